#include "strata/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "strata/core/error.h"

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

std::vector<std::pair<int32_t, double>> sampling_distribution(const float* logits, int64_t vocab,
                                                              const SamplingParams& params) {
  // Candidates by logit, best first. Among equal logits the higher id comes first: transformers'
  // top-p sorts ascending (stably) and cuts from the low end, so it drops the lower ids of a tie.
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  auto by_logit = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a > b); };
  size_t keep = order.size();
  if (params.top_k > 0 && size_t(params.top_k) < keep) {
    // transformers keeps every token whose logit ties the k-th largest, so we do too.
    keep = size_t(params.top_k);
    std::partial_sort(order.begin(), order.begin() + std::ptrdiff_t(keep), order.end(), by_logit);
    const float kth = logits[order[keep - 1]];
    std::sort(order.begin() + std::ptrdiff_t(keep), order.end(), by_logit);
    while (keep < order.size() && logits[order[keep]] == kth) ++keep;
    order.resize(keep);
  } else {
    std::sort(order.begin(), order.end(), by_logit);
  }

  std::vector<std::pair<int32_t, double>> dist(order.size());
  const double inv_t = params.temperature > 0 ? 1.0 / double(params.temperature) : 1.0;
  const double top = double(logits[order[0]]) * inv_t;
  double sum = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    dist[i] = {order[i], std::exp(double(logits[order[i]]) * inv_t - top)};
    sum += dist[i].second;
  }
  for (auto& d : dist) d.second /= sum;

  if (params.top_p < 1.0f) {
    // Keep each token whose more probable predecessors hold less than top_p of the mass (at least
    // one), which is transformers' rule "drop tokens whose ascending cumulative mass <= 1 - top_p".
    double before = 0;
    size_t n = 0;
    while (n < dist.size() && (n == 0 || before < double(params.top_p))) before += dist[n++].second;
    dist.resize(n);
    for (auto& d : dist) d.second /= before;
  }
  if (params.min_p > 0.0f) {
    // transformers' rule: drop each token whose probability is below min_p times the first's
    // (the first always stays); renormalising before does not change the ratio.
    const double floor = double(params.min_p) * dist[0].second;
    size_t n = 1;
    while (n < dist.size() && dist[n].second >= floor) ++n;
    if (n < dist.size()) {
      dist.resize(n);
      double kept = 0;
      for (const auto& d : dist) kept += d.second;
      for (auto& d : dist) d.second /= kept;
    }
  }
  return dist;
}

int32_t Sampler::sample(const float* logits, int64_t vocab, std::span<const int32_t> prompt,
                        std::span<const int32_t> answer) {
  if (params_.adjusts_logits()) {
    adjusted_.assign(logits, logits + vocab);
    adjust_logits(adjusted_.data(), vocab, params_, prompt, answer);
    logits = adjusted_.data();
  }
  if (params_.greedy()) return int32_t(std::max_element(logits, logits + vocab) - logits);
  const auto dist = sampling_distribution(logits, vocab, params_);
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  double cum = 0;
  for (const auto& [token, p] : dist) {
    cum += p;
    if (u < cum) return token;
  }
  return dist.back().first;
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

StepLogprobs step_logprobs(const float* logits, int64_t vocab, int32_t sampled, int top) {
  STRATA_CHECK(sampled >= 0 && sampled < vocab, "token " << sampled << " outside the vocabulary of " << vocab);
  float mx = -INFINITY;
  for (int64_t j = 0; j < vocab; ++j) mx = std::max(mx, logits[j]);
  double sum = 0;
  for (int64_t j = 0; j < vocab; ++j) sum += std::exp(double(logits[j]) - double(mx));
  const double log_z = double(mx) + std::log(sum);
  StepLogprobs out;
  out.sampled = {sampled, double(logits[sampled]) - log_z};
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

}  // namespace strata
