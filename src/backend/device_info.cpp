// Device names for hardware profiles: the CPU's from /proc/cpuinfo, and the GPU's fallback when
// the binary has no CUDA backend (the CUDA version is in cuda/device_info.cpp).
#include "strata/backend/device_info.h"

#include <fstream>

#include "strata/core/error.h"

namespace strata {

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const size_t b = line.find_first_not_of(" \t", colon + 1);
    const size_t e = line.find_last_not_of(" \t\r");
    if (b != std::string::npos && e >= b) return line.substr(b, e - b + 1);
  }
  return "unknown CPU";
}

#ifndef STRATA_HAVE_CUDA
std::string cuda_device_name(int) {
  throw Error("this strata was built without the CUDA backend: no GPU name to report");
}
CudaCapability cuda_compute_capability(int) {
  throw Error("this strata was built without the CUDA backend: no GPU to query");
}
#endif

}  // namespace strata
