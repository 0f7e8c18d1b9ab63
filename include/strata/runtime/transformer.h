// The one decoder-only forward pass, driven by ModelConfig, over any backend. A step takes a
// packed list of tokens (from any number of sequences, each token with its cache slot and
// position), writes their keys and values into the KV cache, and returns logits for the rows
// asked for. Prefill (many tokens per sequence) and decode (one per sequence) are the same call.
#pragma once
#include <cstdint>
#include <vector>

#include "strata/backend/backend.h"
#include "strata/model/config.h"
#include "strata/runtime/model_weights.h"

namespace strata {

// Keys and values of every layer: [slots, capacity, kv_heads, head_dim] each.
struct KvCache {
  Buffer storage;
  std::vector<Tensor> k, v;  // per layer
  int slots = 0, capacity = 0;
};
KvCache make_kv_cache(const ModelConfig& cfg, Backend& backend, int slots, int capacity);

struct StepBatch {
  std::vector<int32_t> tokens;     // [T]
  std::vector<int32_t> positions;  // [T], 0-based position within its sequence
  std::vector<int32_t> slots;      // [T], KV cache slot of its sequence
  std::vector<int32_t> logit_rows; // indices into tokens whose logits are wanted (e.g. each sequence's last)
};

class Transformer {
public:
  Transformer(ModelConfig cfg, ModelWeights weights, Backend& backend);

  const ModelConfig& config() const { return cfg_; }
  Backend& backend() { return backend_; }

  // Runs one step; returns logits [logit_rows.size(), vocab] on the backend, valid until the next call.
  Tensor forward(const StepBatch& batch, KvCache& cache);

private:
  void ensure_workspace(int64_t tokens, int64_t rows);
  void run_layer(const LayerWeights& w, const Tensor& x, int64_t T, const Tensor& cache_k, const Tensor& cache_v);
  void norm(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& out);

  ModelConfig cfg_;
  ModelWeights w_;
  Backend& backend_;
  // Workspace, grown on demand: activations for `ws_tokens_` tokens and `ws_rows_` logit rows.
  Buffer ws_;
  int64_t ws_tokens_ = 0, ws_rows_ = 0;
  Tensor x_, xn_, q_, k_, v_, attn_, mlp_a_, mlp_b_, last_, logits_;
  Tensor ids_, pos_, pos_shifted_, slots_, rows_;
};

}  // namespace strata
