// Generation over one batch of requests: packed prefill (in chunks bounded by a token budget,
// prompts sharing a prefix computing it once: prefix_sharing.h),
// then decode steps over the sequences still running, until each meets EOS or its length limit.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "strata/runtime/prefix_sharing.h"
#include "strata/runtime/sampler.h"
#include "strata/runtime/sequence.h"
#include "strata/runtime/transformer.h"

namespace strata {

struct GenStats {
  double prefill_seconds = 0, decode_seconds = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0, decode_steps = 0;
  int64_t shared_prompt_tokens = 0;  // prompt tokens whose cache rows were copied, not computed
  // Slot occupancy over the steps that decode: slots those steps had, and of them the ones that
  // decoded a live sequence (the rest wait for their batch's longest, or stand empty).
  int64_t decode_slot_steps = 0, live_slot_steps = 0;
  double occupancy() const { return decode_slot_steps > 0 ? double(live_slot_steps) / double(decode_slot_steps) : 0; }
  // Mixtures of experts: the routing of every sparse layer step (ForwardOps::routing_totals).
  RoutingTotals routing;
  void add(const GenStats& o);
};

// The keys and values of a few prompt prefixes kept from one batch to the next, so that a job whose
// prompts begin with one of a few instructions computes each once, not once per batch. generate()
// copies into a prompt the longest kept prefix it begins with, and after each batch keeps the
// batch's most shared prefix: most recently used first, the least recent forgotten past capacity.
struct KeptPrefixes {
  struct Entry {
    std::vector<int32_t> tokens;
    KvCache rows;  // one slot of tokens.size() positions
  };
  std::vector<Entry> entries;
  size_t capacity = 4;
};

struct GenOptions {
  int64_t prefill_token_budget = 4096;  // tokens per prefill step; bounds activation memory
  bool share_prefixes = true;            // prompts of a batch share common prefixes' cache rows
  PrefixSharingOptions prefix_sharing;
  KeptPrefixes* kept_prefixes = nullptr;  // with share_prefixes: carried across calls (may be empty)
};

// Generates for every request (max_new_tokens is clamped to the model's context; a prompt that
// fills the context alone is an error). Stats are added to `stats` when given.
std::vector<GenResult> generate(Transformer& model, const std::vector<GenRequest>& requests,
                                const GenOptions& options = {}, GenStats* stats = nullptr);

}  // namespace strata
