#include "strata/model/weight_specs.h"

namespace strata {

int64_t WeightSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<WeightSpec> layer_weight_specs(const ModelConfig& c, int layer) {
  const int64_t h = c.hidden, f = c.intermediate, qd = c.q_dim(), kvd = c.kv_dim();
  std::vector<WeightSpec> s;
  auto add = [&](WeightRole role, const std::string& name, std::vector<int64_t> shape) {
    s.push_back({role, name, std::move(shape)});
  };
  if (c.arch == Arch::OPT) {
    const std::string p = "model.decoder.layers." + std::to_string(layer) + ".";
    add(WeightRole::AttnNormW, p + "self_attn_layer_norm.weight", {h});
    add(WeightRole::AttnNormB, p + "self_attn_layer_norm.bias", {h});
    add(WeightRole::QW, p + "self_attn.q_proj.weight", {qd, h});
    if (c.qkv_bias) add(WeightRole::QB, p + "self_attn.q_proj.bias", {qd});
    add(WeightRole::KW, p + "self_attn.k_proj.weight", {kvd, h});
    if (c.qkv_bias) add(WeightRole::KB, p + "self_attn.k_proj.bias", {kvd});
    add(WeightRole::VW, p + "self_attn.v_proj.weight", {kvd, h});
    if (c.qkv_bias) add(WeightRole::VB, p + "self_attn.v_proj.bias", {kvd});
    add(WeightRole::OW, p + "self_attn.out_proj.weight", {h, qd});
    if (c.o_bias) add(WeightRole::OB, p + "self_attn.out_proj.bias", {h});
    add(WeightRole::MlpNormW, p + "final_layer_norm.weight", {h});
    add(WeightRole::MlpNormB, p + "final_layer_norm.bias", {h});
    add(WeightRole::Fc1W, p + "fc1.weight", {f, h});
    if (c.mlp_bias) add(WeightRole::Fc1B, p + "fc1.bias", {f});
    add(WeightRole::Fc2W, p + "fc2.weight", {h, f});
    if (c.mlp_bias) add(WeightRole::Fc2B, p + "fc2.bias", {h});
    return s;
  }
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  add(WeightRole::AttnNormW, p + "input_layernorm.weight", {h});
  add(WeightRole::QW, p + "self_attn.q_proj.weight", {qd, h});
  if (c.qkv_bias) add(WeightRole::QB, p + "self_attn.q_proj.bias", {qd});
  add(WeightRole::KW, p + "self_attn.k_proj.weight", {kvd, h});
  if (c.qkv_bias) add(WeightRole::KB, p + "self_attn.k_proj.bias", {kvd});
  add(WeightRole::VW, p + "self_attn.v_proj.weight", {kvd, h});
  if (c.qkv_bias) add(WeightRole::VB, p + "self_attn.v_proj.bias", {kvd});
  add(WeightRole::OW, p + "self_attn.o_proj.weight", {h, qd});
  if (c.o_bias) add(WeightRole::OB, p + "self_attn.o_proj.bias", {h});
  add(WeightRole::MlpNormW, p + "post_attention_layernorm.weight", {h});
  add(WeightRole::Fc1W, p + "mlp.gate_proj.weight", {f, h});
  add(WeightRole::UpW, p + "mlp.up_proj.weight", {f, h});
  add(WeightRole::Fc2W, p + "mlp.down_proj.weight", {h, f});
  return s;
}

std::vector<WeightSpec> global_weight_specs(const ModelConfig& c) {
  const int64_t h = c.hidden, V = c.vocab_size;
  std::vector<WeightSpec> s;
  if (c.arch == Arch::OPT) {
    s.push_back({WeightRole::Embed, "model.decoder.embed_tokens.weight", {V, h}});
    s.push_back({WeightRole::PosEmbed, "model.decoder.embed_positions.weight", {c.max_positions + c.pos_offset, h}});
    s.push_back({WeightRole::FinalNormW, "model.decoder.final_layer_norm.weight", {h}});
    s.push_back({WeightRole::FinalNormB, "model.decoder.final_layer_norm.bias", {h}});
  } else {
    s.push_back({WeightRole::Embed, "model.embed_tokens.weight", {V, h}});
    s.push_back({WeightRole::FinalNormW, "model.norm.weight", {h}});
  }
  if (!c.tied_embeddings) s.push_back({WeightRole::LmHead, "lm_head.weight", {V, h}});
  return s;
}

bool is_ignorable_weight(const ModelConfig& c, const std::string& name) {
  if (c.tied_embeddings && name == "lm_head.weight") return true;
  return name.size() >= 20 && name.compare(name.size() - 20, 20, "rotary_emb.inv_freq") == 0;
}

}  // namespace strata
