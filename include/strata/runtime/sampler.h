// Token sampling: greedy, temperature, top-k and top-p, applied in that order as Hugging Face's
// generate() does. Each sequence owns a seeded generator, so results do not depend on batching.
#pragma once
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "strata/core/thread_pool.h"

namespace strata {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  uint64_t seed = 0;
  int max_new_tokens = 32;
  bool ignore_eos = false;   // keep generating past EOS (benchmarks)

  bool greedy() const { return temperature <= 0.0f || top_k == 1; }
};

// -log softmax(logits)[target], in double with the maximum subtracted first (scoring a text, e.g.
// perplexity). Throws strata::Error when the row holds a non-finite value (an fp16 overflow shows
// up here, not as a NaN perplexity).
double token_nll(const float* logits, int64_t vocab, int32_t target);
// token_nll of `rows` rows of logits ([rows, vocab]) against targets[r], the rows spread over the
// pool's threads (each row's value is token_nll's, so the result does not depend on the pool).
// On a GPU the host's log-softmax over the vocabulary, not the forward pass, bounds scoring.
std::vector<double> token_nlls(ThreadPool& pool, const float* logits, int64_t rows, int64_t vocab,
                               const int32_t* targets);

// A token and its log-probability under the model's own distribution: log_softmax of the raw
// logits, before temperature, top-k and top-p (OpenAI's logprobs).
struct TokenLogprob {
  int32_t token = 0;
  double logprob = 0;
};
struct StepLogprobs {
  TokenLogprob sampled;
  std::vector<TokenLogprob> top;  // the `top` most probable tokens, most probable first
};
// log_softmax in double (maximum subtracted first) of one row; ties in `top` go to the lower id.
StepLogprobs step_logprobs(const float* logits, int64_t vocab, int32_t sampled, int top);

// The distribution sample() draws from: temperature, then top-k, then top-p, then softmax, as
// transformers' TemperatureLogitsWarper, TopKLogitsWarper and TopPLogitsWarper. Returns
// (token, probability) pairs, most probable first; probabilities sum to 1.
std::vector<std::pair<int32_t, double>> sampling_distribution(const float* logits, int64_t vocab,
                                                              const SamplingParams& params);

class Sampler {
public:
  explicit Sampler(const SamplingParams& p) : params_(p), rng_(p.seed) {}
  // Picks a token from one row of logits (float32, length vocab).
  int32_t sample(const float* logits, int64_t vocab);

private:
  SamplingParams params_;
  std::mt19937_64 rng_;
};

}  // namespace strata
