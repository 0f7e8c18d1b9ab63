// Requests for the continuous-batching tests of the resident generator (test_continuous.cpp) and
// the offloading engine (test_offload_serve.cpp), and their common check.
#pragma once
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

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

// Same tokens and finish reason; log-probabilities within `tol`.
inline void check_same(const std::vector<GenResult>& got, const std::vector<GenResult>& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (size_t c = 0; c < got.size(); ++c) {
    INFO("choice " << c);
    CHECK(got[c].tokens == want[c].tokens);
    CHECK(got[c].finish == want[c].finish);
    REQUIRE(got[c].logprobs.size() == want[c].logprobs.size());
    for (size_t t = 0; t < got[c].logprobs.size(); ++t)
      CHECK(std::fabs(got[c].logprobs[t].sampled.logprob - want[c].logprobs[t].sampled.logprob) <= tol);
  }
}

}  // namespace strata::test
