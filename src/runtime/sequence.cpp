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
  if (room < 0 || (room == 0 && r.prompt_logprobs < 0))
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
  if (r.prompt_logprobs >= 0 && sp.max_new_tokens < 1)
    STRATA_FAIL("request " << index << ": scoring the prompt needs max_new_tokens >= 1 (its last row samples one)");
  if (sp.min_tokens < 0) STRATA_FAIL("request " << index << ": min_tokens must be >= 0, got " << sp.min_tokens);
  Sequence s;
  s.request = &r;
  s.slot = slot;
  SamplingParams p = r.sampling;
  p.seed += uint64_t(choice);  // wraps: every choice its own stream
  std::vector<int32_t> ends = p.stop_token_ids;
  if (!p.ignore_eos) ends.insert(ends.end(), cfg.eos_ids.begin(), cfg.eos_ids.end());
  s.sampler = Sampler(p, std::move(ends), r.grammar.get());
  s.max_new = std::min(r.sampling.max_new_tokens, std::max(room, r.prompt_logprobs >= 0 ? 1 : 0));
  s.done = s.max_new <= 0;
  if (r.prompt_logprobs >= 0) s.result.prompt_logprobs.resize(r.prompt.size() - 1);  // filled by position
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
  // One allocation (the engine makes a StepSampler per block, and a CUDA free waits for the
  // device): the argmax's ids, then where the device samples the temperatures and, 8-aligned, the
  // candidates.
  max_rows_ = std::max<size_t>(max_rows, 1);
  const bool on_device = backend.samples_on_device();
  device_buf_ = backend.alloc(max_rows_ * 8 + (on_device ? max_rows_ * row_candidates_bytes(kCandidates) : 0));
}

namespace {

// A row the backend's argmax serves: greedy over its raw logits.
bool plain_greedy(const Sequence* s) {
  return s->request->sampling.greedy() && !s->sampler.adjusts(s->result.tokens.size());
}

// Or may serve: a greedy JSON answer takes the argmax wherever its grammar allows it (most
// steps), and only the other steps copy its row to the host to be masked.
bool argmax_may_serve(const Sequence* s) {
  return plain_greedy(s) || s->sampler.greedy_held(s->result.tokens.size());
}

}  // namespace

void StepSampler::sample(const Tensor& logits, const std::vector<Sequence*>& seqs) {
  const int64_t R = int64_t(seqs.size());
  picks_.resize(size_t(R));
  row_logprobs_.resize(size_t(R));
  const bool all_argmax = std::all_of(seqs.begin(), seqs.end(), argmax_may_serve);
  const bool any_argmax = std::any_of(seqs.begin(), seqs.end(), argmax_may_serve);
  const bool any_logprobs =
      std::any_of(seqs.begin(), seqs.end(), [](const Sequence* s) { return s->request->logprobs >= 0; });
  const bool on_device = backend_.samples_on_device();
  // Greedy rows take the backend's argmax whether or not logprobs are asked for, so asking
  // never changes the tokens. On the host a mixed step's greedy rows take the host's (the same).
  decided_.assign(size_t(R), 0);
  if (all_argmax || (on_device && any_argmax)) {
    Tensor ids = device_buf_.view(0, DType::I32, {R});
    backend_.argmax_rows(logits, ids);
    backend_.copy_to_host(picks_.data(), ids.data, size_t(R) * 4);
    for (int64_t r = 0; r < R; ++r) {
      Sequence& s = *seqs[size_t(r)];
      decided_[size_t(r)] = plain_greedy(&s) || s.sampler.take_argmax(picks_[size_t(r)], s.result.tokens.size());
    }
  }
  const bool all_decided = std::all_of(decided_.begin(), decided_.end(), [](char d) { return d != 0; });
  // Rows the candidates may serve: unadjusted sampled rows and any asking for logprobs.
  const bool candidates_serve = std::any_of(seqs.begin(), seqs.end(), [](const Sequence* s) {
    const bool sampled = !s->request->sampling.greedy() && !s->sampler.adjusts(s->result.tokens.size());
    return sampled || s->request->logprobs >= 0;
  });
  full_rows_.clear();
  if (!all_decided || any_logprobs) {
    if (on_device && candidates_serve) {
      sample_from_candidates(logits, seqs);
    } else {
      for (int64_t r = 0; r < R; ++r)
        if (!decided_[size_t(r)] || seqs[size_t(r)]->request->logprobs >= 0) full_rows_.push_back(r);
    }
  }
  if (!full_rows_.empty()) sample_full_rows(logits, seqs);
  finish(seqs);
}

void StepSampler::sample_from_candidates(const Tensor& logits, const std::vector<Sequence*>& seqs) {
  const int64_t R = int64_t(seqs.size()), V = logits.row_size();
  temperatures_.resize(size_t(R));
  for (int64_t r = 0; r < R; ++r) temperatures_[size_t(r)] = seqs[size_t(r)]->request->sampling.temperature;
  const Tensor temperatures = device_buf_.view(max_rows_ * 4, DType::F32, {R});
  void* candidates = static_cast<char*>(device_buf_.data()) + max_rows_ * 8;
  backend_.upload(temperatures.data, temperatures_.data(), size_t(R) * 4);  // no wait: ordered before the kernel
  backend_.row_candidates(logits, temperatures, kCandidates, candidates);
  host_candidates_.resize(size_t(R) * row_candidates_bytes(kCandidates));
  backend_.copy_to_host(host_candidates_.data(), candidates, host_candidates_.size());
  for (int64_t r = 0; r < R; ++r) {
    Sequence& s = *seqs[size_t(r)];
    const RowCandidates c = read_row_candidates(host_candidates_.data(), r, kCandidates, V);
    bool full_row = false;
    if (!decided_[size_t(r)]) {
      const std::optional<int32_t> token = s.sampler.sample(c, s.result.tokens.size());
      full_row = !token;
      if (token) picks_[size_t(r)] = *token, decided_[size_t(r)] = 1;
    }
    if (!full_row && s.request->logprobs >= 0) {
      std::optional<StepLogprobs> lp = step_logprobs(c, picks_[size_t(r)], s.request->logprobs);
      full_row = !lp;
      if (lp) row_logprobs_[size_t(r)] = std::move(*lp);
    }
    if (full_row) full_rows_.push_back(r);
  }
}

void StepSampler::sample_full_rows(const Tensor& logits, const std::vector<Sequence*>& seqs) {
  const int64_t R = int64_t(seqs.size()), F = int64_t(full_rows_.size()), V = logits.row_size();
  // A few rows are copied one by one (each copy waits for the device); past a quarter of the
  // step, one copy of all of them costs less than their waits.
  const bool whole = F * 4 > R;
  host_logits_.resize(size_t((whole ? R : F) * V));
  if (whole) {
    backend_.copy_to_host_f32(logits, host_logits_.data());
  } else {
    for (int64_t i = 0; i < F; ++i)
      backend_.copy_to_host_f32(logits.rows(full_rows_[size_t(i)], 1), host_logits_.data() + i * V);
  }
  // Each row's draw and logprobs read only its own logits and sequence, so rows go in parallel
  // and the tokens do not depend on the threads.
  on_host_rows(F * V, F, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t r = full_rows_[size_t(i)];
      Sequence& s = *seqs[size_t(r)];
      const float* row = host_logits_.data() + (whole ? r : i) * V;
      if (!decided_[size_t(r)]) picks_[size_t(r)] = s.sampler.sample(row, V, s.request->prompt, s.result.tokens);
      if (s.request->logprobs >= 0)
        row_logprobs_[size_t(r)] = step_logprobs(row, V, picks_[size_t(r)], s.request->logprobs);
    }
  });
}

void StepSampler::finish(const std::vector<Sequence*>& seqs) {
  const int64_t R = int64_t(seqs.size());
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
    } else if (std::find(stop_ids.begin(), stop_ids.end(), tok) != stop_ids.end() || s.sampler.answer_complete()) {
      s.done = true;
      s.result.finish = FinishReason::Stop;
    } else if (s.request->stop && s.result.tokens.size() >= size_t(std::max(s.request->sampling.min_tokens, 0)) &&
               s.request->stop(s.result.tokens)) {  // min_tokens holds stop strings back too (vLLM)
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
