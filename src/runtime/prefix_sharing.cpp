#include "strata/runtime/prefix_sharing.h"

#include <algorithm>

namespace strata {

int shareable_length(const std::vector<int32_t>& source, const std::vector<int32_t>& prompt,
                     const PrefixSharingOptions& options) {
  const int common = int(std::mismatch(source.begin(), source.end(), prompt.begin(), prompt.end()).first - source.begin());
  const int length = std::min(common, int(prompt.size()) - 1);
  return length >= std::max(options.min_shared_tokens, 1) ? length : 0;
}

std::vector<SharedPrefix> plan_shared_prefixes(const std::vector<const std::vector<int32_t>*>& prompts,
                                               const PrefixSharingOptions& options) {
  std::vector<SharedPrefix> plan(prompts.size());
  std::vector<int> order;
  for (size_t i = 0; i < prompts.size(); ++i)
    if (prompts[i]) order.push_back(int(i));
  // Equal prompts keep their batch order, so the first of them is the source.
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return *prompts[size_t(a)] < *prompts[size_t(b)]; });
  int source = -1;
  for (const int i : order) {
    // Sorted order puts a source's prefix-sharing prompts right after it, so the first one that
    // shares too little starts the next source.
    const int length = source >= 0 ? shareable_length(*prompts[size_t(source)], *prompts[size_t(i)], options) : 0;
    if (length > 0) plan[size_t(i)] = {source, length};
    else source = i;
  }
  return plan;
}

}  // namespace strata
