// The GPU's name and compute capability (the CPU part and the no-CUDA fallback are in
// ../device_info.cpp).
#include "strata/backend/device_info.h"

#include <cuda_runtime.h>

#include "cuda_common.h"

namespace strata {

std::string cuda_device_name(int device_index) {
  cudaDeviceProp prop{};
  STRATA_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_index));
  return prop.name;
}

CudaCapability cuda_compute_capability(int device_index) {
  cudaDeviceProp prop{};
  STRATA_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_index));
  return {prop.major, prop.minor};
}

}  // namespace strata
