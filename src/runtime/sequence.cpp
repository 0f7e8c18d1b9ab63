#include "strata/runtime/sequence.h"

#include <algorithm>
#include <functional>
#include <mutex>
#include <thread>

#include "strata/core/error.h"
#include "strata/core/thread_pool.h"

namespace strata {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Eos: return "eos";
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: break;
  }
  return "length";
}

size_t count_choices(const std::vector<GenRequest>& requests) {
  size_t n = 0;
  for (const GenRequest& r : requests) n += size_t(std::max(r.n, 0));
  return n;
}

Sequence start_sequence(const GenRequest& r, const ModelConfig& cfg, int slot, size_t index, int choice) {
  if (r.prompt.empty()) STRATA_FAIL("request " << index << ": empty prompt (no tokens)");
  if (r.n < 1) STRATA_FAIL("request " << index << ": n must be at least 1, got " << r.n);
  // Prompt + generation stay within the context, as Hugging Face's max_length. A prompt scored
  // whole may fill it: its one sampled token is never fed back, so it needs no position.
  const int room = cfg.max_positions - int(r.prompt.size());
  if (room < 0 || (room == 0 && !r.score_prompt))
    STRATA_FAIL("request " << index << ": prompt of " << r.prompt.size() << " tokens fills the model's context of "
                           << cfg.max_positions);
  const SamplingParams& sp = r.sampling;
  if (!(sp.repetition_penalty > 0.0f) || !(sp.min_p >= 0.0f && sp.min_p <= 1.0f))
    STRATA_FAIL("request " << index << ": repetition_penalty must be > 0 and min_p in [0, 1], got "
                           << sp.repetition_penalty << " and " << sp.min_p);
  for (const auto& [token, bias] : sp.logit_bias)
    if (token < 0 || token >= cfg.vocab_size)
      STRATA_FAIL("request " << index << ": logit_bias token " << token << " is outside the model's vocabulary of "
                             << cfg.vocab_size);
  for (int32_t token : sp.stop_token_ids)
    if (token < 0 || token >= cfg.vocab_size)
      STRATA_FAIL("request " << index << ": stop_token_ids token " << token << " is outside the model's vocabulary of "
                             << cfg.vocab_size);
  if (sp.min_tokens < 0) STRATA_FAIL("request " << index << ": min_tokens must be >= 0, got " << sp.min_tokens);
  Sequence s;
  s.request = &r;
  s.slot = slot;
  SamplingParams p = r.sampling;
  p.seed += uint64_t(choice);  // wraps: every choice its own stream
  std::vector<int32_t> ends = p.stop_token_ids;
  if (!p.ignore_eos) ends.insert(ends.end(), cfg.eos_ids.begin(), cfg.eos_ids.end());
  s.sampler = Sampler(p, std::move(ends));
  s.max_new = std::min(r.sampling.max_new_tokens, std::max(room, r.score_prompt ? 1 : 0));
  s.done = s.max_new <= 0;
  return s;
}

namespace {

// The host's sampling rows: a row of a 128k vocabulary drawn with temperature, or its logprobs,
// costs about a millisecond of one thread (bench/bench_sampling.cpp), so a batch of 64 on one
// thread would outlast a resident model's decode step. One pool for the process, made on first
// use; a second StepSampler sampling at the same moment (none does today) runs its rows alone.
// Small steps stay on the calling thread, where the pool's wake-up would cost more.
void on_host_rows(int64_t elements, int64_t rows, const std::function<void(int64_t, int64_t)>& fn) {
  constexpr int64_t kParallelElements = int64_t(1) << 18;
  static std::mutex busy;
  std::unique_lock<std::mutex> lock(busy, std::defer_lock);
  if (rows < 2 || elements < kParallelElements || !lock.try_lock()) return fn(0, rows);
  static ThreadPool pool(int(std::clamp(std::thread::hardware_concurrency(), 1u, 16u)));
  pool.parallel_for(rows, fn);
}

}  // namespace

StepSampler::StepSampler(Backend& backend, const ModelConfig& cfg, size_t max_rows) : backend_(backend), cfg_(cfg) {
  argmax_buf_ = backend.alloc(std::max<size_t>(max_rows, 1) * 4);
}

void StepSampler::sample(const Tensor& logits, const std::vector<Sequence*>& seqs) {
  const int64_t R = int64_t(seqs.size()), V = logits.row_size();
  picks_.resize(size_t(R));
  // A row whose logits are adjusted (penalties, bias, ends held back) is sampled on the host even
  // when greedy.
  const bool all_greedy = std::all_of(seqs.begin(), seqs.end(), [](const Sequence* s) {
    return s->request->sampling.greedy() && !s->sampler.adjusts(s->result.tokens.size());
  });
  const bool any_logprobs =
      std::any_of(seqs.begin(), seqs.end(), [](const Sequence* s) { return s->request->logprobs >= 0; });
  // Greedy rows take the backend's argmax whether or not logprobs are asked for, so asking
  // never changes the tokens.
  if (all_greedy) {
    Tensor ids = argmax_buf_.view(0, DType::I32, {R});
    backend_.argmax_rows(logits, ids);
    backend_.copy_to_host(picks_.data(), ids.data, size_t(R) * 4);
  }
  if (!all_greedy || any_logprobs) {
    host_logits_.resize(size_t(R * V));
    backend_.copy_to_host_f32(logits, host_logits_.data());
    // Each row's draw and logprobs read only its own logits and sequence, so rows go in parallel
    // and the tokens do not depend on the threads.
    row_logprobs_.resize(size_t(R));
    on_host_rows(R * V, R, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        Sequence& s = *seqs[size_t(r)];
        const float* row = host_logits_.data() + r * V;
        if (!all_greedy) picks_[size_t(r)] = s.sampler.sample(row, V, s.request->prompt, s.result.tokens);
        if (s.request->logprobs >= 0)
          row_logprobs_[size_t(r)] = step_logprobs(row, V, picks_[size_t(r)], s.request->logprobs);
      }
    });
  }
  for (int64_t r = 0; r < R; ++r) {
    Sequence& s = *seqs[size_t(r)];
    const int32_t tok = picks_[size_t(r)];
    s.result.tokens.push_back(tok);
    if (s.request->logprobs >= 0) s.result.logprobs.push_back(std::move(row_logprobs_[size_t(r)]));
    const bool is_eos = std::find(cfg_.eos_ids.begin(), cfg_.eos_ids.end(), tok) != cfg_.eos_ids.end();
    const std::vector<int32_t>& stop_ids = s.request->sampling.stop_token_ids;
    if (is_eos && !s.request->sampling.ignore_eos) {
      s.done = true;
      s.result.finish = FinishReason::Eos;
    } else if (std::find(stop_ids.begin(), stop_ids.end(), tok) != stop_ids.end()) {
      s.done = true;
      s.result.finish = FinishReason::Stop;
    } else if (s.request->stop && s.request->stop(s.result.tokens)) {
      s.done = true;
      s.result.finish = FinishReason::Stop;
    } else if (int(s.result.tokens.size()) >= s.max_new) {
      s.done = true;
      s.result.finish = FinishReason::Length;
    } else {
      s.next_token = tok;
    }
  }
}

}  // namespace strata
