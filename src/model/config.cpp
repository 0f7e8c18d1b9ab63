// ModelConfig from Hugging Face config.json files and built-in presets.
#include "strata/model/config.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>
#include <type_traits>

#include "strata/core/error.h"
#include "strata/model/classifier.h"

namespace strata {

using json = nlohmann::json;

bool ModelConfig::window_layer(int layer) const {
  return layer_window > 0 && std::binary_search(window_layers.begin(), window_layers.end(), layer);
}

bool ModelConfig::nope_layer(int layer) const {
  return std::binary_search(nope_layers.begin(), nope_layers.end(), layer);
}

int ModelConfig::rope_row(int layer) const {
  if (nope_layer(layer)) return local_rope_theta > 0.0f ? 2 : 1;
  return local_rope_layer(layer) ? 1 : 0;
}

bool ModelConfig::sparse_layer(int layer) const {
  return moe() && !std::binary_search(dense_layers.begin(), dense_layers.end(), layer);
}

void ModelConfig::keep_layers(int layers) {
  n_layers = layers;
  for (std::vector<int>* list : {&dense_layers, &window_layers, &nope_layers})
    list->erase(std::remove_if(list->begin(), list->end(), [&](int l) { return l >= layers; }), list->end());
}

int64_t ModelConfig::layer_param_count(int layer) const {
  const int64_t h = hidden, f = intermediate;
  int64_t n = int64_t(h) * (q_dim() + 2 * kv_dim()) + int64_t(q_dim()) * h;  // q, k, v, o
  if (sparse_layer(layer)) n += int64_t(n_experts) * (h + 3 * h * int64_t(expert_intermediate));  // router, experts
  else n += (gated_mlp() ? 3 : 2) * h * f;
  if (pre_norms) n += (norm_bias ? 4 : 2) * h;                               // two norms
  if (sandwich_norms) n += 2 * h;                                            // and Gemma's two more
  if (qkv_bias) n += q_dim() + 2 * kv_dim();
  if (o_bias) n += h;
  if (mlp_bias) n += f + h;
  if (qk_norm) n += qk_norm_whole ? q_dim() + kv_dim() : 2 * head_dim;
  if (attn_sinks) n += n_heads;
  if (sparse_layer(layer) && router_bias) n += n_experts;
  if (sparse_layer(layer) && expert_bias) n += int64_t(n_experts) * (2 * int64_t(expert_intermediate) + h);
  return n;
}

int64_t ModelConfig::layer_param_count() const {
  int64_t most = 0;
  for (int l = 0; l < n_layers; ++l) {
    most = std::max(most, layer_param_count(l));
    if (uniform_layers()) break;
  }
  return most;
}

int64_t ModelConfig::global_param_count() const {
  int64_t n = int64_t(vocab_size) * hidden;                   // token embedding
  if (!tied_embeddings && lm_head) n += int64_t(vocab_size) * hidden;  // lm_head
  if (pos == PosKind::Learned) n += int64_t(max_positions + pos_offset) * hidden;
  n += (norm_bias ? 2 : 1) * int64_t(hidden);                 // final norm
  return n;
}

int64_t ModelConfig::param_count() const {
  int64_t n = global_param_count();
  if (uniform_layers()) return n + int64_t(n_layers) * layer_param_count();
  for (int l = 0; l < n_layers; ++l) n += layer_param_count(l);
  return n;
}

namespace {

// A mixture of experts' fields (validate()).
void validate_experts(const ModelConfig& c) {
  if (c.arch != Arch::Llama || (c.mlp != MlpKind::SwiGLU && c.mlp != MlpKind::ClampedSwiGLU))
    STRATA_FAIL(c.name << ": mixtures of experts are supported for SwiGLU (LLaMA-family) layers only");
  if (c.experts_per_token <= 0 || c.experts_per_token > c.n_experts)
    STRATA_FAIL(c.name << ": num_experts_per_tok " << c.experts_per_token << " must be between 1 and the "
                     << c.n_experts << " experts");
  if (c.n_experts > 4096) STRATA_FAIL(c.name << ": " << c.n_experts << " experts, above the limit of 4096");
  if (c.expert_intermediate <= 0 || c.expert_intermediate > (1 << 22))
    STRATA_FAIL(c.name << ": the experts' intermediate size " << c.expert_intermediate << " must be in [1, 2^22]");
  for (size_t i = 0; i < c.dense_layers.size(); ++i)
    if (c.dense_layers[i] < 0 || c.dense_layers[i] >= c.n_layers || (i > 0 && c.dense_layers[i] <= c.dense_layers[i - 1]))
      STRATA_FAIL(c.name << ": dense (mlp_only) layer " << c.dense_layers[i] << " outside the " << c.n_layers
                       << " layers or out of order");
}

}  // namespace

void ModelConfig::validate() const {
  auto positive = [&](int v, const char* field) {
    if (v <= 0) STRATA_FAIL(name << ": config field " << field << " must be positive, got " << v);
  };
  positive(vocab_size, "vocab_size");
  positive(hidden, "hidden_size");
  positive(intermediate, "intermediate_size");
  positive(n_layers, "num_hidden_layers");
  positive(n_heads, "num_attention_heads");
  positive(n_kv_heads, "num_key_value_heads");
  positive(head_dim, "head_dim");
  positive(max_positions, "max_position_embeddings");
  if (n_heads % n_kv_heads != 0)
    STRATA_FAIL(name << ": num_attention_heads " << n_heads << " is not a multiple of num_key_value_heads "
                     << n_kv_heads);
  if (pos == PosKind::Rope && head_dim % 2 != 0) STRATA_FAIL(name << ": RoPE needs an even head_dim, got " << head_dim);
  // Bounds far above any real model (LLaMA-3 405B: hidden 16384, 126 layers, vocab 128256), so the
  // parameter counts cannot overflow int64 and q_dim() an int on a hostile config.json.
  auto at_most = [&](int64_t v, int64_t limit, const char* field) {
    if (v > limit) STRATA_FAIL(name << ": config field " << field << " is " << v << ", above the limit of " << limit);
  };
  at_most(vocab_size, 1 << 24, "vocab_size");
  at_most(hidden, 1 << 20, "hidden_size");
  at_most(intermediate, 1 << 22, "intermediate_size");
  at_most(n_layers, 1 << 14, "num_hidden_layers");
  at_most(max_positions, 1 << 26, "max_position_embeddings");
  at_most(head_dim, 1 << 16, "head_dim");
  at_most(int64_t(n_heads) * head_dim, 1 << 22, "num_attention_heads x head_dim");
  if (!(norm_eps >= 0.0f && std::isfinite(norm_eps)))
    STRATA_FAIL(name << ": norm epsilon " << norm_eps << " is not a finite number >= 0");
  if (pos == PosKind::Rope && !(rope_theta > 0.0f && std::isfinite(rope_theta)))
    STRATA_FAIL(name << ": rope_theta " << rope_theta << " is not positive");
  if (rope_scaling) {
    const RopeScaling& s = *rope_scaling;  // rope_inv_freq divides by each of these
    if (!(s.factor > 0.0f) || !(s.low_freq_factor > 0.0f) || !(s.high_freq_factor > s.low_freq_factor) ||
        s.original_max_positions <= 0)
      STRATA_FAIL(name << ": rope_scaling needs factor > 0, 0 < low_freq_factor < high_freq_factor and "
                       << "original_max_position_embeddings > 0; got " << s.factor << ", " << s.low_freq_factor << ", "
                       << s.high_freq_factor << ", " << s.original_max_positions);
  }
  if (!(rope_attention_factor > 0.0f && std::isfinite(rope_attention_factor)))
    STRATA_FAIL(name << ": RoPE attention factor " << rope_attention_factor << " is not positive");
  if (rotary_dim != 0 && (rotary_dim < 0 || rotary_dim > head_dim || rotary_dim % 2 != 0))
    STRATA_FAIL(name << ": rotary dimension " << rotary_dim << " is not an even number in 1.." << head_dim
                     << " (head_dim)");
  if (!rope_freq_factors.empty() && rope_freq_factors.size() != size_t(rotary_dims() / 2))
    STRATA_FAIL(name << ": " << rope_freq_factors.size() << " RoPE frequency factors for " << rotary_dims()
                     << " rotary dimensions (need half as many)");
  for (float f : rope_freq_factors)
    if (!(f > 0.0f && std::isfinite(f))) STRATA_FAIL(name << ": RoPE frequency factor " << f << " is not positive");
  for (int e : eos_ids)
    if (e < 0 || e >= vocab_size) STRATA_FAIL(name << ": eos_token_id " << e << " outside the vocabulary");
  if (moe()) validate_experts(*this);
  for (size_t i = 0; i < window_layers.size(); ++i)
    if (window_layers[i] < 0 || window_layers[i] >= n_layers || (i > 0 && window_layers[i] <= window_layers[i - 1]))
      STRATA_FAIL(name << ": sliding-window layer " << window_layers[i] << " outside the " << n_layers
                       << " layers or out of order");
  for (size_t i = 0; i < nope_layers.size(); ++i)
    if (nope_layers[i] < 0 || nope_layers[i] >= n_layers || (i > 0 && nope_layers[i] <= nope_layers[i - 1]))
      STRATA_FAIL(name << ": layer without RoPE " << nope_layers[i] << " outside the " << n_layers
                       << " layers or out of order");
  if (!nope_layers.empty() && pos != PosKind::Rope)
    STRATA_FAIL(name << ": layers without RoPE in a model without RoPE");
  if (!window_layers.empty() && layer_window <= 0)
    STRATA_FAIL(name << ": sliding-window layers need a window > 0, got " << layer_window);
  if (!(residual_multiplier > 0.0f && std::isfinite(residual_multiplier)) ||
      !(logit_scale > 0.0f && std::isfinite(logit_scale)))
    STRATA_FAIL(name << ": residual multiplier " << residual_multiplier << " and logit scale " << logit_scale
                     << " must be positive");
  for (float v : {embed_scale, query_scale, attn_softcap, final_softcap, local_rope_theta})
    if (!(v >= 0.0f && std::isfinite(v)))
      STRATA_FAIL(name << ": Gemma setting " << v << " (embedding scale, query_pre_attn_scalar, soft cap or local "
                       << "RoPE base) is not a finite number >= 0");
  if (mlp == MlpKind::ClampedSwiGLU &&
      !(glu_limit > 0.0f && std::isfinite(glu_limit) && glu_alpha > 0.0f && std::isfinite(glu_alpha)))
    STRATA_FAIL(name << ": swiglu_limit " << glu_limit << " and swiglu_alpha " << glu_alpha
                     << " must be finite and positive");
  if (attn_sinks && n_heads > 256) STRATA_FAIL(name << ": attention sinks for " << n_heads << " heads (at most 256)");
}


namespace {

// Integer fields land in an int: a value that is not an integer or does not fit is refused, not
// truncated (4294967360 would become 64) or converted out of range (1e300, undefined behaviour).
int as_int(const json& v, const char* key) {
  const bool fits = v.is_number_unsigned()  ? v.get<uint64_t>() <= uint64_t(INT32_MAX)
                    : v.is_number_integer() ? v.get<int64_t>() >= INT32_MIN && v.get<int64_t>() <= INT32_MAX
                                            : false;
  if (!fits)
    STRATA_FAIL("config field '" << key << "' is " << v.dump() << "; expected an integer that fits in 32 bits");
  return int(v.get<int64_t>());
}

// Float fields: a number a float holds (1e300 would be inf), NaN being no JSON number.
float as_float(const json& v, const char* key) {
  if (!v.is_number() || !(std::fabs(v.get<double>()) <= double(FLT_MAX)))
    STRATA_FAIL("config field '" << key << "' is " << v.dump() << "; expected a number within float range");
  return float(v.get<double>());
}

template <class T>
T get_or(const json& j, const char* key, T fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if constexpr (std::is_same_v<T, int>) return as_int(*it, key);
  if constexpr (std::is_same_v<T, float>) return as_float(*it, key);
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    STRATA_FAIL("config field '" << key << "' has the wrong type: " << it->dump());
  }
}

int require_int(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) STRATA_FAIL("missing field '" << key << "'");
  return as_int(*it, key);
}

// An id or a list of ids (eos_token_id is either).
std::vector<int> id_list(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return {};
  if (!it->is_array()) return {as_int(*it, key)};
  std::vector<int> ids;
  for (const json& id : *it) ids.push_back(as_int(id, key));
  return ids;
}

void read_opt(const json& j, const std::string& file, ModelConfig& c) {
  c.arch = Arch::OPT;
  c.hidden = require_int(j, "hidden_size");
  c.intermediate = require_int(j, "ffn_dim");
  c.n_layers = require_int(j, "num_hidden_layers");
  c.n_heads = require_int(j, "num_attention_heads");
  c.n_kv_heads = c.n_heads;
  if (c.n_heads > 0 && c.hidden % c.n_heads != 0)  // transformers refuses it too
    STRATA_FAIL(file << ": hidden_size " << c.hidden << " is not a multiple of num_attention_heads " << c.n_heads);
  c.head_dim = c.n_heads > 0 ? c.hidden / c.n_heads : 0;
  c.max_positions = require_int(j, "max_position_embeddings");
  c.norm = NormKind::LayerNorm;
  c.norm_eps = 1e-5f;  // torch.nn.LayerNorm's default, which OPT uses
  c.pos = PosKind::Learned;
  c.pos_offset = 2;
  const std::string act = get_or<std::string>(j, "activation_function", "relu");
  if (act == "relu") c.mlp = MlpKind::ReLU;
  else if (act == "gelu") c.mlp = MlpKind::GELU;
  else STRATA_FAIL(file << ": OPT activation_function '" << act << "' is not supported (relu, gelu)");
  const bool bias = get_or<bool>(j, "enable_bias", true);
  c.qkv_bias = c.o_bias = c.mlp_bias = bias;
  c.norm_bias = true;
  if (!get_or<bool>(j, "layer_norm_elementwise_affine", true))
    STRATA_FAIL(file << ": OPT without elementwise-affine LayerNorm is not supported");
  c.tied_embeddings = get_or<bool>(j, "tie_word_embeddings", true);
  const int proj = get_or<int>(j, "word_embed_proj_dim", c.hidden);
  if (proj != c.hidden)
    STRATA_FAIL(file << ": OPT with word_embed_proj_dim " << proj << " != hidden_size " << c.hidden
                     << " (OPT-350m's projection) is not supported");
  if (!get_or<bool>(j, "do_layer_norm_before", true))
    STRATA_FAIL(file << ": OPT with do_layer_norm_before=false (post-LayerNorm, OPT-350m) is not supported");
  if (get_or<bool>(j, "_remove_final_layer_norm", false))
    STRATA_FAIL(file << ": OPT with _remove_final_layer_norm is not supported");
}

// The pretraining context scaled RoPE extends: config.json's top level (Phi-3), else rope_scaling's,
// else max_position_embeddings (transformers' standardize_rope_params order).
int original_positions(const json& j, const json& scaling, const std::string& file, const ModelConfig& c) {
  const int original = get_or<int>(j, "original_max_position_embeddings",
                                   get_or<int>(scaling, "original_max_position_embeddings", c.max_positions));
  if (original <= 0) STRATA_FAIL(file << ": original_max_position_embeddings " << original << " is not positive");
  return original;
}

float required_factor(const json& scaling, const std::string& file, const std::string& type) {
  if (!scaling.contains("factor")) STRATA_FAIL(file << ": rope_scaling of type '" << type << "' needs 'factor'");
  const float factor = as_float(scaling["factor"], "rope_scaling.factor");
  if (!(factor > 0.0f && std::isfinite(factor)))
    STRATA_FAIL(file << ": rope_scaling.factor " << factor << " is not positive");
  return factor;
}

// Linear (position interpolation): every inverse frequency divided by the factor.
void read_linear_rope(const json& scaling, const std::string& file, ModelConfig& c) {
  c.rope_freq_factors.assign(size_t(c.rotary_dims() / 2), required_factor(scaling, file, "linear"));
}

// YaRN (yarn_freq_divisors). The attention factor is 0.1 ln(factor) + 1 unless given (DeepSeek's
// mscale / mscale_all_dim ratio when both are). The context becomes factor x original when that
// is longer than max_position_embeddings (Qwen2.5: 4 x 32768), as vLLM takes it, unless a sliding
// window already is the context.
void read_yarn(const json& j, const json& scaling, const std::string& file, ModelConfig& c) {
  const int original = original_positions(j, scaling, file, c);
  const double factor = required_factor(scaling, file, "yarn");
  auto given_or = [&](const char* key, double fallback) {  // transformers' `get(key) or fallback`
    const double v = get_or<float>(scaling, key, 0.0f);
    return v != 0.0 ? v : fallback;
  };
  const double m = given_or("mscale", 0), m_all = given_or("mscale_all_dim", 0);
  c.rope_attention_factor = get_or<float>(
      scaling, "attention_factor",
      float(m != 0.0 && m_all != 0.0 ? yarn_mscale(factor, m) / yarn_mscale(factor, m_all) : yarn_mscale(factor)));
  c.rope_freq_factors = yarn_freq_divisors(c.rotary_dims(), c.rope_theta, factor, original, given_or("beta_fast", 32),
                                           given_or("beta_slow", 1), get_or<bool>(scaling, "truncate", true));
  // A sliding window shorter than the context is the context (read_llama): YaRN does not lift it.
  if (c.sliding_window == 0)
    c.max_positions = std::max(c.max_positions, int(std::min(factor * original, double(1 << 26))));
}

// LongRoPE as transformers' Phi-3 applies it: inverse frequencies divided by short_factor while
// the sequence stays within original_max_position_embeddings, by long_factor past it (for the
// whole sequence, cached keys included). Strata serves the first regime exactly and caps the
// context there (Phi-3.5 mini: 4096 of 131072 positions). The attention factor is
// sqrt(1 + ln(factor) / ln(original)), factor = max_position_embeddings / original, unless given.
void read_longrope(const json& j, const json& scaling, const std::string& file, ModelConfig& c) {
  const int original = original_positions(j, scaling, file, c);
  auto it = scaling.find("short_factor");
  if (it == scaling.end() || !it->is_array())
    STRATA_FAIL(file << ": LongRoPE scaling needs rope_scaling.short_factor, an array of rotary dims / 2 numbers");
  for (const json& f : *it) c.rope_freq_factors.push_back(as_float(f, "rope_scaling.short_factor"));
  if (c.rope_freq_factors.size() != size_t(c.rotary_dims() / 2))
    STRATA_FAIL(file << ": rope_scaling.short_factor has " << c.rope_freq_factors.size() << " values; "
                     << (c.partial_rotary() ? "the rotary dims / 2 are " : "head_dim / 2 is ") << c.rotary_dims() / 2);
  const float factor = get_or<float>(scaling, "factor", float(c.max_positions) / float(original));
  c.rope_attention_factor = get_or<float>(
      scaling, "attention_factor",
      factor <= 1.0f ? 1.0f : std::sqrt(1.0f + std::log(factor) / std::log(float(original))));
  c.max_positions = std::min(c.max_positions, original);
}

// Mixtral (num_local_experts; the experts' width is intermediate_size; top-k weights always
// renormalised) and Qwen3-MoE (num_experts, moe_intermediate_size, norm_topk_prob; layer l's MLP is
// sparse unless l is in mlp_only_layers or (l + 1) is not a multiple of decoder_sparse_step, as in
// transformers' Qwen3MoeDecoderLayer).
void read_experts(const json& j, const std::string& file, const std::string& model_type, ModelConfig& c) {
  const bool mixtral = model_type == "mixtral";
  // Qwen3-MoE checkpoints say num_experts; transformers 5 writes num_local_experts for both.
  const char* count_key = !mixtral && j.contains("num_experts") ? "num_experts" : "num_local_experts";
  c.moe_naming = mixtral ? MoeNaming::Mixtral : MoeNaming::Qwen3Moe;
  c.n_experts = require_int(j, count_key);
  c.experts_per_token = require_int(j, "num_experts_per_tok");
  if (c.n_experts <= 0) STRATA_FAIL(file << ": " << count_key << " is " << c.n_experts << "; expected at least 1");
  if (c.experts_per_token <= 0 || c.experts_per_token > c.n_experts)
    STRATA_FAIL(file << ": num_experts_per_tok " << c.experts_per_token << " must be between 1 and " << count_key
                     << " (" << c.n_experts << ")");
  if (mixtral) {
    c.expert_intermediate = c.intermediate;
    return;
  }
  c.expert_intermediate = require_int(j, "moe_intermediate_size");
  c.norm_topk_prob = get_or<bool>(j, "norm_topk_prob", false);  // transformers' Qwen3MoeConfig default
  const int step = get_or<int>(j, "decoder_sparse_step", 1);
  if (step <= 0) STRATA_FAIL(file << ": decoder_sparse_step " << step << " is not positive");
  std::vector<int> mlp_only = id_list(j, "mlp_only_layers");
  for (int l = 0; l < c.n_layers; ++l)
    if (std::find(mlp_only.begin(), mlp_only.end(), l) != mlp_only.end() || (l + 1) % step != 0)
      c.dense_layers.push_back(l);
  for (int l : mlp_only)
    if (l < 0 || l >= c.n_layers)
      STRATA_FAIL(file << ": mlp_only_layers names layer " << l << " of " << c.n_layers);
}

// The sizes every LLaMA-style config.json gives (Gemma's too), with its RMSNorm and RoPE; head_dim
// and max_position_embeddings default to the family's.
void read_llama_shape(const json& j, int default_head_dim, int default_positions, ModelConfig& c) {
  c.arch = Arch::Llama;
  c.hidden = require_int(j, "hidden_size");
  c.intermediate = require_int(j, "intermediate_size");
  c.n_layers = require_int(j, "num_hidden_layers");
  // validate()'s bound, here already: the per-layer lists the readers build are as long.
  if (c.n_layers > (1 << 14))
    STRATA_FAIL("config field num_hidden_layers is " << c.n_layers << ", above the limit of " << (1 << 14));
  c.n_heads = require_int(j, "num_attention_heads");
  c.n_kv_heads = get_or<int>(j, "num_key_value_heads", c.n_heads);
  c.head_dim = get_or<int>(j, "head_dim", default_head_dim);
  // Also validate()'s: YaRN's and the linear scaling's tables are head_dim / 2 long when read.
  if (c.head_dim > (1 << 16))
    STRATA_FAIL("config field head_dim is " << c.head_dim << ", above the limit of " << (1 << 16));
  c.max_positions = get_or<int>(j, "max_position_embeddings", default_positions);
  c.norm = NormKind::RMSNorm;
  c.norm_eps = get_or<float>(j, "rms_norm_eps", 1e-6f);
  c.pos = PosKind::Rope;
}

// SmolLM3 (smollm3): LLaMA whose every fourth layer attends without RoPE. no_rope_layers holds a
// flag a layer, 1 where RoPE applies (transformers' SmolLM3Attention.use_rope), else every
// no_rope_layer_interval-th layer (4) has none. Its sliding window, off in every release, is refused.
void read_nope_layers(const json& j, const std::string& file, ModelConfig& c) {
  if (get_or<bool>(j, "use_sliding_window", false))
    STRATA_FAIL(file << ": use_sliding_window=true is not supported for SmolLM3");
  auto flags = j.find("no_rope_layers");
  if (flags != j.end() && !flags->is_null()) {
    if (!flags->is_array() || int(flags->size()) != c.n_layers)
      STRATA_FAIL(file << ": no_rope_layers must list num_hidden_layers (" << c.n_layers << ") flags");
    for (int l = 0; l < c.n_layers; ++l) {
      const json& f = (*flags)[size_t(l)];
      if (!f.is_number_integer() || (f.get<int64_t>() != 0 && f.get<int64_t>() != 1))
        STRATA_FAIL(file << ": no_rope_layers[" << l << "] must be 0 or 1, got " << f.dump());
      if (f.get<int64_t>() == 0) c.nope_layers.push_back(l);
    }
    return;
  }
  const int interval = get_or<int>(j, "no_rope_layer_interval", 4);
  if (interval <= 0) STRATA_FAIL(file << ": no_rope_layer_interval " << interval << " is not positive");
  for (int l = 0; l < c.n_layers; ++l)
    if ((l + 1) % interval == 0) c.nope_layers.push_back(l);
}

// partial_rotary_factor (rope_parameters' in transformers 5, config.json's root before): each head's
// first int(head_dim x factor) dims rotate. Only Phi-3's attention (Phi-4-mini: 0.75) and GLM's
// (0.5, transformers' default for it) split the head so in transformers; the others rotate whole
// heads, so a factor there is refused.
void read_partial_rotary(const json& j, const json& rope, const std::string& file, const std::string& model_type,
                         ModelConfig& c) {
  const bool glm = model_type == "glm" || model_type == "glm4";
  const double factor = get_or<double>(rope, "partial_rotary_factor",
                                       get_or<double>(j, "partial_rotary_factor", glm ? 0.5 : 1.0));
  if (factor == 1.0) return;
  if (model_type != "phi3" && !glm)
    STRATA_FAIL(file << ": partial_rotary_factor " << factor << " is not supported for " << model_type
                     << " (phi3, glm, glm4)");
  const double dims = double(c.head_dim) * factor;  // transformers' int(head_dim * partial_rotary_factor)
  if (!(factor > 0.0 && factor < 1.0) || int(dims) < 2 || int(dims) % 2 != 0)
    STRATA_FAIL(file << ": partial_rotary_factor " << factor << " of head_dim " << c.head_dim
                     << " does not give an even number of rotary dimensions");
  c.rotary_dim = int(dims);
}

// Granite (GraniteForCausalLM): LLaMA with four multipliers, each 1 when absent (transformers'
// defaults): embeddings x embedding_multiplier, scores x attention_multiplier (in place of
// 1 / sqrt(head_dim)), each residual branch x residual_multiplier, logits / logits_scaling.
void read_granite(const json& j, const std::string& file, ModelConfig& c) {
  auto positive = [&](const char* key) {
    const float v = get_or<float>(j, key, 1.0f);
    if (!(v > 0.0f)) STRATA_FAIL(file << ": " << key << " " << v << " is not positive");
    return v;
  };
  const float embedding = positive("embedding_multiplier"), attention = positive("attention_multiplier");
  if (embedding != 1.0f) c.embed_scale = embedding;
  c.query_scale = 1.0f / (attention * attention);  // attention_scale() = 1 / sqrt(query_scale)
  c.residual_multiplier = positive("residual_multiplier");
  c.logit_scale = 1.0f / positive("logits_scaling");
}

bool read_layer_types(const json& j, const std::string& file, ModelConfig& c);

// OLMo 3: OLMo 2's layer with three sliding-window layers in four (layer_types, else every fourth
// full, as transformers' default), the sliding ones rotating with their own base (`sliding_rope`,
// transformers 5's rope_parameters.sliding_attention; else rope_theta), unscaled: the YaRN of
// rope_scaling is the full layers' alone, its attention factor too (ModelConfig::attention_scale).
void read_olmo3_windows(const json& j, const json& sliding_rope, const std::string& file, ModelConfig& c) {
  c.layer_window = get_or<int>(j, "sliding_window", 4096);
  if (c.layer_window <= 0) STRATA_FAIL(file << ": sliding_window " << c.layer_window << " is not positive");
  if (!read_layer_types(j, file, c))
    for (int l = 0; l < c.n_layers; ++l)
      if ((l + 1) % 4 != 0) c.window_layers.push_back(l);
  c.local_rope_theta = get_or<float>(sliding_rope, "rope_theta", get_or<float>(j, "rope_theta", c.rope_theta));
  const std::string local_type = get_or<std::string>(sliding_rope, "rope_type", "default");
  if (local_type != "default")
    STRATA_FAIL(file << ": sliding layers' rope type '" << local_type << "' is not supported (default)");
}

void read_llama(const json& j, const std::string& file, const std::string& model_type, ModelConfig& c) {
  const int heads = get_or<int>(j, "num_attention_heads", 0);
  read_llama_shape(j, heads > 0 ? get_or<int>(j, "hidden_size", 0) / heads : 0, 2048, c);
  c.mlp = MlpKind::SwiGLU;
  const std::string act = get_or<std::string>(j, "hidden_act", "silu");
  if (act != "silu") STRATA_FAIL(file << ": hidden_act '" << act << "' is not supported (silu)");
  // GLM and GLM-4: attention_bias (default true) is q/k/v's; o_proj has none. Their rotated pairs
  // interleave (rotary_layout_source), and GLM-4 adds sandwich norms under names of its own.
  const bool glm = model_type == "glm" || model_type == "glm4";
  c.qkv_bias = model_type == "qwen2" ? true : get_or<bool>(j, "attention_bias", glm);
  c.qk_norm = model_type == "qwen3" || model_type == "qwen3_moe";  // q_norm, k_norm over each head, before RoPE
  c.o_bias = model_type == "qwen2" || glm ? false : get_or<bool>(j, "attention_bias", false);
  c.rope_interleaved = glm;
  if (model_type == "glm4") {
    c.sandwich_norms = true;
    c.sandwich_naming = SandwichNaming::Glm4;
  }
  if (model_type == "olmo2" || model_type == "olmo3") set_olmo2_fields(c);  // post-norms under Gemma's names
  if (get_or<bool>(j, "mlp_bias", false)) STRATA_FAIL(file << ": mlp_bias=true is not supported");
  c.tied_embeddings = get_or<bool>(j, "tie_word_embeddings", false);
  if (model_type == "mistral" || model_type == "mixtral" || model_type == "qwen2" || model_type == "qwen3" ||
      model_type == "qwen3_moe" || model_type == "phi3") {
    // Sliding-window attention differs from full attention only for sequences longer than the
    // window (a query sees keys less than `window` positions back): the context becomes the
    // window, and everything served is exact (Mistral 7B v0.1: 4096 of 32768).
    const bool sliding =
        get_or<bool>(j, "use_sliding_window", model_type == "mistral" || model_type == "mixtral" || model_type == "phi3");
    const int window = get_or<int>(j, "sliding_window", 0);
    if (sliding && window > 0 && window < c.max_positions) c.max_positions = c.sliding_window = window;
  }

  // transformers 5 writes rope settings under rope_parameters; older files use rope_theta/rope_scaling.
  json rope = j.contains("rope_parameters") && j["rope_parameters"].is_object() ? j["rope_parameters"] : json::object();
  // transformers 5's rope_parameters per layer type (OLMo 3): the full layers' settings are the
  // model's; the sliding layers' base is read with their windows (read_olmo3_windows).
  json sliding_rope = json::object();
  if (rope.contains("full_attention")) {
    sliding_rope = rope.value("sliding_attention", json::object());
    rope = rope["full_attention"].is_object() ? rope["full_attention"] : json::object();
  }
  c.rope_theta = get_or<float>(rope, "rope_theta", get_or<float>(j, "rope_theta", 10000.0f));
  json scaling = j.contains("rope_scaling") && j["rope_scaling"].is_object() ? j["rope_scaling"] : rope;
  const std::string rope_type = get_or<std::string>(scaling, "rope_type", get_or<std::string>(scaling, "type", "default"));
  read_partial_rotary(j, rope, file, model_type, c);  // before the scalings, which count its frequencies
  if (rope_type == "llama3") {
    RopeScaling s;
    s.factor = get_or<float>(scaling, "factor", 1.0f);
    s.low_freq_factor = get_or<float>(scaling, "low_freq_factor", 1.0f);
    s.high_freq_factor = get_or<float>(scaling, "high_freq_factor", 4.0f);
    s.original_max_positions = get_or<int>(scaling, "original_max_position_embeddings", 8192);
    c.rope_scaling = s;
  } else if (model_type == "phi3" && (rope_type == "longrope" || rope_type == "su" || rope_type == "yarn")) {
    // transformers reads Phi-3's "su" and "yarn" as LongRoPE.
    read_longrope(j, scaling, file, c);
  } else if (rope_type == "linear") {
    read_linear_rope(scaling, file, c);
  } else if (rope_type == "yarn") {
    read_yarn(j, scaling, file, c);
  } else if (rope_type == "dynamic") {
    // Dynamic NTK changes the frequencies only for sequences past max_position_embeddings,
    // Strata's context: within it transformers keeps the plain ones.
    required_factor(scaling, file, "dynamic");
  } else if (rope_type != "default") {
    STRATA_FAIL(file << ": rope scaling type '" << rope_type
                     << "' is not supported (llama3, linear, dynamic, yarn; longrope for phi3)");
  }
  if (model_type == "mixtral" || model_type == "qwen3_moe") read_experts(j, file, model_type, c);
  if (model_type == "smollm3") read_nope_layers(j, file, c);
  if (model_type == "granite") read_granite(j, file, c);
  if (model_type == "olmo3") read_olmo3_windows(j, sliding_rope, file, c);
}

// transformers 5's layer_types (Gemma, GPT-OSS): each layer's sliding_attention or full_attention,
// the sliding ones into window_layers. False when config.json has none.
bool read_layer_types(const json& j, const std::string& file, ModelConfig& c) {
  auto types = j.find("layer_types");
  if (types == j.end() || types->is_null()) return false;
  if (!types->is_array() || int(types->size()) != c.n_layers)
    STRATA_FAIL(file << ": layer_types must list num_hidden_layers (" << c.n_layers << ") layer types");
  for (int l = 0; l < c.n_layers; ++l) {
    const json& t = (*types)[size_t(l)];
    const std::string kind = t.is_string() ? t.get<std::string>() : "";
    if (kind == "sliding_attention") c.window_layers.push_back(l);
    else if (kind != "full_attention")
      STRATA_FAIL(file << ": layer_types[" << l << "] is " << t.dump() << " (sliding_attention or full_attention)");
  }
  return true;
}

// Gemma 2 (gemma2) and Gemma 3's text model (gemma3_text, or a multimodal gemma3's text_config,
// read by the caller): LLaMA's layer with GeGLU, (1 + w) norms, a norm after the attention and
// after the MLP too, embeddings times sqrt(hidden), scores scaled by query_pre_attn_scalar, and
// sliding-window layers among full ones (layer_types, else Gemma 2's even layers and Gemma 3's
// five in six). Gemma 2 soft-caps scores and logits; Gemma 3 normalises q and k per head and
// rotates its sliding layers with rope_local_base_freq, unscaled.
void read_gemma(const json& j, const std::string& file, const std::string& model_type, ModelConfig& c) {
  const bool gemma2 = model_type == "gemma2";
  read_llama_shape(j, 256, gemma2 ? 8192 : 131072, c);
  c.norm_plus_one = true;
  c.sandwich_norms = true;
  c.mlp = MlpKind::GeGLU;
  // Gemma's files name the activation hidden_activation (hidden_act too in older ones).
  const std::string act =
      get_or<std::string>(j, "hidden_activation", get_or<std::string>(j, "hidden_act", "gelu_pytorch_tanh"));
  if (act != "gelu_pytorch_tanh" && act != "gelu_tanh")
    STRATA_FAIL(file << ": hidden_activation '" << act << "' is not supported (gelu_pytorch_tanh)");
  if (get_or<bool>(j, "attention_bias", false)) STRATA_FAIL(file << ": attention_bias=true is not supported for Gemma");
  if (get_or<bool>(j, "use_bidirectional_attention", false))  // EmbeddingGemma: an encoder, not a generator
    STRATA_FAIL(file << ": use_bidirectional_attention=true (an embedding model) is not supported");
  c.qk_norm = !gemma2;
  c.tied_embeddings = get_or<bool>(j, "tie_word_embeddings", true);
  c.embed_scale = std::sqrt(float(c.hidden));
  c.query_scale = get_or<float>(j, "query_pre_attn_scalar", float(c.head_dim));
  if (!(c.query_scale > 0.0f)) STRATA_FAIL(file << ": query_pre_attn_scalar " << c.query_scale << " is not positive");
  c.attn_softcap = get_or<float>(j, "attn_logit_softcapping", 0.0f);
  c.final_softcap = get_or<float>(j, "final_logit_softcapping", 0.0f);
  if (c.attn_softcap < 0.0f || c.final_softcap < 0.0f)
    STRATA_FAIL(file << ": attn_logit_softcapping and final_logit_softcapping must be positive or null");

  c.layer_window = get_or<int>(j, "sliding_window", gemma2 ? 4096 : 512);
  if (c.layer_window <= 0) STRATA_FAIL(file << ": sliding_window " << c.layer_window << " is not positive");
  if (!read_layer_types(j, file, c)) {
    const int pattern = gemma2 ? 2 : get_or<int>(j, "sliding_window_pattern", 6);
    if (pattern <= 0) STRATA_FAIL(file << ": sliding_window_pattern " << pattern << " is not positive");
    for (int l = 0; l < c.n_layers; ++l)
      if ((l + 1) % pattern != 0) c.window_layers.push_back(l);
  }

  // RoPE: one setting for every layer (Gemma 2, and Gemma 3's files before transformers 5), or
  // transformers 5's rope_parameters per layer type.
  json full = json::object(), sliding = json::object();
  auto params = j.find("rope_parameters");
  if (params != j.end() && params->is_object() && params->contains("full_attention")) {
    full = (*params)["full_attention"];
    sliding = params->value("sliding_attention", json::object());
  } else {
    full = j.contains("rope_scaling") && j["rope_scaling"].is_object() ? j["rope_scaling"] : json::object();
    if (params != j.end() && params->is_object()) full.update(*params);
  }
  c.rope_theta = get_or<float>(full, "rope_theta", get_or<float>(j, "rope_theta", 10000.0f));
  const std::string rope_type = get_or<std::string>(full, "rope_type", get_or<std::string>(full, "type", "default"));
  if (rope_type == "linear") read_linear_rope(full, file, c);
  else if (rope_type != "default")
    STRATA_FAIL(file << ": rope scaling type '" << rope_type << "' is not supported for Gemma (linear)");
  if (!gemma2) {
    c.local_rope_theta = get_or<float>(sliding, "rope_theta", get_or<float>(j, "rope_local_base_freq", 10000.0f));
    const std::string local_type = get_or<std::string>(sliding, "rope_type", "default");
    if (local_type != "default")
      STRATA_FAIL(file << ": sliding layers' rope type '" << local_type << "' is not supported (default)");
  }
}

}  // namespace

void set_olmo2_fields(ModelConfig& c) {
  c.pre_norms = false;
  c.sandwich_norms = true;
  c.qk_norm = c.qk_norm_whole = true;
}

void set_gpt_oss_fields(ModelConfig& c) {
  c.norm_eps = 1e-5f;
  c.mlp = MlpKind::ClampedSwiGLU;
  c.glu_limit = 7.0f;
  c.glu_alpha = 1.702f;
  c.qkv_bias = c.o_bias = c.attn_sinks = c.router_bias = c.expert_bias = true;
  c.moe_naming = MoeNaming::GptOss;
  c.expert_intermediate = c.intermediate;
  c.norm_topk_prob = true;
}

namespace {

// GPT-OSS (gpt_oss): LLaMA's attention with biases on q, k, v and o and a learned sink logit per
// query head, sliding-window layers (layer_types, else the even ones) among full ones, YaRN; every
// MLP is a mixture of experts whose router and experts have biases and whose experts apply the
// clamped SwiGLU. Its router takes the top k of the logits and softmaxes them: the weights of
// softmax, top k and renormalisation (route_tokens), so norm_topk_prob.
void read_gpt_oss(const json& j, const std::string& file, ModelConfig& c) {
  read_llama_shape(j, 64, 131072, c);
  set_gpt_oss_fields(c);  // validate() checks the expert counts and the SwiGLU's settings
  c.norm_eps = get_or<float>(j, "rms_norm_eps", c.norm_eps);
  const std::string act = get_or<std::string>(j, "hidden_act", "silu");
  if (act != "silu") STRATA_FAIL(file << ": hidden_act '" << act << "' is not supported (silu)");
  c.glu_limit = get_or<float>(j, "swiglu_limit", c.glu_limit);
  c.glu_alpha = get_or<float>(j, "swiglu_alpha", c.glu_alpha);
  c.qkv_bias = c.o_bias = get_or<bool>(j, "attention_bias", true);
  c.tied_embeddings = get_or<bool>(j, "tie_word_embeddings", false);
  c.n_experts = require_int(j, j.contains("num_experts") ? "num_experts" : "num_local_experts");
  if (c.n_experts <= 0) STRATA_FAIL(file << ": num_local_experts is " << c.n_experts << "; expected at least 1");
  c.experts_per_token = require_int(j, "num_experts_per_tok");

  c.layer_window = get_or<int>(j, "sliding_window", 128);
  if (c.layer_window <= 0) STRATA_FAIL(file << ": sliding_window " << c.layer_window << " is not positive");
  if (!read_layer_types(j, file, c))
    for (int l = 0; l < c.n_layers; l += 2) c.window_layers.push_back(l);

  // RoPE: transformers 5's rope_parameters, or the Hub's rope_theta and rope_scaling; YaRN (factor
  // 32 over 4096 positions, truncate false) when neither says, as GptOssConfig defaults.
  json scaling = {{"rope_type", "yarn"}, {"factor", 32.0}, {"beta_fast", 32.0}, {"beta_slow", 1.0},
                  {"truncate", false}, {"original_max_position_embeddings", 4096}};
  for (const char* key : {"rope_scaling", "rope_parameters"})
    if (j.contains(key) && j[key].is_object()) scaling = j[key];
  c.rope_theta = get_or<float>(scaling, "rope_theta", get_or<float>(j, "rope_theta", 150000.0f));
  const std::string rope_type = get_or<std::string>(scaling, "rope_type", get_or<std::string>(scaling, "type", "default"));
  if (rope_type == "yarn") read_yarn(j, scaling, file, c);
  else if (rope_type != "default")
    STRATA_FAIL(file << ": rope scaling type '" << rope_type << "' is not supported for GPT-OSS (yarn)");
}

// A multimodal Gemma 3 (Gemma3ForConditionalGeneration): its text_config is a gemma3_text config,
// whose missing keys take Gemma3TextConfig's defaults; the ids may sit at the top level.
json gemma3_text_config(const json& j, const std::string& file) {
  auto it = j.find("text_config");
  if (it == j.end() || !it->is_object()) STRATA_FAIL(file << ": a gemma3 config needs a text_config object");
  json text = *it;
  for (const char* key : {"vocab_size", "bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype", "dtype",
                          "tie_word_embeddings"})
    if (!text.contains(key) && j.contains(key)) text[key] = j[key];
  if (!text.contains("vocab_size")) text["vocab_size"] = 262208;  // Gemma3TextConfig's default
  return text;
}

}  // namespace

namespace {

// A file's bytes, or nothing when it cannot be opened.
std::optional<std::string> file_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// generation_config.json's sampling settings (RecommendedSampling), each checked against the
// range the sampler takes; `null` counts as absent. Errors name the field, the caller the file.
RecommendedSampling recommended_sampling(const json& j) {
  RecommendedSampling r;
  auto number = [&](const char* key, auto in_range, const char* range) -> std::optional<float> {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return std::nullopt;
    const float v = as_float(*it, key);
    if (!in_range(v)) STRATA_FAIL(key << " " << it->dump() << " must be " << range);
    return v;
  };
  std::optional<bool> do_sample;  // absent: vLLM takes what is named
  if (auto it = j.find("do_sample"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) STRATA_FAIL("do_sample must be true or false, got " << it->dump());
    do_sample = it->get<bool>();
  }
  if (do_sample.value_or(true)) {
    r.temperature = number("temperature", [](float v) { return v >= 0; }, ">= 0");
    r.top_p = number("top_p", [](float v) { return v > 0 && v <= 1; }, "in (0, 1]");
    r.min_p = number("min_p", [](float v) { return v >= 0 && v <= 1; }, "in [0, 1]");
    if (auto it = j.find("top_k"); it != j.end() && !it->is_null()) {
      const int k = as_int(*it, "top_k");
      if (k < -1) STRATA_FAIL("top_k " << k << " must be >= 0 (0 or -1: off)");
      r.top_k = std::max(k, 0);
    }
    if (!r.temperature && do_sample) r.temperature = 1.0f;  // generate()'s default
  }
  r.repetition_penalty = number("repetition_penalty", [](float v) { return v > 0; }, "> 0");
  if (auto it = j.find("max_new_tokens"); it != j.end() && !it->is_null()) {
    const int n = as_int(*it, "max_new_tokens");
    if (n < 1) STRATA_FAIL("max_new_tokens " << n << " must be at least 1");
    r.max_new_tokens = n;
  }
  return r;
}

}  // namespace

ModelConfig config_from_hf_json(const std::filesystem::path& path) {
  const std::optional<std::string> text = file_text(path);
  if (!text) STRATA_FAIL("cannot open model config " << path.string());
  return config_from_hf_json_text(*text, path);
}

RecommendedSampling read_generation_config(const std::filesystem::path& path, ModelConfig& c) {
  const std::optional<std::string> text = file_text(path);
  if (!text) return {};
  const std::string file = path.string();
  json j;
  try {
    j = json::parse(*text);
  } catch (const json::exception& e) {
    STRATA_FAIL(file << ": invalid JSON: " << e.what());
  }
  if (!j.is_object()) STRATA_FAIL(file << ": expected a JSON object");
  try {
    for (int id : id_list(j, "eos_token_id")) {
      if (id < 0 || id >= c.vocab_size)
        STRATA_FAIL("eos_token_id " << id << " outside the vocabulary of " << c.vocab_size);
      if (std::find(c.eos_ids.begin(), c.eos_ids.end(), id) == c.eos_ids.end()) c.eos_ids.push_back(id);
    }
    RecommendedSampling r = recommended_sampling(j);
    r.source = file;
    return r;
  } catch (const Error& e) {
    STRATA_FAIL(file << ": " << e.what());
  }
}

namespace {

// config.json's "torch_dtype" (or transformers 5's "dtype"): bfloat16, float16 or float32; F16
// when absent (only a bf16 checkpoint changes what `--dtype auto` picks).
DType checkpoint_dtype(const json& j, const std::string& file) {
  for (const char* key : {"dtype", "torch_dtype"}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    if (!j[key].is_string()) STRATA_FAIL(file << ": '" << key << "' must be a string");
    const std::string dt = j[key].get<std::string>();
    if (dt == "bfloat16") return DType::BF16;
    if (dt == "float16") return DType::F16;
    if (dt == "float32") return DType::F32;
    STRATA_FAIL(file << ": '" << key << "' is " << dt << " (expected bfloat16, float16 or float32)");
  }
  return DType::F16;
}

// A sequence classifier (LlamaForSequenceClassification, Qwen3ForSequenceClassification, ...)
// scores with `score.weight` [num_labels, hidden]: no LM head, whatever tie_word_embeddings says
// (a classifier converted from a tied model keeps the flag). Heads Strata does not compute are
// refused rather than loaded as a generator.
void read_head_kind(const json& j, const std::string& file, ModelConfig& c) {
  const auto it = j.find("architectures");
  if (it == j.end() || !it->is_array() || it->empty() || !(*it)[0].is_string()) return;
  const std::string arch = (*it)[0].get<std::string>();
  for (const char* other : {"ForTokenClassification", "ForQuestionAnswering"})
    if (arch.ends_with(other))
      STRATA_FAIL(file << ": architectures " << arch << ": a " << other
                       << " head is not supported (causal LMs, embedding models and ForSequenceClassification are)");
  const std::optional<TokenClassifier> from_tokens = token_classifier(j, file);
  if (!arch.ends_with("ForSequenceClassification")) {
    if (from_tokens)
      STRATA_FAIL(file << ": classifier_from_token makes a sequence classifier of a causal LM, but architectures is "
                       << arch << "; set it to the ForSequenceClassification class as well (--hf-overrides "
                                  "'{\"architectures\": [\"Qwen3ForSequenceClassification\"], ...}')");
    return;
  }
  // transformers derives num_labels from id2label (2 when neither is written); a head made from the
  // LM head's tokens has its own count.
  const auto labels = j.find("id2label");
  if (from_tokens) c.num_labels = from_tokens->labels();
  else if (labels != j.end() && labels->is_object() && !labels->empty()) c.num_labels = int(labels->size());
  else c.num_labels = get_or<int>(j, "num_labels", 2);
  if (c.num_labels < 1 || c.num_labels > (1 << 20))
    STRATA_FAIL(file << ": num_labels " << c.num_labels << " must be at least 1");
  c.lm_head = false;
  c.tied_embeddings = false;
}

}  // namespace

ModelConfig config_from_hf_json_text(const std::string& text, const std::filesystem::path& path) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    STRATA_FAIL(path.string() << ": invalid JSON: " << e.what());
  }
  if (!j.is_object()) STRATA_FAIL(path.string() << ": expected a JSON object");
  const std::string file = path.string();
  ModelConfig c;
  c.name = path.parent_path().filename().string();
  try {
    std::string model_type = get_or<std::string>(j, "model_type", "");
    if (model_type == "gemma3") {
      j = gemma3_text_config(j, file);
      model_type = "gemma3_text";
    }
    // Some embedding models attend both ways (gte-Qwen2, EmbeddingGemma): not a decoder's causal mask.
    const bool bidirectional = get_or<bool>(j, "use_bidirectional_attention", false);
    if (bidirectional || !get_or<bool>(j, "is_causal", true))
      STRATA_FAIL(file << ": " << (bidirectional ? "use_bidirectional_attention true" : "is_causal false")
                       << ": the model attends both ways (a bidirectional embedding model); Strata's attention is "
                          "causal");
    if (model_type == "opt") read_opt(j, file, c);
    else if (model_type == "gemma2" || model_type == "gemma3_text") read_gemma(j, file, model_type, c);
    else if (model_type == "gpt_oss") read_gpt_oss(j, file, c);
    else if (model_type == "llama" || model_type == "mistral" || model_type == "qwen2" || model_type == "qwen3" ||
             model_type == "phi3" || model_type == "mixtral" || model_type == "qwen3_moe" || model_type == "smollm3" ||
             model_type == "glm" || model_type == "glm4" || model_type == "granite" || model_type == "olmo2" ||
             model_type == "olmo3")
      read_llama(j, file, model_type, c);  // Phi-3, GLM: LLaMA with fused projections (split_fused_projections)
    else
      STRATA_FAIL(file << ": model_type '" << model_type
                       << "' is not supported (opt, llama, mistral, qwen2, qwen3, phi3, mixtral, qwen3_moe, smollm3, "
                          "gemma2, gemma3_text, gemma3, gpt_oss, glm, glm4, granite, olmo2, olmo3)");
    c.vocab_size = require_int(j, "vocab_size");
    std::vector<int> bos = id_list(j, "bos_token_id");
    c.bos_id = bos.empty() ? -1 : bos[0];
    c.eos_ids = id_list(j, "eos_token_id");
    std::vector<int> pad = id_list(j, "pad_token_id");
    c.pad_id = pad.empty() ? -1 : pad[0];
    c.checkpoint_dtype = checkpoint_dtype(j, file);
    read_head_kind(j, file, c);
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (msg.rfind(file, 0) == 0) throw;
    STRATA_FAIL(file << ": " << msg);
  }
  ModelConfig named = c;  // validate()'s errors start with the name; the file says more here
  named.name = file;
  named.validate();
  return c;
}

namespace {

ModelConfig opt_preset(const char* name, int hidden, int layers, int heads) {
  ModelConfig c;
  c.name = name;
  c.arch = Arch::OPT;
  c.vocab_size = 50272;
  c.hidden = hidden;
  c.intermediate = 4 * hidden;
  c.n_layers = layers;
  c.n_heads = c.n_kv_heads = heads;
  c.head_dim = hidden / heads;
  c.max_positions = 2048;
  c.norm = NormKind::LayerNorm;
  c.pos = PosKind::Learned;
  c.pos_offset = 2;
  c.mlp = MlpKind::ReLU;
  c.qkv_bias = c.o_bias = c.mlp_bias = c.norm_bias = true;
  c.tied_embeddings = true;
  c.bos_id = 2;
  c.eos_ids = {2};
  c.pad_id = 1;
  return c;
}

ModelConfig llama_preset(const char* name, int hidden, int layers, int heads, int kv_heads, int inter, int vocab,
                         float theta, int max_pos) {
  ModelConfig c;
  c.name = name;
  c.arch = Arch::Llama;
  c.vocab_size = vocab;
  c.hidden = hidden;
  c.intermediate = inter;
  c.n_layers = layers;
  c.n_heads = heads;
  c.n_kv_heads = kv_heads;
  c.head_dim = hidden / heads;
  c.max_positions = max_pos;
  c.norm = NormKind::RMSNorm;
  c.pos = PosKind::Rope;
  c.rope_theta = theta;
  c.mlp = MlpKind::SwiGLU;
  c.bos_id = 128000;
  c.eos_ids = {128001, 128009};
  c.checkpoint_dtype = DType::BF16;  // Llama 3, Qwen 2/3 and Mixtral ship bf16 weights
  return c;
}

const std::map<std::string, ModelConfig>& presets() {
  static const std::map<std::string, ModelConfig> table = [] {
    std::map<std::string, ModelConfig> m;
    // OPT shapes from the OPT paper (Zhang et al. 2022), as used by FlexGen's benchmarks.
    for (const ModelConfig& c : {opt_preset("opt-125m", 768, 12, 12), opt_preset("opt-1.3b", 2048, 24, 32),
                                 opt_preset("opt-6.7b", 4096, 32, 32), opt_preset("opt-13b", 5120, 40, 40),
                                 opt_preset("opt-30b", 7168, 48, 56), opt_preset("opt-66b", 9216, 64, 72),
                                 opt_preset("opt-175b", 12288, 96, 96)})
      m[c.name] = c;
    m["llama-3-8b"] = llama_preset("llama-3-8b", 4096, 32, 32, 8, 14336, 128256, 500000.0f, 8192);
    m["llama-3-70b"] = llama_preset("llama-3-70b", 8192, 80, 64, 8, 28672, 128256, 500000.0f, 8192);
    ModelConfig l31 = llama_preset("llama-3.1-8b", 4096, 32, 32, 8, 14336, 128256, 500000.0f, 131072);
    l31.rope_scaling = RopeScaling{8.0f, 1.0f, 4.0f, 8192};
    m[l31.name] = l31;
    ModelConfig qwen = llama_preset("qwen2-7b", 3584, 28, 28, 4, 18944, 152064, 1000000.0f, 32768);
    qwen.qkv_bias = true;
    qwen.norm_eps = 1e-6f;
    qwen.bos_id = -1;
    qwen.eos_ids = {151643};
    m[qwen.name] = qwen;
    // Qwen3 (config.json of Qwen/Qwen3-8B and -32B): per-head q/k norms, head_dim 128 whatever the
    // width (32B: 64 heads x 128 = 8192 > hidden 5120), untied, 40960 positions.
    for (ModelConfig q3 : {llama_preset("qwen3-8b", 4096, 36, 32, 8, 12288, 151936, 1000000.0f, 40960),
                           llama_preset("qwen3-32b", 5120, 64, 64, 8, 25600, 151936, 1000000.0f, 40960)}) {
      q3.head_dim = 128;
      q3.qk_norm = true;
      q3.norm_eps = 1e-6f;
      q3.bos_id = -1;
      q3.eos_ids = {151645, 151643};
      m[q3.name] = q3;
    }
    // SmolLM3-3B (HuggingFaceTB/SmolLM3-3B's config.json): GQA 16 / 4, tied, every fourth layer
    // without RoPE; 3.08B parameters.
    ModelConfig smollm3 = llama_preset("smollm3-3b", 2048, 36, 16, 4, 11008, 128256, 5000000.0f, 65536);
    smollm3.norm_eps = 1e-6f;
    smollm3.tied_embeddings = true;
    for (int l = 3; l < smollm3.n_layers; l += 4) smollm3.nope_layers.push_back(l);
    m[smollm3.name] = smollm3;
    // Phi-4-mini-instruct (config.json): GQA 24 / 8, tied, 96 of each head's 128 dims rotate
    // (partial_rotary_factor 0.75); its LongRoPE context served to the original 4096. 3.84B
    // parameters (its model card: 3.8B).
    ModelConfig phi4 = llama_preset("phi-4-mini", 3072, 32, 24, 8, 8192, 200064, 10000.0f, 4096);
    phi4.rotary_dim = 96;
    phi4.tied_embeddings = true;
    phi4.bos_id = 199999;
    phi4.eos_ids = {199999};
    m[phi4.name] = phi4;
    // GLM-4-9B-0414 (config.json): GQA 32 / 2, head_dim 128 of which 64 rotate on interleaved pairs,
    // q/k/v biases, sandwich norms; 9.40B parameters (its safetensors' count).
    ModelConfig glm4 = llama_preset("glm-4-9b", 4096, 40, 32, 2, 13696, 151552, 10000.0f, 32768);
    glm4.rotary_dim = 64;
    glm4.rope_interleaved = true;
    glm4.qkv_bias = true;
    glm4.sandwich_norms = true;
    glm4.sandwich_naming = SandwichNaming::Glm4;
    glm4.bos_id = -1;
    glm4.eos_ids = {151329, 151336, 151338};
    m[glm4.name] = glm4;
    // OLMo-2-0325-32B (config.json): GQA 40 / 8, norms after each block only, q and k normed over all
    // their heads; 32.2B parameters (the card's).
    ModelConfig olmo2 = llama_preset("olmo-2-32b", 5120, 64, 40, 8, 27648, 100352, 500000.0f, 4096);
    olmo2.norm_eps = 1e-6f;
    set_olmo2_fields(olmo2);
    olmo2.bos_id = -1;
    olmo2.eos_ids = {100257};
    m[olmo2.name] = olmo2;
    // Mixtral-8x7B-v0.1 (config.json): 8 experts of 14336, 2 per token, 32768 positions, no sliding
    // window. 46.7B parameters, 12.9B active.
    ModelConfig mixtral = llama_preset("mixtral-8x7b", 4096, 32, 32, 8, 14336, 32000, 1000000.0f, 32768);
    mixtral.norm_eps = 1e-5f;
    mixtral.n_experts = 8;
    mixtral.experts_per_token = 2;
    mixtral.expert_intermediate = 14336;
    mixtral.moe_naming = MoeNaming::Mixtral;
    mixtral.bos_id = 1;
    mixtral.eos_ids = {2};
    m[mixtral.name] = mixtral;
    // Qwen3-30B-A3B (config.json): 128 experts of 768, 8 per token, renormalised, every layer sparse,
    // head_dim 128 (32 heads x 128 = 4096 > hidden 2048). 30.5B parameters, 3.3B active.
    ModelConfig a3b = llama_preset("qwen3-30b-a3b", 2048, 48, 32, 4, 6144, 151936, 1000000.0f, 40960);
    a3b.head_dim = 128;
    a3b.qk_norm = true;
    a3b.norm_eps = 1e-6f;
    a3b.n_experts = 128;
    a3b.experts_per_token = 8;
    a3b.expert_intermediate = 768;
    a3b.norm_topk_prob = true;
    a3b.moe_naming = MoeNaming::Qwen3Moe;
    a3b.bos_id = -1;
    a3b.eos_ids = {151645, 151643};
    m[a3b.name] = a3b;
    // Gemma 2 9B and 27B, Gemma 3 1B, 12B and 27B (config.json; Gemma 3's 12B and 27B from
    // text_config): GeGLU, (1 + w) norms before and after each block, embeddings times sqrt(hidden),
    // tied. Gemma 2: even layers slide over 4096 of 8192 positions, scores soft-capped at 50 and
    // logits at 30. Gemma 3: five layers in six slide (512 positions for 1B, 1024 above), q/k norms,
    // sliding layers rotate with base 1e4, the others with 1e6 (scaled linearly by 8 above 1B).
    struct GemmaShape {
      const char* name;
      int hidden, layers, heads, kv_heads, head_dim, inter, window, query_scale;
    };
    for (const GemmaShape& g : {GemmaShape{"gemma-2-9b", 3584, 42, 16, 8, 256, 14336, 4096, 256},
                                GemmaShape{"gemma-2-27b", 4608, 46, 32, 16, 128, 36864, 4096, 144},
                                GemmaShape{"gemma-3-1b", 1152, 26, 4, 1, 256, 6912, 512, 256},
                                GemmaShape{"gemma-3-12b", 3840, 48, 16, 8, 256, 15360, 1024, 256},
                                GemmaShape{"gemma-3-27b", 5376, 62, 32, 16, 128, 21504, 1024, 168}}) {
      const bool gemma2 = std::string(g.name).starts_with("gemma-2");
      ModelConfig c = llama_preset(g.name, g.hidden, g.layers, g.heads, g.kv_heads, g.inter,
                                   gemma2 ? 256000 : g.hidden == 1152 ? 262144 : 262208,
                                   gemma2 ? 10000.0f : 1000000.0f, gemma2 ? 8192 : g.hidden == 1152 ? 32768 : 131072);
      c.head_dim = g.head_dim;
      c.mlp = MlpKind::GeGLU;
      c.norm_eps = 1e-6f;
      c.norm_plus_one = c.sandwich_norms = c.tied_embeddings = true;
      c.embed_scale = std::sqrt(float(g.hidden));
      c.query_scale = float(g.query_scale);
      c.layer_window = g.window;
      for (int l = 0; l < g.layers; ++l)
        if ((l + 1) % (gemma2 ? 2 : 6) != 0) c.window_layers.push_back(l);
      if (gemma2) {
        c.attn_softcap = 50.0f;
        c.final_softcap = 30.0f;
      } else {
        c.qk_norm = true;
        c.local_rope_theta = 10000.0f;
        if (g.hidden != 1152) c.rope_freq_factors.assign(size_t(g.head_dim / 2), 8.0f);
      }
      c.bos_id = 2;
      c.eos_ids = {1, gemma2 ? 107 : 106};  // <eos>, <end_of_turn>
      c.pad_id = 0;
      m[c.name] = c;
    }
    // gpt-oss-20b and -120b (config.json): 32 or 128 experts of 2880, 4 per token, 64 query heads
    // and 8 kv heads of 64, even layers sliding over 128 positions, sinks, biases, YaRN (factor 32
    // over 4096, base 150000). 20.9B and 116.8B parameters, 3.6B and 5.1B active.
    for (const auto& [name, layers, experts] : {std::tuple{"gpt-oss-20b", 24, 32}, std::tuple{"gpt-oss-120b", 36, 128}}) {
      ModelConfig c = llama_preset(name, 2880, layers, 64, 8, 2880, 201088, 150000.0f, 131072);
      c.head_dim = 64;
      set_gpt_oss_fields(c);
      c.n_experts = experts;
      c.experts_per_token = 4;
      c.layer_window = 128;
      for (int l = 0; l < layers; l += 2) c.window_layers.push_back(l);
      c.rope_freq_factors = yarn_freq_divisors(64, 150000.0f, 32.0, 4096, 32, 1, false);
      c.rope_attention_factor = float(yarn_mscale(32.0));
      c.bos_id = 199998;
      c.eos_ids = {200002, 199999, 200012};  // <|return|>, <|endoftext|>, <|call|>
      c.pad_id = 199999;
      m[c.name] = c;
    }
    return m;
  }();
  return table;
}

}  // namespace

std::optional<ModelConfig> config_preset(const std::string& name) {
  auto it = presets().find(name);
  if (it == presets().end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> config_preset_names() {
  std::vector<std::string> names;
  for (const auto& [name, cfg] : presets()) names.push_back(name);
  return names;
}

std::vector<float> yarn_freq_divisors(int head_dim, float rope_theta, double factor, int original_positions,
                                      double beta_fast, double beta_slow, bool truncate) {
  auto correction_dim = [&](double rotations) {
    return head_dim * std::log(original_positions / (rotations * 2.0 * M_PI)) / (2.0 * std::log(double(rope_theta)));
  };
  double low = correction_dim(beta_fast), high = correction_dim(beta_slow);
  if (truncate) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0), high = std::min(high, double(head_dim - 1));
  if (low == high) high += 0.001;
  std::vector<float> divisors(size_t(head_dim / 2));
  for (int i = 0; i < head_dim / 2; ++i) {
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);  // 0: kept, 1: interpolated
    // inv = (1 - ramp) inv0 + ramp inv0 / factor, so inv0's divisor is:
    divisors[size_t(i)] = float(1.0 / ((1.0 - ramp) + ramp / factor));
  }
  return divisors;
}

double yarn_mscale(double factor, double m) { return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; }

float ModelConfig::attention_scale() const {
  return rope_attention_factor * rope_attention_factor / std::sqrt(query_scale > 0.0f ? query_scale : float(head_dim));
}

float ModelConfig::attention_scale(int layer) const {
  if (!local_rope_layer(layer)) return attention_scale();
  return 1.0f / std::sqrt(query_scale > 0.0f ? query_scale : float(head_dim));
}

namespace {

// 1 / base ** (2i / d) for i < d / 2, the same float32 expression as transformers.
std::vector<float> plain_inv_freq(float base, int d) {
  std::vector<float> inv(size_t(d / 2));
  for (int i = 0; i < d / 2; ++i) inv[size_t(i)] = 1.0f / std::pow(base, float(2 * i) / float(d));
  return inv;
}

}  // namespace

std::vector<float> rope_inv_freq(const ModelConfig& cfg) {
  const int d = cfg.head_dim;
  std::vector<float> inv = plain_inv_freq(cfg.rope_theta, cfg.rotary_dims());
  for (size_t i = 0; i < cfg.rope_freq_factors.size() && i < inv.size(); ++i) inv[i] /= cfg.rope_freq_factors[i];
  if (cfg.rope_scaling) {
    const RopeScaling& s = *cfg.rope_scaling;
    const float old_len = float(s.original_max_positions);
    const float low_wavelen = old_len / s.low_freq_factor, high_wavelen = old_len / s.high_freq_factor;
    for (float& f : inv) {
      const float wavelen = 2.0f * float(M_PI) / f;
      if (wavelen > low_wavelen) {
        f = f / s.factor;  // low frequencies: fully interpolated
      } else if (wavelen >= high_wavelen) {  // medium: blend between interpolated and original
        const float smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1.0f - smooth) * f / s.factor + smooth * f;
      }
    }
  }
  inv.resize(size_t(d / 2), 0.0f);  // partial rotary: the passing dims turn by angle 0
  if (cfg.local_rope_theta > 0.0f) {  // Gemma 3's sliding layers: their own base, unscaled
    const std::vector<float> local = plain_inv_freq(cfg.local_rope_theta, d);
    inv.insert(inv.end(), local.begin(), local.end());
  }
  if (!cfg.nope_layers.empty()) inv.insert(inv.end(), size_t(d / 2), 0.0f);  // the layers without RoPE
  return inv;
}

}  // namespace strata
