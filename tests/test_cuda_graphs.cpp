// Step graphs (Transformer::forward, Backend::capture): a step shape seen before replays the graph
// captured for it, and gives exactly the tokens and logits of the steps launched op by op. [cuda]:
// on a GPU, and in CI on the emulated backend, whose runtime records a captured stream's work and
// fails the calls a capture cannot hold, as CUDA does (tests/cuda_emulation/test_async_runtime.cpp).
#include "test_paths.h"
#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <string>
#include <nlohmann/json.hpp>

#include "strata/backend/backend.h"
#include "strata/model/model_loader.h"
#include "strata/runtime/generator.h"
#include "graphs_setting.h"
#include "test_support.h"

using namespace strata;
using nlohmann::json;
using strata::test::GraphsSetting;

namespace {

json load_expected(const std::string& model) {
  std::ifstream in(std::string(STRATA_FIXTURES_DIR) + "/models/" + model + "/expected.json");
  REQUIRE(in.good());
  return json::parse(in);
}

struct Run {
  std::vector<GenResult> results;
  int64_t replays = 0;
};

// The fixture's prompts generated in one batch (the decode steps keep a shape while every
// sequence runs, so graphs replay), with logprobs to compare the logits too.
Run generate_with(const std::string& name, Backend& backend, const char* graphs) {
  GraphsSetting setting(graphs);
  const json exp = load_expected(name);
  ModelBundle b = open_model(std::string(STRATA_FIXTURES_DIR) + "/models/" + name);
  Transformer model(b.config, load_model_weights(b.config, *b.weights, backend), backend);
  std::vector<GenRequest> reqs = test::fixture_requests(exp);
  for (GenRequest& r : reqs) r.logprobs = 2;
  Run run;
  run.results = generate(model, reqs);
  run.replays = model.graph_replays();
  return run;
}

}  // namespace

TEST_CASE("cuda graphs: replayed decode steps give the tokens and log-probabilities of eager steps",
          "[cuda][graphs]") {
  if (!cuda_available()) {
    WARN("no GPU: skipped");
    return;
  }
  auto backend = make_cuda_backend(0);
  // Learned positions (OPT), RoPE with GQA (LLaMA), per-head norms (Qwen3), GPTQ codes read by the
  // fused linear, and mixtures of experts, whose decode steps route on the device (their prefill
  // steps, on the host, run eagerly): Mixtral's renormalised top 2, and Qwen3-MoE's top k without
  // renormalisation beside a dense layer.
  for (const char* name :
       {"tiny-opt", "tiny-llama", "tiny-qwen3", "tiny-llama-gptq", "tiny-mixtral", "tiny-qwen3-moe", "tiny-gemma3",
        "tiny-gpt-oss"}) {
    INFO(name);
    const Run eager = generate_with(name, *backend, "0");
    const Run graphed = generate_with(name, *backend, "1");
    CHECK(eager.replays == 0);
    CHECK(graphed.replays > 0);
    REQUIRE(graphed.results.size() == eager.results.size());
    for (size_t i = 0; i < eager.results.size(); ++i) {
      INFO("prompt " << i);
      CHECK(graphed.results[i].tokens == eager.results[i].tokens);
      REQUIRE(graphed.results[i].logprobs.size() == eager.results[i].logprobs.size());
      for (size_t t = 0; t < eager.results[i].logprobs.size(); ++t)  // the same kernels on the same bytes
        CHECK(graphed.results[i].logprobs[t].sampled.logprob == eager.results[i].logprobs[t].sampled.logprob);
    }
  }
}

TEST_CASE("cuda graphs: the CPU backend has none and runs every step eagerly", "[graphs]") {
  auto backend = make_cpu_backend(2);
  const Run run = generate_with("tiny-llama", *backend, "1");
  CHECK(run.replays == 0);
  const json exp = load_expected("tiny-llama");
  for (size_t i = 0; i < run.results.size(); ++i) CHECK(run.results[i].tokens == exp["greedy"][i].get<std::vector<int32_t>>());
}

TEST_CASE("cuda graphs: a replay is one launch issued, and the launches recorded into a graph none",
          "[cuda][graphs]") {
  if (!cuda_available()) {
    WARN("no GPU: skipped");
    return;
  }
  auto backend = make_cuda_backend(0);
  Buffer buf = backend->alloc(3 * 64 * 2);
  const Tensor a = buf.view(0, DType::F16, {64}), b = buf.view(128, DType::F16, {64}), c = buf.view(256, DType::F16, {64});
  const auto three_adds = [&] {
    for (int i = 0; i < 3; ++i) backend->add(a, b, c);
  };
  int64_t before = device_launches_issued();
  three_adds();
  CHECK(device_launches_issued() - before == 3);
  before = device_launches_issued();
  const std::shared_ptr<void> graph = backend->capture(three_adds);
  REQUIRE(graph);
  CHECK(device_launches_issued() - before == 0);
  backend->replay(graph);
  backend->synchronize();
  CHECK(device_launches_issued() - before == 1);
}
