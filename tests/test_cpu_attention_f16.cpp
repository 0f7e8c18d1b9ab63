// The CPU backend's kv_store and attention with fp16 and bf16 data (cpu_attention: the GPU computes
// in 16 bits and hands decode attention to the KV cache in host memory). Every combination of
// F32/F16/BF16 activations (q, k, v, out) and F32/F16/BF16 caches runs the same steps over data the
// 16-bit types hold exactly and is compared to a double-precision reference computed here; outputs
// are poisoned with 0xFF bytes (NaN in every dtype) beforehand so an element left unwritten shows
// up. Also linear and the norms over fp16 and bf16 weights (experts computed on the CPU).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernel_test_support.h"
#include "strata/backend/backend.h"
#include "strata/core/dtype.h"
#include "strata/core/error.h"
#include "worst_error.h"

using namespace strata;
using test::count;
using test::random_f16;
using test::round_f16;

namespace {

float round_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }
// A value that fp16 and bf16 both hold: bf16's 8-bit significand in fp16's range (values under
// 2^-16 become multiples of fp16's 2^-24, which have fewer bits still).
float round_16bit(float x) { return round_f16(round_bf16(x)); }
using Rounding = float (*)(float);

// n values uniform in [lo, hi), rounded by `round` (random_f16's draws for round_f16).
std::vector<float> random_rounded(size_t n, std::mt19937& rng, Rounding round, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = round(dist(rng));
  return v;
}

constexpr DType kFloatTypes[] = {DType::F32, DType::F16, DType::BF16};

// Tolerances of outputs of dtype `out` against the reference. fp32: summation order alone. 16
// bits: one rounding to nearest even on top, at most the unit roundoff u of the output's magnitude
// (2^-11 for fp16, 2^-8 for bf16). fp16's are taken loosely (about u absolute and 2u relative, for
// outputs within 1: averages of values in [-1, 1]); bf16's are u relative plus fp32's error, tight
// enough that a rounding by truncation (errors up to 2u) fails them.
struct Tolerance {
  double atol, rtol;
};
Tolerance tolerance(DType out) {
  if (out == DType::F16) return {5e-4, 1e-3};
  if (out == DType::BF16) return {1e-5, 0x1p-8};
  return {1e-5, 1e-5};
}

// A CPU backend and the buffers one test allocates on it.
struct Rig {
  std::unique_ptr<Backend> be = make_cpu_backend(2);
  std::vector<Buffer> keep;

  Tensor poisoned(DType dt, std::initializer_list<int64_t> dims) {
    keep.push_back(be->alloc(count(dims) * dtype_size(dt)));
    Tensor t = keep.back().view(0, dt, dims);
    std::memset(t.data, 0xFF, t.nbytes());
    return t;
  }
  Tensor floats(DType dt, const std::vector<float>& v, std::initializer_list<int64_t> dims) {
    REQUIRE(v.size() == count(dims));
    Tensor t = poisoned(dt, dims);
    convert_elements(v.data(), DType::F32, t.data, dt, v.size());
    return t;
  }
  Tensor i32(const std::vector<int32_t>& v) {
    Tensor t = poisoned(DType::I32, {int64_t(v.size())});
    std::memcpy(t.data, v.data(), v.size() * 4);
    return t;
  }
  std::vector<float> read(const Tensor& t) {
    std::vector<float> out(size_t(t.numel()));
    be->copy_to_host_f32(t, out.data());
    return out;
  }
};

// One forward step's attention inputs: token t writes (k[t], v[t]) at (slots[t], positions[t])
// and attends to positions [0, positions[t]] of its slot.
struct Step {
  std::vector<int32_t> slots, positions;
  std::vector<float> q, k, v;  // [T, heads, d], [T, kv_heads, d] x2; 16-bit-representable
};

struct Shape {
  int64_t heads, kv_heads, d, S, C;
};

// Plain double-precision attention over a host copy of the cache, stored as kv_store would.
class Reference {
public:
  explicit Reference(const Shape& sh)
      : sh_(sh), k_(size_t(sh.S * sh.C * sh.kv_heads * sh.d)), v_(k_.size()) {}

  // Keys [pos - window + 1, pos] only when window > 0; scores soft-capped when softcap > 0; head
  // h's sink logit sinks[h] in the softmax's sum when sinks are given.
  std::vector<double> step(const Step& st, double scale, int window = 0, double softcap = 0,
                           const std::vector<float>& sinks = {}) {
    const int64_t T = int64_t(st.slots.size()), row = sh_.kv_heads * sh_.d;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < row; ++i) {
        const size_t at = size_t((st.slots[t] * sh_.C + st.positions[t]) * row + i);
        k_[at] = st.k[size_t(t * row + i)];
        v_[at] = st.v[size_t(t * row + i)];
      }
    std::vector<double> out(size_t(T * sh_.heads * sh_.d), 0.0);
    const int64_t group = sh_.heads / sh_.kv_heads;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < sh_.heads; ++h) {
        const int64_t n = st.positions[t] + 1, hk = h / group;
        const int64_t first = window > 0 ? std::max<int64_t>(0, n - window) : 0;
        auto at = [&](int64_t j) { return size_t(((st.slots[t] * sh_.C + j) * sh_.kv_heads + hk) * sh_.d); };
        std::vector<double> w(static_cast<size_t>(n), 0.0);
        double mx = -INFINITY, sum = 0;
        for (int64_t j = first; j < n; ++j) {
          double s = 0;
          for (int64_t i = 0; i < sh_.d; ++i) s += double(st.q[size_t((t * sh_.heads + h) * sh_.d + i)]) * k_[at(j) + size_t(i)];
          s *= scale;
          w[size_t(j)] = softcap > 0 ? softcap * std::tanh(s / softcap) : s;
          mx = std::max(mx, w[size_t(j)]);
        }
        if (!sinks.empty()) mx = std::max(mx, double(sinks[size_t(h)]));
        for (int64_t j = first; j < n; ++j) sum += (w[size_t(j)] = std::exp(w[size_t(j)] - mx));
        if (!sinks.empty()) sum += std::exp(double(sinks[size_t(h)]) - mx);
        double* o = out.data() + (t * sh_.heads + h) * sh_.d;
        for (int64_t j = first; j < n; ++j)
          for (int64_t i = 0; i < sh_.d; ++i) o[i] += w[size_t(j)] / sum * v_[at(j) + size_t(i)];
      }
    return out;
  }

private:
  Shape sh_;
  std::vector<double> k_, v_;
};

// A step's data: fp16-representable (`round` = round_f16), or what both 16-bit types hold (round_16bit).
Step random_step(const Shape& sh, std::vector<int32_t> slots, std::vector<int32_t> positions, std::mt19937& rng,
                 Rounding round = round_f16) {
  Step st;
  const size_t T = slots.size();
  st.slots = std::move(slots);
  st.positions = std::move(positions);
  // q spread wider than k so the softmax is far from uniform.
  st.q = random_rounded(T * size_t(sh.heads * sh.d), rng, round, -4.0f, 4.0f);
  st.k = random_rounded(T * size_t(sh.kv_heads * sh.d), rng, round, -1.0f, 1.0f);
  st.v = random_rounded(T * size_t(sh.kv_heads * sh.d), rng, round, -1.0f, 1.0f);
  return st;
}

// Runs `steps` through kv_store + attention with activations of dtype `act` and caches of dtype
// `cache` (fresh caches of zeros), returning each step's output as floats.
std::vector<std::vector<float>> run_steps(const Shape& sh, const std::vector<Step>& steps, DType act, DType cache,
                                          int window = 0, float softcap = 0.0f, const std::vector<float>& sinks = {}) {
  Rig r;
  AttentionSpec spec(1.0f / std::sqrt(float(sh.d)), window, softcap);
  spec.sinks = sinks.empty() ? nullptr : sinks.data();
  const Tensor ck = r.floats(cache, std::vector<float>(count({sh.S, sh.C, sh.kv_heads, sh.d}), 0.0f),
                             {sh.S, sh.C, sh.kv_heads, sh.d});
  const Tensor cv = r.floats(cache, std::vector<float>(size_t(ck.numel()), 0.0f), {sh.S, sh.C, sh.kv_heads, sh.d});
  std::vector<std::vector<float>> outs;
  for (const Step& st : steps) {
    const int64_t T = int64_t(st.slots.size());
    const Tensor slots = r.i32(st.slots), positions = r.i32(st.positions);
    r.be->kv_store(r.floats(act, st.k, {T, sh.kv_heads, sh.d}), r.floats(act, st.v, {T, sh.kv_heads, sh.d}), ck, cv,
                   slots, positions);
    const Tensor out = r.poisoned(act, {T, sh.heads, sh.d});
    r.be->attention(r.floats(act, st.q, {T, sh.heads, sh.d}), ck, cv, slots, positions, spec, out);
    outs.push_back(r.read(out));
  }
  return outs;
}

// run_steps, comparing each step's output to the reference within atol + rtol * |ref|.
void check_steps(const Shape& sh, const std::vector<Step>& steps, DType act, DType cache, double atol, double rtol,
                 int window = 0, float softcap = 0.0f, const std::vector<float>& sinks = {}) {
  const float scale = 1.0f / std::sqrt(float(sh.d));
  const std::vector<std::vector<float>> outs = run_steps(sh, steps, act, cache, window, softcap, sinks);
  Reference ref(sh);
  for (size_t n = 0; n < steps.size(); ++n) {
    const std::vector<float>& got = outs[n];
    const std::vector<double> want = ref.step(steps[n], double(scale), window, double(softcap), sinks);
    size_t bad = 0;
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double err = std::abs(double(got[i]) - want[i]);
      worst = std::max(worst, err);
      if (!(err <= atol + rtol * std::abs(want[i]))) ++bad;  // NaN (unwritten) counts as bad
    }
    INFO("step " << n << ", activations " << dtype_name(act) << ", caches " << dtype_name(cache) << ", d " << sh.d
                 << ", window " << window << ", softcap " << softcap << ", sinks " << !sinks.empty()
                 << ": worst abs error " << worst);
    CHECK(bad == 0);
  }
}

// check_steps for every pair of dtypes (activations, caches) with BF16 in it, within the output's
// tolerance; the steps' data must be round_16bit's.
void check_bf16_pairs(const Shape& sh, const std::vector<Step>& steps) {
  for (DType act : kFloatTypes)
    for (DType cache : kFloatTypes)
      if (act == DType::BF16 || cache == DType::BF16)
        check_steps(sh, steps, act, cache, tolerance(act).atol, tolerance(act).rtol);
}

// Two steps over three slots: first a prefill of slots 0 and 2, then a mixed batch with decode
// tokens deep into slots 0 and 2 and a fresh prefill of slot 1 between them.
std::vector<Step> mixed_steps(const Shape& sh, std::mt19937& rng, Rounding round = round_f16) {
  std::vector<int32_t> s1, p1;
  for (int32_t i = 0; i < 17; ++i) s1.push_back(0), p1.push_back(i);
  for (int32_t i = 0; i < 30; ++i) s1.push_back(2), p1.push_back(i);
  std::vector<int32_t> s2{0}, p2{17};
  for (int32_t i = 0; i < 6; ++i) s2.push_back(1), p2.push_back(i);
  s2.push_back(2), p2.push_back(30);
  return {random_step(sh, s1, p1, rng, round), random_step(sh, s2, p2, rng, round)};
}

}  // namespace

TEST_CASE("cpu attention: F32, F16 and BF16 activations and caches match a double reference (GQA)", "[cpu_attention]") {
  std::mt19937 rng(1234);
  const Shape sh{8, 2, 64, 3, 40};
  const std::vector<Step> steps = mixed_steps(sh, rng);
  // fp32 throughout: only summation order separates it from the reference.
  check_steps(sh, steps, DType::F32, DType::F32, 1e-5, 1e-5);
  // An fp16 cache holds the fp16-representable inputs exactly, so fp32 outputs stay as close.
  check_steps(sh, steps, DType::F32, DType::F16, 1e-5, 1e-5);
  // fp16 outputs: one rounding (at most 2^-12 of 1 here, the outputs being averages of values in
  // [-1, 1]) on top.
  check_steps(sh, steps, DType::F16, DType::F16, 5e-4, 1e-3);
  check_steps(sh, steps, DType::F16, DType::F32, 5e-4, 1e-3);
  // Every pair with bf16 in it (mixed with fp16 too), over data both 16-bit types hold.
  check_bf16_pairs(sh, mixed_steps(sh, rng, round_16bit));
}

// Contexts of several key tiles (the online softmax rescales between them) and work items of
// uneven runs of kv heads: one decode token splits 5 kv heads into runs of 1, three tokens into
// runs of 2, 2 and 1 (the backend has 2 threads and aims at 4 items a thread).
TEST_CASE("cpu attention: long contexts and uneven runs of kv heads match a double reference", "[cpu_attention]") {
  std::mt19937 rng(4321);
  const Shape sh{10, 5, 64, 3, 300};
  std::vector<int32_t> s1, p1;
  for (int32_t i = 0; i < 200; ++i) s1.push_back(0), p1.push_back(i);
  for (int32_t i = 0; i < 129; ++i) s1.push_back(2), p1.push_back(i);
  const std::vector<Step> steps{random_step(sh, s1, p1, rng), random_step(sh, {0}, {200}, rng),
                                random_step(sh, {2, 0, 1}, {129, 201, 0}, rng)};
  for (DType act : {DType::F32, DType::F16})
    for (DType cache : {DType::F32, DType::F16}) {
      const bool f16_out = act == DType::F16;
      check_steps(sh, steps, act, cache, f16_out ? 5e-4 : 1e-5, f16_out ? 1e-3 : 1e-5);
    }
  const std::vector<Step> steps16{random_step(sh, s1, p1, rng, round_16bit), random_step(sh, {0}, {200}, rng, round_16bit),
                                  random_step(sh, {2, 0, 1}, {129, 201, 0}, rng, round_16bit)};
  check_bf16_pairs(sh, steps16);
  // Multi-head attention over the same steps: 16-bit rows are read in blocks of four positions.
  const Shape mha{5, 5, 64, 3, 300};
  std::mt19937 rng2(4322);
  const std::vector<Step> mha_steps{random_step(mha, s1, p1, rng2), random_step(mha, {2, 0, 1}, {129, 200, 0}, rng2)};
  check_steps(mha, mha_steps, DType::F16, DType::F16, 5e-4, 1e-3);
  check_steps(mha, mha_steps, DType::F32, DType::F16, 1e-5, 1e-5);
  const std::vector<Step> mha_steps16{random_step(mha, s1, p1, rng2, round_16bit),
                                      random_step(mha, {2, 0, 1}, {129, 200, 0}, rng2, round_16bit)};
  check_steps(mha, mha_steps16, DType::BF16, DType::BF16, tolerance(DType::BF16).atol, tolerance(DType::BF16).rtol);
  check_steps(mha, mha_steps16, DType::F32, DType::BF16, 1e-5, 1e-5);
}

TEST_CASE("cpu attention: F16 and BF16 with odd head dims and multi-head attention (scalar tails)", "[cpu_attention]") {
  std::mt19937 rng(99);
  const Tolerance bf16 = tolerance(DType::BF16);
  for (int64_t d : {45, 7, 128}) {  // 45 = 32 + 8 + 5 goes through every loop of the SIMD kernels
    for (const Shape& sh : {Shape{3, 3, d, 3, 40}, Shape{4, 1, d, 3, 40}}) {
      const std::vector<Step> steps = mixed_steps(sh, rng);
      check_steps(sh, steps, DType::F32, DType::F32, 1e-5, 1e-5);
      check_steps(sh, steps, DType::F16, DType::F16, 5e-4, 1e-3);
      const std::vector<Step> steps16 = mixed_steps(sh, rng, round_16bit);
      check_steps(sh, steps16, DType::BF16, DType::BF16, bf16.atol, bf16.rtol);
    }
  }
}

TEST_CASE("cpu attention: kv_store rounds fp32 to fp16 to nearest even, like float_to_half", "[cpu_attention]") {
  Rig r;
  std::mt19937 rng(7);
  const int64_t T = 5, kvh = 3, d = 45, C = 8;  // rows of 135: vector lanes and a scalar tail
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  std::vector<float> k(count({T, kvh, d})), v(k.size());
  for (float& x : k) x = dist(rng);
  for (float& x : v) x = dist(rng) * 1e-5f;  // fp16 subnormals
  // Values just past the largest half, ties and specials.
  const float edge[] = {65504.0f, 65519.0f, 65520.0f, -70000.0f, 1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048, 0.0f, -0.0f,
                        INFINITY, 5.96e-8f, 2.98e-8f, 8.94e-8f};
  for (size_t i = 0; i < std::size(edge); ++i) k[i * 11] = edge[i];
  k[130] = 65520.0f;  // in the scalar tail of row 0
  k[133] = 1.0f + 3.0f / 2048;
  const Tensor ck = r.poisoned(DType::F16, {2, C, kvh, d}), cv = r.poisoned(DType::F16, {2, C, kvh, d});
  const std::vector<int32_t> slots{1, 0, 1, 0, 1}, positions{0, 7, 3, 2, 7};
  r.be->kv_store(r.floats(DType::F32, k, {T, kvh, d}), r.floats(DType::F32, v, {T, kvh, d}), ck, cv, r.i32(slots),
                 r.i32(positions));
  const int64_t row = kvh * d;
  size_t bad = 0;
  for (int64_t t = 0; t < T; ++t) {
    const size_t at = size_t((slots[size_t(t)] * C + positions[size_t(t)]) * row);
    for (int64_t i = 0; i < row; ++i) {
      const size_t src = size_t(t * row + i);
      bad += ck.ptr<uint16_t>()[at + size_t(i)] != float_to_half(k[src]);
      bad += cv.ptr<uint16_t>()[at + size_t(i)] != float_to_half(v[src]);
    }
  }
  CHECK(bad == 0);
  // The other rows were not written: still the 0xFF poison.
  CHECK(ck.ptr<uint16_t>()[0] == 0xFFFF);
  CHECK(cv.ptr<uint16_t>()[size_t((1 * C + 1) * row)] == 0xFFFF);
}

TEST_CASE("cpu attention: kv_store rounds fp32 and fp16 to bf16 to nearest even, like float_to_bf16", "[cpu_attention]") {
  Rig r;
  std::mt19937 rng(17);
  const int64_t T = 5, kvh = 3, d = 45, C = 8;  // rows of 135: vector lanes and a scalar tail
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  std::vector<float> k(count({T, kvh, d})), v(k.size());
  for (float& x : k) x = dist(rng);
  for (float& x : v) x = dist(rng) * 1e-38f;  // fp32's smallest normals and its subnormals
  auto from_bits = [](uint32_t b) {
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  };
  // Ties (to even, up and down, either sign, subnormal too), just past a tie, the largest floats
  // (rounding up to infinity), zeros, infinities and NaNs: quiet, signaling (0x7f800001 would
  // round to infinity) and one whose rounding would carry into the sign (0x7fff8000).
  const uint32_t edge[] = {0x3f808000, 0x3f818000, 0x3f808001, 0xbf818000, 0x7f7fffff, 0x7f7f8000, 0xff7fffff,
                           0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0x7f800001, 0x7fff8000,
                           0x00008000, 0x00018000};
  for (size_t i = 0; i < std::size(edge); ++i) k[i * 8 + 3] = from_bits(edge[i]);
  k[129] = from_bits(0x7f800001);  // in the scalar tail of row 0
  k[131] = from_bits(0x3f818000);
  k[133] = from_bits(0x7f7fffff);
  const std::vector<int32_t> slots{1, 0, 1, 0, 1}, positions{0, 7, 3, 2, 7};
  const int64_t row = kvh * d;
  // Calls f(stored, src) for each element of the stored rows (cache index, k or v index).
  auto for_each_stored = [&](auto&& f) {
    for (int64_t t = 0; t < T; ++t) {
      const size_t at = size_t((slots[size_t(t)] * C + positions[size_t(t)]) * row);
      for (int64_t i = 0; i < row; ++i) f(at + size_t(i), size_t(t * row + i));
    }
  };
  const Tensor ck = r.poisoned(DType::BF16, {2, C, kvh, d}), cv = r.poisoned(DType::BF16, {2, C, kvh, d});
  r.be->kv_store(r.floats(DType::F32, k, {T, kvh, d}), r.floats(DType::F32, v, {T, kvh, d}), ck, cv, r.i32(slots),
                 r.i32(positions));
  size_t bad = 0;
  for_each_stored([&](size_t at, size_t src) {
    bad += ck.ptr<uint16_t>()[at] != float_to_bf16(k[src]);
    bad += cv.ptr<uint16_t>()[at] != float_to_bf16(v[src]);
  });
  CHECK(bad == 0);
  CHECK(ck.ptr<uint16_t>()[0] == 0xFFFF);  // rows not stored keep the poison
  CHECK(cv.ptr<uint16_t>()[size_t((1 * C + 1) * row)] == 0xFFFF);

  // Between the 16-bit types, and bf16 into fp32: one rounding to nearest even (none for fp32).
  // fp16 values carry 3 bits past bf16's, so an eighth of them are ties.
  for (const auto& types : {std::pair{DType::F16, DType::BF16}, {DType::BF16, DType::F16}, {DType::BF16, DType::F32}}) {
    const DType from = types.first, to = types.second;
    INFO(dtype_name(from) << " into " << dtype_name(to));
    const std::vector<float> x = random_rounded(k.size(), rng, from == DType::F16 ? round_f16 : round_bf16, -3.0f, 3.0f);
    const Tensor xt = r.floats(from, x, {T, kvh, d});
    const Tensor c = r.poisoned(to, {2, C, kvh, d}), c2 = r.poisoned(to, {2, C, kvh, d});
    r.be->kv_store(xt, xt, c, c2, r.i32(slots), r.i32(positions));
    const std::vector<float> got = r.read(c);
    size_t wrong = 0;
    for_each_stored([&](size_t at, size_t src) {
      const float want = to == DType::BF16 ? round_bf16(x[src]) : to == DType::F16 ? round_f16(x[src]) : x[src];
      wrong += !(got[at] == want);
    });
    CHECK(wrong == 0);
  }
}

TEST_CASE("cpu attention: kv_store and attention reject mixed or unsupported dtypes", "[cpu_attention]") {
  Rig r;
  const int64_t heads = 4, kvh = 2, d = 16, C = 4;
  auto t = [&](DType dt, std::initializer_list<int64_t> dims) { return r.floats(dt, std::vector<float>(count(dims)), dims); };
  const Tensor slots = r.i32({0}), positions = r.i32({0});
  const Tensor k32 = t(DType::F32, {1, kvh, d}), k16 = t(DType::F16, {1, kvh, d}), kbf = t(DType::BF16, {1, kvh, d});
  const Tensor c32 = t(DType::F32, {1, C, kvh, d}), c16 = t(DType::F16, {1, C, kvh, d});
  const Tensor cbf = t(DType::BF16, {1, C, kvh, d});
  const Tensor q32 = t(DType::F32, {1, heads, d}), q16 = t(DType::F16, {1, heads, d}), qbf = t(DType::BF16, {1, heads, d});
  const Tensor o32 = t(DType::F32, {1, heads, d}), o16 = t(DType::F16, {1, heads, d}), obf = t(DType::BF16, {1, heads, d});
  Tensor ci32 = c32, ki32 = k32, qi32 = q32;
  ci32.dtype = ki32.dtype = qi32.dtype = DType::I32;
  using Catch::Contains;

  CHECK_THROWS_WITH(r.be->kv_store(k32, k16, c16, c16, slots, positions), Contains("k and v must share one dtype"));
  CHECK_THROWS_WITH(r.be->kv_store(kbf, k16, c16, c16, slots, positions), Contains("k and v must share one dtype"));
  CHECK_THROWS_WITH(r.be->kv_store(k16, k16, c16, c32, slots, positions),
                    Contains("cache_k and cache_v must share one dtype"));
  CHECK_THROWS_WITH(r.be->kv_store(k16, k16, cbf, c16, slots, positions),
                    Contains("cache_k and cache_v must share one dtype"));
  CHECK_THROWS_WITH(r.be->kv_store(k32, k32, ci32, ci32, slots, positions), Contains("must be a CPU F32, F16 or BF16 tensor"));
  CHECK_THROWS_WITH(r.be->kv_store(ki32, ki32, cbf, cbf, slots, positions), Contains("must be a CPU F32, F16 or BF16 tensor"));

  CHECK_THROWS_WITH(r.be->attention(q16, c16, c16, slots, positions, 1.0f, o32), Contains("q and out must share one dtype"));
  CHECK_THROWS_WITH(r.be->attention(qbf, c16, c16, slots, positions, 1.0f, o16), Contains("q and out must share one dtype"));
  CHECK_THROWS_WITH(r.be->attention(q32, c32, c16, slots, positions, 1.0f, o32),
                    Contains("cache_k and cache_v must share one dtype"));
  CHECK_THROWS_WITH(r.be->attention(qbf, cbf, c32, slots, positions, 1.0f, obf),
                    Contains("cache_k and cache_v must share one dtype"));
  CHECK_THROWS_WITH(r.be->attention(qi32, cbf, cbf, slots, positions, 1.0f, qi32), Contains("must be a CPU F32, F16 or BF16 tensor"));
  CHECK_THROWS_AS(r.be->attention(q16, ci32, ci32, slots, positions, 1.0f, o16), Error);

  // Supported combinations pass: any two of F32, F16 and BF16 for activations and caches.
  CHECK_NOTHROW(r.be->kv_store(k16, k16, c32, c32, slots, positions));
  CHECK_NOTHROW(r.be->kv_store(k32, k32, c16, c16, slots, positions));
  CHECK_NOTHROW(r.be->kv_store(kbf, kbf, c16, c16, slots, positions));
  CHECK_NOTHROW(r.be->kv_store(k16, k16, cbf, cbf, slots, positions));
  CHECK_NOTHROW(r.be->kv_store(k32, k32, cbf, cbf, slots, positions));
  CHECK_NOTHROW(r.be->attention(q16, c16, c16, slots, positions, 1.0f, o16));
  CHECK_NOTHROW(r.be->attention(q32, c16, c16, slots, positions, 1.0f, o32));
  CHECK_NOTHROW(r.be->attention(qbf, cbf, cbf, slots, positions, 1.0f, obf));
  CHECK_NOTHROW(r.be->attention(qbf, c16, c16, slots, positions, 1.0f, obf));
  CHECK_NOTHROW(r.be->attention(q32, cbf, cbf, slots, positions, 1.0f, o32));
  // Other ops keep fp32 only.
  CHECK_THROWS_WITH(r.be->add(q16, q16, o16), Contains("must be a CPU F32 tensor"));
}

// Prefill runs (consecutive positions of one slot) attend a tile of queries at a time. A prompt
// prefilled in two chunks, the second beside a fresh prompt and a decode token; two runs of one
// slot with a gap of positions between them; runs longer than the kernel's 64-key tiles and its
// items of 32 query rows; head dims that are not a multiple of 8.
TEST_CASE("cpu attention: chunked prefill runs match a double reference", "[cpu_attention]") {
  std::mt19937 rng(2468);
  for (const Shape& sh : {Shape{9, 3, 64, 3, 260}, Shape{4, 4, 20, 3, 260}, Shape{8, 1, 45, 3, 260}}) {
    std::vector<int32_t> s1, p1, s2, p2, s3, p3;
    for (int32_t i = 0; i < 100; ++i) s1.push_back(0), p1.push_back(i);
    for (int32_t i = 100; i < 231; ++i) s2.push_back(0), p2.push_back(i);
    for (int32_t i = 0; i < 70; ++i) s2.push_back(1), p2.push_back(i);
    s2.push_back(2), p2.push_back(0);
    for (int32_t i = 0; i < 10; ++i) s3.push_back(2), p3.push_back(1 + i);
    for (int32_t i = 0; i < 12; ++i) s3.push_back(2), p3.push_back(40 + i);  // positions 11..39 stay empty
    const std::vector<Step> steps{random_step(sh, s1, p1, rng), random_step(sh, s2, p2, rng), random_step(sh, s3, p3, rng)};
    check_steps(sh, steps, DType::F32, DType::F32, 1e-5, 1e-5);
    check_steps(sh, steps, DType::F32, DType::F16, 1e-5, 1e-5);
    check_steps(sh, steps, DType::F16, DType::F16, 5e-4, 1e-3);
    const std::vector<Step> steps16{random_step(sh, s1, p1, rng, round_16bit), random_step(sh, s2, p2, rng, round_16bit),
                                    random_step(sh, s3, p3, rng, round_16bit)};
    check_bf16_pairs(sh, steps16);
  }
}

// Gemma's sliding-window and soft-capped attention (AttentionSpec): decode tokens and prefill runs
// (the chunked prompt of the test above: rows whose windows start apart inside one key tile, a
// second chunk whose window starts past the first chunk's keys), windows of one key, under a tile,
// a tile's 64, past it and past the context, a soft cap that bends q's wide scores.
TEST_CASE("cpu attention: sliding windows and soft caps match a double reference", "[cpu_attention]") {
  std::mt19937 rng(97531);
  const Shape sh{8, 2, 40, 3, 260};
  std::vector<int32_t> s1, p1, s2, p2;
  for (int32_t i = 0; i < 100; ++i) s1.push_back(0), p1.push_back(i);
  for (int32_t i = 0; i < 30; ++i) s1.push_back(2), p1.push_back(i);
  for (int32_t i = 100; i < 231; ++i) s2.push_back(0), p2.push_back(i);
  s2.push_back(2), p2.push_back(30);  // a decode token
  s2.push_back(1), p2.push_back(0);   // and a one-token prompt
  const std::vector<Step> steps{random_step(sh, s1, p1, rng), random_step(sh, s2, p2, rng)};
  for (int window : {1, 5, 64, 70, 1000})
    for (float softcap : {0.0f, 2.0f}) {
      check_steps(sh, steps, DType::F32, DType::F32, 1e-5, 1e-5, window, softcap);
      check_steps(sh, steps, DType::F16, DType::F16, 5e-4, 1e-3, window, softcap);
    }
}

// GPT-OSS's sinks (AttentionSpec::sinks): one logit per query head joins each softmax's sum, so a
// head's weights sum to less than one. Per head: sinks around the scores' range, one far above
// them (the head attends to almost nothing: the normalizer's larger-of-max-and-sink form keeps
// the exponentials finite), one far below (plain attention); with and without a window.
TEST_CASE("cpu attention: sink logits match a double reference", "[cpu_attention]") {
  std::mt19937 rng(24680);
  const Shape sh{8, 2, 40, 3, 260};
  std::vector<int32_t> s1, p1, s2, p2;
  for (int32_t i = 0; i < 100; ++i) s1.push_back(0), p1.push_back(i);
  for (int32_t i = 0; i < 30; ++i) s1.push_back(2), p1.push_back(i);
  for (int32_t i = 100; i < 180; ++i) s2.push_back(0), p2.push_back(i);
  s2.push_back(2), p2.push_back(30);  // a decode token
  const std::vector<Step> steps{random_step(sh, s1, p1, rng), random_step(sh, s2, p2, rng)};
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> sinks(static_cast<size_t>(sh.heads));
  for (float& s : sinks) s = normal(rng);
  sinks[1] = 60.0f;
  sinks[6] = -60.0f;
  for (int window : {0, 5, 70}) {
    check_steps(sh, steps, DType::F32, DType::F32, 1e-5, 1e-5, window, 0.0f, sinks);
    check_steps(sh, steps, DType::F16, DType::F16, 5e-4, 1e-3, window, 0.0f, sinks);
    check_steps(sh, steps, DType::F32, DType::F32, 1e-5, 1e-5, window, 2.0f, sinks);
  }
}

// Over q, k and v that the 16-bit types hold, 16-bit activations run fp32's arithmetic over fp32's
// values, so their outputs are fp32's rounded to nearest even, bit for bit: decode tokens and
// prefill runs, over caches of each dtype. A rounding by truncation is off in about half of them.
TEST_CASE("cpu attention: F16 and BF16 outputs are the F32 outputs rounded to nearest even", "[cpu_attention]") {
  std::mt19937 rng(8642);
  for (const Shape& sh : {Shape{8, 2, 45, 3, 40}, Shape{4, 4, 64, 3, 40}}) {  // 45: vector lanes and scalar tails
    const std::vector<Step> steps = mixed_steps(sh, rng, round_16bit);
    for (DType cache : kFloatTypes) {
      const std::vector<std::vector<float>> f32 = run_steps(sh, steps, DType::F32, cache);
      for (DType act : {DType::F16, DType::BF16}) {
        const std::vector<std::vector<float>> got = run_steps(sh, steps, act, cache);
        const Rounding round = act == DType::F16 ? round_f16 : round_bf16;
        size_t bad = 0, rounded = 0, total = 0;
        for (size_t n = 0; n < steps.size(); ++n)
          for (size_t i = 0; i < got[n].size(); ++i, ++total) {
            bad += !(got[n][i] == round(f32[n][i]));  // NaN (unwritten) counts as bad
            rounded += round(f32[n][i]) != f32[n][i];
          }
        INFO("activations " << dtype_name(act) << ", caches " << dtype_name(cache) << ", d " << sh.d << ": " << bad
                            << " of " << total << " differ");
        CHECK(bad == 0);
        CHECK(rounded > total / 2);  // nearly every output needed rounding
      }
    }
  }
}

// Experts computed on the CPU (policy cpu_experts) read the GPU's 16-bit weights where they live:
// linear takes fp16 or bf16 weights (and a 16-bit bias, of either type) beside fp32 activations,
// for a few tokens (rows streamed) and for many (rows widened in blocks for sgemm), and the norms
// take 16-bit scales and shifts. Odd sizes, poisoned outputs, against float64 over the same
// 16-bit-representable values.
TEST_CASE("cpu backend: fp16 and bf16 weights in linear and the norms match a double reference", "[cpu_attention][moe]") {
  Rig r;
  std::mt19937 rng(1357);
  // y = x w^T + bias over weights of dtype wdt and a bias of dtype bdt, values rounded by `round`.
  auto check_linear = [&](DType wdt, DType bdt, Rounding round, int64_t T, int64_t in, int64_t out) {
    INFO("weights " << dtype_name(wdt) << ", bias " << dtype_name(bdt) << ", T " << T << " in " << in << " out " << out);
    const std::vector<float> x = random_rounded(size_t(T * in), rng, round), w = random_rounded(size_t(out * in), rng, round),
                             bias = random_rounded(size_t(out), rng, round);
    const Tensor xt = r.floats(DType::F32, x, {T, in}), wt = r.floats(wdt, w, {out, in});
    const Tensor bt = r.floats(bdt, bias, {out}), y = r.poisoned(DType::F32, {T, out});
    r.be->linear(xt, wt, bt, y);
    const std::vector<float> got = r.read(y);
    double worst = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t o = 0; o < out; ++o) {
        double want = bias[size_t(o)];
        for (int64_t i = 0; i < in; ++i) want += double(x[size_t(t * in + i)]) * w[size_t(o * in + i)];
        worst = test::worst_of(worst, std::fabs(got[size_t(t * out + o)] - want));
      }
    CHECK(worst < 1e-4 * double(in));  // fp32 accumulation over `in` products of magnitude <= 1
  };
  // fp16 over fp16-representable values; the pairs with bf16 in them over values both types hold.
  const std::tuple<int64_t, int64_t, int64_t> sizes[] = {{1, 37, 29}, {5, 64, 33}, {8, 130, 7}, {9, 70, 300}, {40, 33, 65}};
  for (const auto& [T, in, out] : sizes) check_linear(DType::F16, DType::F16, round_f16, T, in, out);
  for (const auto& [wdt, bdt] : {std::pair{DType::BF16, DType::BF16}, {DType::BF16, DType::F16}, {DType::F32, DType::BF16}})
    for (const auto& [T, in, out] : sizes) check_linear(wdt, bdt, round_16bit, T, in, out);

  const int64_t T = 3, h = 45;
  const std::vector<float> x = random_f16(size_t(T * h), rng), w = random_rounded(size_t(h), rng, round_16bit),
                           b = random_rounded(size_t(h), rng, round_16bit);
  const Tensor xt = r.floats(DType::F32, x, {T, h});
  for (const auto& [rms, wdt] : {std::pair{true, DType::F16}, {false, DType::F16}, {true, DType::BF16}, {false, DType::BF16}}) {
    INFO((rms ? "rms_norm" : "layer_norm") << " over " << dtype_name(wdt) << " weights");
    const Tensor o = r.poisoned(DType::F32, {T, h});
    if (rms) r.be->rms_norm(xt, r.floats(wdt, w, {h}), 1e-5f, o);
    else r.be->layer_norm(xt, r.floats(wdt, w, {h}), r.floats(wdt, b, {h}), 1e-5f, o);
    const std::vector<float> got = r.read(o);
    for (int64_t t = 0; t < T; ++t) {
      double mean = 0, sq = 0;
      for (int64_t i = 0; i < h; ++i) mean += x[size_t(t * h + i)], sq += double(x[size_t(t * h + i)]) * x[size_t(t * h + i)];
      mean /= double(h);
      const double var = sq / double(h) - mean * mean;
      for (int64_t i = 0; i < h; ++i) {
        const double xi = x[size_t(t * h + i)];
        const double want = rms ? xi / std::sqrt(sq / double(h) + 1e-5) * w[size_t(i)]
                                : (xi - mean) / std::sqrt(var + 1e-5) * w[size_t(i)] + b[size_t(i)];
        CHECK(got[size_t(t * h + i)] == Approx(want).margin(1e-5));
      }
    }
  }
}
