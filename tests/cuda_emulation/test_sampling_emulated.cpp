// sampling.cu's argmax_rows on the CPU through the emulation in fake/, fp16, bf16 and fp32 logits
// (the fp32 path, which the head writes since 2026-11-25, and the bf16 one have not run on a GPU
// yet). Expected indices come from a plain loop here: the largest value, the lowest index among
// equals, NaN never wins, and a row with no winner (all NaN) reports 0.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "kernels.h"

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
