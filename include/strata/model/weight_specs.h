// The tensors a config implies, with their Hugging Face names and shapes. The loader, the dummy
// source and (later) the placement of layers on tiers all read this one table.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "strata/model/config.h"

namespace strata {

enum class WeightRole : uint8_t {
  // per layer
  AttnNormW, AttnNormB, QW, QB, QNormW, KW, KB, KNormW, VW, VB, OW, OB,  // QNorm/KNorm: Qwen3's per-head norms
  MlpNormW, MlpNormB, Fc1W, Fc1B, UpW, Fc2W, Fc2B,  // Fc1 is LLaMA's gate_proj, Fc2 its down_proj
  PostAttnNormW, PostMlpNormW,  // Gemma's norms of the attention's and the MLP's outputs (sandwich_norms)
  // a mixture-of-experts layer's MLP: the router [experts, h], and each expert's SwiGLU (biases:
  // GPT-OSS)
  RouterW, RouterB, ExpertGateW, ExpertUpW, ExpertGateB, ExpertUpB, ExpertDownW, ExpertDownB,
  // GPT-OSS's sink logits [heads], per layer: read into a table beside the blocks (attention_sink_specs)
  AttnSinks,
  // whole model
  Embed, PosEmbed, FinalNormW, FinalNormB, LmHead,
};

struct WeightSpec {
  WeightRole role;
  std::string name;             // e.g. "model.layers.3.self_attn.q_proj.weight"
  std::vector<int64_t> shape;   // Hugging Face layout, [out, in] for projections
  int expert = -1;              // which expert, for the Expert* roles
  int64_t numel() const;
};

std::vector<WeightSpec> layer_weight_specs(const ModelConfig& cfg, int layer);
std::vector<WeightSpec> global_weight_specs(const ModelConfig& cfg);  // lm_head only when untied
// Each layer's attention sinks (attn_sinks; else none), which no block holds: the forward pass
// reads them as one F32 table [layers, heads] (read_attention_sinks).
std::vector<WeightSpec> attention_sink_specs(const ModelConfig& cfg);
// Stored tensors a loader may skip: a tied lm_head saved anyway, rotary inv_freq buffers.
bool is_ignorable_weight(const ModelConfig& cfg, const std::string& name);

}  // namespace strata
