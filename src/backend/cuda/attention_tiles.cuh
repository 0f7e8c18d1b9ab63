// Which query tiles the tensor-core attention kernel (attention_tc.cu) takes, decided on the
// device from the step's slots and positions so the host needs no copy of them. Both attention
// kernels evaluate the same rule: the tiled kernel computes the tiles it accepts, and the
// per-token kernel, launched after it, skips the tokens of those tiles.
#pragma once
#include <cstdint>

#include "kernels.h"

namespace strata::cuda {

constexpr int kQueryTile = 64;        // consecutive query tokens of one block of the tiled kernel
constexpr int kMaxTileRuns = 4;       // runs of one slot a tile may hold (packed prefill: 1 or 2)
constexpr int kMinTokensPerRun = 8;   // fewer (decode steps) stay with the per-token kernel

// The first key a token at `pos` sees: window > 0 limits it to the last `window` positions
// (AttentionSpec::first_key).
__device__ __forceinline__ int first_key(int pos, int window) {
  return window > 0 && pos >= window ? pos - window + 1 : 0;
}

// A scaled score after the soft cap (AttentionSpec::cap): softcap * tanh(s / softcap), or s.
__device__ __forceinline__ float cap_score(float s, float softcap) {
  return softcap > 0.0f ? softcap * tanhf(s / softcap) : s;
}

// What multiplies a row's weighted sum of values (accumulated against its running max m, softmax
// sum l) to give query head `head`'s output: 1 / l, or with the head's sink logit (sinks: F32
// [heads], or null) 1 / (l + exp(sink - m)), against the larger of m and the sink
// (softmax_normalizer in backend.h).
__device__ __forceinline__ float softmax_normalizer(float m, float l, const float* sinks, int head) {
  if (sinks == nullptr) return 1.0f / l;
  const float s = sinks[head], top = fmaxf(m, s), shift = expf(m - top);
  return shift / (l * shift + expf(s - top));
}

// Loads the slots and positions of query tile `tile` into slot_s / pos_s ([kQueryTile]; -1 past
// the step's end) and says whether the tiled kernel takes the tile: every token valid, at most
// kMaxTileRuns runs of consecutive tokens sharing a slot, and at least kMinTokensPerRun tokens
// per run on average. Every thread of the block must call it (it synchronizes), blockDim.x >=
// kQueryTile. Returns the same value to every thread.
// Params: AttentionParams or QuantAttentionParams.
template <class Params>
__device__ __forceinline__ bool load_query_tile(const Params& p, int64_t tile, int32_t* slot_s, int32_t* pos_s) {
  const int64_t t0 = tile * kQueryTile;
  const int i = threadIdx.x;
  bool invalid = false;
  bool run_start = false;
  if (i < kQueryTile) {
    const int64_t t = t0 + i;
    int32_t slot = -1, pos = -1;
    if (t < p.tokens) {
      slot = p.slots[t];
      pos = p.positions[t];
      invalid = slot < 0 || slot >= p.slot_count || pos < 0 || pos >= p.capacity;
      run_start = i == 0 || p.slots[t - 1] != slot;
    }
    slot_s[i] = slot;
    pos_s[i] = pos;
  }
  const int runs = __syncthreads_count(run_start);    // also publishes slot_s and pos_s
  if (__syncthreads_or(invalid)) return false;        // the per-token kernel writes their NaNs
  const int64_t n_tokens = p.tokens - t0 < kQueryTile ? p.tokens - t0 : kQueryTile;
  return runs <= kMaxTileRuns && n_tokens >= int64_t(runs) * kMinTokensPerRun;
}

// The (token, query head) of a block of the per-token kernels, whose block x is token * heads +
// head: a token's blocks are adjacent, so query heads that share a kv head run side by side and
// read its keys and values through L2 instead of each from memory. Returns false when the
// tensor-core kernel took the token's tile (the block then has nothing to do). Every thread of
// the block must call it.
template <class Params>
__device__ __forceinline__ bool per_token_block(const Params& p, int64_t& token, int& head) {
  token = blockIdx.x / p.heads;
  head = int(blockIdx.x % p.heads);
  if (!p.skip_tensor_core_tiles) return true;
  __shared__ int32_t slot_s[kQueryTile];
  __shared__ int32_t pos_s[kQueryTile];
  return !load_query_tile(p, token / kQueryTile, slot_s, pos_s);
}

}  // namespace strata::cuda
