// The CUDA backend's quantized kernels against the host quantization reference
// (include/strata/quant/quant.h, src/quant/quant.cpp) and plain double arithmetic, never against
// CUDA code: quantize/dequantize bytes, the fused dequant linear, kv_store into quantized caches
// and attention over them. Shapes include rows that the group does not divide (a shorter last
// group), odd lengths (a lone last nibble), misaligned views and token counts beyond one pass of
// the fused kernel; GPU outputs are poisoned with 0xFF bytes (fp16 NaN) beforehand so unwritten
// elements show. Without a GPU the tests warn and return. No CUDA header: builds without CUDA.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernel_test_support.h"
#include "strata/backend/backend.h"
#include "strata/core/dtype.h"
#include "strata/core/error.h"
#include "strata/quant/quant.h"

using namespace strata;
using test::random_floats;
using test::round_f16;
using test::spec_of;
using test::to_half;

namespace {

const double kHalfUlp16 = std::ldexp(1.0, -11);  // fp16 rounding, relative (normal range)
const double kUlp32 = std::ldexp(1.0, -24);      // one fp32 rounding, relative; also fp16's subnormal step

DType qdtype(int bits) { return bits == 4 ? DType::Q4 : DType::Q8; }

std::string label(const char* what, std::initializer_list<int64_t> values) {
  std::string s = what;
  for (int64_t v : values) s += " " + std::to_string(v);
  return s;
}

// The minimum of group g of a quantized row (quant.h's layout), for error bounds.
float row_group_min(const quant::QuantSpec& spec, const uint8_t* row, int64_t n, int64_t g) {
  const size_t code_bytes = (size_t(n) * size_t(spec.bits) + 31) / 32 * 4;
  const size_t groups = size_t((n + spec.group_size - 1) / spec.group_size);
  uint16_t h;
  std::memcpy(&h, row + code_bytes + 2 * (groups + size_t(g)), 2);
  return half_to_float(h);
}

// One CUDA backend and the device memory a test case allocates on it.
struct Gpu {
  std::unique_ptr<Backend> be = make_cuda_backend(0);
  std::vector<Buffer> keep;

  // `bytes` bytes at byte `offset` of a fresh allocation: a copy of `host`, or 0xFF bytes.
  void* put(const void* host, size_t bytes, size_t offset = 0) {
    keep.push_back(be->alloc(bytes + offset));
    void* p = static_cast<char*>(keep.back().data()) + offset;
    if (host) {
      be->copy_to_device(p, host, bytes);
    } else {
      const std::vector<uint8_t> poison(bytes, 0xFF);
      be->copy_to_device(p, poison.data(), bytes);
    }
    return p;
  }
  Tensor f16(const std::vector<float>& v, std::initializer_list<int64_t> dims, size_t offset = 0) {
    const std::vector<uint16_t> h = to_half(v);
    Tensor t(put(h.data(), h.size() * 2, offset), DType::F16, Device::CUDA, dims);
    REQUIRE(size_t(t.numel()) == v.size());
    return t;
  }
  Tensor f32(const std::vector<float>& v, std::initializer_list<int64_t> dims) {
    Tensor t(put(v.data(), v.size() * 4), DType::F32, Device::CUDA, dims);
    REQUIRE(size_t(t.numel()) == v.size());
    return t;
  }
  Tensor poisoned(DType dt, std::initializer_list<int64_t> dims, size_t offset = 0) {
    Tensor t(nullptr, dt, Device::CUDA, dims);
    t.data = put(nullptr, t.nbytes(), offset);
    return t;
  }
  Tensor i32(const std::vector<int32_t>& v) {
    return Tensor(put(v.data(), v.size() * 4), DType::I32, Device::CUDA, {int64_t(v.size())});
  }
  // A quantized tensor holding `bytes` (or poisoned when null).
  Tensor quantized(const std::vector<uint8_t>* bytes, size_t nbytes, int bits, int group,
                   std::initializer_list<int64_t> dims, size_t offset = 0) {
    Tensor t = Tensor::quantized(nullptr, qdtype(bits), group, Device::CUDA, dims);
    REQUIRE(t.nbytes() == nbytes);
    t.data = put(bytes ? bytes->data() : nullptr, nbytes, offset);
    return t;
  }
  std::vector<uint8_t> bytes(const void* p, size_t n) {
    std::vector<uint8_t> v(n);
    be->copy_to_host(v.data(), p, n);
    return v;
  }
  std::vector<float> read(const Tensor& t) {
    std::vector<float> v(size_t(t.numel()));
    be->copy_to_host_f32(t, v.data());
    return v;
  }
};

// Byte-for-byte equality, reporting the count and the first difference.
void expect_same_bytes(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, const std::string& what) {
  REQUIRE(got.size() == want.size());
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i] && bad++ == 0) first = i;
  INFO(what << ": " << bad << " of " << got.size() << " bytes differ; first at " << first << ": got "
            << (bad ? int(got[first]) : 0) << ", want " << (bad ? int(want[first]) : 0));
  CHECK(bad == 0);
}

// |got - want| <= tol[i] everywhere; NaN (a poisoned, unwritten element) never passes.
void expect_within(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& tol,
                   const std::string& what) {
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
// both signs (row 4) and a non-positive row whose maximum is a zero (row 5).
void add_special_rows(std::vector<float>& x, int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> pos(0.25f, 2.0f);
  for (int64_t i = 0; i < n; ++i) {
    const auto at = [&](int64_t r) -> float& { return x[size_t(r * n + i)]; };
    at(1) = i % 5 == 0 ? -0.0f : i % 5 == 2 ? 0.0f : round_f16(pos(rng));
    at(2) = i % 5 == 0 ? 0.0f : i % 5 == 2 ? -0.0f : round_f16(pos(rng));
    at(3) = 0.75f;
    at(4) = i % 2 == 0 ? -0.0f : 0.0f;
    at(5) = i % 3 == 0 ? (i % 2 == 0 ? -0.0f : 0.0f) : -round_f16(pos(rng));
  }
}

}  // namespace

TEST_CASE("cuda: quantize/dequantize equal the host reference for any row length", "[cuda][quant]") {
  STRATA_REQUIRE_GPU();
  Gpu g;
  std::mt19937 rng(21);
  const int64_t rows = 6;
  for (int bits : {4, 8})
    for (int group : {32, 64, 128})
      for (int64_t n : {1, 16, 20, 33, 64, 72, 120, 128, 200, 4097})
        for (bool f32 : {false, true}) {
          const quant::QuantSpec spec = spec_of(bits, group);
          const std::string what = label(f32 ? "f32 bits group n" : "f16 bits group n", {bits, group, n});
          INFO(what);
          g.keep.clear();
          std::vector<float> x = random_floats(size_t(rows * n), rng, -3.0f, 3.0f, !f32);
          add_special_rows(x, n, rng);
          const size_t row_bytes = quant::row_bytes(spec, n), qbytes = size_t(rows) * row_bytes;

          // Quantize: the GPU's bytes, padding included, equal the host's (over a poisoned buffer).
          std::vector<uint8_t> want(qbytes);
          const std::vector<uint16_t> xh = to_half(x);
          quant::quantize_rows(spec, f32 ? static_cast<const void*>(x.data()) : xh.data(), f32 ? DType::F32 : DType::F16,
                               rows, n, want.data());
          void* q = g.put(nullptr, qbytes);
          g.be->quantize_rows(spec, f32 ? g.f32(x, {rows, n}) : g.f16(x, {rows, n}), q);
          expect_same_bytes(g.bytes(q, qbytes), want, "quantize " + what);

          // Dequantize the host's bytes: values equal the host's bit for bit, also at an output
          // address that rules out vector stores.
          const DType out_dt = f32 ? DType::F32 : DType::F16;
          const size_t out_bytes = size_t(rows * n) * dtype_size(out_dt);
          std::vector<uint8_t> back(out_bytes);
          quant::dequantize_rows(spec, want.data(), rows, n, back.data(), out_dt);
          void* qd = g.put(want.data(), qbytes);
          for (size_t offset : {size_t(0), dtype_size(out_dt)}) {
            const Tensor out = g.poisoned(out_dt, {rows, n}, offset);
            g.be->dequantize_rows(spec, qd, out);
            expect_same_bytes(g.bytes(out.data, out_bytes), back, "dequantize " + what + " offset " + std::to_string(offset));
          }
        }
}

namespace {

// y = x @ dequant(w)^T + bias on the GPU against double arithmetic over the host's dequantized
// weights and the fp16 x. Error bound per output (all worst-case, so no flakiness):
//  - fp16 output rounding: 2^-11 |y|, plus 2^-24 for fp16's subnormal step;
//  - fp32 arithmetic: each lane sums in/32 products in sequence, then 5 shuffle levels; the
//    kernel's dequantization (one FMA) differs from the reference's (product rounded, then the
//    add) by at most 2 ulp of |code * scale| + |w| <= 2 (|w| + |min|). So the error is at most
//    (in/32 + 8) * 2^-24 * sum |x| (|w| + |min|); we allow twice that.
// A lost element costs |x w| ~ sum / in, far above the (in/16 + 16) * 2^-24 * sum allowed.
void check_quant_linear(Gpu& g, const quant::QuantSpec& spec, int64_t T, int64_t out, int64_t in, bool with_bias,
                        size_t w_offset, size_t x_offset, std::mt19937& rng) {
  g.keep.clear();
  std::vector<float> w = random_floats(size_t(out * in), rng, -1.0f, 1.0f, false);
  for (int64_t o = 0; o < out; o += 3)  // rows far from zero: the minimum term dominates
    for (int64_t i = 0; i < in; ++i) w[size_t(o * in + i)] += 2.0f;
  const size_t row_bytes = quant::row_bytes(spec, in);
  std::vector<uint8_t> wq(size_t(out) * row_bytes);
  quant::quantize_rows(spec, w.data(), DType::F32, out, in, wq.data());
  std::vector<float> wd(w.size());
  quant::dequantize_rows(spec, wq.data(), out, in, wd.data(), DType::F32);
  const std::vector<float> x = random_floats(size_t(T * in), rng, -1.0f, 1.0f, true);
  const std::vector<float> bias = with_bias ? random_floats(size_t(out), rng, -1.0f, 1.0f, true) : std::vector<float>();

  std::vector<double> want(size_t(T * out)), tol(want.size());
  for (int64_t o = 0; o < out; ++o) {
    const uint8_t* row = wq.data() + size_t(o) * row_bytes;
    std::vector<double> mag_w(static_cast<size_t>(in));
    for (int64_t i = 0; i < in; ++i)
      mag_w[size_t(i)] = std::fabs(double(wd[size_t(o * in + i)])) +
                         std::fabs(double(row_group_min(spec, row, in, i / spec.group_size)));
    for (int64_t t = 0; t < T; ++t) {
      double sum = with_bias ? double(bias[size_t(o)]) : 0.0, mag = std::fabs(sum);
      for (int64_t i = 0; i < in; ++i) {
        const double xi = x[size_t(t * in + i)];
        sum += xi * double(wd[size_t(o * in + i)]);
        mag += std::fabs(xi) * mag_w[size_t(i)];
      }
      want[size_t(t * out + o)] = sum;
      tol[size_t(t * out + o)] = kHalfUlp16 * std::fabs(sum) + double(in / 16 + 16) * kUlp32 * mag + kUlp32;
    }
  }

  const Tensor gw = g.quantized(&wq, wq.size(), spec.bits, spec.group_size, {out, in}, w_offset);
  const Tensor gx = g.f16(x, {T, in}, x_offset);
  const Tensor gb = with_bias ? g.f16(bias, {out}) : Tensor();
  const Tensor gy = g.poisoned(DType::F16, {T, out});
  g.be->linear(gx, gw, gb, gy);
  expect_within(g.read(gy), want, tol,
                label("linear bits group T out in bias w_offset x_offset",
                      {spec.bits, spec.group_size, T, out, in, with_bias, int64_t(w_offset), int64_t(x_offset)}));
}

}  // namespace

TEST_CASE("cuda: fused dequant linear matches double arithmetic over the reference's weights", "[cuda][quant]") {
  STRATA_REQUIRE_GPU();
  Gpu g;
  std::mt19937 rng(22);
  CHECK(g.be->fused_dequant_max_tokens() >= 1);
  const std::vector<std::pair<int64_t, int64_t>> shapes{{37, 72}, {64, 200}, {29, 120}, {300, 1000}, {96, 4096}};
  for (int bits : {4, 8})
    for (int group : {32, 64, 128})
      for (auto [out, in] : shapes)
        for (int64_t T : {1, 7, 16, 33})
          check_quant_linear(g, spec_of(bits, group), T, out, in, T % 2 == 1, 0, 0, rng);
  // Views that rule out the vector loads: w 4-byte aligned only, x 2-byte aligned only.
  for (int bits : {4, 8})
    for (int64_t T : {1, 3, 16, 17}) {
      check_quant_linear(g, spec_of(bits, 64), T, 45, 1024, true, 4, 2, rng);
      check_quant_linear(g, spec_of(bits, 32), T, 45, 264, false, 4, 0, rng);
    }
  // Token counts between the kernel's token slots (2, 4, 8) and a long row of many tiles.
  for (int64_t T : {2, 3, 5, 12})
    check_quant_linear(g, spec_of(4, 128), T, 70, 520, true, 0, 0, rng);
  check_quant_linear(g, spec_of(4, 64), 4, 33, 11008, false, 0, 0, rng);
}

TEST_CASE("cuda: kv_store quantizes cache rows as the host reference does", "[cuda][quant]") {
  STRATA_REQUIRE_GPU();
  Gpu g;
  std::mt19937 rng(23);
  const int64_t S = 3, C = 5;
  // (slot, position) per token; the last two are out of range and must write nothing.
  const std::vector<int32_t> slots{0, 2, 1, 0, 2, 3, 1}, pos{0, 4, 2, 4, 0, 1, 5};
  const int64_t T = int64_t(slots.size());
  for (int bits : {4, 8})
    for (int group : {32, 64, 128})
      for (int64_t d : {20, 16, 33, 64, 128})
        for (int64_t kv_heads : {1, 3}) {
          const quant::QuantSpec spec = spec_of(bits, group);
          const std::string what = label("kv_store bits group d kv_heads", {bits, group, d, kv_heads});
          INFO(what);
          g.keep.clear();
          std::vector<float> k = random_floats(size_t(T * kv_heads * d), rng, -2.0f, 2.0f, true);
          std::vector<float> v = random_floats(size_t(T * kv_heads * d), rng, -2.0f, 2.0f, true);
          for (int64_t i = 0; i < d; ++i) {
            k[size_t(i)] = i % 4 == 0 ? -0.0f : i % 4 == 1 ? 0.0f : std::fabs(k[size_t(i)]);  // a zero minimum
            v[size_t(kv_heads * d + i)] = 0.375f;                                            // a constant row
          }
          const size_t row_bytes = quant::row_bytes(spec, d), cache_bytes = size_t(S * C * kv_heads) * row_bytes;

          // Expected: the poison everywhere but the rows of in-range tokens, quantized by the host.
          std::vector<uint8_t> want_k(cache_bytes, 0xFF), want_v(cache_bytes, 0xFF);
          const std::vector<uint16_t> kh = to_half(k), vh = to_half(v);
          for (int64_t t = 0; t < T; ++t) {
            if (slots[size_t(t)] >= S || pos[size_t(t)] >= C) continue;
            for (int64_t h = 0; h < kv_heads; ++h) {
              const size_t src = size_t((t * kv_heads + h) * d);
              const size_t dst = size_t((slots[size_t(t)] * C + pos[size_t(t)]) * kv_heads + h) * row_bytes;
              quant::quantize_rows(spec, kh.data() + src, DType::F16, 1, d, want_k.data() + dst);
              quant::quantize_rows(spec, vh.data() + src, DType::F16, 1, d, want_v.data() + dst);
            }
          }

          const Tensor ck = g.quantized(nullptr, cache_bytes, bits, group, {S, C, kv_heads, d});
          const Tensor cv = g.quantized(nullptr, cache_bytes, bits, group, {S, C, kv_heads, d});
          g.be->kv_store(g.f16(k, {T, kv_heads, d}), g.f16(v, {T, kv_heads, d}), ck, cv, g.i32(slots), g.i32(pos));
          expect_same_bytes(g.bytes(ck.data, cache_bytes), want_k, what + " keys");
          expect_same_bytes(g.bytes(cv.data, cache_bytes), want_v, what + " values");
        }
}

namespace {

// Attention over a quantized cache on the GPU against double arithmetic over the host's
// dequantized cache (the kernel dequantizes by the same fp32 formula, so keys and values are the
// same numbers). Error bound per output element o_i = sum_j p_j v_ji (worst case):
//  - fp16 output rounding: 2^-11 |o_i| + 2^-24;
//  - a score s_j is off by at most ds = (d + 16) 2^-24 (scale sum_i |q_i k_ji| + 2 max |s|) (the
//    scaled query's rounding, the fp32 dot product, the subtraction of the running max); each
//    weight then by ds plus a few ulp per exp and per tile rescale, the normalization by as
//    much again, and the sums over n keys by n ulp: |error| <= (2 ds + (n + 64) 2^-22) sum_j p_j |v_ji|.
//    We allow 4 ds + (n + 256) 2^-21.
void check_quant_attention(Gpu& g, const quant::QuantSpec& spec, int64_t T, int64_t heads, int64_t kv_heads, int64_t d,
                           int64_t S, int64_t C, const std::vector<int32_t>& slots, const std::vector<int32_t>& pos,
                           float q_range, std::mt19937& rng) {
  g.keep.clear();
  const int64_t rows = S * C * kv_heads;
  const std::vector<float> ck = random_floats(size_t(rows * d), rng, -1.0f, 1.0f, false);
  const std::vector<float> cv = random_floats(size_t(rows * d), rng, -1.0f, 1.0f, false);
  const size_t cache_bytes = size_t(rows) * quant::row_bytes(spec, d);
  std::vector<uint8_t> kq(cache_bytes), vq(cache_bytes);
  quant::quantize_rows(spec, ck.data(), DType::F32, rows, d, kq.data());
  quant::quantize_rows(spec, cv.data(), DType::F32, rows, d, vq.data());
  std::vector<float> kd(ck.size()), vd(cv.size());
  quant::dequantize_rows(spec, kq.data(), rows, d, kd.data(), DType::F32);
  quant::dequantize_rows(spec, vq.data(), rows, d, vd.data(), DType::F32);
  const std::vector<float> q = random_floats(size_t(T * heads * d), rng, -q_range, q_range, true);
  const double scale = double(1.0f / std::sqrt(float(d)));

  std::vector<double> want(q.size()), tol(q.size());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t kvh = h / (heads / kv_heads), n = pos[size_t(t)] + 1;
      const auto at = [&](int64_t j, int64_t i) { return size_t(((slots[size_t(t)] * C + j) * kv_heads + kvh) * d + i); };
      const float* qt = q.data() + (t * heads + h) * d;
      std::vector<double> s(static_cast<size_t>(n)), p(static_cast<size_t>(n));
      double s_max = -INFINITY, s_abs = 0, qk_abs = 0, denom = 0;
      for (int64_t j = 0; j < n; ++j) {
        double dot = 0, mag = 0;
        for (int64_t i = 0; i < d; ++i) {
          dot += double(qt[i]) * kd[at(j, i)];
          mag += std::fabs(double(qt[i]) * kd[at(j, i)]);
        }
        s[size_t(j)] = dot * scale;
        s_max = std::max(s_max, s[size_t(j)]);
        s_abs = std::max(s_abs, std::fabs(s[size_t(j)]));
        qk_abs = std::max(qk_abs, mag * scale);
      }
      for (int64_t j = 0; j < n; ++j) denom += p[size_t(j)] = std::exp(s[size_t(j)] - s_max);
      const double ds = double(d + 16) * kUlp32 * (qk_abs + 2 * s_abs);
      const double eps = 4 * ds + double(n + 256) * std::ldexp(1.0, -21);
      for (int64_t i = 0; i < d; ++i) {
        double o = 0, mag = 0;
        for (int64_t j = 0; j < n; ++j) {
          o += p[size_t(j)] / denom * vd[at(j, i)];
          mag += p[size_t(j)] / denom * std::fabs(double(vd[at(j, i)]));
        }
        const size_t k = size_t((t * heads + h) * d + i);
        want[k] = o;
        tol[k] = kHalfUlp16 * std::fabs(o) + eps * mag + kUlp32;
      }
    }

  const Tensor gk = g.quantized(&kq, cache_bytes, spec.bits, spec.group_size, {S, C, kv_heads, d});
  const Tensor gv = g.quantized(&vq, cache_bytes, spec.bits, spec.group_size, {S, C, kv_heads, d});
  const Tensor out = g.poisoned(DType::F16, {T, heads, d});
  g.be->attention(g.f16(q, {T, heads, d}), gk, gv, g.i32(slots), g.i32(pos), float(scale), out);
  expect_within(g.read(out), want, tol,
                label("attention bits group T heads kv_heads d C",
                      {spec.bits, spec.group_size, T, heads, kv_heads, d, C}));
}

}  // namespace

TEST_CASE("cuda: attention over quantized caches matches double arithmetic over the dequantized cache",
          "[cuda][quant]") {
  STRATA_REQUIRE_GPU();
  Gpu g;
  std::mt19937 rng(24);
  const int64_t S = 2, C = 150;
  // A single key, a whole 64-key tile, one key past it, the whole cache, and a random position.
  const std::vector<int32_t> slots{1, 0, 1, 0, 1}, pos{0, 63, 64, int32_t(C - 1), 101};
  for (int bits : {4, 8})
    for (int group : {32, 64, 128})
      for (auto [heads, kv_heads] : std::vector<std::pair<int64_t, int64_t>>{{6, 2}, {4, 1}, {8, 8}})
        for (int64_t d : {20, 16, 64, 128}) {
          check_quant_attention(g, spec_of(bits, group), 5, heads, kv_heads, d, S, C, slots, pos, 1.0f, rng);
          check_quant_attention(g, spec_of(bits, group), 1, heads, kv_heads, d, S, C, {0}, {77}, 1.0f, rng);
        }
  // The largest head dim (64 code words a row at 8 bits), an odd one, peaked scores, a long context.
  for (int bits : {4, 8}) {
    check_quant_attention(g, spec_of(bits, 64), 3, 4, 2, 256, 2, 130, {0, 1, 1}, {129, 64, 0}, 1.0f, rng);
    check_quant_attention(g, spec_of(bits, 32), 3, 4, 2, 33, 2, 130, {1, 0, 1}, {129, 65, 7}, 1.0f, rng);
    check_quant_attention(g, spec_of(bits, 128), 2, 4, 4, 64, 1, 1000, {0, 0}, {999, 500}, 8.0f, rng);
  }
}

TEST_CASE("cuda: quantized ops refuse bad tensors, naming them", "[cuda][quant]") {
  STRATA_REQUIRE_GPU();
  Gpu g;
  const quant::QuantSpec spec = spec_of(4, 32);
  const size_t rb = quant::row_bytes(spec, 64);
  // A quantized buffer must be 4-byte aligned.
  CHECK_THROWS_AS(g.be->quantize_rows(spec, g.f16(std::vector<float>(64, 1.0f), {1, 64}), g.put(nullptr, rb, 2)),
                  Error);
  const Tensor w = g.quantized(nullptr, 8 * rb, 4, 32, {8, 64}, 2);
  CHECK_THROWS_AS(g.be->linear(g.f16(std::vector<float>(64, 1.0f), {1, 64}), w, Tensor(), g.poisoned(DType::F16, {1, 8})),
                  Error);
  // Caches quantized alike, head dims up to 256.
  const Tensor k4 = g.quantized(nullptr, 4 * rb, 4, 32, {1, 2, 2, 64});
  const Tensor k8 = g.quantized(nullptr, 4 * quant::row_bytes(spec_of(8, 32), 64), 8, 32, {1, 2, 2, 64});
  const Tensor q = g.f16(std::vector<float>(4 * 64, 0.5f), {1, 4, 64});
  const Tensor one = g.i32({0});
  CHECK_THROWS_AS(g.be->attention(q, k4, k8, one, one, 1.0f, g.poisoned(DType::F16, {1, 4, 64})), Error);
  const Tensor k_f16 = g.poisoned(DType::F16, {1, 2, 2, 64});
  CHECK_THROWS_AS(g.be->kv_store(g.f16(std::vector<float>(128, 0.5f), {1, 2, 64}),
                                 g.f16(std::vector<float>(128, 0.5f), {1, 2, 64}), k_f16, k4, one, one),
                  Error);
  const size_t rb288 = quant::row_bytes(spec, 288);
  const Tensor big = g.quantized(nullptr, rb288, 4, 32, {1, 1, 1, 288});
  CHECK_THROWS_AS(g.be->attention(g.f16(std::vector<float>(288, 0.5f), {1, 1, 288}), big, big, one, one, 1.0f,
                                  g.poisoned(DType::F16, {1, 1, 288})),
                  Error);
}
