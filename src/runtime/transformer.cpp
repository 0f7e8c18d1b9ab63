#include "strata/runtime/transformer.h"

#include <cmath>

#include "strata/core/error.h"

namespace strata {

KvCache make_kv_cache(const ModelConfig& cfg, Backend& backend, int slots, int capacity) {
  STRATA_CHECK(slots > 0 && capacity > 0, "kv cache needs slots and capacity, got " << slots << " x " << capacity);
  KvCache c;
  c.slots = slots;
  c.capacity = capacity;
  const DType dt = backend.activation_dtype();
  const size_t per = size_t(slots) * size_t(capacity) * size_t(cfg.kv_dim()) * dtype_size(dt);
  c.storage = backend.alloc(per * 2 * size_t(cfg.n_layers));
  for (int l = 0; l < cfg.n_layers; ++l) {
    c.k.push_back(c.storage.view(per * (2 * size_t(l)), dt, {slots, capacity, cfg.n_kv_heads, cfg.head_dim}));
    c.v.push_back(c.storage.view(per * (2 * size_t(l) + 1), dt, {slots, capacity, cfg.n_kv_heads, cfg.head_dim}));
  }
  return c;
}

Transformer::Transformer(ModelConfig cfg, ModelWeights weights, Backend& backend)
    : cfg_(std::move(cfg)), w_(std::move(weights)), backend_(backend) {
  cfg_.validate();
}

void Transformer::ensure_workspace(int64_t T, int64_t R) {
  if (T <= ws_tokens_ && R <= ws_rows_) return;
  T = std::max(T, ws_tokens_);
  R = std::max(R, ws_rows_);
  const DType dt = backend_.activation_dtype();
  const int64_t h = cfg_.hidden, qd = cfg_.q_dim(), f = cfg_.intermediate, V = cfg_.vocab_size;
  struct Piece { Tensor* t; DType dt; std::vector<int64_t> dims; };
  const std::vector<Piece> pieces = {
      {&x_, dt, {T, h}},       {&xn_, dt, {T, h}},          {&q_, dt, {T, cfg_.n_heads, cfg_.head_dim}},
      {&k_, dt, {T, cfg_.n_kv_heads, cfg_.head_dim}},       {&v_, dt, {T, cfg_.n_kv_heads, cfg_.head_dim}},
      {&attn_, dt, {T, qd}},   {&mlp_a_, dt, {T, f}},       {&mlp_b_, dt, {T, f}},
      {&last_, dt, {R, h}},    {&logits_, dt, {R, V}},
      {&ids_, DType::I32, {T}}, {&pos_, DType::I32, {T}},   {&pos_shifted_, DType::I32, {T}},
      {&slots_, DType::I32, {T}}, {&rows_, DType::I32, {R}}};
  size_t total = 0;
  std::vector<size_t> offsets;
  for (const Piece& p : pieces) {
    offsets.push_back(total);
    size_t n = dtype_size(p.dt);
    for (int64_t d : p.dims) n *= size_t(d);
    total += (n + 255) / 256 * 256;
  }
  ws_.reset();  // free the old workspace before taking the larger one
  ws_ = backend_.alloc(total);
  for (size_t i = 0; i < pieces.size(); ++i) {
    Tensor& t = *pieces[i].t;
    t = Tensor();
    t.data = static_cast<char*>(ws_.data()) + offsets[i];
    t.dtype = pieces[i].dt;
    t.device = backend_.device();
    t.ndim = int(pieces[i].dims.size());
    for (size_t d = 0; d < pieces[i].dims.size(); ++d) t.shape[d] = pieces[i].dims[d];
  }
  ws_tokens_ = T;
  ws_rows_ = R;
}

void Transformer::norm(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& out) {
  if (cfg_.norm == NormKind::LayerNorm) backend_.layer_norm(x, w, b, cfg_.norm_eps, out);
  else backend_.rms_norm(x, w, cfg_.norm_eps, out);
}

Tensor Transformer::forward(const StepBatch& batch, KvCache& cache) {
  const int64_t T = int64_t(batch.tokens.size()), R = int64_t(batch.logit_rows.size());
  STRATA_CHECK(T > 0 && batch.positions.size() == size_t(T) && batch.slots.size() == size_t(T),
               "forward: tokens, positions and slots must have the same non-zero length");
  for (int64_t t = 0; t < T; ++t) {
    STRATA_CHECK(batch.tokens[t] >= 0 && batch.tokens[t] < cfg_.vocab_size,
                 "token id " << batch.tokens[t] << " outside the vocabulary of " << cfg_.vocab_size);
    STRATA_CHECK(batch.positions[t] >= 0 && batch.positions[t] < std::min(cache.capacity, cfg_.max_positions),
                 "position " << batch.positions[t] << " outside the context");
    STRATA_CHECK(batch.slots[t] >= 0 && batch.slots[t] < cache.slots, "slot " << batch.slots[t] << " outside the cache");
  }
  for (int32_t r : batch.logit_rows) STRATA_CHECK(r >= 0 && r < T, "logit row " << r << " outside the step");
  ensure_workspace(T, std::max<int64_t>(R, 1));

  const Tensor ids = ids_.rows(0, T), pos = pos_.rows(0, T), slots = slots_.rows(0, T);
  backend_.copy_to_device(ids.data, batch.tokens.data(), size_t(T) * 4);
  backend_.copy_to_device(pos.data, batch.positions.data(), size_t(T) * 4);
  backend_.copy_to_device(slots.data, batch.slots.data(), size_t(T) * 4);

  const Tensor x = x_.rows(0, T);
  backend_.embedding(ids, w_.embed, x, false);
  if (cfg_.pos == PosKind::Learned) {
    std::vector<int32_t> shifted(batch.positions);
    for (int32_t& p : shifted) p += cfg_.pos_offset;  // OPT's table starts at index 2
    const Tensor ps = pos_shifted_.rows(0, T);
    backend_.copy_to_device(ps.data, shifted.data(), size_t(T) * 4);
    backend_.embedding(ps, w_.pos_embed, x, true);
  }

  for (int l = 0; l < cfg_.n_layers; ++l) run_layer(w_.layers[size_t(l)], x, T, cache.k[size_t(l)], cache.v[size_t(l)]);

  if (R == 0) return logits_.rows(0, 0);
  const Tensor rows = rows_.rows(0, R), last = last_.rows(0, R), logits = logits_.rows(0, R);
  backend_.copy_to_device(rows.data, batch.logit_rows.data(), size_t(R) * 4);
  backend_.gather_rows(x, rows, last);
  norm(last, w_.final_norm_w, w_.final_norm_b, last);
  backend_.linear(last, w_.lm_head, Tensor(), logits);
  return logits;
}

void Transformer::run_layer(const LayerWeights& w, const Tensor& x, int64_t T, const Tensor& cache_k,
                            const Tensor& cache_v) {
  const Tensor xn = xn_.rows(0, T), pos = pos_.rows(0, T), slots = slots_.rows(0, T);
  const Tensor q = q_.rows(0, T), k = k_.rows(0, T), v = v_.rows(0, T), attn = attn_.rows(0, T);
  const int64_t qd = cfg_.q_dim(), kvd = cfg_.kv_dim();

  // Attention block (pre-norm): x += o_proj(attention(rope(q), rope(k), v)).
  norm(x, w.attn_norm_w, w.attn_norm_b, xn);
  backend_.linear(xn, w.q_w, w.q_b, q.reshaped({T, qd}));
  backend_.linear(xn, w.k_w, w.k_b, k.reshaped({T, kvd}));
  backend_.linear(xn, w.v_w, w.v_b, v.reshaped({T, kvd}));
  if (cfg_.pos == PosKind::Rope) {
    backend_.rope(q, pos, w_.inv_freq);
    backend_.rope(k, pos, w_.inv_freq);
  }
  backend_.kv_store(k, v, cache_k, cache_v, slots, pos);
  backend_.attention(q, cache_k, cache_v, slots, pos, 1.0f / std::sqrt(float(cfg_.head_dim)),
                     attn.reshaped({T, cfg_.n_heads, cfg_.head_dim}));
  backend_.linear(attn, w.o_w, w.o_b, xn);
  backend_.add(x, xn, x);

  // MLP block (pre-norm): x += fc2(act(fc1(x))), or down(silu(gate(x)) * up(x)).
  norm(x, w.mlp_norm_w, w.mlp_norm_b, xn);
  const Tensor a = mlp_a_.rows(0, T), b = mlp_b_.rows(0, T);
  backend_.linear(xn, w.fc1_w, w.fc1_b, a);
  switch (cfg_.mlp) {
    case MlpKind::ReLU: backend_.activation(Activation::ReLU, a); break;
    case MlpKind::GELU: backend_.activation(Activation::GELU, a); break;
    case MlpKind::SwiGLU:
      backend_.linear(xn, w.up_w, Tensor(), b);
      backend_.swiglu(a, b, a);
      break;
  }
  backend_.linear(a, w.fc2_w, w.fc2_b, xn);
  backend_.add(x, xn, x);
}

}  // namespace strata
