// Helpers shared by the model tests.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "strata/backend/backend.h"
#include "strata/model/model_loader.h"
#include "strata/runtime/generator.h"
#include "strata/runtime/model_weights.h"
#include "strata/runtime/transformer.h"
#include "worst_error.h"

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

// The last logits of each prompt of a tiny model's expected.json (tests/fixtures/models/
// make_models.py) run alone. fp32 on both sides: differences come from summation order only, and
// the fixture stores 6 significant digits, so 2e-5 absolute plus 1e-5 relative to the largest logit.
inline void check_hf_last_logits(Transformer& model, const nlohmann::json& exp) {
  for (size_t p = 0; p < exp["prompts"].size(); ++p) {
    const std::vector<int32_t> prompt = exp["prompts"][p].get<std::vector<int32_t>>();
    const std::vector<float> got = last_logits(model, prompt);
    const std::vector<float> want = exp["last_logits"][p].get<std::vector<float>>();
    REQUIRE(got.size() == want.size());
    float scale = 0, worst = 0;
    for (float w : want) scale = std::max(scale, std::fabs(w));
    for (size_t i = 0; i < got.size(); ++i) worst = worst_of(worst, std::fabs(got[i] - want[i]));
    INFO("prompt " << p << " (" << prompt.size() << " tokens): max |diff| " << worst << ", max |logit| " << scale);
    CHECK(worst <= 2e-5f + 1e-5f * scale);
  }
}

// A fixture's prompts (expected.json), each asking for its max_new_tokens.
inline std::vector<GenRequest> fixture_requests(const nlohmann::json& exp) {
  std::vector<GenRequest> reqs;
  for (const nlohmann::json& p : exp["prompts"]) {
    GenRequest r;
    r.prompt = p.get<std::vector<int32_t>>();
    r.sampling.max_new_tokens = exp["max_new_tokens"].get<int>();
    reqs.push_back(r);
  }
  return reqs;
}

// Its greedy tokens, all prompts generated in one batch.
inline void check_hf_greedy(Transformer& model, const nlohmann::json& exp) {
  const std::vector<GenRequest> reqs = fixture_requests(exp);
  const std::vector<GenResult> got = generate(model, reqs, GenOptions{});
  for (size_t i = 0; i < reqs.size(); ++i) {
    INFO("prompt " << i);
    CHECK(got[i].tokens == exp["greedy"][i].get<std::vector<int32_t>>());
  }
}

// Both checks above for a model loaded on the CPU backend.
inline void check_hf_outputs(const ModelBundle& b, const nlohmann::json& exp) {
  auto backend = make_cpu_backend(2);
  Transformer model(b.config, load_model_weights(b.config, *b.weights, *backend), *backend);
  check_hf_last_logits(model, exp);
  check_hf_greedy(model, exp);
}

}  // namespace strata::test
