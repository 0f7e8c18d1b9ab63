#include "strata/runtime/row_candidates.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "strata/core/error.h"

namespace strata {

RowCandidates read_row_candidates(const void* rows, int64_t r, int64_t capacity, int64_t vocab) {
  const auto* row = static_cast<const uint8_t*>(rows) + size_t(r) * row_candidates_bytes(capacity);
  RowCandidates c;
  c.vocab = vocab;
  std::memcpy(&c.max, row, 4);
  std::memcpy(&c.count, row + 4, 4);
  std::memcpy(&c.sum_t, row + 8, 8);
  std::memcpy(&c.sum_1, row + 16, 8);
  STRATA_CHECK(c.count >= 0 && c.count <= capacity && c.count <= vocab,
               "row candidates: row " << r << " holds " << c.count << " of at most " << capacity);
  c.logits = reinterpret_cast<const float*>(row + kRowCandidatesHeaderBytes);
  c.ids = reinterpret_cast<const int32_t*>(row + kRowCandidatesHeaderBytes + 4 * size_t(capacity));
  return c;
}

void compute_row_candidates(const float* logits, int64_t vocab, float temperature, int64_t capacity, void* out) {
  STRATA_CHECK(vocab > 0 && capacity > 0 && capacity <= kMaxRowCandidates,
               "row candidates: vocabulary " << vocab << ", capacity " << capacity);
  float mx = -INFINITY;
  for (int64_t i = 0; i < vocab; ++i) mx = std::max(mx, logits[i]);
  const double inv_t = temperature > 0 ? 1.0 / double(temperature) : 1.0;
  const double top = double(mx) * inv_t;
  double sum_t = 0, sum_1 = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    sum_t += std::exp(double(logits[i]) * inv_t - top);
    sum_1 += std::exp(double(logits[i]) - double(mx));
  }
  // -0 and +0 tie, as the sampler's comparisons have them; NaN sorts last.
  auto before = [&](int32_t a, int32_t b) {
    const float x = logits[a], y = logits[b];
    if (std::isnan(x) || std::isnan(y)) return !std::isnan(x) || (std::isnan(y) && a > b);
    return x > y || (x == y && a > b);
  };
  const int32_t count = int32_t(std::min(capacity, vocab));
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + count, order.end(), before);

  auto* row = static_cast<uint8_t*>(out);
  std::memcpy(row, &mx, 4);
  std::memcpy(row + 4, &count, 4);
  std::memcpy(row + 8, &sum_t, 8);
  std::memcpy(row + 16, &sum_1, 8);
  auto* cand_logits = reinterpret_cast<float*>(row + kRowCandidatesHeaderBytes);
  auto* cand_ids = reinterpret_cast<int32_t*>(row + kRowCandidatesHeaderBytes + 4 * size_t(capacity));
  for (int32_t i = 0; i < count; ++i) {
    cand_logits[i] = logits[order[size_t(i)]];
    cand_ids[i] = order[size_t(i)];
  }
}

TargetRank compute_target_rank(const float* logits, int64_t vocab, int32_t target) {
  STRATA_CHECK(target >= 0 && target < vocab, "target " << target << " outside the vocabulary of " << vocab);
  TargetRank t;
  t.logit = logits[target];
  for (int64_t j = 0; j < vocab; ++j) t.rank += logits[j] >= t.logit;
  return t;
}

}  // namespace strata
