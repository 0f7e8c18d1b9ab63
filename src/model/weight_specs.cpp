#include "strata/model/weight_specs.h"

namespace strata {

int64_t WeightSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {

// Tensor names inside one layer, per architecture (nullptr: the architecture has no such tensor).
struct LayerNames {
  WeightRole role;
  const char* opt;
  const char* llama;
};
// In block order: a layer's q, k and v weights (and their biases), and SwiGLU's gate and up, are
// adjacent so that the layout can stack them into one matrix (model_weights.cpp, block_layout).
constexpr LayerNames kLayerNames[] = {
    {WeightRole::AttnNormW, "self_attn_layer_norm.weight", "input_layernorm.weight"},
    {WeightRole::AttnNormB, "self_attn_layer_norm.bias", nullptr},
    {WeightRole::QNormW, nullptr, "self_attn.q_norm.weight"},
    {WeightRole::KNormW, nullptr, "self_attn.k_norm.weight"},
    {WeightRole::QW, "self_attn.q_proj.weight", "self_attn.q_proj.weight"},
    {WeightRole::KW, "self_attn.k_proj.weight", "self_attn.k_proj.weight"},
    {WeightRole::VW, "self_attn.v_proj.weight", "self_attn.v_proj.weight"},
    {WeightRole::QB, "self_attn.q_proj.bias", "self_attn.q_proj.bias"},
    {WeightRole::KB, "self_attn.k_proj.bias", "self_attn.k_proj.bias"},
    {WeightRole::VB, "self_attn.v_proj.bias", "self_attn.v_proj.bias"},
    {WeightRole::OW, "self_attn.out_proj.weight", "self_attn.o_proj.weight"},
    {WeightRole::OB, "self_attn.out_proj.bias", "self_attn.o_proj.bias"},
    {WeightRole::PostAttnNormW, nullptr, "post_attention_layernorm.weight"},  // Gemma's; LLaMA's MLP norm
    {WeightRole::MlpNormW, "final_layer_norm.weight", "post_attention_layernorm.weight"},
    {WeightRole::MlpNormB, "final_layer_norm.bias", nullptr},
    {WeightRole::Fc1W, "fc1.weight", "mlp.gate_proj.weight"},
    {WeightRole::UpW, nullptr, "mlp.up_proj.weight"},
    {WeightRole::Fc1B, "fc1.bias", nullptr},
    {WeightRole::Fc2W, "fc2.weight", "mlp.down_proj.weight"},
    {WeightRole::Fc2B, "fc2.bias", nullptr},
    {WeightRole::PostMlpNormW, nullptr, "post_feedforward_layernorm.weight"},
};

// The four norms of a sandwich layer: Gemma's norm before the MLP is pre_feedforward_layernorm
// (LLaMA's post_attention_layernorm, which GLM-4 keeps, normalises the MLP's input); GLM-4 names
// the two after the attention and the MLP its own way.
const char* sandwich_name(SandwichNaming naming, WeightRole r, const char* llama_name) {
  const bool glm4 = naming == SandwichNaming::Glm4;
  switch (r) {
    case WeightRole::MlpNormW: return glm4 ? llama_name : "pre_feedforward_layernorm.weight";
    case WeightRole::PostAttnNormW: return glm4 ? "post_self_attn_layernorm.weight" : llama_name;
    case WeightRole::PostMlpNormW: return glm4 ? "post_mlp_layernorm.weight" : llama_name;
    default: return llama_name;
  }
}

// Whether the config has this tensor, and its shape in Hugging Face layout.
bool present(const ModelConfig& c, WeightRole r) {
  switch (r) {
    case WeightRole::AttnNormW: case WeightRole::MlpNormW: return c.pre_norms;
    case WeightRole::AttnNormB: case WeightRole::MlpNormB: return c.pre_norms && c.norm_bias;
    case WeightRole::QB: case WeightRole::KB: case WeightRole::VB: return c.qkv_bias;
    case WeightRole::OB: return c.o_bias;
    case WeightRole::Fc1B: case WeightRole::Fc2B: return c.mlp_bias;
    case WeightRole::UpW: return c.gated_mlp();
    case WeightRole::QNormW: case WeightRole::KNormW: return c.qk_norm;
    case WeightRole::PostAttnNormW: case WeightRole::PostMlpNormW: return c.sandwich_norms;
    default: return true;
  }
}

std::vector<int64_t> shape_of(const ModelConfig& c, WeightRole r) {
  const int64_t h = c.hidden, f = c.intermediate, qd = c.q_dim(), kvd = c.kv_dim();
  switch (r) {
    case WeightRole::QW: return {qd, h};
    case WeightRole::QB: return {qd};
    case WeightRole::KW: case WeightRole::VW: return {kvd, h};
    case WeightRole::KB: case WeightRole::VB: return {kvd};
    case WeightRole::OW: return {h, qd};
    case WeightRole::Fc1W: case WeightRole::UpW: return {f, h};
    case WeightRole::Fc1B: return {f};
    case WeightRole::Fc2W: return {h, f};
    case WeightRole::QNormW: return {c.qk_norm_whole ? qd : c.head_dim};
    case WeightRole::KNormW: return {c.qk_norm_whole ? kvd : c.head_dim};
    default: return {h};  // norms and the biases of width h
  }
}

// A sparse layer's MLP after its norm: the router, then each expert's gate, up (adjacent, so that
// the layout stacks them as one [2f, h] matrix; their biases likewise) and down, in Mixtral's,
// Qwen3-MoE's or GPT-OSS's names (gpt_oss_source shows its fused experts as Qwen3-MoE's).
void add_expert_specs(const ModelConfig& c, const std::string& prefix, std::vector<WeightSpec>& specs) {
  const bool mixtral = c.moe_naming == MoeNaming::Mixtral;
  const std::string moe = prefix + (mixtral ? "block_sparse_moe." : "mlp.");
  const std::string router = moe + (c.moe_naming == MoeNaming::GptOss ? "router." : "gate.");
  const int64_t h = c.hidden, f = c.expert_intermediate;
  specs.push_back({WeightRole::RouterW, router + "weight", {c.n_experts, h}});
  if (c.router_bias) specs.push_back({WeightRole::RouterB, router + "bias", {c.n_experts}});
  for (int e = 0; e < c.n_experts; ++e) {
    const std::string expert = moe + "experts." + std::to_string(e) + ".";
    specs.push_back({WeightRole::ExpertGateW, expert + (mixtral ? "w1.weight" : "gate_proj.weight"), {f, h}, e});
    specs.push_back({WeightRole::ExpertUpW, expert + (mixtral ? "w3.weight" : "up_proj.weight"), {f, h}, e});
    if (c.expert_bias) {
      specs.push_back({WeightRole::ExpertGateB, expert + "gate_proj.bias", {f}, e});
      specs.push_back({WeightRole::ExpertUpB, expert + "up_proj.bias", {f}, e});
    }
    specs.push_back({WeightRole::ExpertDownW, expert + (mixtral ? "w2.weight" : "down_proj.weight"), {h, f}, e});
    if (c.expert_bias) specs.push_back({WeightRole::ExpertDownB, expert + "down_proj.bias", {h}, e});
  }
}

}  // namespace

std::vector<WeightSpec> layer_weight_specs(const ModelConfig& c, int layer) {
  const bool opt = c.arch == Arch::OPT, sparse = c.sparse_layer(layer);
  const std::string prefix = (opt ? "model.decoder.layers." : "model.layers.") + std::to_string(layer) + ".";
  std::vector<WeightSpec> specs;
  for (const LayerNames& n : kLayerNames) {
    const char* name = opt ? n.opt : n.llama;
    if (c.sandwich_norms) name = sandwich_name(c.sandwich_naming, n.role, name);
    const bool dense_mlp = n.role == WeightRole::Fc1W || n.role == WeightRole::UpW || n.role == WeightRole::Fc2W;
    if (name && present(c, n.role) && !(sparse && dense_mlp)) specs.push_back({n.role, prefix + name, shape_of(c, n.role)});
    if (sparse && n.role == WeightRole::MlpNormW) add_expert_specs(c, prefix, specs);
  }
  return specs;
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
  if (!c.tied_embeddings && c.lm_head) s.push_back({WeightRole::LmHead, "lm_head.weight", {V, h}});
  return s;
}

std::vector<WeightSpec> attention_sink_specs(const ModelConfig& c) {
  std::vector<WeightSpec> s;
  if (!c.attn_sinks) return s;
  for (int l = 0; l < c.n_layers; ++l)
    s.push_back({WeightRole::AttnSinks, "model.layers." + std::to_string(l) + ".self_attn.sinks", {c.n_heads}});
  return s;
}

bool is_ignorable_weight(const ModelConfig& c, const std::string& name) {
  if (c.tied_embeddings && name == "lm_head.weight") return true;
  // The classifier's, read by model/classifier.h (lm_head.weight: a head made from its tokens' rows).
  if (c.num_labels > 0 && (name == "score.weight" || name == "lm_head.weight")) return true;
  return name.size() >= 19 && name.compare(name.size() - 19, 19, "rotary_emb.inv_freq") == 0;
}

}  // namespace strata
