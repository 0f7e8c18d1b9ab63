// KV-cache writes and causal attention over the cache (prefill and decode alike).
//
// attention_kernel: one block of kThreads per (token, query head). The scaled query sits in
// shared memory in fp32; keys [0, positions[t]] of the token's slot are visited in tiles of
// kTile with an online softmax (running max m and denominator l, both fp32). Per tile: a warp
// per key computes the score (lanes across the head dimension, kKeyUnroll keys in flight), the
// block agrees on the tile max, the scores become exp(s - m_new), and each thread rescales and
// accumulates the output dimensions it owns. Head dims up to kMaxHeadDim; half2 loads when the
// head dim is even and the pointers are 4-byte aligned. After the tensor-core kernel
// (attention_tc.cu), it skips the tokens of the tiles that kernel took (skip_tensor_core_tiles).
#include <cmath>
#include <cstdint>

#include "attention_split.cuh"
#include "attention_tiles.cuh"
#include "cuda_common.h"
#include "device_utils.cuh"
#include "kernels.h"

namespace strata::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 64;
constexpr int kKeyUnroll = 4;
constexpr int kUnitsPerThread = kMaxHeadDim / kThreads;  // output elements (or pairs) per thread
static_assert(kThreads >= kQueryTile, "load_query_tile needs a thread per token of a tile");

template <class T>
__global__ void kv_store_kernel(const KvStoreParams<T> p) {
  const int64_t t = blockIdx.x;
  const int slot = p.slots[t];
  const int pos = p.positions[t];
  if (slot < 0 || slot >= p.slot_count || pos < 0 || pos >= p.capacity) return;  // validated by callers
  const int64_t dst = (int64_t(slot) * p.capacity + pos) * p.row;
  const int64_t src = t * p.row;
  for (int64_t i = threadIdx.x; i < p.row; i += blockDim.x) {
    p.cache_k[dst + i] = p.k[src + i];
    p.cache_v[dst + i] = p.v[src + i];
  }
}

template <bool kPairs, class T>
__global__ void __launch_bounds__(kThreads) attention_kernel(const AttentionParams<T> p) {
  constexpr int kVec = kPairs ? 2 : 1;
  __shared__ float q_s[kMaxHeadDim];
  __shared__ float p_s[kTile];
  __shared__ float tile_max_s[kWarps];

  int64_t t;
  int head;
  if (!per_token_block(p, t, head)) return;  // uniform over the block
  const int d = p.head_dim;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  T* out = p.out + t * p.q_token_stride + int64_t(head) * d;
  const int slot = p.slots[t];
  const int pos = p.positions[t];
  if (slot < 0 || slot >= p.slot_count || pos < 0 || pos >= p.capacity) {  // uniform over the block
    for (int i = threadIdx.x; i < d; i += kThreads) out[i] = from_float<T>(NAN);
    return;
  }
  const int kv_head = head / (p.heads / p.kv_heads);
  const T* q = p.q + t * p.q_token_stride + int64_t(head) * d;
  for (int i = threadIdx.x; i < d; i += kThreads) q_s[i] = to_float(q[i]) * p.scale;
  const int64_t base = int64_t(slot) * p.kv_slot_stride + int64_t(kv_head) * d;
  const T* kb = p.cache_k + base;
  const T* vb = p.cache_v + base;
  __syncthreads();

  const int units = d / kVec;
  float m_run = -INFINITY;
  float l_part = 0.0f;  // this thread's share of the softmax denominator, reduced at the end
  float acc[kUnitsPerThread][kVec];
#pragma unroll
  for (int c = 0; c < kUnitsPerThread; ++c)
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc[c][e] = 0.0f;

  const int n_keys = pos + 1;
  for (int start = first_key(pos, p.window); start < n_keys; start += kTile) {
    const int n = min(kTile, n_keys - start);

    // 1. Scores of this tile's keys into p_s; each warp tracks the max of its keys.
    float wmax = -INFINITY;
    for (int j0 = warp; j0 < n; j0 += kWarps * kKeyUnroll) {
      float s[kKeyUnroll];
#pragma unroll
      for (int r = 0; r < kKeyUnroll; ++r) {
        const int j = j0 + r * kWarps;
        s[r] = 0.0f;
        if (j < n) {
          const T* krow = kb + int64_t(start + j) * p.kv_pos_stride;
          for (int u = lane; u < units; u += 32) {
            if constexpr (kPairs) {
              const float2 kf = to_float2(reinterpret_cast<const Pair<T>*>(krow)[u]);
              s[r] += q_s[2 * u] * kf.x + q_s[2 * u + 1] * kf.y;
            } else {
              s[r] += q_s[u] * to_float(krow[u]);
            }
          }
        }
      }
#pragma unroll
      for (int r = 0; r < kKeyUnroll; ++r) {
        const float sr = cap_score(warp_sum(s[r]), p.softcap);  // j < n is uniform over the warp
        const int j = j0 + r * kWarps;
        if (j < n) {
          if (lane == 0) p_s[j] = sr;
          wmax = fmaxf(wmax, sr);
        }
      }
    }
    if (lane == 0) tile_max_s[warp] = wmax;
    __syncthreads();

    // 2. Online softmax update: scores become weights; old sums rescale by alpha.
    const float alpha = online_softmax_tile<kWarps>(p_s, tile_max_s, n, m_run, l_part);

    // 3. Output: each thread owns units threadIdx.x + c * kThreads (coalesced over the values).
#pragma unroll
    for (int c = 0; c < kUnitsPerThread; ++c) {
      const int u = threadIdx.x + c * kThreads;
      if (u >= units) continue;
      float a0 = acc[c][0] * alpha;
      float a1 = kPairs ? acc[c][kVec - 1] * alpha : 0.0f;
#pragma unroll 8
      for (int j = 0; j < n; ++j) {
        const T* vrow = vb + int64_t(start + j) * p.kv_pos_stride;
        const float w = p_s[j];
        if constexpr (kPairs) {
          const float2 vf = to_float2(reinterpret_cast<const Pair<T>*>(vrow)[u]);
          a0 += w * vf.x;
          a1 += w * vf.y;
        } else {
          a0 += w * to_float(vrow[u]);
        }
      }
      acc[c][0] = a0;
      if constexpr (kPairs) acc[c][kVec - 1] = a1;
    }
    __syncthreads();  // p_s and tile_max_s are rewritten by the next tile
  }

  // l >= 1: the max key contributes exp(0).
  const float inv_l = softmax_normalizer(m_run, block_sum(l_part), p.sinks, head);
#pragma unroll
  for (int c = 0; c < kUnitsPerThread; ++c) {
    const int u = threadIdx.x + c * kThreads;
    if (u >= units) continue;
    if constexpr (kPairs) {
      reinterpret_cast<Pair<T>*>(out)[u] = pair_from_floats<T>(acc[c][0] * inv_l, acc[c][kVec - 1] * inv_l);
    } else {
      out[u] = from_float<T>(acc[c][0] * inv_l);
    }
  }
}

}  // namespace

template <class T>
void launch_kv_store(const KvStoreParams<T>& p, cudaStream_t stream) {
  if (p.tokens == 0 || p.row == 0) return;
  kv_store_kernel<<<dim3(unsigned(p.tokens)), row_block_threads(p.row), 0, stream>>>(p);
  STRATA_CUDA_CHECK_LAUNCH("kv_store_kernel", stream);
}

template <class T>
void launch_attention(const AttentionParams<T>& p, cudaStream_t stream) {
  if (p.tokens == 0 || p.heads == 0 || p.head_dim == 0) return;
  const dim3 grid(unsigned(p.tokens * p.heads));  // (token, head) = (x / heads, x % heads)
  if (half2_attention(p)) {
    attention_kernel<true><<<grid, kThreads, 0, stream>>>(p);
    STRATA_CUDA_CHECK_LAUNCH("attention_kernel<pairs>", stream);
  } else {
    attention_kernel<false><<<grid, kThreads, 0, stream>>>(p);
    STRATA_CUDA_CHECK_LAUNCH("attention_kernel<scalar>", stream);
  }
}

#define STRATA_INSTANTIATE(T)                                                  \
  template void launch_kv_store<T>(const KvStoreParams<T>&, cudaStream_t);    \
  template void launch_attention<T>(const AttentionParams<T>&, cudaStream_t);
STRATA_FOR_EACH_ACT(STRATA_INSTANTIATE)

}  // namespace strata::cuda
