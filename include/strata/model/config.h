// ModelConfig: the fields that say how one decoder-only architecture differs from another.
// One forward pass (runtime/transformer) reads it; there is no per-architecture model class.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "strata/core/dtype.h"

namespace strata {

enum class Arch : uint8_t { OPT, Llama };
enum class NormKind : uint8_t { LayerNorm, RMSNorm };
enum class PosKind : uint8_t { Learned, Rope };
// SwiGLU: down(silu(gate) * up); GeGLU (Gemma): down(gelu_tanh(gate) * up); ClampedSwiGLU
// (GPT-OSS's experts): down((up' + 1) * g sigmoid(alpha g)), g = min(gate, limit), up' = up
// clamped to [-limit, limit] (ModelConfig::glu_limit, glu_alpha).
enum class MlpKind : uint8_t { ReLU, GELU, SwiGLU, GeGLU, ClampedSwiGLU };
// Whose tensor names a mixture-of-experts layer uses (weight_specs.cpp): Mixtral's
// block_sparse_moe.experts.N.w1/w3/w2, Qwen3-MoE's mlp.experts.N.gate/up/down_proj, or GPT-OSS's
// (Qwen3-MoE's experts, as gpt_oss_source shows its fused ones, and mlp.router).
enum class MoeNaming : uint8_t { Mixtral, Qwen3Moe, GptOss };
// Whose names a layer's four sandwich norms have (weight_specs.cpp): Gemma's post_attention_layernorm,
// pre_feedforward_layernorm and post_feedforward_layernorm, or GLM-4's post_self_attn_layernorm,
// post_attention_layernorm (before the MLP, as LLaMA's) and post_mlp_layernorm.
enum class SandwichNaming : uint8_t { Gemma, Glm4 };

struct RopeScaling {      // Hugging Face rope_scaling with rope_type "llama3"
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_positions = 8192;
};

struct ModelConfig {
  std::string name;                 // preset name or model directory
  Arch arch = Arch::OPT;
  int vocab_size = 0;
  int hidden = 0;                   // h1
  int intermediate = 0;             // h2 (MLP hidden)
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;               // == n_heads without grouped-query attention
  int head_dim = 0;
  int max_positions = 0;
  int sliding_window = 0;           // > 0: max_positions was cut to this window (config.json's sliding_window)
  NormKind norm = NormKind::LayerNorm;
  float norm_eps = 1e-5f;
  PosKind pos = PosKind::Learned;
  int pos_offset = 0;               // OPT's learned positions start at index 2
  float rope_theta = 10000.0f;
  std::optional<RopeScaling> rope_scaling;
  // Partial rotary (Phi-4-mini: 96 of 128; GLM: 64 of 128): only the first `rotary_dim` dims of
  // each query and key head rotate, the rest pass as they are. 0: the whole head (rotary_dims()).
  // `rope_interleaved`: the rotated pairs are (2i, 2i + 1) (GLM's, GPT-J's), not (i, i + r/2). The
  // forward pass rotates whole heads in NeoX pairs: rotary_layout_source reorders each head's dims
  // so that the pairs line up and the passing ones meet the zero frequencies rope_inv_freq pads
  // the table with.
  int rotary_dim = 0;
  bool rope_interleaved = false;
  // GGUF's rope_freqs.weight (llama.cpp's form of Llama 3.1's scaling): one divisor per frequency,
  // rotary_dims() / 2 of them, applied after rope_scaling. Empty: none.
  std::vector<float> rope_freq_factors;
  // LongRoPE (Phi-3.5, Phi-3 128k): transformers multiplies cos and sin by this "attention
  // factor", so queries and keys both grow by it; Strata scales the scores by its square instead
  // (and, under partial rotary, divides the query's passing dims by it: rotary_layout_source).
  float rope_attention_factor = 1.0f;
  MlpKind mlp = MlpKind::ReLU;
  bool qkv_bias = false;            // q/k/v projections (OPT, Qwen2)
  bool o_bias = false;              // attention output projection (OPT)
  bool mlp_bias = false;            // fc1/fc2 (OPT)
  bool norm_bias = false;           // LayerNorm bias (OPT)
  bool qk_norm = false;             // RMSNorm of each query and key head before RoPE (Qwen3)
  bool qk_norm_whole = false;       // with qk_norm: over all of q's and all of k's heads at once (OLMo 2)
  bool tied_embeddings = false;     // lm_head shares the token embedding
  // false: an untied checkpoint without lm_head.weight (an embedding model: Qwen3-Embedding-8B,
  // e5-mistral). It computes embeddings; generating needs an LM head.
  bool lm_head = true;
  // > 0: a sequence classifier (config.json's architectures *ForSequenceClassification): a `score`
  // matrix of this many rows over the last non-pad token's final state (model/classifier.h) in
  // place of the LM head, which such a checkpoint lacks (lm_head false, tied_embeddings false).
  int num_labels = 0;
  // Mixture of experts (Mixtral, Qwen3-MoE): a sparse layer's MLP is `n_experts` SwiGLU experts of
  // width `expert_intermediate`, of which a linear router picks `experts_per_token` for each token
  // (softmax over all experts, top k, then the k weights renormalised to sum to 1 when
  // `norm_topk_prob`: always for Mixtral). 0 experts: a dense model.
  int n_experts = 0;
  int experts_per_token = 0;
  int expert_intermediate = 0;
  bool norm_topk_prob = true;
  MoeNaming moe_naming = MoeNaming::Mixtral;
  // Layers whose MLP stays dense (width `intermediate`) in a MoE model: Qwen3-MoE's mlp_only_layers
  // and the layers decoder_sparse_step skips, ascending.
  std::vector<int> dense_layers;
  // Gemma 2 and 3 (model_type gemma2, gemma3_text, gemma3's text model):
  float embed_scale = 0.0f;         // > 0: the token embeddings times this (sqrt(hidden))
  bool norm_plus_one = false;       // RMSNorm scales by 1 + w: the norms add the 1 in fp32 (Gemma)
  bool sandwich_norms = false;      // a norm after the attention and after the MLP, before each residual add
  bool pre_norms = true;            // false: no norm before the attention or the MLP, only after (OLMo 2)
  SandwichNaming sandwich_naming = SandwichNaming::Gemma;
  float query_scale = 0.0f;         // > 0: scores scale by 1 / sqrt(this), not of head_dim (query_pre_attn_scalar)
  float attn_softcap = 0.0f;        // > 0: scores soft-capped, cap * tanh(s / cap) (Gemma 2)
  float final_softcap = 0.0f;       // > 0: logits soft-capped likewise (Gemma 2)
  // Granite: each residual branch (o_proj's and down_proj's output) times residual_multiplier
  // before its add (residual_scale_source folds it into those projections), and the logits times
  // logit_scale (1 / logits_scaling). Its embedding_multiplier is embed_scale, its
  // attention_multiplier the score scale (query_scale = 1 / multiplier^2).
  float residual_multiplier = 1.0f;
  float logit_scale = 1.0f;
  // Sliding-window layers: each token sees the last `layer_window` positions (its own included);
  // the other layers see the whole context. Gemma 3's sliding layers rotate with base
  // `local_rope_theta` and no scaling (0: as the others).
  int layer_window = 0;
  std::vector<int> window_layers;   // ascending
  float local_rope_theta = 0.0f;
  // Layers that attend without RoPE (SmolLM3's no_rope_layers: every fourth), ascending.
  std::vector<int> nope_layers;
  // GPT-OSS: every layer's softmax has a learned sink logit per query head (AttentionSpec::sinks),
  // the router and the experts have biases, and the experts' SwiGLU is clamped (ClampedSwiGLU).
  bool attn_sinks = false;
  bool router_bias = false;
  bool expert_bias = false;
  float glu_limit = 0.0f;
  float glu_alpha = 1.0f;
  // The dtype the checkpoint was trained and saved in (config.json's torch_dtype, transformers
  // 5's dtype): `--dtype auto` runs a BF16 checkpoint in bf16 on the GPU. F16 when unstated.
  DType checkpoint_dtype = DType::F16;
  int bos_id = -1;
  std::vector<int> eos_ids;         // generation stops at any of these
  int pad_id = -1;

  int q_dim() const { return n_heads * head_dim; }
  int rotary_dims() const { return rotary_dim > 0 ? rotary_dim : head_dim; }
  bool partial_rotary() const { return rotary_dims() < head_dim; }
  int kv_dim() const { return n_kv_heads * head_dim; }
  // The softmax's score scale: 1 / sqrt(head_dim), times LongRoPE's or YaRN's attention factor
  // squared; a layer with the local RoPE base (Gemma 3's, OLMo 3's sliding layers) is unscaled, so
  // it takes no factor.
  float attention_scale() const;
  float attention_scale(int layer) const;
  bool moe() const { return n_experts > 0; }
  bool gated_mlp() const { return mlp == MlpKind::SwiGLU || mlp == MlpKind::GeGLU || mlp == MlpKind::ClampedSwiGLU; }
  // Whether layer l attends through a sliding window (layer_window), and whether its RoPE
  // frequencies are the local ones (rope_inv_freq's second row).
  bool window_layer(int layer) const;
  bool local_rope_layer(int layer) const { return local_rope_theta > 0.0f && window_layer(layer); }
  bool nope_layer(int layer) const;
  // Layer l's row of rope_inv_freq's table: 0 the model's frequencies, then the local ones where
  // local_rope_theta is set, then a row of zeros where some layer has no RoPE (a rotation by
  // angle 0, cos 1 and sin 0, leaves q and k exactly as they are).
  int rope_row(int layer) const;
  // Whether layer l's MLP is a mixture of experts.
  bool sparse_layer(int layer) const;
  // Whether every layer has the same tensors (the offloading engine's one block layout needs it).
  bool uniform_layers() const { return dense_layers.empty() || int(dense_layers.size()) == n_layers; }
  // Parameters of one transformer layer (the largest, where they differ), of layer l, of the whole
  // model (embeddings and head included) and of its globals (embeddings, final norm, head).
  int64_t layer_param_count() const;
  int64_t layer_param_count(int layer) const;
  int64_t param_count() const;
  int64_t global_param_count() const;
  void validate() const;            // throws strata::Error naming the bad field
  // The first `layers` layers only (a benchmark's cut model): the per-layer lists trimmed to them.
  void keep_layers(int layers);
};

// Reads a Hugging Face config.json (OPTForCausalLM, LlamaForCausalLM, MistralForCausalLM,
// Qwen2ForCausalLM, Qwen3ForCausalLM, Phi3ForCausalLM, MixtralForCausalLM, Qwen3MoeForCausalLM,
// SmolLM3ForCausalLM, Gemma 2 and 3, GptOssForCausalLM). Unsupported variants (e.g. OPT-350m's projection) are refused by name.
ModelConfig config_from_hf_json(const std::filesystem::path& config_json);
// The same from the file's text in memory (the fuzz target): `source` names it in errors, and its
// parent directory names the model.
ModelConfig config_from_hf_json_text(const std::string& text, const std::filesystem::path& source);
// The sampling settings a checkpoint's makers recommend, each set only where its file names it:
// generation_config.json's temperature, top_p, top_k, min_p, repetition_penalty and
// max_new_tokens, or a GGUF's general.sampling.* (gguf.h). vLLM (its default `--generation-config
// auto`) and llama.cpp take them as the defaults of requests that give none; so does `strata run`.
struct RecommendedSampling {
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k;  // 0: off
  std::optional<int> max_new_tokens;
  std::string source;        // the file that names them
  bool empty() const {
    return !temperature && !top_p && !min_p && !repetition_penalty && !top_k && !max_new_tokens;
  }
};

// A model directory's generation_config.json (nothing when `file` does not exist):
// - its eos_token_id (an id or a list) joins the config's end tokens, after them: transformers'
//   generate() stops at the generation config's ids, which chat models list there (GPT-OSS's
//   <|call|>, Llama 3's <|eot_id|> where config.json names only one);
// - its sampling settings are returned. As vLLM reads them, a named value counts whether or not
//   do_sample is; as transformers' generate() reads them, `do_sample: false` keeps decoding greedy
//   (temperature, top_p, top_k and min_p are then not taken), and `do_sample: true` without a
//   temperature samples at 1.
// Throws strata::Error naming the file and field for bad JSON, an id outside the vocabulary, or a
// setting out of its range.
RecommendedSampling read_generation_config(const std::filesystem::path& file, ModelConfig& c);

// Built-in shapes for benchmarks with dummy weights: opt-125m ... opt-175b, llama-3-8b, ...
std::optional<ModelConfig> config_preset(const std::string& name);
std::vector<std::string> config_preset_names();

// RoPE inverse frequencies [head_dim / 2] (under partial rotary, rotary_dims() / 2 of them and
// zeros after), with llama3 scaling applied when configured; then, when
// local_rope_theta is set, the sliding layers' [head_dim / 2] (that base, no scaling); then, when
// some layer has no RoPE, [head_dim / 2] zeros: the rows of the table ForwardOps picks a layer's
// row from (layer_attention, ModelConfig::rope_row).
std::vector<float> rope_inv_freq(const ModelConfig& cfg);

// YaRN as transformers computes it (static: the same at every length), as the divisor of each
// RoPE inverse frequency (head_dim / 2 of them): frequencies that turn fewer than beta_slow times
// over the original context are divided by the factor, those turning more than beta_fast times
// kept, a linear ramp between (its ends floored / ceiled when truncate).
std::vector<float> yarn_freq_divisors(int head_dim, float rope_theta, double factor, int original_positions,
                                      double beta_fast = 32, double beta_slow = 1, bool truncate = true);
// YaRN's attention factor: 0.1 m ln(factor) + 1, or 1 when factor <= 1.
double yarn_mscale(double factor, double m = 1);

// What every GPT-OSS shares, over a LLaMA shape (config.json's reader, GGUF's, the presets): the
// clamped SwiGLU with GptOssConfig's limit and gain, a sink logit per query head, biases on the
// attention, the router and the experts (as wide as intermediate), top-k-then-softmax routing.
void set_gpt_oss_fields(ModelConfig& c);
// OLMo 2's and 3's layer, wherever it is read (config.json, GGUF, the preset): no norm before the
// attention or the MLP, one after each, and q and k normed over all their heads at once.
void set_olmo2_fields(ModelConfig& c);

}  // namespace strata
