// Runs a fixture's prompts through the offloading engine (the compressed-weights tests of GGUF and
// GPTQ checkpoints): greedy tokens, each prompt's NLLs, and the engine's report.
#pragma once
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "policy_fixtures.h"
#include "strata/backend/backend.h"
#include "strata/model/model_loader.h"
#include "strata/offload/engine.h"
#include "temp_files.h"
#include "worst_error.h"

namespace strata::test {

// The weights-only compressed policy the model tests run: weights on the CPU tier, so they cross
// cpu->gpu as codes, everything else on the "GPU".
inline Policy compressed_weights_policy(int bits, int group_size) {
  Policy p = policy_of(2, 2, {0, 100, 0}, {100, 0, 0}, {100, 0, 0});
  p.compress_weights = Compression{bits, group_size};
  return p;
}

struct EngineRun {
  std::vector<GenResult> results;
  OffloadReport report;
};

// The fixture's prompts ("prompts", "max_new_tokens"), greedy, with their prompt NLLs.
inline EngineRun run_engine(const ModelBundle& model, const nlohmann::json& exp, const Policy& policy,
                            Backend& backend) {
  std::vector<GenRequest> reqs;
  PlanShape shape;
  for (const nlohmann::json& p : exp["prompts"]) {
    GenRequest r;
    r.prompt = p.get<std::vector<int32_t>>();
    r.sampling.max_new_tokens = exp["max_new_tokens"].get<int>();
    r.prompt_logprobs = 0;
    shape.prompt_len = std::max(shape.prompt_len, int(r.prompt.size()));
    reqs.push_back(r);
  }
  shape.gen_len = exp["max_new_tokens"].get<int>();
  OffloadOptions opt;
  opt.policy = policy;
  opt.offload_dir = temp_dir("engine_run");
  OffloadEngine engine(model.config, *model.weights, backend, opt, shape);
  EngineRun run;
  for (size_t b = 0; b < reqs.size(); b += size_t(engine.block_size())) {
    const std::vector<GenRequest> block(reqs.begin() + long(b),
                                        reqs.begin() + long(std::min(reqs.size(), b + size_t(engine.block_size()))));
    for (GenResult& r : engine.generate(block)) run.results.push_back(std::move(r));
  }
  run.report = engine.report();
  return run;
}

inline EngineRun run_engine(const ModelBundle& model, const nlohmann::json& exp, const Policy& policy) {
  auto backend = make_cpu_backend(2);
  return run_engine(model, exp, policy, *backend);
}

// A result's prompt NLLs (-log p of each prompt token after the first).
inline std::vector<double> prompt_nlls(const GenResult& g) {
  std::vector<double> out;
  for (const StepLogprobs& p : g.prompt_logprobs) out.push_back(-p.sampled.logprob);
  return out;
}

// The largest |got - want| over one prompt's NLLs.
inline double max_nll_error(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = worst_of(worst, std::fabs(got[i] - want[i]));
  return worst;
}

}  // namespace strata::test
