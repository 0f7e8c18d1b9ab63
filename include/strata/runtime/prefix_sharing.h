// Shared prompt prefixes within one batch: a prompt that begins with the same tokens as another
// prompt of the batch (a common instruction or system prompt, the usual shape of a batch job)
// copies that prompt's cache rows for those positions instead of computing them again. A key or
// value at position p depends only on tokens 0..p, so the copied rows are the ones the prompt
// would compute itself.
#pragma once
#include <cstdint>
#include <vector>

namespace strata {

struct PrefixSharingOptions {
  // A prompt shares only prefixes at least this long: each copy is a few small copies per layer.
  int min_shared_tokens = 16;
};

// What a prompt takes from another: positions [0, length) of prompt `source`, which computes its
// whole prompt itself (source -1: none, length 0).
struct SharedPrefix {
  int source = -1;
  int length = 0;
};

// Plans the sharing for one batch of prompts. Prompts are sorted by their tokens, so those with a
// common beginning sit together; each shares with the nearest preceding prompt that computes
// itself (a source), when their common prefix reaches min_shared_tokens. A prompt always computes
// its last token (its logits row is sampled), so a prompt equal to its source shares all but that.
// Sources never share themselves: one level, so a source never waits for another.
std::vector<SharedPrefix> plan_shared_prefixes(const std::vector<const std::vector<int32_t>*>& prompts,
                                               const PrefixSharingOptions& options = {});

// Prompt tokens a plan copies instead of computing.
int64_t shared_tokens(const std::vector<SharedPrefix>& plan);

}  // namespace strata
