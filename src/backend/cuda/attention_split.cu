// Split-KV decode attention over fp16 caches (flash-decoding), and the merge that the quantized
// variant (quant_attention.cu) shares.
//
// The per-token kernel (attention.cu) runs tokens x heads blocks, each over its token's whole
// context: a decode step of one sequence and 32 heads fills 32 of an H100's 132 SMs, and under GQA
// each query head reads its kv head's rows again. split_attention_kernel instead runs a block per
// (token, kv head, up to kSplitKvGroupHeads of its query heads, chunk of the keys): the group's
// scaled queries sit in shared memory, and each K and V row is read once for all of them.
// split_kv.h's rule picks the chunk count. Per 64-key tile:
// 1. scores: a warp per key (two in flight), lanes across the head dim, each lane's products for
//    the eight query heads summed over the warp by group_sum8 (the lanes end with one head each);
// 2. online softmax, a warp per query head (split_softmax_tile);
// 3. output: thread i takes value unit i % units (an element, or a pair under half2 loads) of keys
//    i / units, i / units + 128 / units, ..., for every query head; the key groups' sums meet in
//    shared memory at the end.
// Each block writes its heads' partials (unnormalized output, max score m, denominator l) to
// scratch; split_kv_merge_kernel, a block per (token, query head), combines the chunks by their
// log-sum-exp weights and writes the fp16 output. An empty chunk (past the token's last tile)
// writes m = -inf, l = 0 and weighs nothing in the merge.
#include <cmath>
#include <cstdint>

#include "attention_split.cuh"
#include "cuda_common.h"
#include "kernels.h"
#include "split_kv.h"

namespace strata::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = kSplitKvTileKeys;
constexpr int kKeyUnroll = 2;
constexpr int kGroup = kSplitKvGroupHeads;
static_assert(kThreads >= kQueryTile, "load_query_tile needs a thread per token of a tile");
static_assert(kSplitKvMaxChunks <= 32, "the merge weighs the chunks with one warp");

template <bool kPairs, class T>
__global__ void __launch_bounds__(kThreads) split_attention_kernel(const AttentionParams<T> p, const SplitKvScratch part) {
  constexpr int kVec = kPairs ? 2 : 1;
  __shared__ float q_s[kGroup][kMaxHeadDim];
  __shared__ float p_s[kGroup][kTile];
  __shared__ float o_s[kThreads * kVec];
  __shared__ SplitSoftmax sm;

  SplitBlock b;
  if (!split_block(p, part.splits, b)) return;  // uniform over the block
  const int d = p.head_dim;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const T* q = p.q + b.token * p.q_token_stride + int64_t(b.head0) * d;  // the group's heads are adjacent
  for (int i = threadIdx.x; i < b.heads * d; i += kThreads) q_s[i / d][i % d] = to_float(q[i]) * p.scale;
  if (threadIdx.x < kGroup) {
    sm.m[threadIdx.x] = -INFINITY;
    sm.l[threadIdx.x] = 0.0f;
  }
  const int64_t base = int64_t(b.slot) * p.kv_slot_stride + int64_t(b.kv_head) * d;
  const T* kb = p.cache_k + base;
  const T* vb = p.cache_v + base;
  __syncthreads();

  const int units = d / kVec;
  const int unit_threads = min(units, kThreads);
  const int key_groups = kThreads / unit_threads;                 // output phase: threads per unit
  const int ku = threadIdx.x % unit_threads, kg = threadIdx.x / unit_threads;
  const int unit_reps = (units + kThreads - 1) / kThreads;          // 2 for scalar head dims over 128
  float acc[kGroup][2][kVec];
#pragma unroll
  for (int g = 0; g < kGroup; ++g)
#pragma unroll
    for (int c = 0; c < 2; ++c)
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc[g][c][e] = 0.0f;

  for (int start = b.key_begin; start < b.key_end; start += kTile) {
    const int n = min(kTile, b.key_end - start);

    // 1. Scores of this tile's keys for every query head of the group into p_s.
    for (int j0 = warp; j0 < n; j0 += kWarps * kKeyUnroll) {  // uniform per warp
      float s[kKeyUnroll][kGroup];
#pragma unroll
      for (int r = 0; r < kKeyUnroll; ++r) {
#pragma unroll
        for (int g = 0; g < kGroup; ++g) s[r][g] = 0.0f;
        const int j = j0 + r * kWarps;
        if (j >= n) continue;
        const T* krow = kb + int64_t(start + j) * p.kv_pos_stride;
        for (int u = lane; u < units; u += 32) {
          if constexpr (kPairs) {
            const float2 kf = to_float2(reinterpret_cast<const Pair<T>*>(krow)[u]);
#pragma unroll
            for (int g = 0; g < kGroup; ++g)
              if (g < b.heads) s[r][g] += q_s[g][2 * u] * kf.x + q_s[g][2 * u + 1] * kf.y;
          } else {
            const float kf = to_float(krow[u]);
#pragma unroll
            for (int g = 0; g < kGroup; ++g)
              if (g < b.heads) s[r][g] += q_s[g][u] * kf;
          }
        }
      }
#pragma unroll
      for (int r = 0; r < kKeyUnroll; ++r) {
        const float sum = group_sum8(s[r], 32);  // head lane / 4's score; lanes 4g..4g+3 hold it
        const int j = j0 + r * kWarps, g = lane >> 2;
        if (j < n && (lane & 3) == 0 && g < b.heads) p_s[g][j] = cap_score(sum, p.softcap);
      }
    }
    __syncthreads();

    // 2. Online softmax per query head: scores become weights, sm.alpha rescales older sums.
    split_softmax_tile<kTile, kWarps>(p_s, n, b.heads, sm);

    // 3. Output: this thread's value unit(s) of keys kg, kg + key_groups, ... for every head.
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      const float alpha = g < b.heads ? sm.alpha[g] : 0.0f;
#pragma unroll
      for (int c = 0; c < 2; ++c)
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[g][c][e] *= alpha;
    }
    if (kg < key_groups) {
      for (int j = kg; j < n; j += key_groups) {
        const T* vrow = vb + int64_t(start + j) * p.kv_pos_stride;
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int u = ku + c * kThreads;
          if (c >= unit_reps || u >= units) continue;
          float v[kVec];
          if constexpr (kPairs) {
            const float2 vf = to_float2(reinterpret_cast<const Pair<T>*>(vrow)[u]);
            v[0] = vf.x;
            v[kVec - 1] = vf.y;
          } else {
            v[0] = to_float(vrow[u]);
          }
#pragma unroll
          for (int g = 0; g < kGroup; ++g) {
            if (g >= b.heads) continue;
            const float w = p_s[g][j];
#pragma unroll
            for (int e = 0; e < kVec; ++e) acc[g][c][e] += w * v[e];
          }
        }
      }
    }
    __syncthreads();  // p_s and sm.alpha are rewritten by the next tile
  }

  // 4. Partials. With several key groups, element i of head g is the sum over kg of
  // o_s[(kg * unit_threads) * kVec + i].
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    if (g >= b.heads) break;  // uniform over the block
    const int64_t pi = split_partial(b.token, p.heads, b.head0 + g, part.splits, int(blockIdx.y));
    float* out = part.acc + pi * d;
    if (key_groups == 1) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int u = ku + c * kThreads;
        if (c >= unit_reps || u >= units) continue;
#pragma unroll
        for (int e = 0; e < kVec; ++e) out[u * kVec + e] = acc[g][c][e];
      }
    } else {
#pragma unroll
      for (int e = 0; e < kVec; ++e) o_s[threadIdx.x * kVec + e] = acc[g][0][e];
      __syncthreads();
      for (int i = threadIdx.x; i < d; i += kThreads) {
        float o = 0.0f;
        for (int k = 0; k < key_groups; ++k) o += o_s[k * unit_threads * kVec + i];
        out[i] = o;
      }
      __syncthreads();  // o_s is rewritten for the next head
    }
    if (threadIdx.x == 0) {
      part.max[pi] = sm.m[g];
      part.sum[pi] = sm.l[g];
    }
  }
}

// out = sum_c w_c acc_c / sum_c w_c l_c, w_c = exp(m_c - M), M = max_c m_c; an empty chunk
// (m_c = -inf) weighs 0 rather than exp(-inf - M).
template <class T>
__global__ void __launch_bounds__(kThreads) split_kv_merge_kernel(const SplitKvMergeParams<T> p) {
  __shared__ float w_s[kSplitKvMaxChunks];
  __shared__ float inv_l_s;
  int64_t t;
  int head;
  if (!per_token_block(p, t, head)) return;  // uniform over the block
  const int d = p.head_dim;
  T* out = p.out + (t * p.heads + head) * d;
  const int slot = p.slots[t];
  const int pos = p.positions[t];
  if (slot < 0 || slot >= p.slot_count || pos < 0 || pos >= p.capacity) {  // uniform over the block
    for (int i = threadIdx.x; i < d; i += kThreads) out[i] = from_float<T>(NAN);
    return;
  }
  const int splits = p.part.splits;
  const int64_t first = split_partial(t, p.heads, head, splits, 0);
  if (threadIdx.x < 32) {
    const int c = threadIdx.x;
    const float m = c < splits ? p.part.max[first + c] : -INFINITY;
    const float m_all = warp_max(m);
    const float w = c < splits && m != -INFINITY ? expf(m - m_all) : 0.0f;
    const float l = warp_sum(c < splits ? w * p.part.sum[first + c] : 0.0f);
    if (c < splits) w_s[c] = w;
    if (c == 0) inv_l_s = softmax_normalizer(m_all, l, p.sinks, head);  // l >= 1: the max key's chunk gives exp(0)
  }
  __syncthreads();
  const float* acc = p.part.acc + first * d;
  for (int i = threadIdx.x; i < d; i += kThreads) {
    float o = 0.0f;
    for (int c = 0; c < splits; ++c) o += w_s[c] * acc[int64_t(c) * d + i];
    out[i] = from_float<T>(o * inv_l_s);
  }
}

size_t align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

size_t split_kv_scratch_bytes(int64_t tokens, int heads, int head_dim, int splits) {
  const size_t partials = size_t(tokens) * size_t(heads) * size_t(splits);
  return align256(partials * size_t(head_dim) * sizeof(float)) + 2 * align256(partials * sizeof(float));
}

SplitKvScratch split_kv_scratch(void* buffer, int64_t tokens, int heads, int head_dim, int splits) {
  const size_t partials = size_t(tokens) * size_t(heads) * size_t(splits);
  char* at = static_cast<char*>(buffer);
  SplitKvScratch s;
  s.acc = reinterpret_cast<float*>(at);
  at += align256(partials * size_t(head_dim) * sizeof(float));
  s.max = reinterpret_cast<float*>(at);
  at += align256(partials * sizeof(float));
  s.sum = reinterpret_cast<float*>(at);
  s.splits = splits;
  return s;
}

template <class T>
void launch_split_kv_merge(const SplitKvMergeParams<T>& p, cudaStream_t stream) {
  if (p.tokens == 0 || p.heads == 0 || p.head_dim == 0) return;
  split_kv_merge_kernel<<<dim3(unsigned(p.tokens * p.heads)), kThreads, 0, stream>>>(p);
  STRATA_CUDA_CHECK_LAUNCH("split_kv_merge_kernel", stream);
}

template <class T>
void launch_split_attention(const AttentionParams<T>& p, const SplitKvScratch& s, cudaStream_t stream) {
  if (p.tokens == 0 || p.heads == 0 || p.head_dim == 0) return;
  const dim3 grid(split_grid_x(p), unsigned(s.splits));
  if (half2_attention(p)) {
    split_attention_kernel<true><<<grid, kThreads, 0, stream>>>(p, s);
    STRATA_CUDA_CHECK_LAUNCH("split_attention_kernel<pairs>", stream);
  } else {
    split_attention_kernel<false><<<grid, kThreads, 0, stream>>>(p, s);
    STRATA_CUDA_CHECK_LAUNCH("split_attention_kernel<scalar>", stream);
  }
  launch_split_kv_merge(split_merge_params(p, s, p.head_dim), stream);
}

#define STRATA_INSTANTIATE(T)                                                                          \
  template void launch_split_kv_merge<T>(const SplitKvMergeParams<T>&, cudaStream_t);                 \
  template void launch_split_attention<T>(const AttentionParams<T>&, const SplitKvScratch&, cudaStream_t);
STRATA_FOR_EACH_ACT(STRATA_INSTANTIATE)

}  // namespace strata::cuda
