#include "strata/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace strata {

int32_t Sampler::sample(const float* logits, int64_t vocab) {
  if (params_.greedy()) return int32_t(std::max_element(logits, logits + vocab) - logits);

  // Candidates sorted by logit, best first (stable, so equal logits keep the lower id first).
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  size_t keep = size_t(vocab);
  if (params_.top_k > 0) keep = std::min(keep, size_t(params_.top_k));
  auto by_logit = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  if (keep < order.size()) {
    std::partial_sort(order.begin(), order.begin() + std::ptrdiff_t(keep), order.end(), by_logit);
    order.resize(keep);
  } else {
    std::sort(order.begin(), order.end(), by_logit);
  }

  std::vector<double> probs(order.size());
  const double inv_t = 1.0 / double(params_.temperature);
  const double top = double(logits[order[0]]) * inv_t;
  double sum = 0;
  for (size_t i = 0; i < order.size(); ++i) sum += probs[i] = std::exp(double(logits[order[i]]) * inv_t - top);
  for (double& p : probs) p /= sum;

  if (params_.top_p < 1.0f) {
    // Smallest prefix whose mass reaches top_p (at least one token), as transformers' TopPLogitsWarper.
    double cum = 0;
    size_t n = 0;
    while (n < probs.size()) {
      cum += probs[n++];
      if (cum >= double(params_.top_p)) break;
    }
    probs.resize(n);
    order.resize(n);
    const double mass = std::accumulate(probs.begin(), probs.end(), 0.0);
    for (double& p : probs) p /= mass;
  }

  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  double cum = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    cum += probs[i];
    if (u < cum) return order[i];
  }
  return order.back();
}

}  // namespace strata
