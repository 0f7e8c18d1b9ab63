// The CUDA attention kernels (src/backend/cuda/attention.cu, attention_tc.cu) run on the CPU
// through the emulation in fake/, against attention computed here in double precision over the
// same fp16 inputs. What this proves and what it does not: README.md beside this file.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels.h"

namespace {

using namespace strata::cuda;

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
};

struct Result {
  std::vector<float> got;   // NaN where no kernel wrote
  std::vector<double> want;
};

Result run_case(const Case& c, Kernels kernels, std::mt19937& rng) {
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
  std::vector<__half> q_buffer(q_elems + 16), cache_k(cache_elems), cache_v(cache_elems);
  __half* q = q_buffer.data() + c.q_offset;
  for (size_t i = 0; i < q_elems; ++i) q[i] = __float2half_rn(uniform(rng) * c.q_range);
  for (__half& x : cache_k) x = __float2half_rn(uniform(rng));
  for (__half& x : cache_v) x = __float2half_rn(uniform(rng));
  std::vector<__half> out(q_elems, __float2half_rn(NAN));

  AttentionParams p{};
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
  if (kernels != Kernels::PerTokenOnly) {
    REQUIRE(tensor_core_attention_supports(int(d), T));
    launch_tensor_core_attention(p, nullptr);
    p.skip_tensor_core_tiles = true;
  }
  if (kernels != Kernels::TensorCoresOnly) launch_attention(p, nullptr);

  Result r;
  for (const __half& h : out) r.got.push_back(__half2float(h));
  r.want.resize(q_elems);
  for (int64_t t = 0; t < T; ++t) {
    const bool valid = slots[size_t(t)] >= 0 && slots[size_t(t)] < c.slot_count && positions[size_t(t)] >= 0 &&
                       positions[size_t(t)] < c.capacity;
    for (int64_t h = 0; h < heads && !valid; ++h)
      for (int64_t e = 0; e < d; ++e) r.want[size_t((t * heads + h) * d + e)] = NAN;  // the kernels write NaN
    for (int64_t h = 0; h < heads && valid; ++h) {
      const int64_t kv_head = h / (heads / kvh);
      auto cache_at = [&](const std::vector<__half>& cache, int64_t pos, int64_t e) {
        return double(__half2float(cache[size_t(((slots[size_t(t)] * c.capacity + pos) * kvh + kv_head) * d + e)]));
      };
      const int64_t n_keys = positions[size_t(t)] + 1;
      std::vector<double> w(static_cast<size_t>(n_keys));
      double max_score = -INFINITY;
      for (int64_t j = 0; j < n_keys; ++j) {
        double s = 0;
        for (int64_t e = 0; e < d; ++e) s += double(__half2float(q[size_t((t * heads + h) * d + e)])) * cache_at(cache_k, j, e);
        w[size_t(j)] = s * p.scale;
        max_score = std::max(max_score, w[size_t(j)]);
      }
      double sum = 0;
      for (double& x : w) sum += (x = std::exp(x - max_score));
      for (int64_t e = 0; e < d; ++e) {
        double o = 0;
        for (int64_t j = 0; j < n_keys; ++j) o += w[size_t(j)] * cache_at(cache_v, j, e);
        r.want[size_t((t * heads + h) * d + e)] = o / sum;
      }
    }
  }
  return r;
}

// Every element within 2e-3 + 1e-2 |want| (the [cuda] tests' bound); NaN never passes.
void expect_close(const Result& r, const std::string& label) {
  INFO(label);
  size_t bad = 0;
  for (size_t i = 0; i < r.got.size(); ++i) {
    if (!(std::fabs(r.got[i] - r.want[i]) <= 2e-3 + 1e-2 * std::fabs(r.want[i]))) ++bad;
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

TEST_CASE("emulated: the per-token kernel matches a double reference", "[emulated]") {
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
    expect_close(run_case(c, Kernels::PerTokenOnly, rng), "per-token, d " + std::to_string(d));
  }
}

TEST_CASE("emulated: prefill attention on tensor cores matches a double reference", "[emulated]") {
  std::mt19937 rng(2);
  for (int d : {16, 64, 80, 96, 128}) {
    Case one{{{1, 0, 200}}, 2, 1, d, 3};                                  // four tiles, the last partial
    Case packed{{{2, 0, 37}, {0, 0, 100}, {1, 0, 90}}, 2, 2, d, 3};       // sequences meet inside tiles
    expect_close(run_case(one, Kernels::Both, rng), "one prompt, d " + std::to_string(d));
    expect_close(run_case(packed, Kernels::Both, rng), "three packed prompts, d " + std::to_string(d));
  }
  Case chunk{{{0, 300, 128}}, 4, 1, 128, 2};  // a second chunk reads the first chunk's keys
  expect_close(run_case(chunk, Kernels::Both, rng), "second chunk");
  Case misaligned{{{1, 0, 150}}, 2, 2, 64, 2};
  misaligned.q_offset = 1;  // 2 bytes: the scalar loads
  expect_close(run_case(misaligned, Kernels::Both, rng), "misaligned q");
  Case peaked{{{0, 1900, 100}}, 2, 1, 128, 1, 2000, 6.0f};  // the running max moves between key tiles
  expect_close(run_case(peaked, Kernels::Both, rng), "peaked scores");
}

TEST_CASE("emulated: the tensor-core kernel takes prefill tiles and leaves decode tiles", "[emulated]") {
  std::mt19937 rng(3);
  // Five decode tokens ahead of a prompt of 70: tile 0 holds six runs (declined), tile 1 the
  // prompt's last 11 tokens (taken).
  Case mixed{{{0, 40, 1}, {1, 7, 1}, {2, 300, 1}, {3, 0, 1}, {4, 99, 1}, {5, 0, 70}}, 2, 1, 32, 6};
  const Result alone = run_case(mixed, Kernels::TensorCoresOnly, rng);
  CHECK(tokens_unwritten(alone, mixed, 0, 64));
  CHECK(tokens_written(alone, mixed, 64, 75));
  expect_close(run_case(mixed, Kernels::Both, rng), "decode tokens ahead of a prompt");

  // Four runs of 16 (taken), then five runs in 64 tokens (declined).
  Case runs{{{0, 0, 16}, {1, 10, 16}, {2, 20, 16}, {3, 30, 16}, {0, 16, 12}, {1, 26, 13}, {2, 36, 13}, {3, 46, 13},
             {4, 0, 13}},
            2, 1, 32, 5};
  const Result tc = run_case(runs, Kernels::TensorCoresOnly, rng);
  CHECK(tokens_written(tc, runs, 0, 64));
  CHECK(tokens_unwritten(tc, runs, 64, 128));
  expect_close(run_case(runs, Kernels::Both, rng), "four runs, then five");

  // Two runs of 4 tokens each in a tile of 8: fewer than 8 tokens per run, declined.
  Case short_runs{{{0, 0, 4}, {1, 0, 4}}, 2, 1, 32, 2};
  CHECK(tokens_unwritten(run_case(short_runs, Kernels::TensorCoresOnly, rng), short_runs, 0, 8));

  // An invalid position anywhere in a tile leaves the whole tile to the per-token kernel (which
  // writes NaN for that token alone).
  Case invalid{{{0, 0, 20}, {0, 700, 1}, {0, 21, 10}}, 2, 1, 32, 1};
  CHECK(tokens_unwritten(run_case(invalid, Kernels::TensorCoresOnly, rng), invalid, 0, 31));
}
