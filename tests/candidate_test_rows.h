// Rows of logits that exercise a row's sampling candidates (row_candidates.h) at their limits,
// shared by the host tests (test_row_candidates.cpp) and the kernel's emulated test: peaked (a
// draw within the first few), flat (draws and nuclei past a small capacity), ties on a coarse
// grid (top-k's and logprobs' tie runs, ranks that differ only in their ids), masked tokens at
// -inf, and signed zeros (which tie). `representable` rounds a value to the logits' type.
#pragma once
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace strata::test {

template <class Round>
std::vector<std::vector<float>> candidate_test_rows(int64_t vocab, std::mt19937& rng, Round representable) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> rows;
  for (float scale : {6.0f, 0.3f}) {
    std::vector<float> r(static_cast<size_t>(vocab));
    for (float& x : r) x = representable(scale * normal(rng));
    rows.push_back(r);
  }
  std::vector<float> grid(static_cast<size_t>(vocab));
  for (float& x : grid) x = std::round(2.0f * normal(rng)) / 2.0f;
  rows.push_back(grid);
  std::vector<float> masked = rows[0];
  for (size_t i = 0; i < masked.size(); i += 3) masked[i] = -INFINITY;
  rows.push_back(masked);
  std::vector<float> zeros(static_cast<size_t>(vocab), -3.0f);
  for (size_t i = 0; i < zeros.size(); i += 7) zeros[i] = (i / 7) % 2 ? 0.0f : -0.0f;
  rows.push_back(zeros);
  return rows;
}

}  // namespace strata::test
