// Always-on checks for CUDA runtime and cuBLAS calls and for kernel launches, plus the debug
// switch STRATA_CUDA_SYNC=1 that synchronizes after every kernel so a fault names its kernel.
#pragma once
#include <cstdint>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "strata/core/error.h"

namespace strata::cuda {

[[noreturn]] void raise_cuda_error(const char* call, const char* file, int line, cudaError_t err);
[[noreturn]] void raise_cublas_error(const char* call, const char* file, int line, cublasStatus_t status);

// True when the environment has STRATA_CUDA_SYNC set to anything but "" or "0" (read once).
bool sync_debug_enabled();

// False when the environment has STRATA_CUDA_ATTENTION=per-token: prefill attention then runs on
// the per-token kernel alone, as before the tensor-core kernel (read once; to bisect a mismatch).
bool tensor_core_attention_enabled();

// After a launch (or a library call that launches): reports a bad launch configuration at once
// and, in debug mode, synchronizes the stream so an asynchronous fault is charged to `what`.
void check_launch(const char* what, cudaStream_t stream, const char* file, int line);

// Device work issued in this process (device_launches_issued in strata/backend/backend.h): every
// check_launch counts one launch, except on a thread that is recording into a graph (its
// launches run only when the graph does); a graph's replay counts one.
int64_t launches_issued();
void count_graph_launch();
// Marks the calling thread as recording into a graph (CudaBackend::capture) while alive.
class RecordingLaunches {
public:
  RecordingLaunches();
  ~RecordingLaunches();
  RecordingLaunches(const RecordingLaunches&) = delete;
  RecordingLaunches& operator=(const RecordingLaunches&) = delete;
};

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace strata::cuda

#define STRATA_CUDA_CHECK(call)                                                          \
  do {                                                                                   \
    const cudaError_t strata_cuda_err_ = (call);                                         \
    if (strata_cuda_err_ != cudaSuccess)                                                 \
      ::strata::cuda::raise_cuda_error(#call, __FILE__, __LINE__, strata_cuda_err_);     \
  } while (0)

#define STRATA_CUBLAS_CHECK(call)                                                        \
  do {                                                                                   \
    const cublasStatus_t strata_cublas_st_ = (call);                                     \
    if (strata_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                      \
      ::strata::cuda::raise_cublas_error(#call, __FILE__, __LINE__, strata_cublas_st_);  \
  } while (0)

#define STRATA_CUDA_CHECK_LAUNCH(what, stream) ::strata::cuda::check_launch(what, stream, __FILE__, __LINE__)
