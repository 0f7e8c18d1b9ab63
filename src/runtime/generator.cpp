#include "strata/runtime/generator.h"

#include <algorithm>
#include <chrono>

#include "strata/core/error.h"

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
void prefill(Transformer& model, std::vector<Sequence>& seqs, const std::vector<ChoiceGroup>& groups, KvCache& cache,
             StepSampler& sampler, int64_t budget) {
  StepBatch step;
  std::vector<Sequence*> finishing;  // sequences whose last prompt token is in this step
  auto flush = [&] {
    if (step.tokens.empty()) return;
    const Tensor logits = model.forward(step, cache);
    if (!finishing.empty()) sampler.sample(logits, finishing);
    step = StepBatch();
    finishing.clear();
  };
  for (const ChoiceGroup& g : groups) {
    Sequence& s = seqs[g.first];
    if (s.done) continue;  // max_new 0: every choice of the request is done
    const std::vector<int32_t>& prompt = s.request->prompt;
    for (size_t i = 0; i < prompt.size(); ++i) {
      if (int64_t(step.tokens.size()) >= budget) flush();
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
}

// Copies the prompt's keys and values from each group's first slot to the slots of its other
// choices, every layer, with gather_rows over the cache seen as [slots * capacity, kv_dim] rows.
void share_prompt_cache(Backend& be, const ModelConfig& cfg, std::vector<Sequence>& seqs,
                        const std::vector<ChoiceGroup>& groups, KvCache& cache) {
  std::vector<int32_t> rows;
  for (const ChoiceGroup& g : groups) {
    if (g.n < 2 || seqs[g.first].done) continue;
    const int len = int(seqs[g.first].request->prompt.size());
    rows.resize(size_t(len));
    for (int p = 0; p < len; ++p) rows[size_t(p)] = seqs[g.first].slot * cache.capacity + p;
    Buffer ids_buf = be.alloc(rows.size() * 4);
    const Tensor ids = ids_buf.view(0, DType::I32, {int64_t(len)});
    be.copy_to_device(ids.data, rows.data(), rows.size() * 4);
    const int64_t all_rows = int64_t(cache.slots) * cache.capacity;
    for (size_t c = 1; c < g.n; ++c) {
      const int64_t dst = int64_t(seqs[g.first + c].slot) * cache.capacity;
      for (int l = 0; l < cfg.n_layers; ++l)
        for (const Tensor* t : {&cache.k[size_t(l)], &cache.v[size_t(l)]}) {
          const Tensor flat = t->reshaped({all_rows, int64_t(cfg.kv_dim())});
          be.gather_rows(flat, ids, flat.rows(dst, len));
        }
    }
    be.synchronize();  // ids_buf is released at the end of this iteration
  }
}

}  // namespace

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
  KvCache cache = make_kv_cache(cfg, model.backend(), int(seqs.size()), capacity);
  StepSampler sampler(model.backend(), cfg, seqs.size());

  GenStats local;
  auto t0 = Clock::now();
  prefill(model, seqs, groups, cache, sampler, std::max<int64_t>(options.prefill_token_budget, 1));
  share_prompt_cache(model.backend(), cfg, seqs, groups, cache);
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
