// Device helpers shared by the split-KV decode kernels over fp16 (attention_split.cu) and quantized
// (quant_attention.cu) caches: which token, query heads and key chunk a block takes, the sum of
// eight per-head dot products over a lane group, and the per-head online softmax of a key tile.
#pragma once
#include <cmath>
#include <cstdint>

#include "attention_tiles.cuh"
#include "device_utils.cuh"
#include "kernels.h"
#include "split_kv.h"

namespace strata::cuda {

// Whether the attention kernels take pair loads (half2, bfloat162): an even head dim and
// 4-byte-aligned q, caches and output (host code).
template <class T>
bool half2_attention(const AttentionParams<T>& p) {
  const auto aligned4 = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 4 == 0; };
  return p.head_dim % 2 == 0 && aligned4(p.q) && aligned4(p.cache_k) && aligned4(p.cache_v) && aligned4(p.out);
}

// A split block's work: query heads [head0, head0 + heads) of token `token`, which share kv head
// `kv_head`, over keys [key_begin, key_end) of slot `slot` (an empty range for an empty chunk).
struct SplitBlock {
  int64_t token;
  int slot;
  int kv_head;
  int head0;
  int heads;
  int key_begin;
  int key_end;
};

// Block x is (token, kv head, group of up to kSplitKvGroupHeads of its query heads), y the chunk.
// Chunk c of a token whose keys [first_key, pos] touch `tiles` key tiles (from the one holding
// first_key) holds those tiles' [c * per, (c + 1) * per), per = ceil(tiles / splits), cut to the
// token's keys, so chunks past the last tile are empty. False (for every thread of the block) when the
// token is invalid (the merge writes its NaN) or its tile went to the tensor-core kernel. Every
// thread must call it.
template <class Params>
__device__ __forceinline__ bool split_block(const Params& p, int splits, SplitBlock& b) {
  const int group = p.heads / p.kv_heads;
  const int head_groups = (group + kSplitKvGroupHeads - 1) / kSplitKvGroupHeads;
  const int64_t x = blockIdx.x;
  const int hg = int(x % head_groups);
  b.kv_head = int(x / head_groups % p.kv_heads);
  b.token = x / head_groups / p.kv_heads;
  b.head0 = b.kv_head * group + hg * kSplitKvGroupHeads;
  b.heads = min(kSplitKvGroupHeads, group - hg * kSplitKvGroupHeads);
  if (p.skip_tensor_core_tiles) {
    __shared__ int32_t slot_s[kQueryTile];
    __shared__ int32_t pos_s[kQueryTile];
    if (load_query_tile(p, b.token / kQueryTile, slot_s, pos_s)) return false;
  }
  b.slot = p.slots[b.token];
  const int pos = p.positions[b.token];
  if (b.slot < 0 || b.slot >= p.slot_count || pos < 0 || pos >= p.capacity) return false;
  constexpr int kTile = kSplitKvTileKeys;
  const int lo = first_key(pos, p.window), lo_tile = lo / kTile;
  const int tiles = pos / kTile + 1 - lo_tile;
  const int per = (tiles + splits - 1) / splits;
  const int first = min(int(blockIdx.y) * per, tiles);
  b.key_begin = max((lo_tile + first) * kTile, lo);
  b.key_end = min((lo_tile + min(first + per, tiles)) * kTile, pos + 1);
  return true;
}

// Sums each of v[0..8) over a group of `width` lanes (the lanes sharing lane / width; width a power
// of two in [8, 32]); every lane of the warp must call it with the same width. The first three
// steps trade halves of v with the partner lane instead of summing all eight, so it takes
// log2(width) + 4 shuffles rather than 8 log2(width). Returns the sum of value
// (lane % width) / (width / 8), which that lane then holds (v is clobbered).
__device__ __forceinline__ float group_sum8(float (&v)[kSplitKvGroupHeads], int width) {
  static_assert(kSplitKvGroupHeads == 8, "three halving steps");
  const int lane = threadIdx.x & 31;
  int o = width / 2;
  bool upper = (lane & o) != 0;  // keeps values 4..7, sends 0..3
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float send = upper ? v[i] : v[i + 4];
    v[i] = (upper ? v[i + 4] : v[i]) + __shfl_xor_sync(kFullMask, send, o);
  }
  o /= 2;
  upper = (lane & o) != 0;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float send = upper ? v[i] : v[i + 2];
    v[i] = (upper ? v[i + 2] : v[i]) + __shfl_xor_sync(kFullMask, send, o);
  }
  o /= 2;
  upper = (lane & o) != 0;
  v[0] = (upper ? v[1] : v[0]) + __shfl_xor_sync(kFullMask, upper ? v[0] : v[1], o);
  for (o /= 2; o > 0; o /= 2) v[0] += __shfl_xor_sync(kFullMask, v[0], o);
  return v[0];
}

// The running softmax state of a split block's query heads, in shared memory.
struct SplitSoftmax {
  float m[kSplitKvGroupHeads];      // running max score
  float l[kSplitKvGroupHeads];      // running denominator
  float alpha[kSplitKvGroupHeads];  // this tile's rescale of earlier sums, exp(m_old - m_new)
};

// One tile's online-softmax step for each of `heads` query heads: p_s[g][j] (j < n <= kTile) holds
// head g's scores and becomes its weights exp(s - m_new); a warp per head updates m, l and alpha.
// Every thread calls it; it ends with a barrier.
template <int kTile, int kWarps>
__device__ __forceinline__ void split_softmax_tile(float (*p_s)[kTile], int n, int heads, SplitSoftmax& sm) {
  const int lane = threadIdx.x & 31;
  for (int g = threadIdx.x >> 5; g < heads; g += kWarps) {  // uniform per warp
    const float m_old = sm.m[g];  // read by every lane before lane 0 rewrites it (below the shuffles)
    float m_tile = -INFINITY;
    for (int j = lane; j < n; j += 32) m_tile = fmaxf(m_tile, p_s[g][j]);
    const float m_new = fmaxf(m_old, warp_max(m_tile));
    float l_tile = 0.0f;
    for (int j = lane; j < n; j += 32) {
      const float e = expf(p_s[g][j] - m_new);
      p_s[g][j] = e;
      l_tile += e;
    }
    l_tile = warp_sum(l_tile);
    if (lane == 0) {
      const float alpha = expf(m_old - m_new);  // 0 on the first tile (m_old = -inf)
      sm.alpha[g] = alpha;
      sm.l[g] = sm.l[g] * alpha + l_tile;
      sm.m[g] = m_new;
    }
  }
  __syncthreads();
}

// Index of partial (token, head, chunk) in SplitKvScratch's max and sum ([tokens, heads, splits]).
__device__ __forceinline__ int64_t split_partial(int64_t token, int heads, int head, int splits, int chunk) {
  return (token * heads + head) * splits + chunk;
}

// The merge's parameters for a split launch of either attention params (host code).
template <template <class> class Params, class T>
SplitKvMergeParams<T> split_merge_params(const Params<T>& p, const SplitKvScratch& s, int head_dim) {
  SplitKvMergeParams<T> m{};
  m.part = s;
  m.out = p.out;
  m.slots = p.slots;
  m.positions = p.positions;
  m.tokens = p.tokens;
  m.heads = p.heads;
  m.head_dim = head_dim;
  m.slot_count = p.slot_count;
  m.capacity = p.capacity;
  m.skip_tensor_core_tiles = p.skip_tensor_core_tiles;
  m.sinks = p.sinks;
  return m;
}

// Blocks of a split launch in x: (token, kv head, group of up to kSplitKvGroupHeads query heads).
template <class Params>
unsigned split_grid_x(const Params& p) {
  const int group = p.heads / p.kv_heads;
  return unsigned(p.tokens * p.kv_heads * ((group + kSplitKvGroupHeads - 1) / kSplitKvGroupHeads));
}

}  // namespace strata::cuda
