#include "strata/runtime/moe_routing.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "strata/core/error.h"

namespace strata {

int MoeRouting::active_experts() const {
  int n = 0;
  for (size_t e = 0; e + 1 < expert_begin.size(); ++e) n += expert_begin[e + 1] > expert_begin[e];
  return n;
}

MoeRouting route_tokens(const float* logits, int64_t T, int E, int k, bool renormalize) {
  STRATA_CHECK(E > 0 && k > 0 && k <= E, "internal: routing " << k << " of " << E << " experts");
  MoeRouting r;
  r.tokens = T;
  r.k = k;
  std::vector<int32_t> chosen(size_t(T) * size_t(k));  // each token's experts, ascending
  std::vector<float> weight(chosen.size());
  std::vector<float> prob(static_cast<size_t>(E));
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* row = logits + t * E;
    const float top = *std::max_element(row, row + E);
    float sum = 0;
    for (int e = 0; e < E; ++e) sum += prob[size_t(e)] = std::exp(row[e] - top);
    for (float& p : prob) p /= sum;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      return prob[size_t(a)] != prob[size_t(b)] ? prob[size_t(a)] > prob[size_t(b)] : a < b;
    });
    float picked = 0;
    for (int j = 0; j < k; ++j) picked += prob[size_t(order[size_t(j)])];
    std::sort(order.begin(), order.begin() + k);
    for (int j = 0; j < k; ++j) {
      const size_t i = size_t(t) * size_t(k) + size_t(j);
      chosen[i] = order[size_t(j)];
      weight[i] = renormalize ? prob[size_t(chosen[i])] / picked : prob[size_t(chosen[i])];
    }
  }
  // Counting sort by expert: assignments of one expert stay in token order.
  r.expert_begin.assign(size_t(E) + 1, 0);
  for (int32_t e : chosen) ++r.expert_begin[size_t(e) + 1];
  for (int e = 0; e < E; ++e) r.expert_begin[size_t(e) + 1] += r.expert_begin[size_t(e)];
  std::vector<int32_t> next(r.expert_begin.begin(), r.expert_begin.end() - 1);
  r.gather.resize(chosen.size());
  r.combine_rows.resize(chosen.size());
  r.combine_weights = std::move(weight);
  for (size_t i = 0; i < chosen.size(); ++i) {
    const int32_t a = next[size_t(chosen[i])]++;
    r.gather[size_t(a)] = int32_t(i / size_t(k));
    r.combine_rows[i] = a;
  }
  return r;
}

}  // namespace strata
