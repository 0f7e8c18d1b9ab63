// sampling.cu's argmax_rows and row_candidates on the CPU through the emulation in fake/, fp16,
// bf16 and fp32 logits (argmax's fp32 path, which the head writes since 2026-11-25, and its bf16
// one have not run on a GPU yet; row_candidates has never run on one). Expected indices come from a plain loop here: the largest value, the lowest index among
// equals, NaN never wins, and a row with no winner (all NaN) reports 0.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "candidate_test_rows.h"
#include "kernels.h"
#include "strata/runtime/row_candidates.h"

namespace {

using strata::cuda::bf16;

int32_t expected_argmax(const std::vector<float>& row) {
  int32_t best = -1;
  for (size_t j = 0; j < row.size(); ++j)
    if (!std::isnan(row[j]) && (best < 0 || row[j] > row[size_t(best)])) best = int32_t(j);
  return best < 0 ? 0 : best;
}

// Rows of `cols` logits, values of L: random, with ties of the maximum, NaNs, all NaN, all -inf,
// and values that differ by less than fp16 or bf16 can tell (in fp32 only).
template <class L>
std::vector<std::vector<float>> test_rows(int64_t cols, std::mt19937& rng) {
  using strata::cuda::from_float;
  using strata::cuda::to_float;
  const bool sixteen_bit = !std::is_same_v<L, float>;
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::vector<float>> rows(6, std::vector<float>(size_t(cols)));
  for (auto& r : rows)
    for (float& x : r) x = to_float(from_float<L>(u(rng)));
  const size_t last = size_t(cols - 1), mid = size_t(cols / 2);
  rows[1][last] = rows[1][mid] = 9.0f;                 // a tie: the lower index wins
  rows[2][0] = nan;                                   // NaN first: never wins
  rows[2][mid] = 9.5f;
  for (float& x : rows[3]) x = nan;                   // no winner: 0
  for (float& x : rows[4]) x = -INFINITY;             // every value equal: index 0
  rows[5][mid] = 5.0f;
  rows[5][last] = sixteen_bit ? 5.0f : 5.0f + 1e-6f;  // fp32: the later, larger value wins
  return rows;
}

}  // namespace

TEMPLATE_TEST_CASE("emulated cuda: argmax_rows over fp16, bf16 and fp32 logits", "[emulated][tsan]", __half, bf16,
                   float) {
  using L = TestType;
  std::mt19937 rng(31);
  for (int64_t cols : {1, 7, 512, 1000, 2051}) {
    INFO("cols " << cols);
    const auto rows = test_rows<L>(cols, rng);
    std::vector<L> flat;
    for (const auto& r : rows)
      for (float x : r) flat.push_back(strata::cuda::from_float<L>(x));
    std::vector<int32_t> got(rows.size(), -7);
    strata::cuda::launch_argmax_rows(flat.data(), int64_t(rows.size()), cols, got.data(), nullptr);
    for (size_t r = 0; r < rows.size(); ++r) {
      INFO("row " << r);
      CHECK(got[r] == expected_argmax(rows[r]));
    }
  }
}

// sampling.cu's row_candidates against compute_row_candidates (row_candidates.h): the same
// candidates bit for bit, in the same order, and the same sums but for their order (a tree over
// the block's threads against the reference's index order). Rows with ties on a coarse grid
// (ranks then differ only in their ids), masked tokens, signed zeros, NaN, and capacities below,
// at and above the row's length; the output poisoned first.
namespace {

template <class L>
void check_row_candidates(std::initializer_list<int64_t> col_counts, std::initializer_list<int> capacities) {
  using strata::cuda::from_float;
  using strata::cuda::to_float;
  std::mt19937 rng(41);
  for (int64_t cols : col_counts) {
    auto rows = strata::test::candidate_test_rows(cols, rng, [](float x) { return to_float(from_float<L>(x)); });
    std::vector<float> nan_row = rows[1];
    nan_row[nan_row.size() / 2] = std::numeric_limits<float>::quiet_NaN();
    rows.push_back(nan_row);
    const std::vector<float> temperatures = {0.0f, 0.7f, 1.3f, 1.0f, 0.5f, 2.0f};
    std::vector<L> flat;
    for (const auto& r : rows)
      for (float x : r) flat.push_back(from_float<L>(x));
    for (int capacity : capacities) {
      INFO("cols " << cols << " capacity " << capacity);
      const size_t row_bytes = strata::row_candidates_bytes(capacity);
      std::vector<uint8_t> got(rows.size() * row_bytes, 0xAB);
      strata::cuda::launch_row_candidates(flat.data(), int64_t(rows.size()), cols, temperatures.data(), capacity,
                                          got.data(), nullptr);
      std::vector<uint8_t> expected(row_bytes);
      for (size_t r = 0; r < rows.size(); ++r) {
        INFO("row " << r);
        strata::compute_row_candidates(rows[r].data(), cols, temperatures[r], capacity, expected.data());
        const auto e = strata::read_row_candidates(expected.data(), 0, capacity, cols);
        const auto g = strata::read_row_candidates(got.data(), int64_t(r), capacity, cols);
        CHECK(g.max == e.max);
        REQUIRE(g.count == e.count);
        for (int sums : {0, 1}) {
          const double x = sums ? g.sum_1 : g.sum_t, y = sums ? e.sum_1 : e.sum_t;
          if (std::isnan(y)) {
            CHECK(std::isnan(x));
          } else {
            CHECK(std::abs(x - y) <= 1e-13 * y);
          }
        }
        int wrong_ids = 0, wrong_logits = 0;
        for (int32_t i = 0; i < g.count; ++i) {
          wrong_ids += g.ids[i] != e.ids[i];
          wrong_logits += std::memcmp(&g.logits[i], &e.logits[i], 4) != 0;
        }
        CHECK(wrong_ids == 0);
        CHECK(wrong_logits == 0);
      }
    }
  }
}

}  // namespace

TEMPLATE_TEST_CASE("emulated cuda: row_candidates against the host reference", "[emulated]", __half, bf16, float) {
  check_row_candidates<TestType>({1, 7, 600, 3000}, {1, 8, 64, int(strata::kMaxRowCandidates)});
}

// The same under ThreadSanitizer (.ci/run), one shape: the whole grid takes minutes there.
TEST_CASE("emulated cuda: row_candidates, one shape", "[emulated][tsan]") {
  check_row_candidates<__half>({600}, {64, int(strata::kMaxRowCandidates)});
}

// sampling.cu's target_ranks against compute_target_rank (row_candidates.h): each row's target
// logit bit for bit and its rank (the logits at least as large) exactly, over the candidate rows
// (ties on a coarse grid, masked tokens, signed zeros), a NaN row entry (counted nowhere), and
// targets first, last, at a tie and at -inf; the output poisoned first.
namespace {

template <class L>
void check_target_ranks(std::initializer_list<int64_t> col_counts) {
  using strata::cuda::from_float;
  using strata::cuda::to_float;
  std::mt19937 rng(43);
  for (int64_t cols : col_counts) {
    auto rows = strata::test::candidate_test_rows(cols, rng, [](float x) { return to_float(from_float<L>(x)); });
    rows[1][rows[1].size() / 2] = std::numeric_limits<float>::quiet_NaN();
    std::vector<L> flat;
    std::vector<int32_t> targets;
    for (size_t r = 0; r < rows.size(); ++r) {
      for (float x : rows[r]) flat.push_back(from_float<L>(x));
      const int32_t picks[] = {0, int32_t(cols - 1), int32_t(cols / 3), int32_t((cols * 2) / 3)};
      targets.push_back(picks[r % 4]);
    }
    std::vector<uint8_t> got(rows.size() * 8, 0xAB);
    strata::cuda::launch_target_ranks(flat.data(), int64_t(rows.size()), cols, targets.data(), got.data(), nullptr);
    for (size_t r = 0; r < rows.size(); ++r) {
      INFO("cols " << cols << " row " << r << " target " << targets[r]);
      const strata::TargetRank want = strata::compute_target_rank(rows[r].data(), cols, targets[r]);
      strata::TargetRank g;
      std::memcpy(&g, got.data() + r * 8, 8);
      CHECK(std::memcmp(&g.logit, &want.logit, 4) == 0);
      CHECK(g.rank == want.rank);
    }
  }
}

}  // namespace

TEMPLATE_TEST_CASE("emulated cuda: target_ranks against the host reference", "[emulated]", __half, bf16, float) {
  check_target_ranks<TestType>({1, 7, 600, 3001});
}

// The same under ThreadSanitizer (.ci/run), one shape.
TEST_CASE("emulated cuda: target_ranks, one shape", "[emulated][tsan]") { check_target_ranks<__half>({600}); }
