#include "strata/runtime/prompt_logprobs.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "strata/core/error.h"

namespace strata {
namespace {

constexpr size_t kScoredLogitBytes = size_t(64) << 20;

StepLogprobs target_logprob(const float* logits, int64_t vocab, int32_t target, int top) {
  STRATA_CHECK(target >= 0 && target < vocab, "prompt token " << target << " outside the vocabulary of " << vocab);
  float mx = -INFINITY;
  for (int64_t j = 0; j < vocab; ++j) mx = std::max(mx, logits[j]);
  double sum = 0;
  int64_t rank = 0;
  const float own = logits[target];
  for (int64_t j = 0; j < vocab; ++j) {
    sum += std::exp(double(logits[j]) - double(mx));
    rank += logits[j] >= own;
  }
  const double log_z = double(mx) + std::log(sum);
  StepLogprobs out;
  out.sampled = {target, double(own) - log_z};
  out.sampled_rank = rank;
  const size_t k = size_t(std::clamp<int64_t>(top, 0, vocab));
  if (k > 0) {
    std::vector<int32_t> order(static_cast<size_t>(vocab));
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + std::ptrdiff_t(k), order.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (size_t i = 0; i < k; ++i) out.top.push_back({order[i], double(logits[order[i]]) - log_z});
  }
  return out;
}

}  // namespace

std::vector<StepLogprobs> target_logprobs(ThreadPool& pool, const float* logits, int64_t rows, int64_t vocab,
                                          const int32_t* targets, int top) {
  std::vector<StepLogprobs> out(static_cast<size_t>(std::max<int64_t>(rows, 0)));
  pool.parallel_for(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) out[size_t(r)] = target_logprob(logits + r * vocab, vocab, targets[r], top);
  });
  return out;
}

PromptScorer::PromptScorer(Backend& backend, int64_t vocab)
    : backend_(backend), vocab_(vocab), max_rows_(std::max<int64_t>(1, int64_t(kScoredLogitBytes / (size_t(vocab) * 4)))) {}

void PromptScorer::add(Sequence& s, int32_t first_row, int from, int to) {
  const int last = std::min(to, int(s.request->prompt.size()) - 1);  // the last position predicts no prompt token
  if (last <= from) return;
  Span* prev = spans_.empty() ? nullptr : &spans_.back();
  if (prev && prev->seq == &s && prev->to == from && prev->first_row + (prev->to - prev->from) == first_row) {
    prev->to = last;  // the same prompt's next position, on the next row
  } else {
    spans_.push_back({&s, first_row, from, last});
  }
  rows_ += last - from;
}

void PromptScorer::append_rows(StepBatch& step) const {
  for (const Span& span : spans_)
    for (int t = span.from; t < span.to; ++t) step.logit_rows.push_back(span.first_row + (t - span.from));
}

void PromptScorer::score(const Tensor& logits) {
  if (spans_.empty()) return;
  STRATA_CHECK(logits.dim(0) == rows_ && logits.row_size() == vocab_,
               "internal: " << logits.dim(0) << " logit rows for " << rows_ << " scored prompt positions");
  host_.resize(size_t(rows_ * vocab_));
  backend_.copy_to_host_f32(logits, host_.data());
  // Each row's target, top count and place, then every row in one pass over the pool.
  struct Row {
    std::vector<StepLogprobs>* into;
    size_t position;
    int32_t target;
    int top;
  };
  std::vector<Row> rows;
  rows.reserve(size_t(rows_));
  for (const Span& span : spans_)
    for (int t = span.from; t < span.to; ++t)
      rows.push_back({&span.seq->result.prompt_logprobs, size_t(t), span.seq->request->prompt[size_t(t) + 1],
                      span.seq->request->prompt_logprobs});
  if (!pool_) pool_ = std::make_unique<ThreadPool>(0);
  pool_->parallel_for(rows_, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const Row& row = rows[size_t(r)];
      (*row.into)[row.position] = target_logprob(host_.data() + size_t(r) * size_t(vocab_), vocab_, row.target, row.top);
    }
  });
  spans_.clear();
  rows_ = 0;
}

}  // namespace strata
