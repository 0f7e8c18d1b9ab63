// One sequence's generation state, and the sampling of a step's logit rows into next tokens.
// Shared by the resident generator and the offloading engine, so both stop, sample and count
// exactly alike.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "strata/backend/backend.h"
#include "strata/model/config.h"
#include "strata/runtime/sampler.h"

namespace strata {

// Says whether a sequence is to end after the tokens it has generated so far (stop strings: the
// job detokenizes and matches, so this module needs no tokenizer). Called after every sampled
// token; it must not keep state, since one request's n choices share it.
using StopCheck = std::function<bool(std::span<const int32_t> generated)>;

struct GenRequest {
  std::vector<int32_t> prompt;  // token ids, non-empty
  SamplingParams sampling;
  // >= 0: also score the prompt (GenResult::prompt_logprobs) with this many top tokens a position.
  // Its prompt is computed whole, never copied from a shared prefix (whose rows have no logits).
  int prompt_logprobs = -1;
  // Choices: n sequences continue the prompt, choice c sampling with seed sampling.seed + c. The
  // resident generator prefills the prompt once for all of them; the offloading engine once per
  // GPU batch its choices fall in (it keeps them in one batch where they fit). Results come one
  // per choice, in request order, then choice order.
  int n = 1;
  int logprobs = -1;            // >= 0: record GenResult::logprobs with this many top tokens
  StopCheck stop;               // empty: none
  // Non-null: each choice is one document of this grammar (answer_grammar.h: a JSON object or
  // array, a JSON schema's), drawn only among the tokens it allows, and ends (finish Stop) where
  // the document does.
  std::shared_ptr<const AnswerGrammar> grammar;
};

// Eos: an EOS token; Stop: the request's StopCheck, one of its stop_token_ids or the end of a
// grammar's document; Length: max_new_tokens or the context.
enum class FinishReason : uint8_t { Eos, Length, Stop };
const char* finish_reason_name(FinishReason r);

struct GenResult {
  std::vector<int32_t> tokens;  // generated ids (EOS included when it ended the sequence)
  FinishReason finish = FinishReason::Length;
  // With prompt_logprobs >= 0: entry t is prompt[t + 1]'s log-probability after prompt[0..t] (its
  // rank and the top tokens), t = 0 .. prompt size - 2. Every choice of a request carries it.
  std::vector<StepLogprobs> prompt_logprobs;
  // With logprobs >= 0: one entry per generated token (tokens[i]), from the raw logits.
  std::vector<StepLogprobs> logprobs;
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

// Validates a request against the config (non-empty prompt that leaves room in the context, n >= 1)
// and sets up the sequence of its choice `choice` (sampling seed + choice); `index` names the
// request in errors.
Sequence start_sequence(const GenRequest& request, const ModelConfig& cfg, int slot, size_t index, int choice = 0);

// The sequences (choices) of all requests: sum of their n.
size_t count_choices(const std::vector<GenRequest>& requests);

class StepSampler {
public:
  StepSampler(Backend& backend, const ModelConfig& cfg, size_t max_rows);

  // Samples one token per sequence from the rows of `logits` (row i belongs to seqs[i]) and
  // updates their state (EOS, stop check, length limit). When every row is greedy over its raw
  // logits (no penalty or bias), the argmax runs on the backend and only the ids cross to the
  // host, unless a row asks for logprobs. A greedy row held to a grammar counts as one: its
  // argmax stands where the grammar allows it, and only otherwise does its row cross to be masked. Logprobs are always of the raw logits. Rows sampled or
  // scored on the host run on a pool of host threads when the step is large.
  // On a backend that samples on the device (the GPU), sampled rows and logprobs copy each row's
  // candidates (row_candidates.h: its largest logits and its sums), not its logits, and only the
  // rows those cannot decide copy their logits.
  void sample(const Tensor& logits, const std::vector<Sequence*>& seqs);

  // Candidates a row brings to the host: a draw of a model's distribution at temperature 1 almost
  // always lands among its top 1024 tokens, and these are 8 KiB against a 128k vocabulary's 512.
  static constexpr int64_t kCandidates = kMaxRowCandidates;

private:
  void sample_from_candidates(const Tensor& logits, const std::vector<Sequence*>& seqs);
  void sample_full_rows(const Tensor& logits, const std::vector<Sequence*>& seqs);
  // Each sequence takes its token, and ends at EOS, a stop or its length.
  void finish(const std::vector<Sequence*>& seqs);

  Backend& backend_;
  const ModelConfig& cfg_;
  size_t max_rows_ = 0;
  Buffer device_buf_;  // the argmax's ids, the rows' temperatures, their candidates
  std::vector<int32_t> picks_;
  std::vector<char> decided_;      // picks_[r] holds row r's token
  std::vector<int64_t> full_rows_;  // rows whose logits come to the host
  std::vector<float> temperatures_;
  std::vector<uint8_t> host_candidates_;
  std::vector<float> host_logits_;  // the step's logits, or full_rows_' in their order
  std::vector<StepLogprobs> row_logprobs_;
};

}  // namespace strata
