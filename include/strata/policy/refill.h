// Continuous batching in the cost model (issue 37, point 4; docs/cost-model.md "Continuous
// batching"): the throughput of a policy when answers end at different lengths, with blocks that
// wait for their longest answer, and with refill, where a finished slot takes the next request
// and the block runs a steady state of decode steps carrying newcomers' prompts.
#pragma once
#include <string>
#include <vector>

#include "strata/model/config.h"
#include "strata/policy/cost_model.h"
#include "strata/policy/policy.h"
#include "strata/profile/hardware.h"

namespace strata {

// The lengths of a job's answers (generated tokens, the first included): observed ones, or an
// assumed mean with every block reaching the limit.
struct GenLengths {
  std::vector<int> samples;  // one per answer; empty: assumed
  double assumed_mean = 0;   // without samples: the mean answer ...
  int assumed_longest = 0;   // ... and a block's longest (the job's max_new_tokens)

  double mean() const;
  // E[L^2] / E[L]: the length of the answer a slot is in at a random step of the steady state
  // (a long answer holds its slot for more steps), which sets the cache's mean context.
  double slot_weighted_mean() const;
  // E[max of `draws` answers]: a block's decode steps + 1, its longest answer drawn from these.
  double expected_longest(int draws) const;

  // One length per line: an integer, or a JSON line of a finished job's output (strata's format:
  // "completion_tokens", or each of "choices"' "completion_tokens"). Fails naming the file and
  // line of anything else.
  static GenLengths from_file(const std::string& path);
  static GenLengths assumed(double mean, int longest);
};

struct RefillPrediction {
  double mean_len = 0;          // the mean answer
  double block_len = 0;         // a block's expected longest answer
  Prediction blocks;            // a block of the policy generating block_len tokens
  double blocks_tok_s = 0;      // block_size * mean_len / blocks.total_s: the answers' tokens only
  double blocks_occupancy = 0;  // mean_len / block_len: live slots' share of a block's decode steps
  StageTime steady_step;        // one layer of a steady-state step (refill)
  double refill_tok_s = 0;      // block_size tokens per steady-state step
};

// Blocks against refill for `p` at prompt length `prompt_len` and these answer lengths. Refill's
// steady state: every step generates one token per slot, 1 / mean_len of the slots prefilling a
// newcomer's prompt and the rest decoding, the weights read once per step for both.
RefillPrediction predict_refill(const ModelConfig& cfg, const Policy& p, int prompt_len, const GenLengths& lengths,
                                const HardwareProfile& hw);

}  // namespace strata
