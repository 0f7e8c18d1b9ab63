// Where a mixture of experts' MLP halves live and run (docs/moe.md): placed apart from the
// attention halves (policy expert_weights), and computed on the CPU where they live in the phases
// the policy names (cpu_experts). Greedy tokens are Hugging Face's (tests/fixtures/models/
// tiny-mixtral, made by make_moe_fixtures.py) whatever the placement and phase; the bytes moved
// are what the placement says.
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

// The policy grid with the MLP halves placed apart: each policy's experts on another split than
// its weights (every tier alone, mixed, and the two halves of a layer on different tiers), and
// computed on the CPU in no phase, in decode, or in both, in turn.
std::vector<Policy> apart_grid() {
  const std::vector<TierSplit> splits = {{0, 100, 0}, {100, 0, 0}, {0, 0, 100}, {34, 33, 33}, {50, 50, 0}, {0, 50, 50}};
  std::vector<Policy> out;
  for (Policy p : policy_grid()) {
    TierSplit x = splits[out.size() % splits.size()];
    if (x.gpu == p.weights.gpu && x.cpu == p.weights.cpu) x = splits[(out.size() + 1) % splits.size()];
    p.expert_weights = x;
    const int phase = int(out.size() / 2) % 3;
    out.push_back(with_cpu_experts(p, phase == 2, phase != 0));
  }
  return out;
}

std::string describe_experts(const Policy& p) {
  const TierSplit& x = *p.expert_weights;
  return describe(p) + ", experts " + std::to_string(x.gpu) + "/" + std::to_string(x.cpu) + "/" + std::to_string(x.disk) +
         ", cpu_experts " + cpu_experts_name(p);
}

}  // namespace

TEST_CASE("moe: experts placed apart give Hugging Face's greedy tokens, in the memory the plan says",
          "[moe][offload]") {
  // Each half streams from its own home, so the tokens are exactly those of every other policy on
  // the CPU backend; the plan reserves each half's buffers by its own tiers.
  auto backend = make_cpu_backend(2);
  ModelBundle model = open_model(kModels + "tiny-mixtral");
  const json exp = load_expected("tiny-mixtral");
  const std::vector<GenRequest> reqs = fixture_requests(exp);
  int halves_apart = 0;
  for (const Policy& policy : apart_grid()) {
    OffloadOptions opt;
    opt.policy = policy;
    opt.offload_dir = offload_dir("experts-apart");
    OffloadEngine engine(model.config, *model.weights, *backend, opt, shape_of(reqs));
    const std::vector<GenResult> got = run_blocks(engine, reqs);
    REQUIRE(got.size() == reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i) {
      INFO(describe_experts(policy) << ", prompt " << i);
      CHECK(got[i].tokens == exp["greedy"][i].get<std::vector<int32_t>>());
    }
    const PlacementPlan& plan = engine.plan();
    halves_apart += plan.weight_tier != plan.expert_tier;
    const TierBytes planned = plan.peak(), used = engine.report().used;
    for (Tier t : {Tier::Gpu, Tier::Cpu, Tier::Disk}) {
      INFO(describe_experts(policy) << ", " << tier_name(t) << ": plan " << planned.at(t) << ", used " << used.at(t));
      CHECK(used.at(t) <= planned.at(t));
      CHECK(planned.at(t) - used.at(t) < 4096);
    }
  }
  CHECK(halves_apart >= 20);
}

TEST_CASE("moe: attention on the GPU and experts on the CPU move only the experts, or only hidden rows",
          "[moe][offload]") {
  // MoE-Lightning's placement: the attention halves resident, the MLP halves on the CPU tier. Moved,
  // every step carries every layer's MLP half and nothing else; computed on the CPU in decode,
  // decode steps carry each layer's hidden rows both ways instead.
  auto backend = make_cpu_backend(2);
  ModelBundle model = open_model(kModels + "tiny-mixtral");
  std::vector<GenRequest> reqs = fixture_requests(load_expected("tiny-mixtral"));
  for (GenRequest& r : reqs) r.sampling.ignore_eos = true;
  const int n_tokens = reqs.front().sampling.max_new_tokens, L = model.config.n_layers;
  Policy moved = policy_of(int(reqs.size()), 1, {100, 0, 0}, {100, 0, 0}, {100, 0, 0});
  moved.expert_weights = TierSplit{0, 100, 0};
  auto run = [&](const Policy& p) {
    OffloadOptions opt;
    opt.policy = p;
    opt.offload_dir = offload_dir("experts-apart-bytes");
    OffloadEngine engine(model.config, *model.weights, *backend, opt, shape_of(reqs));
    for (const GenResult& r : engine.generate(reqs)) REQUIRE(int(r.tokens.size()) == n_tokens);
    return std::pair{engine.report(), engine.plan()};
  };
  const auto [a, plan] = run(moved);
  const auto [b, plan_b] = run(with_cpu_experts(moved, false, true));
  CHECK(a.cpu_to_gpu.bytes == double(n_tokens) * L * double(plan.mlp_weight_bytes));
  CHECK(a.gpu_to_cpu.bytes == 0);
  const double crossed = double(n_tokens - 1) * L * double(reqs.size()) * double(model.config.hidden) * 4;
  CHECK(b.cpu_to_gpu.bytes == double(L) * double(plan.mlp_weight_bytes) + crossed);  // prefill moves them
  CHECK(b.gpu_to_cpu.bytes == crossed);
  // The plan: no attention buffer on the GPU (every attention half is resident), one MLP buffer.
  const PlacementPlan whole = plan_placement(model.config, policy_of(int(reqs.size()), 1, {0, 100, 0}, {100, 0, 0}, {100, 0, 0}),
                                             shape_of(reqs), DType::F32);
  CHECK(whole.working.gpu - plan.working.gpu == double(plan.attn_weight_bytes));
  CHECK(plan.weights.cpu == double(L) * double(plan.mlp_weight_bytes));
}

TEST_CASE("moe: dense MLPs among experts stream with each layer's half at its own size", "[moe][offload]") {
  // tiny-qwen3-moe's layer 1 is dense (mlp_only_layers): its MLP half is a SwiGLU of width 96, the
  // others a router and 6 experts of width 32. Over the apart grid (every tier, every cpu_experts
  // phase) the engine gives Hugging Face's tokens in the memory its plan says.
  auto backend = make_cpu_backend(2);
  ModelBundle model = open_model(kModels + "tiny-qwen3-moe");
  const ModelConfig& cfg = model.config;
  REQUIRE(cfg.n_layers == 3);
  REQUIRE(!cfg.sparse_layer(1));
  const json exp = load_expected("tiny-qwen3-moe");
  const std::vector<GenRequest> reqs = fixture_requests(exp);
  for (const Policy& policy : apart_grid()) {
    OffloadOptions opt;
    opt.policy = policy;
    opt.offload_dir = offload_dir("mixed-layers");
    OffloadEngine engine(cfg, *model.weights, *backend, opt, shape_of(reqs));
    const std::vector<GenResult> got = run_blocks(engine, reqs);
    REQUIRE(got.size() == reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i) {
      INFO(describe_experts(policy) << ", prompt " << i);
      CHECK(got[i].tokens == exp["greedy"][i].get<std::vector<int32_t>>());
    }
    const TierBytes planned = engine.plan().peak(), used = engine.report().used;
    for (Tier t : {Tier::Gpu, Tier::Cpu, Tier::Disk}) {
      INFO(describe_experts(policy) << ", " << tier_name(t) << ": plan " << planned.at(t) << ", used " << used.at(t));
      CHECK(used.at(t) <= planned.at(t));
      CHECK(planned.at(t) - used.at(t) < 4096);
    }
  }

  // The bytes: attention resident, the MLP halves on the CPU tier. Moved, each step carries each
  // layer's own half (the dense one smaller here); computed on the CPU in decode, the sparse layers
  // send hidden rows instead, and the dense layer's half still moves (a dense MLP computed where it
  // lives would read all of it there).
  std::vector<GenRequest> fixed = reqs;
  for (GenRequest& r : fixed) r.sampling.ignore_eos = true;
  const int n_tokens = fixed.front().sampling.max_new_tokens;
  for (const GenRequest& r : fixed) REQUIRE(r.sampling.max_new_tokens == n_tokens);
  Policy moved = policy_of(int(fixed.size()), 1, {100, 0, 0}, {100, 0, 0}, {100, 0, 0});
  moved.expert_weights = TierSplit{0, 100, 0};
  auto run = [&](const Policy& p) {
    OffloadOptions opt;
    opt.policy = p;
    opt.offload_dir = offload_dir("mixed-layers-bytes");
    OffloadEngine engine(cfg, *model.weights, *backend, opt, shape_of(fixed));
    for (const GenResult& r : engine.generate(fixed)) REQUIRE(int(r.tokens.size()) == n_tokens);
    return std::pair{engine.report(), engine.plan()};
  };
  // Each kind's MLP half as the layer block lays it out (fp32 on the CPU backend, page-aligned).
  const size_t dense = halved_layer_layout(cfg, 1, DType::F32, 4096).mlp_bytes;
  const size_t sparse = halved_layer_layout(cfg, 0, DType::F32, 4096).mlp_bytes;
  REQUIRE(dense != sparse);
  const auto [a, plan] = run(moved);
  CHECK(plan.mlp_weight_bytes == std::max(dense, sparse));  // the buffer holds either kind
  CHECK(plan.mlp_weights.cpu == double(dense + 2 * sparse));
  CHECK(a.cpu_to_gpu.bytes == double(n_tokens) * double(dense + 2 * sparse));
  CHECK(a.gpu_to_cpu.bytes == 0);
  const auto [b, plan_b] = run(with_cpu_experts(moved, false, true));
  const double crossed = double(n_tokens - 1) * 2 * double(fixed.size()) * double(cfg.hidden) * 4;
  CHECK(b.cpu_to_gpu.bytes == double(dense + 2 * sparse) + double(n_tokens - 1) * double(dense) + crossed);
  CHECK(b.gpu_to_cpu.bytes == crossed);

  // Compressed (4-bit weights and cache): each kind's codes cross the links and a prefill step
  // dequantizes either kind's half into the one buffer. Every placement at one batch shape gives
  // the tokens of the same shape with everything on the GPU tier.
  for (Policy p : {policy_of(int(fixed.size()), 1, {0, 100, 0}, {100, 0, 0}, {100, 0, 0}),
                   policy_of(int(fixed.size()), 1, {0, 0, 100}, {0, 100, 0}, {100, 0, 0}), moved,
                   with_cpu_experts(moved, false, true)}) {
    p.compress_weights = Compression{4, 64};
    p.compress_kv_cache = Compression{4, 64};
    Policy resident = p;
    resident.weights = resident.kv_cache = resident.activations = {100, 0, 0};
    resident.expert_weights.reset();
    resident.cpu_experts_prefill = resident.cpu_experts_decode = false;
    const bool on_cpu = p.cpu_experts_decode;
    INFO(describe(p) << (on_cpu ? ", cpu_experts decode" : ""));
    OffloadOptions opt, ref;
    opt.policy = p;
    ref.policy = resident;
    opt.offload_dir = ref.offload_dir = offload_dir("mixed-layers-compressed");
    OffloadEngine engine(cfg, *model.weights, *backend, opt, shape_of(reqs)),
        ref_engine(cfg, *model.weights, *backend, ref, shape_of(reqs));
    const std::vector<GenResult> got = run_blocks(engine, reqs), want = run_blocks(ref_engine, reqs);
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) CHECK(got[i].tokens == want[i].tokens);
  }
}

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

TEST_CASE("policy: expert_weights places the MLP halves apart and writes back", "[policy][moe]") {
  const std::string base = "gpu_batch_size: 2\nnum_gpu_batches: 1\nweights: {gpu: 100}\n"
                           "kv_cache: {gpu: 100}\nactivations: {gpu: 100}\n";
  CHECK_FALSE(parse_policy(base).expert_weights.has_value());
  const Policy p = parse_policy(base + "expert_weights: {gpu: 25, cpu: 50, disk: 25}\n");
  REQUIRE(p.expert_weights.has_value());
  CHECK(p.expert_weights->gpu == 25);
  CHECK(p.expert_weights->disk == 25);
  const Policy again = parse_policy(policy_to_yaml(p));
  REQUIRE(again.expert_weights.has_value());
  CHECK(again.expert_weights->cpu == 50);
  CHECK_THROWS_WITH(parse_policy(base + "expert_weights: {gpu: 50, cpu: 40}\n", "p.yaml"),
                    Catch::Contains("p.yaml:6") && Catch::Contains("expert_weights") && Catch::Contains("sum to 90"));
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

TEST_CASE("moe: expert_weights on a dense model fails naming the field", "[moe][offload]") {
  auto backend = make_cpu_backend(1);
  ModelBundle model = open_model(kModels + "tiny-llama");
  OffloadOptions opt;
  opt.policy = policy_of(1, 1, {100, 0, 0}, {100, 0, 0}, {100, 0, 0});
  opt.policy.expert_weights = TierSplit{0, 100, 0};
  opt.offload_dir = offload_dir("experts-apart-dense");
  CHECK_THROWS_WITH(OffloadEngine(model.config, *model.weights, *backend, opt, PlanShape{4, 2}),
                    Catch::Contains("expert_weights") && Catch::Contains("has none"));
}

TEST_CASE("CUDA: experts placed apart give the all-on-GPU run's tokens", "[moe][offload][cuda]") {
  if (!cuda_available()) {
    WARN("no GPU: skipped");
    return;
  }
  // Moving the halves from their own homes runs the same fp16 kernels on the same shapes as the
  // same batch shape with every class on the GPU: not a token may change (CPU attention and CPU
  // experts sum in another order and are left out; the CPU experts' case is below).
  auto backend = make_cuda_backend(0);
  ModelBundle model = open_model(kModels + "tiny-mixtral");
  const std::vector<GenRequest> reqs = fixture_requests(load_expected("tiny-mixtral"));
  int n = 0;
  for (Policy policy : apart_grid()) {
    if (policy.cpu_attention) continue;
    policy.cpu_experts_prefill = policy.cpu_experts_decode = false;
    OffloadOptions opt;
    opt.policy = policy;
    opt.offload_dir = offload_dir("experts-apart-cuda");
    OffloadOptions resident = opt;
    resident.policy.weights = resident.policy.kv_cache = resident.policy.activations = {100, 0, 0};
    resident.policy.expert_weights.reset();
    OffloadEngine ref(model.config, *model.weights, *backend, resident, shape_of(reqs));
    const std::vector<GenResult> want = run_blocks(ref, reqs);
    OffloadEngine engine(model.config, *model.weights, *backend, opt, shape_of(reqs));
    const std::vector<GenResult> got = run_blocks(engine, reqs);
    for (size_t i = 0; i < reqs.size(); ++i) {
      INFO(describe_experts(policy) << ", prompt " << i);
      CHECK(got[i].tokens == want[i].tokens);
    }
    ++n;
  }
  CHECK(n >= 10);
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
