// The CUDA attention kernels (src/backend/cuda/attention.cu, attention_tc.cu, attention_split.cu)
// run on the CPU through the emulation in fake/, against attention computed here in double
// precision over the same inputs, outputs and split scratch poisoned with NaN; every case for fp16
// and for bf16 activations. What this proves and what it does not: README.md beside this file.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "emulated_act.h"
#include "kernels.h"
#include "split_kv.h"

namespace {

using namespace strata::cuda;
using strata::test::act_tol;

// Sequences packed one after another, as a step lays them out: (slot, first position, tokens).
struct Run {
  int32_t slot, first, count;
};

enum class Kernels { PerTokenOnly, TensorCoresOnly, Both };

struct Case {
  std::vector<Run> runs;
  int heads = 2, kv_heads = 1, head_dim = 64, slot_count = 1, capacity = 600;
  float q_range = 1.0f;
  size_t q_offset = 0;  // elements: a q that is not 16-byte aligned
  float kv_scale = 1.0f;  // keys and values times kv_scale, q divided by it (a power of two)
  int window = 0;         // AttentionSpec's sliding window and soft cap (Gemma)
  float softcap = 0.0f;
  std::vector<float> sinks;  // [heads]: GPT-OSS's sink logits, or none
};

struct Result {
  std::vector<float> got;   // NaN where no kernel wrote
  std::vector<double> want;
  double atol = 0, rtol = 0;  // the bound, for the activation type
};

// splits > 0: the split-KV kernels with that many chunks instead of the per-token kernel.
template <class Act>
Result run_case(const Case& c, Kernels kernels, std::mt19937& rng, int splits = 0) {
  std::vector<int32_t> slots, positions;
  for (const Run& r : c.runs) {
    for (int32_t i = 0; i < r.count; ++i) {
      slots.push_back(r.slot);
      positions.push_back(r.first + i);
    }
  }
  const int64_t T = int64_t(slots.size()), d = c.head_dim, heads = c.heads, kvh = c.kv_heads;
  const size_t q_elems = size_t(T * heads * d), cache_elems = size_t(c.slot_count) * c.capacity * kvh * d;
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<Act> q_buffer(q_elems + 16), cache_k(cache_elems), cache_v(cache_elems);
  Act* q = q_buffer.data() + c.q_offset;
  for (size_t i = 0; i < q_elems; ++i)
    q[i] = from_float<Act>(to_float(from_float<Act>(uniform(rng) * c.q_range)) / c.kv_scale);
  for (Act& x : cache_k) x = from_float<Act>(to_float(from_float<Act>(uniform(rng))) * c.kv_scale);
  for (Act& x : cache_v) x = from_float<Act>(to_float(from_float<Act>(uniform(rng))) * c.kv_scale);
  std::vector<Act> out(q_elems, from_float<Act>(NAN));

  AttentionParams<Act> p{};
  p.q = q;
  p.cache_k = cache_k.data();
  p.cache_v = cache_v.data();
  p.slots = slots.data();
  p.positions = positions.data();
  p.out = out.data();
  p.tokens = T;
  p.heads = int(heads);
  p.kv_heads = int(kvh);
  p.head_dim = int(d);
  p.slot_count = c.slot_count;
  p.capacity = c.capacity;
  p.scale = 1.0f / std::sqrt(float(d));
  p.q_token_stride = heads * d;
  p.kv_pos_stride = kvh * d;
  p.kv_slot_stride = c.capacity * kvh * d;
  p.window = c.window;
  p.softcap = c.softcap;
  p.sinks = c.sinks.empty() ? nullptr : c.sinks.data();
  if (kernels != Kernels::PerTokenOnly) {
    REQUIRE(tensor_core_attention_supports(int(d), T));
    launch_tensor_core_attention(p, nullptr);
    p.skip_tensor_core_tiles = true;
  }
  std::vector<float> scratch;  // poisoned: a partial the split kernel fails to write is NaN
  if (kernels != Kernels::TensorCoresOnly && splits > 0) {
    const size_t bytes = split_kv_scratch_bytes(T, int(heads), int(d), splits);
    scratch.assign(bytes / sizeof(float) + 64, NAN);
    void* at = scratch.data() + (256 - reinterpret_cast<uintptr_t>(scratch.data()) % 256) % 256 / sizeof(float);
    launch_split_attention(p, split_kv_scratch(at, T, int(heads), int(d), splits), nullptr);
  } else if (kernels != Kernels::TensorCoresOnly) {
    launch_attention(p, nullptr);
  }

  Result r;
  for (const Act& h : out) r.got.push_back(to_float(h));
  // The [cuda] tests' fp16 bound, 2e-3 + 1e-2 |want| for values of magnitude up to 1, made Act's;
  // attention is linear in the values, so the absolute term scales with them.
  r.atol = act_tol<Act>(2e-3) * c.kv_scale;
  r.rtol = act_tol<Act>(1e-2);
  r.want.resize(q_elems);
  for (int64_t t = 0; t < T; ++t) {
    const bool valid = slots[size_t(t)] >= 0 && slots[size_t(t)] < c.slot_count && positions[size_t(t)] >= 0 &&
                       positions[size_t(t)] < c.capacity;
    for (int64_t h = 0; h < heads && !valid; ++h)
      for (int64_t e = 0; e < d; ++e) r.want[size_t((t * heads + h) * d + e)] = NAN;  // the kernels write NaN
    for (int64_t h = 0; h < heads && valid; ++h) {
      const int64_t kv_head = h / (heads / kvh);
      auto cache_at = [&](const std::vector<Act>& cache, int64_t pos, int64_t e) {
        return double(to_float(cache[size_t(((slots[size_t(t)] * c.capacity + pos) * kvh + kv_head) * d + e)]));
      };
      const int64_t n_keys = positions[size_t(t)] + 1;
      // Keys [first, n_keys): a sliding window's last c.window positions.
      const int64_t first = c.window > 0 ? std::max<int64_t>(0, n_keys - c.window) : 0;
      std::vector<double> w(static_cast<size_t>(n_keys), 0.0);
      double max_score = -INFINITY;
      for (int64_t j = first; j < n_keys; ++j) {
        double s = 0;
        for (int64_t e = 0; e < d; ++e)
          s += double(to_float(q[size_t((t * heads + h) * d + e)])) * cache_at(cache_k, j, e);
        s *= p.scale;
        w[size_t(j)] = c.softcap > 0 ? c.softcap * std::tanh(s / c.softcap) : s;
        max_score = std::max(max_score, w[size_t(j)]);
      }
      const double sink = c.sinks.empty() ? -INFINITY : double(c.sinks[size_t(h)]);
      max_score = std::max(max_score, sink);
      double sum = std::exp(sink - max_score);  // 0 without sinks
      for (int64_t j = first; j < n_keys; ++j) sum += (w[size_t(j)] = std::exp(w[size_t(j)] - max_score));
      for (int64_t e = 0; e < d; ++e) {
        double o = 0;
        for (int64_t j = first; j < n_keys; ++j) o += w[size_t(j)] * cache_at(cache_v, j, e);
        r.want[size_t((t * heads + h) * d + e)] = o / sum;
      }
    }
  }
  return r;
}

// Every element within r.atol + r.rtol |want| (the [cuda] tests' bound, run_case); NaN passes only
// where it is wanted (an invalid token's output).
void expect_close(const Result& r, const std::string& label) {
  INFO(label);
  size_t bad = 0;
  for (size_t i = 0; i < r.got.size(); ++i) {
    if (std::isnan(r.want[i]) ? !std::isnan(r.got[i])
                              : !(std::fabs(r.got[i] - r.want[i]) <= r.atol + r.rtol * std::fabs(r.want[i])))
      ++bad;
  }
  CHECK(bad == 0);
}

// Tokens [first, last) of each head written (or not) by the kernels that ran.
bool tokens_written(const Result& r, const Case& c, int64_t first, int64_t last) {
  bool all = true;
  for (int64_t t = first; t < last; ++t)
    for (int64_t i = 0; i < int64_t(c.heads) * c.head_dim; ++i)
      all = all && !std::isnan(r.got[size_t(t * c.heads * c.head_dim + i)]);
  return all;
}
bool tokens_unwritten(const Result& r, const Case& c, int64_t first, int64_t last) {
  bool none = true;
  for (int64_t t = first; t < last; ++t)
    for (int64_t i = 0; i < int64_t(c.heads) * c.head_dim; ++i)
      none = none && std::isnan(r.got[size_t(t * c.heads * c.head_dim + i)]);
  return none;
}

}  // namespace

TEMPLATE_TEST_CASE("emulated: the per-token kernel matches a double reference", "[emulated]", __half, bf16) {
  using Act = TestType;
  // The kernel that has run on an H100 (2026-11-23): this checks the emulation itself.
  std::mt19937 rng(1);
  Case c;
  c.runs = {{0, 0, 9}, {1, 30, 1}, {2, 62, 3}};
  c.heads = 4;
  c.kv_heads = 2;
  c.slot_count = 3;
  c.capacity = 130;
  for (int d : {20, 64}) {
    c.head_dim = d;
    expect_close(run_case<Act>(c, Kernels::PerTokenOnly, rng), "per-token, d " + std::to_string(d));
  }
}

TEMPLATE_TEST_CASE("emulated: prefill attention on tensor cores matches a double reference", "[emulated]",
                   __half, bf16) {
  using Act = TestType;
  std::mt19937 rng(2);
  for (int d : {16, 64, 80, 96, 128}) {
    Case one{{{1, 0, 200}}, 2, 1, d, 3};                                  // four tiles, the last partial
    Case packed{{{2, 0, 37}, {0, 0, 100}, {1, 0, 90}}, 2, 2, d, 3};       // sequences meet inside tiles
    expect_close(run_case<Act>(one, Kernels::Both, rng), "one prompt, d " + std::to_string(d));
    expect_close(run_case<Act>(packed, Kernels::Both, rng), "three packed prompts, d " + std::to_string(d));
  }
  Case chunk{{{0, 300, 128}}, 4, 1, 128, 2};  // a second chunk reads the first chunk's keys
  expect_close(run_case<Act>(chunk, Kernels::Both, rng), "second chunk");
  Case misaligned{{{1, 0, 150}}, 2, 2, 64, 2};
  misaligned.q_offset = 1;  // 2 bytes: the scalar loads
  expect_close(run_case<Act>(misaligned, Kernels::Both, rng), "misaligned q");
  Case peaked{{{0, 1900, 100}}, 2, 1, 128, 1, 2000, 6.0f};  // the running max moves between key tiles
  expect_close(run_case<Act>(peaked, Kernels::Both, rng), "peaked scores");
}

TEMPLATE_TEST_CASE("emulated: the tensor-core kernel takes prefill tiles and leaves decode tiles", "[emulated]",
                   __half, bf16) {
  using Act = TestType;
  std::mt19937 rng(3);
  // Five decode tokens ahead of a prompt of 70: tile 0 holds six runs (declined), tile 1 the
  // prompt's last 11 tokens (taken).
  Case mixed{{{0, 40, 1}, {1, 7, 1}, {2, 300, 1}, {3, 0, 1}, {4, 99, 1}, {5, 0, 70}}, 2, 1, 32, 6};
  const Result alone = run_case<Act>(mixed, Kernels::TensorCoresOnly, rng);
  CHECK(tokens_unwritten(alone, mixed, 0, 64));
  CHECK(tokens_written(alone, mixed, 64, 75));
  expect_close(run_case<Act>(mixed, Kernels::Both, rng), "decode tokens ahead of a prompt");

  // Four runs of 16 (taken), then five runs in 64 tokens (declined).
  Case runs{{{0, 0, 16}, {1, 10, 16}, {2, 20, 16}, {3, 30, 16}, {0, 16, 12}, {1, 26, 13}, {2, 36, 13}, {3, 46, 13},
             {4, 0, 13}},
            2, 1, 32, 5};
  const Result tc = run_case<Act>(runs, Kernels::TensorCoresOnly, rng);
  CHECK(tokens_written(tc, runs, 0, 64));
  CHECK(tokens_unwritten(tc, runs, 64, 128));
  expect_close(run_case<Act>(runs, Kernels::Both, rng), "four runs, then five");

  // Two runs of 4 tokens each in a tile of 8: fewer than 8 tokens per run, declined.
  Case short_runs{{{0, 0, 4}, {1, 0, 4}}, 2, 1, 32, 2};
  CHECK(tokens_unwritten(run_case<Act>(short_runs, Kernels::TensorCoresOnly, rng), short_runs, 0, 8));

  // An invalid position anywhere in a tile leaves the whole tile to the per-token kernel (which
  // writes NaN for that token alone).
  Case invalid{{{0, 0, 20}, {0, 700, 1}, {0, 21, 10}}, 2, 1, 32, 1};
  CHECK(tokens_unwritten(run_case<Act>(invalid, Kernels::TensorCoresOnly, rng), invalid, 0, 31));
}

TEMPLATE_TEST_CASE("emulated: split-KV decode attention matches a double reference", "[emulated][split]",
                   __half, bf16) {
  using Act = TestType;
  std::mt19937 rng(4);
  // Five tokens of three slots: 1 key, 63, a whole tile of 64, one past it, and 334 (six tiles).
  // Chunk counts 1 (the shared K/V reads alone), 3, and 8 (more chunks than tiles: empty chunks).
  const std::vector<Run> decode{{1, 0, 1}, {0, 62, 1}, {2, 63, 1}, {1, 64, 1}, {0, 333, 1}};
  for (int d : {64, 80, 128, 15}) {
    // GQA ratios 1, 4, 8, and 12 (a kv head's query heads in two blocks, of 8 and 4).
    for (auto [heads, kv_heads] : std::vector<std::pair<int, int>>{{2, 2}, {4, 1}, {16, 2}, {12, 1}}) {
      for (int splits : {1, 3, 8}) {
        Case c{decode, heads, kv_heads, d, 3, 340};
        expect_close(run_case<Act>(c, Kernels::PerTokenOnly, rng, splits),
                     "d " + std::to_string(d) + " heads " + std::to_string(heads) + "/" + std::to_string(kv_heads) +
                         " splits " + std::to_string(splits));
      }
    }
  }
  // One token over 334 keys in up to 32 chunks (26 of them empty); head dim 256 (the largest),
  // and a scalar head dim over 128 (two value units a thread).
  expect_close(run_case<Act>(Case{{{0, 333, 1}}, 8, 1, 64, 1, 340}, Kernels::PerTokenOnly, rng, kSplitKvMaxChunks),
               "32 chunks");
  expect_close(run_case<Act>(Case{{{1, 200, 1}, {0, 64, 1}}, 8, 2, 256, 2, 340}, Kernels::PerTokenOnly, rng, 4),
               "d 256");
  expect_close(run_case<Act>(Case{{{1, 200, 1}, {0, 64, 1}}, 4, 4, 161, 2, 340}, Kernels::PerTokenOnly, rng, 4),
               "d 161");
  // Peaked scores: the chunks' maxima differ widely, so the merge's rescale matters.
  expect_close(
      run_case<Act>(Case{{{0, 1000, 1}, {0, 300, 1}}, 8, 1, 128, 1, 1100, 6.0f}, Kernels::PerTokenOnly, rng, 5),
      "peaked scores");
  // A misaligned q takes the scalar loads; an invalid position writes NaN for its token alone.
  Case misaligned{{{1, 150, 1}, {0, 7, 1}}, 4, 2, 64, 2, 340};
  misaligned.q_offset = 1;
  expect_close(run_case<Act>(misaligned, Kernels::PerTokenOnly, rng, 3), "misaligned q");
  expect_close(
      run_case<Act>(Case{{{0, 100, 1}, {1, 500, 1}, {1, 90, 1}}, 4, 1, 64, 2, 340}, Kernels::PerTokenOnly, rng, 3),
      "invalid position");
  // After the tensor-core kernel: the split kernels leave the tiles it took (the prompt's last 11
  // tokens) and take the decode tokens ahead of it.
  Case mixed{{{0, 40, 1}, {1, 7, 1}, {2, 300, 1}, {3, 0, 1}, {4, 99, 1}, {5, 0, 70}}, 4, 1, 32, 6, 340};
  expect_close(run_case<Act>(mixed, Kernels::Both, rng, 3), "decode tokens ahead of a prompt");
}

namespace {

// The merge alone over hand-made partials of one token and head: chunk c has max m[c] (-inf: an
// empty or fully masked chunk, whose acc and l are 0), denominator l[c] and output sum acc[c].
template <class Act>
void check_merge(const std::vector<float>& m, int d, std::mt19937& rng) {
  INFO("merge of " << m.size() << " chunks, head dim " << d);
  const int splits = int(m.size());
  std::uniform_real_distribution<float> uniform(0.5f, 2.0f);
  std::vector<float> scratch(split_kv_scratch_bytes(1, 1, d, splits) / sizeof(float) + 64, NAN);
  void* at = scratch.data() + (256 - reinterpret_cast<uintptr_t>(scratch.data()) % 256) % 256 / sizeof(float);
  SplitKvScratch part = split_kv_scratch(at, 1, 1, d, splits);
  double l_all = 0, m_all = -INFINITY;
  for (float x : m) m_all = std::max(m_all, double(x));
  std::vector<double> want(size_t(d), 0.0);
  for (int c = 0; c < splits; ++c) {
    const bool empty = m[size_t(c)] == -INFINITY;
    part.max[c] = m[size_t(c)];
    part.sum[c] = empty ? 0.0f : uniform(rng);
    const double w = empty ? 0.0 : std::exp(double(m[size_t(c)]) - m_all);
    l_all += w * part.sum[c];
    for (int i = 0; i < d; ++i) {
      part.acc[c * d + i] = empty ? 0.0f : uniform(rng) - 1.25f;
      want[size_t(i)] += w * part.acc[c * d + i];
    }
  }
  const int32_t slot = 0, pos = 10;
  std::vector<Act> out(size_t(d), from_float<Act>(NAN));
  SplitKvMergeParams<Act> p{};
  p.part = part;
  p.out = out.data();
  p.slots = &slot;
  p.positions = &pos;
  p.tokens = 1;
  p.heads = 1;
  p.head_dim = d;
  p.slot_count = 1;
  p.capacity = 11;
  launch_split_kv_merge(p, nullptr);
  size_t bad = 0;
  for (int i = 0; i < d; ++i) {
    const double w = want[size_t(i)] / l_all, got = to_float(out[size_t(i)]);
    // fp16 rounding, with room for fp32 sums (act_tol: made Act's)
    if (!(std::fabs(got - w) <= act_tol<Act>(1e-3 * std::fabs(w) + 1e-6))) ++bad;
  }
  CHECK(bad == 0);
}

}  // namespace

TEMPLATE_TEST_CASE("emulated: sliding windows and soft caps in every attention kernel match a double reference",
                   "[emulated][split]", __half, bf16) {
  using Act = TestType;
  // Gemma's attention: token t sees keys (pos - window, pos], scores soft-capped. Windows of one
  // key, shorter than a tile, a tile's 64, past it, and past the context; a cap low enough that
  // tanh bends the scores (peaked: q times 4). Prefill tiles (tensor cores, with a sliding layer's
  // rows whose windows start apart inside one key tile), decode through the per-token kernel, and
  // the split kernels with 1, 3 and 8 chunks (chunks cut from the window's first tile).
  std::mt19937 rng(31);
  for (int window : {1, 5, 64, 70, 1000})
    for (float softcap : {0.0f, 2.0f}) {
      const std::string what = "window " + std::to_string(window) + " softcap " + std::to_string(softcap);
      Case prefill{{{1, 0, 150}, {0, 40, 90}}, 4, 2, 64, 2, 400, 4.0f};
      prefill.window = window;
      prefill.softcap = softcap;
      expect_close(run_case<Act>(prefill, Kernels::Both, rng), "prefill, " + what);
      Case decode{{{0, 0, 1}, {1, 63, 1}, {2, 64, 1}, {0, 333, 1}, {1, 399, 1}}, 8, 2, 80, 3, 400, 4.0f};
      decode.window = window;
      decode.softcap = softcap;
      expect_close(run_case<Act>(decode, Kernels::PerTokenOnly, rng), "decode, " + what);
      for (int splits : {1, 3, 8}) expect_close(run_case<Act>(decode, Kernels::PerTokenOnly, rng, splits),
                                                "split " + std::to_string(splits) + ", " + what);
    }
}

TEMPLATE_TEST_CASE("emulated: sink logits in every attention kernel match a double reference", "[emulated][split]",
                   __half, bf16) {
  using Act = TestType;
  // GPT-OSS's attention: each query head's sink logit joins its softmax's sum (the split kernels
  // add it in the merge). Sinks near the scores, far above them (the head attends to almost
  // nothing) and far below; whole context and a window, as in the test above.
  std::mt19937 rng(37);
  const std::vector<float> sinks{0.5f, -1.0f, 50.0f, 2.0f, -50.0f, 1.5f, 0.0f, 3.0f};
  for (int window : {0, 5, 70}) {
    const std::string what = "window " + std::to_string(window);
    Case prefill{{{1, 0, 150}, {0, 40, 90}}, 4, 2, 64, 2, 400, 4.0f};
    prefill.window = window;
    prefill.sinks.assign(sinks.begin(), sinks.begin() + 4);
    expect_close(run_case<Act>(prefill, Kernels::Both, rng), "prefill, sinks, " + what);
    Case decode{{{0, 0, 1}, {1, 63, 1}, {2, 64, 1}, {0, 333, 1}, {1, 399, 1}}, 8, 2, 80, 3, 400, 4.0f};
    decode.window = window;
    decode.sinks = sinks;
    expect_close(run_case<Act>(decode, Kernels::PerTokenOnly, rng), "decode, sinks, " + what);
    for (int splits : {1, 3, 8}) expect_close(run_case<Act>(decode, Kernels::PerTokenOnly, rng, splits),
                                              "split " + std::to_string(splits) + ", sinks, " + what);
  }
}

TEMPLATE_TEST_CASE("emulated: the split-KV merge weighs chunks by their maxima and skips empty ones",
                   "[emulated][split]", __half, bf16) {
  using Act = TestType;
  std::mt19937 rng(5);
  check_merge<Act>({0.5f}, 64, rng);
  check_merge<Act>({3.0f, -INFINITY, -INFINITY}, 80, rng);      // the chunks past the last tile
  check_merge<Act>({-INFINITY, 1.0f, -20.0f, 4.0f}, 128, rng);  // an empty chunk first
  check_merge<Act>({-30.0f, 2.0f, 1.5f, -INFINITY, 0.0f, 2.5f, 9.0f}, 15, rng);
  std::vector<float> many(size_t(kSplitKvMaxChunks), -INFINITY);
  many[7] = -3.0f;
  many[31] = 5.0f;
  check_merge<Act>(many, 256, rng);
}

// Small enough for CI's ThreadSanitizer run (.ci/run): a missing barrier in the split kernel or
// the merge shows there as a data race. Four query heads of a kv head, three chunks (one empty
// for the short token), half2 and scalar loads.
TEMPLATE_TEST_CASE("emulated: the split-KV kernels once, for ThreadSanitizer", "[emulated][split][tsan]",
                   __half, bf16) {
  using Act = TestType;
  std::mt19937 rng(6);
  expect_close(run_case<Act>(Case{{{0, 150, 1}, {1, 5, 1}}, 4, 1, 64, 2, 160}, Kernels::PerTokenOnly, rng, 3), "half2");
  expect_close(run_case<Act>(Case{{{0, 150, 1}, {1, 5, 1}}, 4, 1, 15, 2, 160}, Kernels::PerTokenOnly, rng, 3),
               "scalar");
}

TEST_CASE("emulated: bf16 attention over keys and values of 1e6, past fp16's 65504", "[emulated][bf16]") {
  // Keys and values times 2^20 (about 1e6; bf16 values, fp16 infinities), q divided by it: the
  // same scores, outputs of 1e5 to 1e6 through the per-token, tensor-core and split-KV kernels,
  // within the bf16 bound with its absolute term times 2^20 (run_case).
  std::mt19937 rng(7);
  const float M = 0x1p20f;
  Case decode{{{0, 40, 1}, {1, 0, 1}, {2, 300, 1}}, 4, 2, 64, 3, 340};
  decode.kv_scale = M;
  expect_close(run_case<bf16>(decode, Kernels::PerTokenOnly, rng), "per-token");
  expect_close(run_case<bf16>(decode, Kernels::PerTokenOnly, rng, 3), "split-KV, 3 chunks");
  Case prefill{{{2, 0, 37}, {0, 0, 100}, {1, 0, 90}}, 2, 2, 128, 3};
  prefill.kv_scale = M;
  const Result r = run_case<bf16>(prefill, Kernels::Both, rng);
  expect_close(r, "tensor cores");
  double largest = 0;
  for (float x : r.got) largest = std::max(largest, double(std::fabs(x)));
  CHECK(largest > 65504.0);  // outputs fp16 could not hold either
}

TEST_CASE("split_kv_chunks splits decode of few sequences over long contexts, not big batches", "[emulated][split]") {
  const int h100 = 132;
  // One sequence, 32 heads (8 kv heads), 4096 keys: 32 blocks for 132 SMs; 8 blocks a chunk, so 32
  // chunks (capped) of two tiles.
  CHECK(split_kv_chunks(1, 32, 8, 4096, h100) == 32);
  // The same without GQA: 32 blocks a chunk, 9 chunks reach 2 blocks per SM.
  CHECK(split_kv_chunks(1, 32, 32, 4096, h100) == 9);
  CHECK(split_kv_chunks(4, 32, 32, 2048, h100) == 3);
  // Enough blocks already: 16 or 64 sequences of 32 heads.
  CHECK(split_kv_chunks(16, 32, 32, 4096, h100) == 1);
  CHECK(split_kv_chunks(64, 32, 8, 4096, h100) == 1);
  // Short contexts: fewer than two tiles a chunk.
  CHECK(split_kv_chunks(1, 32, 32, 100, h100) == 1);
  CHECK(split_kv_chunks(1, 32, 32, 256, h100) == 2);
  // A smaller GPU splits less; 16 query heads a kv head take two blocks a chunk.
  CHECK(split_kv_chunks(1, 32, 32, 4096, 1) == 1);
  CHECK(split_kv_chunks(1, 32, 2, 8192, 20) == 10);

  int setting = 0;
  CHECK((parse_split_kv(nullptr, setting) && setting == kSplitKvAuto));
  CHECK((parse_split_kv("auto", setting) && setting == kSplitKvAuto));
  CHECK((parse_split_kv("0", setting) && setting == 0));
  CHECK((parse_split_kv("7", setting) && setting == 7));
  CHECK_FALSE(parse_split_kv("33", setting));
  CHECK_FALSE(parse_split_kv("on", setting));
  CHECK_FALSE(parse_split_kv("-1", setting));
}
