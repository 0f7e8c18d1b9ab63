// The one decoder-only forward pass, driven by ModelConfig, over any backend. A step takes a
// packed list of tokens (from any number of sequences, each token with its cache slot and
// position), writes their keys and values into the KV cache, and returns logits for the rows
// asked for. Prefill (many tokens per sequence) and decode (one per sequence) are the same call.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "strata/backend/backend.h"
#include "strata/model/config.h"
#include "strata/runtime/forward_ops.h"
#include "strata/runtime/model_weights.h"
#include "strata/runtime/step_graphs.h"

namespace strata {

// Keys and values of every layer: [slots, capacity, kv_heads, head_dim] each.
struct KvCache {
  Buffer storage;
  std::vector<Tensor> k, v;  // per layer
  int slots = 0, capacity = 0;
};
KvCache make_kv_cache(const ModelConfig& cfg, Backend& backend, int slots, int capacity);
// The same storage seen as slots x capacity positions (at most what it was made with); the rows
// it held are not kept in place.
void reshape_kv_cache(KvCache& cache, const ModelConfig& cfg, DType dtype, int slots, int capacity);

class Transformer {
public:
  Transformer(ModelConfig cfg, ModelWeights weights, Backend& backend);

  const ModelConfig& config() const { return cfg_; }
  Backend& backend() { return backend_; }

  // Runs one step; returns logits [logit_rows.size(), vocab] on the backend, valid until the next call.
  Tensor forward(const StepBatch& batch, KvCache& cache);
  // The same step without the LM head: hidden states after the final norm, valid until the next
  // call: of the logit_rows' tokens ([rows, hidden], gathered on the backend, so that only they
  // cross to the host), or of every token when logit_rows is empty ([tokens, hidden]).
  // Embeddings pool them. Always eager: an embedding job's steps rarely repeat a shape.
  Tensor hidden_states(const StepBatch& batch, KvCache& cache);
  // Mixture-of-experts routing over every forward() so far.
  RoutingTotals routing_totals() const { return ops_.routing_totals(); }
  // Steps that replayed a captured graph instead of launching op by op.
  int64_t graph_replays() const { return graphs_.replays(); }

private:
  void ensure_workspace(int64_t tokens, int64_t rows);
  // The layer stack and head over the step begun in ops_: logits [R, vocab].
  Tensor run_layers(int64_t tokens, KvCache& cache);
  // The embedding and the layer stack alone: the hidden state x_ [tokens, hidden].
  Tensor run_stack(int64_t tokens, KvCache& cache);

  // Step graphs: keyed by everything a capture fixes: tokens, logit rows, the workspace and the
  // cache (address, slots, capacity).
  StepGraphs graphs_;

  ModelConfig cfg_;
  ModelWeights w_;
  Backend& backend_;
  ForwardOps ops_;
  // Workspace, grown on demand: the hidden state and ForwardOps' scratch for `ws_tokens_` tokens
  // and `ws_rows_` logit rows.
  Buffer ws_;
  int64_t ws_tokens_ = 0, ws_rows_ = 0;
  Tensor x_;
  // hidden_states' selected rows: their indices (I32) then the rows, grown on demand.
  Buffer selected_;
  int64_t selected_rows_ = 0;
};

}  // namespace strata
