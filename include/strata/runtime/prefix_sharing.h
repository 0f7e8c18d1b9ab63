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

// How many of `prompt`'s first positions it can take from `source`: their common prefix, less the
// prompt's last token, which it always computes (its logits row is sampled); 0 when that is
// shorter than the options' minimum.
int shareable_length(const std::vector<int32_t>& source, const std::vector<int32_t>& prompt,
                     const PrefixSharingOptions& options);

// Plans the sharing for one batch of prompts (a null entry takes no part). Prompts are sorted by
// their tokens, so those with a common beginning sit together; each shares with the nearest
// preceding prompt that computes itself (a source), as much as shareable_length allows, so a prompt
// equal to its source shares all but its last token. Sources never share themselves: one level,
// so a source never waits for another.
std::vector<SharedPrefix> plan_shared_prefixes(const std::vector<const std::vector<int32_t>*>& prompts,
                                               const PrefixSharingOptions& options = {});

}  // namespace strata
