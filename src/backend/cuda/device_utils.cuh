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

// One tile's step of an online softmax (the per-token attention kernels): the tile's n scores sit
// in p_s, each of the kWarps warps' max of them in tile_max_s. Turns the scores into weights
// exp(s - m_new), m_new = max(m_run, the tile's max); rescales this thread's share of the
// denominator l_part by alpha = exp(m_run - m_new) and adds its weights; sets m_run = m_new and
// returns alpha, by which the caller rescales its output. Every thread of the block calls it; it
// ends with a barrier, so p_s holds the weights for all.
template <int kWarps>
__device__ __forceinline__ float online_softmax_tile(float* p_s, const float* tile_max_s, int n, float& m_run,
                                                     float& l_part) {
  float m_tile = tile_max_s[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) m_tile = fmaxf(m_tile, tile_max_s[w]);
  const float m_new = fmaxf(m_run, m_tile);
  const float alpha = expf(m_run - m_new);  // 0 on the first tile (m_run = -inf)
  l_part *= alpha;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const float e = expf(p_s[j] - m_new);
    p_s[j] = e;
    l_part += e;
  }
  m_run = m_new;
  __syncthreads();
  return alpha;
}

// Threads per block for a one-block-per-row kernel over h elements: a multiple of 32 in [32, 512].
inline int row_block_threads(long long h) {
  long long t = (h + 31) / 32 * 32;
  if (t < 32) t = 32;
  if (t > 512) t = 512;
  return int(t);
}

}  // namespace strata::cuda
