// Helpers shared by the model tests.
#pragma once
#include <vector>

#include "strata/runtime/transformer.h"

namespace strata::test {

// Runs one prompt alone through the model and returns its last-position logits as float32.
inline std::vector<float> last_logits(Transformer& model, const std::vector<int32_t>& prompt) {
  Backend& be = model.backend();
  KvCache cache = make_kv_cache(model.config(), be, 1, int(prompt.size()));
  StepBatch step;
  step.tokens = prompt;
  for (size_t i = 0; i < prompt.size(); ++i) {
    step.positions.push_back(int32_t(i));
    step.slots.push_back(0);
  }
  step.logit_rows = {int32_t(prompt.size() - 1)};
  const Tensor logits = model.forward(step, cache);
  std::vector<float> out(size_t(logits.numel()));
  be.copy_to_host_f32(logits, out.data());
  return out;
}

}  // namespace strata::test
