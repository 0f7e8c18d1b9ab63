// The pieces of the forward pass (embedding, one decoder layer, the LM head) over a workspace the
// caller provides. Transformer runs them over resident weights; the offloading engine runs them
// one (layer, GPU batch) at a time over weights, caches and hidden states it moves between tiers.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "strata/backend/backend.h"
#include "strata/model/config.h"
#include "strata/runtime/model_weights.h"

namespace strata {

// Positions [0, length) of cache slot `src` copied to slot `dst` in every layer, after the step's
// keys and values are stored and before it attends: a prompt that shares another's beginning
// (prefix_sharing.h) and computes only the rest. The source's rows must be in the cache by then,
// stored by this step or an earlier one; the step's tokens of `dst` come at `length` or later.
struct PrefixCopy {
  int32_t src = 0, dst = 0, length = 0;
};

// Mixture-of-experts layer steps: their count, the tokens they routed and the distinct experts
// those activated, each summed over the steps.
struct RoutingTotals {
  int64_t layer_steps = 0, tokens = 0, active_experts = 0;
  RoutingTotals operator+(const RoutingTotals& o) const {
    return {layer_steps + o.layer_steps, tokens + o.tokens, active_experts + o.active_experts};
  }
  RoutingTotals operator-(const RoutingTotals& o) const {
    return {layer_steps - o.layer_steps, tokens - o.tokens, active_experts - o.active_experts};
  }
};

// A packed step: tokens from any number of sequences, each with its cache slot and position.
struct StepBatch {
  std::vector<int32_t> tokens;     // [T]
  std::vector<int32_t> positions;  // [T], 0-based position within its sequence
  std::vector<int32_t> slots;      // [T], KV cache slot of its sequence
  std::vector<int32_t> logit_rows; // indices into tokens whose logits are wanted (e.g. each sequence's last)
  std::vector<PrefixCopy> prefix_copies;  // not with attention_inputs()
};

// The attention block's inputs for attention done elsewhere (delegated to the CPU, where the
// cache lives there): views of the workspace, valid until the next attention_inputs().
// q: [T, heads, d]; k, v: [T, kv_heads, d].
struct AttentionInputs {
  Tensor q, k, v;
};

// What differs between layers' attention (Gemma's sliding-window layers among full ones, GPT-OSS's
// sinks): the RoPE frequencies (F32 [head_dim / 2]; empty without RoPE) and how scores become
// weights.
struct LayerAttention {
  Tensor inv_freq;
  AttentionSpec spec;
};
// Layer l's, from the model's table of frequencies (rope_inv_freq's rows, uploaded: ModelWeights::
// inv_freq; empty without RoPE) and of sinks (ModelWeights::attn_sinks, or a view of its host
// copy for attention on the CPU; empty without sinks), each where the attention runs.
LayerAttention layer_attention(const ModelConfig& cfg, const Tensor& rope_table, const Tensor& sinks_table, int layer);

// STRATA_DEVICE_ROUTING=0 routes every mixture-of-experts step on the host; anything else, or
// unset, routes on the device where the backend can (Backend::routes_on_device).
bool device_routing_allowed();

class ForwardOps {
public:
  ForwardOps(const ModelConfig& cfg, Backend& backend);

  // Bytes of workspace for steps of up to `tokens` tokens and `rows` logit rows (the hidden
  // state itself excluded: the caller owns it).
  static size_t workspace_bytes(const ModelConfig& cfg, DType dtype, int64_t tokens, int64_t rows);
  void bind_workspace(void* base, int64_t tokens, int64_t rows);
  int64_t max_tokens() const { return ws_tokens_; }

  // Checks the step against the config and the cache geometry, and uploads its ids, positions and
  // slots; the calls below then work on this step.
  void begin_step(const StepBatch& batch, int cache_slots, int cache_capacity);
  int64_t tokens() const { return T_; }

  void embed(const ModelWeights& w, const Tensor& x);  // x: [T, h]
  // The whole stack, layer by layer: attention_norm(first layer, x), then layer() for each with the
  // layer after it (nullptr for the last). layer() does x += attention block; x += MLP block
  // (caches: [S, C, kv_heads, d]), each residual add fused with the norm that follows it, so it
  // expects its attention's normed input in the workspace, from attention_norm or the layer before.
  void attention_norm(const LayerWeights& w, const Tensor& x);
  void layer(const LayerWeights& w, const LayerWeights* next, const LayerAttention& a, const Tensor& x,
             const Tensor& cache_k, const Tensor& cache_v);
  // The two halves of layer(), for a schedule that streams a layer's weights half by half: the
  // attention block reads only w's attention tensors, the MLP block only its MLP tensors.
  void attention_block(const LayerWeights& w, const LayerAttention& a, const Tensor& x, const Tensor& cache_k,
                       const Tensor& cache_v);
  void mlp_block(const LayerWeights& w, const Tensor& x);
  // The attention block around attention done elsewhere: its inputs (norm, q/k/v projections,
  // their norms, rope) for this step, then, any time later, x += o_proj(attn) for the rows of x
  // (attn: [rows, heads, d], the attention's output). Steps of other units may run between the
  // two; attention_output uses no step state.
  AttentionInputs attention_inputs(const LayerWeights& w, const LayerAttention& a, const Tensor& x);
  void attention_output(const LayerWeights& w, const Tensor& x, const Tensor& attn);
  // Final norm and LM head on the step's logit rows; valid until the next step.
  Tensor head(const ModelWeights& w, const Tensor& x);
  // The final norm over every row of x, in place: the hidden states an embedding pools.
  void final_norm(const ModelWeights& w, const Tensor& x);
  // For a sequence group computed in several steps: the rows of its whole hidden state x
  // ([tokens, h]) that head() then reads, in place of the last step's logit rows.
  void select_logit_rows(const std::vector<int32_t>& rows, int64_t tokens);

  // Every mixture-of-experts layer step so far: how many, the tokens routed, and the distinct
  // experts those tokens activated (summed over the steps). The cost model's expected count is
  // expected_active_experts (cost_model.h).
  // Reading them waits for the device where it counts them (routing on the device).
  RoutingTotals routing_totals() const;
  // Whether this step's sparse layers route on the device (no trip to the host mid-step, so the
  // step can be captured in a graph): w's, or every one of `layers`. Dense layers need nothing.
  bool routes_on_device(const LayerWeights& w) const;
  bool step_routes_on_device(const std::vector<LayerWeights>& layers) const;

  // The step's slots and positions on the backend (I32 [T]).
  Tensor slots() const { return slots_.rows(0, T_); }
  Tensor positions() const { return pos_.rows(0, T_); }

private:
  void upload_indices(const StepBatch& batch);
  void norm(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& out);
  // A block's input (x normed, or x itself where the model has no norms before its blocks), and
  // the residual add fused with the next block's input.
  void block_input(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& out);
  void add_block_input(const Tensor& x, const Tensor& delta, const Tensor& w, const Tensor& b, const Tensor& out);
  Backend::Norm norm_kind() const;
  // What RMS norms add to their weights: 1 for Gemma's (1 + w), else 0.
  float norm_offset() const;
  void copy_prefixes(const Tensor& cache_k, const Tensor& cache_v);
  // q, k, v (split, normed per head, rotated) from the normed input in the workspace.
  AttentionInputs project_qkv(const LayerWeights& w, const LayerAttention& a);
  // The stacked q/k/v GEMM over the normed input: its output [T, q_dim + 2 kv_dim] in the workspace.
  Tensor qkv_projection(const LayerWeights& w);
  // From the normed input: q, k and v, k and v stored in the caches, the step's prefix copies, and
  // attention; its output [T, heads, d] in the workspace.
  Tensor attention_from_normed(const LayerWeights& w, const LayerAttention& a, const Tensor& cache_k,
                               const Tensor& cache_v);
  // The step's prefix copies and attention over caches that hold the step's keys and values.
  Tensor attend_stored(const Tensor& q, const AttentionSpec& spec, const Tensor& cache_k, const Tensor& cache_v);
  // Gemma's norm of a block's output before its residual add (sandwich_norms), in place.
  void post_norm(const Tensor& w, const Tensor& y);
  // act = the gated MLP's activation of gate_up ([rows, 2f], gate then up): SwiGLU, GeGLU or
  // GPT-OSS's clamped SwiGLU, as the config says.
  void gated_activation(const Tensor& gate_up, const Tensor& act);
  // The MLP from the normed input in the workspace; its output [T, h] (in the normed input's place).
  Tensor mlp_from_normed(const LayerWeights& w);
  // The same for a mixture-of-experts layer: routing, each active expert's GEMMs over its tokens.
  Tensor experts_from_normed(const LayerWeights& w);
  // Its routing and experts, into `routed` ([T k, h]: each expert's inputs, then its outputs).
  void experts_routed_on_device(const LayerWeights& w, const Tensor& logits, const Tensor& routed);
  void experts_routed_on_host(const LayerWeights& w, const Tensor& logits, const Tensor& routed);

  const ModelConfig& cfg_;
  Backend& backend_;
  int64_t ws_tokens_ = 0, ws_rows_ = 0;
  int64_t T_ = 0, R_ = 0;
  std::vector<PrefixCopy> copies_;
  Tensor xn_, q_, k_, v_, attn_, mlp_a_, mlp_b_, last_, logits_;
  Tensor ids_, pos_, pos_shifted_, slots_, rows_;
  Tensor moe_rows_, router_, moe_gather_, moe_combine_, moe_weights_;  // mixtures of experts only
  Tensor moe_begin_, moe_active_;                                     // routed on the device only
  bool device_routing_ = device_routing_allowed();
  mutable RoutingTotals routing_;  // the host's counts, and the device's as last read
  Buffer routing_counts_;          // the device's: I32 [3], as Backend::DeviceRouting's totals
  void* indices_ = nullptr;        // where the index pieces start (upload_indices lays them out)
  std::vector<int32_t> uploaded_;  // their contents on the device, as last uploaded
};

}  // namespace strata
