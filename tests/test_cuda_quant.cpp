// The CUDA backend's quantized kernels against the host quantization reference
// (include/strata/quant/quant.h, src/quant/quant.cpp) and plain double arithmetic, never against
// CUDA code: quantize/dequantize bytes, the fused dequant linear, kv_store into quantized caches
// and attention over them. Shapes include rows that the group does not divide (a shorter last
// group), odd lengths (a lone last nibble), misaligned views and token counts beyond one pass of
// the fused kernel; GPU outputs are poisoned with 0xFF bytes (fp16 NaN) beforehand so unwritten
// elements show. Without a GPU the tests warn and return. No CUDA header: builds without CUDA.
// The expected values and error bounds are in quant_kernel_cases.h, which the CPU emulation of
// these kernels (cuda_emulation/test_quant_emulated.cpp) shares.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "kernel_test_support.h"
#include "quant_kernel_cases.h"
#include "strata/backend/backend.h"
#include "strata/core/dtype.h"
#include "strata/core/error.h"
#include "strata/quant/quant.h"
#include "strata/runtime/moe_routing.h"

using namespace strata;
using namespace strata::test;  // kernel_test_support.h, quant_kernel_cases.h

namespace {

DType qdtype(int bits) { return bits == 4 ? DType::Q4 : DType::Q8; }

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

// y = x @ dequant(w)^T + bias on the GPU; quant_kernel_cases.h has the expected values and bounds.
void check_quant_linear(Gpu& g, const quant::QuantSpec& spec, int64_t T, int64_t out, int64_t in, bool with_bias,
                        size_t w_offset, size_t x_offset, std::mt19937& rng) {
  g.keep.clear();
  const QuantLinearCase c = make_quant_linear_case(spec, T, out, in, with_bias, rng);
  const Tensor gw = g.quantized(&c.w, c.w.size(), spec.bits, spec.group_size, {out, in}, w_offset);
  const Tensor gx = g.f16(c.x, {T, in}, x_offset);
  const Tensor gb = with_bias ? g.f16(c.bias, {out}) : Tensor();
  const Tensor gy = g.poisoned(DType::F16, {T, out});
  g.be->linear(gx, gw, gb, gy);
  expect_within(g.read(gy), c.want, c.tol,
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

// Backend::linears (a decode step's experts): jobs over codes within one pass of the fused kernel
// go in grouped launches, per weight shape and token tier; the others (more tokens, fp16 weights)
// one linear() each. Every job against double arithmetic, and bit for bit what linear() gives it.
TEST_CASE("cuda: linears over codes give each job what linear() gives it", "[cuda][quant][moe]") {
  STRATA_REQUIRE_GPU();
  Gpu g;
  std::mt19937 rng(24);
  struct Job {
    int bits, group;
    int64_t out, in, T;
  };
  // Two expert shapes of each bit width, every token tier, 17 tokens (linear()).
  std::vector<Job> specs;
  const int64_t counts[] = {1, 2, 1, 3, 6, 5, 1, 9, 16, 17, 1, 4};
  for (size_t i = 0; i < 48; ++i) {
    const int bits = i % 3 == 2 ? 8 : 4;
    const bool down = i % 2 == 1;
    specs.push_back({bits, 64, down ? 40 : 74, down ? 37 : 128, counts[i % std::size(counts)]});
  }
  std::vector<QuantLinearCase> cases;
  std::vector<Backend::LinearJob> jobs;
  for (const Job& j : specs) {
    cases.push_back(make_quant_linear_case(spec_of(j.bits, j.group), j.T, j.out, j.in, false, rng));
    const QuantLinearCase& c = cases.back();
    jobs.push_back({g.f16(c.x, {j.T, j.in}), g.quantized(&c.w, c.w.size(), j.bits, j.group, {j.out, j.in}),
                    g.poisoned(DType::F16, {j.T, j.out})});
  }
  // And one over fp16 weights, which cuBLAS computes.
  const std::vector<float> w16 = random_floats(size_t(24 * 40), rng, -1.0f, 1.0f, DType::F16),
                           x16 = random_floats(size_t(3 * 40), rng, -1.0f, 1.0f, DType::F16);
  jobs.push_back({g.f16(x16, {3, 40}), g.f16(w16, {24, 40}), g.poisoned(DType::F16, {3, 24})});
  // Launches issued: one per weight shape and token tier (the fewest of 1, 2, 4, 8, 16 tokens a
  // pass that cover a job), one per job of 17 tokens, and one cuBLAS GEMM.
  const auto tier = [](int64_t T) {
    for (int64_t tokens : {1, 2, 4, 8})
      if (T <= tokens) return tokens;
    return int64_t(16);
  };
  std::set<std::tuple<int64_t, int64_t, int, int64_t>> launches;
  int64_t alone = 1;
  for (const Job& j : specs) {
    if (j.T > 16) ++alone;
    else launches.insert({j.out, j.in, j.bits, tier(j.T)});
  }
  const int64_t before = device_launches_issued();
  g.be->linears(jobs);
  CHECK(device_launches_issued() - before == int64_t(launches.size()) + alone);
  for (size_t i = 0; i < specs.size(); ++i) {
    const Job& j = specs[i];
    const std::string what = label("linears job bits out in T", {int64_t(i), j.bits, j.out, j.in, j.T});
    expect_within(g.read(jobs[i].y), cases[i].want, cases[i].tol, what);
    const Tensor alone = g.poisoned(DType::F16, {j.T, j.out});
    g.be->linear(jobs[i].x, jobs[i].w, Tensor(), alone);
    CHECK(g.bytes(jobs[i].y.data, jobs[i].y.nbytes()) == g.bytes(alone.data, alone.nbytes()));
  }
  const std::vector<float> y16 = g.read(jobs.back().y);
  for (int64_t t = 0; t < 3; ++t)
    for (int64_t o = 0; o < 24; ++o) {
      double want = 0, mag = 0;
      for (int64_t i = 0; i < 40; ++i) {
        want += double(x16[size_t(t * 40 + i)]) * double(w16[size_t(o * 40 + i)]);
        mag += std::fabs(double(x16[size_t(t * 40 + i)]) * double(w16[size_t(o * 40 + i)]));
      }
      CHECK(std::fabs(double(y16[size_t(t * 24 + o)]) - want) <= 0x1p-10 * mag + 1e-6);
    }
}

TEST_CASE("cuda: experts routed on the device give route_tokens' routing and each expert linear()'s rows",
          "[cuda][quant][moe]") {
  STRATA_REQUIRE_GPU();
  Gpu g;
  std::mt19937 rng(25);
  const int64_t T = 7, E = 12, k = 3, A = T * k, out = 37, in = 72;
  const std::vector<float> logits = random_floats(size_t(T * E), rng, -3.0f, 3.0f, false);
  const MoeRouting want = route_tokens(logits.data(), T, int(E), int(k), true);
  const Backend::DeviceRouting r{g.poisoned(DType::I32, {A}),     g.poisoned(DType::I32, {A}),
                                 g.poisoned(DType::F32, {A}),     g.poisoned(DType::I32, {E + 1}),
                                 g.poisoned(DType::I32, {E}),     g.i32({0, 0, 0})};
  std::vector<Tensor> w;
  std::vector<std::vector<uint8_t>> codes;
  for (int64_t e = 0; e < E; ++e) {
    codes.push_back(make_quant_linear_case(spec_of(4, 32), 1, out, in, false, rng).w);
    w.push_back(g.quantized(&codes.back(), codes.back().size(), 4, 32, {out, in}));
  }
  // Steps of up to 64 tokens route on the device, over codes or fp16 rows of whole 4-byte words;
  // longer steps, more than 256 experts and odd fp16 rows do not.
  CHECK(g.be->routes_on_device(T, E, k, w[0]));
  CHECK(g.be->routes_on_device(64, E, k, w[0]));
  CHECK(g.be->routes_on_device(T, E, k, g.poisoned(DType::F16, {out, in})));
  CHECK(!g.be->routes_on_device(65, E, k, w[0]));
  CHECK(!g.be->routes_on_device(T, 257, k, w[0]));
  CHECK(!g.be->routes_on_device(T, E, k, g.poisoned(DType::F16, {out, in + 1})));

  const Tensor x = g.f16(random_floats(size_t(A * in), rng, -1.0f, 1.0f, DType::F16), {A, in});
  const Tensor y = g.poisoned(DType::F16, {A, out});
  const int64_t before = device_launches_issued();
  g.be->route_experts(g.f32(logits, {T, E}), k, true, r);
  g.be->routed_linears(x, w, r, T, y);
  CHECK(device_launches_issued() - before == 2);  // one for the routing, one for every expert

  const auto ints = [&](const Tensor& t) {
    std::vector<int32_t> v(size_t(t.numel()));
    g.be->copy_to_host(v.data(), t.data, t.nbytes());
    return v;
  };
  CHECK(ints(r.gather) == want.gather);
  CHECK(ints(r.combine_rows) == want.combine_rows);
  CHECK(ints(r.expert_begin) == want.expert_begin);
  std::vector<int32_t> active;
  for (int64_t e = 0; e < E; ++e)
    if (want.expert_begin[size_t(e + 1)] > want.expert_begin[size_t(e)]) active.push_back(int32_t(e));
  active.resize(size_t(E), -1);
  CHECK(ints(r.active) == active);
  CHECK(ints(r.totals) == std::vector<int32_t>{1, int32_t(T), want.active_experts()});
  const std::vector<float> weights = g.read(r.combine_weights);
  for (size_t i = 0; i < weights.size(); ++i)  // expf may differ from the host's in its last place
    CHECK(std::fabs(weights[i] - want.combine_weights[i]) <= 1e-6f * want.combine_weights[i]);

  for (int64_t e = 0; e < E; ++e) {
    const int64_t first = want.expert_begin[size_t(e)], n = want.expert_begin[size_t(e + 1)] - first;
    if (n == 0) continue;
    const Tensor alone = g.poisoned(DType::F16, {n, out});
    g.be->linear(x.rows(first, n), w[size_t(e)], Tensor(), alone);
    INFO("expert " << e << ", " << n << " rows");
    CHECK(g.bytes(y.rows(first, n).data, size_t(n * out) * 2) == g.bytes(alone.data, alone.nbytes()));
  }

  // With each expert's bias (GPT-OSS): its rows are linear()'s with that bias, bit for bit.
  std::vector<Tensor> biases;
  for (int64_t e = 0; e < E; ++e) biases.push_back(g.f16(random_floats(size_t(out), rng, -1.0f, 1.0f, DType::F16), {out}));
  const Tensor yb = g.poisoned(DType::F16, {A, out});
  g.be->routed_linears(x, w, r, T, yb, biases);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t first = want.expert_begin[size_t(e)], n = want.expert_begin[size_t(e + 1)] - first;
    if (n == 0) continue;
    const Tensor alone = g.poisoned(DType::F16, {n, out});
    g.be->linear(x.rows(first, n), w[size_t(e)], biases[size_t(e)], alone);
    INFO("expert " << e << ", " << n << " rows, with bias");
    CHECK(g.bytes(yb.rows(first, n).data, size_t(n * out) * 2) == g.bytes(alone.data, alone.nbytes()));
  }
  CHECK_THROWS_WITH(g.be->routed_linears(x, w, r, T, yb, std::vector<Tensor>(biases.begin(), biases.begin() + 2)),
                    Catch::Contains("2 biases for 12 experts"));

  // fp16 experts through the same routing: each expert's rows within the bound of double
  // arithmetic over its weights (cuBLAS, which linear() runs, sums in another order).
  std::vector<QuantLinearCase> plain;
  std::vector<Tensor> w16;
  std::vector<float> x16;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = std::max<int32_t>(want.expert_begin[size_t(e + 1)] - want.expert_begin[size_t(e)], 1);
    plain.push_back(make_plain_linear_case(n, out, in, rng, DType::F16));
    w16.push_back(g.f16(plain.back().w16, {out, in}));
    if (want.expert_begin[size_t(e + 1)] > want.expert_begin[size_t(e)])
      x16.insert(x16.end(), plain.back().x.begin(), plain.back().x.end());
  }
  const Tensor y16 = g.poisoned(DType::F16, {A, out});
  g.be->routed_linears(g.f16(x16, {A, in}), w16, r, T, y16);
  const std::vector<float> got16 = g.read(y16);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t first = want.expert_begin[size_t(e)], n = want.expert_begin[size_t(e + 1)] - first;
    if (n == 0) continue;
    expect_within(std::vector<float>(got16.begin() + first * out, got16.begin() + (first + n) * out),
                  plain[size_t(e)].want, plain[size_t(e)].tol, label("fp16 expert rows", {e, n}));
  }
}

TEST_CASE("cuda: kv_store quantizes cache rows as the host reference does", "[cuda][quant]") {
  STRATA_REQUIRE_GPU();
  Gpu g;
  std::mt19937 rng(23);
  const int64_t S = QuantKvStoreCase::S, C = QuantKvStoreCase::C;
  for (int bits : {4, 8})
    for (int group : {32, 64, 128})
      for (int64_t d : {20, 16, 33, 64, 128})
        for (int64_t kv_heads : {1, 3}) {
          const quant::QuantSpec spec = spec_of(bits, group);
          const std::string what = label("kv_store bits group d kv_heads", {bits, group, d, kv_heads});
          INFO(what);
          g.keep.clear();
          const QuantKvStoreCase c = make_quant_kv_store_case(spec, d, kv_heads, rng);
          const int64_t T = int64_t(c.slots.size());
          const size_t cache_bytes = c.cache_bytes;
          const Tensor ck = g.quantized(nullptr, cache_bytes, bits, group, {S, C, kv_heads, d});
          const Tensor cv = g.quantized(nullptr, cache_bytes, bits, group, {S, C, kv_heads, d});
          g.be->kv_store(g.f16(c.k, {T, kv_heads, d}), g.f16(c.v, {T, kv_heads, d}), ck, cv, g.i32(c.slots),
                         g.i32(c.pos));
          expect_same_bytes(g.bytes(ck.data, cache_bytes), c.want_k, what + " keys");
          expect_same_bytes(g.bytes(cv.data, cache_bytes), c.want_v, what + " values");
        }
}

namespace {

// Attention over a quantized cache on the GPU; quant_kernel_cases.h has the expected values and
// bounds (with `prefill_tiles`, the bound of the tensor-core kernel's fp16 operands).
void check_quant_attention(Gpu& g, const quant::QuantSpec& spec, int64_t T, int64_t heads, int64_t kv_heads, int64_t d,
                           int64_t S, int64_t C, const std::vector<int32_t>& slots, const std::vector<int32_t>& pos,
                           float q_range, std::mt19937& rng, bool prefill_tiles = false) {
  g.keep.clear();
  QuantAttentionCase c = make_quant_attention_case(spec, T, heads, kv_heads, d, S, C, slots, pos, q_range, rng);
  if (prefill_tiles) allow_fp16_operands(c);
  const size_t cache_bytes = c.k.size();
  const Tensor gk = g.quantized(&c.k, cache_bytes, spec.bits, spec.group_size, {S, C, kv_heads, d});
  const Tensor gv = g.quantized(&c.v, cache_bytes, spec.bits, spec.group_size, {S, C, kv_heads, d});
  const Tensor out = g.poisoned(DType::F16, {T, heads, d});
  g.be->attention(g.f16(c.q, {T, heads, d}), gk, gv, g.i32(slots), g.i32(pos), c.scale, out);
  expect_within(g.read(out), c.want, c.tol,
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

// The split-KV kernels over quantized caches (quant_attention.cu) with forced chunk counts (a
// backend made inside each STRATA_SPLIT_KV setting): 1, 3, and 8 (empty chunks).
TEST_CASE("cuda: split-KV decode over quantized caches matches double arithmetic", "[cuda][quant][split]") {
  STRATA_REQUIRE_GPU();
  std::mt19937 rng(28);
  const std::vector<int32_t> all_slots{0, 1, 2, 0, 1}, all_pos{333, 64, 63, 62, 0};
  for (const char* chunks : {"1", "3", "8"}) {
    SplitKvSetting setting(chunks);
    INFO("STRATA_SPLIT_KV=" << chunks);
    Gpu g;
    for (int bits : {4, 8})
      for (int64_t d : {64, 80, 128, 33})
        for (auto [heads, kv_heads] : std::vector<std::pair<int64_t, int64_t>>{{4, 4}, {8, 2}, {16, 2}, {12, 1}})
          for (int64_t T : {1, 5}) {
            const std::vector<int32_t> slots(all_slots.begin(), all_slots.begin() + T);
            const std::vector<int32_t> pos(all_pos.begin(), all_pos.begin() + T);
            check_quant_attention(g, spec_of(bits, d == 80 ? 64 : 32), T, heads, kv_heads, d, 3, 340, slots, pos, 1.0f,
                                  rng);
          }
    for (int bits : {4, 8}) check_quant_attention(g, spec_of(bits, 64), 2, 8, 2, 256, 2, 340, {1, 0}, {200, 64}, 1.0f, rng);
  }
  SplitKvSetting most("32");
  Gpu g;
  for (int bits : {4, 8})
    check_quant_attention(g, spec_of(bits, 128), 2, 8, 1, 128, 1, 2000, {0, 0}, {1999, 700}, 8.0f, rng);
}

TEST_CASE("cuda: prefill over quantized caches on tensor cores", "[cuda][quant]") {
  STRATA_REQUIRE_GPU();
  Gpu g;
  std::mt19937 rng(26);
  for (int bits : {4, 8})
    for (int group : {32, 64, 128})
      for (int64_t d : {16, 64, 96, 128}) {
        // Three prompts packed (tiles where two meet); decode tokens ahead of a prompt (a tile
        // left to the per-token kernel beside one taken).
        std::vector<int32_t> slots, pos;
        packed_tokens({{2, 0, 37}, {0, 0, 100}, {1, 0, 90}}, slots, pos);
        check_quant_attention(g, spec_of(bits, group), int64_t(slots.size()), 8, 2, d, 3, 300, slots, pos, 1.0f, rng,
                              true);
        slots.clear();
        pos.clear();
        packed_tokens({{0, 40, 1}, {1, 7, 1}, {2, 200, 1}, {0, 41, 1}, {3, 0, 1}, {1, 0, 70}}, slots, pos);
        check_quant_attention(g, spec_of(bits, group), int64_t(slots.size()), 4, 4, d, 4, 300, slots, pos, 1.0f, rng,
                              true);
      }
  std::vector<int32_t> slots, pos;
  packed_tokens({{0, 1900, 100}}, slots, pos);  // a second chunk, peaked scores across key tiles
  check_quant_attention(g, spec_of(4, 128), int64_t(slots.size()), 8, 2, 128, 1, 2000, slots, pos, 6.0f, rng, true);
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
