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
//
// split_quant_attention_kernel is the split-KV decode variant (attention_split.cu's design): a
// block per (token, kv head, chunk of the keys) reads each row once for the kv head's query heads.
#include <cmath>
#include <cstdint>

#include "attention_split.cuh"
#include "attention_tiles.cuh"
#include "cuda_common.h"
#include "kernels.h"
#include "quant_common.cuh"

namespace strata::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = kSplitKvTileKeys;  // split_block cuts chunks at these tiles
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

template <int kBits, class T>
__global__ void __launch_bounds__(kThreads) quant_attention_kernel(const QuantAttentionParams<T> p, int seg) {
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
  T* out = p.out + (t * p.heads + head) * d;
  const int slot = p.slots[t];
  const int pos = p.positions[t];
  if (slot < 0 || slot >= p.slot_count || pos < 0 || pos >= p.capacity) {  // uniform over the block
    for (int i = threadIdx.x; i < d; i += kThreads) out[i] = from_float<T>(NAN);
    return;
  }
  const int kv_head = head / (p.heads / p.kv_heads);
  const T* q = p.q + (t * p.heads + head) * d;
  for (int i = threadIdx.x; i < kMaxHeadDim; i += kThreads) {
    const int e = (i % kMaxWords) * kPer + i / kMaxWords;  // element k = i / kMaxWords of word i % kMaxWords
    q_s[i] = e < d ? to_float(q[e]) * p.scale : 0.0f;
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
  for (int start = first_key(pos, p.window); start < n_keys; start += kTile) {
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
          s[r] = cap_score(s[r], p.softcap);
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
  // l >= 1: the max key contributes exp(0); block_sum syncs o_s too.
  const float inv_l = softmax_normalizer(m_run, block_sum(l_part), p.sinks, head);
  for (int i = threadIdx.x; i < d; i += kThreads) {
    float o = 0.0f;
    for (int g = 0; g < key_groups; ++g) o += o_s[g * words * kPer + i];
    out[i] = from_float<T>(o * inv_l);
  }
}

// Split-KV decode over quantized caches: attention_split.cu's design (a block per token, kv head,
// up to kSplitKvGroupHeads of its query heads and chunk of the keys; partials merged by
// split_kv_merge_kernel) with the reads of the kernel above. Scores: `seg` lanes per key (a power
// of two >= the row's words, at least 8 so group_sum8 can leave each lane one head), each lane
// dequantizing a word once for all the group's heads. Output: thread i takes word i % words of
// the value rows of keys i / words, i / words + 128 / words, ..., for every head.
template <int kBits, class T>
__global__ void __launch_bounds__(kThreads)
    split_quant_attention_kernel(const QuantAttentionParams<T> p, const SplitKvScratch part, int seg) {
  constexpr int kPer = 32 / kBits;
  constexpr int kMaxWords = kMaxHeadDim / kPer;
  constexpr int kGroup = kSplitKvGroupHeads;
  constexpr int kSplitKeyUnroll = 2;
  __shared__ float q_s[kGroup][kMaxHeadDim];  // q_s[g][k * kMaxWords + u]: element k of word u of head g
  __shared__ float p_s[kGroup][kTile];
  __shared__ float o_s[kThreads * kPer];
  __shared__ SplitSoftmax sm;

  const QuantRowLayout& l = p.row;
  SplitBlock b;
  if (!split_block(p, part.splits, b)) return;  // uniform over the block
  const int d = l.n;
  const int words = int(l.code_bytes / 4);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const T* q = p.q + (b.token * p.heads + b.head0) * d;  // the group's heads are adjacent
  for (int i = threadIdx.x; i < b.heads * kMaxHeadDim; i += kThreads) {
    const int g = i / kMaxHeadDim, r = i % kMaxHeadDim;
    const int e = (r % kMaxWords) * kPer + r / kMaxWords;  // element k = r / kMaxWords of word r % kMaxWords
    q_s[g][r] = e < d ? to_float(q[g * d + e]) * p.scale : 0.0f;
  }
  if (threadIdx.x < kGroup) {
    sm.m[threadIdx.x] = -INFINITY;
    sm.l[threadIdx.x] = 0.0f;
  }
  const int64_t pos_stride = int64_t(p.kv_heads) * l.row_bytes;
  const int64_t base = (int64_t(b.slot) * p.capacity * p.kv_heads + b.kv_head) * l.row_bytes;
  const uint8_t* kb = p.cache_k + base;
  const uint8_t* vb = p.cache_v + base;
  __syncthreads();

  const int keys_per_pass = 32 / seg;  // keys a warp scores at once
  const int sub = lane / seg, u0 = lane % seg;
  const int key_groups = kThreads / words;  // output phase: threads per word
  const int kg = threadIdx.x / words, ku = threadIdx.x % words;
  float acc[kGroup][kPer];
#pragma unroll
  for (int g = 0; g < kGroup; ++g)
#pragma unroll
    for (int k = 0; k < kPer; ++k) acc[g][k] = 0.0f;

  for (int start = b.key_begin; start < b.key_end; start += kTile) {
    const int n = min(kTile, b.key_end - start);

    // 1. Scores of this tile's keys for every query head of the group into p_s.
    for (int j0 = warp * keys_per_pass; j0 < n; j0 += kWarps * keys_per_pass * kSplitKeyUnroll) {  // uniform per warp
      float s[kSplitKeyUnroll][kGroup];
#pragma unroll
      for (int r = 0; r < kSplitKeyUnroll; ++r) {
#pragma unroll
        for (int g = 0; g < kGroup; ++g) s[r][g] = 0.0f;
        const int j = j0 + r * kWarps * keys_per_pass + sub;
        if (j >= n) continue;
        const uint8_t* krow = kb + int64_t(start + j) * pos_stride;
        for (int u = u0; u < words; u += seg) {
          const uint32_t word = reinterpret_cast<const uint32_t*>(krow)[u];
          const float2 gp = group_params(krow, l, u * kPer / l.group);
#pragma unroll
          for (int k = 0; k < kPer; ++k) {
            const float kv = dequant_ref(word_code<kBits>(word, k), gp.x, gp.y);
#pragma unroll
            for (int g = 0; g < kGroup; ++g)
              if (g < b.heads) s[r][g] = fmaf(q_s[g][k * kMaxWords + u], kv, s[r][g]);
          }
        }
      }
#pragma unroll
      for (int r = 0; r < kSplitKeyUnroll; ++r) {
        const float sum = group_sum8(s[r], seg);  // within the key's lanes
        const int j = j0 + r * kWarps * keys_per_pass + sub, g = u0 / (seg / kGroup);
        if (j < n && u0 % (seg / kGroup) == 0 && g < b.heads) p_s[g][j] = cap_score(sum, p.softcap);
      }
    }
    __syncthreads();

    // 2. Online softmax per query head: scores become weights, sm.alpha rescales older sums.
    split_softmax_tile<kTile, kWarps>(p_s, n, b.heads, sm);

    // 3. Output: this thread's word of the values of keys kg, kg + key_groups, ... for every head.
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      const float alpha = g < b.heads ? sm.alpha[g] : 0.0f;
#pragma unroll
      for (int k = 0; k < kPer; ++k) acc[g][k] *= alpha;
    }
    if (kg < key_groups) {
      for (int j = kg; j < n; j += key_groups) {
        const uint8_t* vrow = vb + int64_t(start + j) * pos_stride;
        const uint32_t word = reinterpret_cast<const uint32_t*>(vrow)[ku];
        const float2 gp = group_params(vrow, l, ku * kPer / l.group);
#pragma unroll
        for (int k = 0; k < kPer; ++k) {
          const float v = dequant_ref(word_code<kBits>(word, k), gp.x, gp.y);
#pragma unroll
          for (int g = 0; g < kGroup; ++g)
            if (g < b.heads) acc[g][k] = fmaf(p_s[g][j], v, acc[g][k]);
        }
      }
    }
    __syncthreads();  // p_s and sm.alpha are rewritten by the next tile
  }

  // 4. Partials: thread kg * words + u holds elements [u * kPer, u * kPer + kPer) of key group
  // kg's sum, so o_s[kg * words * kPer + i] is element i of it.
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    if (g >= b.heads) break;  // uniform over the block
    const int64_t pi = split_partial(b.token, p.heads, b.head0 + g, part.splits, int(blockIdx.y));
#pragma unroll
    for (int k = 0; k < kPer; ++k) o_s[threadIdx.x * kPer + k] = acc[g][k];
    __syncthreads();
    for (int i = threadIdx.x; i < d; i += kThreads) {
      float o = 0.0f;
      for (int k = 0; k < key_groups; ++k) o += o_s[k * words * kPer + i];
      part.acc[pi * d + i] = o;
    }
    if (threadIdx.x == 0) {
      part.max[pi] = sm.m[g];
      part.sum[pi] = sm.l[g];
    }
    __syncthreads();  // o_s is rewritten for the next head
  }
}

}  // namespace

template <class T>
void launch_split_quant_attention(const QuantAttentionParams<T>& p, const SplitKvScratch& s, cudaStream_t stream) {
  if (p.tokens == 0 || p.heads == 0 || p.row.n == 0) return;
  const int words = int(p.row.code_bytes / 4);
  int seg = kSplitKvGroupHeads;  // lanes per key in the score phase
  while (seg < words && seg < 32) seg *= 2;
  const dim3 grid(split_grid_x(p), unsigned(s.splits));
  if (p.row.bits == 4) split_quant_attention_kernel<4><<<grid, kThreads, 0, stream>>>(p, s, seg);
  else split_quant_attention_kernel<8><<<grid, kThreads, 0, stream>>>(p, s, seg);
  STRATA_CUDA_CHECK_LAUNCH("split_quant_attention_kernel", stream);
  launch_split_kv_merge(split_merge_params(p, s, p.row.n), stream);
}

template <class T>
void launch_quant_attention(const QuantAttentionParams<T>& p, cudaStream_t stream) {
  if (p.tokens == 0 || p.heads == 0 || p.row.n == 0) return;
  const int words = int(p.row.code_bytes / 4);
  int seg = 1;  // lanes per key in the score phase
  while (seg < words && seg < 32) seg *= 2;
  const dim3 grid(unsigned(p.tokens * p.heads));  // (token, head) = (x / heads, x % heads)
  if (p.row.bits == 4) quant_attention_kernel<4><<<grid, kThreads, 0, stream>>>(p, seg);
  else quant_attention_kernel<8><<<grid, kThreads, 0, stream>>>(p, seg);
  STRATA_CUDA_CHECK_LAUNCH("quant_attention_kernel", stream);
}

#define STRATA_INSTANTIATE(T)                                                                                \
  template void launch_split_quant_attention<T>(const QuantAttentionParams<T>&, const SplitKvScratch&,      \
                                                cudaStream_t);                                              \
  template void launch_quant_attention<T>(const QuantAttentionParams<T>&, cudaStream_t);
STRATA_FOR_EACH_ACT(STRATA_INSTANTIATE)

}  // namespace strata::cuda
