// The quantized CUDA kernels (src/backend/cuda/quant.cu, quant_linear.cu, quant_attention.cu),
// which have never run on a GPU, run on the CPU through the emulation in fake/: the cases of
// tests/test_cuda_quant.cpp (fewer shapes), calling the launchers directly on host memory, with
// the expected values and bounds of tests/quant_kernel_cases.h; every case for fp16 and for bf16
// activations (TestType), quantize and dequantize also for fp32 rows.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "emulated_act.h"
#include "kernels.h"
#include "split_kv.h"
#include "quant_kernel_cases.h"

using namespace strata;
using namespace strata::test;
using namespace strata::cuda;

namespace {

// Host memory standing in for device buffers: `bytes` bytes at byte `offset` of an allocation
// aligned to 256 bytes (as cudaMalloc's), holding a copy of `src` or the 0xFF poison.
struct Arena {
  std::vector<std::vector<uint8_t>> blocks;
  template <class T = uint8_t>
  T* put(const void* src, size_t bytes, size_t offset = 0) {
    blocks.emplace_back(bytes + offset + 256, uint8_t(0xFF));
    uint8_t* base = blocks.back().data();
    base += (256 - reinterpret_cast<uintptr_t>(base) % 256) % 256;
    if (src) std::memcpy(base + offset, src, bytes);
    return reinterpret_cast<T*>(base + offset);
  }
  // A copy of v in E (values of E).
  template <class E>
  const E* of(const std::vector<float>& v, size_t offset = 0) {
    const std::vector<E> e = elements<E>(v);
    return put<const E>(e.data(), e.size() * sizeof(E), offset);
  }
};
std::vector<uint8_t> bytes_of(const void* p, size_t n) {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  return std::vector<uint8_t>(b, b + n);
}

}  // namespace

namespace {

// Rows of E (__half, bf16 or float): quantize (bytes equal the host reference's) and dequantize
// the host's bytes (values equal bit for bit, also at an output address that rules out vector
// stores); rows 1..5 special.
template <class E>
void check_quantize_round_trip(int bits, int group, int64_t n, std::mt19937& rng) {
  const int64_t rows = 6;
  const DType dt = dtype_of<E>;
  const quant::QuantSpec spec = spec_of(bits, group);
  const std::string what = label((std::string(dtype_name(dt)) + " bits group n").c_str(), {bits, group, n});
  INFO(what);
  Arena a;
  // (fp32 rows get special rows of fp16 values, as in the GPU test.)
  std::vector<float> x = random_floats(size_t(rows * n), rng, -3.0f, 3.0f, dt);
  add_special_rows(x, n, rng, dt == DType::F32 ? DType::F16 : dt);
  const size_t qbytes = size_t(rows) * quant::row_bytes(spec, n);
  std::vector<uint8_t> want(qbytes);
  const std::vector<E> xe = elements<E>(x);
  quant::quantize_rows(spec, xe.data(), dt, rows, n, want.data());

  QuantParams p;
  p.rows = rows;
  p.row = quant_row_layout(bits, group, int(n));
  uint8_t* q = a.put(nullptr, qbytes);
  launch_quantize_rows(p, a.of<E>(x), q, nullptr);
  expect_same_bytes(bytes_of(q, qbytes), want, "quantize " + what);

  const size_t out_bytes = size_t(rows * n) * sizeof(E);
  std::vector<uint8_t> back(out_bytes);
  quant::dequantize_rows(spec, want.data(), rows, n, back.data(), dt);
  const uint8_t* qd = a.put(want.data(), qbytes);
  for (size_t offset : {size_t(0), sizeof(E)}) {
    E* out = a.put<E>(nullptr, out_bytes, offset);
    launch_dequantize_rows(p, qd, out, nullptr);
    expect_same_bytes(bytes_of(out, out_bytes), back, "dequantize " + what + " offset " + std::to_string(offset));
  }
}

}  // namespace

TEMPLATE_TEST_CASE("emulated cuda: quantize/dequantize equal the host reference for any row length",
                   "[emulated][quant]", __half, bf16) {
  std::mt19937 rng(21);
  for (int bits : {4, 8})
    for (int group : {32, 64, 128})
      for (int64_t n : {1, 20, 33, 64, 200, 1000}) {
        check_quantize_round_trip<TestType>(bits, group, n, rng);
        if (std::is_same_v<TestType, __half>) check_quantize_round_trip<float>(bits, group, n, rng);  // once
      }
}

namespace {

template <class Act>
void check_quant_linear(const quant::QuantSpec& spec, int64_t T, int64_t out, int64_t in, bool with_bias,
                        size_t w_offset, size_t x_offset, std::mt19937& rng) {
  const QuantLinearCase c = make_quant_linear_case(spec, T, out, in, with_bias, rng, dtype_of<Act>);
  Arena a;
  QuantLinearParams<Act> p;
  p.x = a.of<Act>(c.x, x_offset);
  p.w = a.put(c.w.data(), c.w.size(), w_offset);
  p.bias = with_bias ? a.of<Act>(c.bias) : nullptr;
  p.y = a.put<Act>(nullptr, size_t(T * out) * sizeof(Act));
  p.tokens = T;
  p.out = int(out);
  p.row = quant_row_layout(spec.bits, spec.group_size, int(in));
  launch_quant_linear(p, nullptr);
  expect_within(floats(p.y, size_t(T * out)), c.want, c.tol,
                label("linear bits group T out in bias w_offset x_offset",
                      {spec.bits, spec.group_size, T, out, in, with_bias, int64_t(w_offset), int64_t(x_offset)}));
}

}  // namespace

TEMPLATE_TEST_CASE("emulated cuda: fused dequant linear matches double arithmetic over the reference's weights",
                   "[emulated][quant]", __half, bf16) {
  using Act = TestType;
  std::mt19937 rng(22);
  for (int bits : {4, 8})
    for (int group : {32, 64, 128})
      for (auto [out, in] : std::vector<std::pair<int64_t, int64_t>>{{37, 72}, {29, 200}})
        for (int64_t T : {1, 7, 17})  // 17: a second pass over the weights
          check_quant_linear<Act>(spec_of(bits, group), T, out, in, T % 2 == 1, 0, 0, rng);
  // Views that rule out the vector loads: w 4-byte aligned only, x 2-byte aligned only.
  for (int bits : {4, 8})
    for (int64_t T : {3, 16}) {
      check_quant_linear<Act>(spec_of(bits, 64), T, 45, 264, true, 4, 2, rng);
      check_quant_linear<Act>(spec_of(bits, 32), T, 45, 264, false, 4, 0, rng);
    }
}

// launch_quant_linears: 110 jobs over one weight shape (67 at the 1-token tier: two launches),
// every token tier and empty jobs, each job against double arithmetic and bit for bit what
// launch_quant_linear gives it alone; outputs start poisoned.
TEMPLATE_TEST_CASE("emulated cuda: grouped fused linears give each job what its own launch gives it", "[emulated][quant]",
                   __half, bf16) {
  using Act = TestType;
  std::mt19937 rng(23);
  for (auto [bits, group, out, in] : {std::tuple{4, 32, 37, 72}, std::tuple{8, 64, 20, 200}}) {
    const quant::QuantSpec spec = spec_of(bits, group);
    const QuantRowLayout row = quant_row_layout(bits, group, int(in));
    const int64_t counts[] = {1, 1, 1, 2, 1, 1, 3, 1, 0, 1, 5, 1, 16, 1, 8, 1, 9, 1, 4, 1};  // 13 of 20 at 1
    Arena a;
    std::vector<QuantLinearCase> cases;
    std::vector<QuantLinearJob<Act>> jobs;
    for (int i = 0; i < 110; ++i) {
      const int64_t T = counts[i % std::size(counts)];
      cases.push_back(make_quant_linear_case(spec, T, out, in, false, rng, dtype_of<Act>));
      const QuantLinearCase& c = cases.back();
      jobs.push_back({a.of<Act>(c.x), a.put(c.w.data(), c.w.size()), a.put<Act>(nullptr, size_t(T * out) * sizeof(Act) + 8), T});
    }
    launch_quant_linears(jobs.data(), int(jobs.size()), int(out), row, nullptr);
    for (size_t i = 0; i < jobs.size(); ++i) {
      const int64_t T = jobs[i].tokens;
      const std::string what = label("linears job bits T", {int64_t(i), bits, T});
      expect_within(floats(jobs[i].y, size_t(T * out)), cases[i].want, cases[i].tol, what);
      const uint8_t* past = reinterpret_cast<const uint8_t*>(jobs[i].y + T * out);
      CHECK(bytes_of(past, 8) == std::vector<uint8_t>(8, 0xFF));  // nothing written past the job's rows
      QuantLinearParams<Act> p{};
      p.x = jobs[i].x;
      p.w = jobs[i].w;
      p.y = a.put<Act>(nullptr, size_t(T * out) * sizeof(Act));
      p.tokens = T;
      p.out = int(out);
      p.row = row;
      launch_quant_linear(p, nullptr);
      expect_same_bytes(bytes_of(jobs[i].y, size_t(T * out) * sizeof(Act)), bytes_of(p.y, size_t(T * out) * sizeof(Act)),
                        what + " against its own launch");
    }
  }
}

TEMPLATE_TEST_CASE("emulated cuda: routed fused linears give each active expert what its own launch gives it",
                   "[emulated][quant]", __half, bf16) {
  using Act = TestType;
  // Experts' rows as the device's routing lays them out: each expert's rows contiguous, their
  // count read from expert_begin, every token tier up to max_rows in one launch (past 16 rows, a
  // pass per 16, as launch_quant_linear takes them); inactive
  // experts (no rows) and the active list's -1 slots compute nothing. Each expert's rows within
  // the bound of double arithmetic and, over codes, bit for bit its own launch_quant_linear's;
  // 16-bit weight rows (bits 16) have no launch of their own. Nothing past the routed rows is
  // written.
  std::mt19937 rng(29);
  struct Shape {
    int bits, group, out, in, max_rows;
    std::vector<int64_t> rows;  // each expert's
  };
  for (const Shape& s : {Shape{4, 32, 37, 72, 16, {16, 0, 9, 1, 5, 0, 2, 3, 16, 8, 4, 0}},
                         Shape{8, 64, 20, 200, 2, {1, 2, 0, 2, 1, 0, 0}}, Shape{4, 128, 45, 130, 1, {1, 1, 0, 1}},
                         Shape{16, 0, 37, 74, 16, {3, 0, 16, 1, 2, 9}}, Shape{16, 0, 24, 530, 4, {4, 1, 0, 3}},
                         // More rows than one pass takes (a step of up to 64 tokens): two and three passes.
                         Shape{4, 64, 20, 128, 40, {40, 0, 17, 1, 6}}, Shape{16, 0, 20, 64, 40, {33, 2}}}) {
    const bool codes = s.bits != 16;
    const QuantRowLayout row = codes ? quant_row_layout(s.bits, s.group, s.in) : plain_row_layout(s.in);
    const int E = int(s.rows.size());
    std::vector<int32_t> begin = {0}, active;
    for (int e = 0; e < E; ++e) {
      begin.push_back(begin.back() + int32_t(s.rows[size_t(e)]));
      if (s.rows[size_t(e)] > 0) active.push_back(e);
    }
    const int64_t A = begin.back();
    active.resize(active.size() + 2, -1);  // slots past the active experts
    Arena a;
    RoutedLinears<Act> g{};
    std::vector<QuantLinearCase> cases;
    std::vector<float> x;
    for (int e = 0; e < E; ++e) {
      const int64_t n = std::max<int64_t>(s.rows[size_t(e)], 1);  // an inactive expert's weights all the same
      cases.push_back(codes ? make_quant_linear_case(spec_of(s.bits, s.group), n, s.out, s.in, false, rng, dtype_of<Act>)
                            : make_plain_linear_case(n, s.out, s.in, rng, dtype_of<Act>));
      const QuantLinearCase& c = cases.back();
      g.w[e] = codes ? a.put(c.w.data(), c.w.size()) : reinterpret_cast<const uint8_t*>(a.of<Act>(c.w16));
      if (s.rows[size_t(e)] > 0) x.insert(x.end(), c.x.begin(), c.x.end());
    }
    g.x = a.of<Act>(x);
    g.y = a.put<Act>(nullptr, size_t(A * s.out) * sizeof(Act) + 8);
    g.expert_begin = a.put<const int32_t>(begin.data(), begin.size() * 4);
    g.active = a.put<const int32_t>(active.data(), active.size() * 4);
    g.active_slots = int(active.size());
    g.out = s.out;
    g.row = row;
    launch_routed_linears(g, E, s.max_rows, nullptr);
    for (int e = 0; e < E; ++e) {
      const int64_t n = s.rows[size_t(e)], first = begin[size_t(e)];
      if (n == 0) continue;
      const std::string what = label("routed expert bits rows", {e, s.bits, n});
      expect_within(floats(g.y + first * s.out, size_t(n * s.out)), cases[size_t(e)].want, cases[size_t(e)].tol, what);
      if (!codes) continue;
      QuantLinearParams<Act> p{};
      p.x = g.x + first * s.in;
      p.w = g.w[e];
      p.y = a.put<Act>(nullptr, size_t(n * s.out) * sizeof(Act));
      p.tokens = n;
      p.out = s.out;
      p.row = row;
      launch_quant_linear(p, nullptr);
      expect_same_bytes(bytes_of(g.y + first * s.out, size_t(n * s.out) * sizeof(Act)),
                        bytes_of(p.y, size_t(n * s.out) * sizeof(Act)), what + " against its own launch");
    }
    CHECK(bytes_of(g.y + A * s.out, 8) == std::vector<uint8_t>(8, 0xFF));
  }
}

namespace {

template <class Act>
void check_quant_kv_store(int bits, int group, int64_t d, int64_t kv_heads, std::mt19937& rng) {
  const quant::QuantSpec spec = spec_of(bits, group);
  const std::string what = label("kv_store bits group d kv_heads", {bits, group, d, kv_heads});
  INFO(what);
  const QuantKvStoreCase c = make_quant_kv_store_case(spec, d, kv_heads, rng, dtype_of<Act>);
  Arena a;
  QuantKvStoreParams<Act> p;
  p.k = a.of<Act>(c.k);
  p.v = a.of<Act>(c.v);
  p.cache_k = a.put(nullptr, c.cache_bytes);
  p.cache_v = a.put(nullptr, c.cache_bytes);
  p.slots = a.put<const int32_t>(c.slots.data(), c.slots.size() * 4);
  p.positions = a.put<const int32_t>(c.pos.data(), c.pos.size() * 4);
  p.tokens = int64_t(c.slots.size());
  p.kv_heads = int(kv_heads);
  p.slot_count = int(c.S);
  p.capacity = int(c.C);
  p.row = quant_row_layout(bits, group, int(d));
  launch_quant_kv_store(p, nullptr);
  expect_same_bytes(bytes_of(p.cache_k, c.cache_bytes), c.want_k, what + " keys");
  expect_same_bytes(bytes_of(p.cache_v, c.cache_bytes), c.want_v, what + " values");
}

}  // namespace

TEMPLATE_TEST_CASE("emulated cuda: kv_store quantizes cache rows as the host reference does", "[emulated][quant]",
                   __half, bf16) {
  using Act = TestType;
  std::mt19937 rng(23);
  for (int bits : {4, 8})
    for (int group : {32, 64, 128})
      for (int64_t d : {20, 16, 33, 64, 128})
        for (int64_t kv_heads : {1, 3}) check_quant_kv_store<Act>(bits, group, d, kv_heads, rng);
}

namespace {

// Both attention kernels as the backend runs them: the tensor-core one for the prefill tiles it
// takes (`tensor_cores`; then the fp16 operand bound), then the per-token one, or with splits > 0
// the split-KV kernels with that many chunks (scratch poisoned with NaN).
template <class Act>
void check_quant_attention(const quant::QuantSpec& spec, int64_t T, int64_t heads, int64_t kv_heads, int64_t d,
                           int64_t S, int64_t C, const std::vector<int32_t>& slots, const std::vector<int32_t>& pos,
                           float q_range, std::mt19937& rng, bool tensor_cores = false, int splits = 0,
                           int window = 0, float softcap = 0.0f, const std::vector<float>& sinks = {}) {
  QuantAttentionCase c = make_quant_attention_case(spec, T, heads, kv_heads, d, S, C, slots, pos, q_range, rng,
                                                   dtype_of<Act>, window, softcap, sinks);
  if (tensor_cores) allow_fp16_operands(c, dtype_of<Act>);
  Arena a;
  QuantAttentionParams<Act> p;
  p.q = a.of<Act>(c.q);
  p.cache_k = a.put(c.k.data(), c.k.size());
  p.cache_v = a.put(c.v.data(), c.v.size());
  p.slots = a.put<const int32_t>(slots.data(), slots.size() * 4);
  p.positions = a.put<const int32_t>(pos.data(), pos.size() * 4);
  p.out = a.put<Act>(nullptr, c.q.size() * sizeof(Act));
  p.tokens = T;
  p.heads = int(heads);
  p.kv_heads = int(kv_heads);
  p.slot_count = int(S);
  p.capacity = int(C);
  p.scale = c.scale;
  p.window = window;
  p.softcap = softcap;
  p.sinks = sinks.empty() ? nullptr : a.put<const float>(sinks.data(), sinks.size() * 4);
  p.row = quant_row_layout(spec.bits, spec.group_size, int(d));
  if (tensor_cores) {
    REQUIRE(tensor_core_attention_supports(int(d), T));
    launch_tensor_core_quant_attention(p, nullptr);
    p.skip_tensor_core_tiles = true;
  }
  if (splits > 0) {
    const size_t bytes = split_kv_scratch_bytes(T, int(heads), int(d), splits);
    launch_split_quant_attention(p, split_kv_scratch(a.put(nullptr, bytes), T, int(heads), int(d), splits), nullptr);
  } else {
    launch_quant_attention(p, nullptr);
  }
  expect_within(floats(p.out, c.q.size()), c.want, c.tol,
                label("attention bits group T heads kv_heads d C splits window",
                      {spec.bits, spec.group_size, T, heads, kv_heads, d, C, splits, window}));
}

}  // namespace

TEMPLATE_TEST_CASE(
    "emulated cuda: attention over quantized caches matches double arithmetic over the dequantized cache",
    "[emulated][quant]", __half, bf16) {
  using Act = TestType;
  std::mt19937 rng(24);
  const int64_t S = 2, C = 150;
  // A single key, a whole 64-key tile, one key past it, the whole cache, and a random position.
  const std::vector<int32_t> slots{1, 0, 1, 0, 1}, pos{0, 63, 64, int32_t(C - 1), 101};
  for (int bits : {4, 8})
    for (int group : {32, 64, 128})
      for (auto [heads, kv_heads] : std::vector<std::pair<int64_t, int64_t>>{{6, 2}, {4, 1}})
        for (int64_t d : {20, 16, 64, 128})
          check_quant_attention<Act>(spec_of(bits, group), 5, heads, kv_heads, d, S, C, slots, pos, 1.0f, rng);
  // The largest head dim (64 code words a row at 8 bits), an odd one, peaked scores.
  for (int bits : {4, 8}) {
    check_quant_attention<Act>(spec_of(bits, 64), 3, 4, 2, 256, 2, 130, {0, 1, 1}, {129, 64, 0}, 1.0f, rng);
    check_quant_attention<Act>(spec_of(bits, 32), 3, 4, 2, 33, 2, 130, {1, 0, 1}, {129, 65, 7}, 1.0f, rng);
    check_quant_attention<Act>(spec_of(bits, 128), 2, 4, 4, 64, 1, 400, {0, 0}, {399, 200}, 8.0f, rng);
  }
}

TEMPLATE_TEST_CASE("emulated cuda: split-KV decode over quantized caches matches double arithmetic",
                   "[emulated][quant][split]", __half, bf16) {
  using Act = TestType;
  std::mt19937 rng(27);
  // Five tokens of three slots: 1 key, 63, a whole tile of 64, one past it, and 334 (six tiles);
  // chunk counts 1 (the shared K/V reads alone), 3, and 8 (more chunks than tiles).
  const std::vector<int32_t> slots{1, 0, 2, 1, 0}, pos{0, 62, 63, 64, 333};
  const std::vector<int> groups{32, 64, 128};
  size_t next_group = 0;
  for (int bits : {4, 8})
    for (int64_t d : {64, 80, 128, 33})
      for (auto [heads, kv_heads] : std::vector<std::pair<int64_t, int64_t>>{{2, 2}, {4, 1}, {16, 2}})
        for (int splits : {1, 3, 8}) {
          const int group = groups[next_group++ % groups.size()];
          check_quant_attention<Act>(spec_of(bits, group), 5, heads, kv_heads, d, 3, 340, slots, pos, 1.0f, rng, false,
                                     splits);
        }
  for (int bits : {4, 8}) {
    // The largest head dim (64 code words at 8 bits), a ratio of 12 (two blocks of a kv head's
    // heads), 32 chunks over six tiles, and peaked scores over 1001 keys in five chunks.
    check_quant_attention<Act>(spec_of(bits, 64), 2, 8, 2, 256, 2, 340, {1, 0}, {200, 64}, 1.0f, rng, false, 4);
    check_quant_attention<Act>(spec_of(bits, 32), 2, 12, 1, 64, 2, 340, {1, 0}, {300, 10}, 1.0f, rng, false, 3);
    check_quant_attention<Act>(spec_of(bits, 32), 1, 8, 1, 64, 1, 340, {0}, {333}, 1.0f, rng, false, kSplitKvMaxChunks);
    check_quant_attention<Act>(spec_of(bits, 128), 2, 8, 1, 128, 1, 1100, {0, 0}, {1000, 300}, 8.0f, rng, false, 5);
  }
  // After the tensor-core kernel: decode tokens ahead of a prompt take the split kernels.
  std::vector<int32_t> mixed_slots, mixed_pos;
  packed_tokens({{0, 40, 1}, {1, 7, 1}, {2, 200, 1}, {0, 41, 1}, {3, 0, 1}, {1, 0, 70}}, mixed_slots, mixed_pos);
  check_quant_attention<Act>(spec_of(4, 64), int64_t(mixed_slots.size()), 4, 1, 64, 4, 300, mixed_slots, mixed_pos,
                             1.0f, rng, true, 3);
}

TEMPLATE_TEST_CASE("emulated cuda: sliding windows and soft caps over quantized caches match double arithmetic",
                   "[emulated][quant][split]", __half, bf16) {
  using Act = TestType;
  std::mt19937 rng(28);
  // Gemma's attention over 4- and 8-bit caches: windows of one key, within a tile, a tile's 64,
  // past it and past the context, a soft cap that bends peaked scores; the per-token kernel, the
  // split kernels (chunks cut from the window's first tile) and prefill tiles on tensor cores.
  const std::vector<int32_t> slots{1, 0, 2, 1, 0}, pos{0, 62, 63, 64, 333};
  std::vector<int32_t> prompt_slots, prompt_pos;
  packed_tokens({{1, 0, 150}, {0, 40, 90}}, prompt_slots, prompt_pos);
  for (int bits : {4, 8})
    for (int window : {1, 5, 64, 70, 1000})
      for (float softcap : {0.0f, 2.0f}) {
        check_quant_attention<Act>(spec_of(bits, 32), 5, 8, 2, 64, 3, 340, slots, pos, 4.0f, rng, false, 0, window,
                                   softcap);
        check_quant_attention<Act>(spec_of(bits, 64), 5, 8, 2, 64, 3, 340, slots, pos, 4.0f, rng, false, 3, window,
                                   softcap);
        check_quant_attention<Act>(spec_of(bits, 32), int64_t(prompt_slots.size()), 4, 2, 64, 2, 340, prompt_slots,
                                   prompt_pos, 4.0f, rng, true, 0, window, softcap);
      }
}

TEMPLATE_TEST_CASE("emulated cuda: sink logits over quantized caches match double arithmetic",
                   "[emulated][quant][split]", __half, bf16) {
  using Act = TestType;
  std::mt19937 rng(29);
  // GPT-OSS's sinks over 4- and 8-bit caches: the per-token kernel, the split kernels (the merge
  // adds each head's sink) and prefill tiles on tensor cores; sinks near, far above and far below
  // the scores; whole context and a window.
  const std::vector<float> sinks{0.5f, -1.0f, 50.0f, 2.0f, -50.0f, 1.5f, 0.0f, 3.0f};
  const std::vector<float> four(sinks.begin(), sinks.begin() + 4);
  const std::vector<int32_t> slots{1, 0, 2, 1, 0}, pos{0, 62, 63, 64, 333};
  std::vector<int32_t> prompt_slots, prompt_pos;
  packed_tokens({{1, 0, 150}, {0, 40, 90}}, prompt_slots, prompt_pos);
  for (int bits : {4, 8})
    for (int window : {0, 70}) {
      check_quant_attention<Act>(spec_of(bits, 32), 5, 8, 2, 64, 3, 340, slots, pos, 4.0f, rng, false, 0, window,
                                 0.0f, sinks);
      check_quant_attention<Act>(spec_of(bits, 64), 5, 8, 2, 64, 3, 340, slots, pos, 4.0f, rng, false, 3, window,
                                 0.0f, sinks);
      check_quant_attention<Act>(spec_of(bits, 32), int64_t(prompt_slots.size()), 4, 2, 64, 2, 340, prompt_slots,
                                 prompt_pos, 4.0f, rng, true, 0, window, 0.0f, four);
    }
}

TEMPLATE_TEST_CASE("emulated cuda: prefill over quantized caches on tensor cores", "[emulated][quant]", __half, bf16) {
  using Act = TestType;
  std::mt19937 rng(26);
  for (int bits : {4, 8})
    for (int64_t d : {16, 64, 128}) {
      // Three prompts packed (tiles where two meet), and decode tokens ahead of a prompt (a tile
      // declined beside one taken).
      std::vector<int32_t> slots, pos;
      packed_tokens({{2, 0, 37}, {0, 0, 100}, {1, 0, 90}}, slots, pos);
      check_quant_attention<Act>(spec_of(bits, 32), int64_t(slots.size()), 2, 1, d, 3, 300, slots, pos, 1.0f, rng,
                                 true);
      slots.clear();
      pos.clear();
      packed_tokens({{0, 40, 1}, {1, 7, 1}, {2, 200, 1}, {0, 41, 1}, {3, 0, 1}, {1, 0, 70}}, slots, pos);
      check_quant_attention<Act>(spec_of(bits, 64), int64_t(slots.size()), 4, 2, d, 4, 300, slots, pos, 1.0f, rng,
                                 true);
    }
  // A second chunk of a prompt, peaked scores across key tiles.
  std::vector<int32_t> slots, pos;
  packed_tokens({{0, 200, 80}}, slots, pos);
  check_quant_attention<Act>(spec_of(4, 128), int64_t(slots.size()), 2, 2, 128, 1, 300, slots, pos, 6.0f, rng, true);
}

// One shape per quantized kernel, each bit width: small enough for CI's ThreadSanitizer run
// (.ci/run), where a barrier missing between lanes or warps shows as a data race.
TEMPLATE_TEST_CASE("emulated cuda: each quantized kernel once, for ThreadSanitizer", "[emulated][quant][tsan]",
                   __half, bf16) {
  using Act = TestType;
  std::mt19937 rng(25);
  for (int bits : {4, 8}) {
    check_quantize_round_trip<Act>(bits, 32, 72, rng);
    if (std::is_same_v<Act, __half>) check_quantize_round_trip<float>(bits, 32, 33, rng);
    check_quant_kv_store<Act>(bits, 32, 33, 2, rng);
    check_quant_linear<Act>(spec_of(bits, 32), 3, 5, 72, true, 0, 0, rng);
    check_quant_linear<Act>(spec_of(bits, 32), 2, 3, 40, false, 4, 2, rng);  // the scalar loads
    check_quant_attention<Act>(spec_of(bits, 32), 2, 2, 1, 40, 1, 70, {0, 0}, {69, 5}, 1.0f, rng);
    // split-KV
    check_quant_attention<Act>(spec_of(bits, 32), 2, 4, 1, 40, 1, 160, {0, 0}, {150, 5}, 1.0f, rng, false, 3);
    std::vector<int32_t> slots, pos;
    packed_tokens({{0, 0, 20}, {1, 0, 50}}, slots, pos);
    check_quant_attention<Act>(spec_of(bits, 32), int64_t(slots.size()), 2, 1, 32, 2, 70, slots, pos, 1.0f, rng, true);
  }
}

TEMPLATE_TEST_CASE(
    "emulated cuda: split_qkv into quantized caches stores the codes of the split rows, in exactly the addressed rows",
    "[emulated][quant]", __half, bf16) {
  using Act = TestType;
  // The fused store (split_qkv_store on quantized caches) against the host reference: the split
  // kernel's own k and v rows (launch_split_qkv into buffers, checked against float64 in
  // test_ops_emulated.cpp) quantized by quant::quantize_rows into a copy of the old cache. Bytes
  // equal, the rows of no token untouched, a token outside the cache writing nothing but its q.
  std::mt19937 rng(31);
  const int64_t S = 3, C = 9;
  const std::vector<int32_t> slots{2, 0, 2, 3}, pos{0, 8, 5, 3};
  const int64_t T = int64_t(slots.size());
  for (int bits : {4, 8})
    for (int group : {32, 64})
      for (auto [heads, kv_heads, d] : std::vector<std::tuple<int, int, int>>{{6, 2, 20}, {4, 4, 64}, {8, 2, 128}})
        for (bool rotate : {true, false}) {
          const quant::QuantSpec spec = spec_of(bits, group);
          const std::string what = label("split_qkv quantized store bits group heads kv_heads d rotate",
                                         {bits, group, heads, kv_heads, d, rotate});
          INFO(what);
          const int64_t qd = int64_t(heads) * d, kvd = int64_t(kv_heads) * d;
          const std::vector<float> qkv = random_act<Act>(size_t(T * (qd + 2 * kvd)), rng);
          const std::vector<float> inv = rotate ? rope_inv_freq_of(d) : std::vector<float>();
          const size_t row_bytes = quant::row_bytes(spec, d), cache_bytes = size_t(S * C * kv_heads) * row_bytes;
          std::vector<uint8_t> old(cache_bytes);
          for (uint8_t& b : old) b = uint8_t(rng());
          Arena a;
          // The unfused reference: split into k and v, then the host quantizes each (token, head) row.
          SplitQkvParams<Act> split{};
          split.qkv = a.of<Act>(qkv);
          split.positions = pos.data();
          split.inv_freq = rotate ? inv.data() : nullptr;
          split.q = a.put<Act>(nullptr, size_t(T * qd) * 2);
          split.k = a.put<Act>(nullptr, size_t(T * kvd) * 2);
          split.v = a.put<Act>(nullptr, size_t(T * kvd) * 2);
          split.tokens = T;
          split.heads = heads;
          split.kv_heads = kv_heads;
          split.head_dim = d;
          launch_split_qkv(split, nullptr);
          std::vector<uint8_t> want_k = old, want_v = old;
          for (int64_t t = 0; t < T; ++t) {
            if (slots[size_t(t)] >= S) continue;
            const size_t at = size_t((slots[size_t(t)] * C + pos[size_t(t)]) * kv_heads) * row_bytes;
            quant::quantize_rows(spec, split.k + t * kvd, dtype_of<Act>, kv_heads, d, want_k.data() + at);
            quant::quantize_rows(spec, split.v + t * kvd, dtype_of<Act>, kv_heads, d, want_v.data() + at);
          }
          // The fused store.
          SplitQkvParams<Act> fused = split;
          fused.q = a.put<Act>(nullptr, size_t(T * qd) * 2);
          fused.k = fused.v = nullptr;
          fused.quant_cache_k = a.put(old.data(), cache_bytes);
          fused.quant_cache_v = a.put(old.data(), cache_bytes);
          fused.quant_row = quant_row_layout(bits, group, d);
          fused.slots = slots.data();
          fused.slot_count = int(S);
          fused.capacity = int(C);
          launch_split_qkv(fused, nullptr);
          expect_same_bytes(bytes_of(fused.q, size_t(T * qd) * 2), bytes_of(split.q, size_t(T * qd) * 2), what + ": q");
          expect_same_bytes(bytes_of(fused.quant_cache_k, cache_bytes), want_k, what + ": cache k");
          expect_same_bytes(bytes_of(fused.quant_cache_v, cache_bytes), want_v, what + ": cache v");
        }
}
