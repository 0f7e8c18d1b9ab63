// Helpers shared by the kernel tests (test_cpu_attention_f16, test_cpu_quant_ops, test_cuda_*):
// fp16-representable random data, element counts, and the skip on a machine without a GPU.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "strata/backend/backend.h"
#include "strata/core/dtype.h"
#include "strata/quant/quant.h"

// Ends a test case with a warning where there is no CUDA GPU (the build need not have CUDA).
#define STRATA_REQUIRE_GPU()              \
  do {                                    \
    if (!strata::cuda_available()) {      \
      WARN("no GPU: skipped");            \
      return;                             \
    }                                     \
  } while (0)

namespace strata::test {

inline float round_f16(float x) { return half_to_float(float_to_half(x)); }

// n values uniform in [lo, hi), rounded to fp16 where `fp16` (so fp16 and fp32 copies are equal).
inline std::vector<float> random_floats(size_t n, std::mt19937& rng, float lo, float hi, bool fp16) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = fp16 ? round_f16(dist(rng)) : dist(rng);
  return v;
}

inline std::vector<float> random_f16(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  return random_floats(n, rng, lo, hi, true);
}

inline std::vector<uint16_t> to_half(const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = float_to_half(v[i]);
  return h;
}

// Elements of a tensor of shape `dims`.
inline size_t count(std::initializer_list<int64_t> dims) {
  size_t n = 1;
  for (int64_t d : dims) n *= size_t(d);
  return n;
}

// STRATA_SPLIT_KV (src/backend/cuda/split_kv.h) set for a scope: a CUDA backend made inside it
// sends every attention call the tensor-core kernel leaves through the split-KV kernels with
// `chunks` chunks ("0": never; "auto": the rule).
class SplitKvSetting {
public:
  explicit SplitKvSetting(const std::string& chunks) {
    if (const char* old = std::getenv(kName)) saved_ = old;
    setenv(kName, chunks.c_str(), 1);
  }
  ~SplitKvSetting() {
    if (saved_) setenv(kName, saved_->c_str(), 1);
    else unsetenv(kName);
  }
  SplitKvSetting(const SplitKvSetting&) = delete;
  SplitKvSetting& operator=(const SplitKvSetting&) = delete;

private:
  static constexpr const char* kName = "STRATA_SPLIT_KV";
  std::optional<std::string> saved_;
};

inline quant::QuantSpec spec_of(int bits, int group) {
  quant::QuantSpec s;
  s.bits = bits;
  s.group_size = group;
  return s;
}

}  // namespace strata::test
