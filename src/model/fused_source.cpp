// Phi-3 stores each layer's q, k and v projections as one qkv_proj and the MLP's gate and up as
// one gate_up_proj (rows stacked in that order, as transformers' Phi3 slices them). The forward
// pass takes them apart: this source shows each fused tensor as its parts, so the loader asks for
// q_proj ... up_proj as for LLaMA and the rows are cut out on reading.
#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "strata/core/error.h"
#include "strata/model/weight_source.h"

namespace strata {
namespace {

class SplitFusedSource final : public WeightSource {
public:
  SplitFusedSource(std::unique_ptr<WeightSource> inner, const ModelConfig& cfg) : inner_(std::move(inner)) {
    const int64_t q = cfg.q_dim(), kv = cfg.kv_dim(), f = cfg.intermediate;
    for (const std::string& name : inner_->names()) {
      if (name.ends_with(".self_attn.qkv_proj.weight")) {
        const std::string prefix = name.substr(0, name.size() - std::string_view("qkv_proj.weight").size());
        split(name, {{prefix + "q_proj.weight", 0, q}, {prefix + "k_proj.weight", q, kv}, {prefix + "v_proj.weight", q + kv, kv}});
      } else if (name.ends_with(".mlp.gate_up_proj.weight")) {
        const std::string prefix = name.substr(0, name.size() - std::string_view("gate_up_proj.weight").size());
        split(name, {{prefix + "gate_proj.weight", 0, f}, {prefix + "up_proj.weight", f, f}});
      } else {
        names_.push_back(name);
      }
    }
  }

  std::string describe() const override { return inner_->describe(); }
  std::optional<quant::QuantSpec> codes_spec() const override { return inner_->codes_spec(); }
  bool contains(const std::string& name) const override {
    return parts_.count(name) != 0 || (inner_->contains(name) && !fused_.count(name));
  }
  std::vector<std::string> names() const override { return names_; }

  std::vector<int64_t> shape(const std::string& name) const override {
    auto it = parts_.find(name);
    if (it == parts_.end()) return inner_->shape(hidden_check(name));
    std::vector<int64_t> s = inner_->shape(it->second.fused);
    s[0] = it->second.rows;
    return s;
  }

private:
  void read_into(const std::string& name, DType dst_dtype, void* dst, ThreadPool* pool) const override {
    auto it = parts_.find(name);
    if (it == parts_.end()) return inner_->read(hidden_check(name), dst_dtype, dst, pool);
    const Part& p = it->second;
    cut_rows(p, size_t(row_elements(p)) * dtype_size(dst_dtype), dst, [&](void* all) {
      inner_->read(p.fused, dst_dtype, all, pool);
      return true;
    });
  }

  bool read_codes_into(const std::string& name, const quant::QuantSpec& spec, void* dst,
                       ThreadPool* pool) const override {
    auto it = parts_.find(name);
    if (it == parts_.end()) return inner_->read_codes(hidden_check(name), spec, dst, pool);
    const Part& p = it->second;
    // Quantized rows are self-contained, so a part's rows are cut out of the fused codes as well.
    return cut_rows(p, quant::row_bytes(spec, row_elements(p)), dst,
                    [&](void* all) { return inner_->read_codes(p.fused, spec, all, pool); });
  }

  struct Part {
    std::string fused;
    int64_t first_row, rows;
  };
  struct NamedPart {
    std::string name;
    int64_t first_row, rows;
  };

  void split(const std::string& fused, std::initializer_list<NamedPart> parts) {
    int64_t total = 0;
    for (const NamedPart& p : parts) total += p.rows;
    const std::vector<int64_t> s = inner_->shape(fused);
    if (s.size() != 2 || s[0] != total)
      STRATA_FAIL(inner_->describe() << ": tensor '" << fused << "' has " << (s.empty() ? 0 : s[0])
                                     << " rows; the config's projections need " << total);
    fused_.emplace(fused);
    for (const NamedPart& p : parts) {
      parts_.emplace(p.name, Part{fused, p.first_row, p.rows});
      names_.push_back(p.name);
    }
  }

  int64_t row_elements(const Part& p) const {
    const std::vector<int64_t> full = inner_->shape(p.fused);
    int64_t row = 1;
    for (size_t d = 1; d < full.size(); ++d) row *= full[d];
    return row;
  }

  // Reads the whole fused tensor with `read_all` (rows of row_bytes each) and copies the part's
  // rows to dst; false when read_all is.
  template <class ReadAll>
  bool cut_rows(const Part& p, size_t row_bytes, void* dst, ReadAll read_all) const {
    std::vector<uint8_t> all(size_t(inner_->shape(p.fused)[0]) * row_bytes);
    if (!read_all(all.data())) return false;
    std::memcpy(dst, all.data() + size_t(p.first_row) * row_bytes, size_t(p.rows) * row_bytes);
    return true;
  }

  // A fused tensor is read only through its parts.
  const std::string& hidden_check(const std::string& name) const {
    if (fused_.count(name)) STRATA_FAIL(inner_->describe() << ": tensor '" << name << "' is read in parts");
    return name;
  }

  std::unique_ptr<WeightSource> inner_;
  std::unordered_map<std::string, Part> parts_;
  std::unordered_set<std::string> fused_;
  std::vector<std::string> names_;
};

}  // namespace

std::unique_ptr<WeightSource> split_fused_projections(std::unique_ptr<WeightSource> inner, const ModelConfig& cfg) {
  return std::make_unique<SplitFusedSource>(std::move(inner), cfg);
}

}  // namespace strata
