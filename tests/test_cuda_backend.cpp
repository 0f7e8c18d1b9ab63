// The CUDA backend against the fp32 CPU backend, each case once with fp16 activations and once
// with bf16: both backends get the same inputs rounded to the activation dtype (the CPU one as
// fp32), shapes include odd sizes, and GPU outputs are poisoned with 0xFF bytes (a NaN in fp16
// and in bf16) beforehand so any element a kernel fails to write shows up. Without a GPU the
// tests warn and return; on a GPU without bf16 (below sm_80) the bf16 runs do. This file
// includes no CUDA header: it builds without CUDA too.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "kernel_test_support.h"
#include "strata/backend/backend.h"
#include "strata/backend/device_info.h"
#include "strata/core/dtype.h"
#include "strata/core/error.h"
#include "strata/quant/quant.h"

using namespace strata;
using test::count;
using test::spec_of;

// The rest of the test case runs once per activation dtype `act` (Catch's GENERATE: fp16, then
// bf16), which every failure names; the bf16 run ends with a warning on a GPU without bf16.
#define STRATA_REQUIRE_GPU_FOR_EACH_ACT(act)                                          \
  STRATA_REQUIRE_GPU();                                                               \
  const DType act = GENERATE(DType::F16, DType::BF16);                                \
  INFO("activations " << dtype_name(act));                                            \
  if (act == DType::BF16 && !cuda_has_bf16(0)) {                                      \
    WARN("the GPU has no bf16 (compute capability below 8.0): bf16 skipped");         \
    return;                                                                           \
  }

namespace {

// The tolerances below are fp16's, made act's by act_tol. Each fp16 bound covers an error made of
// roundings to fp16 (inputs are exact in fp16 and the CPU takes the same values in fp32; the
// kernels compute in fp32 and round their outputs, and some intermediates, to fp16), each at most
// u16 = 2^-11 relative, plus fp32 arithmetic (2^-24 an operation). With bf16 activations the same
// kernels round at the same places to bf16, each rounding erring by at most u_bf16 = 2^-8, so the
// bound with u_bf16 in place of u16 is at most tol * u_bf16 / u16 = 8 tol (the fp32 terms,
// multiplied as well, only loosen it). fp16: tol itself (the factor is exactly 1).
float act_tol(DType act, float fp16_tol) {
  return float(double(fp16_tol) * test::unit_roundoff(act) / test::unit_roundoff(DType::F16));
}

// n values uniform in [lo, hi), rounded to `act` (for fp16 the sequence random_f16 gives).
std::vector<float> random_act(DType act, size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  return test::random_floats(n, rng, lo, hi, act);
}

// Every element within atol + rtol * |want|; NaN (an unwritten, poisoned element) never passes.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, float atol, float rtol,
                  const std::string& what);

// Both backends, the GPU's with activations `act`, and the buffers one test case allocates on them.
struct Rig {
  explicit Rig(DType act_dtype) : act(act_dtype), gpu(make_cuda_backend(0, act_dtype)) {}
  DType act;
  std::unique_ptr<Backend> cpu = make_cpu_backend(2);
  std::unique_ptr<Backend> gpu;
  std::vector<Buffer> keep;

  Tensor upload(Backend& be, DType dt, const void* host, std::initializer_list<int64_t> dims, size_t offset = 0) {
    const size_t bytes = count(dims) * dtype_size(dt);
    keep.push_back(be.alloc(bytes + offset));
    Tensor t = keep.back().view(offset, dt, dims);
    be.copy_to_device(t.data, host, bytes);
    return t;
  }
  Tensor cpu_f32(const std::vector<float>& v, std::initializer_list<int64_t> dims) {
    REQUIRE(v.size() == count(dims));
    return upload(*cpu, DType::F32, v.data(), dims);
  }
  // v (exact in act) as an act tensor; offset: byte offset of the view inside its buffer (2 makes
  // it misaligned for paired loads).
  Tensor gpu_act(const std::vector<float>& v, std::initializer_list<int64_t> dims, size_t offset = 0) {
    REQUIRE(v.size() == count(dims));
    const std::vector<uint16_t> h = test::to_bits(v, act);
    return upload(*gpu, act, h.data(), dims, offset);
  }
  Tensor gpu_f32(const std::vector<float>& v, std::initializer_list<int64_t> dims) {
    REQUIRE(v.size() == count(dims));
    return upload(*gpu, DType::F32, v.data(), dims);
  }
  Tensor i32(Backend& be, const std::vector<int32_t>& v, std::initializer_list<int64_t> dims) {
    REQUIRE(v.size() == count(dims));
    return upload(be, DType::I32, v.data(), dims);
  }
  Tensor cpu_out(std::initializer_list<int64_t> dims) { return cpu_f32(std::vector<float>(count(dims), 0.0f), dims); }
  Tensor gpu_poisoned(DType dt, std::initializer_list<int64_t> dims, size_t offset = 0) {
    const std::vector<uint8_t> poison(count(dims) * dtype_size(dt), 0xFF);
    return upload(*gpu, dt, poison.data(), dims, offset);
  }
  Tensor act_poisoned(std::initializer_list<int64_t> dims, size_t offset = 0) {
    return gpu_poisoned(act, dims, offset);
  }
  std::vector<float> read(const Tensor& t) {
    std::vector<float> v(size_t(t.numel()));
    (t.device == Device::CUDA ? *gpu : *cpu).copy_to_host_f32(t, v.data());
    return v;
  }
  std::vector<int32_t> read_i32(const Tensor& t) {
    std::vector<int32_t> v(size_t(t.numel()));
    (t.device == Device::CUDA ? *gpu : *cpu).copy_to_host(v.data(), t.data, t.nbytes());
    return v;
  }
  // expect_close with fp16's tolerances made act's.
  void close(const std::vector<float>& got, const std::vector<float>& want, float fp16_atol, float fp16_rtol,
             const std::string& what) const {
    expect_close(got, want, act_tol(act, fp16_atol), act_tol(act, fp16_rtol), what);
  }
};

void expect_close(const std::vector<float>& got, const std::vector<float>& want, float atol, float rtol,
                  const std::string& what) {
  REQUIRE(got.size() == want.size());
  size_t bad = 0, first = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - double(want[i]));
    if (!(err <= atol + rtol * std::fabs(want[i]))) {
      if (bad++ == 0) first = i;
      if (!(err <= worst)) worst = err;
    }
  }
  INFO(what << ": " << bad << " of " << got.size() << " elements off, worst error " << worst << "; first at "
            << first << ": got " << (got.empty() ? 0.0f : got[first]) << ", want "
            << (want.empty() ? 0.0f : want[first]));
  CHECK(bad == 0);
}

std::string shape_label(const char* op, std::initializer_list<int64_t> dims) {
  std::string s = op;
  for (int64_t d : dims) s += " " + std::to_string(d);
  return s;
}

}  // namespace

TEST_CASE("cuda: make_cuda_backend explains why it cannot start", "[cuda]") {
  for (DType act : {DType::F16, DType::BF16}) {
    INFO("activations " << dtype_name(act));
    REQUIRE_THROWS_AS(make_cuda_backend(cuda_available() ? 1 << 20 : 0, act), Error);
  }
}

TEST_CASE("cuda: backend basics, validation and out-of-memory errors", "[cuda]") {
  STRATA_REQUIRE_GPU_FOR_EACH_ACT(act);
  Rig r(act);
  CHECK(std::string(r.gpu->name()) == "cuda");
  CHECK(r.gpu->device() == Device::CUDA);
  CHECK(r.gpu->activation_dtype() == act);

  // Round trip through device memory.
  std::mt19937 rng(1);
  const std::vector<float> v = random_act(act, 1001, rng);
  Tensor t = r.gpu_act(v, {7, 143});
  expect_close(r.read(t), v, 0.0f, 0.0f, "round trip");

  // Out of memory names the request and leaves the backend usable.
  try {
    r.gpu->alloc(size_t(1) << 52);
    FAIL("a 4 PiB allocation succeeded");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find(std::to_string(size_t(1) << 52)) != std::string::npos);
  }
  Tensor out = r.act_poisoned({7, 143});
  r.gpu->add(t, t, out);
  std::vector<float> twice(v.size());
  for (size_t i = 0; i < v.size(); ++i) twice[i] = 2.0f * v[i];
  expect_close(r.read(out), twice, 0.0f, 0.0f, "add after a failed alloc");

  // Entries refuse wrong dtypes (the other 16-bit type included), devices and shapes.
  Tensor w = r.gpu_act(random_act(act, 143 * 5, rng), {5, 143});
  Tensor bad_w = r.gpu_act(random_act(act, 142 * 5, rng), {5, 142});
  Tensor y = r.act_poisoned({7, 5});
  CHECK_THROWS_AS(r.gpu->linear(t, bad_w, Tensor(), y), Error);
  CHECK_THROWS_AS(r.gpu->linear(t, w, Tensor(), r.act_poisoned({7, 6})), Error);
  CHECK_THROWS_AS(r.gpu->add(t, r.gpu_f32(v, {7, 143}), out), Error);
  CHECK_THROWS_AS(r.gpu->add(t, r.cpu_f32(v, {7, 143}), out), Error);
  const DType other = act == DType::F16 ? DType::BF16 : DType::F16;
  CHECK_THROWS_AS(r.gpu->add(t, t, r.gpu_poisoned(other, {7, 143})), Error);
  CHECK_THROWS_AS(r.gpu->linear(t, r.gpu_poisoned(other, {5, 143}), Tensor(), y), Error);
  CHECK_THROWS_AS(r.gpu->argmax_rows(t, r.act_poisoned({7})), Error);
  Tensor q = r.gpu_act(random_act(act, 2 * 300, rng), {1, 2, 300});
  Tensor cache = r.gpu_act(random_act(act, 4 * 300, rng), {1, 4, 1, 300});
  CHECK_THROWS_AS(r.gpu->attention(q, cache, cache, r.i32(*r.gpu, {0}, {1}), r.i32(*r.gpu, {0}, {1}), 1.0f,
                                   r.act_poisoned({1, 2, 300})),
                  Error);
  r.gpu->synchronize();
}

TEST_CASE("cuda: embedding and gather_rows match the CPU backend", "[cuda]") {
  STRATA_REQUIRE_GPU_FOR_EACH_ACT(act);
  std::mt19937 rng(2);
  for (int64_t T : {1, 3, 17}) {
    for (int64_t h : {72, 120, 1000, 4096}) {
      Rig r(act);
      const int64_t V = 300;
      const std::vector<float> table = random_act(act, size_t(V * h), rng);
      std::vector<int32_t> ids(static_cast<size_t>(T));
      for (auto& id : ids) id = int32_t(rng() % V);
      ids[0] = int32_t(V - 1);
      const std::vector<float> base = random_act(act, size_t(T * h), rng);
      for (bool accumulate : {false, true}) {
        Tensor c_out = r.cpu_f32(base, {T, h});
        Tensor g_out = accumulate ? r.gpu_act(base, {T, h}) : r.act_poisoned({T, h});
        r.cpu->embedding(r.i32(*r.cpu, ids, {T}), r.cpu_f32(table, {V, h}), c_out, accumulate);
        r.gpu->embedding(r.i32(*r.gpu, ids, {T}), r.gpu_act(table, {V, h}), g_out, accumulate);
        r.close(r.read(g_out), r.read(c_out), accumulate ? 1e-3f : 0.0f, accumulate ? 1e-3f : 0.0f,
                shape_label(accumulate ? "embedding+=" : "embedding", {T, h}));
      }
      // gather_rows: pick rows of a [T, h] activation, repeats allowed.
      const int64_t B = T == 1 ? 1 : T - 1;
      std::vector<int32_t> rows(static_cast<size_t>(B));
      for (auto& x : rows) x = int32_t(rng() % T);
      rows.back() = int32_t(T - 1);
      Tensor c_g = r.cpu_out({B, h});
      Tensor g_g = r.act_poisoned({B, h});
      r.cpu->gather_rows(r.cpu_f32(base, {T, h}), r.i32(*r.cpu, rows, {B}), c_g);
      r.gpu->gather_rows(r.gpu_act(base, {T, h}), r.i32(*r.gpu, rows, {B}), g_g);
      r.close(r.read(g_g), r.read(c_g), 0.0f, 0.0f, shape_label("gather_rows", {T, h}));
    }
  }
}

TEST_CASE("cuda: layer_norm and rms_norm match the CPU backend", "[cuda]") {
  STRATA_REQUIRE_GPU_FOR_EACH_ACT(act);
  std::mt19937 rng(3);
  for (int64_t T : {1, 3, 17}) {
    for (int64_t h : {72, 120, 1000, 4096, 8192}) {
      Rig r(act);
      const std::vector<float> x = random_act(act, size_t(T * h), rng, 2.0f, 4.0f);  // an offset tests the mean
      const std::vector<float> w = random_act(act, size_t(h), rng, 0.5f, 1.5f);
      const std::vector<float> b = random_act(act, size_t(h), rng, -0.5f, 0.5f);
      for (bool with_bias : {true, false}) {
        Tensor c_out = r.cpu_out({T, h});
        Tensor g_out = r.act_poisoned({T, h});
        r.cpu->layer_norm(r.cpu_f32(x, {T, h}), r.cpu_f32(w, {h}), with_bias ? r.cpu_f32(b, {h}) : Tensor(), 1e-5f,
                          c_out);
        r.gpu->layer_norm(r.gpu_act(x, {T, h}), r.gpu_act(w, {h}), with_bias ? r.gpu_act(b, {h}) : Tensor(), 1e-5f,
                          g_out);
        r.close(r.read(g_out), r.read(c_out), 3e-3f, 3e-3f, shape_label("layer_norm", {T, h, with_bias}));
      }
      Tensor c_out = r.cpu_out({T, h});
      Tensor g_out = r.act_poisoned({T, h});
      r.cpu->rms_norm(r.cpu_f32(x, {T, h}), r.cpu_f32(w, {h}), 1e-6f, c_out);
      r.gpu->rms_norm(r.gpu_act(x, {T, h}), r.gpu_act(w, {h}), 1e-6f, g_out);
      r.close(r.read(g_out), r.read(c_out), 3e-3f, 3e-3f, shape_label("rms_norm", {T, h}));

      // In place (out aliases x).
      Tensor g_x = r.gpu_act(x, {T, h});
      r.gpu->rms_norm(g_x, r.gpu_act(w, {h}), 1e-6f, g_x);
      r.close(r.read(g_x), r.read(c_out), 3e-3f, 3e-3f, shape_label("rms_norm in place", {T, h}));
      Tensor g_y = r.gpu_act(x, {T, h});
      Tensor c_y = r.cpu_f32(x, {T, h});
      r.cpu->layer_norm(c_y, r.cpu_f32(w, {h}), r.cpu_f32(b, {h}), 1e-5f, c_y);
      r.gpu->layer_norm(g_y, r.gpu_act(w, {h}), r.gpu_act(b, {h}), 1e-5f, g_y);
      r.close(r.read(g_y), r.read(c_y), 3e-3f, 3e-3f, shape_label("layer_norm in place", {T, h}));
    }
  }
}

TEST_CASE("cuda: linear matches the CPU backend", "[cuda]") {
  STRATA_REQUIRE_GPU_FOR_EACH_ACT(act);
  std::mt19937 rng(4);
  const std::vector<std::pair<int64_t, int64_t>> in_out = {{72, 120}, {120, 72}, {1000, 1000}, {4096, 72}, {72, 4099}};
  for (int64_t T : {1, 3, 17}) {
    for (auto [in, out] : in_out) {
      Rig r(act);
      const float ws = 1.0f / std::sqrt(float(in));  // keeps outputs of order 1
      const std::vector<float> x = random_act(act, size_t(T * in), rng);
      const std::vector<float> w = random_act(act, size_t(out * in), rng, -ws, ws);
      const std::vector<float> bias = random_act(act, size_t(out), rng);
      for (bool with_bias : {false, true}) {
        Tensor c_y = r.cpu_out({T, out});
        Tensor g_y = r.act_poisoned({T, out});
        r.cpu->linear(r.cpu_f32(x, {T, in}), r.cpu_f32(w, {out, in}), with_bias ? r.cpu_f32(bias, {out}) : Tensor(),
                      c_y);
        r.gpu->linear(r.gpu_act(x, {T, in}), r.gpu_act(w, {out, in}), with_bias ? r.gpu_act(bias, {out}) : Tensor(),
                      g_y);
        r.close(r.read(g_y), r.read(c_y), 3e-3f, 5e-3f, shape_label("linear", {T, in, out, with_bias}));
      }
      // An fp32 output (the head's logits) holds cuBLAS's fp32 sums: only the summation order
      // differs from the CPU's over the same inputs, whose products are exact in fp32 (11 + 11 or
      // 8 + 8 significant bits), so this bound is fp32's whatever the activations.
      Tensor c_y = r.cpu_out({T, out});
      Tensor g_y = r.gpu_poisoned(DType::F32, {T, out});
      r.cpu->linear(r.cpu_f32(x, {T, in}), r.cpu_f32(w, {out, in}), Tensor(), c_y);
      r.gpu->linear(r.gpu_act(x, {T, in}), r.gpu_act(w, {out, in}), Tensor(), g_y);
      expect_close(r.read(g_y), r.read(c_y), 1e-4f, 1e-4f, shape_label("linear fp32 out", {T, in, out}));
      // With a bias (GPT-OSS's router): added to the fp32 sums in fp32.
      Tensor g_yb = r.gpu_poisoned(DType::F32, {T, out});
      r.cpu->linear(r.cpu_f32(x, {T, in}), r.cpu_f32(w, {out, in}), r.cpu_f32(bias, {out}), c_y);
      r.gpu->linear(r.gpu_act(x, {T, in}), r.gpu_act(w, {out, in}), r.gpu_act(bias, {out}), g_yb);
      expect_close(r.read(g_yb), r.read(c_y), 1e-4f, 1e-4f, shape_label("linear fp32 out, bias", {T, in, out}));
    }
  }
}

TEST_CASE("cuda: add, activations and swiglu match the CPU backend", "[cuda]") {
  STRATA_REQUIRE_GPU_FOR_EACH_ACT(act);
  std::mt19937 rng(5);
  for (int64_t T : {1, 3, 17}) {
    for (int64_t h : {72, 120, 1001, 4096}) {
      Rig r(act);
      const std::vector<float> a = random_act(act, size_t(T * h), rng, -4.0f, 4.0f);
      const std::vector<float> b = random_act(act, size_t(T * h), rng, -4.0f, 4.0f);
      Tensor c_out = r.cpu_out({T, h});
      Tensor g_out = r.act_poisoned({T, h});
      r.cpu->add(r.cpu_f32(a, {T, h}), r.cpu_f32(b, {T, h}), c_out);
      r.gpu->add(r.gpu_act(a, {T, h}), r.gpu_act(b, {T, h}), g_out);
      r.close(r.read(g_out), r.read(c_out), 1e-3f, 1e-3f, shape_label("add", {T, h}));

      for (Activation fn : {Activation::ReLU, Activation::GELU}) {
        Tensor c_x = r.cpu_f32(a, {T, h});
        Tensor g_x = r.gpu_act(a, {T, h});
        r.cpu->activation(fn, c_x);
        r.gpu->activation(fn, g_x);
        r.close(r.read(g_x), r.read(c_x), 1e-3f, 2e-3f, shape_label(fn == Activation::ReLU ? "relu" : "gelu", {T, h}));
      }

      // SwiGLU over the stacked gate/up GEMM's rows [T, 2h]: a's row, then b's.
      std::vector<float> gu;
      for (int64_t t = 0; t < T; ++t) {
        gu.insert(gu.end(), a.begin() + t * h, a.begin() + (t + 1) * h);
        gu.insert(gu.end(), b.begin() + t * h, b.begin() + (t + 1) * h);
      }
      Tensor g_s = r.act_poisoned({T, h});
      r.gpu->swiglu(r.gpu_act(gu, {T, 2 * h}), g_s);
      const std::vector<double> want = test::swiglu_reference(gu, T, h);
      r.close(r.read(g_s), std::vector<float>(want.begin(), want.end()), 2e-3f, 2e-3f, shape_label("swiglu", {T, h}));
      // GPT-OSS's clamped SwiGLU, a limit inside the values' range [-4, 4].
      Tensor g_c = r.act_poisoned({T, h});
      r.gpu->clamped_swiglu(r.gpu_act(gu, {T, 2 * h}), g_c, 1.5f, 1.702f);
      const std::vector<double> clamped = test::clamped_swiglu_reference(gu, T, h, 1.5, 1.702f);
      r.close(r.read(g_c), std::vector<float>(clamped.begin(), clamped.end()), 2e-3f, 2e-3f,
              shape_label("clamped swiglu", {T, h}));
    }
  }
}

TEST_CASE("cuda: combine_rows sums each token's weighted expert rows as the CPU backend does", "[cuda][moe]") {
  STRATA_REQUIRE_GPU_FOR_EACH_ACT(act);
  std::mt19937 rng(21);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (const auto& [T, k, h, A] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 1, 72, 1}, {3, 2, 1001, 6},
                                   {17, 8, 4096, 136}}) {
    Rig r(act);
    const std::vector<float> src = random_act(act, size_t(A * h), rng, -4.0f, 4.0f);
    std::vector<float> w(size_t(T * k));
    for (float& v : w) v = u(rng);
    std::vector<int32_t> rows(size_t(T * k));
    for (int32_t& x : rows) x = int32_t(rng() % uint32_t(A));
    Tensor c_out = r.cpu_out({T, h});
    Tensor g_out = r.act_poisoned({T, h});
    r.cpu->combine_rows(r.cpu_f32(src, {A, h}), r.i32(*r.cpu, rows, {T, k}), r.cpu_f32(w, {T, k}), c_out);
    r.gpu->combine_rows(r.gpu_act(src, {A, h}), r.i32(*r.gpu, rows, {T, k}), r.gpu_f32(w, {T, k}), g_out);
    r.close(r.read(g_out), r.read(c_out), 2e-3f, 2e-3f, shape_label("combine_rows", {T, k, h, A}));
  }
}

TEST_CASE("cuda: rope matches the CPU backend, long positions included", "[cuda]") {
  STRATA_REQUIRE_GPU_FOR_EACH_ACT(act);
  std::mt19937 rng(6);
  for (int64_t T : {1, 3, 17}) {
    for (auto [heads, d] : std::vector<std::pair<int64_t, int64_t>>{{6, 20}, {4, 64}, {8, 128}, {2, 256}}) {
      Rig r(act);
      std::vector<float> inv_freq(size_t(d / 2));
      for (int64_t i = 0; i < d / 2; ++i) inv_freq[size_t(i)] = std::pow(10000.0f, -2.0f * float(i) / float(d));
      std::vector<int32_t> pos(static_cast<size_t>(T));
      for (auto& p : pos) p = int32_t(rng() % 5000);
      pos[0] = T > 1 ? 131071 : 0;
      const std::vector<float> x = random_act(act, size_t(T * heads * d), rng);
      Tensor c_x = r.cpu_f32(x, {T, heads, d});
      Tensor g_x = r.gpu_act(x, {T, heads, d});
      r.cpu->rope(c_x, r.i32(*r.cpu, pos, {T}), r.cpu_f32(inv_freq, {d / 2}));
      r.gpu->rope(g_x, r.i32(*r.gpu, pos, {T}), r.gpu_f32(inv_freq, {d / 2}));
      r.close(r.read(g_x), r.read(c_x), 2e-3f, 2e-3f, shape_label("rope", {T, heads, d}));
    }
  }
}

TEST_CASE("cuda: add_norm adds the residual and norms it as add then norm do", "[cuda]") {
  STRATA_REQUIRE_GPU_FOR_EACH_ACT(act);
  std::mt19937 rng(4);
  for (int64_t T : {1, 3, 17}) {
    for (int64_t h : {72, 1000, 4096}) {
      Rig r(act);
      const std::vector<float> x = random_act(act, size_t(T * h), rng, 2.0f, 4.0f);
      const std::vector<float> d = random_act(act, size_t(T * h), rng);
      const std::vector<float> w = random_act(act, size_t(h), rng, 0.5f, 1.5f);
      const std::vector<float> b = random_act(act, size_t(h), rng, -0.5f, 0.5f);
      for (int kind = 0; kind < 3; ++kind) {  // layer norm with and without a bias, rms norm
        const Backend::Norm norm = kind == 2 ? Backend::Norm::Rms : Backend::Norm::Layer;
        const float eps = kind == 2 ? 1e-6f : 1e-5f;
        // Separately on the GPU: the fused op must give the same bits.
        Tensor sx = r.gpu_act(x, {T, h}), want = r.act_poisoned({T, h});
        r.gpu->add(sx, r.gpu_act(d, {T, h}), sx);
        if (kind == 2) r.gpu->rms_norm(sx, r.gpu_act(w, {h}), eps, want);
        else r.gpu->layer_norm(sx, r.gpu_act(w, {h}), kind == 0 ? r.gpu_act(b, {h}) : Tensor(), eps, want);
        Tensor fx = r.gpu_act(x, {T, h}), delta = r.gpu_act(d, {T, h});
        r.gpu->add_norm(fx, delta, norm, r.gpu_act(w, {h}), kind == 0 ? r.gpu_act(b, {h}) : Tensor(), eps, delta);
        const std::string what = std::string("add_norm ") + std::to_string(kind);
        r.close(r.read(fx), r.read(sx), 0.0f, 0.0f, shape_label((what + ": x").c_str(), {T, h}));
        r.close(r.read(delta), r.read(want), 0.0f, 0.0f, shape_label((what + ": out").c_str(), {T, h}));
        Tensor cx = r.cpu_f32(x, {T, h}), cout = r.cpu_out({T, h});
        r.cpu->add_norm(cx, r.cpu_f32(d, {T, h}), norm, r.cpu_f32(w, {h}), kind == 0 ? r.cpu_f32(b, {h}) : Tensor(), eps,
                        cout);
        r.close(r.read(delta), r.read(cout), 3e-3f, 3e-3f, shape_label((what + ": against the CPU").c_str(), {T, h}));
      }
    }
  }
}

TEST_CASE("cuda: split_qkv splits and rotates the stacked rows as a float64 reference does", "[cuda]") {
  STRATA_REQUIRE_GPU_FOR_EACH_ACT(act);
  std::mt19937 rng(16);
  for (int64_t T : {1, 3, 17}) {
    for (auto [heads, kv_heads, d] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
             {6, 6, 20}, {8, 2, 64}, {4, 1, 128}, {2, 2, 256}}) {
      for (bool rotate : {true, false}) {
        Rig r(act);
        std::vector<int32_t> pos(static_cast<size_t>(T));
        for (auto& p : pos) p = int32_t(rng() % 5000);
        pos[0] = T > 1 ? 131071 : 0;
        const int64_t qd = heads * d, kvd = kv_heads * d;
        const std::vector<float> qkv = random_act(act, size_t(T * (qd + 2 * kvd)), rng);
        const std::vector<float> inv = rotate ? test::rope_inv_freq_of(d) : std::vector<float>();
        Tensor q = r.act_poisoned({T, heads, d});
        Tensor k = r.act_poisoned({T, kv_heads, d});
        Tensor v = r.act_poisoned({T, kv_heads, d});
        r.gpu->split_qkv(r.gpu_act(qkv, {T, qd + 2 * kvd}), r.i32(*r.gpu, pos, {T}),
                         rotate ? r.gpu_f32(inv, {d / 2}) : Tensor(), q, k, v);
        const std::vector<double> want = test::split_qkv_reference(qkv, pos, inv, heads, kv_heads, d);
        auto part = [&](size_t at, size_t n) { return std::vector<float>(want.begin() + ptrdiff_t(at), want.begin() + ptrdiff_t(at + n)); };
        const std::string what = std::string(rotate ? "split_qkv rotated" : "split_qkv") + " heads " +
                                 std::to_string(heads) + "/" + std::to_string(kv_heads);
        r.close(r.read(q), part(0, size_t(T * qd)), 2e-3f, 2e-3f, shape_label((what + ": q").c_str(), {T, d}));
        r.close(r.read(k), part(size_t(T * qd), size_t(T * kvd)), 2e-3f, 2e-3f,
                shape_label((what + ": k").c_str(), {T, d}));
        r.close(r.read(v), part(size_t(T * (qd + kvd)), size_t(T * kvd)), 0.0f, 0.0f,
                shape_label((what + ": v").c_str(), {T, d}));
      }
    }
  }
}

namespace {
// Slots and positions of T tokens, no two the same (slot, position) of an S x C cache.
std::pair<std::vector<int32_t>, std::vector<int32_t>> distinct_cache_rows(int64_t T, int64_t S, int64_t C) {
  std::vector<int32_t> slots(static_cast<size_t>(T)), pos(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    slots[size_t(t)] = int32_t(t % S);
    pos[size_t(t)] = int32_t((t * 7 + 5) % C);
  }
  return {slots, pos};
}
}  // namespace

TEST_CASE("cuda: split_qkv_store puts k and v in their cache rows and leaves the others", "[cuda]") {
  STRATA_REQUIRE_GPU_FOR_EACH_ACT(act);
  std::mt19937 rng(18);
  const int64_t S = 3, C = 37;
  for (int64_t T : {1, 3, 17}) {
    for (auto [heads, kv_heads, d] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{6, 2, 20}, {32, 8, 128}}) {
      Rig r(act);
      const auto [slots, pos] = distinct_cache_rows(T, S, C);
      const int64_t qd = heads * d, kvd = kv_heads * d;
      const std::vector<float> qkv = random_act(act, size_t(T * (qd + 2 * kvd)), rng);
      const std::vector<float> inv = test::rope_inv_freq_of(d);
      const std::vector<float> old = random_act(act, size_t(S * C * kvd), rng, 5.0f, 6.0f);
      Tensor q = r.act_poisoned({T, heads, d});
      Tensor ck = r.gpu_act(old, {S, C, kv_heads, d}), cv = r.gpu_act(old, {S, C, kv_heads, d});
      r.gpu->split_qkv_store(r.gpu_act(qkv, {T, qd + 2 * kvd}), r.i32(*r.gpu, pos, {T}), r.gpu_f32(inv, {d / 2}), q,
                             r.i32(*r.gpu, slots, {T}), ck, cv);
      const std::vector<double> want = test::split_qkv_reference(qkv, pos, inv, heads, kv_heads, d);
      const auto [want_k, want_v] = test::caches_after_store(old, want, slots, pos, qd, kvd, S, C);
      r.close(r.read(q), std::vector<float>(want.begin(), want.begin() + T * qd), 2e-3f, 2e-3f,
              shape_label("split_qkv_store: q", {T, heads, d}));
      r.close(r.read(ck), std::vector<float>(want_k.begin(), want_k.end()), 2e-3f, 2e-3f,
              shape_label("split_qkv_store: cache k", {T, heads, d}));
      r.close(r.read(cv), std::vector<float>(want_v.begin(), want_v.end()), 0.0f, 0.0f,
              shape_label("split_qkv_store: cache v", {T, heads, d}));
    }
  }
}

TEST_CASE("cuda: split_qkv_store into quantized caches stores the bytes split_qkv then kv_store store", "[cuda][quant]") {
  STRATA_REQUIRE_GPU_FOR_EACH_ACT(act);
  std::mt19937 rng(19);
  const int64_t S = 3, C = 37, T = 17;
  for (const quant::QuantSpec spec : {quant::QuantSpec{4, 32}, quant::QuantSpec{4, 64}, quant::QuantSpec{8, 128}}) {
    for (auto [heads, kv_heads, d] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{6, 2, 20}, {32, 8, 128}}) {
      Rig r(act);
      const auto [slots, pos] = distinct_cache_rows(T, S, C);
      const int64_t qd = heads * d, kvd = kv_heads * d;
      const std::vector<float> qkv = random_act(act, size_t(T * (qd + 2 * kvd)), rng);
      const std::vector<float> inv = test::rope_inv_freq_of(d);
      const DType qt = quant::dtype_of(spec);
      const size_t cache_bytes = size_t(S * C * kv_heads) * quant::row_bytes(spec, d);
      auto cache = [&] {  // poisoned: the rows no token addresses must keep their bytes in both
        Tensor c = r.act_poisoned({int64_t(cache_bytes / 2)});
        return Tensor::quantized(c.data, qt, spec.group_size, Device::CUDA, {S, C, kv_heads, d});
      };
      const Tensor fk = cache(), fv = cache(), uk = cache(), uv = cache();
      Tensor fq = r.act_poisoned({T, heads, d}), uq = r.act_poisoned({T, heads, d});
      Tensor k = r.act_poisoned({T, kv_heads, d}), v = r.act_poisoned({T, kv_heads, d});
      const Tensor g_qkv = r.gpu_act(qkv, {T, qd + 2 * kvd}), g_pos = r.i32(*r.gpu, pos, {T});
      const Tensor g_slots = r.i32(*r.gpu, slots, {T}), g_inv = r.gpu_f32(inv, {d / 2});
      r.gpu->split_qkv_store(g_qkv, g_pos, g_inv, fq, g_slots, fk, fv);
      r.gpu->split_qkv(g_qkv, g_pos, g_inv, uq, k, v);
      r.gpu->kv_store(k, v, uk, uv, g_slots, g_pos);
      auto bytes = [&](const Tensor& t, size_t n) {
        std::vector<uint8_t> b(n);
        r.gpu->copy_to_host(b.data(), t.data, n);
        return b;
      };
      INFO(spec.bits << "-bit, group " << spec.group_size << ", heads " << heads << "/" << kv_heads << ", d " << d);
      CHECK(bytes(fq, size_t(T * qd) * 2) == bytes(uq, size_t(T * qd) * 2));
      CHECK(bytes(fk, cache_bytes) == bytes(uk, cache_bytes));
      CHECK(bytes(fv, cache_bytes) == bytes(uv, cache_bytes));
    }
  }
}

TEST_CASE("cuda: kv_store writes exactly the addressed cache rows", "[cuda]") {
  STRATA_REQUIRE_GPU_FOR_EACH_ACT(act);
  std::mt19937 rng(7);
  for (int64_t T : {1, 3, 17}) {
    for (auto [kvh, d] : std::vector<std::pair<int64_t, int64_t>>{{2, 20}, {1, 64}, {8, 128}}) {
      Rig r(act);
      const int64_t S = 3, C = 37;
      std::vector<int32_t> slots(static_cast<size_t>(T)), pos(static_cast<size_t>(T));
      // Distinct (slot, position) pairs, the last position included: two tokens writing one row
      // race on the GPU (found on the first H100 run, when t = 15 also hit (0, C - 1)).
      for (int64_t t = 0; t < T; ++t) {
        slots[size_t(t)] = int32_t(t % S);
        pos[size_t(t)] = t == 0 ? int32_t(C - 1) : int32_t((t * 7 + 5) % (C - 1));
      }
      std::set<std::pair<int32_t, int32_t>> pairs;
      for (int64_t t = 0; t < T; ++t) pairs.insert({slots[size_t(t)], pos[size_t(t)]});
      REQUIRE(pairs.size() == size_t(T));
      const std::vector<float> k = random_act(act, size_t(T * kvh * d), rng);
      const std::vector<float> v = random_act(act, size_t(T * kvh * d), rng);
      const std::vector<float> ck = random_act(act, size_t(S * C * kvh * d), rng);
      const std::vector<float> cv = random_act(act, size_t(S * C * kvh * d), rng);
      Tensor c_ck = r.cpu_f32(ck, {S, C, kvh, d}), c_cv = r.cpu_f32(cv, {S, C, kvh, d});
      Tensor g_ck = r.gpu_act(ck, {S, C, kvh, d}), g_cv = r.gpu_act(cv, {S, C, kvh, d});
      r.cpu->kv_store(r.cpu_f32(k, {T, kvh, d}), r.cpu_f32(v, {T, kvh, d}), c_ck, c_cv, r.i32(*r.cpu, slots, {T}),
                      r.i32(*r.cpu, pos, {T}));
      r.gpu->kv_store(r.gpu_act(k, {T, kvh, d}), r.gpu_act(v, {T, kvh, d}), g_ck, g_cv, r.i32(*r.gpu, slots, {T}),
                      r.i32(*r.gpu, pos, {T}));
      r.close(r.read(g_ck), r.read(c_ck), 0.0f, 0.0f, shape_label("kv_store k", {T, kvh, d}));
      r.close(r.read(g_cv), r.read(c_cv), 0.0f, 0.0f, shape_label("kv_store v", {T, kvh, d}));
    }
  }
}

namespace {

// Runs attention on both backends over a random cache and compares. q_offset_bytes > 0 puts q
// at a misaligned address, which forces the scalar kernel (no paired loads).
void check_attention(DType act, int64_t T, int64_t heads, int64_t kv_heads, int64_t d, int64_t S, int64_t C,
                     const std::vector<int32_t>& slots, const std::vector<int32_t>& pos, float q_range,
                     std::mt19937& rng, size_t q_offset_bytes = 0) {
  Rig r(act);
  const std::vector<float> q = random_act(act, size_t(T * heads * d), rng, -q_range, q_range);
  const std::vector<float> ck = random_act(act, size_t(S * C * kv_heads * d), rng);
  const std::vector<float> cv = random_act(act, size_t(S * C * kv_heads * d), rng);
  const float scale = 1.0f / std::sqrt(float(d));
  Tensor c_out = r.cpu_out({T, heads, d});
  Tensor g_out = r.act_poisoned({T, heads, d}, q_offset_bytes);
  r.cpu->attention(r.cpu_f32(q, {T, heads, d}), r.cpu_f32(ck, {S, C, kv_heads, d}), r.cpu_f32(cv, {S, C, kv_heads, d}),
                   r.i32(*r.cpu, slots, {T}), r.i32(*r.cpu, pos, {T}), scale, c_out);
  r.gpu->attention(r.gpu_act(q, {T, heads, d}, q_offset_bytes), r.gpu_act(ck, {S, C, kv_heads, d}),
                   r.gpu_act(cv, {S, C, kv_heads, d}), r.i32(*r.gpu, slots, {T}), r.i32(*r.gpu, pos, {T}), scale,
                   g_out);
  r.close(r.read(g_out), r.read(c_out), 2e-3f, 1e-2f,
          shape_label("attention T heads kv_heads d C", {T, heads, kv_heads, d, C}));
}

}  // namespace

TEST_CASE("cuda: attention matches the CPU backend (GQA, MQA, MHA, odd head dims)", "[cuda]") {
  STRATA_REQUIRE_GPU_FOR_EACH_ACT(act);
  std::mt19937 rng(8);
  const int64_t S = 3, C = 600;
  for (int64_t T : {1, 3, 17}) {
    for (auto [heads, kv_heads] : std::vector<std::pair<int64_t, int64_t>>{{6, 2}, {4, 1}, {8, 8}}) {
      for (int64_t d : {20, 64, 128}) {
        std::vector<int32_t> slots(static_cast<size_t>(T)), pos(static_cast<size_t>(T));
        for (int64_t t = 0; t < T; ++t) {
          slots[size_t(t)] = int32_t(rng() % S);
          pos[size_t(t)] = int32_t(rng() % C);
        }
        pos[0] = 0;                                   // a single key
        if (T > 1) pos[1] = int32_t(C - 1);           // the whole cache
        if (T > 2) pos[2] = 63;                       // exactly one tile of 64 keys
        check_attention(act, T, heads, kv_heads, d, S, C, slots, pos, 1.0f, rng);
      }
    }
  }
  // The largest head dim, an odd head dim and a misaligned q (both take the scalar kernel).
  check_attention(act, 3, 4, 2, 256, 2, 130, {0, 1, 1}, {129, 64, 0}, 1.0f, rng);
  check_attention(act, 3, 4, 2, 15, 2, 130, {1, 0, 1}, {129, 65, 7}, 1.0f, rng);
  check_attention(act, 3, 4, 2, 64, 2, 130, {1, 0, 1}, {129, 65, 7}, 1.0f, rng, 2);
}

TEST_CASE("cuda: attention over a long context with peaked scores", "[cuda]") {
  STRATA_REQUIRE_GPU_FOR_EACH_ACT(act);
  std::mt19937 rng(9);
  // 4100 = 64 tiles of 64 keys plus 4; large |q| makes the running max move between tiles.
  check_attention(act, 3, 8, 2, 128, 1, 4100, {0, 0, 0}, {4099, 64, 4000}, 6.0f, rng);
  check_attention(act, 2, 4, 4, 64, 2, 4100, {1, 0}, {4099, 2047}, 1.0f, rng);
}

// The split-KV kernels (attention_split.cu) with chunk counts forced through STRATA_SPLIT_KV (each
// check makes its backend inside the setting): one chunk (the shared K/V reads of a GQA group
// alone), three, and eight (more chunks than a short context has tiles, so some are empty). The
// tests above run the rule's choice ("auto"), which on a GPU splits their long contexts.
TEST_CASE("cuda: split-KV decode attention matches the CPU backend", "[cuda][split]") {
  STRATA_REQUIRE_GPU_FOR_EACH_ACT(act);
  std::mt19937 rng(11);
  // Tokens of three slots: 334 keys (six tiles), 65, a whole tile of 64, 63, a single key; a
  // step of T tokens takes the first T.
  const std::vector<int32_t> all_slots{0, 1, 2, 0, 1}, all_pos{333, 64, 63, 62, 0};
  for (const char* chunks : {"1", "3", "8"}) {
    test::SplitKvSetting setting(chunks);
    INFO("STRATA_SPLIT_KV=" << chunks);
    for (int64_t d : {64, 80, 128, 15}) {
      for (auto [heads, kv_heads] : std::vector<std::pair<int64_t, int64_t>>{{4, 4}, {8, 2}, {16, 2}, {12, 1}}) {
        for (int64_t T : {1, 3, 5}) {
          const std::vector<int32_t> slots(all_slots.begin(), all_slots.begin() + T);
          const std::vector<int32_t> pos(all_pos.begin(), all_pos.begin() + T);
          check_attention(act, T, heads, kv_heads, d, 3, 340, slots, pos, 1.0f, rng);
        }
      }
    }
    // The largest head dim, a scalar one over 128, a misaligned q.
    check_attention(act, 2, 8, 2, 256, 2, 340, {1, 0}, {200, 64}, 1.0f, rng);
    check_attention(act, 2, 4, 4, 161, 2, 340, {1, 0}, {200, 64}, 1.0f, rng);
    check_attention(act, 2, 4, 2, 64, 2, 340, {1, 0}, {150, 7}, 1.0f, rng, 2);
  }
  // 32 chunks (the most) over a long context with peaked scores: chunk maxima far apart.
  test::SplitKvSetting most("32");
  check_attention(act, 3, 8, 2, 128, 1, 4100, {0, 0, 0}, {4099, 64, 4000}, 6.0f, rng);
  // Decode tokens ahead of a prompt: the tensor-core kernel takes the prompt's tiles, the split
  // kernels the rest.
  std::vector<int32_t> slots, pos;
  for (int32_t s = 0; s < 5; ++s) {
    slots.push_back(s);
    pos.push_back(40 + 60 * s);
  }
  for (int32_t i = 0; i < 70; ++i) {
    slots.push_back(5);
    pos.push_back(i);
  }
  check_attention(act, int64_t(slots.size()), 8, 2, 64, 6, 600, slots, pos, 1.0f, rng);
}

namespace {

// Tokens of sequences packed one after another, as a prefill step lays them out: each entry is
// (slot, first position, tokens).
struct Run {
  int32_t slot, first, count;
};
void packed_runs(const std::vector<Run>& runs, std::vector<int32_t>& slots, std::vector<int32_t>& pos) {
  for (const Run& r : runs) {
    for (int32_t i = 0; i < r.count; ++i) {
      slots.push_back(r.slot);
      pos.push_back(r.first + i);
    }
  }
}

void check_packed_attention(DType act, const std::vector<Run>& runs, int64_t heads, int64_t kv_heads, int64_t d,
                            int64_t S, int64_t C, float q_range, std::mt19937& rng, size_t q_offset_bytes = 0) {
  std::vector<int32_t> slots, pos;
  packed_runs(runs, slots, pos);
  check_attention(act, int64_t(slots.size()), heads, kv_heads, d, S, C, slots, pos, q_range, rng, q_offset_bytes);
}

}  // namespace

// Prefill layouts, which the tensor-core kernel takes in tiles of 64 queries (attention_tc.cu;
// head dims multiple of 16 up to 128), leaving decode-like tiles to the per-token kernel.
TEST_CASE("cuda: prefill attention on tensor cores matches the CPU backend", "[cuda]") {
  STRATA_REQUIRE_GPU_FOR_EACH_ACT(act);
  std::mt19937 rng(10);
  for (int64_t d : {16, 64, 80, 96, 128}) {
    // One prompt of 200 tokens: four tiles, the last one partial.
    check_packed_attention(act, {{1, 0, 200}}, 8, 2, d, 3, 600, 1.0f, rng);
    // Three prompts packed: tiles where two sequences meet.
    check_packed_attention(act, {{2, 0, 37}, {0, 0, 100}, {1, 0, 90}}, 6, 6, d, 3, 600, 1.0f, rng);
  }
  // A prompt's second chunk: its queries start at position 300 and read the first chunk's keys.
  check_packed_attention(act, {{0, 300, 128}}, 4, 1, 128, 2, 600, 1.0f, rng);
  // Decode tokens of five sequences ahead of a prompt: the first tile (six runs) stays with the
  // per-token kernel, the second goes to tensor cores.
  check_packed_attention(act, {{0, 40, 1}, {1, 7, 1}, {2, 300, 1}, {3, 0, 1}, {4, 99, 1}, {5, 0, 70}}, 8, 2, 64, 6, 600,
                         1.0f, rng);
  // Four runs of 16 in a tile (taken) and five runs in the next (not taken).
  check_packed_attention(act, {{0, 0, 16}, {1, 10, 16}, {2, 20, 16}, {3, 30, 16}, {0, 16, 12}, {1, 26, 13}, {2, 36, 13},
                          {3, 46, 13}, {4, 0, 13}},
                         4, 2, 64, 5, 600, 1.0f, rng);
  // A misaligned q takes the kernel's scalar loads.
  check_packed_attention(act, {{1, 0, 150}}, 4, 2, 64, 2, 600, 1.0f, rng, 2);
  // A long context with peaked scores moves the running max between key tiles.
  check_packed_attention(act, {{0, 1900, 100}}, 8, 2, 128, 1, 2000, 6.0f, rng);
}

TEST_CASE("cuda: argmax_rows matches the CPU backend and takes the lowest index on ties", "[cuda]") {
  STRATA_REQUIRE_GPU_FOR_EACH_ACT(act);
  std::mt19937 rng(10);
  for (int64_t B : {1, 3, 17}) {
    for (int64_t V : {7, 1000, 32000, 50257}) {
      Rig r(act);
      std::vector<float> logits = random_act(act, size_t(B * V), rng, -8.0f, 8.0f);
      if (B > 1) {  // row 1: the maximum appears three times
        const int64_t a = V / 3, b = V / 2, c = V - 1;
        for (int64_t j = 0; j < V; ++j) logits[size_t(V + j)] = std::min(logits[size_t(V + j)], 7.0f);
        logits[size_t(V + c)] = logits[size_t(V + b)] = logits[size_t(V + a)] = 9.0f;
      }
      if (B > 2)  // row 2: all equal
        for (int64_t j = 0; j < V; ++j) logits[size_t(2 * V + j)] = -1.0f;
      Tensor c_out = r.i32(*r.cpu, std::vector<int32_t>(size_t(B), -1), {B});
      Tensor g_out = r.i32(*r.gpu, std::vector<int32_t>(size_t(B), -1), {B});
      r.cpu->argmax_rows(r.cpu_f32(logits, {B, V}), c_out);
      r.gpu->argmax_rows(r.gpu_act(logits, {B, V}), g_out);
      const std::vector<int32_t> want = r.read_i32(c_out);
      INFO("argmax B " << B << " V " << V);
      CHECK(r.read_i32(g_out) == want);
      if (B > 1) CHECK(want[1] == int32_t(V / 3));
      if (B > 2) CHECK(want[2] == 0);
      // fp32 logits (the head's): the same picks, and values one fp16 or bf16 rounding would merge
      // stay apart.
      if (B > 2) logits[size_t(2 * V + V - 1)] = -1.0f + 1e-6f;
      Tensor g32 = r.i32(*r.gpu, std::vector<int32_t>(size_t(B), -1), {B});
      r.gpu->argmax_rows(r.gpu_f32(logits, {B, V}), g32);
      const std::vector<int32_t> got32 = r.read_i32(g32);
      for (int64_t b = 0; b < B; ++b) CHECK(got32[size_t(b)] == (b == 2 ? int32_t(V - 1) : want[size_t(b)]));
    }
  }
}

TEST_CASE("cuda: quantize_rows and dequantize_rows equal the host reference byte for byte", "[cuda][quant]") {
  STRATA_REQUIRE_GPU_FOR_EACH_ACT(act);
  std::mt19937 rng(11);
  for (int bits : {4, 8})
    for (int group : {32, 64, 128})
      for (auto [rows, n] : std::vector<std::pair<int64_t, int64_t>>{{1, 128}, {37, 256}, {5, 4096}}) {
        const quant::QuantSpec spec = spec_of(bits, group);
        const std::string label = shape_label("quant bits group rows n", {bits, group, rows, n});
        INFO(label);
        Rig r(act);
        std::vector<float> x = random_act(act, size_t(rows * n), rng, -3.0f, 3.0f);
        for (int64_t i = 0; i < n && rows > 1; i += 7) x[size_t(n + i)] = 0.5f;  // flat stretches in row 1
        const std::vector<uint16_t> xh = test::to_bits(x, act);
        const size_t qbytes = size_t(rows) * quant::row_bytes(spec, n);
        std::vector<uint8_t> want(qbytes);
        quant::quantize_rows(spec, xh.data(), act, rows, n, want.data());

        const Tensor gx = r.gpu_act(x, {rows, n});
        const Tensor gq = r.act_poisoned({int64_t(qbytes / 2)});  // bytes, poisoned
        r.gpu->quantize_rows(spec, gx, gq.data);
        std::vector<uint8_t> got(qbytes);
        r.gpu->copy_to_host(got.data(), gq.data, qbytes);
        size_t differ = 0;
        for (size_t i = 0; i < qbytes; ++i) differ += got[i] != want[i];
        CHECK(differ == 0);

        std::vector<uint16_t> back(x.size());
        quant::dequantize_rows(spec, want.data(), rows, n, back.data(), act);
        const Tensor gout = r.act_poisoned({rows, n});
        r.gpu->dequantize_rows(spec, gq.data, gout);
        std::vector<uint16_t> gback(x.size());
        r.gpu->copy_to_host(gback.data(), gout.data, gback.size() * 2);
        CHECK(gback == back);
      }
}

TEST_CASE("the GPU dtype: --dtype auto follows a bf16 checkpoint where the GPU has bf16, and bad names are refused", "[bf16]") {
  CHECK(gpu_activation_dtype("fp16", DType::BF16) == DType::F16);
  CHECK(gpu_activation_dtype("bf16", DType::F16) == DType::BF16);
  CHECK(gpu_activation_dtype("auto", DType::F16) == DType::F16);
  CHECK(gpu_activation_dtype("auto", DType::F32) == DType::F16);
  const bool has_bf16 = !cuda_available() || cuda_has_bf16(0);
  CHECK(gpu_activation_dtype("auto", DType::BF16) == (has_bf16 ? DType::BF16 : DType::F16));
  CHECK_THROWS_WITH(gpu_activation_dtype("half", DType::F16), Catch::Contains("--dtype half"));
}

TEST_CASE("CUDA: bf16 runs where the card has it and is refused below sm_80, naming the capability", "[cuda][bf16]") {
  if (!cuda_available()) {
    WARN("no GPU: skipped");
    return;
  }
  if (cuda_has_bf16(0)) {
    const std::unique_ptr<Backend> be = make_cuda_backend(0, DType::BF16);
    CHECK(be->activation_dtype() == DType::BF16);
  }
  CHECK_THROWS_WITH(make_cuda_backend(0, DType::F32), Catch::Contains("F16 or BF16"));
  // The emulated device plays a Turing card (7.5) when asked; a real one is what it is.
  setenv("STRATA_EMULATED_CC", "75", 1);
  const CudaCapability cc = cuda_compute_capability(0);
  if (cc.major == 7 && cc.minor == 5) {
    CHECK_THROWS_WITH(make_cuda_backend(0, DType::BF16),
                      Catch::Contains("compute capability 8.0") && Catch::Contains("has 7.5") &&
                          Catch::Contains("--dtype fp16"));
    CHECK(gpu_activation_dtype("auto", DType::BF16) == DType::F16);  // the card's fallback, not an error
    CHECK(make_cuda_backend(0, DType::F16)->activation_dtype() == DType::F16);
  } else if (!cuda_has_bf16(0)) {
    CHECK_THROWS_WITH(make_cuda_backend(0, DType::BF16), Catch::Contains("compute capability 8.0"));
  }
  unsetenv("STRATA_EMULATED_CC");
}
