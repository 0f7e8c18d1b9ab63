#include "strata/runtime/forward_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "strata/core/error.h"
#include "strata/runtime/moe_routing.h"

namespace strata {
namespace {

struct PieceShape {
  DType dt;
  std::vector<int64_t> dims;
};

// The workspace's pieces, in the order of ForwardOps::bind_workspace's targets. Logits are fp32 on
// every backend (head()).
// mlp_a_ holds the stacked q/k/v GEMM's output until split_qkv, the output projection's in layer()
// until its add_norm, then the MLP's first GEMM's (gate and up side by side for SwiGLU); mlp_b_ is
// SwiGLU's product (the other MLPs act in place).
// A mixture of experts adds the router's logits, the step's T k assignments' rows (each expert's
// gathered inputs, then its outputs in their place), and the routing's index pieces; the
// experts' gate/up outputs and SwiGLU products reuse mlp_a_ and mlp_b_, as many experts' side by
// side as fit (an expert takes at most T rows). Routed on the device, a step's experts are one
// run (the host does not know their rows), so mlp_a_ and mlp_b_ hold all T k rows of a step of up
// to device_routed_tokens(cfg) tokens.

// The most tokens a step may route on the device: 16, where no expert gets more rows than one pass
// of the fused linear takes (kQuantLinearTokens), or up to 64 while the step's mean rows per
// expert stay at most 4 (Qwen3-MoE's 8 of 128 up to 64 tokens, Mixtral's 2 of 8 up to 16), so an
// expert past 16 rows, which the fused linear reads in a second pass, stays rare.
int64_t device_routed_tokens(const ModelConfig& cfg) {
  if (!cfg.moe()) return 0;
  return std::max<int64_t>(16, std::min<int64_t>(64, 4 * cfg.n_experts / cfg.experts_per_token));
}

std::vector<PieceShape> workspace_shapes(const ModelConfig& cfg, DType dt, int64_t T, int64_t R) {
  const int64_t h = cfg.hidden, qd = cfg.q_dim(), V = cfg.vocab_size;
  const int64_t f = std::max(cfg.intermediate, cfg.expert_intermediate);
  const bool swiglu = cfg.gated_mlp();
  const int64_t a_width = std::max({swiglu ? 2 * f : f, qd + 2 * cfg.kv_dim(), h});
  const int64_t k = cfg.moe() ? cfg.experts_per_token : 0, E = cfg.moe() ? cfg.n_experts : 0;
  const int64_t routed = T * k, device_routed = std::min(T, device_routed_tokens(cfg)) * k;
  const auto rows_for = [](int64_t rows, int64_t elements, int64_t width) {
    return std::max(rows, (elements + width - 1) / width);
  };
  const int64_t a_rows = rows_for(T, device_routed * 2 * cfg.expert_intermediate, a_width);
  const int64_t b_rows = swiglu ? rows_for(T, device_routed * cfg.expert_intermediate, f) : 0;
  return {{dt, {T, h}},          {dt, {T, cfg.n_heads, cfg.head_dim}},
          {dt, {T, cfg.n_kv_heads, cfg.head_dim}}, {dt, {T, cfg.n_kv_heads, cfg.head_dim}},
          {dt, {T, qd}},         {dt, {a_rows, a_width}},
          {dt, {b_rows, f}},     {dt, {R, h}},
          {DType::F32, {R, V}},  {DType::I32, {T}},
          {DType::I32, {T}},     {DType::I32, {T}},
          {DType::I32, {T}},     {DType::I32, {R}},
          {dt, {routed, h}},     {DType::F32, {cfg.moe() ? T : 0, E}},
          {DType::I32, {routed}}, {DType::I32, {routed}},
          {DType::F32, {routed}}, {DType::I32, {cfg.moe() ? E + 1 : 0}},
          {DType::I32, {std::min(E, device_routed)}}};
}

size_t piece_bytes(const PieceShape& p) {
  size_t n = dtype_size(p.dt);
  for (int64_t d : p.dims) n *= size_t(d);
  return (n + 255) / 256 * 256;  // every piece 256-byte aligned, as cuBLAS and vector loads like
}

// The first rows x width elements of a workspace piece, as [rows, width].
Tensor leading(const Tensor& piece, int64_t rows, int64_t width) {
  STRATA_CHECK(rows * width <= piece.numel(), "internal: " << rows << " x " << width << " outgrow the piece "
                                                           << piece.shape_str());
  return Tensor(piece.data, piece.dtype, piece.device, {rows, width});
}

}  // namespace

ForwardOps::ForwardOps(const ModelConfig& cfg, Backend& backend) : cfg_(cfg), backend_(backend) {}

LayerAttention layer_attention(const ModelConfig& cfg, const Tensor& rope_table, const Tensor& sinks_table, int layer) {
  LayerAttention a;
  const bool window = cfg.window_layer(layer);
  a.spec = AttentionSpec(cfg.attention_scale(layer), window ? cfg.layer_window : 0, cfg.attn_softcap);
  if (cfg.attn_sinks) {
    STRATA_CHECK(sinks_table.dtype == DType::F32 && sinks_table.numel() == int64_t(cfg.n_layers) * cfg.n_heads,
                 "internal: attention sinks " << sinks_table.shape_str() << " for " << cfg.n_layers << " layers of "
                                              << cfg.n_heads << " heads");
    a.spec.sinks = static_cast<const float*>(sinks_table.data) + int64_t(layer) * cfg.n_heads;
  }
  if (rope_table.empty()) return a;
  const int64_t half = cfg.head_dim / 2, row = cfg.rope_row(layer);
  STRATA_CHECK(rope_table.numel() >= (row + 1) * half,
               "internal: RoPE table of " << rope_table.numel() << " frequencies for layer " << layer);
  a.inv_freq = Tensor(static_cast<float*>(rope_table.data) + row * half, DType::F32, rope_table.device, {half});
  return a;
}

size_t ForwardOps::workspace_bytes(const ModelConfig& cfg, DType dt, int64_t T, int64_t R) {
  size_t total = 0;
  for (const PieceShape& p : workspace_shapes(cfg, dt, T, R)) total += piece_bytes(p);
  return total;
}

void ForwardOps::bind_workspace(void* base, int64_t T, int64_t R) {
  Tensor* const targets[] = {&xn_,     &q_,      &k_,         &v_,        &attn_,       &mlp_a_,
                             &mlp_b_,  &last_,   &logits_,    &ids_,      &pos_,        &pos_shifted_,
                             &slots_,  &rows_,   &moe_rows_,  &router_,   &moe_gather_, &moe_combine_,
                             &moe_weights_, &moe_begin_, &moe_active_};
  const std::vector<PieceShape> shapes = workspace_shapes(cfg_, backend_.activation_dtype(), T, R);
  size_t offset = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    Tensor& t = *targets[i];
    t = Tensor();
    t.data = static_cast<char*>(base) + offset;
    t.dtype = shapes[i].dt;
    t.device = backend_.device();
    t.ndim = int(shapes[i].dims.size());
    for (size_t d = 0; d < shapes[i].dims.size(); ++d) t.shape[d] = shapes[i].dims[d];
    offset += piece_bytes(shapes[i]);
  }
  ws_tokens_ = T;
  ws_rows_ = R;
  indices_ = ids_.data;
  uploaded_.clear();
}

void ForwardOps::begin_step(const StepBatch& batch, int cache_slots, int cache_capacity) {
  const int64_t T = int64_t(batch.tokens.size()), R = int64_t(batch.logit_rows.size());
  STRATA_CHECK(T > 0 && batch.positions.size() == size_t(T) && batch.slots.size() == size_t(T),
               "forward: tokens, positions and slots must have the same non-zero length");
  STRATA_CHECK(T <= ws_tokens_ && R <= ws_rows_,
               "forward: step of " << T << " tokens / " << R << " rows exceeds the workspace (" << ws_tokens_ << " / "
                                   << ws_rows_ << ")");
  for (int64_t t = 0; t < T; ++t) {
    STRATA_CHECK(batch.tokens[t] >= 0 && batch.tokens[t] < cfg_.vocab_size,
                 "token id " << batch.tokens[t] << " outside the vocabulary of " << cfg_.vocab_size);
    STRATA_CHECK(batch.positions[t] >= 0 && batch.positions[t] < std::min(cache_capacity, cfg_.max_positions),
                 "position " << batch.positions[t] << " outside the context");
    STRATA_CHECK(batch.slots[t] >= 0 && batch.slots[t] < cache_slots, "slot " << batch.slots[t] << " outside the cache");
  }
  for (int32_t r : batch.logit_rows) STRATA_CHECK(r >= 0 && r < T, "logit row " << r << " outside the step");
  for (const PrefixCopy& c : batch.prefix_copies) {
    STRATA_CHECK(c.src >= 0 && c.src < cache_slots && c.dst >= 0 && c.dst < cache_slots && c.src != c.dst &&
                     c.length >= 0 && c.length <= cache_capacity,
                 "prefix copy of " << c.length << " positions from slot " << c.src << " to slot " << c.dst
                                   << " outside the cache");
    for (int64_t t = 0; t < T; ++t)
      STRATA_CHECK(batch.slots[t] != c.dst || batch.positions[t] >= c.length,
                   "prefix copy into slot " << c.dst << " would overwrite position " << batch.positions[t]
                                            << " of the step");
  }
  copies_ = batch.prefix_copies;
  T_ = T;
  R_ = R;
  upload_indices(batch);
}

// The step's ids, positions, shifted positions, slots and logit rows go up as one copy (on CUDA one
// stream synchronization instead of five): the five pieces are re-laid out for this step's T, each
// 256-byte aligned as bind_workspace's, in the space bind_workspace gave them (sized for the
// largest step), so the copy is about 4 T + R values whatever the workspace's size. The offloading
// engine begins a step for every sub-layer of a unit; with one unit a sub-layer, the repeats find
// the same bytes on the device and copy nothing.
void ForwardOps::upload_indices(const StepBatch& batch) {
  const size_t T = batch.tokens.size(), R = batch.logit_rows.size();
  const size_t piece = (T * 4 + 255) / 256 * 256 / 4;  // values per piece
  Tensor* const pieces[] = {&ids_, &pos_, &pos_shifted_, &slots_, &rows_};
  for (size_t k = 0; k < 5; ++k) pieces[k]->data = static_cast<char*>(indices_) + k * piece * 4;
  std::vector<int32_t> staged(4 * piece + R, 0);
  std::copy(batch.tokens.begin(), batch.tokens.end(), staged.begin());
  std::copy(batch.positions.begin(), batch.positions.end(), staged.begin() + ptrdiff_t(piece));
  if (cfg_.pos == PosKind::Learned)  // OPT's table starts at index 2
    for (size_t t = 0; t < T; ++t) staged[2 * piece + t] = batch.positions[t] + cfg_.pos_offset;
  std::copy(batch.slots.begin(), batch.slots.end(), staged.begin() + ptrdiff_t(3 * piece));
  std::copy(batch.logit_rows.begin(), batch.logit_rows.end(), staged.begin() + ptrdiff_t(4 * piece));
  // Equal bytes mean the device already holds what this step's layout reads.
  if (staged == uploaded_) return;
  backend_.upload(indices_, staged.data(), staged.size() * 4);
  uploaded_ = std::move(staged);
}

void ForwardOps::norm(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& out) {
  if (cfg_.norm == NormKind::LayerNorm) backend_.layer_norm(x, w, b, cfg_.norm_eps, out);
  else backend_.rms_norm(x, w, cfg_.norm_eps, out, norm_offset());
}

float ForwardOps::norm_offset() const { return cfg_.norm_plus_one ? 1.0f : 0.0f; }

Backend::Norm ForwardOps::norm_kind() const {
  return cfg_.norm == NormKind::LayerNorm ? Backend::Norm::Layer : Backend::Norm::Rms;
}

void ForwardOps::embed(const ModelWeights& w, const Tensor& x) {
  backend_.embedding(ids_.rows(0, T_), w.embed, x, false);
  // Gemma: times sqrt(hidden), rounded to the activation dtype as transformers rounds it.
  if (cfg_.embed_scale > 0.0f) backend_.scale(x, round_to_dtype(cfg_.embed_scale, backend_.activation_dtype()));
  if (cfg_.pos == PosKind::Learned) backend_.embedding(pos_shifted_.rows(0, T_), w.pos_embed, x, true);
}

void ForwardOps::attention_norm(const LayerWeights& w, const Tensor& x) {
  block_input(x, w.attn_norm_w, w.attn_norm_b, xn_.rows(0, T_));
}

// A block's input: x normed, or (OLMo 2, whose norms come after its blocks) x as it is.
void ForwardOps::block_input(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& out) {
  if (cfg_.pre_norms) norm(x, w, b, out);
  else backend_.copy_on_device(out.data, x.data, x.nbytes());
}

// x += delta, and the next block's input from the new x.
void ForwardOps::add_block_input(const Tensor& x, const Tensor& delta, const Tensor& w, const Tensor& b,
                                 const Tensor& out) {
  if (cfg_.pre_norms) {
    backend_.add_norm(x, delta, norm_kind(), w, b, cfg_.norm_eps, out, norm_offset());
    return;
  }
  backend_.add(x, delta, x);
  backend_.copy_on_device(out.data, x.data, x.nbytes());
}

// Each residual add runs with the norm after it (add_norm): the attention's with the MLP's norm,
// the MLP's with the next layer's attention norm; the last layer's add is a plain add (the head
// norms only its logit rows).
void ForwardOps::layer(const LayerWeights& w, const LayerWeights* next, const LayerAttention& a, const Tensor& x,
                       const Tensor& cache_k, const Tensor& cache_v) {
  const int64_t T = T_, h = cfg_.hidden;
  const Tensor xn = xn_.rows(0, T);
  const Tensor attn = attention_from_normed(w, a, cache_k, cache_v);
  const Tensor o = leading(mlp_a_, T, h);  // free until the MLP's first GEMM
  backend_.linear(attn.reshaped({T, cfg_.q_dim()}), w.o_w, w.o_b, o);
  post_norm(w.post_attn_norm_w, o);
  add_block_input(x, o, w.mlp_norm_w, w.mlp_norm_b, xn);
  const Tensor y = mlp_from_normed(w);
  post_norm(w.post_mlp_norm_w, y);
  if (next) add_block_input(x, y, next->attn_norm_w, next->attn_norm_b, xn);
  else backend_.add(x, y, x);
}

// The step's prefix copies in one layer's caches ([S, C, ...]: a slot's positions are contiguous).
void ForwardOps::copy_prefixes(const Tensor& cache_k, const Tensor& cache_v) {
  for (const Tensor* cache : {&cache_k, &cache_v}) {
    const size_t slot_bytes = cache->row_bytes(), pos_bytes = slot_bytes / size_t(cache->dim(1));
    char* base = static_cast<char*>(cache->data);
    for (const PrefixCopy& c : copies_)
      backend_.copy_on_device(base + size_t(c.dst) * slot_bytes, base + size_t(c.src) * slot_bytes,
                              size_t(c.length) * pos_bytes);
  }
}

void ForwardOps::post_norm(const Tensor& w, const Tensor& y) {
  if (cfg_.sandwich_norms) backend_.rms_norm(y, w, cfg_.norm_eps, y, norm_offset());
}

AttentionInputs ForwardOps::attention_inputs(const LayerWeights& w, const LayerAttention& a, const Tensor& x) {
  attention_norm(w, x);
  return project_qkv(w, a);
}

Tensor ForwardOps::qkv_projection(const LayerWeights& w) {
  const Tensor qkv = leading(mlp_a_, T_, cfg_.q_dim() + 2 * cfg_.kv_dim());
  backend_.linear(xn_.rows(0, T_), w.qkv_w, w.qkv_b, qkv);
  return qkv;
}

AttentionInputs ForwardOps::project_qkv(const LayerWeights& w, const LayerAttention& a) {
  const Tensor& inv_freq = a.inv_freq;
  const int64_t T = T_;
  const Tensor pos = pos_.rows(0, T);
  const Tensor q = q_.rows(0, T), k = k_.rows(0, T), v = v_.rows(0, T);
  // One GEMM over the stacked q/k/v rows, then one pass that splits its output and rotates q and
  // k. Qwen3 normalises each head of q and k before the rotation, so there the pass only splits.
  const bool rope = cfg_.pos == PosKind::Rope;
  backend_.split_qkv(qkv_projection(w), pos, rope && !cfg_.qk_norm ? inv_freq : Tensor(), q, k, v);
  if (cfg_.qk_norm) {  // Qwen3: every head of q and k normalised on its own, in place; OLMo 2: all at once
    const bool whole = cfg_.qk_norm_whole;
    const Tensor q_heads = whole ? q.reshaped({T, cfg_.q_dim()}) : q.reshaped({T * cfg_.n_heads, cfg_.head_dim});
    const Tensor k_heads = whole ? k.reshaped({T, cfg_.kv_dim()}) : k.reshaped({T * cfg_.n_kv_heads, cfg_.head_dim});
    backend_.rms_norm(q_heads, w.q_norm_w, cfg_.norm_eps, q_heads, norm_offset());
    backend_.rms_norm(k_heads, w.k_norm_w, cfg_.norm_eps, k_heads, norm_offset());
    if (rope) {
      backend_.rope(q, pos, inv_freq);
      backend_.rope(k, pos, inv_freq);
    }
  }
  return {q, k, v};
}

void ForwardOps::attention_output(const LayerWeights& w, const Tensor& x, const Tensor& attn) {
  const int64_t T = x.dim(0);
  STRATA_CHECK(attn.dim(0) == T && T <= ws_tokens_, "internal: attention output of " << attn.dim(0) << " rows for "
                                                                                       << T << " hidden rows");
  const Tensor out = xn_.rows(0, T);
  backend_.linear(attn.reshaped({T, cfg_.q_dim()}), w.o_w, w.o_b, out);
  post_norm(w.post_attn_norm_w, out);
  backend_.add(x, out, x);
}

void ForwardOps::attention_block(const LayerWeights& w, const LayerAttention& a, const Tensor& x,
                                 const Tensor& cache_k, const Tensor& cache_v) {
  // Pre-norm: x += o_proj(attention(rope(q), rope(k), v)).
  attention_norm(w, x);
  attention_output(w, x, attention_from_normed(w, a, cache_k, cache_v));
}

// Where the cache holds the activation dtype or quantized rows, and no per-head norm comes between
// the split and the rotation, k and v go from the stacked GEMM's output straight into the cache
// (split_qkv_store): one pass instead of a split and a kv_store.
Tensor ForwardOps::attention_from_normed(const LayerWeights& w, const LayerAttention& a, const Tensor& cache_k,
                                         const Tensor& cache_v) {
  const DType dt = backend_.activation_dtype();
  auto storable = [dt](const Tensor& c) { return c.dtype == dt || c.quantized(); };
  if (cfg_.qk_norm || !storable(cache_k) || !storable(cache_v)) {
    const AttentionInputs in = project_qkv(w, a);
    backend_.kv_store(in.k, in.v, cache_k, cache_v, slots_.rows(0, T_), pos_.rows(0, T_));
    return attend_stored(in.q, a.spec, cache_k, cache_v);
  }
  const Tensor q = q_.rows(0, T_);
  backend_.split_qkv_store(qkv_projection(w), pos_.rows(0, T_), cfg_.pos == PosKind::Rope ? a.inv_freq : Tensor(), q,
                           slots_.rows(0, T_), cache_k, cache_v);
  return attend_stored(q, a.spec, cache_k, cache_v);
}

Tensor ForwardOps::attend_stored(const Tensor& q, const AttentionSpec& spec, const Tensor& cache_k,
                                 const Tensor& cache_v) {
  const int64_t T = T_;
  const Tensor attn = attn_.rows(0, T).reshaped({T, cfg_.n_heads, cfg_.head_dim});
  copy_prefixes(cache_k, cache_v);
  backend_.attention(q, cache_k, cache_v, slots_.rows(0, T), pos_.rows(0, T), spec, attn);
  return attn;
}

void ForwardOps::mlp_block(const LayerWeights& w, const Tensor& x) {
  // Pre-norm: x += fc2(act(fc1(x))), or down(silu(gate(x)) * up(x)).
  block_input(x, w.mlp_norm_w, w.mlp_norm_b, xn_.rows(0, T_));
  const Tensor y = mlp_from_normed(w);
  post_norm(w.post_mlp_norm_w, y);
  backend_.add(x, y, x);
}

Tensor ForwardOps::mlp_from_normed(const LayerWeights& w) {
  if (w.sparse()) return experts_from_normed(w);
  const int64_t T = T_;
  const Tensor xn = xn_.rows(0, T);
  const int64_t f = cfg_.intermediate;
  Tensor act;  // the input of fc2 (down)
  if (cfg_.gated_mlp()) {  // gate and up as one GEMM, side by side in each row
    const Tensor gate_up = leading(mlp_a_, T, 2 * f);
    backend_.linear(xn, w.gate_up_w, Tensor(), gate_up);
    act = mlp_b_.rows(0, T);
    gated_activation(gate_up, act);
  } else {
    act = leading(mlp_a_, T, f);
    backend_.linear(xn, w.fc1_w, w.fc1_b, act);
    backend_.activation(cfg_.mlp == MlpKind::ReLU ? Activation::ReLU : Activation::GELU, act);
  }
  backend_.linear(act, w.fc2_w, w.fc2_b, xn);
  return xn;
}

void ForwardOps::gated_activation(const Tensor& gate_up, const Tensor& act) {
  if (cfg_.mlp == MlpKind::GeGLU) backend_.geglu(gate_up, act);
  else if (cfg_.mlp == MlpKind::ClampedSwiGLU) backend_.clamped_swiglu(gate_up, act, cfg_.glu_limit, cfg_.glu_alpha);
  else backend_.swiglu(gate_up, act);
}

// Routing on the device where the backend does it for this step (routes_on_device); otherwise
// the router's logits come to the host (a wait for the step's work so far), which picks each
// token's experts and groups the step's rows by expert (route_tokens); one upload sends the
// groups back. Then every active expert runs its SwiGLU over its contiguous rows: one gate/up
// GEMM, one down GEMM, whose output replaces its inputs (many experts' GEMMs in one linears()).
// combine_rows sums each token's k outputs, weighted, into the normed input's place.
Tensor ForwardOps::experts_from_normed(const LayerWeights& w) {
  const int64_t T = T_, k = cfg_.experts_per_token, A = T * k;
  const Tensor xn = xn_.rows(0, T), logits = router_.rows(0, T);
  backend_.linear(xn, w.router_w, w.router_b, logits);
  const Tensor routed = moe_rows_.rows(0, A);
  if (routes_on_device(w)) experts_routed_on_device(w, logits, routed);
  else experts_routed_on_host(w, logits, routed);
  backend_.combine_rows(routed, moe_combine_.rows(0, A).reshaped({T, k}), moe_weights_.rows(0, A).reshaped({T, k}),
                        xn);
  return xn;
}

bool device_routing_allowed() {
  const char* v = std::getenv("STRATA_DEVICE_ROUTING");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

bool ForwardOps::routes_on_device(const LayerWeights& w) const {
  if (!w.sparse() || T_ > device_routed_tokens(cfg_) || !device_routing_) return false;
  const ExpertWeights& e = w.experts.front();
  return backend_.routes_on_device(T_, cfg_.n_experts, cfg_.experts_per_token, e.gate_up_w) &&
         backend_.routes_on_device(T_, cfg_.n_experts, cfg_.experts_per_token, e.down_w);
}

bool ForwardOps::step_routes_on_device(const std::vector<LayerWeights>& layers) const {
  for (const LayerWeights& w : layers)
    if (w.sparse() && !routes_on_device(w)) return false;
  return true;
}

// The step's experts are one run: mlp_a_ and mlp_b_ hold all T k rows (workspace_shapes), and each
// routed_linears launch reads every expert's rows from the routing on the device.
void ForwardOps::experts_routed_on_device(const LayerWeights& w, const Tensor& logits, const Tensor& routed) {
  const int64_t T = T_, E = cfg_.n_experts, k = cfg_.experts_per_token, f = cfg_.expert_intermediate, A = T * k;
  if (routing_counts_.bytes() == 0) {  // first use, never inside a capture (a key's first run is eager)
    routing_counts_ = backend_.alloc(3 * sizeof(int32_t));
    backend_.fill(routing_counts_.data(), 0, routing_counts_.bytes());
  }
  const Backend::DeviceRouting r{moe_gather_.rows(0, A), moe_combine_.rows(0, A), moe_weights_.rows(0, A),
                                 moe_begin_.rows(0, E + 1), moe_active_.rows(0, std::min(E, A)),
                                 routing_counts_.view(0, DType::I32, {3})};
  backend_.route_experts(logits, k, cfg_.norm_topk_prob, r);
  backend_.gather_rows(xn_.rows(0, T), r.gather, routed);
  std::vector<Tensor> gate_up_w, down_w, gate_up_b, down_b;  // biases: GPT-OSS's
  for (const ExpertWeights& e : w.experts) {
    gate_up_w.push_back(e.gate_up_w);
    down_w.push_back(e.down_w);
    if (!e.gate_up_b.empty()) gate_up_b.push_back(e.gate_up_b);
    if (!e.down_b.empty()) down_b.push_back(e.down_b);
  }
  const Tensor gate_up = leading(mlp_a_, A, 2 * f), act = leading(mlp_b_, A, f);
  backend_.routed_linears(routed, gate_up_w, r, T, gate_up, gate_up_b);
  gated_activation(gate_up, act);
  backend_.routed_linears(act, down_w, r, T, routed, down_b);
}

void ForwardOps::experts_routed_on_host(const LayerWeights& w, const Tensor& logits, const Tensor& routed) {
  const int64_t T = T_, E = cfg_.n_experts, k = cfg_.experts_per_token;
  const int64_t f = cfg_.expert_intermediate, A = T * k;
  std::vector<float> host(size_t(T * E));
  backend_.copy_to_host_f32(logits, host.data());
  const MoeRouting r = route_tokens(host.data(), T, int(E), int(k), cfg_.norm_topk_prob);
  ++routing_.layer_steps;
  routing_.tokens += T;
  routing_.active_experts += r.active_experts();

  // gather, combine_rows and combine_weights as one upload, laid out as bind_workspace laid
  // their pieces (the three are adjacent, each 256-byte aligned).
  const size_t rows_at = size_t(static_cast<char*>(moe_combine_.data) - static_cast<char*>(moe_gather_.data));
  const size_t weights_at = size_t(static_cast<char*>(moe_weights_.data) - static_cast<char*>(moe_gather_.data));
  std::vector<uint8_t> staged(weights_at + size_t(A) * 4);
  std::memcpy(staged.data(), r.gather.data(), size_t(A) * 4);
  std::memcpy(staged.data() + rows_at, r.combine_rows.data(), size_t(A) * 4);
  std::memcpy(staged.data() + weights_at, r.combine_weights.data(), size_t(A) * 4);
  backend_.upload(moe_gather_.data, staged.data(), staged.size());

  backend_.gather_rows(xn_.rows(0, T), moe_gather_.rows(0, A), routed);
  // The experts go in runs whose gate/up outputs fit mlp_a_ and SwiGLU products mlp_b_ side by
  // side (a run takes at least one expert: an expert has at most T rows). Each run is one
  // linears() over its experts' gate/up, one swiglu over all their rows and one linears() over
  // their downs. Qwen3-MoE's narrow experts take one run a step, Mixtral's at least two.
  const int64_t fits = std::min(mlp_a_.numel() / (2 * f), mlp_b_.numel() / f);
  const std::vector<int32_t>& at = r.expert_begin;
  std::vector<Backend::LinearJob> gate_up_jobs, down_jobs;
  for (int64_t e = 0, end = 0; e < E; e = end) {
    while (end < E && at[size_t(end) + 1] - at[size_t(e)] <= fits) ++end;
    const int64_t first = at[size_t(e)], S = at[size_t(end)] - first;
    if (S == 0) continue;
    const Tensor gate_up = leading(mlp_a_, S, 2 * f), act = leading(mlp_b_, S, f);
    gate_up_jobs.clear();
    down_jobs.clear();
    for (int64_t x = e; x < end; ++x) {
      const int64_t begin = at[size_t(x)], n = at[size_t(x) + 1] - begin;
      if (n == 0) continue;
      const ExpertWeights& ew = w.experts[size_t(x)];
      gate_up_jobs.push_back({routed.rows(begin, n), ew.gate_up_w, gate_up.rows(begin - first, n), ew.gate_up_b});
      down_jobs.push_back({act.rows(begin - first, n), ew.down_w, routed.rows(begin, n), ew.down_b});
    }
    backend_.linears(gate_up_jobs);
    gated_activation(gate_up, act);
    backend_.linears(down_jobs);
  }
}

// The device's counts join the host's, and restart from zero (int32 counters, read rarely).
RoutingTotals ForwardOps::routing_totals() const {
  if (routing_counts_.bytes() > 0) {
    int32_t counts[3];
    backend_.copy_to_host(counts, routing_counts_.data(), sizeof counts);
    routing_ = routing_ + RoutingTotals{counts[0], counts[1], counts[2]};
    backend_.fill(routing_counts_.data(), 0, routing_counts_.bytes());
  }
  return routing_;
}

void ForwardOps::select_logit_rows(const std::vector<int32_t>& rows, int64_t tokens) {
  const int64_t R = int64_t(rows.size());
  STRATA_CHECK(R <= ws_rows_, "forward: " << R << " logit rows exceed the workspace's " << ws_rows_);
  for (int32_t r : rows) STRATA_CHECK(r >= 0 && r < tokens, "logit row " << r << " outside the " << tokens << " tokens");
  if (R > 0) backend_.upload(rows_.data, rows.data(), size_t(R) * 4);
  R_ = R;
  uploaded_.clear();  // the rows piece no longer holds what begin_step uploaded
}

// The head writes fp32 logits, also on the fp16 CUDA backend (cuBLAS accumulates in fp32 and stores
// fp32): near-tied tokens stay apart, so greedy picks what the fp32 CPU backend and Hugging Face
// pick, and log-probabilities and perplexity keep float precision. A quantized head (a GPTQ
// checkpoint's lm_head) writes the activation dtype.
Tensor ForwardOps::head(const ModelWeights& w, const Tensor& x) {
  if (R_ == 0) return logits_.rows(0, 0);
  STRATA_CHECK(w.lm_head.data != nullptr, cfg_.name << ": the checkpoint has no lm_head: it computes embeddings only");
  const Tensor rows = rows_.rows(0, R_), last = last_.rows(0, R_);
  Tensor logits = logits_.rows(0, R_);
  if (w.lm_head.quantized()) logits = Tensor(logits.data, backend_.activation_dtype(), logits.device, {R_, cfg_.vocab_size});
  backend_.gather_rows(x, rows, last);
  norm(last, w.final_norm_w, w.final_norm_b, last);
  backend_.linear(last, w.lm_head, Tensor(), logits);
  if (cfg_.final_softcap > 0.0f) backend_.soft_cap(logits, cfg_.final_softcap);  // Gemma 2
  if (cfg_.logit_scale != 1.0f) backend_.scale(logits, cfg_.logit_scale);         // Granite
  return logits;
}

void ForwardOps::final_norm(const ModelWeights& w, const Tensor& x) { norm(x, w.final_norm_w, w.final_norm_b, x); }

}  // namespace strata
