// Causal attention of prefill steps on the CPU backend: runs of consecutive positions of one
// sequence attend together, so each key and value row is read once for a tile of queries instead
// of once per query (docs/offload.md, "CPU attention"). Decode steps (one token per sequence) take
// the streaming kernel in cpu_backend.cpp.
#pragma once
#include <cstdint>
#include <vector>

#include "strata/backend/backend.h"
#include "strata/core/tensor.h"
#include "strata/core/thread_pool.h"

namespace strata::cpu {

// Tokens [first_token, first_token + tokens) of a step, at positions first_position, +1, ... of
// one slot.
struct QueryRun {
  int64_t first_token = 0, tokens = 0;
  int32_t slot = 0, first_position = 0;
};

// The step's maximal runs, in token order.
std::vector<QueryRun> query_runs(const int32_t* slots, const int32_t* positions, int64_t tokens);

// Whether the step is a prefill worth tiling: some run holds more than one token.
bool has_prefill_run(const std::vector<QueryRun>& runs);

// attention() over runs: q and out [T, heads, d] of F32, F16 or BF16; caches [S, C, kv_heads, d]
// of F32, F16, BF16, Q4 or Q8 (arguments already checked by the backend). Token t attends positions
// [spec.first_key(its own), its own] of its slot. Scores, softmax and the weighted sum in fp32.
void attend_runs(ThreadPool& pool, const Tensor& q, const Tensor& cache_k, const Tensor& cache_v,
                 const std::vector<QueryRun>& runs, const AttentionSpec& spec, const Tensor& out);

}  // namespace strata::cpu
