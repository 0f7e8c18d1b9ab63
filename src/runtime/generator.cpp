#include "strata/runtime/generator.h"

#include <algorithm>
#include <chrono>

#include "strata/core/error.h"

namespace strata {

const char* finish_reason_name(FinishReason r) { return r == FinishReason::Eos ? "eos" : "length"; }

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Sequence {
  const GenRequest* request = nullptr;
  int slot = 0;
  int length = 0;          // tokens already in the KV cache
  int max_new = 0;
  int32_t next_token = 0;  // sampled, not yet in the cache
  bool done = false;
  Sampler sampler{SamplingParams{}};
  GenResult result;
};

class StepSampler {
public:
  StepSampler(Transformer& model, size_t max_rows) : model_(model) {
    argmax_buf_ = model.backend().alloc(std::max<size_t>(max_rows, 1) * 4);
  }

  // Samples one token per sequence from the rows of `logits` (row i belongs to seqs[i]). When every
  // row is greedy, the argmax runs on the backend and only the ids cross to the host.
  void sample(const Tensor& logits, const std::vector<Sequence*>& seqs) {
    Backend& be = model_.backend();
    const int64_t R = int64_t(seqs.size()), V = logits.row_size();
    picks_.resize(size_t(R));
    const bool all_greedy =
        std::all_of(seqs.begin(), seqs.end(), [](const Sequence* s) { return s->request->sampling.greedy(); });
    if (all_greedy) {
      Tensor ids = argmax_buf_.view(0, DType::I32, {R});
      be.argmax_rows(logits, ids);
      be.copy_to_host(picks_.data(), ids.data, size_t(R) * 4);
    } else {
      host_logits_.resize(size_t(R * V));
      be.copy_to_host_f32(logits, host_logits_.data());
      for (int64_t r = 0; r < R; ++r) picks_[size_t(r)] = seqs[size_t(r)]->sampler.sample(host_logits_.data() + r * V, V);
    }
    const ModelConfig& cfg = model_.config();
    for (int64_t r = 0; r < R; ++r) {
      Sequence& s = *seqs[size_t(r)];
      const int32_t tok = picks_[size_t(r)];
      s.result.tokens.push_back(tok);
      const bool is_eos = std::find(cfg.eos_ids.begin(), cfg.eos_ids.end(), tok) != cfg.eos_ids.end();
      if (is_eos && !s.request->sampling.ignore_eos) {
        s.done = true;
        s.result.finish = FinishReason::Eos;
      } else if (int(s.result.tokens.size()) >= s.max_new) {
        s.done = true;
        s.result.finish = FinishReason::Length;
      } else {
        s.next_token = tok;
      }
    }
  }

private:
  Transformer& model_;
  Buffer argmax_buf_;
  std::vector<int32_t> picks_;
  std::vector<float> host_logits_;
};

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
    if (r.prompt.empty()) STRATA_FAIL("request " << i << ": empty prompt (no tokens)");
    if (int(r.prompt.size()) >= cfg.max_positions)
      STRATA_FAIL("request " << i << ": prompt of " << r.prompt.size() << " tokens fills the model's context of "
                             << cfg.max_positions);
    Sequence& s = seqs[i];
    s.request = &r;
    s.slot = int(i);
    s.sampler = Sampler(r.sampling);
    s.max_new = std::min(r.sampling.max_new_tokens, cfg.max_positions - int(r.prompt.size()));
    s.done = s.max_new <= 0;
    capacity = std::max(capacity, int(r.prompt.size()) + std::max(s.max_new, 0));
  }
  KvCache cache = make_kv_cache(cfg, model.backend(), int(seqs.size()), capacity);
  StepSampler sampler(model, seqs.size());

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
