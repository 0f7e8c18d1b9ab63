// Error reporting for CUDA and cuBLAS calls and the STRATA_CUDA_SYNC debug switch.
#include "cuda_common.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <sstream>

namespace strata::cuda {

void raise_cuda_error(const char* call, const char* file, int line, cudaError_t err) {
  std::ostringstream os;
  os << "CUDA error " << cudaGetErrorName(err) << " (" << cudaGetErrorString(err) << ") in `" << call << "` at "
     << file << ":" << line;
  throw Error(os.str());
}

void raise_cublas_error(const char* call, const char* file, int line, cublasStatus_t status) {
  std::ostringstream os;
  os << "cuBLAS error " << cublasGetStatusName(status) << " (" << cublasGetStatusString(status) << ") in `" << call
     << "` at " << file << ":" << line;
  throw Error(os.str());
}

bool sync_debug_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("STRATA_CUDA_SYNC");
    return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
  }();
  return enabled;
}

bool tensor_core_attention_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("STRATA_CUDA_ATTENTION");
    return v == nullptr || std::strcmp(v, "per-token") != 0;
  }();
  return enabled;
}

namespace {
std::atomic<int64_t> g_launches{0};
thread_local bool t_recording = false;
}  // namespace

int64_t launches_issued() { return g_launches.load(std::memory_order_relaxed); }
void count_graph_launch() { g_launches.fetch_add(1, std::memory_order_relaxed); }
RecordingLaunches::RecordingLaunches() { t_recording = true; }
RecordingLaunches::~RecordingLaunches() { t_recording = false; }

void check_launch(const char* what, cudaStream_t stream, const char* file, int line) {
  if (!t_recording) g_launches.fetch_add(1, std::memory_order_relaxed);
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess && sync_debug_enabled()) err = cudaStreamSynchronize(stream);
  if (err != cudaSuccess) {
    std::ostringstream os;
    os << "CUDA error " << cudaGetErrorName(err) << " (" << cudaGetErrorString(err) << ") after " << what << " at "
       << file << ":" << line;
    if (!sync_debug_enabled()) os << " (set STRATA_CUDA_SYNC=1 to find the kernel that faulted)";
    throw Error(os.str());
  }
}

}  // namespace strata::cuda
