// Names of the devices a hardware profile was measured on. Kept out of the Backend interface: only
// `strata profile` needs them, and the CUDA query stays in src/backend/cuda/.
#pragma once
#include <string>

namespace strata {

// The GPU's marketing name (cudaGetDeviceProperties), e.g. "NVIDIA H100 80GB HBM3". Throws
// strata::Error when the binary has no CUDA backend or the device cannot be queried.
std::string cuda_device_name(int device_index = 0);

// The CPU's "model name" from /proc/cpuinfo, e.g. "AMD EPYC 7B13 64-Core Processor"; "unknown CPU"
// where that file says nothing.
std::string cpu_model_name();

}  // namespace strata
