// Helpers shared by the kernel tests (test_cpu_attention_f16, test_cpu_quant_ops, test_cuda_*):
// fp16- or bf16-representable random data, element counts, and the skip on a machine without a GPU.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
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
inline float round_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }
// x rounded to nearest even in F16 or BF16; F32: x itself.
inline float round_to(DType dt, float x) {
  return dt == DType::F16 ? round_f16(x) : dt == DType::BF16 ? round_bf16(x) : x;
}

// Unit roundoff of F16 (2^-11), BF16 (2^-8) or F32 (2^-24): the largest relative error of one
// rounding to nearest in the normal range.
inline double unit_roundoff(DType dt) {
  return std::ldexp(1.0, dt == DType::F16 ? -11 : dt == DType::BF16 ? -8 : -24);
}

// n values uniform in [lo, hi), rounded to `dt` (so the F16 or BF16 copy and the fp32 one are
// equal).
inline std::vector<float> random_floats(size_t n, std::mt19937& rng, float lo, float hi, DType dt) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = round_to(dt, dist(rng));
  return v;
}
// The same, rounded to fp16 where `fp16`.
inline std::vector<float> random_floats(size_t n, std::mt19937& rng, float lo, float hi, bool fp16) {
  return random_floats(n, rng, lo, hi, fp16 ? DType::F16 : DType::F32);
}

inline std::vector<float> random_f16(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  return random_floats(n, rng, lo, hi, true);
}

inline std::vector<uint16_t> to_half(const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = float_to_half(v[i]);
  return h;
}
// The F16 or BF16 bits of v.
inline std::vector<uint16_t> to_bits(const std::vector<float>& v, DType dt) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = dt == DType::BF16 ? float_to_bf16(v[i]) : float_to_half(v[i]);
  return h;
}

// Elements of a tensor of shape `dims`.
inline size_t count(std::initializer_list<int64_t> dims) {
  size_t n = 1;
  for (int64_t d : dims) n *= size_t(d);
  return n;
}

// float64 references of the ops after the stacked projections (Backend::swiglu, split_qkv).
// gate_up: [T, 2f] -> [T, f].
inline std::vector<double> swiglu_reference(const std::vector<float>& gate_up, int64_t T, int64_t f) {
  std::vector<double> out(size_t(T * f));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < f; ++i) {
      const double g = gate_up[size_t(t * 2 * f + i)], u = gate_up[size_t(t * 2 * f + f + i)];
      out[size_t(t * f + i)] = g / (1.0 + std::exp(-g)) * u;
    }
  return out;
}

// GPT-OSS's clamped SwiGLU (Backend::clamped_swiglu): (clamp(u, -limit, limit) + 1) g
// sigmoid(alpha g), g = min(gate, limit).
inline std::vector<double> clamped_swiglu_reference(const std::vector<float>& gate_up, int64_t T, int64_t f,
                                                    double limit, double alpha) {
  std::vector<double> out(size_t(T * f));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < f; ++i) {
      const double g = std::min(double(gate_up[size_t(t * 2 * f + i)]), limit);
      const double u = std::clamp(double(gate_up[size_t(t * 2 * f + f + i)]), -limit, limit);
      out[size_t(t * f + i)] = (u + 1.0) * g / (1.0 + std::exp(-alpha * g));
    }
  return out;
}

// qkv: [T, (heads + 2 kv_heads) d] -> q [T, heads, d], k and v [T, kv_heads, d] (concatenated in
// that order in the result), q and k rotated (rotate_half) by positions x inv_freq unless
// inv_freq is empty. The angle is the fp32 product, as Hugging Face forms it.
inline std::vector<double> split_qkv_reference(const std::vector<float>& qkv, const std::vector<int32_t>& pos,
                                               const std::vector<float>& inv_freq, int64_t heads, int64_t kv_heads,
                                               int64_t d) {
  const int64_t T = int64_t(pos.size()), qd = heads * d, kvd = kv_heads * d, row = qd + 2 * kvd, half = d / 2;
  std::vector<double> q(size_t(T * qd)), k(size_t(T * kvd)), v(size_t(T * kvd));
  for (int64_t t = 0; t < T; ++t) {
    const float* src = qkv.data() + t * row;
    for (auto [dst, from, n] : {std::tuple{q.data() + t * qd, src, heads}, {k.data() + t * kvd, src + qd, kv_heads}})
      for (int64_t hd = 0; hd < n; ++hd)
        for (int64_t i = 0; i < d; ++i) {
          const double x = from[hd * d + i];
          if (inv_freq.empty()) {
            dst[hd * d + i] = x;
            continue;
          }
          const int64_t j = i % half;
          const double a = double(float(pos[size_t(t)]) * inv_freq[size_t(j)]);
          const double partner = from[hd * d + (i < half ? i + half : i - half)];
          dst[hd * d + i] = i < half ? x * std::cos(a) - partner * std::sin(a) : x * std::cos(a) + partner * std::sin(a);
        }
    for (int64_t i = 0; i < kvd; ++i) v[size_t(t * kvd + i)] = src[qd + kvd + i];
  }
  q.insert(q.end(), k.begin(), k.end());
  q.insert(q.end(), v.begin(), v.end());
  return q;
}

// The caches [S, C, kv_heads * d] (`old`, as doubles) after split_qkv_store writes the reference's
// k and v (split_qkv_reference's result, for T tokens of q_dim qd) at (slots[t], positions[t]);
// a token whose slot is outside the cache writes nothing. Returns {k cache, v cache}.
inline std::pair<std::vector<double>, std::vector<double>> caches_after_store(
    const std::vector<float>& old, const std::vector<double>& split, const std::vector<int32_t>& slots,
    const std::vector<int32_t>& pos, int64_t qd, int64_t kvd, int64_t S, int64_t C) {
  const int64_t T = int64_t(pos.size());
  std::vector<double> k(old.begin(), old.end()), v(old.begin(), old.end());
  for (int64_t t = 0; t < T; ++t) {
    if (slots[size_t(t)] < 0 || slots[size_t(t)] >= S) continue;
    for (int64_t i = 0; i < kvd; ++i) {
      const size_t row = size_t((slots[size_t(t)] * C + pos[size_t(t)]) * kvd + i);
      k[row] = split[size_t(T * qd + t * kvd + i)];
      v[row] = split[size_t(T * (qd + kvd) + t * kvd + i)];
    }
  }
  return {k, v};
}

// Llama's inverse frequencies for heads of d.
inline std::vector<float> rope_inv_freq_of(int64_t d) {
  std::vector<float> inv(size_t(d / 2));
  for (int64_t i = 0; i < d / 2; ++i) inv[size_t(i)] = std::pow(10000.0f, -2.0f * float(i) / float(d));
  return inv;
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

// Tensors on a CPU backend made from host vectors, kept alive with it: the reference side of the
// kernel tests.
struct CpuTensors {
  std::unique_ptr<Backend> be = make_cpu_backend(2);
  std::vector<Buffer> keep;
  Tensor f32(const std::vector<float>& v, std::initializer_list<int64_t> dims) {
    keep.push_back(be->alloc(v.size() * 4));
    Tensor t = keep.back().view(0, DType::F32, dims);
    be->copy_to_device(t.data, v.data(), v.size() * 4);
    return t;
  }
  Tensor i32(const std::vector<int32_t>& v) {
    keep.push_back(be->alloc(v.size() * 4));
    Tensor t = keep.back().view(0, DType::I32, {int64_t(v.size())});
    be->copy_to_device(t.data, v.data(), v.size() * 4);
    return t;
  }
  std::vector<float> read(const Tensor& t) {
    std::vector<float> v(size_t(t.numel()));
    be->copy_to_host_f32(t, v.data());
    return v;
  }
};

inline quant::QuantSpec spec_of(int bits, int group) {
  quant::QuantSpec s;
  s.bits = bits;
  s.group_size = group;
  return s;
}

}  // namespace strata::test
