#include "strata/runtime/embedder.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "strata/core/error.h"

namespace strata {

Embedder::Embedder(Transformer& model, int64_t step_tokens) : model_(model), step_tokens_(step_tokens) {
  STRATA_CHECK(step_tokens > 0, "embedding steps need a positive token budget, got " << step_tokens);
}

void Embedder::fit_cache(int slots, int capacity) {
  const int64_t need = int64_t(slots) * capacity;
  if (need > cache_positions_) {
    cache_.storage.reset();  // free the old cache before taking the larger one
    cache_ = make_kv_cache(model_.config(), model_.backend(), slots, capacity);
    cache_positions_ = need;
    return;
  }
  reshape_kv_cache(cache_, model_.config(), model_.backend().activation_dtype(), slots, capacity);
}

std::vector<std::vector<float>> Embedder::embed(std::span<const std::vector<int32_t>> seqs, PoolingKind pooling) {
  const auto t0 = std::chrono::steady_clock::now();
  const ModelConfig& cfg = model_.config();
  const int64_t h = cfg.hidden;
  for (size_t i = 0; i < seqs.size(); ++i)
    STRATA_CHECK(!seqs[i].empty() && int64_t(seqs[i].size()) <= cfg.max_positions,
                 "sequence " << i << " of " << seqs[i].size() << " tokens: an embedding needs 1 to "
                             << cfg.max_positions << " tokens");
  std::vector<size_t> order(seqs.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return seqs[a].size() > seqs[b].size(); });

  std::vector<std::vector<double>> sums(seqs.size());  // pooled in double, rounded once
  for (size_t begin = 0; begin < order.size();) {
    // The group: the longest left and as many after it as fit the budget at its length.
    const int64_t longest = int64_t(seqs[order[begin]].size());
    const size_t count = size_t(std::max<int64_t>(1, step_tokens_ / longest));
    const size_t end = std::min(order.size(), begin + count);
    fit_cache(int(end - begin), int(longest));
    // Steps over the group: all of it at once, or chunks of its one long sequence.
    for (int64_t from = 0; from < longest; from += step_tokens_) {
      const int64_t to = std::min(longest, from + step_tokens_);
      // The step's tokens, and the ones the pooling reads: every one for the mean, else each
      // sequence's last (or first) token, gathered on the backend before the copy to the host.
      StepBatch step;
      std::vector<size_t> pooled_seq;  // the sequence of each row the step returns
      for (size_t g = begin; g < end; ++g) {
        const std::vector<int32_t>& s = seqs[order[g]];
        const int64_t len = int64_t(s.size());
        for (int64_t p = from; p < std::min(to, len); ++p) {
          const bool pooled = pooling == PoolingKind::Mean || (pooling == PoolingKind::Last && p == len - 1) ||
                              (pooling == PoolingKind::Cls && p == 0);
          if (pooled && pooling != PoolingKind::Mean) step.logit_rows.push_back(int32_t(step.tokens.size()));
          if (pooled) pooled_seq.push_back(order[g]);
          step.tokens.push_back(s[size_t(p)]);
          step.positions.push_back(int32_t(p));
          step.slots.push_back(int32_t(g - begin));
        }
      }
      ++stats_.steps;
      if (pooling != PoolingKind::Mean && step.logit_rows.empty()) {
        model_.hidden_states(step, cache_);  // a chunk of a long sequence: its keys for the next chunk
        continue;
      }
      const Tensor out = model_.hidden_states(step, cache_);
      rows_.resize(pooled_seq.size() * size_t(h));
      model_.backend().copy_to_host_f32(out, rows_.data());
      for (size_t r = 0; r < pooled_seq.size(); ++r) {
        std::vector<double>& acc = sums[pooled_seq[r]];
        acc.resize(size_t(h), 0.0);
        const float* row = rows_.data() + r * size_t(h);
        for (int64_t j = 0; j < h; ++j) acc[size_t(j)] += row[j];
      }
    }
    for (size_t g = begin; g < end; ++g) stats_.tokens += int64_t(seqs[order[g]].size());
    begin = end;
  }
  std::vector<std::vector<float>> out(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    const double scale = pooling == PoolingKind::Mean ? 1.0 / double(seqs[i].size()) : 1.0;
    out[i].resize(size_t(h));
    for (int64_t j = 0; j < h; ++j) out[i][size_t(j)] = float(sums[i][size_t(j)] * scale);
  }
  stats_.sequences += int64_t(seqs.size());
  stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace strata
