// sampling.cu's argmax_rows on the CPU through the emulation in fake/, fp16 and fp32 logits (the
// fp32 path, which the head writes since 2026-11-25, has not run on a GPU yet). Expected
// indices come from a plain loop here: the largest value, the lowest index among equals, NaN
// never wins, and a row with no winner (all NaN) reports 0.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels.h"

namespace {

int32_t expected_argmax(const std::vector<float>& row) {
  int32_t best = -1;
  for (size_t j = 0; j < row.size(); ++j)
    if (!std::isnan(row[j]) && (best < 0 || row[j] > row[size_t(best)])) best = int32_t(j);
  return best < 0 ? 0 : best;
}

// Rows of `cols` logits: random, with ties of the maximum, NaNs, all NaN, all -inf, and values
// that differ by less than fp16 can tell (in fp32 only).
std::vector<std::vector<float>> test_rows(int64_t cols, bool fp16_values, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::vector<float>> rows(6, std::vector<float>(size_t(cols)));
  for (auto& r : rows)
    for (float& x : r) x = fp16_values ? __half2float(__float2half_rn(u(rng))) : u(rng);
  const size_t last = size_t(cols - 1), mid = size_t(cols / 2);
  rows[1][last] = rows[1][mid] = 9.0f;                 // a tie: the lower index wins
  rows[2][0] = nan;                                   // NaN first: never wins
  rows[2][mid] = 9.5f;
  for (float& x : rows[3]) x = nan;                   // no winner: 0
  for (float& x : rows[4]) x = -INFINITY;             // every value equal: index 0
  rows[5][mid] = 5.0f;
  rows[5][last] = fp16_values ? 5.0f : 5.0f + 1e-6f;  // fp32: the later, larger value wins
  return rows;
}

}  // namespace

TEST_CASE("emulated cuda: argmax_rows over fp16 and fp32 logits", "[emulated][tsan]") {
  std::mt19937 rng(31);
  for (int64_t cols : {1, 7, 512, 1000, 2051}) {
    for (bool fp32 : {false, true}) {
      INFO("cols " << cols << (fp32 ? " fp32" : " fp16"));
      const auto rows = test_rows(cols, !fp32, rng);
      std::vector<float> flat;
      std::vector<__half> flat16;
      for (const auto& r : rows)
        for (float x : r) {
          flat.push_back(x);
          flat16.push_back(__float2half_rn(x));
        }
      std::vector<int32_t> got(rows.size(), -7);
      if (fp32) {
        strata::cuda::launch_argmax_rows(flat.data(), int64_t(rows.size()), cols, got.data(), nullptr);
      } else {
        strata::cuda::launch_argmax_rows(flat16.data(), int64_t(rows.size()), cols, got.data(), nullptr);
      }
      for (size_t r = 0; r < rows.size(); ++r) {
        INFO("row " << r);
        CHECK(got[r] == expected_argmax(rows[r]));
      }
    }
  }
}
