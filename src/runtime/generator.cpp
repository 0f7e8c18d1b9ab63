#include "strata/runtime/generator.h"

#include <algorithm>
#include <chrono>

#include "strata/core/error.h"

namespace strata {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Packs prompt tokens into steps of at most `budget` tokens; a long prompt may span steps, since
// each token attends to whatever of its sequence is already in the cache.
void prefill(Transformer& model, std::vector<Sequence>& seqs, KvCache& cache, StepSampler& sampler, int64_t budget) {
  StepBatch step;
  std::vector<Sequence*> finishing;  // sequences whose last prompt token is in this step
  auto flush = [&] {
    if (step.tokens.empty()) return;
    const Tensor logits = model.forward(step, cache);
    if (!finishing.empty()) sampler.sample(logits, finishing);
    step = StepBatch();
    finishing.clear();
  };
  for (Sequence& s : seqs) {
    if (s.done) continue;
    const std::vector<int32_t>& prompt = s.request->prompt;
    for (size_t i = 0; i < prompt.size(); ++i) {
      if (int64_t(step.tokens.size()) >= budget) flush();
      step.tokens.push_back(prompt[i]);
      step.positions.push_back(int32_t(i));
      step.slots.push_back(s.slot);
    }
    s.length = int(prompt.size());
    step.logit_rows.push_back(int32_t(step.tokens.size() - 1));
    finishing.push_back(&s);
  }
  flush();
}

}  // namespace

std::vector<GenResult> generate(Transformer& model, const std::vector<GenRequest>& requests, const GenOptions& options,
                                GenStats* stats) {
  if (requests.empty()) return {};
  const ModelConfig& cfg = model.config();
  std::vector<Sequence> seqs(requests.size());
  int capacity = 1;
  for (size_t i = 0; i < requests.size(); ++i) {
    const GenRequest& r = requests[i];
    Sequence& s = seqs[i];
    s = start_sequence(r, cfg, int(i), i);
    capacity = std::max(capacity, int(r.prompt.size()) + std::max(s.max_new, 0));
  }
  KvCache cache = make_kv_cache(cfg, model.backend(), int(seqs.size()), capacity);
  StepSampler sampler(model.backend(), cfg, seqs.size());

  GenStats local;
  auto t0 = Clock::now();
  prefill(model, seqs, cache, sampler, std::max<int64_t>(options.prefill_token_budget, 1));
  local.prefill_seconds = seconds_since(t0);
  for (const GenRequest& r : requests) local.prompt_tokens += int64_t(r.prompt.size());

  t0 = Clock::now();
  while (true) {
    StepBatch step;
    std::vector<Sequence*> active;
    for (Sequence& s : seqs) {
      if (s.done) continue;
      step.tokens.push_back(s.next_token);
      step.positions.push_back(s.length);
      step.slots.push_back(s.slot);
      step.logit_rows.push_back(int32_t(active.size()));
      active.push_back(&s);
    }
    if (active.empty()) break;
    const Tensor logits = model.forward(step, cache);
    for (Sequence* s : active) ++s->length;
    sampler.sample(logits, active);
    ++local.decode_steps;
  }
  local.decode_seconds = seconds_since(t0);

  std::vector<GenResult> results;
  results.reserve(seqs.size());
  for (Sequence& s : seqs) {
    local.generated_tokens += int64_t(s.result.tokens.size());
    results.push_back(std::move(s.result));
  }
  if (stats) {
    stats->prefill_seconds += local.prefill_seconds;
    stats->decode_seconds += local.decode_seconds;
    stats->prompt_tokens += local.prompt_tokens;
    stats->generated_tokens += local.generated_tokens;
    stats->decode_steps += local.decode_steps;
  }
  return results;
}

}  // namespace strata
