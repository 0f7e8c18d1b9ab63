// The CPU backend's ops over group-wise quantized tensors (Q4/Q8): the fused linear that reads a
// weight's codes, kv_store into a quantized cache and attention over it. Each is compared with the
// same op over fp32 data the host reference (quant::dequantize_rows, itself checked against numpy
// in test_quant.cpp) produced, so the fused paths must compute over exactly the reference's values.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernel_test_support.h"
#include "strata/backend/backend.h"
#include "strata/core/dtype.h"
#include "strata/quant/quant.h"

using namespace strata;
using test::spec_of;

namespace {

std::vector<float> normal(size_t n, std::mt19937& rng, float sd = 1.0f) {
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Rows of n quantized by the reference, and their dequantized fp32 values.
struct Quantized {
  std::vector<uint8_t> codes;
  std::vector<float> values;
};
Quantized quantize(const quant::QuantSpec& s, const std::vector<float>& x, int64_t rows, int64_t n) {
  Quantized q;
  q.codes.resize(size_t(rows) * quant::row_bytes(s, n));
  q.values.resize(x.size());
  quant::quantize_rows(s, x.data(), DType::F32, rows, n, q.codes.data());
  quant::dequantize_rows(s, q.codes.data(), rows, n, q.values.data(), DType::F32);
  return q;
}

Tensor f32(std::vector<float>& v, std::initializer_list<int64_t> dims) { return Tensor(v.data(), DType::F32, Device::CPU, dims); }

}  // namespace

TEST_CASE("cpu: a linear over quantized weights equals the linear over their dequantized values", "[quant][cpu_attention]") {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(11);
  // Awkward sizes (the tiny test models') leave a shorter last group; 256 is whole groups.
  for (int64_t in : {72, 200, 256})
    for (int bits : {4, 8})
      for (int group : {32, 64, 128}) {
        const quant::QuantSpec s = spec_of(bits, group);
        const int64_t out = 37;
        std::vector<float> w = normal(size_t(out * in), rng, 0.2f), bias = normal(size_t(out), rng);
        Quantized q = quantize(s, w, out, in);
        const Tensor wq = Tensor::quantized(q.codes.data(), quant::dtype_of(s), group, Device::CPU, {out, in});
        REQUIRE(wq.nbytes() == q.codes.size());
        for (int64_t T : {1, 3, 33}) {
          INFO("in " << in << ", " << bits << "-bit g" << group << ", T " << T);
          std::vector<float> x = normal(size_t(T * in), rng), got(size_t(T * out), NAN), want(size_t(T * out), NAN);
          be->linear(f32(x, {T, in}), wq, f32(bias, {out}), f32(got, {T, out}));
          be->linear(f32(x, {T, in}), f32(q.values, {out, in}), f32(bias, {out}), f32(want, {T, out}));
          if (T > 1 && T <= 8) {
            // Both stream each weight row through the same dot product: equal to the bit.
            CHECK(got == want);
          } else {  // sgemv / sgemm sum in another order: within fp32 rounding of a double reference
            int far = 0;
            for (int64_t t = 0; t < T; ++t)
              for (int64_t o = 0; o < out; ++o) {
                double ref = bias[size_t(o)], mag = std::fabs(bias[size_t(o)]);
                for (int64_t i = 0; i < in; ++i) {
                  ref += double(x[size_t(t * in + i)]) * double(q.values[size_t(o * in + i)]);
                  mag += std::fabs(double(x[size_t(t * in + i)]) * double(q.values[size_t(o * in + i)]));
                }
                if (std::fabs(got[size_t(t * out + o)] - ref) > 1e-5 * mag) ++far;
              }
            CHECK(far == 0);
          }
        }
      }
}

TEST_CASE("cpu: kv_store quantizes each head's row as the reference does, attention reads the codes", "[quant][cpu_attention]") {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(3);
  // (heads, kv_heads, d): GQA with d = 20 (one short group), MHA with d = 64, d = 128.
  const int64_t shapes[][3] = {{6, 2, 20}, {4, 4, 64}, {8, 2, 128}};
  for (const auto& sh : shapes)
    for (int bits : {4, 8})
      for (int group : {32, 64}) {
        const int64_t heads = sh[0], kvh = sh[1], d = sh[2], S = 3, C = 9, T = 5;
        const quant::QuantSpec s = spec_of(bits, group);
        const size_t rb = quant::row_bytes(s, d);
        INFO("heads " << heads << "/" << kvh << ", d " << d << ", " << bits << "-bit g" << group);
        // Fill positions 0..C-2 of every slot from rows quantized by the reference, then store T more
        // tokens with kv_store (fp32 and fp16 inputs), at the last position of some slots and over
        // earlier positions of others.
        std::vector<float> k0 = normal(size_t(S * C * kvh * d), rng), v0 = normal(size_t(S * C * kvh * d), rng);
        Quantized kq = quantize(s, k0, S * C * kvh, d), vq = quantize(s, v0, S * C * kvh, d);
        const std::vector<int32_t> slots{0, 1, 2, 1, 0}, pos{8, 8, 3, 0, 5};
        std::vector<float> kn = normal(size_t(T * kvh * d), rng), vn = normal(size_t(T * kvh * d), rng);
        for (DType in_dt : {DType::F32, DType::F16}) {
          std::vector<uint8_t> ck = kq.codes, cv = vq.codes;
          const Tensor cache_k = Tensor::quantized(ck.data(), quant::dtype_of(s), group, Device::CPU, {S, C, kvh, d});
          const Tensor cache_v = Tensor::quantized(cv.data(), quant::dtype_of(s), group, Device::CPU, {S, C, kvh, d});
          std::vector<uint16_t> kn16(kn.size()), vn16(vn.size());
          for (size_t i = 0; i < kn.size(); ++i) kn16[i] = float_to_half(kn[i]), vn16[i] = float_to_half(vn[i]);
          const Tensor k = in_dt == DType::F32 ? f32(kn, {T, kvh, d}) : Tensor(kn16.data(), DType::F16, Device::CPU, {T, kvh, d});
          const Tensor v = in_dt == DType::F32 ? f32(vn, {T, kvh, d}) : Tensor(vn16.data(), DType::F16, Device::CPU, {T, kvh, d});
          std::vector<int32_t> sl = slots, ps = pos;
          const Tensor st(sl.data(), DType::I32, Device::CPU, {T}), pt(ps.data(), DType::I32, Device::CPU, {T});
          be->kv_store(k, v, cache_k, cache_v, st, pt);

          // The bytes: every stored row is the reference's quantization of that (fp16-rounded) row.
          std::vector<uint8_t> want_k = kq.codes, want_v = vq.codes;
          for (int64_t t = 0; t < T; ++t) {
            const size_t at = size_t((slots[size_t(t)] * C + pos[size_t(t)]) * kvh) * rb;
            quant::quantize_rows(s, k.ptr<char>() + size_t(t * kvh * d) * dtype_size(in_dt), in_dt, kvh, d, want_k.data() + at);
            quant::quantize_rows(s, v.ptr<char>() + size_t(t * kvh * d) * dtype_size(in_dt), in_dt, kvh, d, want_v.data() + at);
          }
          CHECK(ck == want_k);
          CHECK(cv == want_v);

          // Attention over the codes equals attention over the fp32 cache of their reference values.
          std::vector<float> fk(size_t(S * C * kvh * d)), fv(fk.size());
          quant::dequantize_rows(s, ck.data(), S * C * kvh, d, fk.data(), DType::F32);
          quant::dequantize_rows(s, cv.data(), S * C * kvh, d, fv.data(), DType::F32);
          std::vector<float> q = normal(size_t(T * heads * d), rng), got(q.size(), NAN), want(q.size(), NAN);
          be->attention(f32(q, {T, heads, d}), cache_k, cache_v, st, pt, 0.3f, f32(got, {T, heads, d}));
          be->attention(f32(q, {T, heads, d}), f32(fk, {S, C, kvh, d}), f32(fv, {S, C, kvh, d}), st, pt, 0.3f,
                        f32(want, {T, heads, d}));
          CHECK(got == want);
        }
      }
}

// Prefill steps (runs of consecutive positions) take the tiled kernel, which widens the codes with
// the reference's formula: over the codes it gives the bits it gives over their dequantized values.
TEST_CASE("cpu: prefill attention over quantized caches equals it over their dequantized values", "[quant][cpu_attention]") {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(5);
  const int64_t shapes[][3] = {{6, 2, 20}, {4, 4, 64}, {8, 2, 128}};
  for (const auto& sh : shapes)
    for (int bits : {4, 8}) {
      const int64_t heads = sh[0], kvh = sh[1], d = sh[2], S = 2, C = 150;
      const quant::QuantSpec s = spec_of(bits, 32);
      INFO("heads " << heads << "/" << kvh << ", d " << d << ", " << bits << "-bit");
      // The cache holds the reference's codes for every position; a step of two runs attends to them.
      std::vector<float> k0 = normal(size_t(S * C * kvh * d), rng), v0 = normal(size_t(S * C * kvh * d), rng);
      Quantized kq = quantize(s, k0, S * C * kvh, d), vq = quantize(s, v0, S * C * kvh, d);
      std::vector<int32_t> sl, ps;
      for (int32_t p = 60; p < 150; ++p) sl.push_back(0), ps.push_back(p);
      for (int32_t p = 0; p < 70; ++p) sl.push_back(1), ps.push_back(p);
      const int64_t T = int64_t(sl.size());
      const Tensor st(sl.data(), DType::I32, Device::CPU, {T}), pt(ps.data(), DType::I32, Device::CPU, {T});
      const Tensor cache_k = Tensor::quantized(kq.codes.data(), quant::dtype_of(s), 32, Device::CPU, {S, C, kvh, d});
      const Tensor cache_v = Tensor::quantized(vq.codes.data(), quant::dtype_of(s), 32, Device::CPU, {S, C, kvh, d});
      std::vector<float> fk(size_t(S * C * kvh * d)), fv(fk.size());
      quant::dequantize_rows(s, kq.codes.data(), S * C * kvh, d, fk.data(), DType::F32);
      quant::dequantize_rows(s, vq.codes.data(), S * C * kvh, d, fv.data(), DType::F32);
      std::vector<float> q = normal(size_t(T * heads * d), rng), got(q.size(), NAN), want(q.size(), NAN);
      be->attention(f32(q, {T, heads, d}), cache_k, cache_v, st, pt, 0.3f, f32(got, {T, heads, d}));
      be->attention(f32(q, {T, heads, d}), f32(fk, {S, C, kvh, d}), f32(fv, {S, C, kvh, d}), st, pt, 0.3f,
                    f32(want, {T, heads, d}));
      CHECK(got == want);
      CHECK(std::none_of(got.begin(), got.end(), [](float x) { return std::isnan(x); }));
    }
}
