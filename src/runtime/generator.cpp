#include "strata/runtime/generator.h"

#include <algorithm>
#include <chrono>
#include <functional>

#include "kv_rows.h"
#include "strata/core/error.h"
#include "strata/runtime/prompt_logprobs.h"

namespace strata {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// A request's choices: seqs[first, first + n). The first one's prompt goes through the model; the
// others copy its cache rows afterwards.
struct ChoiceGroup {
  size_t first = 0, n = 1;
};

// Packs prompt tokens into steps of at most `budget` tokens; a long prompt may span steps, since
// each token attends to whatever of its sequence is already in the cache. The last prompt
// position's logits row is sampled once per choice, each with its own sampler.
//
// A prompt that shares a prefix (plan[i] for groups[i]) computes only the rest: sources go first, and
// the step with its first computed token copies its source's rows once they are stored (PrefixCopy),
// so sharing adds no step. A source that begins with a kept prefix copies that first. Returns the
// prompt tokens copied.
int64_t prefill(Transformer& model, std::vector<Sequence>& seqs, const std::vector<ChoiceGroup>& groups,
                const std::vector<SharedPrefix>& plan, KeptPrefixes* kept, const PrefixSharingOptions& sharing,
                KvCache& cache, StepSampler& sampler, int64_t budget) {
  int64_t copied = 0;
  StepBatch step;
  std::vector<Sequence*> finishing;  // sequences whose last prompt token is in this step
  PromptScorer scorer(model.backend(), model.config().vocab_size);
  auto flush = [&] {
    if (step.tokens.empty()) return;
    const int64_t sampled_rows = int64_t(step.logit_rows.size());
    scorer.append_rows(step);
    const Tensor logits = model.forward(step, cache);
    if (!scorer.empty()) scorer.score(logits.rows(sampled_rows, scorer.rows()));
    if (!finishing.empty()) sampler.sample(logits.rows(0, sampled_rows), finishing);
    step = StepBatch();
    finishing.clear();
  };
  std::vector<size_t> order;  // sources (and unshared prompts), then the sharing ones
  for (int pass = 0; pass < 2; ++pass)
    for (size_t i = 0; i < groups.size(); ++i)
      if ((plan[i].source >= 0) == (pass == 1)) order.push_back(i);
  for (const size_t gi : order) {
    const ChoiceGroup& g = groups[gi];
    Sequence& s = seqs[g.first];
    if (s.done) continue;  // max_new 0: every choice of the request is done
    const std::vector<int32_t>& prompt = s.request->prompt;
    const SharedPrefix& share = plan[gi];
    const bool scored = s.request->prompt_logprobs >= 0;  // computed whole: plan_prefill shares none of it
    const size_t first = share.source >= 0 ? size_t(share.length)
                         : scored          ? 0
                                           : size_t(kv_rows::copy_kept_prefix(model.backend(), kept, prompt, cache, s.slot, sharing));
    copied += int64_t(first);
    for (size_t i = first; i < prompt.size(); ++i) {
      if (int64_t(step.tokens.size()) >= budget || (scored && scorer.rows() >= scorer.max_rows())) flush();
      if (i == first && share.source >= 0)
        step.prefix_copies.push_back({seqs[groups[size_t(share.source)].first].slot, s.slot, share.length});
      if (scored) scorer.add(s, int32_t(step.tokens.size()), int(i), int(i) + 1);
      step.tokens.push_back(prompt[i]);
      step.positions.push_back(int32_t(i));
      step.slots.push_back(s.slot);
    }
    for (size_t c = 0; c < g.n; ++c) {
      seqs[g.first + c].length = int(prompt.size());
      step.logit_rows.push_back(int32_t(step.tokens.size() - 1));
      finishing.push_back(&seqs[g.first + c]);
    }
  }
  flush();
  return copied;
}

// How much of a source's prompt to keep: of the lengths its sharers copied, the one that would have
// given the most tokens (length x sharers that copied at least that much), so one prompt that
// shares only the first words does not cut the kept prefix short for every later batch.
int kept_prefix_length(std::vector<int> lengths) {
  std::sort(lengths.begin(), lengths.end(), std::greater<>());
  int best = 0;
  int64_t best_tokens = 0;
  for (size_t i = 0; i < lengths.size(); ++i)
    if (int64_t(lengths[i]) * int64_t(i + 1) > best_tokens) {
      best_tokens = int64_t(lengths[i]) * int64_t(i + 1);
      best = lengths[i];
    }
  return best;
}

// After prefill: keeps a prefix of the source whose prompt the most tokens of this batch copied
// (kept_prefix_length) as the most recently used, unless nothing was shared. Without memory for
// it, later batches compute their own.
void keep_prefix(Backend& be, const ModelConfig& cfg, const std::vector<Sequence>& seqs,
                 const std::vector<ChoiceGroup>& groups, const std::vector<SharedPrefix>& plan, const KvCache& cache,
                 KeptPrefixes& kept) {
  std::vector<int64_t> shared(groups.size(), 0);
  std::vector<std::vector<int>> lengths(groups.size());
  for (const SharedPrefix& s : plan) {
    if (s.source < 0) continue;
    shared[size_t(s.source)] += s.length;
    lengths[size_t(s.source)].push_back(s.length);
  }
  if (shared.empty()) return;
  const size_t best = size_t(std::max_element(shared.begin(), shared.end()) - shared.begin());
  if (shared[best] == 0) return;
  const std::vector<int32_t>& prompt = seqs[groups[best].first].request->prompt;
  std::vector<int32_t> tokens(prompt.begin(), prompt.begin() + kept_prefix_length(lengths[best]));
  kv_rows::keep(be, cfg, std::move(tokens), cache, seqs[groups[best].first].slot, kept);
}

// Copies the prompt's keys and values from each group's first slot to the slots of its other
// choices.
void share_prompt_cache(Backend& be, std::vector<Sequence>& seqs, const std::vector<ChoiceGroup>& groups,
                        const KvCache& cache) {
  for (const ChoiceGroup& g : groups) {
    if (g.n < 2 || seqs[g.first].done) continue;
    for (size_t c = 1; c < g.n; ++c)
      kv_rows::copy_prefix(be, cache, seqs[g.first].slot, cache, seqs[g.first + c].slot,
                        int(seqs[g.first].request->prompt.size()));
  }
}

// The prefix-sharing plan over the requests that prefill (none when sharing is off).
std::vector<SharedPrefix> plan_prefill(const std::vector<Sequence>& seqs, const std::vector<ChoiceGroup>& groups,
                                       const GenOptions& options) {
  std::vector<const std::vector<int32_t>*> prompts(groups.size(), nullptr);
  for (size_t i = 0; i < groups.size() && options.share_prefixes; ++i)
    if (const Sequence& s = seqs[groups[i].first]; !s.done && s.request->prompt_logprobs < 0) prompts[i] = &s.request->prompt;
  return plan_shared_prefixes(prompts, options.prefix_sharing);
}

// The batch's cache; where the device is out of memory for it, the kept prefixes give their memory
// back first (the batch then computes its own), so keeping them never fails a job that fits without.
KvCache make_batch_cache(Backend& be, const ModelConfig& cfg, int slots, int capacity, KeptPrefixes* kept) {
  try {
    return make_kv_cache(cfg, be, slots, capacity);
  } catch (const Error&) {
    if (!kept || kept->entries.empty()) throw;
    kept->entries.clear();
  }
  return make_kv_cache(cfg, be, slots, capacity);
}

}  // namespace

void GenStats::add(const GenStats& o) {
  prefill_seconds += o.prefill_seconds;
  decode_seconds += o.decode_seconds;
  prompt_tokens += o.prompt_tokens;
  generated_tokens += o.generated_tokens;
  decode_steps += o.decode_steps;
  shared_prompt_tokens += o.shared_prompt_tokens;
  decode_slot_steps += o.decode_slot_steps;
  live_slot_steps += o.live_slot_steps;
  routing.layer_steps += o.routing.layer_steps;
  routing.tokens += o.routing.tokens;
  routing.active_experts += o.routing.active_experts;
}

std::vector<GenResult> generate(Transformer& model, const std::vector<GenRequest>& requests, const GenOptions& options,
                                GenStats* stats) {
  if (requests.empty()) return {};
  const ModelConfig& cfg = model.config();
  std::vector<Sequence> seqs(count_choices(requests));
  std::vector<ChoiceGroup> groups;
  int capacity = 1;
  for (size_t i = 0; i < requests.size(); ++i)
    if (requests[i].n < 1) STRATA_FAIL("request " << i << ": n must be at least 1, got " << requests[i].n);
  for (size_t i = 0, slot = 0; i < requests.size(); ++i) {
    const GenRequest& r = requests[i];
    groups.push_back({slot, size_t(r.n)});
    for (int c = 0; c < r.n; ++c, ++slot) {
      Sequence& s = seqs[slot];
      s = start_sequence(r, cfg, int(slot), i, c);
      capacity = std::max(capacity, int(r.prompt.size()) + std::max(s.max_new, 0));
    }
  }
  KvCache cache = make_batch_cache(model.backend(), cfg, int(seqs.size()), capacity, options.kept_prefixes);
  StepSampler sampler(model.backend(), cfg, seqs.size());

  GenStats local;
  const RoutingTotals routed_before = model.routing_totals();
  auto t0 = Clock::now();
  const std::vector<SharedPrefix> plan = plan_prefill(seqs, groups, options);
  KeptPrefixes* kept = options.share_prefixes ? options.kept_prefixes : nullptr;
  local.shared_prompt_tokens = prefill(model, seqs, groups, plan, kept, options.prefix_sharing, cache, sampler,
                                       std::max<int64_t>(options.prefill_token_budget, 1));
  share_prompt_cache(model.backend(), seqs, groups, cache);
  if (kept) keep_prefix(model.backend(), cfg, seqs, groups, plan, cache, *kept);
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
    local.decode_slot_steps += int64_t(seqs.size());
    local.live_slot_steps += int64_t(active.size());
  }
  local.decode_seconds = seconds_since(t0);

  for (const ChoiceGroup& g : groups)  // the first choice scored the prompt for all
    for (size_t c = 1; c < g.n && seqs[g.first].request->prompt_logprobs >= 0; ++c)
      seqs[g.first + c].result.prompt_logprobs = seqs[g.first].result.prompt_logprobs;
  std::vector<GenResult> results;
  results.reserve(seqs.size());
  for (Sequence& s : seqs) {
    local.generated_tokens += int64_t(s.result.tokens.size());
    results.push_back(std::move(s.result));
  }
  local.routing = model.routing_totals() - routed_before;
  if (stats) stats->add(local);
  return results;
}

}  // namespace strata
