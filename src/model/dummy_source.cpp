// Dummy weights for benchmarks: deterministic, fast, no files. Norm weights are 1 and biases 0 so
// activations stay in a realistic range; everything else is uniform in [-0.02, 0.02].
#include <algorithm>
#include <memory>
#include <unordered_map>
#include <vector>

#include "strata/core/error.h"
#include "strata/core/thread_pool.h"
#include "strata/model/weight_source.h"
#include "strata/model/weight_specs.h"

namespace strata {
namespace {

// A counter-based generator: value i of a tensor is a hash of (tensor, i), independent of the others.
uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

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
    for (const WeightSpec& s : attention_sink_specs(cfg)) specs_[s.name] = s;
  }
  std::string describe() const override { return "dummy:" + cfg_.name; }
  bool contains(const std::string& name) const override { return specs_.count(name) != 0; }
  std::vector<int64_t> shape(const std::string& name) const override { return spec(name).shape; }
  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    for (const auto& [name, s] : specs_) out.push_back(name);
    return out;
  }

private:
  void read_into(const std::string& name, DType dst_dtype, void* dst, ThreadPool* pool) const override {
    const WeightSpec& s = spec(name);
    const size_t n = size_t(s.numel());
    const bool is_bias = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    const bool is_norm = !is_bias && (s.role == WeightRole::AttnNormW || s.role == WeightRole::MlpNormW ||
                                      s.role == WeightRole::FinalNormW || s.role == WeightRole::QNormW ||
                                      s.role == WeightRole::KNormW);
    if (dst_dtype != DType::F32 && dst_dtype != DType::F16 && dst_dtype != DType::BF16)
      STRATA_FAIL("dummy weights: unsupported dtype " << dtype_name(dst_dtype));
    const uint64_t key = fnv1a(name) ^ (seed_ * 0x9e3779b97f4a7c15ull);
    auto fill = [&](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) {
        // A norm scales by 1: w = 1, or w = 0 where the norm adds the 1 itself (Gemma).
        float v = is_bias || (is_norm && cfg_.norm_plus_one) ? 0.0f : 1.0f;
        if (!is_bias && !is_norm) v = (float(splitmix64(key + i) >> 40) / float(1 << 24) - 0.5f) * 0.04f;
        switch (dst_dtype) {
          case DType::F32: static_cast<float*>(dst)[i] = v; break;
          case DType::F16: static_cast<uint16_t*>(dst)[i] = float_to_half(v); break;
          default: static_cast<uint16_t*>(dst)[i] = float_to_bf16(v); break;
        }
      }
    };
    // Each value depends on its index alone, so large tensors are filled by many cores (the
    // pool's, else every core's): a 30B preset is 30e9 values, minutes of one core before the
    // first token of a benchmark.
    const size_t slice = size_t(1) << 20;
    if (n <= slice) return fill(0, n);
    std::unique_ptr<ThreadPool> own;
    if (!pool) pool = (own = std::make_unique<ThreadPool>(0)).get();
    pool->parallel_for(int64_t((n + slice - 1) / slice),
                       [&](int64_t s0, int64_t s1) { fill(size_t(s0) * slice, std::min(n, size_t(s1) * slice)); });
  }

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
