// Token sampling: the logits adjusted (logit bias, repetition, frequency and presence penalties),
// then greedy, or temperature, top-k, top-p and min-p applied in that order as Hugging Face's
// generate() does. Each sequence owns a seeded generator, so results do not depend on batching.
#pragma once
#include <algorithm>
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "strata/core/thread_pool.h"
#include "strata/runtime/answer_grammar.h"
#include "strata/runtime/row_candidates.h"

namespace strata {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off; drops tokens less probable than min_p times the most probable
  // Adjustments of the raw logits, before temperature, so greedy decoding takes them too
  // (adjust_logits below). Off at their defaults.
  float repetition_penalty = 1.0f;  // > 0; transformers' and vLLM's: prompt and answer tokens
  float frequency_penalty = 0.0f;   // OpenAI's: per occurrence in the answer
  float presence_penalty = 0.0f;    // OpenAI's: once a token is in the answer
  std::vector<std::pair<int32_t, float>> logit_bias;  // OpenAI's (token, bias)
  // vLLM's: the answer also ends at any of these tokens (finish "stop"), and neither they nor
  // EOS can be drawn before the answer holds min_tokens tokens (transformers' min_new_tokens).
  std::vector<int32_t> stop_token_ids;
  int min_tokens = 0;
  uint64_t seed = 0;
  int max_new_tokens = 32;
  bool ignore_eos = false;   // keep generating past EOS (benchmarks)

  bool greedy() const { return temperature <= 0.0f || top_k == 1; }
  bool adjusts_logits() const {
    return repetition_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f || !logit_bias.empty();
  }
};

// The logits sampling reads, in place, in vLLM's order: each biased token's logit_bias added;
// then every distinct token of the prompt and the answer so far penalised as transformers'
// RepetitionPenaltyLogitsProcessor does (a positive logit divided by repetition_penalty, another
// multiplied); then each token of the answer lowered by frequency_penalty times its count, then by
// presence_penalty, as OpenAI documents them. In fp32, one rounding per operation, as those do.
void adjust_logits(float* logits, int64_t vocab, const SamplingParams& params, std::span<const int32_t> prompt,
                   std::span<const int32_t> answer);

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
  // The tokens at least as probable as `sampled`, itself included (vLLM's rank: 1 for the most
  // probable); 0 where not computed (from a row's candidates, which cannot count them).
  int64_t sampled_rank = 0;
};
// log_softmax in double (maximum subtracted first) of one row; ties in `top` go to the lower id.
StepLogprobs step_logprobs(const float* logits, int64_t vocab, int32_t sampled, int top);
// The same from a row's candidates (row_candidates.h), the normaliser being theirs; nullopt when
// the sampled token or the top's last ties are not among them.
std::optional<StepLogprobs> step_logprobs(const RowCandidates& c, int32_t sampled, int top);

// The distribution sample() draws from the (adjusted) logits: temperature, then top-k, then top-p,
// then min-p, as transformers' TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper and
// MinPLogitsWarper. Returns (token, probability) pairs, most probable first; probabilities sum to 1.
std::vector<std::pair<int32_t, double>> sampling_distribution(const float* logits, int64_t vocab,
                                                              const SamplingParams& params);

class Sampler {
public:
  // `ends`: the tokens min_tokens holds back (the model's EOS ids and the stop ids). `grammar`:
  // hold the answer to it (answer_grammar.h: a JSON object, a JSON schema); null: free text.
  explicit Sampler(const SamplingParams& p, std::vector<int32_t> ends = {}, const AnswerGrammar* grammar = nullptr)
      : params_(p), rng_(p.seed), ends_(std::move(ends)) {
    if (grammar) answer_.cursor = grammar->start();
  }
  // Whether the next draw, after an answer of `answer_len` tokens, reads adjusted logits (a
  // grammar's mask is an adjustment).
  bool adjusts(size_t answer_len) const {
    return params_.adjusts_logits() || holds_back(answer_len) || answer_.cursor != nullptr;
  }
  // Whether the answer is held to a grammar and is a whole document: it ends there.
  bool answer_complete() const { return answer_.cursor && answer_.cursor->complete(); }
  // Picks a token from one row of raw logits (float32, length vocab); the prompt and the answer
  // so far feed the penalties. An answer held to a grammar draws only among the tokens it allows
  // next (the others' logits are -inf before temperature and the warpers, as vLLM's logits
  // processors run before sampling) and moves on by the token drawn.
  int32_t sample(const float* logits, int64_t vocab, std::span<const int32_t> prompt = {},
                 std::span<const int32_t> answer = {});
  // The same draw from a row's candidates (row_candidates.h) where they decide it, the
  // distribution's normaliser being theirs. Otherwise nullopt, and the caller passes the full row
  // to sample() above, whose draw then reuses this call's uniform number: the sequence's random
  // stream is the same either way. Greedy rows and rows whose logits are adjusted get nullopt
  // without a draw (the backend's argmax serves the first, the full row the second).
  std::optional<int32_t> sample(const RowCandidates& c, size_t answer_len);
  // A greedy answer held to a grammar and nothing else (no penalty, bias or min_tokens hold): its
  // row's raw argmax is the token wherever the grammar allows it, so the backend's argmax can
  // serve it without the row leaving the device.
  bool greedy_held(size_t answer_len) const {
    return params_.greedy() && answer_.cursor && !params_.adjusts_logits() && !holds_back(answer_len);
  }
  // For such an answer: takes `argmax` (the row's raw argmax) and moves on by it when the grammar
  // allows it, as sample() would; false, nothing changed, when it does not (sample() then masks
  // the full row).
  bool take_argmax(int32_t argmax, size_t answer_len) {
    if (!greedy_held(answer_len) || !answer_.cursor->accepts(argmax)) return false;
    answer_.cursor->advance(argmax);
    return true;
  }

private:
  // Whether min_tokens still holds the ends back after an answer of `answer_len` tokens.
  bool holds_back(size_t answer_len) const {
    return !ends_.empty() && answer_len < size_t(std::max(params_.min_tokens, 0));
  }

  SamplingParams params_;
  // The next uniform number of the sequence's stream: a candidates' draw's that fell back, or a
  // fresh one.
  double next_uniform();

  std::mt19937_64 rng_;
  std::optional<double> pending_uniform_;
  // sample()'s choice among the tokens the answer's grammar allows next.
  int32_t sample_held(float* logits, int64_t vocab);
  // The draw over warped logits (greedy: their argmax).
  int32_t draw(const float* logits, int64_t vocab);

  std::vector<int32_t> ends_;
  // The answer's place in its grammar; copied with the sampler (a request's choices start alike).
  struct Cursor {
    std::unique_ptr<AnswerCursor> cursor;
    Cursor() = default;
    Cursor(const Cursor& o) : cursor(o.cursor ? o.cursor->clone() : nullptr) {}
    Cursor(Cursor&&) noexcept = default;
    Cursor& operator=(const Cursor& o) { return *this = Cursor(o); }
    Cursor& operator=(Cursor&&) noexcept = default;
  } answer_;
  std::vector<float> adjusted_;  // a row's logits after adjust_logits
};

}  // namespace strata
