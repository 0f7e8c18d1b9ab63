#include "strata/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <utility>

#include "strata/core/error.h"
#include "strata/runtime/row_candidates.h"

// Built with -ffp-contract=off (src/CMakeLists.txt): a penalty's multiply and subtract round
// separately, as the tensor operations of transformers and vLLM do.

namespace strata {

void adjust_logits(float* logits, int64_t vocab, const SamplingParams& p, std::span<const int32_t> prompt,
                   std::span<const int32_t> answer) {
  auto in_vocab = [vocab](int32_t id) { return id >= 0 && id < vocab; };
  for (const auto& [token, bias] : p.logit_bias)
    if (in_vocab(token)) logits[token] += bias;
  if (p.repetition_penalty != 1.0f) {
    std::vector<int32_t> seen(prompt.begin(), prompt.end());
    seen.insert(seen.end(), answer.begin(), answer.end());
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (int32_t id : seen) {
      if (!in_vocab(id)) continue;
      float& l = logits[id];
      l = l < 0 ? l * p.repetition_penalty : l / p.repetition_penalty;
    }
  }
  if (p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) {
    std::vector<int32_t> ids(answer.begin(), answer.end());
    std::sort(ids.begin(), ids.end());
    for (size_t i = 0; i < ids.size();) {
      size_t j = i;
      while (j < ids.size() && ids[j] == ids[i]) ++j;
      if (in_vocab(ids[i])) {
        float& l = logits[ids[i]];
        l -= p.frequency_penalty * float(j - i);
        l -= p.presence_penalty;
      }
      i = j;
    }
  }
}

namespace {

using Weighted = std::pair<int32_t, double>;  // a token and its probability

// Grows the sorted prefix dist[0, in_order) of a row's candidates: by logit, best first; among
// equal logits the higher id first (transformers' top-p sorts ascending, stably, and cuts from the
// low end, so it drops the lower ids of a tie). Sorting 64, then 256, ... tokens finds a peaked
// row's nucleus or draw without sorting a 128k vocabulary.
void sort_more(const float* logits, std::vector<Weighted>& dist, size_t& in_order) {
  auto by_logit = [&](const Weighted& a, const Weighted& b) {
    return logits[a.first] > logits[b.first] || (logits[a.first] == logits[b.first] && a.first > b.first);
  };
  const size_t m = std::min(dist.size(), std::max<size_t>(64, 4 * in_order));
  std::partial_sort(dist.begin() + std::ptrdiff_t(in_order), dist.begin() + std::ptrdiff_t(m), dist.end(), by_logit);
  in_order = m;
}

// Fills `dist` with the tokens sampling may draw and their probabilities (summing to 1), after
// temperature, top-k, top-p and min-p, and returns how many of them lead in sorted order
// (sort_more's): only top-p needs an order, and only as far as its mass reaches. With `sorted` the
// whole result is sorted. A row of a 128k vocabulary thus costs a pass and its exponentials, not
// a sort of 128k tokens.
size_t warp(const float* logits, int64_t vocab, const SamplingParams& params, bool sorted, std::vector<Weighted>& dist) {
  if (params.top_k > 0 && params.top_k < vocab) {
    // The k-th largest logit by selection over a copy, then every token at or above it:
    // transformers keeps every token whose logit ties the k-th largest, so we do too.
    thread_local std::vector<float> values;
    values.assign(logits, logits + vocab);
    std::nth_element(values.begin(), values.begin() + (params.top_k - 1), values.end(), std::greater<float>());
    const float kth = values[size_t(params.top_k - 1)];
    dist.clear();
    for (int64_t i = 0; i < vocab; ++i)
      if (logits[i] >= kth) dist.push_back({int32_t(i), 0.0});
  } else {
    dist.resize(static_cast<size_t>(vocab));
    for (int64_t i = 0; i < vocab; ++i) dist[size_t(i)] = {int32_t(i), 0.0};
  }

  const double inv_t = params.temperature > 0 ? 1.0 / double(params.temperature) : 1.0;
  float best = -INFINITY;
  for (const Weighted& w : dist) best = std::max(best, logits[w.first]);
  const double top = double(best) * inv_t;
  double sum = 0;
  for (Weighted& w : dist) {
    w.second = std::exp(double(logits[w.first]) * inv_t - top);
    sum += w.second;
  }
  for (Weighted& w : dist) w.second /= sum;

  size_t in_order = 0;  // dist[0, in_order) is sorted and precedes the rest
  if (params.top_p < 1.0f) {
    // Keep each token whose more probable predecessors hold less than top_p of the mass (at least
    // one), which is transformers' rule "drop tokens whose ascending cumulative mass <= 1 - top_p".
    double before = 0;
    size_t n = 0;
    for (bool more = true; more;) {
      sort_more(logits, dist, in_order);
      for (; n < in_order && (n == 0 || before < double(params.top_p)); ++n) before += dist[n].second;
      more = n == in_order && in_order < dist.size();
    }
    dist.resize(n);
    in_order = n;
    for (Weighted& w : dist) w.second /= before;
  }
  if (params.min_p > 0.0f) {
    // transformers' rule: drop each token whose probability is below min_p times the most
    // probable's (which always stays); renormalising before does not change the ratio.
    double most = 0;
    for (const Weighted& w : dist) most = std::max(most, w.second);
    const double floor = double(params.min_p) * most;
    auto kept = [&](const Weighted& w) { return w.second >= floor; };
    // After top-p the tokens are sorted, and those kept are a prefix; otherwise order is free.
    const auto kept_end = in_order == dist.size() ? std::partition_point(dist.begin(), dist.end(), kept)
                                                  : std::partition(dist.begin(), dist.end(), kept);
    if (kept_end != dist.end()) {
      dist.erase(kept_end, dist.end());
      in_order = std::min(in_order, dist.size());
      double mass = 0;
      for (const Weighted& w : dist) mass += w.second;
      for (Weighted& w : dist) w.second /= mass;
    }
  }
  while (sorted && in_order < dist.size()) sort_more(logits, dist, in_order);
  return in_order;
}

}  // namespace

std::vector<std::pair<int32_t, double>> sampling_distribution(const float* logits, int64_t vocab,
                                                              const SamplingParams& params) {
  std::vector<Weighted> dist;
  warp(logits, vocab, params, /*sorted=*/true, dist);
  return dist;
}

int32_t Sampler::sample(const float* logits, int64_t vocab, std::span<const int32_t> prompt,
                        std::span<const int32_t> answer) {
  if (adjusts(answer.size())) {
    adjusted_.assign(logits, logits + vocab);
    adjust_logits(adjusted_.data(), vocab, params_, prompt, answer);
    if (holds_back(answer.size()))  // as MinNewTokensLengthLogitsProcessor
      for (int32_t t : ends_)
        if (t >= 0 && t < vocab) adjusted_[size_t(t)] = -INFINITY;
    logits = adjusted_.data();
  }
  if (answer_.cursor) return sample_held(adjusted_.data(), vocab);
  return draw(logits, vocab);
}

int32_t Sampler::sample_held(float* logits, int64_t vocab) {
  AnswerCursor& cursor = *answer_.cursor;
  // A greedy answer whose argmax the grammar allows needs no mask: the masked argmax is the same
  // token (the lowest id among equal maxima either way).
  if (params_.greedy()) {
    const int32_t best = int32_t(std::max_element(logits, logits + vocab) - logits);
    if (cursor.accepts(best)) {
      cursor.advance(best);
      return best;
    }
  }
  if (cursor.mask(logits, vocab) == 0)
    STRATA_FAIL("structured answer: no token of the model's vocabulary can continue it (the tokenizer lacks the "
                "bytes the grammar needs next)");
  const int32_t token = draw(logits, vocab);
  cursor.advance(token);
  return token;
}

int32_t Sampler::draw(const float* logits, int64_t vocab) {
  if (params_.greedy()) return int32_t(std::max_element(logits, logits + vocab) - logits);
  // sampling_distribution's walk, most probable first, sorted only as far as the draw reaches. The
  // order matters beyond the distribution: two runs whose logits differ in the last bits (a
  // step's size picks the GEMM) then part only where two candidates tie to those bits and trade
  // places, not where a draw falls within that rounding of a boundary between untied tokens
  // (docs/offload.md, "The same tokens").
  thread_local std::vector<Weighted> dist;
  size_t in_order = warp(logits, vocab, params_, /*sorted=*/false, dist);
  const double u = next_uniform();
  double cum = 0;
  for (size_t i = 0; i < dist.size(); ++i) {
    if (i == in_order) sort_more(logits, dist, in_order);
    cum += dist[i].second;
    if (u < cum) return dist[i].first;
  }
  while (in_order < dist.size()) sort_more(logits, dist, in_order);
  return dist.back().first;
}

namespace {

// sample()'s draw over a row's candidates, step for step as warp() and the walk take it over the
// full row (the same expressions, so the same probabilities given the same normaliser); nullopt
// where a step would reach past the candidates.
std::optional<int32_t> draw_from(const RowCandidates& c, const SamplingParams& params, double u) {
  if (c.count == 0 || !std::isfinite(c.sum_t) || !(c.sum_t > 0)) return std::nullopt;
  const double inv_t = params.temperature > 0 ? 1.0 / double(params.temperature) : 1.0;
  const double top = double(c.max) * inv_t;
  auto weight = [&](int64_t i) { return std::exp(double(c.logits[i]) * inv_t - top); };
  int64_t kept = c.count;             // the drawable tokens among the candidates: a prefix
  bool complete = c.count == c.vocab;  // whether the prefix holds every drawable token
  double sum = c.sum_t;
  if (params.top_k > 0 && params.top_k < c.vocab) {
    if (params.top_k > c.count) return std::nullopt;
    const float kth = c.logits[params.top_k - 1];
    kept = params.top_k;
    while (kept < c.count && c.logits[kept] >= kth) ++kept;  // the k-th's ties stay
    if (kept == c.count && !complete) return std::nullopt;   // and may run on past the candidates
    complete = true;
    // warp() sums the kept tokens' weights in id order.
    thread_local std::vector<Weighted> by_id;
    by_id.clear();
    for (int64_t i = 0; i < kept; ++i) by_id.push_back({c.ids[i], weight(i)});
    std::sort(by_id.begin(), by_id.end());
    sum = 0;
    for (const Weighted& w : by_id) sum += w.second;
  }
  // Probabilities as the walks reach them: a draw or a nucleus usually ends within tens of the
  // 1024 candidates. The renormalisations below divide only entries already reached.
  thread_local std::vector<double> p;
  p.clear();
  auto prob = [&](int64_t i) {
    while (int64_t(p.size()) <= i) p.push_back(weight(int64_t(p.size())) / sum);
    return p[size_t(i)];
  };
  if (params.top_p < 1.0f) {
    double before = 0;
    int64_t n = 0;
    for (; n < kept && (n == 0 || before < double(params.top_p)); ++n) before += prob(n);
    if (n == kept && !complete && before < double(params.top_p)) return std::nullopt;
    kept = n;
    complete = true;
    for (int64_t i = 0; i < kept; ++i) p[size_t(i)] /= before;
  }
  if (params.min_p > 0.0f) {
    const double floor = double(params.min_p) * prob(0);  // the first is the most probable
    int64_t n = 0;
    while (n < kept && prob(n) >= floor) ++n;
    if (n == kept && !complete) return std::nullopt;
    if (n < kept) {
      kept = n;
      double mass = 0;
      for (int64_t i = 0; i < kept; ++i) mass += p[size_t(i)];
      for (int64_t i = 0; i < kept; ++i) p[size_t(i)] /= mass;
    }
    complete = true;
  }
  double cum = 0;
  for (int64_t i = 0; i < kept; ++i) {
    cum += prob(i);
    if (u < cum) return c.ids[i];
  }
  if (complete) return c.ids[kept - 1];
  return std::nullopt;
}

}  // namespace

std::optional<int32_t> Sampler::sample(const RowCandidates& c, size_t answer_len) {
  if (params_.greedy() || adjusts(answer_len)) return std::nullopt;
  const double u = next_uniform();
  std::optional<int32_t> token = draw_from(c, params_, u);
  if (!token) pending_uniform_ = u;
  return token;
}

double Sampler::next_uniform() {
  if (pending_uniform_) return *std::exchange(pending_uniform_, std::nullopt);
  return std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
}

double token_nll(const float* logits, int64_t vocab, int32_t target) {
  STRATA_CHECK(target >= 0 && target < vocab, "target " << target << " outside the vocabulary of " << vocab);
  float mx = -INFINITY;
  for (int64_t j = 0; j < vocab; ++j) mx = std::max(mx, logits[j]);
  double sum = 0;
  for (int64_t j = 0; j < vocab; ++j) sum += std::exp(double(logits[j]) - double(mx));
  const double nll = std::log(sum) + double(mx) - double(logits[target]);
  if (!std::isfinite(nll)) STRATA_FAIL("perplexity: non-finite logits (maximum " << mx << ", sum " << sum << ")");
  return nll;
}

std::vector<double> token_nlls(ThreadPool& pool, const float* logits, int64_t rows, int64_t vocab,
                               const int32_t* targets) {
  std::vector<double> nlls(static_cast<size_t>(std::max<int64_t>(rows, 0)));
  pool.parallel_for(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) nlls[size_t(r)] = token_nll(logits + r * vocab, vocab, targets[r]);
  });
  return nlls;
}

// The maximum; the `top` most probable (logit descending, the lower id first among ties; NaN never
// enters) in one pass keeping them sorted in a short list, no sort over the vocabulary; the sum of
// exponentials (each term in double, as the device's row_candidates); the rank. Each its own loop,
// so that the plain ones vectorize.
StepLogprobs step_logprobs(const float* logits, int64_t vocab, int32_t sampled, int top) {
  STRATA_CHECK(sampled >= 0 && sampled < vocab, "token " << sampled << " outside the vocabulary of " << vocab);
  const size_t k = size_t(std::clamp<int64_t>(top, 0, vocab));
  std::vector<int32_t> best;
  best.reserve(k + 1);
  auto beats = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  float mx = -INFINITY;
  for (int64_t j = 0; j < vocab; ++j) mx = std::max(mx, logits[j]);
  for (int64_t j = 0; j < vocab && k > 0; ++j) {
    if (best.size() == k && !beats(int32_t(j), best.back())) continue;
    if (std::isnan(logits[j])) continue;
    size_t at = best.size();
    while (at > 0 && beats(int32_t(j), best[at - 1])) --at;
    best.insert(best.begin() + std::ptrdiff_t(at), int32_t(j));
    if (best.size() > k) best.pop_back();
  }
  double sum = 0;
  for (int64_t j = 0; j < vocab; ++j) sum += std::exp(double(logits[j]) - double(mx));
  const double log_z = double(mx) + std::log(sum);
  StepLogprobs out;
  out.sampled = {sampled, double(logits[sampled]) - log_z};
  out.sampled_rank = compute_target_rank(logits, vocab, sampled).rank;
  for (int32_t id : best) out.top.push_back({id, double(logits[id]) - log_z});
  return out;
}

std::optional<StepLogprobs> step_logprobs(const RowCandidates& c, int32_t sampled, int top) {
  if (!std::isfinite(c.sum_1) || !(c.sum_1 > 0)) return std::nullopt;
  const int32_t* at = std::find(c.ids, c.ids + c.count, sampled);
  if (at == c.ids + c.count) return std::nullopt;
  const double log_z = double(c.max) + std::log(c.sum_1);
  StepLogprobs out;
  out.sampled = {sampled, double(c.logits[at - c.ids]) - log_z};
  const int64_t k = std::clamp<int64_t>(top, 0, c.vocab);
  if (k == 0) return out;
  if (k > c.count) return std::nullopt;
  // The k best with every tie of the k-th, re-sorted with the lower id first among ties.
  int64_t m = k;
  while (m < c.count && c.logits[m] == c.logits[k - 1]) ++m;
  if (m == c.count && c.count < c.vocab) return std::nullopt;
  std::vector<int64_t> order(static_cast<size_t>(m));
  std::iota(order.begin(), order.end(), int64_t(0));
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return c.logits[a] > c.logits[b] || (c.logits[a] == c.logits[b] && c.ids[a] < c.ids[b]);
  });
  for (int64_t i = 0; i < k; ++i) {
    const int64_t at_i = order[size_t(i)];
    out.top.push_back({c.ids[at_i], double(c.logits[at_i]) - log_z});
  }
  return out;
}

}  // namespace strata
