// A PEFT LoRA adapter merged into the base model's tensors as they are read (lora.h).
//
// PEFT saves an adapter's tensors under the base model's module names, prefixed with
// "base_model.model.":
//   M.lora_A.weight [r, in], M.lora_B.weight [out, r]   a Linear M:     W += s B A
//   M.lora_B.bias [out]                                  lora_bias:      b += s b_B
//   M.lora_embedding_A [r, vocab], M.lora_embedding_B [h, r]   an Embedding: E += s A^T B^T
//   M.base_layer.weight / .bias, M.weight / .bias        stored whole (bias="all" / "lora_only",
//                                                        modules_to_save, embedding layers): replace
// The product is summed into the base in fp32, row by row on the loader's pool, and rounded once to
// the dtype the loader asks for.
#if defined(__AVX2__)
#include <immintrin.h>
#endif
#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "strata/core/dtype.h"
#include "strata/core/error.h"
#include "strata/core/thread_pool.h"
#include "strata/model/lora.h"
#include "tokenizer_regex.h"

namespace strata {
namespace fs = std::filesystem;
namespace {

using ordered_json = nlohmann::ordered_json;

constexpr std::string_view kPrefix = "base_model.model.";

// What the adapter does to one base tensor.
struct Change {
  std::string a, b;            // adapter tensors of the low-rank product (empty: none)
  bool embedding = false;      // lora_embedding_A / _B: the product is transposed
  bool bias_of_b = false;      // a lora_B.bias added to the base bias
  std::string replacement;     // an adapter tensor that replaces the base one (empty: none)
  float scale = 0;
};

// The adapter_config.json fields whose variants change what the adapted module computes (Strata
// merges only W + s B A), with why each is refused when set.
struct Unsupported {
  const char* field;
  const char* what;
};
constexpr Unsupported kUnsupported[] = {
    {"use_dora", "DoRA (weight-decomposed LoRA)"},
    {"use_qalora", "QA-LoRA"},
    {"use_bdlora", "block-diagonal LoRA"},
    {"alora_invocation_tokens", "activated LoRA (applied after its invocation tokens only)"},
    {"arrow_config", "Arrow routing between adapters"},
    {"kasa_config", "KaSA"},
    {"monteclora_config", "MonteCLoRA"},
    {"velora_config", "VeLoRA"},
    {"layer_replication", "layer replication"},
    {"target_parameters", "LoRA on parameters (MoE experts)"},
    {"trainable_token_indices", "trainable tokens"},
    {"fan_in_fan_out", "fan_in_fan_out (Conv1D layers stored transposed, GPT-2's)"},
};

bool is_set(const ordered_json& v) {
  if (v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_array() || v.is_object()) return !v.empty();
  return true;
}

struct AdapterConfig {
  int r = 0;
  double alpha = 0;
  bool rslora = false;
  ordered_json rank_pattern = ordered_json::object(), alpha_pattern = ordered_json::object();
};

AdapterConfig read_adapter_config(const fs::path& file) {
  std::ifstream in(file);
  if (!in) STRATA_FAIL(file.string() << ": cannot read the LoRA adapter's config");
  ordered_json j;
  try {
    j = ordered_json::parse(in);
  } catch (const std::exception& e) {
    STRATA_FAIL(file.string() << ": not valid JSON (" << e.what() << ")");
  }
  if (!j.is_object()) STRATA_FAIL(file.string() << ": not a JSON object");
  const std::string type = j.value("peft_type", std::string());
  if (type != "LORA")
    STRATA_FAIL(file.string() << ": peft_type is '" << type << "'; Strata reads LoRA adapters (peft_type LORA) only");
  for (const Unsupported& u : kUnsupported)
    if (j.contains(u.field) && is_set(j[u.field]))
      STRATA_FAIL(file.string() << ": " << u.field << " is set: " << u.what << " is not supported (Strata merges "
                                << "plain LoRA, W + s B A)");
  AdapterConfig c;
  if (!j.contains("r") || !j["r"].is_number_integer() || j["r"].get<int>() < 1)
    STRATA_FAIL(file.string() << ": field 'r' must be a positive integer");
  c.r = j["r"].get<int>();
  if (!j.contains("lora_alpha") || !j["lora_alpha"].is_number())
    STRATA_FAIL(file.string() << ": field 'lora_alpha' must be a number");
  c.alpha = j["lora_alpha"].get<double>();
  c.rslora = j.value("use_rslora", false);
  for (const char* field : {"rank_pattern", "alpha_pattern"}) {
    if (!j.contains(field) || j[field].is_null()) continue;
    if (!j[field].is_object()) STRATA_FAIL(file.string() << ": field '" << field << "' must be an object");
    for (const auto& [key, value] : j[field].items())
      if (!value.is_number() || (std::string_view(field) == "rank_pattern" && !value.is_number_integer()))
        STRATA_FAIL(file.string() << ": " << field << "['" << key << "'] must be a number");
    (std::string_view(field) == "rank_pattern" ? c.rank_pattern : c.alpha_pattern) = j[field];
  }
  return c;
}

// PEFT's get_pattern_key: the first key (in the file's order) that matches the end of the module
// name at a dot boundary, as re.match(rf"(.*\.)?({key})$", module) does.
const ordered_json* pattern_value(const ordered_json& patterns, const std::string& module, const fs::path& file,
                                  const char* field) {
  for (const auto& [key, value] : patterns.items()) {
    const std::string where = file.string() + ": " + field + " key '" + key + "'";
    const tok::SplitRegex re("^(.*\\.)?(" + key + ")$", false, where);
    if (re.matches(module)) return &value;
  }
  return nullptr;
}

// Whether the module's last dotted component is one of `names`.
bool last_name_is(const std::string& module, std::initializer_list<std::string_view> names) {
  const size_t dot = module.rfind('.');
  const std::string_view last = std::string_view(module).substr(dot == std::string::npos ? 0 : dot + 1);
  for (std::string_view n : names)
    if (last == n) return true;
  return false;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << "]";
  return o.str();
}

// The change to a tensor [rows, cols] as rows of `rank` terms: row i gets
// sum_k coef[i rank + k] rows[k] (times the scale). A Linear's product B A: coef B, rows A. An
// embedding's A^T B^T: coef A^T, rows B^T. lora_B.bias: one term of coefficient 1. None: rank 0.
struct Product {
  int64_t rank = 0;
  std::vector<float> coef, rows;
};

class LoraSource final : public WeightSource {
public:
  LoraSource(std::unique_ptr<WeightSource> base, const fs::path& dir, const ModelConfig& cfg, LoraSummary* summary)
      : base_(std::move(base)) {
    if (!fs::is_directory(dir)) STRATA_FAIL("--lora " << dir.string() << ": not a directory (a PEFT adapter directory)");
    const fs::path config_file = dir / "adapter_config.json", tensors_file = dir / "adapter_model.safetensors";
    if (!fs::exists(config_file)) STRATA_FAIL(dir.string() << ": no adapter_config.json (not a PEFT LoRA adapter)");
    if (!fs::exists(tensors_file)) {
      if (fs::exists(dir / "adapter_model.bin"))
        STRATA_FAIL(dir.string() << ": the adapter is saved as adapter_model.bin (a pickle); Strata reads "
                                 << "adapter_model.safetensors (save it with safe_serialization=True)");
      STRATA_FAIL(dir.string() << ": no adapter_model.safetensors");
    }
    config_ = read_adapter_config(config_file);
    adapter_ = make_safetensors_source(tensors_file);
    file_ = tensors_file.string();
    for (const std::string& key : adapter_->names()) place(key, cfg, config_file);
    for (auto& [tensor, change] : changes_) check(tensor, change);
    if (summary) {
      *summary = {config_.r, config_.alpha, config_.rslora, 0, 0};
      for (const auto& [tensor, change] : changes_) {
        summary->merged += !change.a.empty() || change.bias_of_b;
        summary->replaced += !change.replacement.empty();
      }
    }
  }

  std::string describe() const override { return base_->describe() + " with LoRA adapter " + file_; }
  bool contains(const std::string& name) const override { return base_->contains(name); }
  std::vector<int64_t> shape(const std::string& name) const override { return base_->shape(name); }
  std::vector<std::string> names() const override { return base_->names(); }
  std::optional<quant::QuantSpec> codes_spec() const override { return base_->codes_spec(); }

private:
  void read_into(const std::string& name, DType dst_dtype, void* dst, ThreadPool* pool) const override {
    auto it = changes_.find(name);
    if (it == changes_.end()) return base_->read(name, dst_dtype, dst, pool);
    const Change& c = it->second;
    const std::vector<int64_t> s = base_->shape(name);
    const int64_t rows = s[0], cols = s.size() > 1 ? s[1] : 1;
    std::vector<float> w(size_t(rows * cols));
    if (c.replacement.empty()) base_->read(name, DType::F32, w.data(), pool);
    else adapter_->read(c.replacement, DType::F32, w.data(), pool);
    const Product p = product_of(c, rows, cols);
    // Row by row, on the pool: each row gets its share of the product and is converted.
    auto rows_from = [&](int64_t r0, int64_t r1) {
      for (int64_t i = r0; i < r1; ++i) add_terms(p, c.scale, i, cols, w.data() + i * cols);
      const size_t out = dtype_size(dst_dtype);
      convert_elements(w.data() + r0 * cols, DType::F32, static_cast<uint8_t*>(dst) + size_t(r0 * cols) * out, dst_dtype,
                       size_t((r1 - r0) * cols));
    };
    parallel_for(pool, rows, rows_from);
  }

  // row += scale sum_k coef[i rank + k] rows[k]: with AVX2, 32 columns at a time held in four
  // registers over the terms; the rest (and without AVX2, all) a column at a time.
  static void add_terms(const Product& p, float scale, int64_t i, int64_t cols, float* row) {
    const float* coef = p.coef.data() + i * p.rank;
    const float* rows = p.rows.data();
    int64_t j0 = 0;
#if defined(__AVX2__) && defined(__FMA__)
    for (; j0 + 32 <= cols; j0 += 32) {
      __m256 acc[4];
      for (int m = 0; m < 4; ++m) acc[m] = _mm256_loadu_ps(row + j0 + 8 * m);
      for (int64_t k = 0; k < p.rank; ++k) {
        const __m256 c = _mm256_set1_ps(scale * coef[k]);
        const float* v = rows + k * cols + j0;
        for (int m = 0; m < 4; ++m) acc[m] = _mm256_fmadd_ps(c, _mm256_loadu_ps(v + 8 * m), acc[m]);
      }
      for (int m = 0; m < 4; ++m) _mm256_storeu_ps(row + j0 + 8 * m, acc[m]);
    }
#endif
    for (; j0 < cols; ++j0)
      for (int64_t k = 0; k < p.rank; ++k) row[j0] += scale * coef[k] * rows[k * cols + j0];
  }

  Product product_of(const Change& c, int64_t rows, int64_t cols) const {
    Product p;
    if (c.bias_of_b) {  // a vector: `rows` elements, each its own row of one column
      p.rank = 1;
      p.coef.resize(size_t(rows));
      adapter_->read(c.b, DType::F32, p.coef.data());
      p.rows = {1.0f};
      return p;
    }
    if (c.a.empty()) return p;
    p.rank = adapter_->shape(c.a)[0];
    std::vector<float> a(size_t(p.rank * (c.embedding ? rows : cols))), b(size_t((c.embedding ? cols : rows) * p.rank));
    adapter_->read(c.a, DType::F32, a.data());
    adapter_->read(c.b, DType::F32, b.data());
    if (!c.embedding) {
      p.coef = std::move(b);  // B [rows, r]
      p.rows = std::move(a);  // A [r, cols]
      return p;
    }
    p.coef.resize(size_t(rows * p.rank));  // A^T [rows, r] of A [r, rows]
    p.rows.resize(size_t(p.rank * cols));  // B^T [r, cols] of B [cols, r]
    for (int64_t k = 0; k < p.rank; ++k) {
      for (int64_t i = 0; i < rows; ++i) p.coef[size_t(i * p.rank + k)] = a[size_t(k * rows + i)];
      for (int64_t j = 0; j < cols; ++j) p.rows[size_t(k * cols + j)] = b[size_t(j * p.rank + k)];
    }
    return p;
  }

  // The tensor is changed, so its stored codes (a GGUF's, a GPTQ checkpoint's) no longer hold it:
  // the loader quantizes what read() gives instead.
  bool read_codes_into(const std::string& name, const quant::QuantSpec& spec, void* dst,
                       ThreadPool* pool) const override {
    if (changes_.count(name)) return false;
    return base_->read_codes(name, spec, dst, pool);
  }

  // Files one adapter tensor under the base tensor it changes.
  void place(const std::string& key, const ModelConfig& cfg, const fs::path& config_file) {
    std::string k = key.starts_with(kPrefix) ? key.substr(kPrefix.size()) : key;
    auto strip = [&](std::string_view suffix) {
      if (!k.ends_with(suffix)) return false;
      k.resize(k.size() - suffix.size());
      return true;
    };
    std::string module, tensor;
    Change* c = nullptr;
    auto change_of = [&](std::string_view which) -> Change& {
      module = k;
      tensor = module + "." + std::string(which);
      refuse_tied(module, cfg, key);
      return changes_[tensor];
    };
    if (strip(".lora_A.weight")) {
      (c = &change_of("weight"))->a = key;
    } else if (strip(".lora_B.weight")) {
      (c = &change_of("weight"))->b = key;
    } else if (strip(".lora_B.bias")) {
      c = &change_of("bias");
      c->b = key;
      c->bias_of_b = true;
    } else if (strip(".lora_embedding_A")) {
      (c = &change_of("weight"))->a = key;
      c->embedding = true;
    } else if (strip(".lora_embedding_B")) {
      (c = &change_of("weight"))->b = key;
      c->embedding = true;
    } else if (strip(".base_layer.weight") || strip(".weight")) {
      change_of("weight").replacement = key;
    } else if (strip(".base_layer.bias") || strip(".bias")) {
      change_of("bias").replacement = key;
    } else {
      STRATA_FAIL(file_ << ": tensor '" << key << "' is not a LoRA matrix (lora_A, lora_B, lora_embedding_A/B) or a "
                        << "weight or bias the adapter replaces; this kind of adapter is not supported");
    }
    if (c) c->scale = scale_of(module, config_file);
  }

  // PEFT's scaling for a module: lora_alpha / r, or / sqrt(r) with use_rslora, each from the
  // patterns when one matches the module's name.
  float scale_of(const std::string& module, const fs::path& config_file) {
    int r = config_.r;
    double alpha = config_.alpha;
    if (const ordered_json* v = pattern_value(config_.rank_pattern, module, config_file, "rank_pattern")) r = v->get<int>();
    if (const ordered_json* v = pattern_value(config_.alpha_pattern, module, config_file, "alpha_pattern"))
      alpha = v->get<double>();
    if (r < 1) STRATA_FAIL(config_file.string() << ": rank_pattern gives " << module << " a rank of " << r);
    ranks_[module] = r;
    return float(alpha / (config_.rslora ? std::sqrt(double(r)) : double(r)));
  }

  void refuse_tied(const std::string& module, const ModelConfig& cfg, const std::string& key) const {
    if (cfg.tied_embeddings && last_name_is(module, {"embed_tokens", "lm_head"}))
      STRATA_FAIL(file_ << ": tensor '" << key << "' changes " << module << ", but this model ties its output matrix "
                        << "to its embeddings (tie_word_embeddings), and PEFT applies the change to one of them only; "
                        << "adapters that change the embeddings or lm_head of a tied model are not supported");
  }

  // The base tensor exists and the adapter's tensors fit it.
  void check(const std::string& tensor, const Change& c) const {
    const std::string module = tensor.substr(0, tensor.rfind('.'));
    const std::string& any = !c.replacement.empty() ? c.replacement : !c.a.empty() ? c.a : c.b;
    if (!base_->contains(tensor)) {
      if (tensor.ends_with(".bias") && base_->contains(module + ".weight"))
        STRATA_FAIL(file_ << ": tensor '" << any << "' adds a bias to " << module << ", which has none in "
                          << base_->describe() << " (lora_bias on a module without a bias is not supported)");
      STRATA_FAIL(file_ << ": tensor '" << any << "' is for '" << tensor << "', which is not in " << base_->describe()
                        << " (an adapter for another model?)");
    }
    const std::vector<int64_t> s = base_->shape(tensor);
    auto refuse = [&](const std::string& key, const std::vector<int64_t>& want) {
      STRATA_FAIL(file_ << ": tensor '" << key << "' has shape " << shape_str(adapter_->shape(key)) << ", but "
                        << tensor << " " << shape_str(s) << " needs " << shape_str(want));
    };
    if (!c.replacement.empty() && adapter_->shape(c.replacement) != s) refuse(c.replacement, s);
    if (c.bias_of_b) {
      if (adapter_->shape(c.b) != s) refuse(c.b, s);
      return;
    }
    if (c.a.empty() != c.b.empty())
      STRATA_FAIL(file_ << ": tensor '" << any << "' has no " << (c.a.empty() ? "lora_A" : "lora_B")
                        << " partner for " << module);
    if (c.a.empty()) return;
    if (s.size() != 2) STRATA_FAIL(file_ << ": tensor '" << c.a << "' adapts " << tensor << ", which is not a matrix");
    const int64_t r = ranks_.at(module);
    const std::vector<int64_t> want_a = c.embedding ? std::vector<int64_t>{r, s[0]} : std::vector<int64_t>{r, s[1]};
    const std::vector<int64_t> want_b = c.embedding ? std::vector<int64_t>{s[1], r} : std::vector<int64_t>{s[0], r};
    if (adapter_->shape(c.a) != want_a) refuse(c.a, want_a);
    if (adapter_->shape(c.b) != want_b) refuse(c.b, want_b);
  }

  std::unique_ptr<WeightSource> base_, adapter_;
  std::string file_;
  AdapterConfig config_;
  std::map<std::string, Change> changes_;  // by base tensor name
  std::map<std::string, int> ranks_;       // by module, from r and rank_pattern
};

}  // namespace

std::unique_ptr<WeightSource> lora_source(std::unique_ptr<WeightSource> base, const fs::path& dir,
                                          const ModelConfig& cfg, LoraSummary* summary) {
  return std::make_unique<LoraSource>(std::move(base), dir, cfg, summary);
}

std::string lora_load_note(const fs::path& dir, const LoraSummary& s) {
  std::ostringstream o;
  o << "LoRA adapter " << dir.string() << ": r " << s.rank << ", alpha " << s.alpha << (s.rslora ? " (rsLoRA)" : "")
    << ", merged into " << s.merged << " tensor" << (s.merged == 1 ? "" : "s");
  if (s.replaced) o << ", " << s.replaced << " replaced whole";
  o << " as they load";
  return o.str();
}

}  // namespace strata
