// A mixture-of-experts layer's routing, on the host: from the router's logits, each token's k
// experts and weights, and the step's tokens grouped by expert so that each active expert runs
// one GEMM over a contiguous range of rows (ForwardOps).
#pragma once
#include <cstdint>
#include <vector>

namespace strata {

struct MoeRouting {
  int64_t tokens = 0;
  int k = 0;
  // The step's T x k assignments sorted by expert (tokens ascending within one): assignment a
  // takes token gather[a]; expert e's run from expert_begin[e] to expert_begin[e + 1].
  std::vector<int32_t> gather;
  std::vector<int32_t> expert_begin;  // [experts + 1]
  // Token t's output is the sum over j < k of combine_weights[t k + j] times the expert output of
  // assignment combine_rows[t k + j], its experts in ascending order (the order transformers
  // adds them in).
  std::vector<int32_t> combine_rows;
  std::vector<float> combine_weights;
  int active_experts() const;  // experts with at least one token
};

// Routing as transformers' Mixtral and Qwen3-MoE compute it: softmax over the E experts in
// float, the k largest probabilities (the lower expert on a tie), divided by their sum when
// `renormalize`. logits: [tokens, E], row-major.
MoeRouting route_tokens(const float* logits, int64_t tokens, int experts, int k, bool renormalize);

}  // namespace strata
