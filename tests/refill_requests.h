// Requests for the continuous-batching tests of the resident generator (test_continuous.cpp) and
// the offloading engine (test_offload_serve.cpp), and their common check.
#pragma once
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "strata/runtime/generator.h"
#include "strata/runtime/sequence.h"

namespace strata::test {

// `n` requests of a two-token prompt whose answers run 1 to 64 tokens (eos ignored); `tokens`
// gets the sum of their lengths.
inline std::vector<GenRequest> varied_answer_requests(std::mt19937& rng, size_t n, int64_t& tokens) {
  std::vector<GenRequest> reqs(n);
  tokens = 0;
  for (GenRequest& r : reqs) {
    r.prompt = {int32_t(3 + rng() % 100), int32_t(3 + rng() % 100)};
    r.sampling.max_new_tokens = 1 + int(rng() % 64);
    r.sampling.ignore_eos = true;
    tokens += r.sampling.max_new_tokens;
  }
  return reqs;
}

// Random requests cut from one or two stems of `min_stem` to `min_stem + stem_spread - 1` tokens
// (beginnings to share), a few tokens of their own after: 0 to 11 answer tokens, eos on or off,
// greedy or sampled with a seed, a logprob per token. Choices (n) are the caller's.
inline std::vector<GenRequest> stem_requests(std::mt19937& rng, int min_stem, int stem_spread, size_t n) {
  std::vector<std::vector<int32_t>> stems(1 + rng() % 2);
  for (std::vector<int32_t>& st : stems)
    for (int i = int(min_stem + int(rng() % unsigned(stem_spread))); i > 0; --i) st.push_back(int32_t(3 + rng() % 200));
  std::vector<GenRequest> reqs(n);
  for (GenRequest& r : reqs) {
    const std::vector<int32_t>& st = stems[rng() % stems.size()];
    r.prompt.assign(st.begin(), st.begin() + long(1 + rng() % st.size()));
    for (int i = int(rng() % 5); i > 0; --i) r.prompt.push_back(int32_t(3 + rng() % 200));
    r.sampling.max_new_tokens = int(rng() % 12);
    r.sampling.ignore_eos = rng() % 2 == 0;
    if (rng() % 2) {
      r.sampling.temperature = 1.3f;
      r.sampling.seed = rng() % 1000;
    }
    r.logprobs = 1;
  }
  return reqs;
}

// Refill against blocks over the same requests (`tokens` answer tokens, one prefill token each):
// the same live slot-steps, refill's occupancy above 90% and the blocks' below 75%, fewer steps.
inline void check_refill_occupancy(const GenStats& refill, const GenStats& blocks, int64_t tokens, size_t requests,
                                   int slots) {
  CHECK(refill.generated_tokens == tokens);
  CHECK(refill.live_slot_steps == tokens - int64_t(requests));  // each answer's first token is prefill's
  CHECK(refill.decode_slot_steps == slots * refill.decode_steps);
  CHECK(blocks.live_slot_steps == refill.live_slot_steps);
  INFO("occupancy: refill " << refill.occupancy() << ", blocks " << blocks.occupancy());
  CHECK(refill.occupancy() > 0.9);
  CHECK(blocks.occupancy() < 0.75);
  CHECK(refill.decode_steps < blocks.decode_steps);
}

// A request that fits (a 3-token prompt, 3 answer tokens), and two that do not fit a plan for it:
// 3 choices, and 9 answer tokens.
struct RefusalRequests {
  GenRequest ok, wide, longer;
};
inline RefusalRequests refusal_requests() {
  RefusalRequests r;
  r.ok.prompt = {5, 6, 7};
  r.ok.sampling.max_new_tokens = 3;
  r.wide = r.ok;
  r.wide.n = 3;
  r.longer = r.ok;
  r.longer.sampling.max_new_tokens = 9;
  return r;
}

// Same tokens and finish reason; log-probabilities within `tol`. One exception, which
// docs/offload.md ("The same tokens") describes: a step's size picks the GEMM, so two candidates
// whose probabilities are equal to the last bits can trade places in the sampler's order (or in
// greedy's argmax) with the neighbours. Two runs may then part at a token where the tokens they
// chose have log-probabilities within kTiedLogprob of each other, and go on as different
// continuations. Returns the number of choices that parted so (callers bound it).
constexpr double kTiedLogprob = 1e-5;
inline int check_same(const std::vector<GenResult>& got, const std::vector<GenResult>& want, double tol) {
  REQUIRE(got.size() == want.size());
  int parted = 0;
  for (size_t c = 0; c < got.size(); ++c) {
    INFO("choice " << c);
    const std::vector<int32_t>&a = got[c].tokens, &b = want[c].tokens;
    REQUIRE(got[c].logprobs.size() == a.size());
    REQUIRE(want[c].logprobs.size() == b.size());
    size_t same = 0;
    while (same < a.size() && same < b.size() && a[same] == b[same]) ++same;
    const bool part = same < a.size() && same < b.size();
    if (part) {
      INFO("parted at token " << same << ": " << a[same] << " against " << b[same]);
      CHECK(std::fabs(got[c].logprobs[same].sampled.logprob - want[c].logprobs[same].sampled.logprob) <= kTiedLogprob);
      ++parted;
    } else {
      CHECK(a == b);
      CHECK(got[c].finish == want[c].finish);
    }
    for (size_t t = 0; t < same; ++t)
      CHECK(std::fabs(got[c].logprobs[t].sampled.logprob - want[c].logprobs[t].sampled.logprob) <= tol);
  }
  return parted;
}

}  // namespace strata::test
