// The backend registry: make_backend by name, and the CUDA entries when this build has no CUDA
// backend. Buffer and Backend's own helpers are in buffer.cpp.
#include "strata/backend/backend.h"

#include "strata/core/error.h"

namespace strata {

#ifndef STRATA_HAVE_CUDA
bool cuda_available() { return false; }
std::unique_ptr<Backend> make_cuda_backend(int) {
  throw Error("this strata was built without the CUDA backend (no nvcc at build time); use --device cpu");
}
#endif

std::unique_ptr<Backend> make_backend(const std::string& name, int threads) {
  if (name == "cpu") return make_cpu_backend(threads);
  if (name == "cuda") return make_cuda_backend(0);
  if (name == "auto") return cuda_available() ? make_cuda_backend(0) : make_cpu_backend(threads);
  STRATA_FAIL("unknown device '" << name << "' (expected cpu, cuda or auto)");
}

}  // namespace strata
