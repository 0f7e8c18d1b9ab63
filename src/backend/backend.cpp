// The backend registry: make_backend by name, and the CUDA entries when this build has no CUDA
// backend. Buffer and Backend's own helpers are in buffer.cpp.
#include "strata/backend/backend.h"

#include "strata/backend/device_info.h"
#include "strata/core/error.h"

namespace strata {

#ifndef STRATA_HAVE_CUDA
bool cuda_available() { return false; }
int64_t device_launches_issued() { return 0; }
std::unique_ptr<Backend> make_cuda_backend(int, DType) {
  throw Error("this strata was built without the CUDA backend (no nvcc at build time); use --device cpu");
}
#endif

std::unique_ptr<Backend> make_backend(const std::string& name, int threads, DType gpu_activations) {
  if (name == "cpu") return make_cpu_backend(threads);
  if (name == "cuda") return make_cuda_backend(0, gpu_activations);
  if (name == "auto") return cuda_available() ? make_cuda_backend(0, gpu_activations) : make_cpu_backend(threads);
  STRATA_FAIL("unknown device '" << name << "' (expected cpu, cuda or auto)");
}

std::string backend_label(const Backend& be) {
  if (be.device() != Device::CUDA) return be.name();
  return std::string(be.name()) + (be.activation_dtype() == DType::BF16 ? " (bf16)" : " (fp16)");
}

DType gpu_activation_dtype(const std::string& requested, DType checkpoint) {
  if (requested == "fp16") return DType::F16;
  if (requested == "bf16") return DType::BF16;
  STRATA_CHECK(requested == "auto", "--dtype " << requested << ": expected auto, fp16 or bf16");
  // A bf16 checkpoint's activations may outgrow fp16's 65504; an older card still runs it in fp16.
  if (checkpoint != DType::BF16) return DType::F16;
  return !cuda_available() || cuda_has_bf16(0) ? DType::BF16 : DType::F16;
}

}  // namespace strata
