#include "strata/runtime/model_weights.h"

#include <set>
#include <vector>

#include "strata/core/error.h"
#include "strata/model/weight_specs.h"

namespace strata {
namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
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

// Loads a group of tensors into one backend buffer; returns the buffer and views by role.
Buffer load_block(const std::vector<WeightSpec>& specs, const WeightSource& src, Backend& backend,
                  std::set<std::string>& used, std::vector<std::pair<WeightRole, Tensor>>& views) {
  const DType dt = backend.activation_dtype();
  const size_t align = 256;  // keeps every view aligned for vector loads and cuBLAS
  std::vector<size_t> offsets;
  size_t total = 0;
  for (const WeightSpec& s : specs) {
    offsets.push_back(total);
    total += (size_t(s.numel()) * dtype_size(dt) + align - 1) / align * align;
  }
  std::vector<uint8_t> staging(total);
  for (size_t i = 0; i < specs.size(); ++i) {
    const WeightSpec& s = specs[i];
    const std::string name = stored_name(src, s.name);
    const std::vector<int64_t> shape = src.shape(name);
    if (shape != s.shape)
      STRATA_FAIL(src.describe() << ": tensor '" << name << "' has shape " << shape_str(shape) << ", the config implies "
                                 << shape_str(s.shape));
    src.read(name, dt, staging.data() + offsets[i]);
    used.insert(name);
  }
  Buffer block = backend.alloc(total);
  backend.copy_to_device(block.data(), staging.data(), total);
  for (size_t i = 0; i < specs.size(); ++i)
    views.emplace_back(specs[i].role, make_view(block.data(), offsets[i], dt, backend.device(), specs[i].shape));
  return block;
}

void assign_layer_view(LayerWeights& lw, WeightRole role, const Tensor& t) {
  switch (role) {
    case WeightRole::AttnNormW: lw.attn_norm_w = t; break;
    case WeightRole::AttnNormB: lw.attn_norm_b = t; break;
    case WeightRole::QW: lw.q_w = t; break;
    case WeightRole::QB: lw.q_b = t; break;
    case WeightRole::KW: lw.k_w = t; break;
    case WeightRole::KB: lw.k_b = t; break;
    case WeightRole::VW: lw.v_w = t; break;
    case WeightRole::VB: lw.v_b = t; break;
    case WeightRole::OW: lw.o_w = t; break;
    case WeightRole::OB: lw.o_b = t; break;
    case WeightRole::MlpNormW: lw.mlp_norm_w = t; break;
    case WeightRole::MlpNormB: lw.mlp_norm_b = t; break;
    case WeightRole::Fc1W: lw.fc1_w = t; break;
    case WeightRole::Fc1B: lw.fc1_b = t; break;
    case WeightRole::UpW: lw.up_w = t; break;
    case WeightRole::Fc2W: lw.fc2_w = t; break;
    case WeightRole::Fc2B: lw.fc2_b = t; break;
    default: STRATA_CHECK(false, "not a layer role");
  }
}

}  // namespace

ModelWeights load_model_weights(const ModelConfig& cfg, const WeightSource& src, Backend& backend) {
  cfg.validate();
  const double need = double(cfg.param_count()) * double(dtype_size(backend.activation_dtype()));
  const size_t avail = backend.available_memory();
  if (avail != SIZE_MAX && need > double(avail))
    STRATA_FAIL(src.describe() << ": the weights need " << need / 1e9 << " GB as " << dtype_name(backend.activation_dtype())
                               << " on " << backend.name() << ", but only " << double(avail) / 1e9
                               << " GB are available (offloading to CPU memory and disk comes with policies)");
  ModelWeights mw;
  std::set<std::string> used;
  std::vector<std::pair<WeightRole, Tensor>> views;
  mw.globals = load_block(global_weight_specs(cfg), src, backend, used, views);
  for (const auto& [role, t] : views) {
    switch (role) {
      case WeightRole::Embed: mw.embed = t; break;
      case WeightRole::PosEmbed: mw.pos_embed = t; break;
      case WeightRole::FinalNormW: mw.final_norm_w = t; break;
      case WeightRole::FinalNormB: mw.final_norm_b = t; break;
      case WeightRole::LmHead: mw.lm_head = t; break;
      default: break;
    }
  }
  if (cfg.tied_embeddings) mw.lm_head = mw.embed;

  mw.layers.resize(size_t(cfg.n_layers));
  for (int l = 0; l < cfg.n_layers; ++l) {
    views.clear();
    LayerWeights& lw = mw.layers[size_t(l)];
    lw.block = load_block(layer_weight_specs(cfg, l), src, backend, used, views);
    for (const auto& [role, t] : views) assign_layer_view(lw, role, t);
  }

  for (const std::string& name : src.names())
    if (!used.count(name) && !is_ignorable_weight(cfg, name))
      STRATA_FAIL(src.describe() << ": unexpected tensor '" << name << "' (not part of a " << cfg.n_layers
                                 << "-layer " << (cfg.arch == Arch::OPT ? "OPT" : "LLaMA-family") << " model)");

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
