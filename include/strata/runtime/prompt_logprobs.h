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

// Rows of logits scored against their targets where the logits are. On a backend that samples on
// the device (the GPU) only each row's candidates (row_candidates.h: its maximum, its sum of
// exponentials and its most probable tokens) and its target's logit and rank cross to the host,
// not the row: 0.5 KiB a row against 256 KiB of a 128k vocabulary in fp16, and no host pass over
// the vocabulary. Elsewhere, or for a row whose top tokens' ties run past its candidates, the row
// crosses as fp32 and target_logprobs reduces it. Either way each row's result is target_logprobs'
// of the same logits, up to the order of the sum's terms.
class RowScorer {
public:
  explicit RowScorer(Backend& backend) : backend_(backend) {}
  // logits: [R, V] where the backend keeps them; targets[r] < V and tops[r] (<= kMaxTop) per row.
  std::vector<StepLogprobs> score(const Tensor& logits, const std::vector<int32_t>& targets, const std::vector<int>& tops);

  static constexpr int kMaxTop = 20;         // vLLM's max_logprobs
  static constexpr int64_t kCandidates = 64;  // a row's candidates: the top 20 and their ties

private:
  std::vector<StepLogprobs> score_on_host(const Tensor& logits, const std::vector<int32_t>& targets,
                                          const std::vector<int>& tops);
  ThreadPool& pool();

  Backend& backend_;
  Buffer device_;                 // the targets, zero temperatures, the rows' candidates and ranks
  std::vector<uint8_t> summaries_;  // the candidates and ranks on the host
  std::vector<float> host_rows_, zeros_;
  std::unique_ptr<ThreadPool> pool_;  // the rows' reductions, made on first use
};

// The scored prompt positions of the step being built, for the resident generator and its
// continuous batcher: their logit rows follow the step's sampled rows, and after the forward pass
// their log-probabilities go into their sequences' GenResult::prompt_logprobs.
class PromptScorer {
public:
  PromptScorer(Backend& backend, int64_t vocab);

  // The most positions one step scores: a scored prompt's piece in a step stops at this many. Their
  // logits are the step's head output: 64 MiB of them as fp32 (1024 rows of a 16k vocabulary) where
  // they cross to the host, 256 MiB where they stay on the device.
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
  int64_t vocab_ = 0, max_rows_ = 1, rows_ = 0;
  std::vector<Span> spans_;
  RowScorer rows_scorer_;
};

}  // namespace strata
