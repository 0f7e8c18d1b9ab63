// Dummy weights for benchmarks: deterministic, fast, no files. Norm weights are 1 and biases 0 so
// activations stay in a realistic range; everything else is uniform in [-0.02, 0.02].
#include <unordered_map>

#include "strata/core/error.h"
#include "strata/model/weight_source.h"
#include "strata/model/weight_specs.h"

namespace strata {
namespace {

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

class DummySource final : public WeightSource {
public:
  DummySource(const ModelConfig& cfg, uint64_t seed) : cfg_(cfg), seed_(seed) {
    for (const WeightSpec& s : global_weight_specs(cfg)) specs_[s.name] = s;
    for (int l = 0; l < cfg.n_layers; ++l)
      for (const WeightSpec& s : layer_weight_specs(cfg, l)) specs_[s.name] = s;
  }
  std::string describe() const override { return "dummy:" + cfg_.name; }
  bool contains(const std::string& name) const override { return specs_.count(name) != 0; }
  std::vector<int64_t> shape(const std::string& name) const override { return spec(name).shape; }
  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    for (const auto& [name, s] : specs_) out.push_back(name);
    return out;
  }

  void read(const std::string& name, DType dst_dtype, void* dst) const override {
    const WeightSpec& s = spec(name);
    const size_t n = size_t(s.numel());
    const bool is_bias = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    const bool is_norm = !is_bias && (s.role == WeightRole::AttnNormW || s.role == WeightRole::MlpNormW ||
                                      s.role == WeightRole::FinalNormW);
    uint64_t state = fnv1a(name) ^ (seed_ * 0x9e3779b97f4a7c15ull) ^ 0x5851f42d4c957f2dull;
    for (size_t i = 0; i < n; ++i) {
      float v = is_bias ? 0.0f : 1.0f;
      if (!is_bias && !is_norm) {
        state ^= state << 13;  // xorshift64: a few cycles per value keeps large presets quick
        state ^= state >> 7;
        state ^= state << 17;
        v = (float(state >> 40) / float(1 << 24) - 0.5f) * 0.04f;
      }
      switch (dst_dtype) {
        case DType::F32: static_cast<float*>(dst)[i] = v; break;
        case DType::F16: static_cast<uint16_t*>(dst)[i] = float_to_half(v); break;
        case DType::BF16: static_cast<uint16_t*>(dst)[i] = float_to_bf16(v); break;
        default: STRATA_FAIL("dummy weights: unsupported dtype " << dtype_name(dst_dtype));
      }
    }
  }

private:
  const WeightSpec& spec(const std::string& name) const {
    auto it = specs_.find(name);
    if (it == specs_.end()) STRATA_FAIL("dummy:" << cfg_.name << ": no tensor '" << name << "'");
    return it->second;
  }
  ModelConfig cfg_;
  uint64_t seed_;
  std::unordered_map<std::string, WeightSpec> specs_;
};

}  // namespace

std::unique_ptr<WeightSource> make_dummy_source(const ModelConfig& cfg, uint64_t seed) {
  return std::make_unique<DummySource>(cfg, seed);
}

}  // namespace strata
