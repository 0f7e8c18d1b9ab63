// Device-side helpers shared by the kernels: warp and block reductions in fp32.
#pragma once
#include <cuda_fp16.h>

namespace strata::cuda {

constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Sum of v over the block, returned to every thread. blockDim.x must be a multiple of 32 (at
// most 1024) and every thread must call it. Safe to call repeatedly in one kernel.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // a previous call may still be reading partial[0]
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < nwarps ? partial[lane] : 0.0f;
    v = warp_sum(v);
    if (lane == 0) partial[0] = v;
  }
  __syncthreads();
  return partial[0];
}

// Threads per block for a one-block-per-row kernel over h elements: a multiple of 32 in [32, 512].
inline int row_block_threads(long long h) {
  long long t = (h + 31) / 32 * 32;
  if (t < 32) t = 32;
  if (t > 512) t = 512;
  return int(t);
}

}  // namespace strata::cuda
