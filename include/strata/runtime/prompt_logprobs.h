// Prompt logprobs (vLLM's prompt_logprobs; the legacy completions' echo with logprobs): each prompt
// token after the first, its log-probability under the model after the tokens before it. The logit
// row of prompt position t scores prompt[t + 1]; the last position's row is the one sampled.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "strata/backend/backend.h"
#include "strata/core/thread_pool.h"
#include "strata/runtime/forward_ops.h"
#include "strata/runtime/sampler.h"
#include "strata/runtime/sequence.h"

namespace strata {

// Rows of logits ([rows, vocab], fp32 on the host) against their targets: each target's
// log-probability (log_softmax in double, as step_logprobs) and rank (the tokens at least as
// probable, itself included), with the `top` most probable tokens (ties: the lower id first). The
// rows are spread over the pool's threads; each row's result is the same whatever the pool.
std::vector<StepLogprobs> target_logprobs(ThreadPool& pool, const float* logits, int64_t rows, int64_t vocab,
                                          const int32_t* targets, int top);

// The scored prompt positions of the step being built, for the resident generator and its
// continuous batcher: their logit rows follow the step's sampled rows, and after the forward pass
// their log-probabilities go into their sequences' GenResult::prompt_logprobs.
class PromptScorer {
public:
  PromptScorer(Backend& backend, int64_t vocab);

  // The most positions one step scores: their logits cross to the host as fp32, so a scored
  // prompt's piece in a step stops at this many (64 MiB of logits; 1024 rows of a 16k vocabulary).
  int64_t max_rows() const { return max_rows_; }
  int64_t rows() const { return rows_; }
  bool empty() const { return rows_ == 0; }

  // Positions [from, to) of s's prompt are computed in this step from row `first_row` on; those
  // that predict a prompt token (t + 1 < prompt size) are scored.
  void add(Sequence& s, int32_t first_row, int from, int to);
  // Appends the listed positions' rows to the step's logit rows (after the sampled ones).
  void append_rows(StepBatch& step) const;
  // `logits`: the listed rows' logits, in order. Scores them into their sequences; clears the list.
  void score(const Tensor& logits);

private:
  struct Span {
    Sequence* seq = nullptr;
    int32_t first_row = 0;
    int from = 0, to = 0;
  };
  Backend& backend_;
  int64_t vocab_ = 0, max_rows_ = 1, rows_ = 0;
  std::vector<Span> spans_;
  std::vector<float> host_;
  std::unique_ptr<ThreadPool> pool_;  // the rows' log-softmax, made on first use
};

}  // namespace strata
