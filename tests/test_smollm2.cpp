// The real default model, SmolLM2-135M-Instruct (Q4_1 GGUF), against Hugging Face transformers
// loading the same file (tests/fixtures/gguf/make_gguf_fixtures.py). Runs when scripts/setup.sh
// has fetched the model; otherwise warns and passes.
#include "required_files.h"
#include "test_paths.h"
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "strata/backend/backend.h"
#include "strata/model/model_loader.h"
#include "strata/runtime/generator.h"
#include "test_support.h"
#include "worst_error.h"

using namespace strata;

TEST_CASE("SmolLM2-135M GGUF: logits and greedy tokens match transformers (CPU)", "[smollm2][gguf-model]") {
  const std::filesystem::path path = strata::test::require_smollm2_gguf();
  std::ifstream in(std::string(STRATA_FIXTURES_DIR) + "/gguf/smollm2_hf.json");
  const auto fx = nlohmann::json::parse(in);
  auto backend = make_cpu_backend();
  ModelBundle mb = open_model(path.string());
  Transformer model(mb.config, load_model_weights(mb.config, *mb.weights, *backend), *backend);

  std::vector<GenRequest> reqs;
  for (const auto& c : fx["logits"]) {
    const std::vector<int32_t> ids = c["ids"].get<std::vector<int32_t>>();
    CHECK(mb.tokenizer->encode(c["prompt"].get<std::string>()) == ids);  // no BOS for this tokenizer

    const std::vector<float> got = test::last_logits(model, ids);

    // Both sides dequantize the same file to float32 and compute in float32: only summation order
    // differs, over 30 layers (observed <= 7e-5). Tolerance: 3e-4 absolute on logits of magnitude ~20.
    const auto top_ids = c["top_ids"].get<std::vector<int>>();
    const auto top_logits = c["top_logits"].get<std::vector<float>>();
    float worst = 0;
    for (size_t i = 0; i < top_ids.size(); ++i) worst = test::worst_of(worst, std::fabs(got[size_t(top_ids[i])] - top_logits[i]));
    double mean = 0;
    for (float v : got) mean += v;
    mean /= double(got.size());
    INFO(c["prompt"] << ": max |diff| over HF's top-50 logits " << worst);
    CHECK(worst <= 3e-4f);
    CHECK(mean == Approx(c["mean"].get<double>()).margin(1e-3));
    CHECK(int(std::max_element(got.begin(), got.end()) - got.begin()) == c["argmax"].get<int>());

    GenRequest r;
    r.prompt = ids;
    r.sampling.max_new_tokens = int(c["greedy_ids"].size());
    reqs.push_back(r);
  }
  // All prompts together in one batch, greedy, against HF's per-prompt greedy continuation.
  const std::vector<GenResult> results = generate(model, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    INFO(fx["logits"][i]["prompt"]);
    CHECK(results[i].tokens == fx["logits"][i]["greedy_ids"].get<std::vector<int32_t>>());
    CHECK(mb.tokenizer->decode(results[i].tokens, true) == fx["logits"][i]["greedy_text"].get<std::string>());
  }
}
