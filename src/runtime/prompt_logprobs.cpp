#include "strata/runtime/prompt_logprobs.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "strata/core/error.h"
#include "strata/runtime/row_candidates.h"

namespace strata {
namespace {

constexpr size_t kScoredLogitBytes = size_t(64) << 20;   // as fp32 on the host
constexpr size_t kDeviceLogitBytes = size_t(256) << 20;  // (fp32-sized) where they stay on the device

}  // namespace

std::vector<StepLogprobs> target_logprobs(ThreadPool& pool, const float* logits, int64_t rows, int64_t vocab,
                                          const int32_t* targets, int top) {
  std::vector<StepLogprobs> out(static_cast<size_t>(std::max<int64_t>(rows, 0)));
  pool.parallel_for(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) out[size_t(r)] = step_logprobs(logits + r * vocab, vocab, targets[r], top);
  });
  return out;
}

ThreadPool& RowScorer::pool() {
  if (!pool_) pool_ = std::make_unique<ThreadPool>(0);
  return *pool_;
}

std::vector<StepLogprobs> RowScorer::score_on_host(const Tensor& logits, const std::vector<int32_t>& targets,
                                                   const std::vector<int>& tops) {
  const int64_t R = logits.dim(0), V = logits.row_size();
  host_rows_.resize(size_t(R * V));
  backend_.copy_to_host_f32(logits, host_rows_.data());
  std::vector<StepLogprobs> out(static_cast<size_t>(R));
  pool().parallel_for(R, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      out[size_t(r)] = step_logprobs(host_rows_.data() + size_t(r * V), V, targets[size_t(r)], tops[size_t(r)]);
  });
  return out;
}

std::vector<StepLogprobs> RowScorer::score(const Tensor& logits, const std::vector<int32_t>& targets,
                                           const std::vector<int>& tops) {
  const int64_t R = logits.dim(0), V = logits.row_size();
  STRATA_CHECK(int64_t(targets.size()) == R && int64_t(tops.size()) == R,
               "internal: " << targets.size() << " targets for " << R << " logit rows");
  for (size_t r = 0; r < targets.size(); ++r)
    STRATA_CHECK(targets[r] >= 0 && targets[r] < V && tops[r] >= 0 && tops[r] <= kMaxTop,
                 "internal: scoring target " << targets[r] << " (top " << tops[r] << ") of a vocabulary of " << V);
  if (R == 0) return {};
  if (!backend_.samples_on_device()) return score_on_host(logits, targets, tops);
  // The device buffer: candidates (8-aligned rows), ranks, then targets and temperatures.
  const size_t cand_bytes = size_t(R) * row_candidates_bytes(kCandidates), rank_bytes = size_t(R) * 8;
  const size_t need = cand_bytes + rank_bytes + size_t(R) * 8;
  if (device_.bytes() < need) {
    device_.reset();
    device_ = backend_.alloc(need);
  }
  const Tensor targets_t = device_.view(cand_bytes + rank_bytes, DType::I32, {R});
  const Tensor temperatures = device_.view(cand_bytes + rank_bytes + size_t(R) * 4, DType::F32, {R});
  zeros_.assign(size_t(R), 0.0f);  // temperature 0: sums at 1
  backend_.upload(targets_t.data, targets.data(), size_t(R) * 4);
  backend_.upload(temperatures.data, zeros_.data(), size_t(R) * 4);
  backend_.row_candidates(logits, temperatures, kCandidates, device_.data());
  backend_.target_ranks(logits, targets_t, static_cast<char*>(device_.data()) + cand_bytes);
  summaries_.resize(cand_bytes + rank_bytes);
  backend_.copy_to_host(summaries_.data(), device_.data(), summaries_.size());
  std::vector<StepLogprobs> out(static_cast<size_t>(R));
  std::vector<char> whole_row(static_cast<size_t>(R), 0);
  pool().parallel_for(R, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const RowCandidates c = read_row_candidates(summaries_.data(), r, kCandidates, V);
      TargetRank t;
      std::memcpy(&t, summaries_.data() + cand_bytes + size_t(r) * 8, sizeof t);
      // The top tokens, re-sorted with the lower id first among ties (nullopt: ties run past them).
      std::optional<StepLogprobs> s = step_logprobs(c, c.ids[0], tops[size_t(r)]);
      if (!s) {
        whole_row[size_t(r)] = 1;
        continue;
      }
      s->sampled = {targets[size_t(r)], double(t.logit) - (double(c.max) + std::log(c.sum_1))};
      s->sampled_rank = t.rank;
      out[size_t(r)] = std::move(*s);
    }
  });
  for (int64_t r = 0; r < R; ++r)
    if (whole_row[size_t(r)]) {
      const std::vector<StepLogprobs> one = score_on_host(logits.rows(r, 1), {targets[size_t(r)]}, {tops[size_t(r)]});
      out[size_t(r)] = one[0];
    }
  return out;
}

PromptScorer::PromptScorer(Backend& backend, int64_t vocab)
    : vocab_(vocab),
      max_rows_(std::max<int64_t>(1, int64_t((backend.samples_on_device() ? kDeviceLogitBytes : kScoredLogitBytes) /
                                             (size_t(vocab) * 4)))),
      rows_scorer_(backend) {}

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
  std::vector<int32_t> targets;
  std::vector<int> tops;
  for (const Span& span : spans_)
    for (int t = span.from; t < span.to; ++t) {
      targets.push_back(span.seq->request->prompt[size_t(t) + 1]);
      tops.push_back(span.seq->request->prompt_logprobs);
    }
  std::vector<StepLogprobs> got = rows_scorer_.score(logits, targets, tops);
  size_t row = 0;
  for (const Span& span : spans_)
    for (int t = span.from; t < span.to; ++t) span.seq->result.prompt_logprobs[size_t(t)] = std::move(got[row++]);
  spans_.clear();
  rows_ = 0;
}

}  // namespace strata
