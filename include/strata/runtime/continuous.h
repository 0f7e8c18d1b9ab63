// Continuous batching in the resident generator (docs/architecture.md, "Continuous batching"): a
// fixed set of cache slots, each holding one live sequence; when a sequence finishes (eos, a stop
// string, its max_new_tokens, the context) its slot takes the next waiting request at once. The
// newcomer's prompt is computed in the following steps, packed with the other slots' decode tokens
// in one step and cut into pieces of at most the prefill budget, so no slot waits for a block's
// longest answer and no step runs with fewer sequences than there are requests to serve.
//
// A sequence's tokens do not depend on its neighbours or on when it was admitted: every token
// attends to its own slot's rows only, and each choice samples with its own seeded sampler.
#pragma once
#include <cstddef>
#include <functional>
#include <vector>

#include "strata/runtime/generator.h"

namespace strata {

struct ContinuousOptions {
  int slots = 32;     // sequences at once: a request's n choices take n slots
  int capacity = 0;   // positions per slot: at least every request's prompt + max_new_tokens
  GenOptions gen;     // the prefill budget per step, prefix sharing, kept prefixes
};

// A request for run_continuous: `request` stays valid until `finished` is called with its tag.
struct Admission {
  const GenRequest* request = nullptr;
  size_t tag = 0;
};

// Serves requests until `next` returns one with a null request and every admitted request has
// finished. `next` is called whenever a slot is free and no request waits; a request whose n
// choices need more slots than are free waits (in order: later requests wait behind it) for its
// neighbours to finish. `finished(tag, results)` is called as the last choice of a request ends,
// results in choice order. A newcomer copies the rows of the longest prompt beginning it shares
// with a live slot's prompt or a kept prefix (GenOptions), and keeps what it shared with a live
// slot as a kept prefix. Throws for a request that cannot be served (n > slots, a prompt that
// overflows `capacity` or the context); the requests finished before are not lost.
void run_continuous(Transformer& model, const ContinuousOptions& options, const std::function<Admission()>& next,
                    const std::function<void(size_t tag, std::vector<GenResult> results)>& finished,
                    GenStats* stats = nullptr);

}  // namespace strata
