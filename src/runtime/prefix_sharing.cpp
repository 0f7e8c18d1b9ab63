#include "strata/runtime/prefix_sharing.h"

#include <algorithm>
#include <numeric>

namespace strata {

namespace {

int common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  const auto [ia, ib] = std::mismatch(a.begin(), a.end(), b.begin(), b.end());
  return int(ia - a.begin());
}

}  // namespace

std::vector<SharedPrefix> plan_shared_prefixes(const std::vector<const std::vector<int32_t>*>& prompts,
                                               const PrefixSharingOptions& options) {
  std::vector<SharedPrefix> plan(prompts.size());
  std::vector<int> order(prompts.size());
  std::iota(order.begin(), order.end(), 0);
  // Equal prompts keep their batch order, so the first of them is the source.
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return *prompts[size_t(a)] < *prompts[size_t(b)]; });
  int source = -1;
  for (const int i : order) {
    const std::vector<int32_t>& p = *prompts[size_t(i)];
    if (source >= 0) {
      // Sorted order puts a source's prefix-sharing prompts right after it, so the first one that
      // shares too little starts the next source.
      const int length = std::min(common_prefix(*prompts[size_t(source)], p), int(p.size()) - 1);
      if (length >= std::max(options.min_shared_tokens, 1)) {
        plan[size_t(i)] = {source, length};
        continue;
      }
    }
    source = i;
  }
  return plan;
}

int64_t shared_tokens(const std::vector<SharedPrefix>& plan) {
  int64_t n = 0;
  for (const SharedPrefix& s : plan) n += s.length;
  return n;
}

}  // namespace strata
