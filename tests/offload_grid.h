// The offloading engine's test grids and helpers, shared by test_offload.cpp (the CPU backend and
// CUDA) and test_offload_async.cpp (the same grids with the device's work reordered).
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <tuple>
#include <unistd.h>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "policy_fixtures.h"
#include "strata/model/model_loader.h"
#include "strata/offload/engine.h"
#include "strata/runtime/generator.h"
#include "test_paths.h"
#include "test_support.h"

namespace strata::test {

inline nlohmann::json load_expected(const std::string& model) {
  std::ifstream in(std::string(STRATA_FIXTURES_DIR) + "/models/" + model + "/expected.json");
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

// One directory per test case: ctest runs cases in parallel processes.
inline std::filesystem::path offload_dir(const std::string& test = "shared") {
  return std::filesystem::temp_directory_path() / ("strata-test-offload-" + test + "-" + std::to_string(::getpid()));
}

inline PlanShape shape_of(const std::vector<GenRequest>& reqs) {
  PlanShape s;
  for (const GenRequest& r : reqs) {
    s.prompt_len = std::max(s.prompt_len, int(r.prompt.size()));
    s.gen_len = std::max(s.gen_len, r.sampling.max_new_tokens);
  }
  return s;
}

// Runs every request through the engine, a block at a time.
inline std::vector<GenResult> run_blocks(OffloadEngine& engine, const std::vector<GenRequest>& reqs) {
  std::vector<GenResult> out;
  for (size_t b = 0; b < reqs.size(); b += size_t(engine.block_size())) {
    const std::vector<GenRequest> block(reqs.begin() + long(b),
                                        reqs.begin() + long(std::min(reqs.size(), b + size_t(engine.block_size()))));
    for (GenResult& r : engine.generate(block)) out.push_back(std::move(r));
  }
  return out;
}

inline std::string describe(const Policy& p) {
  auto split = [](const TierSplit& s) {
    return std::to_string(s.gpu) + "/" + std::to_string(s.cpu) + "/" + std::to_string(s.disk);
  };
  return "weights " + split(p.weights) + " cache " + split(p.kv_cache) + " act " + split(p.activations) + " block " +
         std::to_string(p.gpu_batch_size) + "x" + std::to_string(p.num_gpu_batches) +
         (p.cpu_attention ? " cpu_attention" : "") + (p.overlap ? " overlap" : " no-overlap") + " prefill_tokens " +
         std::to_string(p.prefill_tokens) + " prefill_batches_per_step " + std::to_string(p.prefill_batches_per_step);
}

// Each tensor class alone on each tier (the others mixed), everything mixed, and the extremes;
// batch shapes and the on/off options rotate through the list so each meets several placements.
inline std::vector<Policy> policy_grid() {
  const TierSplit G{100, 0, 0}, C{0, 100, 0}, D{0, 0, 100}, M{34, 33, 33}, M2{50, 0, 50};
  const std::vector<std::array<TierSplit, 3>> placements = {
      {G, G, G}, {C, M, M}, {D, M, M}, {M, C, M}, {M, D, M}, {M, M, C}, {M, M, D}, {G, M, M},
      {M, G, M}, {M, M, G}, {M, M, M}, {C, C, C}, {D, D, D}, {M2, M2, M2}, {D, C, D}, {C, D, C}};
  const std::vector<std::pair<int, int>> shapes = {{1, 1}, {2, 3}, {3, 2}, {5, 1}, {1, 5}, {2, 2}, {4, 2}};
  const std::vector<int> prefill_steps = {3, 0, 8, 24, 45};
  std::vector<Policy> out;
  for (size_t i = 0; i < placements.size(); ++i)
    for (size_t v = 0; v < 2; ++v) {
      const size_t n = out.size();
      const auto [gbs, ngb] = shapes[n % shapes.size()];
      out.push_back(policy_of(gbs, ngb, placements[i][0], placements[i][1], placements[i][2],
                              /*cpu_attention=*/(n / 2) % 2 == 1, /*overlap=*/n % 2 == 0));
      // Prefill steps from 3 tokens (prompts of up to 20 run in pieces, one sequence a group) to
      // the default (whole batches a group), so groups, pieces and both meet every placement.
      out.back().prefill_tokens = prefill_steps[n % prefill_steps.size()];
      // Staggered prefill where there are batches to stagger: all at once, one a step (the last
      // batches prefill while the first decode), or all but one in the first step.
      const int stagger[] = {0, 1, ngb - 1};
      if (ngb > 1) out.back().prefill_batches_per_step = stagger[n % 3];
    }
  return out;
}

// CI's slow builds run a share of the (model, policy) pairs of the big grids: with
// STRATA_TEST_GRID_STRIDE=k, model m runs the policies n with (m + n) % k == 0, so each policy
// still meets 1/k of the models and each model 1/k of the policies. ctest sets k = 2 for the
// emulated CUDA backend's cases (tests/CMakeLists.txt) and .ci/run for the AddressSanitizer stage;
// the plain CPU build and a real GPU's `[cuda]` run take every pair.
inline size_t grid_stride() {
  const char* v = std::getenv("STRATA_TEST_GRID_STRIDE");
  const long k = v ? std::strtol(v, nullptr, 10) : 1;
  return k > 1 ? size_t(k) : 1;
}

inline bool in_grid_share(size_t model, size_t policy) { return (model + policy) % grid_stride() == 0; }

// The compression settings the compressed grid rotates through: weights and cache together, each
// alone, 4 and 8 bits, and groups that do not divide the tiny models' sizes (a shorter last group).
inline std::vector<std::pair<std::optional<Compression>, std::optional<Compression>>> compression_settings() {
  return {{Compression{4, 64}, Compression{4, 32}}, {Compression{8, 128}, std::nullopt}, {std::nullopt, Compression{4, 64}}};
}

// The policy grid, each policy with the compression setting its index picks.
inline std::vector<OffloadOptions> compressed_grid() {
  const auto settings = compression_settings();
  std::vector<OffloadOptions> out;
  for (const Policy& p : policy_grid()) {
    OffloadOptions opt;
    opt.policy = p;
    std::tie(opt.policy.compress_weights, opt.policy.compress_kv_cache) = settings[out.size() % settings.size()];
    opt.offload_dir = offload_dir();
    out.push_back(opt);
  }
  return out;
}

// The reference of the compressed grids: each compression setting with everything on the GPU
// tier, all requests in one block.
inline std::vector<std::vector<GenResult>> all_gpu_compressed_runs(const ModelBundle& model, Backend& backend,
                                                                   const std::vector<GenRequest>& reqs) {
  std::vector<std::vector<GenResult>> out;
  for (const auto& [w, c] : compression_settings()) {
    OffloadOptions opt;
    opt.policy = policy_of(int(reqs.size()), 1, {100, 0, 0}, {100, 0, 0}, {100, 0, 0}, false, true);
    opt.policy.compress_weights = w;
    opt.policy.compress_kv_cache = c;
    OffloadEngine engine(model.config, *model.weights, backend, opt, shape_of(reqs));
    out.push_back(engine.generate(reqs));
  }
  return out;
}

inline std::string describe_compression(const Policy& p) {
  auto one = [](const std::optional<Compression>& c) {
    return c ? std::to_string(c->bits) + "-bit g" + std::to_string(c->group_size) : std::string("off");
  };
  return "weights " + one(p.compress_weights) + ", cache " + one(p.compress_kv_cache);
}

// Two runs that compute in different precisions or orders (the CPU's fp32 beside the GPU's fp16):
// every step's log-probability of the token both chose within `tolerance`, and where the tokens
// part, `want`'s top two within `tolerance` of each other there. The requests asked for 2 logprobs.
inline void check_tokens_within_margin(const std::vector<GenResult>& got, const std::vector<GenResult>& want,
                                       double tolerance) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("prompt " << i);
    REQUIRE(got[i].logprobs.size() == got[i].tokens.size());
    REQUIRE(want[i].logprobs.size() == want[i].tokens.size());
    for (size_t t = 0; t < std::min(got[i].tokens.size(), want[i].tokens.size()); ++t) {
      INFO("token " << t);
      if (got[i].tokens[t] != want[i].tokens[t]) {
        const std::vector<TokenLogprob>& top = want[i].logprobs[t].top;
        REQUIRE(top.size() == 2);
        CHECK(top[0].logprob - top[1].logprob < tolerance);
        break;
      }
      CHECK(std::fabs(got[i].logprobs[t].sampled.logprob - want[i].logprobs[t].sampled.logprob) < tolerance);
    }
  }
}

}  // namespace strata::test
