// Inputs, expected outputs and error bounds for the quantized kernels' tests, shared by the GPU
// tests (test_cuda_quant.cpp) and their CPU emulation (cuda_emulation/test_quant_emulated.cpp).
// Expected values come from the host quantization reference (include/strata/quant/quant.h,
// itself checked against numpy in test_quant.cpp) and plain double arithmetic, never from CUDA
// code. Error bounds are worst-case, so no case is flaky. Activations (inputs and outputs) are fp16
// unless a case is made with `act` = DType::BF16 (the emulated tests run both); a bound's output
// rounding is then bf16's, 2^-8 relative instead of 2^-11.
#pragma once
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "kernel_test_support.h"
#include "strata/core/dtype.h"
#include "strata/quant/quant.h"

namespace strata::test {

const double kHalfUlp16 = std::ldexp(1.0, -11);  // fp16 rounding, relative (normal range)
const double kUlp32 = std::ldexp(1.0, -24);      // one fp32 rounding, relative; also fp16's subnormal step

inline std::string label(const char* what, std::initializer_list<int64_t> values) {
  std::string s = what;
  for (int64_t v : values) s += " " + std::to_string(v);
  return s;
}

// The minimum of group g of a quantized row (quant.h's layout), for error bounds.
inline float row_group_min(const quant::QuantSpec& spec, const uint8_t* row, int64_t n, int64_t g) {
  const size_t code_bytes = (size_t(n) * size_t(spec.bits) + 31) / 32 * 4;
  const size_t groups = size_t((n + spec.group_size - 1) / spec.group_size);
  uint16_t h;
  std::memcpy(&h, row + code_bytes + 2 * (groups + size_t(g)), 2);
  return half_to_float(h);
}

// Byte-for-byte equality, reporting the count and the first difference.
inline void expect_same_bytes(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                              const std::string& what) {
  REQUIRE(got.size() == want.size());
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i] && bad++ == 0) first = i;
  INFO(what << ": " << bad << " of " << got.size() << " bytes differ; first at " << first << ": got "
            << (bad ? int(got[first]) : 0) << ", want " << (bad ? int(want[first]) : 0));
  CHECK(bad == 0);
}

// |got - want| <= tol[i] everywhere; NaN (a poisoned, unwritten element) never passes.
inline void expect_within(const std::vector<float>& got, const std::vector<double>& want,
                          const std::vector<double>& tol, const std::string& what) {
  REQUIRE(got.size() == want.size());
  size_t bad = 0, first = 0;
  double worst = 0;  // the largest error / tolerance ratio
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - want[i]);
    if (!(err <= tol[i])) {
      if (bad++ == 0) first = i;
      if (!(err / tol[i] <= worst)) worst = err / tol[i];
    }
  }
  INFO(what << ": " << bad << " of " << got.size() << " elements off, worst error " << worst
            << " x the tolerance; first at " << first << ": got " << (bad ? got[first] : 0.0f) << ", want "
            << (bad ? want[first] : 0.0) << " +- " << (bad ? tol[first] : 0.0));
  CHECK(bad == 0);
}

// Rows 1..5 of a [6, n] input get the cases where the reference's order matters: a zero minimum
// that is -0 first (row 1) or +0 first (row 2), a constant row (scale 0, row 3), a row of zeros of
// both signs (row 4) and a non-positive row whose maximum is a zero (row 5); values rounded to `dt`.
inline void add_special_rows(std::vector<float>& x, int64_t n, std::mt19937& rng, DType dt = DType::F16) {
  std::uniform_real_distribution<float> pos(0.25f, 2.0f);
  for (int64_t i = 0; i < n; ++i) {
    const auto at = [&](int64_t r) -> float& { return x[size_t(r * n + i)]; };
    at(1) = i % 5 == 0 ? -0.0f : i % 5 == 2 ? 0.0f : round_to(dt, pos(rng));
    at(2) = i % 5 == 0 ? 0.0f : i % 5 == 2 ? -0.0f : round_to(dt, pos(rng));
    at(3) = 0.75f;
    at(4) = i % 2 == 0 ? -0.0f : 0.0f;
    at(5) = i % 3 == 0 ? (i % 2 == 0 ? -0.0f : 0.0f) : -round_to(dt, pos(rng));
  }
}


// y = x @ dequant(w)^T + bias against double arithmetic over the host's dequantized weights and
// the fp16 (or bf16: `act`) x. Error bound per output (all worst-case, so no flakiness):
//  - output rounding: 2^-11 |y| (bf16: 2^-8 |y|), plus 2^-24 for fp16's subnormal step;
//  - fp32 arithmetic: each lane sums in/32 products in sequence, then 5 shuffle levels; the
//    kernel's dequantization (one FMA) differs from the reference's (product rounded, then the
//    add) by at most 2 ulp of |code * scale| + |w| <= 2 (|w| + |min|). So the error is at most
//    (in/32 + 8) * 2^-24 * sum |x| (|w| + |min|); we allow twice that.
// A lost element costs |x w| ~ sum / in, far above the (in/16 + 16) * 2^-24 * sum allowed.
struct QuantLinearCase {
  std::vector<uint8_t> w;   // [out] quantized rows of `in`
  std::vector<float> w16;   // [out, in] 16-bit weights' values instead (make_plain_linear_case)
  std::vector<float> x;     // [T, in], values of act
  std::vector<float> bias;  // [out] values of act, or empty
  std::vector<double> want, tol;  // [T, out]
};

inline QuantLinearCase make_quant_linear_case(const quant::QuantSpec& spec, int64_t T, int64_t out, int64_t in,
                                              bool with_bias, std::mt19937& rng, DType act = DType::F16) {
  QuantLinearCase c;
  std::vector<float> w = random_floats(size_t(out * in), rng, -1.0f, 1.0f, false);
  for (int64_t o = 0; o < out; o += 3)  // rows far from zero: the minimum term dominates
    for (int64_t i = 0; i < in; ++i) w[size_t(o * in + i)] += 2.0f;
  const size_t row_bytes = quant::row_bytes(spec, in);
  c.w.resize(size_t(out) * row_bytes);
  quant::quantize_rows(spec, w.data(), DType::F32, out, in, c.w.data());
  std::vector<float> wd(w.size());
  quant::dequantize_rows(spec, c.w.data(), out, in, wd.data(), DType::F32);
  c.x = random_floats(size_t(T * in), rng, -1.0f, 1.0f, act);
  if (with_bias) c.bias = random_floats(size_t(out), rng, -1.0f, 1.0f, act);

  c.want.resize(size_t(T * out));
  c.tol.resize(c.want.size());
  for (int64_t o = 0; o < out; ++o) {
    const uint8_t* row = c.w.data() + size_t(o) * row_bytes;
    std::vector<double> mag_w(static_cast<size_t>(in));
    for (int64_t i = 0; i < in; ++i)
      mag_w[size_t(i)] = std::fabs(double(wd[size_t(o * in + i)])) +
                         std::fabs(double(row_group_min(spec, row, in, i / spec.group_size)));
    for (int64_t t = 0; t < T; ++t) {
      double sum = with_bias ? double(c.bias[size_t(o)]) : 0.0, mag = std::fabs(sum);
      for (int64_t i = 0; i < in; ++i) {
        const double xi = c.x[size_t(t * in + i)];
        sum += xi * double(wd[size_t(o * in + i)]);
        mag += std::fabs(xi) * mag_w[size_t(i)];
      }
      c.want[size_t(t * out + o)] = sum;
      c.tol[size_t(t * out + o)] = unit_roundoff(act) * std::fabs(sum) + double(in / 16 + 16) * kUlp32 * mag + kUlp32;
    }
  }
  return c;
}

// The same over 16-bit weights (values exact in `act`, rows of it as a routed launch reads them).
inline QuantLinearCase make_plain_linear_case(int64_t T, int64_t out, int64_t in, std::mt19937& rng, DType act) {
  QuantLinearCase c;
  c.w16 = random_floats(size_t(out * in), rng, -1.0f, 1.0f, act);
  const std::vector<float>& w = c.w16;
  c.x = random_floats(size_t(T * in), rng, -1.0f, 1.0f, act);
  c.want.resize(size_t(T * out));
  c.tol.resize(c.want.size());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double sum = 0, mag = 0;
      for (int64_t i = 0; i < in; ++i) {
        const double p = double(c.x[size_t(t * in + i)]) * double(w[size_t(o * in + i)]);
        sum += p;
        mag += std::fabs(p);
      }
      c.want[size_t(t * out + o)] = sum;
      c.tol[size_t(t * out + o)] = unit_roundoff(act) * std::fabs(sum) + double(in / 16 + 16) * kUlp32 * mag + kUlp32;
    }
  return c;
}

// kv_store into quantized caches [S, C, kv_heads] rows of d: tokens (slot, position) with the
// last two out of range (they must write nothing); a zero minimum in token 0's first row and a
// constant row in token 1's. Expected cache bytes: the 0xFF poison everywhere but the rows of
// in-range tokens, quantized by the host.
struct QuantKvStoreCase {
  static constexpr int64_t S = 3, C = 5;
  std::vector<int32_t> slots{0, 2, 1, 0, 2, 3, 1}, pos{0, 4, 2, 4, 0, 1, 5};
  std::vector<float> k, v;  // [T, kv_heads, d], values of act
  std::vector<uint8_t> want_k, want_v;
  size_t cache_bytes = 0;
};

inline QuantKvStoreCase make_quant_kv_store_case(const quant::QuantSpec& spec, int64_t d, int64_t kv_heads,
                                                 std::mt19937& rng, DType act = DType::F16) {
  QuantKvStoreCase c;
  const int64_t T = int64_t(c.slots.size());
  c.k = random_floats(size_t(T * kv_heads * d), rng, -2.0f, 2.0f, act);
  c.v = random_floats(size_t(T * kv_heads * d), rng, -2.0f, 2.0f, act);
  for (int64_t i = 0; i < d; ++i) {
    c.k[size_t(i)] = i % 4 == 0 ? -0.0f : i % 4 == 1 ? 0.0f : std::fabs(c.k[size_t(i)]);  // a zero minimum
    c.v[size_t(kv_heads * d + i)] = 0.375f;                                              // a constant row
  }
  const size_t row_bytes = quant::row_bytes(spec, d);
  c.cache_bytes = size_t(c.S * c.C * kv_heads) * row_bytes;
  c.want_k.assign(c.cache_bytes, 0xFF);
  c.want_v.assign(c.cache_bytes, 0xFF);
  const std::vector<uint16_t> kh = to_bits(c.k, act), vh = to_bits(c.v, act);
  for (int64_t t = 0; t < T; ++t) {
    if (c.slots[size_t(t)] >= c.S || c.pos[size_t(t)] >= c.C) continue;
    for (int64_t h = 0; h < kv_heads; ++h) {
      const size_t src = size_t((t * kv_heads + h) * d);
      const size_t dst = size_t((c.slots[size_t(t)] * c.C + c.pos[size_t(t)]) * kv_heads + h) * row_bytes;
      quant::quantize_rows(spec, kh.data() + src, act, 1, d, c.want_k.data() + dst);
      quant::quantize_rows(spec, vh.data() + src, act, 1, d, c.want_v.data() + dst);
    }
  }
  return c;
}

// One query row of attention in double over n keys and values of d elements, and a worst-case
// bound per output element o_i = sum_j p_j v_ji. `key(j, i)` and `value(j, i)` give an element
// and a magnitude that bounds what the kernel's sums over it can lose (|k| for a kernel that
// reads the values themselves; |c s| + |m| for one that sums codes and minimums apart):
//  - output rounding: out_rel |o_i| + 2^-24 (out_rel: 2^-11 for fp16 outputs, 2^-8 for bf16);
//  - a score s_j is off by at most ds = (d + 16) 2^-24 (scale sum_i |q_i| mag(k_ji) + 2 max |s|)
//    (the scaled query's rounding, the fp32 dot product, the subtraction of the running max);
//    each weight then by ds plus a few ulp per exp and per tile rescale, the normalization by as
//    much again, and the sums over n keys by n ulp: |error| <= (2 ds + (n + 64) 2^-22) sum_j p_j
//    mag(v_ji). We allow 4 ds + (n + 256) 2^-21.
// Keys [first, n) only (a sliding window); softcap > 0 caps the scaled scores, softcap tanh(s /
// softcap), whose slope is at most 1, so the bound stands. A sink logit (GPT-OSS) joins the
// softmax's sum and weighs no value: the weights shrink, and the bound with them.
template <class Element>
void attention_row_reference(const float* q, int64_t n, int64_t d, double scale, Element key, Element value,
                             double out_rel, double* want, double* tol, int64_t first = 0, double softcap = 0,
                             const float* sink = nullptr) {
  std::vector<double> s(static_cast<size_t>(n)), p(s.size(), 0.0);
  double s_max = -INFINITY, s_abs = 0, qk_abs = 0, denom = 0;
  for (int64_t j = first; j < n; ++j) {
    double dot = 0, mag = 0;
    for (int64_t i = 0; i < d; ++i) {
      const std::array<double, 2> k = key(j, i);
      dot += double(q[i]) * k[0];
      mag += std::fabs(double(q[i])) * k[1];
    }
    s[size_t(j)] = softcap > 0 ? softcap * std::tanh(dot * scale / softcap) : dot * scale;
    s_max = std::max(s_max, s[size_t(j)]);
    s_abs = std::max(s_abs, std::fabs(s[size_t(j)]));
    qk_abs = std::max(qk_abs, mag * scale);
  }
  if (sink) s_max = std::max(s_max, double(*sink));
  for (int64_t j = first; j < n; ++j) denom += p[size_t(j)] = std::exp(s[size_t(j)] - s_max);
  if (sink) denom += std::exp(double(*sink) - s_max);
  const double ds = double(d + 16) * kUlp32 * (qk_abs + 2 * s_abs);
  const double eps = 4 * ds + double(n + 256) * std::ldexp(1.0, -21);
  for (int64_t i = 0; i < d; ++i) {
    double o = 0, mag = 0;
    for (int64_t j = first; j < n; ++j) {
      const std::array<double, 2> v = value(j, i);
      o += p[size_t(j)] / denom * v[0];
      mag += p[size_t(j)] / denom * v[1];
    }
    want[i] = o;
    tol[i] = out_rel * std::fabs(o) + eps * mag + kUlp32;
  }
}

// Attention over a quantized cache against double arithmetic over the host's dequantized cache
// (the kernels dequantize by the same fp32 formula, so keys and values are the same numbers), with
// attention_row_reference's bound for fp16 (or bf16: `act`) outputs.
struct QuantAttentionCase {
  std::vector<uint8_t> k, v;  // [S, C, kv_heads] quantized rows of d
  std::vector<float> q;       // [T, heads, d], values of act
  float scale = 0;
  std::vector<double> want, tol;  // [T, heads, d]
  int window = 0;                  // AttentionSpec's window, soft cap and sinks ([heads] or none)
  float softcap = 0.0f;
  std::vector<float> sinks;
};

inline QuantAttentionCase make_quant_attention_case(const quant::QuantSpec& spec, int64_t T, int64_t heads,
                                                    int64_t kv_heads, int64_t d, int64_t S, int64_t C,
                                                    const std::vector<int32_t>& slots, const std::vector<int32_t>& pos,
                                                    float q_range, std::mt19937& rng, DType act = DType::F16,
                                                    int window = 0, float softcap = 0.0f,
                                                    const std::vector<float>& sinks = {}) {
  QuantAttentionCase c;
  c.window = window;
  c.softcap = softcap;
  c.sinks = sinks;
  const int64_t rows = S * C * kv_heads;
  const std::vector<float> ck = random_floats(size_t(rows * d), rng, -1.0f, 1.0f, false);
  const std::vector<float> cv = random_floats(size_t(rows * d), rng, -1.0f, 1.0f, false);
  const size_t cache_bytes = size_t(rows) * quant::row_bytes(spec, d);
  c.k.resize(cache_bytes);
  c.v.resize(cache_bytes);
  quant::quantize_rows(spec, ck.data(), DType::F32, rows, d, c.k.data());
  quant::quantize_rows(spec, cv.data(), DType::F32, rows, d, c.v.data());
  std::vector<float> kd(ck.size()), vd(cv.size());
  quant::dequantize_rows(spec, c.k.data(), rows, d, kd.data(), DType::F32);
  quant::dequantize_rows(spec, c.v.data(), rows, d, vd.data(), DType::F32);
  c.q = random_floats(size_t(T * heads * d), rng, -q_range, q_range, act);
  c.scale = 1.0f / std::sqrt(float(d));

  c.want.resize(c.q.size());
  c.tol.resize(c.q.size());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t kvh = h / (heads / kv_heads), n = pos[size_t(t)] + 1;
      const auto at = [&](int64_t j, int64_t i) { return size_t(((slots[size_t(t)] * C + j) * kv_heads + kvh) * d + i); };
      const auto element = [&at](const std::vector<float>& x) {
        return [&x, &at](int64_t j, int64_t i) {
          const double e = x[at(j, i)];
          return std::array<double, 2>{e, std::fabs(e)};
        };
      };
      const size_t k = size_t((t * heads + h) * d);
      const int64_t first = window > 0 ? std::max<int64_t>(0, n - window) : 0;
      attention_row_reference(c.q.data() + k, n, d, double(c.scale), element(kd), element(vd), unit_roundoff(act),
                              c.want.data() + k, c.tol.data() + k, first, double(softcap),
                              sinks.empty() ? nullptr : &sinks[size_t(h)]);
    }
  return c;
}

// Prefill tiles over quantized caches take the tensor-core kernel (attention_tc.cu), which rounds
// the dequantized keys and values and the softmax weights to fp16 for its MMAs: the fp16
// attention tests' bound, 2e-3 + 1e-2 |o|, instead of the fp32 kernel's. With bf16 operands
// (`act`) every one of those roundings errs by up to 2^-8 instead of 2^-11, so the bound is 8 times
// that.
inline void allow_fp16_operands(QuantAttentionCase& c, DType act = DType::F16) {
  const double k = unit_roundoff(act) / unit_roundoff(DType::F16);
  for (size_t i = 0; i < c.want.size(); ++i) c.tol[i] = std::max(c.tol[i], k * (2e-3 + 1e-2 * std::fabs(c.want[i])));
}

// The (slot, position) of each token of sequences packed one after another as a prefill step
// lays them out; runs: (slot, first position, tokens).
inline void packed_tokens(const std::vector<std::array<int32_t, 3>>& runs, std::vector<int32_t>& slots,
                          std::vector<int32_t>& pos) {
  for (const auto& r : runs)
    for (int32_t i = 0; i < r[2]; ++i) {
      slots.push_back(r[0]);
      pos.push_back(r[1] + i);
    }
}

}  // namespace strata::test
