// Greedy sampling: argmax over each row of logits, one block per row, lowest index on ties.
#include <climits>
#include <cmath>

#include "cuda_common.h"
#include "device_utils.cuh"
#include "kernels.h"

namespace strata::cuda {

namespace {

constexpr int kThreads = 512;

// Does candidate (v, i) beat the current best (bv, bi)? NaN never wins (comparisons are false).
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }


template <class T>
__global__ void argmax_rows_kernel(const T* __restrict__ logits, int64_t cols, int32_t* __restrict__ out) {
  __shared__ float warp_val[32];
  __shared__ int warp_idx[32];
  const T* row = logits + int64_t(blockIdx.x) * cols;
  float best = -INFINITY;
  int best_i = INT_MAX;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float v = to_float(row[j]);
    if (better(v, int(j), best, best_i)) {
      best = v;
      best_i = int(j);
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_xor_sync(kFullMask, best, o);
    const int i = __shfl_xor_sync(kFullMask, best_i, o);
    if (better(v, i, best, best_i)) {
      best = v;
      best_i = i;
    }
  }
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  if (lane == 0) {
    warp_val[warp] = best;
    warp_idx[warp] = best_i;
  }
  __syncthreads();
  if (warp == 0) {
    const int nwarps = blockDim.x >> 5;
    best = lane < nwarps ? warp_val[lane] : -INFINITY;
    best_i = lane < nwarps ? warp_idx[lane] : INT_MAX;
    for (int o = 16; o > 0; o >>= 1) {
      const float v = __shfl_xor_sync(kFullMask, best, o);
      const int i = __shfl_xor_sync(kFullMask, best_i, o);
      if (better(v, i, best, best_i)) {
        best = v;
        best_i = i;
      }
    }
    // A row of NaNs has no winner: report index 0 rather than an out-of-vocabulary id.
    if (lane == 0) out[blockIdx.x] = best_i == INT_MAX ? 0 : best_i;
  }
}

template <class T>
void launch_argmax(const T* logits, int64_t rows, int64_t cols, int32_t* out, cudaStream_t stream) {
  if (rows == 0) return;
  argmax_rows_kernel<T><<<dim3(unsigned(rows)), kThreads, 0, stream>>>(logits, cols, out);
  STRATA_CUDA_CHECK_LAUNCH("argmax_rows_kernel", stream);
}

}  // namespace

template <class L>
void launch_argmax_rows(const L* logits, int64_t rows, int64_t cols, int32_t* out, cudaStream_t stream) {
  launch_argmax(logits, rows, cols, out, stream);
}

template void launch_argmax_rows<__half>(const __half*, int64_t, int64_t, int32_t*, cudaStream_t);
template void launch_argmax_rows<bf16>(const bf16*, int64_t, int64_t, int32_t*, cudaStream_t);
template void launch_argmax_rows<float>(const float*, int64_t, int64_t, int32_t*, cudaStream_t);

}  // namespace strata::cuda
