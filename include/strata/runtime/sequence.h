// One sequence's generation state, and the sampling of a step's logit rows into next tokens.
// Shared by the resident generator and the offloading engine, so both stop, sample and count
// exactly alike.
#pragma once
#include <cstdint>
#include <vector>

#include "strata/backend/backend.h"
#include "strata/model/config.h"
#include "strata/runtime/sampler.h"

namespace strata {

struct GenRequest {
  std::vector<int32_t> prompt;  // token ids, non-empty
  SamplingParams sampling;
  bool score_prompt = false;    // also score the prompt: GenResult::prompt_nll (offloading engine)
};

enum class FinishReason : uint8_t { Eos, Length };
const char* finish_reason_name(FinishReason r);

struct GenResult {
  std::vector<int32_t> tokens;  // generated ids (EOS included when it ended the sequence)
  FinishReason finish = FinishReason::Length;
  // With score_prompt: -log p(prompt[t + 1] | prompt[0..t]) for t = 0 .. prompt size - 2.
  std::vector<double> prompt_nll;
};

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

// Validates a request against the config (non-empty prompt that leaves room in the context) and
// sets up its sequence; `index` names the request in errors.
Sequence start_sequence(const GenRequest& request, const ModelConfig& cfg, int slot, size_t index);

class StepSampler {
public:
  StepSampler(Backend& backend, const ModelConfig& cfg, size_t max_rows);

  // Samples one token per sequence from the rows of `logits` (row i belongs to seqs[i]) and
  // updates their state (EOS, length limit). When every row is greedy, the argmax runs on the
  // backend and only the ids cross to the host.
  void sample(const Tensor& logits, const std::vector<Sequence*>& seqs);

private:
  Backend& backend_;
  const ModelConfig& cfg_;
  Buffer argmax_buf_;
  std::vector<int32_t> picks_;
  std::vector<float> host_logits_;
};

}  // namespace strata
