#include "strata/runtime/transformer.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "strata/core/error.h"

namespace strata {

namespace {
size_t layer_cache_bytes(const ModelConfig& cfg, DType dt, int slots, int capacity) {
  return size_t(slots) * size_t(capacity) * size_t(cfg.kv_dim()) * dtype_size(dt);
}
}  // namespace

KvCache make_kv_cache(const ModelConfig& cfg, Backend& backend, int slots, int capacity) {
  STRATA_CHECK(slots > 0 && capacity > 0, "kv cache needs slots and capacity, got " << slots << " x " << capacity);
  KvCache c;
  const DType dt = backend.activation_dtype();
  c.storage = backend.alloc(layer_cache_bytes(cfg, dt, slots, capacity) * 2 * size_t(cfg.n_layers));
  reshape_kv_cache(c, cfg, dt, slots, capacity);
  return c;
}

void reshape_kv_cache(KvCache& c, const ModelConfig& cfg, DType dt, int slots, int capacity) {
  STRATA_CHECK(slots > 0 && capacity > 0, "kv cache needs slots and capacity, got " << slots << " x " << capacity);
  const size_t per = layer_cache_bytes(cfg, dt, slots, capacity);
  STRATA_CHECK(per * 2 * size_t(cfg.n_layers) <= c.storage.bytes(),
               "kv cache of " << slots << " x " << capacity << " positions exceeds its storage");
  c.slots = slots;
  c.capacity = capacity;
  c.k.clear();
  c.v.clear();
  for (int l = 0; l < cfg.n_layers; ++l) {
    c.k.push_back(c.storage.view(per * (2 * size_t(l)), dt, {slots, capacity, cfg.n_kv_heads, cfg.head_dim}));
    c.v.push_back(c.storage.view(per * (2 * size_t(l) + 1), dt, {slots, capacity, cfg.n_kv_heads, cfg.head_dim}));
  }
}

namespace {

// At most this many step shapes keep a graph (each holds its kernels' parameters).
constexpr size_t kMaxStepGraphs = 64;

}  // namespace

Transformer::Transformer(ModelConfig cfg, ModelWeights weights, Backend& backend)
    : graphs_(backend, cuda_graphs_allowed(), kMaxStepGraphs),
      cfg_(std::move(cfg)),
      w_(std::move(weights)),
      backend_(backend),
      ops_(cfg_, backend) {
  cfg_.validate();
}

void Transformer::ensure_workspace(int64_t T, int64_t R) {
  if (T <= ws_tokens_ && R <= ws_rows_) return;
  T = std::max(T, ws_tokens_);
  R = std::max(R, ws_rows_);
  const DType dt = backend_.activation_dtype();
  const size_t x_bytes = (size_t(T) * size_t(cfg_.hidden) * dtype_size(dt) + 255) / 256 * 256;
  graphs_.clear();  // their addresses are the old workspace's
  ws_.reset();  // free the old workspace before taking the larger one
  ws_ = backend_.alloc(x_bytes + ForwardOps::workspace_bytes(cfg_, dt, T, R));
  x_ = ws_.view(0, dt, {T, cfg_.hidden});
  ops_.bind_workspace(static_cast<char*>(ws_.data()) + x_bytes, T, R);
  ws_tokens_ = T;
  ws_rows_ = R;
}

// A step whose shape came before replays that shape's graph: its ids, positions and slots are
// uploaded first (begin_step), outside the graph, and the graph's kernels read them from the
// workspace. A step that copies prompt rows between slots runs eagerly (the copies' addresses vary),
// as does a mixture of experts' step routed on the host (it reads the router's logits mid-step).
Tensor Transformer::forward(const StepBatch& batch, KvCache& cache) {
  const int64_t T = int64_t(batch.tokens.size()), R = int64_t(batch.logit_rows.size());
  ensure_workspace(std::max<int64_t>(T, 1), std::max<int64_t>(R, 1));
  ops_.begin_step(batch, cache.slots, cache.capacity);
  if (!graphs_.enabled() || !batch.prefix_copies.empty() || !ops_.step_routes_on_device(w_.layers))
    return run_layers(T, cache);
  return graphs_.run({T, R, StepGraphs::address(ws_.data()), StepGraphs::address(cache.storage.data()), cache.slots,
                      cache.capacity},
                     [&] { return run_layers(T, cache); });
}

Tensor Transformer::hidden_states(const StepBatch& batch, KvCache& cache) {
  // The rows go through a buffer of their own, not the step's logit rows, whose workspace holds
  // [rows, vocab] logits.
  StepBatch step = batch;
  step.logit_rows.clear();
  const int64_t T = int64_t(step.tokens.size()), R = int64_t(batch.logit_rows.size());
  for (int32_t r : batch.logit_rows) STRATA_CHECK(r >= 0 && r < T, "hidden row " << r << " outside the step");
  ensure_workspace(std::max<int64_t>(T, 1), 1);
  ops_.begin_step(step, cache.slots, cache.capacity);
  const Tensor x = run_stack(T, cache);
  if (R == 0) {
    ops_.final_norm(w_, x);
    return x;
  }
  const DType dt = backend_.activation_dtype();
  const size_t index_bytes = (size_t(R) * sizeof(int32_t) + 255) / 256 * 256;
  if (R > selected_rows_) {
    selected_.reset();
    selected_ = backend_.alloc(index_bytes + size_t(R) * size_t(cfg_.hidden) * dtype_size(dt));
    selected_rows_ = R;
  }
  const Tensor rows = selected_.view(0, DType::I32, {R});
  const Tensor out = selected_.view(index_bytes, dt, {R, cfg_.hidden});
  backend_.copy_to_device(rows.data, batch.logit_rows.data(), size_t(R) * sizeof(int32_t));
  backend_.gather_rows(x, rows, out);
  ops_.final_norm(w_, out);
  return out;
}

Tensor Transformer::run_layers(int64_t T, KvCache& cache) { return ops_.head(w_, run_stack(T, cache)); }

Tensor Transformer::run_stack(int64_t T, KvCache& cache) {
  const Tensor x = x_.rows(0, T);
  ops_.embed(w_, x);
  ops_.attention_norm(w_.layers[0], x);
  for (int l = 0; l < cfg_.n_layers; ++l) {
    const LayerWeights* next = l + 1 < cfg_.n_layers ? &w_.layers[size_t(l + 1)] : nullptr;
    ops_.layer(w_.layers[size_t(l)], next, layer_attention(cfg_, w_.inv_freq, w_.attn_sinks, l), x, cache.k[size_t(l)],
               cache.v[size_t(l)]);
  }
  return x;
}

}  // namespace strata
