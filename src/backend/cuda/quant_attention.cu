// Causal attention over quantized KV caches: attention.cu's kernel (one block per (token, query
// head), tiles of kTile keys, online softmax in fp32), reading each cache row's 32-bit code words
// (8 elements at 4 bits, 4 at 8; a word never spans two groups) and dequantizing them in
// registers by the reference formula, so keys and values equal the CPU backend's bit for bit.
//
// Scores: a warp scores 32 / S keys at once, S (a power of two >= the row's words, at most 32)
// lanes per key, each lane a word at a time, then a shuffle sum within its S lanes. The scaled
// query sits in shared memory as q_s[k * kMaxWords + u] = element k of word u, so the lanes of
// a key read consecutive floats. Output: thread i takes word i % words of the value rows of keys
// i / words, i / words + groups, ... (groups = kThreads / words), accumulating its word's
// elements; the groups' partial outputs are summed through shared memory at the end. After the
// tensor-core kernel (attention_tc.cu) it skips the tiles that kernel took.
#include <cmath>
#include <cstdint>

#include "attention_tiles.cuh"
#include "cuda_common.h"
#include "kernels.h"
#include "quant_common.cuh"

namespace strata::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 64;
constexpr int kKeyUnroll = 4;
static_assert(kThreads >= kQueryTile, "load_query_tile needs a thread per token of a tile");

// Dot product of word u of a key row with the matching query elements (padding elements past the
// head dim have q 0).
template <int kBits>
__device__ __forceinline__ float word_dot(const uint8_t* row, const QuantRowLayout& l, int u, const float* q_s) {
  constexpr int kPer = 32 / kBits, kMaxWords = kMaxHeadDim / kPer;
  const uint32_t word = reinterpret_cast<const uint32_t*>(row)[u];
  const float2 sm = group_params(row, l, u * kPer / l.group);
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < kPer; ++k) s = fmaf(q_s[k * kMaxWords + u], dequant_ref(word_code<kBits>(word, k), sm.x, sm.y), s);
  return s;
}

template <int kBits>
__global__ void __launch_bounds__(kThreads) quant_attention_kernel(const QuantAttentionParams p, int seg) {
  constexpr int kPer = 32 / kBits;
  constexpr int kMaxWords = kMaxHeadDim / kPer;
  __shared__ float q_s[kMaxHeadDim];
  __shared__ float p_s[kTile];
  __shared__ float tile_max_s[kWarps];
  __shared__ float o_s[kThreads * kPer];

  const QuantRowLayout& l = p.row;
  int64_t t;
  int head;
  if (!per_token_block(p, t, head)) return;  // uniform over the block
  const int d = l.n;
  const int words = int(l.code_bytes / 4);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  __half* out = p.out + (t * p.heads + head) * d;
  const int slot = p.slots[t];
  const int pos = p.positions[t];
  if (slot < 0 || slot >= p.slot_count || pos < 0 || pos >= p.capacity) {  // uniform over the block
    for (int i = threadIdx.x; i < d; i += kThreads) out[i] = __float2half_rn(NAN);
    return;
  }
  const int kv_head = head / (p.heads / p.kv_heads);
  const __half* q = p.q + (t * p.heads + head) * d;
  for (int i = threadIdx.x; i < kMaxHeadDim; i += kThreads) {
    const int e = (i % kMaxWords) * kPer + i / kMaxWords;  // element k = i / kMaxWords of word i % kMaxWords
    q_s[i] = e < d ? __half2float(q[e]) * p.scale : 0.0f;
  }
  // Row of cache position j: ((slot * capacity + j) * kv_heads + kv_head) * row_bytes.
  const int64_t pos_stride = int64_t(p.kv_heads) * l.row_bytes;
  const int64_t base = (int64_t(slot) * p.capacity * p.kv_heads + kv_head) * l.row_bytes;
  const uint8_t* kb = p.cache_k + base;
  const uint8_t* vb = p.cache_v + base;
  __syncthreads();

  const int keys_per_pass = 32 / seg;  // keys a warp scores at once
  const int sub = lane / seg, u0 = lane % seg;
  const int key_groups = kThreads / words;  // output phase: threads per word
  const int kg = threadIdx.x / words, ku = threadIdx.x % words;
  float m_run = -INFINITY;
  float l_part = 0.0f;  // this thread's share of the softmax denominator, reduced at the end
  float acc[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) acc[k] = 0.0f;

  const int n_keys = pos + 1;
  for (int start = 0; start < n_keys; start += kTile) {
    const int n = min(kTile, n_keys - start);

    // 1. Scores of this tile's keys into p_s; each warp tracks the max of its keys.
    float wmax = -INFINITY;
    for (int j0 = warp * keys_per_pass; j0 < n; j0 += kWarps * keys_per_pass * kKeyUnroll) {  // uniform per warp
      float s[kKeyUnroll];
#pragma unroll
      for (int r = 0; r < kKeyUnroll; ++r) {
        const int j = j0 + r * kWarps * keys_per_pass + sub;
        s[r] = 0.0f;
        if (j < n) {
          const uint8_t* krow = kb + int64_t(start + j) * pos_stride;
          for (int u = u0; u < words; u += seg) s[r] += word_dot<kBits>(krow, l, u, q_s);
        }
      }
#pragma unroll
      for (int r = 0; r < kKeyUnroll; ++r) {
        for (int o = seg / 2; o > 0; o >>= 1) s[r] += __shfl_xor_sync(kFullMask, s[r], o);  // within the key's lanes
        const int j = j0 + r * kWarps * keys_per_pass + sub;
        if (j < n) {
          if (u0 == 0) p_s[j] = s[r];
          wmax = fmaxf(wmax, s[r]);
        }
      }
    }
    wmax = warp_max(wmax);  // lanes saw different keys
    if (lane == 0) tile_max_s[warp] = wmax;
    __syncthreads();

    // 2. Online softmax update: scores become weights; old sums rescale by alpha.
    const float alpha = online_softmax_tile<kWarps>(p_s, tile_max_s, n, m_run, l_part);

    // 3. Output: this thread's word of the values of keys kg, kg + key_groups, ...
#pragma unroll
    for (int k = 0; k < kPer; ++k) acc[k] *= alpha;
    if (kg < key_groups) {
      for (int j = kg; j < n; j += key_groups) {
        const uint8_t* vrow = vb + int64_t(start + j) * pos_stride;
        const uint32_t word = reinterpret_cast<const uint32_t*>(vrow)[ku];
        const float2 sm = group_params(vrow, l, ku * kPer / l.group);
        const float w = p_s[j];
#pragma unroll
        for (int k = 0; k < kPer; ++k) acc[k] = fmaf(w, dequant_ref(word_code<kBits>(word, k), sm.x, sm.y), acc[k]);
      }
    }
    __syncthreads();  // p_s and tile_max_s are rewritten by the next tile
  }

  // Thread kg * words + u holds elements [u * kPer, u * kPer + kPer) of key group kg's partial
  // output, so o_s[kg * words * kPer + i] is element i of it.
#pragma unroll
  for (int k = 0; k < kPer; ++k) o_s[threadIdx.x * kPer + k] = acc[k];
  const float inv_l = 1.0f / block_sum(l_part);  // >= 1: the max key contributes exp(0); syncs o_s too
  for (int i = threadIdx.x; i < d; i += kThreads) {
    float o = 0.0f;
    for (int g = 0; g < key_groups; ++g) o += o_s[g * words * kPer + i];
    out[i] = __float2half_rn(o * inv_l);
  }
}

}  // namespace

void launch_quant_attention(const QuantAttentionParams& p, cudaStream_t stream) {
  if (p.tokens == 0 || p.heads == 0 || p.row.n == 0) return;
  const int words = int(p.row.code_bytes / 4);
  int seg = 1;  // lanes per key in the score phase
  while (seg < words && seg < 32) seg *= 2;
  const dim3 grid(unsigned(p.tokens * p.heads));  // (token, head) = (x / heads, x % heads)
  if (p.row.bits == 4) quant_attention_kernel<4><<<grid, kThreads, 0, stream>>>(p, seg);
  else quant_attention_kernel<8><<<grid, kThreads, 0, stream>>>(p, seg);
  STRATA_CUDA_CHECK_LAUNCH("quant_attention_kernel", stream);
}

}  // namespace strata::cuda
