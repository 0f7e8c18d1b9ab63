// Embeddings: a sequence's hidden states after the final norm, pooled into one vector (the last
// token's, the mean of all, or the first token's), as sentence-transformers and vLLM's pooling
// models compute them over a decoder (Qwen3-Embedding, e5-mistral). Prefill only: no LM head, no
// decode.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "strata/model/pooling.h"
#include "strata/runtime/transformer.h"

namespace strata {

// Work done by Embedder::embed, summed over calls.
struct EmbedStats {
  int64_t sequences = 0, tokens = 0, steps = 0;
  double seconds = 0;
};

// Runs sequences through the model in packed steps of at most `step_tokens` tokens: the longest
// first, each step as many whole sequences as keep (their count x the longest) within the budget,
// so the KV cache never holds more than max(step_tokens, the longest sequence) positions; a
// sequence longer than the budget runs alone in chunks that read its earlier keys from the cache.
// The cache is kept from call to call and grows only when a call needs more.
class Embedder {
public:
  Embedder(Transformer& model, int64_t step_tokens);

  // One pooled vector [hidden] per sequence, in fp32 (unnormalized), in the order given. Every
  // sequence must be non-empty and within the model's context.
  std::vector<std::vector<float>> embed(std::span<const std::vector<int32_t>> sequences, PoolingKind pooling);
  const EmbedStats& stats() const { return stats_; }

private:
  // A cache of at least `slots` x `capacity` positions (the storage reused where it is large enough).
  void fit_cache(int slots, int capacity);

  Transformer& model_;
  int64_t step_tokens_;
  KvCache cache_;
  int64_t cache_positions_ = 0;  // slots x capacity the storage holds
  std::vector<float> rows_;      // a step's pooled rows on the host
  EmbedStats stats_;
};

}  // namespace strata
