// The offloading engine with its device work reordered: the CUDA backend's streams run in any
// order their events allow. On the emulated CUDA backend (tests/cuda_emulation/README.md,
// "Asynchronous mode") STRATA_EMULATED_ASYNC=seed queues every stream's work and runs it in a
// seeded random order, copies delayed; on a GPU the variable is ignored and the streams are
// asynchronous anyway. A released GPU slot is poisoned with NaNs after its last users
// (STRATA_TEST_POISON_RELEASED), so a reader the engine forgot to order before the release reads
// NaNs. The schedule does not change a token (each op's arithmetic is the same in any order), so
// every run must give exactly the tokens of the same policy with every call completed in order.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "offload_grid.h"
#include "strata/backend/backend.h"
#include "strata/backend/device_info.h"
#include "strata/model/model_loader.h"

using namespace strata;
using namespace strata::test;

namespace {

// Sets an environment variable for a scope.
class ScopedEnv {
public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) saved_ = old;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (saved_) setenv(name_, saved_->c_str(), 1);
    else unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

private:
  const char* name_;
  std::optional<std::string> saved_;
};

bool emulated_device() { return cuda_device_name(0).find("Emulated") != std::string::npos; }

// Each option set's tokens on a backend whose calls complete in order (the emulation's default;
// on a GPU, the same asynchronous streams).
std::vector<std::vector<GenResult>> in_order_runs(const ModelBundle& model, const std::vector<GenRequest>& reqs,
                                                  const std::vector<OffloadOptions>& grid) {
  auto backend = make_cuda_backend(0);
  std::vector<std::vector<GenResult>> out;
  for (const OffloadOptions& opt : grid) {
    OffloadEngine engine(model.config, *model.weights, *backend, opt, shape_of(reqs));
    out.push_back(run_blocks(engine, reqs));
  }
  return out;
}

// Runs `opt` with the device's work reordered by `seed` and released slots poisoned; returns how
// many prompts' tokens differ from `want` (failing the case, unless `count_only`).
int reordered_run(const ModelBundle& model, const std::vector<GenRequest>& reqs, const OffloadOptions& opt, unsigned seed,
                  const std::vector<GenResult>& want, const std::string& what, bool count_only = false) {
  const ScopedEnv async("STRATA_EMULATED_ASYNC", std::to_string(seed));
  const ScopedEnv poison("STRATA_TEST_POISON_RELEASED", "1");
  auto backend = make_cuda_backend(0);  // after the variables: the emulation reads them as it makes streams
  OffloadEngine engine(model.config, *model.weights, *backend, opt, shape_of(reqs));
  const std::vector<GenResult> got = run_blocks(engine, reqs);
  REQUIRE(got.size() == want.size());
  int differ = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    differ += got[i].tokens != want[i].tokens ? 1 : 0;
    if (count_only) continue;
    INFO(what << ", " << describe(opt.policy) << ", " << describe_compression(opt.policy) << ", seed " << seed
              << ", prompt " << i);
    CHECK(got[i].tokens == want[i].tokens);
  }
  return differ;
}

// The mutation checks: with the event wait `wait` skipped (STRATA_TEST_SKIP_EVENT_WAIT), the
// first six policies of the grid that `pick` accepts, reordered, against their in-order runs
// (which wait); returns how many prompts' tokens differ.
template <class Pick>
int differences_without(const std::string& wait, Pick pick);

std::vector<OffloadOptions> plain_grid() {
  std::vector<OffloadOptions> out;
  for (const Policy& p : policy_grid()) {
    OffloadOptions opt;
    opt.policy = p;
    opt.offload_dir = offload_dir("async");
    out.push_back(opt);
  }
  return out;
}

template <class Pick>
int differences_without(const std::string& wait, Pick pick) {
  ModelBundle model = open_model(std::string(STRATA_FIXTURES_DIR) + "/models/tiny-llama");
  const std::vector<GenRequest> reqs = fixture_requests(load_expected("tiny-llama"));
  std::vector<OffloadOptions> grid;
  for (const OffloadOptions& opt : plain_grid())
    if (pick(opt.policy) && grid.size() < 6) grid.push_back(opt);
  REQUIRE(grid.size() == 6);
  const auto want = in_order_runs(model, reqs, grid);
  const ScopedEnv skip("STRATA_TEST_SKIP_EVENT_WAIT", wait);
  int differ = 0;
  for (size_t n = 0; n < grid.size(); ++n) differ += reordered_run(model, reqs, grid[n], unsigned(n + 1), want[n], "", true);
  INFO(differ << " prompts of " << grid.size() * reqs.size() << " differ");
  std::error_code ec;
  std::filesystem::remove_all(offload_dir("async"), ec);
  return differ;
}

}  // namespace

TEST_CASE("async: every policy gives the in-order run's tokens with the device's work reordered",
          "[offload][cuda][async]") {
  if (!cuda_available()) {
    WARN("no GPU: skipped");
    return;
  }
  // Two seeds per policy; the models take turns over the grid.
  const std::vector<OffloadOptions> grid = plain_grid();
  const char* const names[] = {"tiny-llama", "tiny-opt"};
  for (size_t m = 0; m < 2; ++m) {
    ModelBundle model = open_model(std::string(STRATA_FIXTURES_DIR) + "/models/" + names[m]);
    const std::vector<GenRequest> reqs = fixture_requests(load_expected(names[m]));
    std::vector<OffloadOptions> mine;
    for (size_t n = m; n < grid.size(); n += 2) mine.push_back(grid[n]);
    const auto want = in_order_runs(model, reqs, mine);
    for (size_t n = 0; n < mine.size(); ++n)
      for (unsigned seed = 1; seed <= 2; ++seed) reordered_run(model, reqs, mine[n], unsigned(7 * n) + seed, want[n], names[m]);
  }
  std::error_code ec;
  std::filesystem::remove_all(offload_dir("async"), ec);
}

TEST_CASE("async: compressed placements give the in-order run's tokens with the device's work reordered",
          "[offload][cuda][async][quant]") {
  if (!cuda_available()) {
    WARN("no GPU: skipped");
    return;
  }
  // Every other policy of the compressed grid (each compression setting meets several
  // placements), one seed each, a different one per policy.
  ModelBundle model = open_model(std::string(STRATA_FIXTURES_DIR) + "/models/tiny-llama");
  const std::vector<GenRequest> reqs = fixture_requests(load_expected("tiny-llama"));
  std::vector<OffloadOptions> grid;
  const std::vector<OffloadOptions> all = compressed_grid();
  for (size_t n = 0; n < all.size(); n += 2) {
    grid.push_back(all[n]);
    grid.back().offload_dir = offload_dir("async-compressed");
  }
  const auto want = in_order_runs(model, reqs, grid);
  for (size_t n = 0; n < grid.size(); ++n) reordered_run(model, reqs, grid[n], unsigned(100 + n), want[n], "tiny-llama");
  std::error_code ec;
  std::filesystem::remove_all(offload_dir("async-compressed"), ec);
}

TEST_CASE("async: attention delegated to the CPU gives the in-order run's tokens with the device's work reordered",
          "[offload][cuda][async]") {
  if (!cuda_available()) {
    WARN("no GPU: skipped");
    return;
  }
  // The delegated policies (cache off the GPU), fp16 and quantized caches, on a grouped-query and
  // a multi-head model, three seeds each: the CPU attention lane, its copies and the deferred
  // output projections all reordered.
  int delegated = 0;
  for (const char* name : {"tiny-llama", "tiny-opt"}) {
    ModelBundle model = open_model(std::string(STRATA_FIXTURES_DIR) + "/models/" + name);
    const std::vector<GenRequest> reqs = fixture_requests(load_expected(name));
    std::vector<OffloadOptions> grid;
    for (OffloadOptions opt : compressed_grid()) {
      if (!opt.policy.cpu_attention || opt.policy.kv_cache.gpu == 100) continue;
      opt.policy.compress_weights.reset();  // the weights' kernels are the grids' above
      opt.offload_dir = offload_dir("async-cpu");
      grid.push_back(opt);
    }
    delegated += int(grid.size());
    const auto want = in_order_runs(model, reqs, grid);
    for (size_t n = 0; n < grid.size(); ++n)
      for (unsigned seed = 1; seed <= 3; ++seed) reordered_run(model, reqs, grid[n], unsigned(1000 + 10 * n) + seed, want[n], name);
  }
  CHECK(delegated >= 8);
  std::error_code ec;
  std::filesystem::remove_all(offload_dir("async-cpu"), ec);
}

TEST_CASE("async: the reordered grid fails when the compute stream skips its wait for the weights",
          "[offload][cuda][async]") {
  if (!cuda_available() || !emulated_device()) {
    WARN("needs the emulated CUDA backend, where the order is seeded: skipped");
    return;
  }
  // The mutation check: the test-only switch drops one event wait (compute after the weights'
  // copy), so a layer computes from a weight buffer still holding the last layer's weights or the
  // poison. The reordered runs must notice, on policies whose weights cross the link.
  CHECK(differences_without("weights", [](const Policy& p) { return p.weights.gpu < 100; }) > 0);
}

TEST_CASE("CUDA: in decode the engine's thread waits for the device only for the sampled tokens", "[offload][cuda]") {
  if (!cuda_available()) {
    WARN("no GPU: skipped");
    return;
  }
  // Every tensor class on the CPU tier, two GPU batches: each decode step samples each batch once
  // (its stop and eos checks) and nothing else makes the engine's thread wait for the device: no
  // per-step synchronize, and with cpu_attention no wait for q, k and v either (the CPU attention
  // lane waits for them).
  auto backend = make_cuda_backend(0);
  ModelBundle model = open_model(std::string(STRATA_FIXTURES_DIR) + "/models/tiny-llama");
  const std::vector<GenRequest> reqs = fixture_requests(load_expected("tiny-llama"));
  const TierSplit C{0, 100, 0};
  const int64_t ngb = 2;
  for (const bool cpu_attention : {false, true}) {
    OffloadOptions opt;
    opt.policy = policy_of(2, int(ngb), C, C, C, cpu_attention, /*overlap=*/true);
    opt.offload_dir = offload_dir("async-waits");
    OffloadEngine engine(model.config, *model.weights, *backend, opt, shape_of(reqs));
    run_blocks(engine, reqs);
    const OffloadReport r = engine.report();
    const int64_t steps = r.gen.decode_steps;
    INFO("cpu_attention " << cpu_attention << ": " << r.decode_device_waits << " device waits in " << steps
                          << " decode steps");
    REQUIRE(steps > 0);
    CHECK(r.decode_device_waits >= steps);  // at least one batch decodes in every step
    CHECK(r.decode_device_waits <= steps * ngb);
    CHECK(r.decode_host_waits >= r.decode_device_waits);
  }
  // With overlap off the lanes' tasks run inline, but the compute stream's spans are still timed
  // apart: on a policy all on the GPU the engine's thread waits for the sampled tokens only, not
  // for every half-layer's kernels (FlexGen's 2 x 1 OPT-6.7B case, where that cost 1.7x per step).
  const TierSplit G{100, 0, 0};
  OffloadOptions opt;
  opt.policy = policy_of(2, int(ngb), G, G, G, /*cpu_attention=*/false, /*overlap=*/false);
  opt.offload_dir = offload_dir("async-waits");
  OffloadEngine engine(model.config, *model.weights, *backend, opt, shape_of(reqs));
  run_blocks(engine, reqs);
  const OffloadReport r = engine.report();
  INFO("overlap off, all on the GPU: " << r.decode_device_waits << " device waits in " << r.gen.decode_steps
                                        << " decode steps");
  REQUIRE(r.gen.decode_steps > 0);
  CHECK(r.decode_device_waits <= r.gen.decode_steps * ngb);
  CHECK(r.compute_busy > 0);  // still timed
  std::error_code ec;
  std::filesystem::remove_all(offload_dir("async-waits"), ec);
}

TEST_CASE("async: the reordered CPU-attention runs fail when the CPU skips its wait for q, k and v",
          "[offload][cuda][async]") {
  if (!cuda_available() || !emulated_device()) {
    WARN("needs the emulated CUDA backend, where the order is seeded: skipped");
    return;
  }
  // The second mutation: the CPU attention lane no longer waits for the copy of q, k and v, so it
  // may attend with the last step's (or the other buffer set's) queries and keys.
  CHECK(differences_without("cpu attention inputs",
                            [](const Policy& p) { return p.cpu_attention && p.kv_cache.gpu < 100; }) > 0);
}

namespace {

// tiny-mixtral with its weights on the CPU tier, the cache and hidden states on each tier, over
// batch shapes, computing its experts there in decode or in both phases, and with its MLP halves
// placed apart; each run reordered by its own seed against its in-order run; returns how many
// prompts' tokens differ (failing the case unless `count_only`).
int cpu_experts_reordered(bool count_only) {
  ModelBundle model = open_model(std::string(STRATA_FIXTURES_DIR) + "/models/tiny-mixtral");
  const std::vector<GenRequest> reqs = fixture_requests(load_expected("tiny-mixtral"));
  const TierSplit G{100, 0, 0}, C{0, 100, 0}, D{0, 0, 100}, M{34, 33, 33};
  const std::vector<Policy> policies = {policy_of(2, 2, C, G, G),       policy_of(1, 3, C, C, G, true),
                                        policy_of(3, 2, C, G, C),       policy_of(2, 1, C, D, G),
                                        policy_of(4, 2, C, M, M, true), policy_of(1, 2, C, G, D)};
  std::vector<OffloadOptions> grid;
  for (const Policy& p : policies) {
    OffloadOptions opt;
    opt.policy = p;
    opt.policy.cpu_experts_decode = true;
    opt.policy.cpu_experts_prefill = grid.size() % 2 == 1;
    opt.offload_dir = offload_dir("async-experts");
    grid.push_back(opt);
  }
  // The halves apart (expert_weights): attention resident and experts computed on the CPU; and
  // attention on the CPU tier with experts streaming from disk (moved: the MLP half's own pinned
  // buffer and disk reads).
  grid.push_back(grid.front());
  grid.back().policy = policy_of(2, 2, G, G, G);
  grid.back().policy.expert_weights = C;
  grid.back().policy.cpu_experts_decode = true;
  grid.push_back(grid.back());
  grid.back().policy = policy_of(3, 2, C, M, G);
  grid.back().policy.expert_weights = D;
  const auto want = in_order_runs(model, reqs, grid);
  int differ = 0;
  for (size_t n = 0; n < grid.size(); ++n)
    differ += reordered_run(model, reqs, grid[n], unsigned(500 + n), want[n], "tiny-mixtral cpu_experts", count_only);
  std::error_code ec;
  std::filesystem::remove_all(offload_dir("async-experts"), ec);
  return differ;
}

}  // namespace

TEST_CASE("async: experts computed on the CPU give the in-order run's tokens with the device's work reordered",
          "[offload][cuda][async][moe]") {
  if (!cuda_available()) {
    WARN("no GPU: skipped");
    return;
  }
  // The hidden rows' copies to the host and back, the CPU lane's MLP halves, and the next
  // sub-layer's wait for the copy back, all reordered.
  CHECK(cpu_experts_reordered(false) == 0);
}

TEST_CASE("async: the reordered CPU-experts runs fail when the GPU skips its wait for the CPU's rows",
          "[offload][cuda][async][moe]") {
  if (!cuda_available() || !emulated_device()) {
    WARN("needs the emulated CUDA backend, where the order is seeded: skipped");
    return;
  }
  // The mutation: the sub-layer after an MLP half computed on the CPU no longer waits for its
  // rows' copy back, so it reads the hidden state from before the MLP (or mid-copy).
  const ScopedEnv skip("STRATA_TEST_SKIP_EVENT_WAIT", "cpu experts output");
  CHECK(cpu_experts_reordered(true) > 0);
}
