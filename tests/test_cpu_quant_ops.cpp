// The CPU backend's ops over group-wise quantized tensors (Q4/Q8): the fused linear that reads a
// weight's codes, kv_store into a quantized cache and attention over it. Prefill attention, and the
// linear over many tokens or rows whose codes are not read in place, are compared with the same op
// over fp32 data the host reference (quant::dequantize_rows, itself checked against numpy in
// test_quant.cpp) produced: they compute over exactly the reference's values. Decode attention and
// the linear over a few tokens read the codes in factored form (s (q . c) + m sum q, cpu_quant.h),
// which rounds differently: they are held to double arithmetic over the exact values c s + m
// within a worst-case bound.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_quant.h"
#include "backend/cpu/cpu_simd.h"
#include "kernel_test_support.h"
#include "quant_kernel_cases.h"
#include "strata/backend/backend.h"
#include "strata/core/dtype.h"
#include "strata/quant/quant.h"

using namespace strata;
using test::spec_of;
using test::to_half;

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

// A quantized tensor's elements as exact values c s + m in double, each with the magnitude
// |c s| + |m| that bounds what a factored sum over it can lose (quant.h's layout: codes in 4-byte
// words, then the fp16 scales, then the fp16 minimums).
std::vector<std::array<double, 2>> exact_values(const quant::QuantSpec& spec, const std::vector<uint8_t>& rows, int64_t n) {
  const size_t row_bytes = quant::row_bytes(spec, n), code_bytes = (size_t(n) * size_t(spec.bits) + 31) / 32 * 4;
  const int64_t groups = (n + spec.group_size - 1) / spec.group_size;
  std::vector<std::array<double, 2>> out;
  for (size_t at = 0; at < rows.size(); at += row_bytes) {
    const uint8_t* row = rows.data() + at;
    auto half_at = [&](int64_t k) {
      uint16_t h;
      std::memcpy(&h, row + code_bytes + 2 * size_t(k), 2);
      return double(half_to_float(h));
    };
    for (int64_t i = 0; i < n; ++i) {
      const int64_t g = i / spec.group_size;
      const unsigned c = spec.bits == 8 ? row[i] : (i % 2 == 0 ? row[i / 2] & 0xfu : unsigned(row[i / 2]) >> 4);
      const double cs = double(c) * half_at(g), m = half_at(groups + g);
      out.push_back({cs + m, std::fabs(cs) + std::fabs(m)});
    }
  }
  return out;
}

// Decode attention over quantized caches k, v ([S, C, kv_heads] rows of d) in double over their
// exact values, with quant_kernel_cases.h's worst-case bound (a score summed per group as
// s_g (q . c) + m_g (sum of q) loses at most ulps of sum_i |q_i| (|c_i s| + |m|), a value row
// summed as codes and minimums apart likewise), for outputs rounded to `out_rel` (relative).
struct DecodeReference {
  std::vector<double> want, tol;
};
DecodeReference decode_reference(const quant::QuantSpec& spec, const std::vector<uint8_t>& k, const std::vector<uint8_t>& v,
                                 const std::vector<float>& q, int64_t heads, int64_t kv_heads, int64_t d, int64_t C,
                                 const std::vector<int32_t>& slots, const std::vector<int32_t>& pos, double scale,
                                 double out_rel, int window = 0, double softcap = 0,
                                 const std::vector<float>& sinks = {}) {
  const std::vector<std::array<double, 2>> kx = exact_values(spec, k, d), vx = exact_values(spec, v, d);
  DecodeReference r;
  r.want.resize(q.size());
  r.tol.resize(q.size());
  for (size_t t = 0; t < slots.size(); ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t kvh = h / (heads / kv_heads);
      const auto element = [&](const std::vector<std::array<double, 2>>& x) {
        return [&x, &slots, t, kvh, C, kv_heads, d](int64_t j, int64_t i) {
          return x[size_t(((int64_t(slots[t]) * C + j) * kv_heads + kvh) * d + i)];
        };
      };
      const size_t at = size_t((int64_t(t) * heads + h) * d);
      const int64_t n = pos[t] + 1, first = window > 0 ? std::max<int64_t>(0, n - window) : 0;
      test::attention_row_reference(q.data() + at, n, d, scale, element(kx), element(vx), out_rel, r.want.data() + at,
                                    r.tol.data() + at, first, softcap, sinks.empty() ? nullptr : &sinks[size_t(h)]);
    }
  return r;
}

// |got - want| <= tol everywhere (NaN never passes), reporting the worst error against its bound.
void expect_within(const std::vector<float>& got, const DecodeReference& r) {
  REQUIRE(got.size() == r.want.size());
  size_t bad = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - r.want[i]);
    worst = std::max(worst, err / r.tol[i]);
    if (!(err <= r.tol[i])) ++bad;
  }
  INFO(bad << " of " << got.size() << " elements off; worst error " << worst << " x the bound");
  CHECK(bad == 0);
}

// A linear over quantized weights in double: bias + x . (c s + m) over the exact values, with the
// worst-case bound of any fp32 summation order, (in + 16) 2^-24 (|bias| + sum |x| (|c s| + |m|)):
// no term passes through more than in + 16 roundings (lane sums, scales, the group and minimum
// sums, the reduction, the bias).
void expect_linear_of_exact_values(const quant::QuantSpec& s, const std::vector<uint8_t>& codes,
                                   const std::vector<float>& x, const std::vector<float>& bias, int64_t T,
                                   int64_t out, int64_t in, const std::vector<float>& got) {
  const std::vector<std::array<double, 2>> w = exact_values(s, codes, in);
  int far = 0;
  double worst = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double ref = bias[size_t(o)], mag = std::fabs(ref);
      for (int64_t i = 0; i < in; ++i) {
        const double xi = x[size_t(t * in + i)];
        ref += xi * w[size_t(o * in + i)][0];
        mag += std::fabs(xi) * w[size_t(o * in + i)][1];
      }
      const double err = std::fabs(got[size_t(t * out + o)] - ref), tol = double(in + 16) * test::kUlp32 * mag;
      worst = std::max(worst, err / tol);
      if (!(err <= tol)) ++far;
    }
  INFO(far << " outputs off; worst error " << worst << " x the bound");
  CHECK(far == 0);
}

// A linear over the reference's dequantized fp32 values, summed in any order (sgemv, sgemm): within
// 1e-5 of the magnitude sum of a double reference (NaN never passes).
void expect_linear_of_values(const std::vector<float>& values, const std::vector<float>& x,
                             const std::vector<float>& bias, int64_t T, int64_t out, int64_t in,
                             const std::vector<float>& got) {
  int far = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double ref = bias[size_t(o)], mag = std::fabs(bias[size_t(o)]);
      for (int64_t i = 0; i < in; ++i) {
        const double term = double(x[size_t(t * in + i)]) * double(values[size_t(o * in + i)]);
        ref += term;
        mag += std::fabs(term);
      }
      if (!(std::fabs(got[size_t(t * out + o)] - ref) <= 1e-5 * mag)) ++far;
    }
  INFO(far << " outputs off");
  CHECK(far == 0);
}

}  // namespace

TEST_CASE("cpu: a linear over quantized weights computes over the values the reference describes", "[quant][cpu_attention]") {
  auto be = make_cpu_backend(2);
  const int64_t fused = be->fused_dequant_max_tokens();
  // The cost model prices the CUDA backend's limit (quant.h); the CPU backend's is the same.
  REQUIRE(fused == quant::kCudaFusedDequantMaxTokens);
  std::mt19937 rng(11);
  // Awkward sizes (the tiny test models') leave a shorter last group, and rows whose codes are not
  // read in place (cpu_quant.h: n a multiple of 16); 256 is whole groups, read as codes.
  for (int64_t in : {72, 200, 256})
    for (int bits : {4, 8})
      for (int group : {32, 64, 128}) {
        const quant::QuantSpec s = spec_of(bits, group);
        const int64_t out = 37;
        std::vector<float> w = normal(size_t(out * in), rng, 0.2f), bias = normal(size_t(out), rng);
        for (int64_t i = 0; i < in; ++i) w[size_t(5 * in + i)] += 3.0f;  // a row whose minimums dominate
        Quantized q = quantize(s, w, out, in);
        const Tensor wq = Tensor::quantized(q.codes.data(), quant::dtype_of(s), group, Device::CPU, {out, in});
        REQUIRE(wq.nbytes() == q.codes.size());
        for (int64_t T : {int64_t(1), int64_t(3), int64_t(6), fused, fused + 17}) {
          INFO("in " << in << ", " << bits << "-bit g" << group << ", T " << T);
          std::vector<float> x = normal(size_t(T * in), rng), got(size_t(T * out), NAN), want(size_t(T * out), NAN);
          be->linear(f32(x, {T, in}), wq, f32(bias, {out}), f32(got, {T, out}));
          if (T <= fused && cpu::codes_row_ok(group, in)) {
            // Read as codes in factored form: rounded otherwise than the dequantized values.
            expect_linear_of_exact_values(s, q.codes, x, bias, T, out, in, got);
            continue;
          }
          be->linear(f32(x, {T, in}), f32(q.values, {out, in}), f32(bias, {out}), f32(want, {T, out}));
          if (T > 1 && T <= 8) {
            // Both stream each (dequantized) weight row through the same dot product: equal to the bit.
            CHECK(got == want);
          } else {  // sgemv / sgemm sum in another order: within fp32 rounding of a double reference
            expect_linear_of_values(q.values, x, bias, T, out, in, got);
          }
        }
      }
}

TEST_CASE("cpu: a quantized linear over many tokens runs sgemm over blocks of dequantized rows", "[quant]") {
  // Beyond 24 tokens (cpu_linear.h, kCodesMaxTokens) the CPU backend dequantizes about
  // 16 MB of rows at a time (4M values: 1024 rows of 4096), so 1100 rows take two blocks, the
  // second partial; a second call reuses the first's buffer.
  auto be = make_cpu_backend(2);
  std::mt19937 rng(12);
  const int64_t in = 4096, out = 1100;
  for (int bits : {4, 8}) {
    const quant::QuantSpec s = spec_of(bits, 64);
    std::vector<float> w = normal(size_t(out * in), rng, 0.2f), bias = normal(size_t(out), rng);
    Quantized q = quantize(s, w, out, in);
    const Tensor wq = Tensor::quantized(q.codes.data(), quant::dtype_of(s), 64, Device::CPU, {out, in});
    for (int64_t T : {25, 40}) {
      INFO(bits << "-bit g64, T " << T);
      std::vector<float> x = normal(size_t(T * in), rng), got(size_t(T * out), NAN);
      be->linear(f32(x, {T, in}), wq, f32(bias, {out}), f32(got, {T, out}));
      expect_linear_of_values(q.values, x, bias, T, out, in, got);
    }
  }
}

TEST_CASE("cpu: linears from two threads at once, over fp32 weights and over codes, give each thread's results", "[quant]") {
  // Where the CPU backend stands in for the GPU, the engine's compute and its CPU lane (experts
  // computed on the CPU) call linear at the same time; their BLAS calls take turns (cpu_backend.cpp).
  std::mt19937 rng(13);
  const int64_t in = 512, out = 300, T = 40;
  std::vector<float> w = normal(size_t(out * in), rng, 0.2f), bias = normal(size_t(out), rng);
  Quantized q = quantize(spec_of(4, 64), w, out, in);
  const Tensor wq = Tensor::quantized(q.codes.data(), quant::dtype_of(spec_of(4, 64)), 64, Device::CPU, {out, in});
  const Tensor wf = f32(w, {out, in});
  std::vector<float> x = normal(size_t(T * in), rng);
  const auto run = [&](Backend& be, const Tensor& weights) {
    std::vector<float> y(size_t(T * out), NAN);
    be.linear(f32(x, {T, in}), weights, f32(bias, {out}), f32(y, {T, out}));
    return y;
  };
  auto first = make_cpu_backend(2), second = make_cpu_backend(2);
  const std::vector<float> want_f = run(*first, wf), want_q = run(*first, wq);
  expect_linear_of_values(w, x, bias, T, out, in, want_f);
  expect_linear_of_values(q.values, x, bias, T, out, in, want_q);
  int differ = 0;
  std::thread other([&] {
    for (int i = 0; i < 30; ++i) differ += run(*second, i % 2 ? wq : wf) != (i % 2 ? want_q : want_f);
  });
  int differ_here = 0;
  for (int i = 0; i < 30; ++i) differ_here += run(*first, i % 2 ? wf : wq) != (i % 2 ? want_f : want_q);
  other.join();
  CHECK(differ == 0);
  CHECK(differ_here == 0);
}

TEST_CASE("cpu: linears over few tokens share one parallel region and give each job what linear() gives it",
          "[quant][moe]") {
  // Backend::linears (a step's active experts): the CPU backend runs the jobs that linear() would
  // stream (up to 8 tokens over fp32 and 16-bit weights but a single fp32 token, up to 24 over
  // codes) in one parallel region, in units of rows that never span two jobs; the others, one
  // linear() each. Odd shapes, every weight type and both sides of each limit (a single token
  // over 16-bit rows, whose rows go in blocks), over 1 to 7 threads, with poisoned outputs.
  struct Case {
    DType dt;
    int bits, group;
    int64_t in, out, T;
  };
  const Case cases[] = {
      {DType::F32, 0, 0, 96, 37, 1},   {DType::F32, 0, 0, 130, 5, 3},   {DType::F32, 0, 0, 64, 200, 8},
      {DType::F32, 0, 0, 96, 41, 9},   {DType::F16, 0, 0, 128, 33, 2},  {DType::F16, 0, 0, 72, 19, 9},
      {DType::BF16, 0, 0, 100, 23, 5}, {DType::Q4, 4, 64, 256, 37, 1},  {DType::Q4, 4, 64, 256, 130, 24},
      {DType::Q4, 4, 64, 256, 29, 25}, {DType::Q8, 8, 32, 128, 61, 7},  {DType::Q4, 4, 32, 72, 13, 4},
      {DType::Q4, 4, 64, 512, 3, 2},   {DType::F16, 0, 0, 40, 7, 1},    {DType::BF16, 0, 0, 33, 4, 1},
  };
  std::mt19937 rng(14);
  struct Job {
    std::vector<float> x, values;  // the values the weight holds, exactly
    std::vector<float> w32;
    std::vector<uint16_t> w16;
    Quantized q;
    Tensor w;
  };
  std::vector<Job> jobs(std::size(cases));
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Case& c = cases[i];
    Job& j = jobs[i];
    j.x = normal(size_t(c.T * c.in), rng);
    const std::vector<float> w = normal(size_t(c.out * c.in), rng, 0.2f);
    if (c.bits) {
      j.q = quantize(spec_of(c.bits, c.group), w, c.out, c.in);
      j.values = j.q.values;
      j.w = Tensor::quantized(j.q.codes.data(), c.dt, c.group, Device::CPU, {c.out, c.in});
    } else if (c.dt == DType::F32) {
      j.w32 = j.values = w;
      j.w = f32(j.w32, {c.out, c.in});
    } else {
      j.w16 = test::to_bits(w, c.dt);
      for (uint16_t b : j.w16) j.values.push_back(c.dt == DType::BF16 ? bf16_to_float(b) : half_to_float(b));
      j.w = Tensor(j.w16.data(), c.dt, Device::CPU, {c.out, c.in});
    }
  }
  std::vector<std::vector<float>> one_thread;
  for (int threads : {1, 2, 3, 7}) {
    auto be = make_cpu_backend(threads);
    std::vector<std::vector<float>> got(jobs.size());
    std::vector<Backend::LinearJob> work;
    for (size_t i = 0; i < jobs.size(); ++i) {
      const Case& c = cases[i];
      got[i].assign(size_t(c.T * c.out), NAN);
      work.push_back({f32(jobs[i].x, {c.T, c.in}), jobs[i].w, f32(got[i], {c.T, c.out})});
    }
    be->linears(work);
    for (size_t i = 0; i < jobs.size(); ++i) {
      const Case& c = cases[i];
      INFO(threads << " threads, " << dtype_name(c.dt) << " [" << c.out << " x " << c.in << "], T " << c.T);
      const std::vector<float> zeros(size_t(c.out), 0.0f);
      if (c.bits && c.T <= 24 && cpu::codes_row_ok(c.group, c.in))
        expect_linear_of_exact_values(spec_of(c.bits, c.group), jobs[i].q.codes, jobs[i].x, zeros, c.T, c.out, c.in, got[i]);
      else
        expect_linear_of_values(jobs[i].values, jobs[i].x, zeros, c.T, c.out, c.in, got[i]);
      std::vector<float> want(size_t(c.T * c.out), NAN);
      be->linear(f32(jobs[i].x, {c.T, c.in}), jobs[i].w, Tensor(), f32(want, {c.T, c.out}));
      CHECK(got[i] == want);
    }
    if (one_thread.empty()) one_thread = got;
    else CHECK(got == one_thread);  // how the rows were shared changes no bit
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
        // tokens with kv_store (fp32, fp16 and bf16 inputs), at the last position of some slots and
        // over earlier positions of others.
        std::vector<float> k0 = normal(size_t(S * C * kvh * d), rng), v0 = normal(size_t(S * C * kvh * d), rng);
        Quantized kq = quantize(s, k0, S * C * kvh, d), vq = quantize(s, v0, S * C * kvh, d);
        const std::vector<int32_t> slots{0, 1, 2, 1, 0}, pos{8, 8, 3, 0, 5};
        std::vector<float> kn = normal(size_t(T * kvh * d), rng), vn = normal(size_t(T * kvh * d), rng);
        for (DType in_dt : {DType::F32, DType::F16, DType::BF16}) {
          std::vector<uint8_t> ck = kq.codes, cv = vq.codes;
          const Tensor cache_k = Tensor::quantized(ck.data(), quant::dtype_of(s), group, Device::CPU, {S, C, kvh, d});
          const Tensor cache_v = Tensor::quantized(cv.data(), quant::dtype_of(s), group, Device::CPU, {S, C, kvh, d});
          std::vector<uint16_t> kn16(kn.size()), vn16(vn.size());
          convert_elements(kn.data(), DType::F32, kn16.data(), in_dt == DType::F32 ? DType::F16 : in_dt, kn.size());
          convert_elements(vn.data(), DType::F32, vn16.data(), in_dt == DType::F32 ? DType::F16 : in_dt, vn.size());
          const Tensor k = in_dt == DType::F32 ? f32(kn, {T, kvh, d}) : Tensor(kn16.data(), in_dt, Device::CPU, {T, kvh, d});
          const Tensor v = in_dt == DType::F32 ? f32(vn, {T, kvh, d}) : Tensor(vn16.data(), in_dt, Device::CPU, {T, kvh, d});
          std::vector<int32_t> sl = slots, ps = pos;
          const Tensor st(sl.data(), DType::I32, Device::CPU, {T}), pt(ps.data(), DType::I32, Device::CPU, {T});
          be->kv_store(k, v, cache_k, cache_v, st, pt);

          // The bytes: every stored row is the reference's quantization of that (16-bit-rounded) row.
          std::vector<uint8_t> want_k = kq.codes, want_v = vq.codes;
          for (int64_t t = 0; t < T; ++t) {
            const size_t at = size_t((slots[size_t(t)] * C + pos[size_t(t)]) * kvh) * rb;
            quant::quantize_rows(s, k.ptr<char>() + size_t(t * kvh * d) * dtype_size(in_dt), in_dt, kvh, d, want_k.data() + at);
            quant::quantize_rows(s, v.ptr<char>() + size_t(t * kvh * d) * dtype_size(in_dt), in_dt, kvh, d, want_v.data() + at);
          }
          CHECK(ck == want_k);
          CHECK(cv == want_v);

          // Attention over the codes: double arithmetic over their exact values.
          std::vector<float> q = normal(size_t(T * heads * d), rng), got(q.size(), NAN);
          be->attention(f32(q, {T, heads, d}), cache_k, cache_v, st, pt, 0.3f, f32(got, {T, heads, d}));
          expect_within(got, decode_reference(s, ck, cv, q, heads, kvh, d, C, slots, pos, 0.3, test::kUlp32));
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

// Decode steps over long contexts (several key tiles, so the online softmax rescales the codes'
// sums and the minimums' sums between them): multi-head rows read packed, grouped-query rows
// widened once, head dims with a short last group (80 at group 64 or 128), a head dim that is not a
// multiple of 16 (dequantized by the reference formula instead), fp32, fp16 and bf16 queries, and
// peaked scores.
TEST_CASE("cpu: decode attention over quantized caches matches double arithmetic over the exact values",
          "[quant][cpu_attention]") {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(11);
  // Groups of 1, 2, 3, 4 and 6 queries (a block of 4 and one of 2); d 40 dequantizes instead.
  const std::array<int64_t, 3> shapes[] = {{4, 4, 64}, {4, 4, 128}, {8, 2, 128}, {6, 2, 80},
                                           {3, 3, 80}, {6, 1, 64},  {4, 2, 40}};
  for (const auto& sh : shapes)
    for (int bits : {4, 8})
      for (int group : {32, 64, 128})
        for (float q_range : {1.0f, 6.0f}) {
          const int64_t heads = sh[0], kvh = sh[1], d = sh[2], S = 3, C = 300;
          const quant::QuantSpec s = spec_of(bits, group);
          INFO("heads " << heads << "/" << kvh << ", d " << d << ", " << bits << "-bit g" << group << ", q in +-" << q_range);
          std::vector<uint8_t> ck(size_t(S * C * kvh) * quant::row_bytes(s, d)), cv(ck.size());
          const std::vector<float> k0 = test::random_floats(size_t(S * C * kvh * d), rng, -1.0f, 1.0f, false);
          const std::vector<float> v0 = test::random_floats(k0.size(), rng, -1.0f, 1.0f, false);
          quant::quantize_rows(s, k0.data(), DType::F32, S * C * kvh, d, ck.data());
          quant::quantize_rows(s, v0.data(), DType::F32, S * C * kvh, d, cv.data());
          const Tensor cache_k = Tensor::quantized(ck.data(), quant::dtype_of(s), group, Device::CPU, {S, C, kvh, d});
          const Tensor cache_v = Tensor::quantized(cv.data(), quant::dtype_of(s), group, Device::CPU, {S, C, kvh, d});
          // Tokens at positions in the first tile, at a tile's end and deep in; the last tile's
          // positions leave 0 to 3 past the blocks of four positions that codes are read in.
          std::vector<int32_t> slots{0, 1, 2, 1, 0}, pos{299, 63, 140, 5, 6};
          const int64_t T = int64_t(slots.size());
          const Tensor st(slots.data(), DType::I32, Device::CPU, {T}), pt(pos.data(), DType::I32, Device::CPU, {T});
          std::vector<float> q = test::random_floats(size_t(T * heads * d), rng, -q_range, q_range, true);
          const float scale = 1.0f / std::sqrt(float(d));
          std::vector<float> got(q.size(), NAN);
          be->attention(f32(q, {T, heads, d}), cache_k, cache_v, st, pt, scale, f32(got, {T, heads, d}));
          expect_within(got, decode_reference(s, ck, cv, q, heads, kvh, d, C, slots, pos, double(scale), test::kUlp32));

          std::vector<uint16_t> q16 = to_half(q), out16(q.size(), 0xFFFF);
          be->attention(Tensor(q16.data(), DType::F16, Device::CPU, {T, heads, d}), cache_k, cache_v, st, pt, scale,
                        Tensor(out16.data(), DType::F16, Device::CPU, {T, heads, d}));
          std::vector<float> got16(q.size());
          for (size_t i = 0; i < got16.size(); ++i) got16[i] = half_to_float(out16[i]);
          expect_within(got16, decode_reference(s, ck, cv, q, heads, kvh, d, C, slots, pos, double(scale), test::kHalfUlp16));

          // bf16 queries (q rounded to bf16) and outputs, rounded to nearest even (2^-8 relative).
          std::vector<uint16_t> qbf(q.size()), outbf(q.size(), 0xFFFF);
          std::vector<float> q_bf(q.size()), gotbf(q.size());
          for (size_t i = 0; i < q.size(); ++i) qbf[i] = float_to_bf16(q[i]), q_bf[i] = bf16_to_float(qbf[i]);
          be->attention(Tensor(qbf.data(), DType::BF16, Device::CPU, {T, heads, d}), cache_k, cache_v, st, pt, scale,
                        Tensor(outbf.data(), DType::BF16, Device::CPU, {T, heads, d}));
          for (size_t i = 0; i < gotbf.size(); ++i) gotbf[i] = bf16_to_float(outbf[i]);
          expect_within(gotbf, decode_reference(s, ck, cv, q_bf, heads, kvh, d, C, slots, pos, double(scale), 0x1p-8));
        }
}

// Gemma's sliding windows and soft caps, and GPT-OSS's sinks, over quantized caches: decode read
// as codes (and dequantized, d 40) against double arithmetic, and prefill runs against the same
// runs over the dequantized values.
TEST_CASE("cpu: sliding windows, soft caps and sinks over quantized caches", "[quant][cpu_attention]") {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(13);
  const std::vector<float> head_sinks{-1.5f, 0.5f, 3.0f, 40.0f, -40.0f, 1.0f};
  for (int64_t d : {64, 40})
    for (int bits : {4, 8})
      for (int window : {0, 1, 5, 64, 70})
        for (int variant : {0, 1, 2}) {  // plain, soft-capped, with sinks
          const float softcap = variant == 1 ? 2.0f : 0.0f;
          const std::vector<float> sinks = variant == 2 ? head_sinks : std::vector<float>();
          const int64_t heads = 6, kvh = 2, S = 3, C = 300;
          const quant::QuantSpec s = spec_of(bits, 32);
          INFO("d " << d << ", " << bits << "-bit, window " << window << ", softcap " << softcap << ", sinks "
                    << !sinks.empty());
          std::vector<uint8_t> ck(size_t(S * C * kvh) * quant::row_bytes(s, d)), cv(ck.size());
          const std::vector<float> k0 = test::random_floats(size_t(S * C * kvh * d), rng, -1.0f, 1.0f, false);
          const std::vector<float> v0 = test::random_floats(k0.size(), rng, -1.0f, 1.0f, false);
          quant::quantize_rows(s, k0.data(), DType::F32, S * C * kvh, d, ck.data());
          quant::quantize_rows(s, v0.data(), DType::F32, S * C * kvh, d, cv.data());
          const Tensor cache_k = Tensor::quantized(ck.data(), quant::dtype_of(s), 32, Device::CPU, {S, C, kvh, d});
          const Tensor cache_v = Tensor::quantized(cv.data(), quant::dtype_of(s), 32, Device::CPU, {S, C, kvh, d});
          AttentionSpec spec(1.0f / std::sqrt(float(d)), window, softcap);
          spec.sinks = sinks.empty() ? nullptr : sinks.data();
          std::vector<int32_t> slots{0, 1, 2, 1, 0}, pos{299, 63, 140, 5, 64};
          const int64_t T = int64_t(slots.size());
          const Tensor st(slots.data(), DType::I32, Device::CPU, {T}), pt(pos.data(), DType::I32, Device::CPU, {T});
          std::vector<float> q = test::random_floats(size_t(T * heads * d), rng, -6.0f, 6.0f, true);
          std::vector<float> got(q.size(), NAN);
          be->attention(f32(q, {T, heads, d}), cache_k, cache_v, st, pt, spec, f32(got, {T, heads, d}));
          expect_within(got, decode_reference(s, ck, cv, q, heads, kvh, d, C, slots, pos, double(spec.scale),
                                              test::kUlp32, window, double(softcap), sinks));

          std::vector<int32_t> sl, ps;  // two prefill runs
          for (int32_t p = 60; p < 150; ++p) sl.push_back(0), ps.push_back(p);
          for (int32_t p = 0; p < 70; ++p) sl.push_back(1), ps.push_back(p);
          const int64_t R = int64_t(sl.size());
          const Tensor rs(sl.data(), DType::I32, Device::CPU, {R}), rp(ps.data(), DType::I32, Device::CPU, {R});
          std::vector<float> fk(size_t(S * C * kvh * d)), fv(fk.size());
          quant::dequantize_rows(s, ck.data(), S * C * kvh, d, fk.data(), DType::F32);
          quant::dequantize_rows(s, cv.data(), S * C * kvh, d, fv.data(), DType::F32);
          std::vector<float> qr = test::random_floats(size_t(R * heads * d), rng, -6.0f, 6.0f, true);
          std::vector<float> coded(qr.size(), NAN), plain(qr.size(), NAN);
          be->attention(f32(qr, {R, heads, d}), cache_k, cache_v, rs, rp, spec, f32(coded, {R, heads, d}));
          be->attention(f32(qr, {R, heads, d}), f32(fk, {S, C, kvh, d}), f32(fv, {S, C, kvh, d}), rs, rp, spec,
                        f32(plain, {R, heads, d}));
          CHECK(coded == plain);
          CHECK(std::none_of(coded.begin(), coded.end(), [](float x) { return std::isnan(x); }));
        }
}

namespace {
// Calls f(queries, count, k0, r0) for every block shape (queries x count <= cpu::kBlock) at every
// place among kBlock queries and kBlock rows.
template <class F>
void for_each_block(F&& f) {
  for (int queries = 1; queries <= cpu::kBlock; ++queries)
    for (int count = 1; queries * count <= cpu::kBlock; ++count)
      for (int k0 = 0; k0 + queries <= cpu::kBlock; ++k0)
        for (int r0 = 0; r0 + count <= cpu::kBlock; ++r0) {
          INFO(queries << " queries from " << k0 << " x " << count << " rows from " << r0);
          f(queries, count, k0, r0);
        }
}

// `count` random rows of n values stored as T (fp32, fp16 or bf16), back to back, and their starts.
template <class T>
struct StoredRows {
  std::vector<T> data;
  std::vector<const T*> rows;
};
template <class T>
StoredRows<T> stored_rows(int count, int64_t n, std::mt19937& rng) {
  const std::vector<float> x = normal(size_t(count * n), rng);
  StoredRows<T> s{std::vector<T>(x.size()), {}};
  cpu::from_f32(x.data(), s.data.data(), int64_t(x.size()));
  for (int r = 0; r < count; ++r) s.rows.push_back(s.data.data() + r * n);
  return s;
}
template <class T>
const char* row_type() {
  return std::is_same_v<T, float> ? "fp32" : std::is_same_v<T, cpu::f16> ? "fp16" : "bf16";
}
// got is within fp32 rounding of the double dot product of q and row.
template <class T>
void check_near_double_dot(const float* q, const T* row, int64_t n, float got) {
  double want = 0, magnitude = 0;
  for (int64_t i = 0; i < n; ++i) {
    want += double(q[i]) * double(cpu::value_at(row, i));
    magnitude += std::fabs(double(q[i]) * double(cpu::value_at(row, i)));
  }
  CHECK(std::fabs(double(got) - want) <= double(n) * 0x1p-23 * magnitude);
}
}  // namespace

TEST_CASE("cpu: packed codes read in blocks give each (query, row) pair what it gets alone", "[quant][cpu_attention]") {
  std::mt19937 rng(5);
  constexpr int kN = cpu::kBlock;  // queries and rows to draw blocks from
  for (int bits : {4, 8})
    for (int group : {32, 64, 128})
      for (int64_t d : {64, 80, 128, 256}) {
        if (!cpu::codes_row_ok(group, d)) continue;
        INFO(bits << "-bit g" << group << ", d " << d);
        const quant::QuantSpec s = spec_of(bits, group);
        const size_t row_bytes = quant::row_bytes(s, d);
        const int64_t groups = (d + group - 1) / group;
        std::vector<uint8_t> codes(kN * row_bytes);
        const std::vector<float> x = normal(size_t(kN * d), rng);
        quant::quantize_rows(s, x.data(), DType::F32, kN, d, codes.data());
        const uint8_t* rows[kN];
        for (int r = 0; r < kN; ++r) rows[r] = codes.data() + size_t(r) * row_bytes;
        const std::vector<float> q = normal(size_t(kN * d), rng), q_sums = normal(size_t(kN * groups), rng);
        const std::vector<float> w = normal(kN * kN, rng);  // w[k kN + r]: query k's weight of row r
        const std::vector<float> y0 = normal(size_t(kN * d), rng), mins0 = normal(size_t(kN * groups), rng);
        for_each_block([&](int queries, int count, int k0, int r0) {
                float together[kN * kN];
                cpu::dot_packed_codes(q.data() + k0 * d, q_sums.data() + k0 * groups, queries, rows + r0, count, bits,
                                      group, d, together, kN);
                std::vector<float> y = y0, mins = mins0, y_alone = y0, mins_alone = mins0;
                cpu::axpy_packed_codes(w.data() + k0 * kN + r0, kN, queries, rows + r0, count, bits, group, d,
                                       y.data() + k0 * d, mins.data() + k0 * groups);
                for (int k = k0; k < k0 + queries; ++k)
                  for (int r = r0; r < r0 + count; ++r) {
                    float alone;
                    cpu::dot_packed_codes(q.data() + k * d, q_sums.data() + k * groups, 1, rows + r, 1, bits, group, d,
                                          &alone, 1);
                    CHECK(std::memcmp(&alone, &together[(k - k0) * kN + (r - r0)], 4) == 0);
                    // One row at a time, in order, as the block's axpy must add them.
                    cpu::axpy_packed_codes(w.data() + k * kN + r, kN, 1, rows + r, 1, bits, group, d,
                                           y_alone.data() + k * d, mins_alone.data() + k * groups);
                  }
                CHECK(std::memcmp(y_alone.data(), y.data(), y.size() * 4) == 0);
                CHECK(std::memcmp(mins_alone.data(), mins.data(), mins.size() * 4) == 0);
        });
      }
}

TEST_CASE("cpu: fp32, fp16 and bf16 rows read in blocks give each (query, row) pair what it gets alone", "[cpu_attention]") {
  std::mt19937 rng(6);
  constexpr int kN = cpu::kBlock;
  auto check = [&](auto stored, int64_t n) {
    using T = decltype(stored);
    INFO(row_type<T>() << " rows of " << n);
    const StoredRows<T> made = stored_rows<T>(kN, n, rng);
    const T* const* rows = made.rows.data();
    const std::vector<float> q = normal(size_t(kN * n), rng), w = normal(kN * kN, rng), y0 = normal(size_t(kN * n), rng);
    for_each_block([&](int queries, int count, int k0, int r0) {
            float together[kN * kN];
            cpu::dot_block(q.data() + k0 * n, queries, rows + r0, count, n, together, kN);
            std::vector<float> y = y0, y_alone = y0;
            cpu::axpy_block(w.data() + k0 * kN + r0, kN, queries, rows + r0, count, n, y.data() + k0 * n);
            for (int k = k0; k < k0 + queries; ++k)
              for (int r = r0; r < r0 + count; ++r) {
                float alone;
                cpu::dot_block(q.data() + k * n, 1, rows + r, 1, n, &alone, 1);
                CHECK(std::memcmp(&alone, &together[(k - k0) * kN + (r - r0)], 4) == 0);
                check_near_double_dot(q.data() + k * n, rows[r], n, alone);
                cpu::axpy_block(w.data() + k * kN + r, kN, 1, rows + r, 1, n, y_alone.data() + k * n);
              }
            CHECK(std::memcmp(y_alone.data(), y.data(), y.size() * 4) == 0);
    });
  };
  // Multiples of 16 and the scalar tails after them (head dims such as 20 and 72).
  for (int64_t n : {16, 20, 64, 72, 128}) {
    check(float(), n);
    check(cpu::f16(), n);
    check(cpu::bf16(), n);
  }
}

// A streamed linear's (token, row) pairs (cpu_backend.cpp): blocks of every shape dot_pairs takes,
// over lengths that exercise its 32-float strides, its 8-float tail and its scalar tail, give each
// pair exactly what dot() gives it alone, so a linear's result does not depend on how its tokens
// and rows are grouped. The outputs start poisoned, and each lands at its own stride.
TEST_CASE("cpu: fp32, fp16 and bf16 weight rows dotted in pairs give each pair what dot() gives it", "[quant]") {
  std::mt19937 rng(7);
  constexpr int kMax = cpu::kDotPairs;
  auto check = [&](auto stored, int64_t n) {
    using T = decltype(stored);
    INFO(row_type<T>() << " rows of " << n);
    const StoredRows<T> made = stored_rows<T>(kMax, n, rng);
    const T* const* rows = made.rows.data();
    const std::vector<float> q = normal(size_t(kMax * n), rng);
    int shapes = 0;
    for (int queries = 1; queries <= kMax; ++queries)
      for (int count = 1; queries * count <= kMax; ++count) {
        INFO(queries << " queries by " << count << " rows");
        ++shapes;
        constexpr int64_t kStride = 5;
        std::vector<float> out(size_t(kMax * kStride), std::numeric_limits<float>::quiet_NaN());
        cpu::dot_pairs(q.data(), queries, rows, count, n, out.data(), kStride);
        for (int k = 0; k < kMax; ++k)
          for (int r = 0; r < kStride; ++r) {
            const float got = out[size_t(k * kStride + r)];
            if (k >= queries || r >= count) {  // outside the block: untouched
              CHECK(std::isnan(got));
              continue;
            }
            const float alone = cpu::dot(q.data() + k * n, rows[r], n);
            CHECK(std::memcmp(&alone, &got, 4) == 0);
            check_near_double_dot(q.data() + k * n, rows[r], n, got);
          }
      }
    CHECK(shapes == 5);  // 1x1, 1x2, 1x3, 2x1, 3x1
  };
  for (int64_t n : {1, 7, 8, 15, 31, 32, 33, 40, 63, 64, 96, 100, 257}) {
    check(float(), n);
    check(cpu::f16(), n);
    check(cpu::bf16(), n);
  }
}

// The rows' conversions (cpu_simd.h) against dtype.h's scalar ones, bit for bit, in vector lanes
// and scalar tails: fp32 -> bf16 rounds to nearest even (ties both ways, carries into the exponent
// and to infinity) and keeps NaNs quiet as float_to_bf16 does; bf16 -> fp32 is exact; fp16 both
// ways on finite values and infinities.
TEST_CASE("cpu: rows convert between fp32 and fp16 or bf16 as dtype.h's scalar conversions do", "[cpu_attention]") {
  std::mt19937 rng(12);
  std::uniform_int_distribution<uint32_t> bits;
  const int64_t n = 8 * 40 + 5;
  std::vector<uint32_t> words(static_cast<size_t>(n));
  for (uint32_t& w : words) w = bits(rng);
  // Every third word's low half a tie (0x8000) or just under one (0x7fff), on random top halves
  // (odd or even); specials at both ends.
  for (size_t i = 0; i < words.size(); i += 3) words[i] = (words[i] & 0xffff0000u) | (i % 2 ? 0x8000u : 0x7fffu);
  const uint32_t special[] = {0x7f7fffff, 0xff7f8000, 0x7f800000, 0xff800000, 0x7fc00000, 0x7f800001, 0x7fff8000, 0xffffffff,
                              0x00000000, 0x80000000, 0x00008000, 0x00018000, 0x3f808000, 0x3f818000, 0x3f7fffff};
  for (size_t i = 0; i < std::size(special); ++i) words[i * 7] = words[size_t(n) - 1 - i] = special[i];
  std::vector<float> x(words.size());
  std::memcpy(x.data(), words.data(), words.size() * 4);

  std::vector<cpu::bf16> b(x.size());
  cpu::from_f32(x.data(), b.data(), n);
  std::vector<float> widened(x.size());
  cpu::to_f32(b.data(), widened.data(), n);
  size_t bad = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    uint32_t w;
    std::memcpy(&w, &widened[i], 4);
    bad += uint16_t(b[i]) != float_to_bf16(x[i]);
    bad += w != uint32_t(uint16_t(b[i])) << 16;
  }
  CHECK(bad == 0);

  // fp16 over the same words with exponents brought into [2^-26, 2^18) (fp16's subnormals, normals
  // and overflow) and every third one a tie, and fp16's edges; no NaNs (F16C keeps NaN payloads
  // that the scalar functions do not).
  std::vector<float> finite(x.size());
  for (size_t i = 0; i < words.size(); ++i) {
    uint32_t w = (words[i] & 0x807fffffu) | (uint32_t(127 - 26) + (words[i] >> 23 & 0xffu) % 44) << 23;
    if (i % 3 == 0) w = (w & 0xffffe000u) | 0x1000u;
    std::memcpy(&finite[i], &w, 4);
  }
  for (float v : {65504.0f, 65519.0f, 65520.0f, -70000.0f, 1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048, 5.96e-8f, 2.98e-8f,
                  INFINITY, -INFINITY, 0.0f, -0.0f})
    finite.push_back(v);
  std::vector<cpu::f16> h(finite.size());
  std::vector<float> back(finite.size());
  cpu::from_f32(finite.data(), h.data(), int64_t(finite.size()));
  cpu::to_f32(h.data(), back.data(), int64_t(h.size()));
  size_t bad16 = 0;
  for (size_t i = 0; i < finite.size(); ++i) {
    bad16 += h[i] != float_to_half(finite[i]);
    bad16 += !(back[i] == half_to_float(h[i]));
  }
  CHECK(bad16 == 0);
}
