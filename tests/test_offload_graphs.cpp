// The offloading engine's layer-half graphs (docs/offload.md, "Graphs"): a half whose token count,
// unit rows, cache views and weights' addresses came before replays the graph captured for them,
// and gives exactly the tokens and log-probabilities of the eager run, in blocks and serving.
// [cuda]: on a GPU, and in CI on the emulated backend, whose runtime records a captured stream's
// work and refuses what a capture cannot hold, as CUDA does.
#include "test_paths.h"
#include <catch2/catch.hpp>
#include <cmath>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "graphs_setting.h"
#include "offload_grid.h"
#include "policy_fixtures.h"
#include "refill_requests.h"
#include "strata/backend/backend.h"
#include "strata/model/config.h"
#include "strata/model/model_loader.h"
#include "strata/model/weight_source.h"
#include "strata/offload/engine.h"

using namespace strata;
using namespace strata::test;

namespace {

struct Run {
  std::vector<std::vector<GenResult>> results;  // per request, its choices
  int64_t replays = 0;
};

// The requests a block at a time (`serve` false) or served as slots free up, with graphs on ("1")
// or off ("0").
Run run_with(const ModelBundle& model, Backend& backend, const OffloadOptions& opt, const std::vector<GenRequest>& reqs,
             bool serve, const char* graphs) {
  GraphsSetting setting(graphs);
  OffloadEngine engine(model.config, *model.weights, backend, opt, shape_of(reqs));
  Run run;
  if (serve) {
    run.results.resize(reqs.size());
    size_t next = 0;
    engine.serve([&] { return next < reqs.size() ? Admission{&reqs[next], next++} : Admission{}; },
                 [&](size_t tag, std::vector<GenResult> results) { run.results.at(tag) = std::move(results); });
  } else {
    for (GenResult& r : run_blocks(engine, reqs)) run.results.push_back({std::move(r)});
  }
  run.replays = engine.report().graph_replays;
  return run;
}

// Bit for bit: replayed or launched, the same kernels run on the same bytes.
void check_identical(const Run& got, const Run& want) {
  REQUIRE(got.results.size() == want.results.size());
  for (size_t i = 0; i < want.results.size(); ++i) {
    REQUIRE(got.results[i].size() == want.results[i].size());
    for (size_t c = 0; c < want.results[i].size(); ++c) {
      INFO("request " << i << ", choice " << c);
      const GenResult &g = got.results[i][c], &w = want.results[i][c];
      CHECK(g.tokens == w.tokens);
      REQUIRE(g.logprobs.size() == w.logprobs.size());
      for (size_t t = 0; t < w.logprobs.size(); ++t) CHECK(g.logprobs[t].sampled.logprob == w.logprobs[t].sampled.logprob);
    }
  }
}

OffloadOptions options_of(const Policy& policy, std::optional<Compression> weights = {},
                          std::optional<Compression> cache = {}) {
  OffloadOptions o;
  o.policy = policy;
  o.policy.compress_weights = weights;
  o.policy.compress_kv_cache = cache;
  o.offload_dir = offload_dir("graphs");
  return o;
}

// Placements that put each kind of address under a graph's key: resident layers (a graph per
// layer and unit), weights through the GPU buffers (a graph per buffer and unit, shared by the
// layers passing through it), caches and hidden states staged from the CPU tier and disk, 4-bit
// weights and cache, and attention delegated to the CPU (the MLP halves alone on the GPU).
std::vector<OffloadOptions> graph_placements() {
  const TierSplit G{100, 0, 0}, C{0, 100, 0}, D{0, 0, 100}, M{50, 0, 50}, H{50, 50, 0};
  return {options_of(policy_of(2, 2, G, G, G)),
          options_of(policy_of(2, 2, C, G, G)),
          options_of(policy_of(2, 2, M, C, C)),
          options_of(policy_of(4, 1, C, D, H)),
          options_of(policy_of(2, 2, C, C, G, /*cpu_attention=*/true)),
          options_of(policy_of(2, 2, H, H, G), Compression{4, 64}, Compression{4, 64})};
}

}  // namespace

TEST_CASE("engine graphs: replayed layer halves give the eager run's tokens and log-probabilities",
          "[offload][cuda][graphs]") {
  if (!cuda_available()) {
    WARN("no GPU: skipped");
    return;
  }
  auto backend = make_cuda_backend(0);
  // tiny-mixtral: its attention halves and its decode steps' MLP halves (routed on the device)
  // replay. The compressed placement (slow on the emulation) and delegated attention run on the
  // dense models. tiny-gemma3: its sliding-window and full layers through these placements (the
  // graphs they share across layers: the test below, where only the key's window tells them apart).
  for (const char* name : {"tiny-llama", "tiny-opt", "tiny-mixtral", "tiny-gemma3"}) {
    const ModelBundle model = open_model(std::string(STRATA_FIXTURES_DIR) + "/models/" + name);
    std::vector<GenRequest> reqs = fixture_requests(load_expected(name));
    for (GenRequest& r : reqs) r.logprobs = 2;
    const std::vector<OffloadOptions> placements = graph_placements();
    const std::string n = name;  // tiny-gemma3: up to caches staged through shared GPU buffers
    const size_t count = n == "tiny-llama" ? placements.size() : n == "tiny-opt" ? 5 : n == "tiny-gemma3" ? 3 : 2;
    for (size_t p = 0; p < count; ++p) {
      const OffloadOptions& opt = placements[p];
      INFO(name << ", " << describe(opt.policy) << ", " << describe_compression(opt.policy));
      const Run eager = run_with(model, *backend, opt, reqs, false, "0");
      const Run graphed = run_with(model, *backend, opt, reqs, false, "1");
      CHECK(eager.replays == 0);
      CHECK(graphed.replays > 0);
      check_identical(graphed, eager);
    }
  }
}

TEST_CASE("engine graphs: layers that differ only in their window, RoPE row or sinks keep their own graphs",
          "[offload][cuda][graphs][gpt_oss][gemma]") {
  if (!cuda_available()) {
    WARN("no GPU: skipped");
    return;
  }
  // Six layers of a tiny model's shape (dummy weights; sinks drawn like every other weight),
  // weights and caches through shared GPU buffers, three units a layer, so unit b of layers 1 to
  // 5 meets the same addresses (cache staging buffer b of three): only the key's window, RoPE
  // row and sinks tell their attention halves apart. GPT-OSS: layers 1, 3 and 5 share a window
  // and differ by their sinks; Gemma 3: sliding layers 1, 3, 4 beside full layers 2 and 5, whose
  // window and RoPE row differ; SmolLM3: layers 1, 3 and 5 without RoPE beside 2 and 4, whose
  // RoPE row alone differs. One graph for them would attend as the first layer captured.
  auto backend = make_cuda_backend(0);
  struct Shape {
    const char* name;
    std::vector<int> windows, nope;
  };
  for (const Shape& shape : {Shape{"tiny-gpt-oss", {0, 2, 4}, {}}, Shape{"tiny-gemma3", {0, 1, 3, 4}, {}},
                             Shape{"tiny-smollm3", {}, {1, 3, 5}}}) {
    const char* name = shape.name;
    INFO(name);
    ModelBundle model;
    model.config = config_from_hf_json(std::string(STRATA_FIXTURES_DIR) + "/models/" + name + "/config.json");
    model.config.n_layers = 6;
    model.config.window_layers = shape.windows;
    model.config.nope_layers = shape.nope;
    model.weights = make_dummy_source(model.config, 7);
    std::vector<GenRequest> reqs = fixture_requests(load_expected(name));
    for (GenRequest& r : reqs) r.logprobs = 2;
    const TierSplit C{0, 100, 0}, G{100, 0, 0};
    const OffloadOptions opt = options_of(policy_of(2, 3, C, C, G));
    const Run eager = run_with(model, *backend, opt, reqs, false, "0");
    const Run graphed = run_with(model, *backend, opt, reqs, false, "1");
    CHECK(graphed.replays > 0);
    check_identical(graphed, eager);
  }
}

TEST_CASE("engine graphs: served requests give the eager run's results, steps of every size beside",
          "[offload][refill][cuda][graphs]") {
  if (!cuda_available()) {
    WARN("no GPU: skipped");
    return;
  }
  // Serving packs prompt pieces beside decode tokens, so a unit's steps take many sizes; prompts
  // that begin alike copy rows between slots (those steps run eagerly). Sampled requests with a
  // seed and several choices too: the results must not move by a bit.
  auto backend = make_cuda_backend(0);
  const ModelBundle model = open_model(std::string(STRATA_FIXTURES_DIR) + "/models/tiny-llama");
  std::mt19937 rng(11);
  std::vector<GenRequest> reqs = stem_requests(rng, 6, 10, 14);
  for (GenRequest& r : reqs) r.n = 1 + int(rng() % 2);
  for (const OffloadOptions& opt : {options_of(policy_of(2, 2, {0, 100, 0}, {100, 0, 0}, {100, 0, 0})),
                                    options_of(policy_of(2, 2, {50, 50, 0}, {0, 100, 0}, {100, 0, 0}))}) {
    INFO(describe(opt.policy));
    const Run eager = run_with(model, *backend, opt, reqs, true, "0");
    const Run graphed = run_with(model, *backend, opt, reqs, true, "1");
    CHECK(eager.replays == 0);
    CHECK(graphed.replays > 0);
    check_identical(graphed, eager);
  }
}

TEST_CASE("engine graphs: the CPU backend runs every half eagerly", "[offload][graphs]") {
  auto backend = make_cpu_backend(2);
  const ModelBundle model = open_model(std::string(STRATA_FIXTURES_DIR) + "/models/tiny-llama");
  const nlohmann::json exp = load_expected("tiny-llama");
  const std::vector<GenRequest> reqs = fixture_requests(exp);
  const Run run = run_with(model, *backend, options_of(policy_of(2, 2, {0, 100, 0}, {100, 0, 0}, {100, 0, 0})), reqs,
                           false, "1");
  CHECK(run.replays == 0);
  for (size_t i = 0; i < reqs.size(); ++i)
    CHECK(run.results[i][0].tokens == exp["greedy"][i].get<std::vector<int32_t>>());
}

TEST_CASE("engine graphs: experts over codes route on the device, replay, and give the host-routed run's tokens",
          "[offload][cuda][graphs][moe]") {
  if (!cuda_available()) {
    WARN("no GPU: skipped");
    return;
  }
  auto backend = make_cuda_backend(0);
  const ModelBundle model = open_model(std::string(STRATA_FIXTURES_DIR) + "/models/tiny-mixtral");
  std::vector<GenRequest> reqs = fixture_requests(load_expected("tiny-mixtral"));
  for (GenRequest& r : reqs) r.logprobs = 2;
  const TierSplit G{100, 0, 0}, H{50, 50, 0};
  // Resident layers, and half of them through the GPU's weight buffers; 4-bit experts, whose
  // decode steps (2 tokens a GPU batch) route on the device and run the kernel their host-routed
  // steps run (fp16 experts run cuBLAS there, in another summation order).
  for (const OffloadOptions& opt : {options_of(policy_of(2, 2, G, G, G), Compression{4, 64}),
                                    options_of(policy_of(2, 2, H, G, G), Compression{4, 64})}) {
    INFO(describe(opt.policy));
    struct Routed {
      Run run;
      RoutingTotals routing;
    };
    const auto run = [&](const char* device_routing, const char* graphs) {
      EnvSetting routing_setting("STRATA_DEVICE_ROUTING", device_routing);
      GraphsSetting graphs_setting(graphs);
      OffloadEngine engine(model.config, *model.weights, *backend, opt, shape_of(reqs));
      Routed r;
      for (GenResult& g : run_blocks(engine, reqs)) r.run.results.push_back({std::move(g)});
      r.run.replays = engine.report().graph_replays;
      r.routing = engine.report().gen.routing;
      return r;
    };
    const Routed host = run("0", "1"), device = run("1", "0"), graphed = run("1", "1");
    // The same experts chosen, counted on the device as on the host.
    CHECK(device.routing.layer_steps == host.routing.layer_steps);
    CHECK(device.routing.tokens == host.routing.tokens);
    CHECK(device.routing.active_experts == host.routing.active_experts);
    CHECK(graphed.routing.active_experts == host.routing.active_experts);
    // The same kernels on the same bytes, but for the routing weights' softmax, whose expf the
    // device may round differently in the last place: within that of the host-routed run.
    REQUIRE(device.run.results.size() == host.run.results.size());
    for (size_t i = 0; i < host.run.results.size(); ++i) {
      const GenResult &d = device.run.results[i][0], &h = host.run.results[i][0];
      INFO("request " << i);
      CHECK(d.tokens == h.tokens);
      REQUIRE(d.logprobs.size() == h.logprobs.size());
      for (size_t t = 0; t < h.logprobs.size(); ++t)
        CHECK(std::fabs(d.logprobs[t].sampled.logprob - h.logprobs[t].sampled.logprob) <= 1e-3);
    }
    // Graphs hold the sparse MLP halves too now: more replays than with the host's routing,
    // and bit for bit the eager run.
    CHECK(device.run.replays == 0);
    CHECK(graphed.run.replays > host.run.replays);
    check_identical(graphed.run, device.run);
  }
}
