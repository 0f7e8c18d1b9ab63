// Where each tensor of a policy lives (docs/design.md, "The policy"), and the bytes it takes per
// tier.
// Weights: whole layers, assigned in order by cumulative size so the GPU gets the first ~gpu%
// of the layer bytes, the CPU the next ~cpu%, the disk the rest (FlexGen's rule, at layer
// granularity). KV cache: one tensor pair (K, V) per (GPU batch, layer), the same assignment
// over the layers within every GPU batch. Activations: the hidden state of each GPU batch is one
// tensor, assigned over the block's GPU batches (it is the only activation live between steps).
// Embeddings, final norm and LM head always stay on the GPU. Offloaded layers stream to the GPU
// half a layer (attention or MLP block) at a time. The plan also counts the working buffers the
// schedule needs, so its peak per tier is what the runtime reserves.
//
// The plan is pure data computed from (model config, policy, job shape). The policy search and
// the offloading engine both depend on it here; the policy module needs nothing of offload.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "strata/core/dtype.h"
#include "strata/model/config.h"
#include "strata/policy/policy.h"
#include "strata/quant/quant.h"
#include "strata/runtime/model_weights.h"

namespace strata {

enum class Tier : uint8_t { Gpu, Cpu, Disk };
const char* tier_name(Tier t);  // "gpu", "cpu", "disk"

struct TierBytes {
  double gpu = 0, cpu = 0, disk = 0;
  double& at(Tier t) { return t == Tier::Gpu ? gpu : t == Tier::Cpu ? cpu : disk; }
  double at(Tier t) const { return t == Tier::Gpu ? gpu : t == Tier::Cpu ? cpu : disk; }
  TierBytes& operator+=(const TierBytes& o) { gpu += o.gpu; cpu += o.cpu; disk += o.disk; return *this; }
};

// The shape of the work the plan is for: the longest prompt and the most new tokens of any
// sequence in a block (the KV cache is sized to their sum).
struct PlanShape {
  int prompt_len = 0;
  int gen_len = 0;
  int capacity() const { return prompt_len + gen_len; }
};

struct PlacementPlan {
  std::vector<Tier> weight_tier;  // per layer: its attention half's, and its MLP half's unless...
  std::vector<Tier> expert_tier;  // ... the policy places experts apart: per layer, its MLP half's
  Tier half_tier(int layer, int half) const { return (half ? expert_tier : weight_tier)[size_t(layer)]; }
  std::vector<Tier> cache_tier;   // per layer, the same for every GPU batch
  std::vector<Tier> act_tier;     // per GPU batch: where its hidden state lives between layers

  // Bytes per tier. The three classes hold the tensors themselves (all GPU batches of the block);
  // `working` holds the schedule's buffers: GPU double buffers for offloaded weights, staging for
  // offloaded cache and activations, the compute workspace, pinned staging for disk transfers.
  TierBytes weights, kv_cache, activations, working;
  TierBytes peak() const;  // sum of the four

  // Prefill runs in units of `prefill_seqs` sequences of one GPU batch (as many whole prompts as
  // fit the policy's prefill step, at least one), each computed in steps of at most
  // `step_tokens` tokens; decode runs one unit per GPU batch. The GPU workspace holds one step.
  int prefill_seqs = 1;
  int64_t step_tokens = 0;  // the most tokens of any step: a prefill step or a decode step (gbs)

  // Sizes of one unit (bytes).
  size_t layer_weight_bytes = 0, global_weight_bytes = 0;
  // A layer's two halves as they stream; with dense MLPs among sparse ones (mlp_only_layers), the
  // larger kind's (what a buffer holds). `mlp_weights`: the MLP halves' homes, each its own size.
  size_t attn_weight_bytes = 0, mlp_weight_bytes = 0;
  TierBytes mlp_weights;
  size_t cache_unit_bytes = 0;   // K and V of one layer for one GPU batch at full capacity (its home)
  size_t cache_stage_bytes = 0;  // a GPU staging slot: the slots of a prefill unit, or of a whole
                                 // GPU batch where decode brings the cache to the GPU
  size_t act_unit_bytes = 0;     // hidden state of one GPU batch (its home): the prefill pieces of
                                 // its units, each 4 KiB-aligned for the disk, or its decode rows
  size_t act_piece_bytes = 0;    // one prefill unit's piece of it (aligned)
  size_t act_stage_bytes = 0;    // a GPU staging slot: the larger of a piece and the decode rows
  size_t dequant_bytes = 0;      // compressed weights: the GPU buffer a half-layer is dequantized into
  size_t uncompressed_layer_bytes = 0;  // a layer's block without compression (for reports)

  // Realized percentages (of bytes of the class), for reports beside the policy's request.
  TierSplit realized_weights, realized_kv_cache, realized_activations;
  TierSplit realized_expert_weights;  // the MLP halves' (equal to realized_weights unless apart)
};

// Whether the policy computes some layer's experts on the CPU: a mixture of experts, cpu_experts
// in some phase, and some layer's MLP half on the CPU tier.
// A layer's block by kind: one for a model whose layers are alike; for dense MLPs among sparse
// ones (Qwen3-MoE's mlp_only_layers), the dense kind then the sparse (ModelConfig::sparse_layer).
std::vector<HalvedLayout> layer_kinds(const ModelConfig& cfg, DType dtype, size_t align,
                                      const std::optional<quant::QuantSpec>& compression);
// Layer `layer`'s index in layer_kinds.
inline size_t layer_kind(const ModelConfig& cfg, int layer) {
  return !cfg.uniform_layers() && cfg.sparse_layer(layer) ? 1 : 0;
}

bool cpu_experts_used(const ModelConfig& cfg, const Policy& policy, const std::vector<Tier>& expert_tier);

// The quantization spec of a policy's compression field.
std::optional<quant::QuantSpec> quant_spec(const std::optional<Compression>& c);

// `dtype`: the compute backend's activation dtype (F16 on CUDA, F32 on the CPU backend).
PlacementPlan plan_placement(const ModelConfig& cfg, const Policy& policy, const PlanShape& shape, DType dtype);

// Tiers of `n` equal units after FlexGen's cumulative rule: unit i goes to the tier whose
// percentage range contains the midpoint of its share, (i + 0.5) / n * 100.
std::vector<Tier> assign_tiers(int n, const TierSplit& split);

// One line per class: "weights  gpu 20% (1.2 GiB)  cpu 80% (...)  disk 0%  (policy: 20/80/0)".
std::string describe_plan(const PlacementPlan& plan, const Policy& policy);

}  // namespace strata
