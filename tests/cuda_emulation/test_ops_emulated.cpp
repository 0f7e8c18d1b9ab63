// The remaining CUDA kernels (embedding.cu, norm.cu, elementwise.cu, rope.cu, attention.cu's
// kv_store) on the CPU through the emulation in fake/, against the CPU backend on the same
// inputs, exact in the activation type, with the tolerances of tests/test_cuda_backend.cpp (fewer
// shapes). Every case runs for fp16 and for bf16 (tolerances: act_tol in emulated_act.h). The fp16
// kernels have run on an H100; here they are kept under test for changes made without one.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "emulated_act.h"
#include "kernel_test_support.h"
#include "kernels.h"
#include "quant_kernel_cases.h"
#include "strata/backend/backend.h"

using namespace strata;
using namespace strata::test;
using namespace strata::cuda;

namespace {

using Cpu = CpuTensors;

// Every element within atol + rtol |want|, fp16's tolerances made Act's (act_tol); NaN never passes.
template <class Act>
void expect_close(const std::vector<float>& got, const std::vector<float>& want, double atol, double rtol,
                  const std::string& what) {
  std::vector<double> w(want.begin(), want.end()), tol(want.size());
  for (size_t i = 0; i < want.size(); ++i) tol[i] = act_tol<Act>(atol) + act_tol<Act>(rtol) * std::fabs(w[i]);
  expect_within(got, w, tol, what + (std::is_same_v<Act, bf16> ? " (bf16)" : " (fp16)"));
}

}  // namespace

TEMPLATE_TEST_CASE("emulated cuda: embedding and gather_rows match the CPU backend", "[emulated]", __half, bf16) {
  using Act = TestType;
  std::mt19937 rng(2);
  for (int64_t T : {1, 17}) {
    for (int64_t h : {72, 1000}) {
      Cpu c;
      const int64_t V = 300;
      const std::vector<float> table = random_act<Act>(size_t(V * h), rng);
      std::vector<int32_t> ids(static_cast<size_t>(T));
      for (auto& id : ids) id = int32_t(rng() % V);
      ids[0] = int32_t(V - 1);
      const std::vector<float> base = random_act<Act>(size_t(T * h), rng);
      const std::vector<Act> table16 = elements<Act>(table);
      for (bool accumulate : {false, true}) {
        Tensor c_out = c.f32(base, {T, h});
        c.be->embedding(c.i32(ids), c.f32(table, {V, h}), c_out, accumulate);
        std::vector<Act> out = accumulate ? elements<Act>(base) : poisoned<Act>(size_t(T * h));
        launch_gather_rows(table16.data(), V, ids.data(), T, h, accumulate, out.data(), nullptr);
        expect_close<Act>(floats(out), c.read(c_out), accumulate ? 1e-3 : 0.0, accumulate ? 1e-3 : 0.0,
                          label(accumulate ? "embedding+=" : "embedding", {T, h}));
      }
    }
  }
}

TEMPLATE_TEST_CASE("emulated cuda: layer_norm and rms_norm match the CPU backend", "[emulated][tsan]", __half, bf16) {
  using Act = TestType;
  std::mt19937 rng(3);
  for (int64_t T : {1, 5}) {
    for (int64_t h : {72, 1000}) {
      Cpu c;
      const std::vector<float> x = random_act<Act>(size_t(T * h), rng, 2.0f, 4.0f);  // an offset tests the mean
      const std::vector<float> w = random_act<Act>(size_t(h), rng, 0.5f, 1.5f);
      const std::vector<float> b = random_act<Act>(size_t(h), rng, -0.5f, 0.5f);
      const std::vector<Act> x16 = elements<Act>(x), w16 = elements<Act>(w), b16 = elements<Act>(b);
      for (bool with_bias : {true, false}) {
        Tensor c_out = c.f32(std::vector<float>(size_t(T * h)), {T, h});
        c.be->layer_norm(c.f32(x, {T, h}), c.f32(w, {h}), with_bias ? c.f32(b, {h}) : Tensor(), 1e-5f, c_out);
        std::vector<Act> out = poisoned<Act>(size_t(T * h));
        launch_layer_norm(x16.data(), w16.data(), with_bias ? b16.data() : nullptr, 1e-5f, T, h, out.data(), nullptr);
        expect_close<Act>(floats(out), c.read(c_out), 3e-3, 3e-3, label("layer_norm", {T, h, with_bias}));
      }
      Tensor c_out = c.f32(std::vector<float>(size_t(T * h)), {T, h});
      c.be->rms_norm(c.f32(x, {T, h}), c.f32(w, {h}), 1e-6f, c_out);
      std::vector<Act> in_place = x16;  // out aliases x
      launch_rms_norm(in_place.data(), w16.data(), 1e-6f, T, h, in_place.data(), nullptr);
      expect_close<Act>(floats(in_place), c.read(c_out), 3e-3, 3e-3, label("rms_norm in place", {T, h}));
    }
  }
}

// Gemma's norms scale by 1 + w: the kernels add the 1 in fp32 (w_offset). Against a float64
// reference over weights near 0, where a 16-bit 1 + w (one weight, as Strata stored it before)
// would round w away: the kernels' error must be the output's one rounding (plus fp32 arithmetic),
// and below what the folded weight costs.
TEMPLATE_TEST_CASE("emulated cuda: RMS norms with a weight offset (Gemma's 1 + w) against float64", "[emulated]",
                   __half, bf16) {
  using Act = TestType;
  std::mt19937 rng(5);
  for (int64_t T : {1, 3}) {
    for (int64_t h : {72, 1000}) {
      const std::vector<float> x = random_act<Act>(size_t(T * h), rng, -3.0f, 3.0f),
                               d = random_act<Act>(size_t(T * h), rng);
      const std::vector<float> w = random_act<Act>(size_t(h), rng, -0.06f, 0.06f);
      std::vector<float> folded(w.size());
      for (size_t i = 0; i < w.size(); ++i) folded[i] = strata::cuda::to_float(strata::cuda::from_float<Act>(1.0f + w[i]));
      const std::vector<Act> x16 = elements<Act>(x), d16 = elements<Act>(d), w16 = elements<Act>(w),
                             folded16 = elements<Act>(folded);
      // The reference of x + delta (rounded to Act, as the kernels' residual add rounds it) normed.
      std::vector<float> sum(x.size());
      for (size_t i = 0; i < x.size(); ++i) sum[i] = strata::cuda::to_float(strata::cuda::from_float<Act>(x[i] + d[i]));
      auto reference = [&](const std::vector<float>& in) {
        std::vector<double> y(in.size());
        for (int64_t t = 0; t < T; ++t) {
          double ss = 0;
          for (int64_t i = 0; i < h; ++i) ss += double(in[size_t(t * h + i)]) * in[size_t(t * h + i)];
          const double inv = 1.0 / std::sqrt(ss / double(h) + 1e-6);
          for (int64_t i = 0; i < h; ++i) y[size_t(t * h + i)] = in[size_t(t * h + i)] * inv * (1.0 + w[size_t(i)]);
        }
        return y;
      };
      auto worst = [](const std::vector<float>& got, const std::vector<double>& want) {
        double e = 0;
        for (size_t i = 0; i < got.size(); ++i) e = std::max(e, std::fabs(got[i] - want[i]) / (std::fabs(want[i]) + 1e-3));
        return e;
      };
      std::vector<Act> out = poisoned<Act>(size_t(T * h)), out_folded = poisoned<Act>(size_t(T * h));
      launch_rms_norm(x16.data(), w16.data(), 1e-6f, T, h, out.data(), nullptr, 1.0f);
      launch_rms_norm(x16.data(), folded16.data(), 1e-6f, T, h, out_folded.data(), nullptr);
      const double bound = 1.01 * unit_roundoff(dtype_of<Act>) + 1e-5;
      const double offset_error = worst(floats(out), reference(x)), folded_error = worst(floats(out_folded), reference(x));
      INFO(label("rms_norm with w_offset 1", {T, h}) << ": " << offset_error << " (folded weight: " << folded_error << ")");
      CHECK(offset_error <= bound);
      CHECK(offset_error < folded_error);
      std::vector<Act> fx = x16, delta = d16;
      launch_add_rms_norm(fx.data(), delta.data(), w16.data(), 1e-6f, T, h, delta.data(), nullptr, 1.0f);
      CHECK(worst(floats(delta), reference(sum)) <= bound);
      // The CPU backend, in fp32, to the same reference.
      Cpu c;
      Tensor c_out = c.f32(std::vector<float>(size_t(T * h)), {T, h});
      c.be->rms_norm(c.f32(x, {T, h}), c.f32(w, {h}), 1e-6f, c_out, 1.0f);
      CHECK(worst(c.read(c_out), reference(x)) <= 1e-5);
      Tensor cx = c.f32(x, {T, h}), c_sum = c.f32(std::vector<float>(size_t(T * h)), {T, h});
      c.be->add_norm(cx, c.f32(d, {T, h}), Backend::Norm::Rms, c.f32(w, {h}), Tensor(), 1e-6f, c_sum, 1.0f);
      std::vector<float> exact_sum(x.size());
      for (size_t i = 0; i < x.size(); ++i) exact_sum[i] = x[i] + d[i];
      CHECK(worst(c.read(c_sum), reference(exact_sum)) <= 1e-5);
      CHECK_THROWS_WITH(c.be->add_norm(cx, c.f32(d, {T, h}), Backend::Norm::Layer, c.f32(w, {h}), Tensor(), 1e-5f, c_sum,
                                       1.0f),
                        Catch::Contains("offset is for RMS norms"));
    }
  }
}

TEMPLATE_TEST_CASE("emulated cuda: add_norm is add then norm, bit for bit, in one launch", "[emulated]", __half, bf16) {
  using Act = TestType;
  std::mt19937 rng(4);
  for (int64_t T : {1, 5}) {
    for (int64_t h : {72, 1000}) {
      const std::vector<float> x = random_act<Act>(size_t(T * h), rng, 2.0f, 4.0f),
                               d = random_act<Act>(size_t(T * h), rng);
      const std::vector<float> w = random_act<Act>(size_t(h), rng, 0.5f, 1.5f),
                               b = random_act<Act>(size_t(h), rng, -0.5f, 0.5f);
      const std::vector<Act> x16 = elements<Act>(x), d16 = elements<Act>(d), w16 = elements<Act>(w),
                             b16 = elements<Act>(b);
      for (int kind = 0; kind < 3; ++kind) {  // layer norm with and without a bias, rms norm
        const bool rms = kind == 2;
        const Act* bias = kind == 0 ? b16.data() : nullptr;
        std::vector<Act> sum = poisoned<Act>(size_t(T * h)), want = poisoned<Act>(size_t(T * h));
        launch_add(x16.data(), d16.data(), sum.data(), T * h, nullptr);
        if (rms) launch_rms_norm(sum.data(), w16.data(), 1e-6f, T, h, want.data(), nullptr);
        else launch_layer_norm(sum.data(), w16.data(), bias, 1e-5f, T, h, want.data(), nullptr);
        std::vector<Act> fx = x16, delta = d16;  // out aliases delta, as ForwardOps::layer has it
        if (rms) launch_add_rms_norm(fx.data(), delta.data(), w16.data(), 1e-6f, T, h, delta.data(), nullptr);
        else launch_add_layer_norm(fx.data(), delta.data(), w16.data(), bias, 1e-5f, T, h, delta.data(), nullptr);
        const std::string what = label(rms ? "add_rms_norm" : "add_layer_norm", {T, h, kind});
        expect_close<Act>(floats(fx), floats(sum), 0.0, 0.0, what + ": x");
        expect_close<Act>(floats(delta), floats(want), 0.0, 0.0, what + ": out");
        // And against the CPU backend's fp32 add_norm.
        Cpu c;
        Tensor cx = c.f32(x, {T, h}), cout = c.f32(std::vector<float>(size_t(T * h)), {T, h});
        c.be->add_norm(cx, c.f32(d, {T, h}), rms ? Backend::Norm::Rms : Backend::Norm::Layer, c.f32(w, {h}),
                       kind == 0 ? c.f32(b, {h}) : Tensor(), rms ? 1e-6f : 1e-5f, cout);
        expect_close<Act>(floats(delta), c.read(cout), 3e-3, 3e-3, what + ": against the CPU");
      }
    }
  }
}

TEMPLATE_TEST_CASE("emulated cuda: add, activations, swiglu and the bias add match the CPU backend", "[emulated]",
                   __half, bf16) {
  using Act = TestType;
  std::mt19937 rng(5);
  const int64_t T = 3, h = 1001;
  Cpu c;
  const std::vector<float> a = random_act<Act>(size_t(T * h), rng, -4.0f, 4.0f);
  const std::vector<float> b = random_act<Act>(size_t(T * h), rng, -4.0f, 4.0f);
  const std::vector<Act> a16 = elements<Act>(a), b16 = elements<Act>(b);
  const int64_t n = T * h;

  Tensor c_sum = c.f32(std::vector<float>(size_t(n)), {T, h});
  c.be->add(c.f32(a, {T, h}), c.f32(b, {T, h}), c_sum);
  std::vector<Act> sum = poisoned<Act>(size_t(n));
  launch_add(a16.data(), b16.data(), sum.data(), n, nullptr);
  expect_close<Act>(floats(sum), c.read(c_sum), 1e-3, 1e-3, "add");

  for (Activation act : {Activation::ReLU, Activation::GELU}) {
    Tensor c_x = c.f32(a, {T, h});
    c.be->activation(act, c_x);
    std::vector<Act> x = a16;
    launch_activation(act == Activation::ReLU ? ActKind::ReLU : ActKind::GELU, x.data(), n, nullptr);
    expect_close<Act>(floats(x), c.read(c_x), 1e-3, 2e-3, act == Activation::ReLU ? "relu" : "gelu");
  }

  // SwiGLU over the stacked gate/up GEMM's rows [T, 2h]: a's row, then b's.
  std::vector<float> gu;
  for (int64_t t = 0; t < T; ++t) {
    gu.insert(gu.end(), a.begin() + t * h, a.begin() + (t + 1) * h);
    gu.insert(gu.end(), b.begin() + t * h, b.begin() + (t + 1) * h);
  }
  const std::vector<Act> gu16 = elements<Act>(gu);
  std::vector<Act> product = poisoned<Act>(size_t(n));
  launch_swiglu(gu16.data(), product.data(), T, h, nullptr);
  const std::vector<double> want_s = swiglu_reference(gu, T, h);
  expect_close<Act>(floats(product), std::vector<float>(want_s.begin(), want_s.end()), 2e-3, 2e-3, "swiglu");

  // y += bias, against the sum in fp32.
  const std::vector<float> bias = random_act<Act>(size_t(h), rng);
  std::vector<float> want(static_cast<size_t>(n));
  for (int64_t r = 0; r < T; ++r)
    for (int64_t k = 0; k < h; ++k) want[size_t(r * h + k)] = a[size_t(r * h + k)] + bias[size_t(k)];
  std::vector<Act> y = a16;
  const std::vector<Act> bias16 = elements<Act>(bias);
  launch_bias_add(y.data(), bias16.data(), T, h, nullptr);
  expect_close<Act>(floats(y), want, 2e-3, 2e-3, "bias add");
}

TEMPLATE_TEST_CASE("emulated cuda: rope matches the CPU backend, long positions included", "[emulated][tsan]",
                   __half, bf16) {
  using Act = TestType;
  std::mt19937 rng(6);
  const int64_t T = 3;
  for (auto [heads, d] : std::vector<std::pair<int64_t, int64_t>>{{6, 20}, {2, 128}}) {
    Cpu c;
    std::vector<float> inv_freq(size_t(d / 2));
    for (int64_t i = 0; i < d / 2; ++i) inv_freq[size_t(i)] = std::pow(10000.0f, -2.0f * float(i) / float(d));
    const std::vector<int32_t> pos{131071, 7, int32_t(rng() % 5000)};
    const std::vector<float> x = random_act<Act>(size_t(T * heads * d), rng);
    Tensor c_x = c.f32(x, {T, heads, d});
    c.be->rope(c_x, c.i32(pos), c.f32(inv_freq, {d / 2}));
    std::vector<Act> x16 = elements<Act>(x);
    RopeParams<Act> p{};
    p.x = x16.data();
    p.positions = pos.data();
    p.inv_freq = inv_freq.data();
    p.tokens = T;
    p.heads = int(heads);
    p.head_dim = int(d);
    p.token_stride = heads * d;
    launch_rope(p, nullptr);
    expect_close<Act>(floats(x16), c.read(c_x), 2e-3, 2e-3, label("rope", {T, heads, d}));
  }
}

namespace {

// launch_split_qkv's parameters for rows qkv of pos.size() tokens into q; k and v (or the
// caches) are the caller's.
template <class Act>
SplitQkvParams<Act> split_params(const std::vector<Act>& qkv, const std::vector<int32_t>& pos, const float* inv_freq,
                            std::vector<Act>& q, int64_t heads, int64_t kv_heads, int64_t d) {
  SplitQkvParams<Act> p{};
  p.qkv = qkv.data();
  p.positions = pos.data();
  p.inv_freq = inv_freq;
  p.q = q.data();
  p.tokens = int64_t(pos.size());
  p.heads = int(heads);
  p.kv_heads = int(kv_heads);
  p.head_dim = int(d);
  return p;
}

}  // namespace

TEMPLATE_TEST_CASE("emulated cuda: split_qkv splits and rotates the stacked rows as a float64 reference does",
                   "[emulated]", __half, bf16) {
  using Act = TestType;
  std::mt19937 rng(16);
  const int64_t T = 3;
  for (auto [heads, kv_heads, d] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{{6, 6, 20}, {8, 2, 64}, {4, 1, 128}}) {
    for (bool rotate : {true, false}) {
      const std::vector<int32_t> pos{131071, 7, int32_t(rng() % 5000)};
      const int64_t qd = heads * d, kvd = kv_heads * d;
      const std::vector<float> qkv = random_act<Act>(size_t(T * (qd + 2 * kvd)), rng);
      const std::vector<float> inv = rotate ? rope_inv_freq_of(d) : std::vector<float>();
      const std::vector<Act> qkv16 = elements<Act>(qkv);
      std::vector<Act> q = poisoned<Act>(size_t(T * qd)), k = poisoned<Act>(size_t(T * kvd)),
                       v = poisoned<Act>(size_t(T * kvd));
      SplitQkvParams<Act> p = split_params(qkv16, pos, rotate ? inv.data() : nullptr, q, heads, kv_heads, d);
      p.k = k.data();
      p.v = v.data();
      launch_split_qkv(p, nullptr);
      const std::vector<double> want = split_qkv_reference(qkv, pos, inv, heads, kv_heads, d);
      auto part = [&](int64_t at, int64_t n) { return std::vector<float>(want.begin() + at, want.begin() + at + n); };
      const std::string what = label(rotate ? "split_qkv rotated" : "split_qkv", {heads, kv_heads, d});
      expect_close<Act>(floats(q), part(0, T * qd), 2e-3, 2e-3, what + ": q");
      expect_close<Act>(floats(k), part(T * qd, T * kvd), 2e-3, 2e-3, what + ": k");
      expect_close<Act>(floats(v), part(T * (qd + kvd), T * kvd), 0.0, 0.0, what + ": v");
    }
  }
}

TEMPLATE_TEST_CASE("emulated cuda: split_qkv with the caches writes k and v into exactly the addressed rows",
                   "[emulated]", __half, bf16) {
  using Act = TestType;
  std::mt19937 rng(17);
  const int64_t T = 4, S = 3, C = 9;
  for (auto [heads, kv_heads, d] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{6, 2, 20}, {4, 4, 64}}) {
    // The last token's slot is outside the cache: it writes no row (as kv_store), but its q.
    const std::vector<int32_t> slots{2, 0, 2, 3}, pos{0, 8, 5, 3};
    const int64_t qd = heads * d, kvd = kv_heads * d;
    const std::vector<float> qkv = random_act<Act>(size_t(T * (qd + 2 * kvd)), rng);
    const std::vector<float> inv = rope_inv_freq_of(d);
    const std::vector<float> old = random_act<Act>(size_t(S * C * kvd), rng, 5.0f, 6.0f);
    const std::vector<Act> qkv16 = elements<Act>(qkv);
    std::vector<Act> q = poisoned<Act>(size_t(T * qd)), ck = elements<Act>(old), cv = elements<Act>(old);
    SplitQkvParams<Act> p = split_params(qkv16, pos, inv.data(), q, heads, kv_heads, d);
    p.cache_k = ck.data();
    p.cache_v = cv.data();
    p.slots = slots.data();
    p.slot_count = int(S);
    p.capacity = int(C);
    launch_split_qkv(p, nullptr);
    const std::vector<double> want = split_qkv_reference(qkv, pos, inv, heads, kv_heads, d);
    const auto [want_k, want_v] = caches_after_store(old, want, slots, pos, qd, kvd, S, C);
    const std::string what = label("split_qkv into the caches", {heads, kv_heads, d});
    expect_close<Act>(floats(q), std::vector<float>(want.begin(), want.begin() + T * qd), 2e-3, 2e-3, what + ": q");
    expect_close<Act>(floats(ck), std::vector<float>(want_k.begin(), want_k.end()), 2e-3, 2e-3, what + ": cache k");
    expect_close<Act>(floats(cv), std::vector<float>(want_v.begin(), want_v.end()), 0.0, 0.0, what + ": cache v");
  }
}

TEMPLATE_TEST_CASE("emulated cuda: kv_store writes exactly the addressed cache rows", "[emulated]", __half, bf16) {
  using Act = TestType;
  std::mt19937 rng(7);
  const int64_t T = 5, S = 3, C = 37;
  for (auto [kvh, d] : std::vector<std::pair<int64_t, int64_t>>{{2, 20}, {8, 128}}) {
    // Distinct (slot, position) pairs, the last position included, and one token out of range.
    const std::vector<int32_t> slots{0, 1, 2, 0, 3}, pos{int32_t(C - 1), 5, 12, 30, 0};
    const std::vector<float> k = random_act<Act>(size_t(T * kvh * d), rng),
                             v = random_act<Act>(size_t(T * kvh * d), rng);
    const std::vector<float> cache = random_act<Act>(size_t(S * C * kvh * d), rng);
    std::vector<float> want_k = cache, want_v = cache;
    for (int64_t t = 0; t < T; ++t) {
      if (slots[size_t(t)] >= S) continue;
      for (int64_t i = 0; i < kvh * d; ++i) {
        const size_t at = size_t((slots[size_t(t)] * C + pos[size_t(t)]) * kvh * d + i);
        want_k[at] = k[size_t(t * kvh * d + i)];
        want_v[at] = v[size_t(t * kvh * d + i)];
      }
    }
    const std::vector<Act> k16 = elements<Act>(k), v16 = elements<Act>(v);
    std::vector<Act> ck = elements<Act>(cache), cv = elements<Act>(cache);
    KvStoreParams<Act> p{};
    p.k = k16.data();
    p.v = v16.data();
    p.cache_k = ck.data();
    p.cache_v = cv.data();
    p.slots = slots.data();
    p.positions = pos.data();
    p.tokens = T;
    p.row = kvh * d;
    p.slot_count = int(S);
    p.capacity = int(C);
    launch_kv_store(p, nullptr);
    expect_close<Act>(floats(ck), want_k, 0.0, 0.0, label("kv_store k", {kvh, d}));
    expect_close<Act>(floats(cv), want_v, 0.0, 0.0, label("kv_store v", {kvh, d}));
  }
}

TEMPLATE_TEST_CASE("emulated cuda: combine_rows sums each token's weighted rows as float64 does", "[emulated]",
                   __half, bf16) {
  using Act = TestType;
  // A mixture of experts' combine: out[t] = sum_j w[t, j] src[rows[t, j]], fp32 sums of 16-bit
  // rows, one rounding to Act at the end. Odd shapes; poisoned output; a row outside src gives NaN.
  std::mt19937 rng(12);
  for (const auto& [T, k, h, A] : {std::tuple{1, 1, 1, 1}, {3, 2, 65, 6}, {17, 3, 1000, 51}}) {
    const std::vector<float> src = random_act<Act>(size_t(A * h), rng);
    std::vector<float> w(size_t(T * k));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (float& v : w) v = u(rng);
    std::vector<int32_t> rows(size_t(T * k));
    for (int32_t& r : rows) r = int32_t(rng() % uint32_t(A));
    std::vector<double> want(size_t(T * h));
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < h; ++c)
        for (int j = 0; j < k; ++j)
          want[size_t(t * h + c)] += double(w[size_t(t * k + j)]) * src[size_t(rows[size_t(t * k + j)] * h + c)];
    const std::vector<Act> src16 = elements<Act>(src);
    std::vector<Act> out = poisoned<Act>(size_t(T * h));
    launch_combine_rows(src16.data(), A, rows.data(), w.data(), T, k, h, out.data(), nullptr);
    std::vector<double> tol(want.size());
    for (size_t i = 0; i < want.size(); ++i)  // fp16 rounding (2 u16), made Act's
      tol[i] = act_tol<Act>(1e-6 + std::ldexp(std::fabs(want[i]), -10));
    expect_within(floats(out), want, tol, label("combine_rows", {T, k, h, A}));
  }
  const std::vector<Act> src16 = elements<Act>({1.0f, 2.0f});
  const std::vector<int32_t> bad = {1};
  const std::vector<float> w = {1.0f};
  std::vector<Act> out = poisoned<Act>(2);
  launch_combine_rows(src16.data(), 1, bad.data(), w.data(), 1, 1, 2, out.data(), nullptr);
  CHECK(std::isnan(to_float(out[0])));
}

TEST_CASE("emulated cuda: bf16 carries activations of 1e6, past fp16's 65504, through the norms and add",
          "[emulated][bf16]") {
  // Residual streams of bf16 checkpoints outgrow fp16 (act_types.cuh). Inputs are the bf16 values
  // of the cases above times M = 2^20 (about 1e6): still bf16 values, beyond fp16's 65504 (no fp16
  // run could take them). Scaling by a power of two is exact, so the bounds are those above with
  // their absolute terms times M where the result scales with the inputs (add, the sum of
  // add_norm) and unchanged where it does not (the norms: eps aside, norm(M x) = norm(x)).
  const float M = 0x1p20f;
  std::mt19937 rng(9);
  const int64_t T = 5, h = 1000;
  const auto big = [&](float lo, float hi) {
    std::vector<float> v = random_act<bf16>(size_t(T * h), rng, lo, hi);
    for (float& x : v) x *= M;
    return v;
  };
  const std::vector<float> x = big(2.0f, 4.0f), d = big(-1.0f, 1.0f), a = big(-4.0f, 4.0f);
  const std::vector<float> w = random_act<bf16>(size_t(h), rng, 0.5f, 1.5f),
                           b = random_act<bf16>(size_t(h), rng, -0.5f, 0.5f);
  CHECK(std::fabs(x[0]) > 65504.0f);
  const std::vector<bf16> x16 = elements<bf16>(x), d16 = elements<bf16>(d), a16 = elements<bf16>(a);
  const std::vector<bf16> w16 = elements<bf16>(w), b16 = elements<bf16>(b);
  Cpu c;

  Tensor c_out = c.f32(std::vector<float>(size_t(T * h)), {T, h});
  c.be->layer_norm(c.f32(x, {T, h}), c.f32(w, {h}), c.f32(b, {h}), 1e-5f, c_out);
  std::vector<bf16> out = poisoned<bf16>(size_t(T * h));
  launch_layer_norm(x16.data(), w16.data(), b16.data(), 1e-5f, T, h, out.data(), nullptr);
  expect_close<bf16>(floats(out), c.read(c_out), 3e-3, 3e-3, "layer_norm of 1e6");

  c.be->rms_norm(c.f32(x, {T, h}), c.f32(w, {h}), 1e-6f, c_out);
  out = poisoned<bf16>(size_t(T * h));
  launch_rms_norm(x16.data(), w16.data(), 1e-6f, T, h, out.data(), nullptr);
  expect_close<bf16>(floats(out), c.read(c_out), 3e-3, 3e-3, "rms_norm of 1e6");

  Tensor c_sum = c.f32(std::vector<float>(size_t(T * h)), {T, h});
  c.be->add(c.f32(a, {T, h}), c.f32(d, {T, h}), c_sum);
  out = poisoned<bf16>(size_t(T * h));
  launch_add(a16.data(), d16.data(), out.data(), T * h, nullptr);
  expect_close<bf16>(floats(out), c.read(c_sum), 1e-3 * M, 1e-3, "add of 1e6");

  for (bool rms : {false, true}) {
    Tensor cx = c.f32(x, {T, h}), cout = c.f32(std::vector<float>(size_t(T * h)), {T, h});
    c.be->add_norm(cx, c.f32(d, {T, h}), rms ? Backend::Norm::Rms : Backend::Norm::Layer, c.f32(w, {h}),
                   rms ? Tensor() : c.f32(b, {h}), rms ? 1e-6f : 1e-5f, cout);
    std::vector<bf16> fx = x16, delta = d16;
    if (rms) launch_add_rms_norm(fx.data(), delta.data(), w16.data(), 1e-6f, T, h, delta.data(), nullptr);
    else launch_add_layer_norm(fx.data(), delta.data(), w16.data(), b16.data(), 1e-5f, T, h, delta.data(), nullptr);
    const std::string what = rms ? "add_rms_norm of 1e6" : "add_layer_norm of 1e6";
    expect_close<bf16>(floats(fx), c.read(cx), 1e-3 * M, 1e-3, what + ": x");
    expect_close<bf16>(floats(delta), c.read(cout), 3e-3, 3e-3, what + ": out");
  }
}

namespace {

// Routing by its definition in float64: softmax, the k largest probabilities (the lower expert on
// a tie), renormalised or not; then the assignments grouped by expert, tokens ascending in each.
struct Routed {
  std::vector<int32_t> gather, combine_rows, begin, active;
  std::vector<double> weights;
  int distinct = 0;
};
Routed route_by_definition(const std::vector<float>& logits, int T, int E, int k, bool renormalize) {
  std::vector<std::vector<int>> chosen(static_cast<size_t>(T));
  std::vector<double> weights;
  for (int t = 0; t < T; ++t) {
    const float* row = logits.data() + size_t(t) * size_t(E);
    double top = row[0], sum = 0;
    for (int e = 0; e < E; ++e) top = std::max(top, double(row[e]));
    std::vector<double> p(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) sum += p[size_t(e)] = std::exp(double(row[e]) - top);
    std::vector<int> order(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) order[size_t(e)] = e;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[size_t(a)] > p[size_t(b)]; });
    std::vector<int> mine(order.begin(), order.begin() + k);
    double picked = 0;
    for (int e : mine) picked += p[size_t(e)] / sum;
    std::sort(mine.begin(), mine.end());
    for (int e : mine) weights.push_back(p[size_t(e)] / sum / (renormalize ? picked : 1.0));
    chosen[size_t(t)] = mine;
  }
  Routed r;
  r.weights = weights;
  r.begin.push_back(0);
  r.combine_rows.resize(size_t(T * k));
  for (int e = 0; e < E; ++e) {
    for (int t = 0; t < T; ++t)
      for (int j = 0; j < k; ++j)
        if (chosen[size_t(t)][size_t(j)] == e) {
          r.combine_rows[size_t(t * k + j)] = int32_t(r.gather.size());
          r.gather.push_back(t);
        }
    if (int(r.gather.size()) > r.begin.back()) r.active.push_back(e);
    r.begin.push_back(int32_t(r.gather.size()));
  }
  r.distinct = int(r.active.size());
  r.active.resize(size_t(std::min(E, T * k)), -1);
  return r;
}

}  // namespace

namespace {

// launch_route_experts against the definition for T tokens choosing k of E experts. Token 1's
// logits all tie, token 2's tie across the k-th place (the lower experts win). Poisoned outputs;
// the totals count on from what they held.
void check_routing(int T, int E, int k, bool renormalize, std::mt19937& rng) {
  const std::string what = label("route T E k renormalize", {T, E, k, renormalize});
  INFO(what);
  std::vector<float> logits = random_floats(size_t(T * E), rng, -4.0f, 4.0f, false);
  if (T > 2)
    for (int e = 0; e < E; ++e) {
      logits[size_t(E + e)] = 0.5f;
      if (e % 2 == 1) logits[size_t(2 * E + e)] = 3.0f;
    }
  const Routed want = route_by_definition(logits, T, E, k, renormalize);
  const int A = T * k, slots = std::min(E, A);
  std::vector<int32_t> gather(size_t(A), -7), rows(size_t(A), -7), begin(size_t(E + 1), -7), active(size_t(slots), -7);
  std::vector<float> weights(size_t(A), NAN);
  int32_t totals[3] = {5, 6, 7};
  RouteExpertsParams p{logits.data(), gather.data(), rows.data(), weights.data(), begin.data(), active.data(),
                       totals, T, E, k, slots, renormalize};
  launch_route_experts(p, nullptr);
  CHECK(gather == want.gather);
  CHECK(rows == want.combine_rows);
  CHECK(begin == want.begin);
  CHECK(active == want.active);
  std::vector<double> tol(want.weights.size());
  for (size_t i = 0; i < tol.size(); ++i) tol[i] = 1e-7 + 1e-5 * want.weights[i];  // float sums of E terms
  expect_within(std::vector<float>(weights), want.weights, tol, what + " weights");
  CHECK(totals[0] == 6);
  CHECK(totals[1] == 6 + T);
  CHECK(totals[2] == 7 + want.distinct);
}

}  // namespace

TEST_CASE("emulated cuda: experts routed on the device as float64 routes them", "[emulated]") {
  // Mixtral's 2 of 8, Qwen3-MoE's 8 of 128 unrenormalised, every limit (64 tokens, 16 of 256), k
  // equal to E, more experts than threads of a warp, more tokens than warps (a warp routes several).
  std::mt19937 rng(31);
  for (const auto& [T, E, k, renormalize] :
       {std::tuple{1, 8, 2, true}, {3, 8, 2, true}, {16, 128, 8, false}, {5, 60, 4, true}, {16, 256, 16, true},
        {7, 3, 3, false}, {16, 256, 1, true}, {9, 33, 5, false}, {64, 128, 8, false}, {40, 256, 16, true},
        {33, 9, 2, true}})
    check_routing(T, E, k, renormalize, rng);
}

TEST_CASE("emulated cuda: the routing kernel once, for ThreadSanitizer", "[emulated][tsan]") {
  std::mt19937 rng(32);
  check_routing(3, 40, 3, true, rng);  // two warps of tokens' shared rows, then a thread per expert
}
