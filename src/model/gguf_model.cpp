// Models stored as GGUF: the LLaMA family (architectures llama, which Mistral and Mixtral files use
// too, qwen2, qwen3, qwen3moe, phi3 and smollm3), Gemma 2 and 3 (gemma2, gemma3) and GPT-OSS
// (gpt-oss, its experts in MXFP4): config from <arch>.*
// metadata and the rules llama.cpp applies where the file is silent, tensors under Hugging Face
// names (with llama.cpp's q/k RoPE row permutation undone where its converter applied it, and the
// 1 its converter adds to Gemma's norm weights taken off), and the tokenizer from tokenizer.ggml.*.
#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <charconv>
#include <cstring>
#include <unordered_map>

#include "strata/core/error.h"
#include "strata/core/thread_pool.h"
#include "strata/model/gguf.h"

namespace strata {

namespace {

// Checked narrowing of a metadata integer into a positive config field.
int positive_int(const GgufFile& f, std::string_view key, int64_t v) {
  if (v <= 0 || v > INT32_MAX) STRATA_FAIL("GGUF file " << f.path() << ": key '" << key << "' = " << v << " is out of range");
  return int(v);
}

int token_id_field(const GgufFile& f, std::string_view key, int vocab) {
  auto v = f.get_int_opt(key);
  if (!v) return -1;
  if (*v < 0 || *v >= vocab)
    STRATA_FAIL("GGUF file " << f.path() << ": key '" << key << "' = " << *v << " is outside the vocabulary (" << vocab << ")");
  return int(*v);
}

bool gemma_arch(const std::string& arch) { return arch == "gemma2" || arch == "gemma3"; }
// Architectures whose sliding-window layers are a fixed pattern among full ones: the file's
// sliding_window is those layers' window, not a limit on the context.
bool window_layers_arch(const std::string& arch) { return gemma_arch(arch) || arch == "gpt-oss" || arch == "olmo2"; }

// general.architecture, refused unless Strata's forward pass runs it: llama (LLaMA, Mistral,
// TinyLlama, SmolLM), qwen2 (LLaMA with q/k/v biases), qwen3 (LLaMA with per-head q/k norms),
// qwen3moe, phi3 (LLaMA with fused projections), smollm3 (LLaMA with every fourth layer without
// RoPE), gemma2 and gemma3 (Gemma's layer: config.cpp's read_gemma), gpt-oss (read_gpt_oss), glm4
// (GLM-4-0414: fused gate and up, interleaved partial RoPE, sandwich norms), granite (LLaMA with
// four multipliers: read_granite), olmo2 (OLMo 2: norms after each block only, q and k normed whole).
std::string supported_arch(const GgufFile& f) {
  std::string arch = f.get_string("general.architecture");
  if (arch != "llama" && arch != "qwen2" && arch != "qwen3" && arch != "qwen3moe" && arch != "phi3" &&
      arch != "smollm3" && !gemma_arch(arch) && arch != "gpt-oss" && arch != "glm4" && arch != "granite" &&
      arch != "olmo2")
    STRATA_FAIL("GGUF file " << f.path() << ": unsupported architecture '" << arch
                             << "' (supported: llama, qwen2, qwen3, qwen3moe, phi3, smollm3, gemma2, gemma3, gpt-oss, "
                                "glm4, granite, olmo2)");
  return arch;
}

// llama.cpp's converter writes Llama 3.1's RoPE scaling as this tensor of per-frequency divisors,
// and Phi-3's LongRoPE as two (the short factors serve contexts within the original length).
constexpr const char* kRopeFreqs = "rope_freqs.weight";
constexpr const char* kRopeFactorsShort = "rope_factors_short.weight";
constexpr const char* kRopeFactorsLong = "rope_factors_long.weight";

bool rope_tensor(const std::string& name) {
  return name == kRopeFreqs || name == kRopeFactorsShort || name == kRopeFactorsLong;
}

std::vector<float> rope_freq_factors(const GgufFile& f, const char* name, int rotary_dims) {
  const GgufTensorInfo* t = f.find_tensor(name);
  if (!t) return {};
  if (t->ne.size() != 1 || t->ne[0] != rotary_dims / 2)
    STRATA_FAIL("GGUF file " << f.path() << ": tensor '" << name << "' should hold rope.dimension_count / 2 = "
                             << rotary_dims / 2 << " factors");
  const GgmlTypeInfo* ti = ggml_type_info(uint32_t(t->type));
  if (!ti->dequantizable)
    STRATA_FAIL("GGUF file " << f.path() << ": tensor '" << name << "' has type " << ti->name);
  std::vector<float> factors(size_t(t->ne[0]));
  ggml_dequantize(t->type, t->data, factors.data(), t->ne[0]);
  return factors;
}

// LongRoPE (Phi-3.5 mini, Phi-3 128k) as config.json's (config.cpp's read_longrope): the short
// factors, the attention factor the converter stored (transformers' default when absent), and
// the context capped at the original length, past which llama.cpp and transformers switch to the
// long factors.
void read_longrope(const GgufFile& f, const std::string& arch, ModelConfig& c) {
  if (!c.rope_freq_factors.empty())
    STRATA_FAIL("GGUF file " << f.path() << ": both '" << kRopeFreqs << "' and '" << kRopeFactorsShort << "'");
  c.rope_freq_factors = rope_freq_factors(f, kRopeFactorsShort, c.rotary_dims());
  const std::string orig_key = arch + ".rope.scaling.original_context_length";
  const int64_t original = f.get_int_opt(orig_key).value_or(c.max_positions);
  if (original <= 0) STRATA_FAIL("GGUF file " << f.path() << ": " << orig_key << " " << original << " is not positive");
  const double factor = double(c.max_positions) / double(original);
  const double fallback = factor <= 1.0 ? 1.0 : std::sqrt(1.0 + std::log(factor) / std::log(double(original)));
  c.rope_attention_factor = float(f.get_float_opt(arch + ".rope.scaling.attn_factor").value_or(fallback));
  c.max_positions = int(std::min<int64_t>(c.max_positions, original));
}

// rope.scaling.type as llama.cpp's converter writes a config.json's rope_scaling: linear (factor)
// or yarn (factor, original_context_length, optional yarn_beta_fast / yarn_beta_slow), read as
// config.cpp reads the config.json, so the file runs as transformers runs its source directory.
// Fields the converter writes only for other models' YaRN variants are refused, not guessed.
void read_rope_scaling(const GgufFile& f, const std::string& arch, ModelConfig& c) {
  const std::string prefix = arch + ".rope.scaling.";
  const std::string type = f.get_string_opt(prefix + "type").value_or("none");
  if (type == "none") return;
  if (type != "linear" && type != "yarn")
    STRATA_FAIL("GGUF file " << f.path() << ": rope scaling type '" << type << "' is not supported (linear, yarn)");
  const double factor = f.get_float_opt(prefix + "factor").value_or(0.0);
  if (!(factor > 0.0 && std::isfinite(factor)))
    STRATA_FAIL("GGUF file " << f.path() << ": " << prefix << "factor must be a positive number for " << type);
  if (type == "linear") {
    c.rope_freq_factors.assign(size_t(c.rotary_dims() / 2), float(factor));
    return;
  }
  if (!c.rope_freq_factors.empty())
    STRATA_FAIL("GGUF file " << f.path() << ": both '" << kRopeFreqs << "' and YaRN scaling");
  for (const char* other : {"attn_factor", "yarn_log_multiplier", "yarn_ext_factor", "yarn_attn_factor"})
    if (f.has(prefix + other))
      STRATA_FAIL("GGUF file " << f.path() << ": YaRN with " << prefix << other << " is not supported");
  const int64_t original = f.get_int_opt(prefix + "original_context_length").value_or(c.max_positions);
  if (original <= 0)
    STRATA_FAIL("GGUF file " << f.path() << ": " << prefix << "original_context_length " << original
                             << " is not positive");
  // GPT-OSS's config.json keeps the ramp's ends unrounded (truncate false), which no key records;
  // transformers follows it, llama.cpp rounds them as for every model.
  c.rope_freq_factors = yarn_freq_divisors(c.rotary_dims(), c.rope_theta, factor, int(original),
                                           f.get_float_opt(prefix + "yarn_beta_fast").value_or(32.0),
                                           f.get_float_opt(prefix + "yarn_beta_slow").value_or(1.0),
                                           /*truncate=*/arch != "gpt-oss");
  c.rope_attention_factor = float(yarn_mscale(factor));
  if (c.sliding_window == 0)  // a window shorter than the context is the context, as in config.cpp
    c.max_positions = std::max(c.max_positions, int(std::min(factor * double(original), double(1 << 26))));
}

// llama.cpp's converter permutes q/k rows for its RoPE layout only for llama and SmolLM3 (whose
// converter is LLaMA's); Qwen2's rows are stored as in Hugging Face: ggml's NEOX RoPE reads them so.
bool permuted_qk(const std::string& arch) {  // not qwen*, phi3, gemma, glm4
  return arch == "llama" || arch == "smollm3" || arch == "granite";
}

// A mixture of experts' tensors: the router (ffn_gate_inp) and each layer's experts stacked in
// one 3-D tensor per projection, [experts, rows, cols] (ne fastest-first: cols, rows, experts), and
// GPT-OSS's expert biases in one 2-D tensor per projection, [experts, rows]. Mixtral's files are
// architecture llama, Qwen3-MoE's qwen3moe; the HF names differ (weight_specs; GPT-OSS's experts
// take Qwen3-MoE's, as gpt_oss_source shows its fused ones, and its router is mlp.router).
struct ExpertPart {
  const char* gguf;
  const char* mixtral;
  const char* qwen;
};
constexpr ExpertPart kExpertParts[] = {{"ffn_gate_exps", "w1", "gate_proj"},
                                       {"ffn_up_exps", "w3", "up_proj"},
                                       {"ffn_down_exps", "w2", "down_proj"}};

bool mixtral_names(const std::string& arch) { return arch != "qwen3moe" && arch != "gpt-oss"; }

std::string moe_prefix(int layer, const std::string& arch) {
  return "model.layers." + std::to_string(layer) + (mixtral_names(arch) ? ".block_sparse_moe." : ".mlp.");
}

// blk.<N>.<part>.<weight|bias> -> {N, part, suffix}; false when the name is not of that form.
bool split_block_name(const std::string& g, int& n, std::string& part, std::string& suffix) {
  if (g.rfind("blk.", 0) != 0) return false;
  size_t p1 = g.find('.', 4);
  if (p1 == std::string::npos || p1 == 4) return false;
  auto [end, ec] = std::from_chars(g.data() + 4, g.data() + p1, n);
  if (ec != std::errc() || end != g.data() + p1) return false;
  size_t p2 = g.rfind('.');
  if (p2 <= p1) return false;
  part = g.substr(p1 + 1, p2 - p1 - 1), suffix = g.substr(p2 + 1);
  return suffix == "weight" || suffix == "bias";
}

// Gemma's four norms a layer: llama.cpp calls the norm before the MLP ffn_norm, which is LLaMA's
// post_attention_layernorm, while Gemma's post_attention_layernorm follows the attention.
const std::unordered_map<std::string, std::string>& gemma_layer_norms() {
  static const std::unordered_map<std::string, std::string> norms = {
      {"attn_norm", "input_layernorm"},
      {"post_attention_norm", "post_attention_layernorm"},
      {"ffn_norm", "pre_feedforward_layernorm"},
      {"post_ffw_norm", "post_feedforward_layernorm"},
  };
  return norms;
}

// GLM-4's norms after the attention and the MLP (its post_attention_layernorm is LLaMA's, ffn_norm).
const std::unordered_map<std::string, std::string>& glm4_layer_norms() {
  static const std::unordered_map<std::string, std::string> norms = {
      {"post_attention_norm", "post_self_attn_layernorm"},
      {"post_ffw_norm", "post_mlp_layernorm"},
  };
  return norms;
}

// GGUF tensor name -> Hugging Face name ("" when unknown). Phi-3's and GLM-4's fused tensors keep
// their fused HF names (split_fused_projections cuts them): attn_qkv, and ffn_up holding gate and up.
std::string hf_name(const std::string& g, const std::string& arch) {
  static const std::unordered_map<std::string, std::string> top = {
      {"token_embd.weight", "model.embed_tokens.weight"},
      {"output_norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"},
  };
  if (auto it = top.find(g); it != top.end()) return it->second;
  static const std::unordered_map<std::string, std::string> layer = {
      {"attn_norm", "input_layernorm"},  {"ffn_norm", "post_attention_layernorm"},
      {"attn_q", "self_attn.q_proj"},    {"attn_k", "self_attn.k_proj"},
      {"attn_v", "self_attn.v_proj"},    {"attn_output", "self_attn.o_proj"},
      {"ffn_gate", "mlp.gate_proj"},     {"ffn_up", "mlp.up_proj"},
      {"ffn_down", "mlp.down_proj"},     {"attn_qkv", "self_attn.qkv_proj"},
      {"attn_q_norm", "self_attn.q_norm"}, {"attn_k_norm", "self_attn.k_norm"},
  };
  int n = 0;
  std::string part, suffix;
  if (!split_block_name(g, n, part, suffix)) return "";
  const bool gpt_oss = arch == "gpt-oss";
  if (part == "ffn_gate_inp" && (suffix == "weight" || gpt_oss))
    return moe_prefix(n, arch) + (gpt_oss ? "router." : "gate.") + suffix;
  // GPT-OSS: a sink logit per query head (the converter names it attn_sinks.weight), and the
  // norm before the MLP under its Gemma-like name.
  if (gpt_oss && part == "attn_sinks" && suffix == "weight") return "model.layers." + std::to_string(n) + ".self_attn.sinks";
  if (gpt_oss && part == "post_attention_norm") return "model.layers." + std::to_string(n) + ".post_attention_layernorm." + suffix;
  const bool gemma_norms = gemma_arch(arch) || arch == "olmo2";  // OLMo 2's two norms: Gemma's names
  const auto& names = gemma_norms && gemma_layer_norms().count(part)        ? gemma_layer_norms()
                      : arch == "glm4" && glm4_layer_norms().count(part) ? glm4_layer_norms()
                                                                          : layer;
  auto it = names.find(part);
  if (it == names.end()) return "";
  const bool fused_up = (arch == "phi3" || arch == "glm4") && part == "ffn_up";
  const std::string hf_part = fused_up ? "mlp.gate_up_proj" : it->second;
  return "model.layers." + std::to_string(n) + "." + hf_part + "." + suffix;
}

class GgufSource final : public WeightSource {
public:
  GgufSource(const GgufFile& file, std::shared_ptr<GgufFile> owned) : file_(file), owned_(std::move(owned)) {
    const std::string arch = supported_arch(file_);
    const std::string heads_key = arch + ".attention.head_count", kv_key = arch + ".attention.head_count_kv";
    n_heads_ = positive_int(file_, heads_key, file_.get_int(heads_key));
    n_kv_heads_ = file_.has(kv_key) ? positive_int(file_, kv_key, file_.get_int(kv_key)) : n_heads_;
    const bool permuted = permuted_qk(arch);
    for (const GgufTensorInfo& t : file_.tensors()) {
      if (rope_tensor(t.name)) continue;  // part of the config (config_from_gguf), not a weight
      if (add_experts(t, arch)) continue;
      std::string h = hf_name(t.name, arch);
      // Biases the forward pass has no place for (an MLP's, a norm's) would be dropped silently.
      const bool unused_bias = h.ends_with(".bias") && !h.ends_with("q_proj.bias") && !h.ends_with("k_proj.bias") &&
                               !h.ends_with("v_proj.bias") && !h.ends_with("o_proj.bias") &&
                               !h.ends_with("router.bias");  // hf_name gives it for gpt-oss only
      if (h.empty() || unused_bias)
        STRATA_FAIL("GGUF file " << file_.path() << ": unexpected tensor '" << t.name << "' for a " << arch << " model");
      Entry e{&t, 0};
      if (permuted && (h.ends_with("q_proj.weight") || h.ends_with("q_proj.bias"))) e.permute_heads = n_heads_;
      if (permuted && (h.ends_with("k_proj.weight") || h.ends_with("k_proj.bias"))) e.permute_heads = n_kv_heads_;
      // llama.cpp's converter stores Gemma's (1 + w) norm weights with the 1 added; the forward pass
      // adds it itself in fp32 (norm_plus_one), so the file's values read back as w.
      if (gemma_arch(arch) && h.ends_with("norm.weight")) e.shift = -1.0f;
      map_.emplace(h, e);
      names_.push_back(std::move(h));
    }
  }

  std::string describe() const override { return file_.path(); }
  bool contains(const std::string& name) const override { return map_.count(name) != 0; }

  // The layers' matrices are what a policy compresses: their widest affine codes decide.
  std::optional<quant::QuantSpec> codes_spec() const override {
    int bits = 0;
    for (const auto& [name, e] : map_)
      if (name.find(".layers.") != std::string::npos && name.ends_with(".weight"))
        bits = std::max(bits, ggml_affine_code_bits(e.info->type));
    if (bits == 0) return std::nullopt;
    return quant::QuantSpec{bits <= 4 ? 4 : 8, 32};
  }

  // A 3-D expert tensor shows as one HF matrix per expert, rows [e rows, (e + 1) rows) of it; a
  // 2-D expert bias (GPT-OSS) as one vector per expert, its row e.
  bool add_experts(const GgufTensorInfo& t, const std::string& arch) {
    int layer = 0;
    std::string part, suffix;
    if (!split_block_name(t.name, layer, part, suffix)) return false;
    const ExpertPart* found = nullptr;
    for (const ExpertPart& p : kExpertParts)
      if (part == p.gguf) found = &p;
    if (!found) return false;
    const bool bias = suffix == "bias";
    if (bias && arch != "gpt-oss")
      STRATA_FAIL("GGUF file " << file_.path() << ": unexpected tensor '" << t.name << "' for a " << arch << " model");
    if (t.ne.size() != (bias ? 2u : 3u) || t.ne.back() <= 0)
      STRATA_FAIL("GGUF file " << file_.path() << ": expert tensor '" << t.name << "' is not "
                               << (bias ? "2-D [experts, rows]" : "3-D [experts, rows, cols]"));
    const int64_t rows = bias ? 1 : t.ne[1];
    for (int64_t e = 0; e < t.ne.back(); ++e) {
      std::string h = moe_prefix(layer, arch) + "experts." + std::to_string(e) + "." +
                      (mixtral_names(arch) ? found->mixtral : found->qwen) + "." + suffix;
      map_.emplace(h, Entry{&t, 0, e * rows, rows, 0.0f, bias});
      names_.push_back(std::move(h));
    }
    return true;
  }
  std::vector<std::string> names() const override { return names_; }

  std::vector<int64_t> shape(const std::string& name) const override {
    const Entry& e = get(name);
    const GgufTensorInfo& t = *e.info;
    if (e.slice_vector) return {t.ne[0]};
    if (e.slice_rows) return {e.slice_rows, t.ne[0]};
    return std::vector<int64_t>(t.ne.rbegin(), t.ne.rend());  // ggml ne is fastest-first
  }

private:
  void read_into(const std::string& name, DType dst_dtype, void* dst, ThreadPool* pool) const override {
    const Entry& e = get(name);
    const GgufTensorInfo& t = *e.info;
    STRATA_CHECK(dst_dtype == DType::F32 || dst_dtype == DType::F16 || dst_dtype == DType::BF16,
                 "GGUF tensor " << name << ": unsupported destination dtype " << dtype_name(dst_dtype));
    const GgmlTypeInfo* ti = ggml_type_info(uint32_t(t.type));
    if (!ti->dequantizable)
      STRATA_FAIL("GGUF file " << file_.path() << ": tensor '" << t.name << "' has type " << ti->name
                               << ", which Strata cannot dequantize");
    const RowMap rows = row_map(e);
    const size_t esz = dtype_size(dst_dtype);
    auto* out = static_cast<uint8_t*>(dst);
    if (rows.vec) {
      std::vector<float> buf(static_cast<size_t>(rows.row_len));
      ggml_dequantize(t.type, t.data, buf.data(), rows.row_len);
      if (e.shift != 0.0f)
        for (float& v : buf) v += e.shift;
      if (rows.head_dim) {
        std::vector<float> tmp(buf.size());
        for (int64_t r = 0; r < rows.row_len; ++r) tmp[size_t(r)] = buf[size_t(rows.stored(r))];
        buf.swap(tmp);
      }
      convert_elements(buf.data(), DType::F32, out, dst_dtype, size_t(rows.row_len));
      return;
    }
    // Rows are independent blocks of the file: dequantized on the pool's threads where there is one.
    parallel_for(pool, rows.n_rows, [&](int64_t r0, int64_t r1) {
      std::vector<float> buf(static_cast<size_t>(rows.row_len));
      for (int64_t r = r0; r < r1; ++r) {
        ggml_dequantize(t.type, rows.row(t, r), buf.data(), rows.row_len);
        if (e.shift != 0.0f)
          for (float& v : buf) v += e.shift;
        convert_elements(buf.data(), DType::F32, out + size_t(r) * size_t(rows.row_len) * esz, dst_dtype,
                         size_t(rows.row_len));
      }
    });
  }

  bool read_codes_into(const std::string& name, const quant::QuantSpec& spec, void* dst,
                       ThreadPool* pool) const override {
    const Entry& e = get(name);
    const GgufTensorInfo& t = *e.info;
    const int code_bits = ggml_affine_code_bits(t.type);
    // ggml's groups are 32 elements; a larger group would join two scales.
    if (code_bits == 0 || e.shift != 0.0f || e.slice_vector || code_bits > spec.bits || spec.group_size != 32 || (t.ne.size() != 2 && !e.slice_rows))
      return false;
    const RowMap rows = row_map(e);
    const size_t out_row = quant::row_bytes(spec, rows.row_len);
    std::atomic<bool> packed{true};
    parallel_for(pool, rows.n_rows, [&](int64_t r0, int64_t r1) {
      std::vector<uint8_t> codes(static_cast<size_t>(rows.row_len));
      std::vector<float> scales(static_cast<size_t>(rows.row_len / 32)), mins(scales.size());
      for (int64_t r = r0; r < r1 && packed.load(std::memory_order_relaxed); ++r) {
        ggml_affine_decode(t.type, rows.row(t, r), rows.row_len, codes.data(), scales.data(), mins.data());
        if (!quant::pack_row(spec, rows.row_len, codes.data(), scales.data(), mins.data(),
                             static_cast<uint8_t*>(dst) + size_t(r) * out_row))
          packed = false;
      }
    });
    return packed;
  }

  struct Entry {
    const GgufTensorInfo* info;
    int permute_heads;  // 0: stored as in HF
    int64_t first_row = 0, slice_rows = 0;  // an expert's rows of a 3-D tensor (slice_rows > 0)
    float shift = 0.0f;                     // added to every value read (Gemma's norms: -1)
    bool slice_vector = false;              // the one row sliced is a vector (an expert's bias)
  };
  // Where HF row r of a tensor is stored. llama.cpp's converter stores HF row (h, j, i) -- head h,
  // half j, index i < head_dim/2 -- of a permuted q/k at row (h, i, j).
  struct RowMap {
    int64_t row_len = 0, n_rows = 0, first_row = 0;
    uint64_t row_bytes = 0;
    bool vec = false;      // a 1-D tensor (bias): one ggml row, permuted as n rows of 1 element
    int64_t head_dim = 0;  // 0: rows stored as in HF
    int64_t stored(int64_t r) const {
      if (!head_dim) return r;
      const int64_t h = r / head_dim, w = r % head_dim, half = head_dim / 2;
      return h * head_dim + (w % half) * 2 + w / half;
    }
    const uint8_t* row(const GgufTensorInfo& t, int64_t r) const {
      return t.data + uint64_t(first_row + stored(r)) * row_bytes;
    }
  };
  RowMap row_map(const Entry& e) const {
    const GgufTensorInfo& t = *e.info;
    const GgmlTypeInfo* ti = ggml_type_info(uint32_t(t.type));
    RowMap m;
    m.row_len = t.ne.empty() ? 1 : t.ne[0];
    m.n_rows = m.row_len == 0 ? 0 : t.numel / m.row_len;
    m.row_bytes = uint64_t(m.row_len / ti->block_size) * uint64_t(ti->type_size);
    m.vec = t.ne.size() <= 1;
    if (e.slice_rows) m.first_row = e.first_row, m.n_rows = e.slice_rows;
    const int64_t perm_rows = m.vec ? m.row_len : m.n_rows;
    if (e.permute_heads) {
      if (perm_rows % e.permute_heads != 0 || (perm_rows / e.permute_heads) % 2 != 0)
        STRATA_FAIL("GGUF file " << file_.path() << ": tensor '" << t.name << "': " << perm_rows
                                 << " rows do not split into " << e.permute_heads << " heads of even size");
      m.head_dim = perm_rows / e.permute_heads;
    }
    return m;
  }

  const Entry& get(const std::string& name) const {
    auto it = map_.find(name);
    if (it == map_.end()) STRATA_FAIL("GGUF file " << file_.path() << ": no tensor for '" << name << "'");
    return it->second;
  }

  const GgufFile& file_;
  std::shared_ptr<GgufFile> owned_;
  int n_heads_ = 0, n_kv_heads_ = 0;
  std::unordered_map<std::string, Entry> map_;
  std::vector<std::string> names_;
};

}  // namespace

namespace {

// <arch>.expert_count and expert_used_count; Qwen3-MoE's experts have their own width
// (expert_feed_forward_length). A layer without a router (ffn_gate_inp) is dense. The top-k
// weights are renormalised as llama.cpp does for these architectures unless
// <arch>.expert_weights_norm says false (transformers' Qwen3-MoE norm_topk_prob).
void read_experts(const GgufFile& f, const std::string& arch, ModelConfig& c) {
  const std::string count_key = arch + ".expert_count", used_key = arch + ".expert_used_count";
  if (!f.has(count_key)) {
    if (arch == "qwen3moe" || arch == "gpt-oss") STRATA_FAIL("GGUF file " << f.path() << ": " << arch << " without " << count_key);
    return;
  }
  c.n_experts = positive_int(f, count_key, f.get_int(count_key));
  if (!f.has(used_key)) STRATA_FAIL("GGUF file " << f.path() << ": " << count_key << " without " << used_key);
  c.experts_per_token = positive_int(f, used_key, f.get_int(used_key));
  if (c.experts_per_token > c.n_experts)
    STRATA_FAIL("GGUF file " << f.path() << ": " << used_key << " " << c.experts_per_token << " is above "
                             << count_key << " " << c.n_experts);
  const std::string width_key = arch + ".expert_feed_forward_length";
  c.expert_intermediate = f.has(width_key) ? positive_int(f, width_key, f.get_int(width_key)) : c.intermediate;
  const std::string norm_key = arch + ".expert_weights_norm";
  c.norm_topk_prob = f.has(norm_key) ? f.get_bool(norm_key) : true;
  c.moe_naming = arch == "qwen3moe" ? MoeNaming::Qwen3Moe : MoeNaming::Mixtral;
  for (int l = 0; l < c.n_layers; ++l)
    if (!f.find_tensor("blk." + std::to_string(l) + ".ffn_gate_inp.weight")) c.dense_layers.push_back(l);
  if (int(c.dense_layers.size()) == c.n_layers)
    STRATA_FAIL("GGUF file " << f.path() << ": " << count_key << " is set but no layer has a router (ffn_gate_inp)");
}

// Gemma 2 and 3 as llama.cpp runs their files, onto config.json's fields (config.cpp's read_gemma):
// GeGLU, (1 + w) norms before and after the attention and the MLP, embeddings times sqrt(hidden),
// sliding-window layers among full ones, Gemma 3's q/k norms (found by their tensors) and its
// sliding layers rotating with base 10000, unscaled. Where the file is silent, llama.cpp's rules:
// - the layers' pattern is fixed (Gemma 2's even layers slide, Gemma 3's first five in six); the
//   file names only the window (Gemma 2's default 4096);
// - query_pre_attn_scalar is not stored: hidden / heads for the 27B models (46 layers for Gemma 2,
//   62 for Gemma 3; their config.json's 144 and 168), head_dim otherwise, as Google's configs say;
// - Gemma 2 soft-caps scores and logits, at 50 and 30 where the keys are absent (transformers'
//   defaults too); Gemma 3 caps the logits only where its file names a cap.
// Gemma was trained in bf16, which `--dtype auto` keeps on cards that have it: its activations
// outgrow fp16's range.
void read_gemma(const GgufFile& f, const std::string& arch, ModelConfig& c) {
  const bool gemma2 = arch == "gemma2";
  auto key = [&arch](const char* name) { return arch + "." + name; };
  c.mlp = MlpKind::GeGLU;
  c.norm_plus_one = true;
  c.sandwich_norms = true;
  c.embed_scale = std::sqrt(float(c.hidden));
  const bool is_27b = c.n_layers == (gemma2 ? 46 : 62);
  c.query_scale = is_27b ? float(c.hidden / c.n_heads) : float(c.head_dim);
  const std::optional<int64_t> window = f.get_int_opt(key("attention.sliding_window"));
  if (!window && !gemma2) STRATA_FAIL("GGUF file " << f.path() << ": gemma3 without " << key("attention.sliding_window"));
  c.layer_window = positive_int(f, key("attention.sliding_window"), window.value_or(4096));
  for (int l = 0; l < c.n_layers; ++l)
    if (gemma2 ? l % 2 == 0 : l % 6 < 5) c.window_layers.push_back(l);
  if (!gemma2) c.local_rope_theta = 10000.0f;
  auto softcap = [&](const char* name, double fallback) {
    const double cap = f.get_float_opt(key(name)).value_or(fallback);
    if (!(cap >= 0.0 && cap <= double(FLT_MAX)))
      STRATA_FAIL("GGUF file " << f.path() << ": " << key(name) << " " << cap << " must be a positive number");
    return float(cap);
  };
  c.attn_softcap = gemma2 ? softcap("attn_logit_softcapping", 50.0) : 0.0f;
  c.final_softcap = softcap("final_logit_softcapping", gemma2 ? 30.0 : 0.0);
  c.checkpoint_dtype = DType::BF16;
}

// Granite as config.cpp's read_granite reads its config.json, from the keys llama.cpp's converter
// writes for the four multipliers: logit_scale is required (as llama.cpp requires it), the others
// 1 when absent (attention.scale: 1 / sqrt(head_dim), llama.cpp's reading of 0 or absent).
void read_granite(const GgufFile& f, ModelConfig& c) {
  auto positive = [&](const std::string& key, std::optional<double> fallback) {
    const std::optional<double> v = f.get_float_opt("granite." + key);
    if (!v && !fallback) STRATA_FAIL("GGUF file " << f.path() << ": granite without granite." << key);
    const double value = v.value_or(*fallback);
    if (!(value > 0.0 && std::isfinite(value)))
      STRATA_FAIL("GGUF file " << f.path() << ": granite." << key << " " << value << " is not positive");
    return float(value);
  };
  const float embedding = positive("embedding_scale", 1.0);
  if (embedding != 1.0f) c.embed_scale = embedding;
  if (auto attention = f.get_float_opt("granite.attention.scale"); attention && *attention != 0.0) {
    const float a = positive("attention.scale", std::nullopt);
    c.query_scale = 1.0f / (a * a);
  }
  c.residual_multiplier = positive("residual_scale", 1.0);
  c.logit_scale = 1.0f / positive("logit_scale", std::nullopt);
}

// GPT-OSS as llama.cpp runs its files: what the file does not store is GptOssConfig's default
// (set_gpt_oss_fields: the clamped SwiGLU at limit 7 and gain 1.702, top-k-then-softmax routing,
// sinks, biases on the router and the experts); the even layers slide over
// attention.sliding_window (required, as llama.cpp requires it); q/k/v/o biases as the tensors
// say. The Hub's weights are bf16, which `--dtype auto` keeps on cards that have it.
void read_gpt_oss(const GgufFile& f, ModelConfig& c) {
  const float norm_eps = c.norm_eps;
  const int expert_width = c.expert_intermediate;
  const bool qkv_bias = c.qkv_bias, o_bias = c.o_bias;
  set_gpt_oss_fields(c);
  c.norm_eps = norm_eps, c.expert_intermediate = expert_width, c.qkv_bias = qkv_bias, c.o_bias = o_bias;
  const std::string window_key = "gpt-oss.attention.sliding_window";
  const std::optional<int64_t> window = f.get_int_opt(window_key);
  if (!window) STRATA_FAIL("GGUF file " << f.path() << ": gpt-oss without " << window_key);
  c.layer_window = positive_int(f, window_key, *window);
  for (int l = 0; l < c.n_layers; l += 2) c.window_layers.push_back(l);
  c.checkpoint_dtype = DType::BF16;
}

// OLMo 2: no norm before its blocks, one after each (post_attention_norm, post_ffw_norm), and q and
// k normed over all their heads at once, as the q norm's width (q_dim, not head_dim) says. OLMo 3
// is the same architecture with a sliding window: its sliding layers (sliding_window_pattern, else
// three in four, as llama.cpp's default) rotate with rope.freq_base_swa (else freq_base),
// unscaled, as config.cpp's read_olmo3_windows reads a directory.
void read_olmo2(const GgufFile& f, ModelConfig& c) {
  const GgufTensorInfo* q_norm = f.find_tensor("blk.0.attn_q_norm.weight");
  if (!q_norm || q_norm->ne.empty() || q_norm->ne[0] != c.q_dim())
    STRATA_FAIL("GGUF file " << f.path() << ": olmo2 needs blk.0.attn_q_norm.weight of " << c.q_dim()
                             << " values (head_count x key_length)");
  set_olmo2_fields(c);
  const std::optional<int64_t> window = f.get_int_opt("olmo2.attention.sliding_window");
  if (!window || *window <= 0) return;  // OLMo 2: every layer full
  c.layer_window = positive_int(f, "olmo2.attention.sliding_window", *window);
  const std::string pattern_key = "olmo2.attention.sliding_window_pattern";
  if (f.has(pattern_key)) {
    const std::vector<int64_t> pattern = f.get_int_array(pattern_key);
    if (pattern.size() != size_t(c.n_layers))
      STRATA_FAIL("GGUF file " << f.path() << ": " << pattern_key << " has " << pattern.size() << " values for "
                               << c.n_layers << " layers");
    for (int l = 0; l < c.n_layers; ++l)
      if (pattern[size_t(l)] != 0) c.window_layers.push_back(l);
  } else {
    for (int l = 0; l < c.n_layers; ++l)
      if ((l + 1) % 4 != 0) c.window_layers.push_back(l);
  }
  const double local = f.get_float_opt("olmo2.rope.freq_base_swa").value_or(c.rope_theta);
  if (!(local > 0.0 && local < 1e30))
    STRATA_FAIL("GGUF file " << f.path() << ": olmo2.rope.freq_base_swa " << local << " is not positive");
  c.local_rope_theta = float(local);
}

}  // namespace

RecommendedSampling recommended_sampling_from_gguf(const GgufFile& f) {
  RecommendedSampling r;
  r.source = f.path();
  auto number = [&](const char* name, auto in_range, const char* range) -> std::optional<float> {
    const std::string key = std::string("general.sampling.") + name;
    const std::optional<double> v = f.get_float_opt(key);
    if (!v) return std::nullopt;
    if (!(std::fabs(*v) <= double(FLT_MAX)) || !in_range(float(*v)))
      STRATA_FAIL("GGUF file " << f.path() << ": " << key << " " << *v << " must be " << range);
    return float(*v);
  };
  r.temperature = number("temp", [](float v) { return v >= 0; }, ">= 0");
  r.top_p = number("top_p", [](float v) { return v > 0 && v <= 1; }, "in (0, 1]");
  r.min_p = number("min_p", [](float v) { return v >= 0 && v <= 1; }, "in [0, 1]");
  r.repetition_penalty = number("penalty_repeat", [](float v) { return v > 0; }, "> 0");
  if (const std::optional<int64_t> k = f.get_int_opt("general.sampling.top_k")) {
    if (*k > INT32_MAX)
      STRATA_FAIL("GGUF file " << f.path() << ": general.sampling.top_k " << *k << " does not fit in 32 bits");
    r.top_k = int(std::max<int64_t>(*k, 0));  // llama.cpp: <= 0 is off
  }
  return r;
}

ModelConfig config_from_gguf(const GgufFile& f) {
  const std::string arch = supported_arch(f);
  auto key = [&arch](const char* name) { return arch + "." + name; };
  auto get_positive = [&](const char* name) { return positive_int(f, key(name), f.get_int(key(name))); };
  ModelConfig c;
  c.name = f.path();
  c.arch = Arch::Llama;
  c.norm = NormKind::RMSNorm;
  c.pos = PosKind::Rope;
  c.mlp = MlpKind::SwiGLU;
  c.n_layers = get_positive("block_count");
  // ModelConfig::validate's bound, here already: the per-layer lists below are as long.
  if (c.n_layers > (1 << 14)) STRATA_FAIL("GGUF file " << f.path() << ": " << key("block_count") << " " << c.n_layers << " is above 16384");
  c.hidden = get_positive("embedding_length");
  c.intermediate = get_positive("feed_forward_length");
  c.n_heads = get_positive("attention.head_count");
  c.n_kv_heads = f.has(key("attention.head_count_kv")) ? get_positive("attention.head_count_kv") : c.n_heads;
  if (c.n_heads % c.n_kv_heads != 0)
    STRATA_FAIL("GGUF file " << f.path() << ": head_count " << c.n_heads << " is not a multiple of head_count_kv " << c.n_kv_heads);
  if (auto kl = f.get_int_opt(key("attention.key_length")))
    c.head_dim = positive_int(f, key("attention.key_length"), *kl);
  else if (c.hidden % c.n_heads == 0)
    c.head_dim = c.hidden / c.n_heads;
  else
    STRATA_FAIL("GGUF file " << f.path() << ": embedding_length " << c.hidden << " is not a multiple of head_count " << c.n_heads);
  // validate()'s bound, here already: RoPE scaling's tables are head_dim / 2 long when read.
  if (c.head_dim > (1 << 16))
    STRATA_FAIL("GGUF file " << f.path() << ": head_dim " << c.head_dim << " is above the limit of " << (1 << 16));
  if (auto vl = f.get_int_opt(key("attention.value_length")); vl && *vl != c.head_dim)
    STRATA_FAIL("GGUF file " << f.path() << ": attention.value_length " << *vl << " differs from key_length " << c.head_dim);
  // Partial rotary as config.json's (read_partial_rotary): Phi-4-mini's 96 of 128 (NeoX pairs over
  // those dims in llama.cpp as in transformers), GLM-4's 64 of 128 (interleaved pairs: llama.cpp's
  // rope type "norm" for glm4, as transformers' GLM rotates).
  c.rope_interleaved = arch == "glm4";
  if (auto rd = f.get_int_opt(key("rope.dimension_count")); rd && *rd != c.head_dim) {
    if ((arch != "phi3" && arch != "glm4") || *rd <= 0 || *rd > c.head_dim || *rd % 2 != 0)
      STRATA_FAIL("GGUF file " << f.path() << ": rope.dimension_count " << *rd << " with head_dim " << c.head_dim
                               << " is not supported (partial rotary: phi3 or glm4, an even count below head_dim)");
    c.rotary_dim = int(*rd);
  }
  c.rope_theta = float(f.get_float_opt(key("rope.freq_base")).value_or(10000.0));
  c.norm_eps = float(f.get_float_opt(key("attention.layer_norm_rms_epsilon")).value_or(1e-5));
  if (!(c.rope_theta > 0) || !(c.norm_eps > 0))
    STRATA_FAIL("GGUF file " << f.path() << ": rope.freq_base and layer_norm_rms_epsilon must be positive");
  c.rope_freq_factors = rope_freq_factors(f, kRopeFreqs, c.rotary_dims());
  c.max_positions = get_positive("context_length");
  // As for config.json: within the window sliding and full attention agree (Phi-3 mini: 2047).
  // Gemma's and GPT-OSS's window is their sliding layers' (read_gemma, read_gpt_oss).
  if (auto window = f.get_int_opt(key("attention.sliding_window"));
      !window_layers_arch(arch) && window && *window > 0 && *window < c.max_positions)
    c.max_positions = c.sliding_window = int(*window);
  if (f.find_tensor(kRopeFactorsShort)) read_longrope(f, arch, c);
  else read_rope_scaling(f, arch, c);

  if (auto vs = f.get_int_opt(key("vocab_size")))
    c.vocab_size = positive_int(f, key("vocab_size"), *vs);
  else if (const GgufValue* toks = f.find("tokenizer.ggml.tokens"); toks && toks->type == GgufType::Array)
    c.vocab_size = positive_int(f, "tokenizer.ggml.tokens", int64_t(toks->count));
  else if (const GgufTensorInfo* emb = f.find_tensor("token_embd.weight"); emb && emb->ne.size() == 2)
    c.vocab_size = positive_int(f, "token_embd.weight", emb->ne[1]);
  else
    STRATA_FAIL("GGUF file " << f.path() << ": cannot tell the vocabulary size (no " << key("vocab_size") << ", tokens or token_embd)");
  // Qwen2 has q/k/v biases; a llama file could too.
  c.qkv_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;
  c.o_bias = f.find_tensor("blk.0.attn_output.bias") != nullptr;
  c.qk_norm = f.find_tensor("blk.0.attn_q_norm.weight") != nullptr;  // Qwen3
  if (arch == "glm4") {
    c.sandwich_norms = true;
    c.sandwich_naming = SandwichNaming::Glm4;
  }
  if (arch == "olmo2") read_olmo2(f, c);

  read_experts(f, arch, c);
  if (gemma_arch(arch)) read_gemma(f, arch, c);
  if (arch == "gpt-oss") read_gpt_oss(f, c);
  if (arch == "granite") read_granite(f, c);
  // SmolLM3's layers without RoPE: no key says which, llama.cpp fixes every fourth (as its
  // config.json's no_rope_layer_interval).
  if (arch == "smollm3")
    for (int l = 0; l < c.n_layers; ++l)
      if ((l + 1) % 4 == 0) c.nope_layers.push_back(l);

  c.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  c.bos_id = token_id_field(f, "tokenizer.ggml.bos_token_id", c.vocab_size);
  c.pad_id = token_id_field(f, "tokenizer.ggml.padding_token_id", c.vocab_size);
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"}) {
    int id = token_id_field(f, key, c.vocab_size);
    if (id >= 0 && std::find(c.eos_ids.begin(), c.eos_ids.end(), id) == c.eos_ids.end()) c.eos_ids.push_back(id);
  }
  return c;
}

std::unique_ptr<WeightSource> make_gguf_source(const GgufFile& file) {
  return std::make_unique<GgufSource>(file, nullptr);
}

std::unique_ptr<WeightSource> make_gguf_source(const std::filesystem::path& path) {
  auto owned = std::make_shared<GgufFile>(GgufFile::open(path));
  const GgufFile& ref = *owned;
  return std::make_unique<GgufSource>(ref, std::move(owned));
}

namespace {

// llama.cpp marks every special token (control, user-defined, unknown) of a file whose
// general.name holds "phi3" or "phi-3" as swallowing the whitespace after it, "</s>" too, and
// then <unk>, <s> and <|endoftext|> as not: Phi-3's tokenizer.json has its added tokens rstrip.
std::vector<int> phi3_rstrip_ids(const GgufFile& f, const std::vector<std::string>& tokens,
                                 const std::vector<int64_t>& types) {
  std::string name = f.get_string_opt("general.name").value_or("");
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  if (name.find("phi3") == std::string::npos && name.find("phi-3") == std::string::npos) return {};
  std::vector<int> ids;
  for (size_t id = 0; id < tokens.size() && id < types.size(); ++id) {
    const bool special = types[id] == 2 || types[id] == 3 || types[id] == 4;
    const std::string& t = tokens[id];
    if ((special || t == "</s>") && t != "<unk>" && t != "<s>" && t != "<|endoftext|>") ids.push_back(int(id));
  }
  return ids;
}

std::vector<int64_t> token_types(const GgufFile& f, size_t n_tokens) {
  if (!f.has("tokenizer.ggml.token_type")) return {};
  std::vector<int64_t> types = f.get_int_array("tokenizer.ggml.token_type");
  if (types.size() != n_tokens)
    STRATA_FAIL("GGUF file " << f.path() << ": tokenizer.ggml.token_type has " << types.size() << " entries but there are "
                             << n_tokens << " tokens");
  return types;
}

// llama.cpp's SentencePiece vocabulary: tokens, scores and types; merges, if any, are unused.
Tokenizer sentencepiece_from_gguf(const GgufFile& f) {
  SentencePieceVocab v;
  v.tokens = f.get_string_array("tokenizer.ggml.tokens");
  v.rstrip_ids = phi3_rstrip_ids(f, v.tokens, token_types(f, v.tokens.size()));
  if (f.has("tokenizer.ggml.scores"))
    for (double score : f.get_float_array("tokenizer.ggml.scores")) v.scores.push_back(float(score));
  if (f.has("tokenizer.ggml.token_type"))
    for (int64_t type : f.get_int_array("tokenizer.ggml.token_type")) v.types.push_back(int(type));
  v.add_space_prefix = !f.has("tokenizer.ggml.add_space_prefix") || f.get_bool("tokenizer.ggml.add_space_prefix");
  return Tokenizer::from_sentencepiece(std::move(v), "GGUF file " + f.path() + ": tokenizer.ggml.*");
}

}  // namespace

std::optional<PreTokenizer> gguf_pre_tokenizer(std::string_view name) {
  // llama.cpp's names (llama-vocab.cpp); "gpt2" is an older spelling of "gpt-2".
  if (name == "gpt-2" || name == "gpt2") return PreTokenizer::GPT2;
  if (name == "llama-bpe" || name == "llama3" || name == "llama-v3") return PreTokenizer::Llama3;
  if (name == "qwen2") return PreTokenizer::Qwen2;
  if (name == "smollm") return PreTokenizer::SmolLM;
  if (name == "gpt-4o") return PreTokenizer::Gpt4o;  // GPT-OSS
  if (name == "glm4" || name == "chatglm-bpe") return PreTokenizer::Llama3;  // GLM-4: LLaMA 3's regex
  if (name == "dbrx") return PreTokenizer::Llama3;  // cl100k's regex, LLaMA 3's (OLMo 2's dolma2 tokenizer)
  return std::nullopt;
}

bool gguf_ignores_merges(std::string_view name) {
  return name == "llama-bpe" || name == "llama3" || name == "llama-v3" || name == "glm4";
}

Tokenizer tokenizer_from_gguf(const GgufFile& f) {
  std::string model = f.get_string("tokenizer.ggml.model");
  if (model == "llama") return sentencepiece_from_gguf(f);
  if (model != "gpt2")
    STRATA_FAIL("GGUF file " << f.path() << ": tokenizer model '" << model
                             << "' is not supported (byte-level BPE 'gpt2', SentencePiece 'llama')");
  const std::string pre_name = f.get_string_opt("tokenizer.ggml.pre").value_or("default");
  const std::optional<PreTokenizer> pre = gguf_pre_tokenizer(pre_name);
  if (!pre)
    STRATA_FAIL("GGUF file " << f.path() << ": tokenizer pre-tokenizer '" << pre_name
                             << "' is not supported (gpt-2, llama-bpe, qwen2, smollm, gpt-4o, glm4, dbrx)");
  std::vector<std::string> tokens = f.get_string_array("tokenizer.ggml.tokens");
  std::vector<std::string> merges = f.has("tokenizer.ggml.merges") ? f.get_string_array("tokenizer.ggml.merges")
                                                                    : std::vector<std::string>{};
  std::vector<AddedToken> added;
  const std::vector<int64_t> types = token_types(f, tokens.size());
  const std::vector<int> rstrip = phi3_rstrip_ids(f, tokens, types);
  // llama.cpp token types: 1 normal, 2 unknown, 3 control, 4 user defined, 5 unused, 6 byte.
  for (size_t id = 0; id < types.size(); ++id) {
    if (types[id] != 3 && types[id] != 4) continue;
    const bool strip = std::find(rstrip.begin(), rstrip.end(), int(id)) != rstrip.end();
    added.push_back({int(id), tokens[id], types[id] == 3, strip});
  }
  return Tokenizer::from_parts(std::move(tokens), merges, std::move(added), *pre, gguf_ignores_merges(pre_name));
}

}  // namespace strata
