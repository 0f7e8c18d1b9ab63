// Names of the devices a hardware profile was measured on. Kept out of the Backend interface: only
// `strata profile` needs them, and the CUDA query stays in src/backend/cuda/.
#pragma once
#include <string>

namespace strata {

// The GPU's marketing name (cudaGetDeviceProperties), e.g. "NVIDIA H100 80GB HBM3". Throws
// strata::Error when the binary has no CUDA backend or the device cannot be queried.
std::string cuda_device_name(int device_index = 0);

// The GPU's compute capability, e.g. {9, 0} for an H100; throws as cuda_device_name does.
struct CudaCapability {
  int major = 0, minor = 0;
};
CudaCapability cuda_compute_capability(int device_index = 0);
// bf16 arithmetic and tensor-core MMAs: compute capability 8.0 (Ampere) and newer.
inline bool cuda_has_bf16(int device_index = 0) { return cuda_compute_capability(device_index).major >= 8; }

// The CPU's "model name" from /proc/cpuinfo, e.g. "AMD EPYC 7B13 64-Core Processor"; "unknown CPU"
// where that file says nothing.
std::string cpu_model_name();

}  // namespace strata
