// Experts computed where they live (policy cpu_experts, docs/moe.md): a mixture of experts' MLP
// half on the CPU tier runs on the CPU in the phases the policy names. Greedy tokens are
// Hugging Face's (tests/fixtures/models/tiny-mixtral, made by make_moe_fixtures.py) whatever the
// phase and placement; the bytes moved are the hidden rows instead of the half's weights.
#include "test_paths.h"
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "offload_grid.h"
#include "policy_fixtures.h"
#include "strata/backend/backend.h"
#include "strata/core/error.h"
#include "strata/model/model_loader.h"
#include "strata/offload/engine.h"
#include "strata/policy/placement.h"
#include "strata/policy/policy.h"

using namespace strata;
using namespace strata::test;
using nlohmann::json;

namespace {

const std::string kModels = std::string(STRATA_FIXTURES_DIR) + "/models/";

Policy with_cpu_experts(Policy p, bool prefill, bool decode) {
  p.cpu_experts_prefill = prefill;
  p.cpu_experts_decode = decode;
  return p;
}

}  // namespace

TEST_CASE("policy: cpu_experts reads none, decode, prefill or both and writes them back", "[policy][moe]") {
  const std::string base = "gpu_batch_size: 2\nnum_gpu_batches: 1\nweights: {gpu: 0, cpu: 100}\n"
                           "kv_cache: {gpu: 100}\nactivations: {gpu: 100}\n";
  for (const auto& [name, prefill, decode] : {std::tuple{"none", false, false}, {"decode", false, true},
                                              {"prefill", true, false}, {"both", true, true}}) {
    const Policy p = parse_policy(base + "cpu_experts: " + name + "\n");
    CHECK(p.cpu_experts_prefill == prefill);
    CHECK(p.cpu_experts_decode == decode);
    CHECK(std::string(cpu_experts_name(p)) == name);
    const Policy again = parse_policy(policy_to_yaml(p));
    CHECK(again.cpu_experts_prefill == prefill);
    CHECK(again.cpu_experts_decode == decode);
  }
  CHECK_FALSE(parse_policy(base).cpu_experts_decode);
  CHECK_THROWS_WITH(parse_policy(base + "cpu_experts: sometimes\n", "p.yaml"),
                    Catch::Contains("p.yaml:6") && Catch::Contains("cpu_experts") && Catch::Contains("sometimes"));
  CHECK_THROWS_WITH(parse_policy(base + "cpu_experts: [decode]\n", "p.yaml"), Catch::Contains("a list"));
}

TEST_CASE("moe: experts computed on the CPU give Hugging Face's greedy tokens in every phase and placement",
          "[moe][offload]") {
  // On the CPU backend the CPU's MLP half runs the same kernels over the same bytes as the "GPU"
  // tier's, so the tokens must be exactly Hugging Face's, as for every other policy.
  auto backend = make_cpu_backend(2);
  ModelBundle model = open_model(kModels + "tiny-mixtral");
  const json exp = load_expected("tiny-mixtral");
  const std::vector<GenRequest> reqs = fixture_requests(exp);
  int n = 0, computed_on_cpu = 0;
  for (const Policy& grid_policy : policy_grid()) {
    if (grid_policy.weights.cpu == 0) continue;  // nothing lives on the CPU tier to compute there
    const int phase = n++ % 3;
    OffloadOptions opt;
    opt.policy = with_cpu_experts(grid_policy, phase != 0, phase != 1);
    opt.offload_dir = offload_dir("cpu-experts");
    OffloadEngine engine(model.config, *model.weights, *backend, opt, shape_of(reqs));
    const std::vector<GenResult> got = run_blocks(engine, reqs);
    REQUIRE(got.size() == reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i) {
      INFO(describe(opt.policy) << ", cpu_experts " << cpu_experts_name(opt.policy) << ", prompt " << i);
      CHECK(got[i].tokens == exp["greedy"][i].get<std::vector<int32_t>>());
    }
    const bool on_cpu = cpu_experts_used(model.config, opt.policy, engine.plan().weight_tier);
    CHECK((engine.report().cpu_experts_seconds > 0) == on_cpu);
    computed_on_cpu += on_cpu;
  }
  CHECK(computed_on_cpu >= 6);  // the grid's placements put some layer on the CPU tier that often
}

TEST_CASE("moe: compressed experts computed on the CPU give the all-on-GPU compressed run's tokens",
          "[moe][offload][quant]") {
  // The CPU reads the half's codes where they live with the same fused linear the "GPU" tier runs
  // on the CPU backend, so not a token may change.
  auto backend = make_cpu_backend(2);
  ModelBundle model = open_model(kModels + "tiny-mixtral");
  const std::vector<GenRequest> reqs = fixture_requests(load_expected("tiny-mixtral"));
  const std::vector<std::vector<GenResult>> reference = all_gpu_compressed_runs(model, *backend, reqs);
  const std::vector<OffloadOptions> grid = compressed_grid();
  for (size_t g = 0; g < grid.size(); ++g) {
    if (grid[g].policy.weights.cpu == 0) continue;
    OffloadOptions opt = grid[g];
    opt.policy = with_cpu_experts(opt.policy, g % 2 == 0, true);
    OffloadEngine engine(model.config, *model.weights, *backend, opt, shape_of(reqs));
    const std::vector<GenResult> got = run_blocks(engine, reqs);
    for (size_t i = 0; i < reqs.size(); ++i) {
      INFO(describe(opt.policy) << ", " << describe_compression(opt.policy) << ", cpu_experts "
                                << cpu_experts_name(opt.policy) << ", prompt " << i);
      CHECK(got[i].tokens == reference[g % compression_settings().size()][i].tokens);
    }
  }
}

TEST_CASE("moe: experts computed on the CPU move hidden rows instead of the MLP half", "[moe][offload]") {
  // Weights on the CPU tier, cache and activations on the GPU tier, every sequence generating to
  // its limit: the only crossings are the weights' halves and, with cpu_experts, each decode
  // step's hidden rows of every layer, to the host and back.
  auto backend = make_cpu_backend(2);
  ModelBundle model = open_model(kModels + "tiny-mixtral");
  std::vector<GenRequest> reqs = fixture_requests(load_expected("tiny-mixtral"));
  for (GenRequest& r : reqs) r.sampling.ignore_eos = true;
  const int n_tokens = reqs.front().sampling.max_new_tokens, L = model.config.n_layers;
  const Policy moved = policy_of(int(reqs.size()), 1, {0, 100, 0}, {100, 0, 0}, {100, 0, 0});
  auto run = [&](const Policy& p, GenStats* stats) {
    OffloadOptions opt;
    opt.policy = p;
    opt.offload_dir = offload_dir("cpu-experts-bytes");
    OffloadEngine engine(model.config, *model.weights, *backend, opt, shape_of(reqs));
    for (const GenResult& r : engine.generate(reqs, stats)) REQUIRE(int(r.tokens.size()) == n_tokens);
    return std::pair{engine.report(), engine.plan()};
  };
  GenStats moved_stats, decode_stats;
  const auto [base, plan] = run(moved, &moved_stats);
  const auto [decode, decode_plan] = run(with_cpu_experts(moved, false, true), &decode_stats);
  const double row_bytes = double(model.config.hidden) * 4;  // fp32 on the CPU backend
  const double crossed = double(n_tokens - 1) * L * double(reqs.size()) * row_bytes;
  CHECK(base.gpu_to_cpu.bytes == 0);
  CHECK(decode.gpu_to_cpu.bytes == crossed);
  CHECK(base.cpu_to_gpu.bytes - decode.cpu_to_gpu.bytes ==
        double(n_tokens - 1) * L * double(plan.mlp_weight_bytes) - crossed);
  // The CPU's routing is counted with the GPU's: the same tokens reach the same experts.
  CHECK(decode_stats.routing.layer_steps == moved_stats.routing.layer_steps);
  CHECK(decode_stats.routing.tokens == moved_stats.routing.tokens);
  CHECK(decode_stats.routing.active_experts == moved_stats.routing.active_experts);
  // The plan holds the CPU's buffers: two of a step's hidden rows and its workspace.
  CHECK(decode_plan.working.cpu > plan.working.cpu);
}

TEST_CASE("moe: cpu_experts on a dense model fails naming the option", "[moe][offload]") {
  auto backend = make_cpu_backend(1);
  ModelBundle model = open_model(kModels + "tiny-llama");
  OffloadOptions opt;
  opt.policy = with_cpu_experts(policy_of(1, 1, {0, 100, 0}, {100, 0, 0}, {100, 0, 0}), false, true);
  opt.offload_dir = offload_dir("cpu-experts-dense");
  CHECK_THROWS_WITH(OffloadEngine(model.config, *model.weights, *backend, opt, PlanShape{4, 2}),
                    Catch::Contains("cpu_experts is decode") && Catch::Contains("has no experts"));
}

TEST_CASE("CUDA: experts computed on the CPU give the GPU's tokens where their margin allows", "[moe][offload][cuda]") {
  if (!cuda_available()) {
    WARN("no GPU: skipped");
    return;
  }
  // The GPU's fp16 weights are read in place on the host and widened there; the hidden rows cross
  // in fp16 and the CPU computes the half in fp32, the GPU in fp16 with fp32 accumulation. The
  // logits agree to fp16 tolerance, not bit for bit (test_offload.cpp's delegated attention has
  // the same bound and says why): against the same policy with the experts moved.
  constexpr double kTolerance = 0.05;
  auto backend = make_cuda_backend(0);
  ModelBundle model = open_model(kModels + "tiny-mixtral");
  std::vector<GenRequest> reqs = fixture_requests(load_expected("tiny-mixtral"));
  for (GenRequest& r : reqs) r.logprobs = 2;
  int n = 0, computed_on_cpu = 0;
  for (const Policy& grid_policy : policy_grid()) {
    if (grid_policy.weights.cpu == 0) continue;
    const int phase = n++ % 3;
    OffloadOptions moved;
    moved.policy = grid_policy;
    moved.offload_dir = offload_dir("cpu-experts-cuda");
    OffloadOptions computed = moved;
    computed.policy = with_cpu_experts(grid_policy, phase != 0, phase != 1);
    OffloadEngine moved_engine(model.config, *model.weights, *backend, moved, shape_of(reqs));
    const std::vector<GenResult> want = run_blocks(moved_engine, reqs);
    OffloadEngine engine(model.config, *model.weights, *backend, computed, shape_of(reqs));
    const std::vector<GenResult> got = run_blocks(engine, reqs);
    INFO(describe(computed.policy) << ", cpu_experts " << cpu_experts_name(computed.policy));
    const bool on_cpu = cpu_experts_used(model.config, computed.policy, engine.plan().weight_tier);
    CHECK((engine.report().cpu_experts_seconds > 0) == on_cpu);
    computed_on_cpu += on_cpu;
    check_tokens_within_margin(got, want, kTolerance);
  }
  CHECK(computed_on_cpu >= 6);
}
