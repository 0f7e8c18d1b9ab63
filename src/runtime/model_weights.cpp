#include "strata/runtime/model_weights.h"

#include <set>
#include <vector>

#include "strata/core/error.h"
#include "strata/core/thread_pool.h"
#include "strata/model/weight_specs.h"

namespace strata {
namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// A weight quantized at load (bench_quant measures the rate), its rows spread over `pool` if any.
void quantize_on_host(const quant::QuantSpec& spec, const float* x, int64_t rows, int64_t n, uint8_t* dst,
                      ThreadPool* pool) {
  const size_t row_bytes = quant::row_bytes(spec, n);
  parallel_for(pool, rows, [&](int64_t r0, int64_t r1) {
    quant::quantize_rows(spec, x + r0 * n, DType::F32, r1 - r0, n, dst + size_t(r0) * row_bytes);
  });
}

// Some OPT checkpoints name tensors without the "model." prefix ("decoder.layers.0...").
std::string stored_name(const WeightSource& src, const std::string& name) {
  if (src.contains(name)) return name;
  if (name.rfind("model.", 0) == 0 && src.contains(name.substr(6))) return name.substr(6);
  STRATA_FAIL(src.describe() << ": missing tensor '" << name << "'");
}

Tensor make_view(void* base, size_t offset, DType dt, Device dev, const std::vector<int64_t>& shape) {
  Tensor t;
  t.data = static_cast<char*>(base) + offset;
  t.dtype = dt;
  t.device = dev;
  t.ndim = int(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) t.shape[i] = shape[i];
  return t;
}

Tensor make_spec_view(const BlockLayout& layout, size_t i, void* base, Device dev) {
  Tensor t = make_view(base, layout.offsets[i], layout.dtypes[i], dev, layout.specs[i].shape);
  if (is_quantized(layout.dtypes[i])) t.group = layout.compression->group_size;
  return t;
}

// Bytes of spec i of a layout as stored.
size_t stored_bytes(const WeightSpec& spec, DType dt, const std::optional<quant::QuantSpec>& compression) {
  if (!is_quantized(dt)) return size_t(spec.numel()) * dtype_size(dt);
  return size_t(spec.shape[0]) * quant::row_bytes(*compression, spec.shape[1]);
}

Buffer upload_block(const BlockLayout& layout, const WeightSource& src, Backend& backend, std::set<std::string>& used,
                    ThreadPool& pool) {
  std::vector<uint8_t> staging(layout.bytes);
  read_block(layout, src, staging.data(), used, nullptr, &pool);
  Buffer block = backend.alloc(layout.bytes);
  backend.copy_to_device(block.data(), staging.data(), layout.bytes);
  return block;
}

// Whether `role` is stacked under `prev` in one matrix: q, k, v (and their biases), gate and up.
bool stacks_under(WeightRole prev, WeightRole role) {
  using R = WeightRole;
  return (prev == R::QW && role == R::KW) || (prev == R::KW && role == R::VW) || (prev == R::QB && role == R::KB) ||
         (prev == R::KB && role == R::VB) || (prev == R::Fc1W && role == R::UpW) ||
         (prev == R::ExpertGateW && role == R::ExpertUpW) || (prev == R::ExpertGateB && role == R::ExpertUpB);
}

BlockLayout block_layout(std::vector<WeightSpec> specs, DType dt, const std::optional<quant::QuantSpec>& compression) {
  const size_t align = 256;  // keeps every view aligned for vector loads and cuBLAS
  BlockLayout b;
  b.dtype = dt;
  b.compression = compression;
  b.specs = std::move(specs);
  size_t end = 0;  // of the last tensor, before the padding that aligns the next
  for (size_t i = 0; i < b.specs.size(); ++i) {
    const WeightSpec& s = b.specs[i];
    const DType stored = compression && is_projection(s.role) ? quant::dtype_of(*compression) : dt;
    // A stacked tensor starts where the one above it ends: their rows form one matrix.
    const size_t offset = i > 0 && stacks_under(b.specs[i - 1].role, s.role) ? end : b.bytes;
    b.offsets.push_back(offset);
    b.dtypes.push_back(stored);
    end = offset + stored_bytes(s, stored, compression);
    b.bytes = (end + align - 1) / align * align;
  }
  return b;
}

// A view of rows stacked from `top` down through `bottom` (stacks_under), or an empty tensor when
// either is absent.
Tensor stacked_view(const Tensor& top, const Tensor& bottom, int64_t rows) {
  if (top.empty() || bottom.empty()) return Tensor();
  STRATA_CHECK(static_cast<const char*>(bottom.data) + bottom.nbytes() ==
                   static_cast<const char*>(top.data) + (top.ndim == 1 ? size_t(rows) * dtype_size(top.dtype)
                                                                       : size_t(rows) * top.row_bytes()),
               "internal: stacked projections are not contiguous");
  Tensor t = top;
  t.shape[0] = rows;
  return t;
}

// The stacked matrices' views over a layer's q/k/v and gate/up (block_layout lays them so).
void set_stacked_views(LayerWeights& lw) {
  if (!lw.q_w.empty() && !lw.k_w.empty() && !lw.v_w.empty()) {
    const int64_t rows = lw.q_w.dim(0) + lw.k_w.dim(0) + lw.v_w.dim(0);
    lw.qkv_w = stacked_view(lw.q_w, lw.v_w, rows);
    lw.qkv_b = stacked_view(lw.q_b, lw.v_b, rows);
  }
  if (!lw.up_w.empty()) lw.gate_up_w = stacked_view(lw.fc1_w, lw.up_w, lw.fc1_w.dim(0) + lw.up_w.dim(0));
  for (ExpertWeights& e : lw.experts) {
    e.gate_up_w = stacked_view(e.gate_w, e.up_w, e.gate_w.dim(0) + e.up_w.dim(0));
    if (!e.gate_b.empty()) e.gate_up_b = stacked_view(e.gate_b, e.up_b, e.gate_b.dim(0) + e.up_b.dim(0));
  }
}

}  // namespace

bool is_projection(WeightRole role) {
  switch (role) {
    case WeightRole::QW: case WeightRole::KW: case WeightRole::VW: case WeightRole::OW:
    case WeightRole::Fc1W: case WeightRole::UpW: case WeightRole::Fc2W:
    case WeightRole::ExpertGateW: case WeightRole::ExpertUpW: case WeightRole::ExpertDownW: return true;
    default: return false;
  }
}

const Tensor& layer_tensor(const LayerWeights& lw, const WeightSpec& spec) {
  switch (spec.role) {
    case WeightRole::AttnNormW: return lw.attn_norm_w;
    case WeightRole::AttnNormB: return lw.attn_norm_b;
    case WeightRole::QW: return lw.q_w;
    case WeightRole::QB: return lw.q_b;
    case WeightRole::QNormW: return lw.q_norm_w;
    case WeightRole::KNormW: return lw.k_norm_w;
    case WeightRole::KW: return lw.k_w;
    case WeightRole::KB: return lw.k_b;
    case WeightRole::VW: return lw.v_w;
    case WeightRole::VB: return lw.v_b;
    case WeightRole::OW: return lw.o_w;
    case WeightRole::OB: return lw.o_b;
    case WeightRole::MlpNormW: return lw.mlp_norm_w;
    case WeightRole::MlpNormB: return lw.mlp_norm_b;
    case WeightRole::Fc1W: return lw.fc1_w;
    case WeightRole::Fc1B: return lw.fc1_b;
    case WeightRole::UpW: return lw.up_w;
    case WeightRole::Fc2W: return lw.fc2_w;
    case WeightRole::Fc2B: return lw.fc2_b;
    case WeightRole::PostAttnNormW: return lw.post_attn_norm_w;
    case WeightRole::PostMlpNormW: return lw.post_mlp_norm_w;
    case WeightRole::RouterW: return lw.router_w;
    case WeightRole::RouterB: return lw.router_b;
    case WeightRole::ExpertGateW: case WeightRole::ExpertUpW: case WeightRole::ExpertDownW:
    case WeightRole::ExpertGateB: case WeightRole::ExpertUpB: case WeightRole::ExpertDownB: {
      STRATA_CHECK(spec.expert >= 0 && size_t(spec.expert) < lw.experts.size(),
                   "internal: " << spec.name << " names expert " << spec.expert << " of " << lw.experts.size());
      const ExpertWeights& e = lw.experts[size_t(spec.expert)];
      switch (spec.role) {
        case WeightRole::ExpertGateW: return e.gate_w;
        case WeightRole::ExpertUpW: return e.up_w;
        case WeightRole::ExpertDownW: return e.down_w;
        case WeightRole::ExpertGateB: return e.gate_b;
        case WeightRole::ExpertUpB: return e.up_b;
        default: return e.down_b;
      }
    }
    default: STRATA_FAIL("internal: not a layer role");
  }
}
Tensor& layer_tensor(LayerWeights& lw, const WeightSpec& spec) {
  if (spec.expert >= 0 && size_t(spec.expert) >= lw.experts.size()) lw.experts.resize(size_t(spec.expert) + 1);
  return const_cast<Tensor&>(layer_tensor(static_cast<const LayerWeights&>(lw), spec));
}

BlockLayout layer_block_layout(const ModelConfig& cfg, int layer, DType dtype,
                               const std::optional<quant::QuantSpec>& compression) {
  return block_layout(layer_weight_specs(cfg, layer), dtype, compression);
}
namespace {
bool attention_half_role(WeightRole r) {
  switch (r) {
    case WeightRole::AttnNormW: case WeightRole::AttnNormB: case WeightRole::QW: case WeightRole::QB:
    case WeightRole::QNormW: case WeightRole::KW: case WeightRole::KB: case WeightRole::KNormW: case WeightRole::VW:
    case WeightRole::VB: case WeightRole::OW: case WeightRole::OB: case WeightRole::PostAttnNormW: return true;
    default: return false;
  }
}
}  // namespace

HalvedLayout halved_layer_layout(const ModelConfig& cfg, int layer, DType dtype, size_t align,
                                 const std::optional<quant::QuantSpec>& compression) {
  auto round_up = [align](size_t n) { return (n + align - 1) / align * align; };
  HalvedLayout h;
  h.layout = layer_block_layout(cfg, layer, dtype, compression);
  BlockLayout& l = h.layout;
  // The MLP half begins at its norm (OLMo 2, without one: at its first matrix or the router).
  size_t first_mlp = l.specs.size();
  for (size_t i = 0; i < l.specs.size() && first_mlp == l.specs.size(); ++i)
    if (!attention_half_role(l.specs[i].role)) first_mlp = i;
  STRATA_CHECK(first_mlp < l.specs.size(), "layer " << layer << " has no MLP");
  h.mlp_offset = round_up(l.offsets[first_mlp]);
  const size_t shift = h.mlp_offset - l.offsets[first_mlp];
  for (size_t i = first_mlp; i < l.offsets.size(); ++i) l.offsets[i] += shift;
  h.attn_bytes = h.mlp_offset;
  h.mlp_bytes = round_up(l.bytes + shift - h.mlp_offset);
  l.bytes = h.attn_bytes + h.mlp_bytes;
  return h;
}

BlockLayout half_block_layout(const HalvedLayout& halves, int half) {
  BlockLayout out;
  out.dtype = halves.layout.dtype;
  out.compression = halves.layout.compression;
  out.bytes = half ? halves.mlp_bytes : halves.attn_bytes;
  const size_t base = half ? halves.mlp_offset : 0;
  for (size_t i = 0; i < halves.layout.specs.size(); ++i) {
    if ((halves.layout.offsets[i] >= halves.mlp_offset) != bool(half)) continue;
    out.specs.push_back(halves.layout.specs[i]);
    out.offsets.push_back(halves.layout.offsets[i] - base);
    out.dtypes.push_back(halves.layout.dtypes[i]);
  }
  return out;
}

BlockLayout global_block_layout(const ModelConfig& cfg, DType dtype) {
  return block_layout(global_weight_specs(cfg), dtype, std::nullopt);
}

namespace {

// The stored name of `s`'s tensor, whose shape must be the one the config implies.
std::string checked_stored_name(const WeightSource& src, const WeightSpec& s) {
  const std::string name = stored_name(src, s.name);
  const std::vector<int64_t> shape = src.shape(name);
  if (shape != s.shape)
    STRATA_FAIL(src.describe() << ": tensor '" << name << "' has shape " << shape_str(shape) << ", the config implies "
                               << shape_str(s.shape));
  return name;
}

}  // namespace

void read_block(const BlockLayout& layout, const WeightSource& src, void* host_dst, std::set<std::string>& used,
                CodesTally* tally, ThreadPool* pool) {
  for (size_t i = 0; i < layout.specs.size(); ++i) {
    const WeightSpec& s = layout.specs[i];
    const std::string name = checked_stored_name(src, s);
    uint8_t* dst = static_cast<uint8_t*>(host_dst) + layout.offsets[i];
    if (is_quantized(layout.dtypes[i])) {
      if (src.read_codes(name, *layout.compression, dst, pool)) {  // the file's own codes
        if (tally) ++tally->kept_codes;
        used.insert(name);
        continue;
      }
      if (tally) ++tally->quantized;
      std::vector<float> full(static_cast<size_t>(s.numel()));  // quantized once, here, at load
      src.read(name, DType::F32, full.data(), pool);
      quantize_on_host(*layout.compression, full.data(), s.shape[0], s.shape[1], dst, pool);
    } else {
      src.read(name, layout.dtype, dst, pool);
    }
    used.insert(name);
  }
}

LayerWeights layer_views(const BlockLayout& layout, void* base, Device device) {
  LayerWeights lw;
  for (size_t i = 0; i < layout.specs.size(); ++i)
    layer_tensor(lw, layout.specs[i]) = make_spec_view(layout, i, base, device);
  set_stacked_views(lw);
  return lw;
}

LayerWeights dequantized_views(const LayerWeights& w, const BlockLayout& fp_layout, void* base, Backend& backend) {
  LayerWeights out;
  for (size_t i = 0; i < fp_layout.specs.size(); ++i) {
    const Tensor& src = layer_tensor(w, fp_layout.specs[i]);
    Tensor& dst = layer_tensor(out, fp_layout.specs[i]);
    if (!src.quantized()) {
      dst = src;
      continue;
    }
    STRATA_CHECK(!is_quantized(fp_layout.dtypes[i]) && src.dim(0) == fp_layout.specs[i].shape[0],
                 "internal: dequantizing " << fp_layout.specs[i].name << " into a layout that is not its fp form");
    dst = make_spec_view(fp_layout, i, base, backend.device());
    backend.dequantize_rows(quant::spec_of(src), src.data, dst);
  }
  set_stacked_views(out);
  return out;
}

void set_global_views(const ModelConfig& cfg, const BlockLayout& layout, void* base, Device device, ModelWeights& mw) {
  for (size_t i = 0; i < layout.specs.size(); ++i) {
    const Tensor t = make_spec_view(layout, i, base, device);
    switch (layout.specs[i].role) {
      case WeightRole::Embed: mw.embed = t; break;
      case WeightRole::PosEmbed: mw.pos_embed = t; break;
      case WeightRole::FinalNormW: mw.final_norm_w = t; break;
      case WeightRole::FinalNormB: mw.final_norm_b = t; break;
      case WeightRole::LmHead: mw.lm_head = t; break;
      default: break;
    }
  }
  if (cfg.tied_embeddings) mw.lm_head = mw.embed;
}

std::vector<float> read_attention_sinks(const ModelConfig& cfg, const WeightSource& src, std::set<std::string>& used) {
  std::vector<float> sinks;
  for (const WeightSpec& s : attention_sink_specs(cfg)) {
    const std::string name = checked_stored_name(src, s);
    sinks.resize(sinks.size() + size_t(s.numel()));
    src.read(name, DType::F32, sinks.data() + sinks.size() - size_t(s.numel()));
    used.insert(name);
  }
  return sinks;
}

void check_no_extra_tensors(const ModelConfig& cfg, const WeightSource& src, const std::set<std::string>& used) {
  for (const std::string& name : src.names())
    if (!used.count(name) && !is_ignorable_weight(cfg, name))
      STRATA_FAIL(src.describe() << ": unexpected tensor '" << name << "' (not part of a " << cfg.n_layers
                                 << "-layer " << (cfg.arch == Arch::OPT ? "OPT" : "LLaMA-family") << " model)");
}

ModelWeights load_model_weights(const ModelConfig& cfg, const WeightSource& src, Backend& backend, int threads) {
  cfg.validate();
  const double need = double(cfg.param_count()) * double(dtype_size(backend.activation_dtype()));
  const size_t avail = backend.available_memory();
  if (avail != SIZE_MAX && need > double(avail))
    STRATA_FAIL(src.describe() << ": the weights need " << need / 1e9 << " GB as " << dtype_name(backend.activation_dtype())
                               << " on " << backend.name() << ", but only " << double(avail) / 1e9
                               << " GB are available (offloading to CPU memory and disk comes with policies)");
  ModelWeights mw;
  std::set<std::string> used;
  ThreadPool pool(threads);  // for loading only
  const DType dt = backend.activation_dtype();
  const BlockLayout globals = global_block_layout(cfg, dt);
  mw.globals = upload_block(globals, src, backend, used, pool);
  set_global_views(cfg, globals, mw.globals.data(), backend.device(), mw);

  mw.layers.resize(size_t(cfg.n_layers));
  for (int l = 0; l < cfg.n_layers; ++l) {
    const BlockLayout layout = layer_block_layout(cfg, l, dt);
    Buffer block = upload_block(layout, src, backend, used, pool);
    LayerWeights& lw = mw.layers[size_t(l)];
    lw = layer_views(layout, block.data(), backend.device());
    lw.block = std::move(block);
  }
  mw.attn_sinks_host = read_attention_sinks(cfg, src, used);
  check_no_extra_tensors(cfg, src, used);

  if (!mw.attn_sinks_host.empty()) {
    const size_t bytes = mw.attn_sinks_host.size() * 4;
    mw.sinks_buffer = backend.alloc(bytes);
    backend.copy_to_device(mw.sinks_buffer.data(), mw.attn_sinks_host.data(), bytes);
    mw.attn_sinks = mw.sinks_buffer.view(0, DType::F32, {cfg.n_layers, cfg.n_heads});
  }
  if (cfg.pos == PosKind::Rope) {
    const std::vector<float> inv = rope_inv_freq(cfg);
    Buffer buf = backend.alloc(inv.size() * 4);
    backend.copy_to_device(buf.data(), inv.data(), inv.size() * 4);
    mw.inv_freq = buf.view(0, DType::F32, {int64_t(inv.size())});
    mw.rope_buffer = std::move(buf);
  }
  return mw;
}

}  // namespace strata
