#include "test_paths.h"
#include <catch2/catch.hpp>
#include <filesystem>

#include "strata/core/error.h"
#include "strata/model/config.h"
#include "strata/policy/cost_model.h"
#include "strata/policy/placement.h"
#include "strata/policy/policy.h"
#include "strata/profile/hardware.h"

using namespace strata;

TEST_CASE("the paper's policies parse to FlexGen's --percent settings", "[policy]") {
  const std::string dir = std::string(STRATA_FIXTURES_DIR) + "/../../policies/";
  const Policy p = load_policy(dir + "opt-175b-paper.yaml");
  CHECK(p.gpu_batch_size == 32);
  CHECK(p.num_gpu_batches == 8);
  CHECK(p.block_size() == 256);
  CHECK((p.weights.gpu == 0 && p.weights.cpu == 50 && p.weights.disk == 50));
  CHECK((p.kv_cache.disk == 100 && p.activations.cpu == 100));
  CHECK(p.cpu_attention);
  CHECK_FALSE(p.compress_weights.has_value());
  const Policy c = load_policy(dir + "opt-175b-paper-compressed.yaml");
  REQUIRE(c.compress_weights.has_value());
  CHECK(c.compress_weights->group_size == 64);
  CHECK(c.compress_weights->bits == 4);
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".yaml") {
      CHECK_NOTHROW(load_policy(e.path()));
      ++files;
    }
  CHECK(files == 12);  // the nine paper policies, all-gpu, and the two of the CPU refill measurement
}

TEST_CASE("the paper's policies fit the paper's machine in the runtime's plan and in the cost model",
          "[policy][placement]") {
  // policies/hardware/t4-paper.yaml's budgets (15 GB of GPU, 204 GB of CPU, 1500 GB of disk);
  // workloads of Table 2. The plan is what the runtime reserves; the model's peak is what
  // `strata policy --evaluate` checks beside it.
  const std::string dir = std::string(STRATA_FIXTURES_DIR) + "/../../policies/";
  const HardwareProfile hw = load_hardware_profile(dir + "hardware/t4-paper.yaml");
  const TierBytes budget{hw.gpu_mem, hw.cpu_mem, hw.disk_mem};
  struct Row {
    const char* file;
    const char* model;
    int prompt;
  };
  for (const Row& r : {Row{"opt-6.7b-paper.yaml", "opt-6.7b", 512}, Row{"opt-6.7b-paper-1024.yaml", "opt-6.7b", 1024},
                       Row{"opt-6.7b-paper-compressed.yaml", "opt-6.7b", 512}, Row{"opt-30b-paper.yaml", "opt-30b", 512},
                       Row{"opt-30b-paper-1024.yaml", "opt-30b", 1024},
                       Row{"opt-30b-paper-compressed.yaml", "opt-30b", 512}, Row{"opt-175b-paper.yaml", "opt-175b", 512},
                       Row{"opt-175b-paper-1024.yaml", "opt-175b", 1024},
                       Row{"opt-175b-paper-compressed.yaml", "opt-175b", 512}}) {
    const ModelConfig cfg = *config_preset(r.model);
    const Policy policy = load_policy(dir + r.file);
    const TierBytes plan = plan_placement(cfg, policy, {r.prompt, 32}, DType::F16).peak();
    const TierBytes model = evaluate(cfg, policy, Workload{r.prompt, 32}, hw).peak;
    for (Tier t : {Tier::Gpu, Tier::Cpu, Tier::Disk}) {
      INFO(r.file << ": " << tier_name(t) << " plan " << plan.at(t) / 1e9 << " GB, model " << model.at(t) / 1e9
                  << " GB, budget " << budget.at(t) / 1e9 << " GB");
      CHECK(plan.at(t) <= budget.at(t));
      CHECK(model.at(t) <= budget.at(t));
    }
  }
}

TEST_CASE("a policy survives a YAML round trip", "[policy]") {
  Policy p;
  p.gpu_batch_size = 48;
  p.num_gpu_batches = 3;
  p.weights = {20, 80, 0};
  p.kv_cache = {0, 30, 70};
  p.activations = {0, 100, 0};
  p.overlap = false;
  p.cpu_attention = true;
  p.compress_kv_cache = Compression{4, 32};
  p.prefill_tokens = 512;
  p.prefill_batches_per_step = 2;
  const Policy q = parse_policy(policy_to_yaml(p));
  CHECK(q.prefill_tokens == 512);
  CHECK(q.prefill_batches_per_step == 2);
  CHECK(q.start_step(0) == 0);
  CHECK(q.start_step(1) == 0);
  CHECK(q.start_step(2) == 1);
  CHECK(q.start_steps() == 2);  // 3 batches, 2 a step
  CHECK(Policy{}.start_steps() == 1);
  CHECK(q.prefill_step_tokens() == 512);
  CHECK(Policy{}.prefill_step_tokens() == Policy::kDefaultPrefillTokens);
  CHECK(q.gpu_batch_size == 48);
  CHECK(q.num_gpu_batches == 3);
  CHECK((q.kv_cache.cpu == 30 && q.kv_cache.disk == 70));
  CHECK_FALSE(q.overlap);
  CHECK(q.cpu_attention);
  CHECK_FALSE(q.compress_weights.has_value());
  REQUIRE(q.compress_kv_cache.has_value());
  CHECK(q.compress_kv_cache->group_size == 32);
}

TEST_CASE("bad policies name the line and the field", "[policy]") {
  const std::string base = "gpu_batch_size: 4\nnum_gpu_batches: 2\nweights: {gpu: 100}\nkv_cache: {cpu: 100}\n";
  CHECK_NOTHROW(parse_policy(base + "activations: {gpu: 100}\n"));
  CHECK_THROWS_WITH(parse_policy(base + "activations: {gpu: 60, cpu: 30}\n", "p.yaml"),
                    Catch::Contains("p.yaml:5: field 'activations': percentages sum to 90, not 100"));
  CHECK_THROWS_WITH(parse_policy(base + "activations: {gpu: 100}\nweight_dtype: f16\n", "p.yaml"),
                    Catch::Contains("p.yaml:6: unknown key 'weight_dtype'"));
  CHECK_THROWS_WITH(parse_policy(base + "activations: {gpu: 100, nvme: 0}\n", "p.yaml"),
                    Catch::Contains("unknown key 'activations.nvme'"));
  CHECK_THROWS_WITH(parse_policy("gpu_batch_size: 0\nnum_gpu_batches: 2\nweights: {gpu: 100}\nkv_cache: {gpu: 100}\n"
                                 "activations: {gpu: 100}\n", "p.yaml"),
                    Catch::Contains("p.yaml:1: field 'gpu_batch_size' must be in [1,"));
  CHECK_THROWS_WITH(parse_policy("gpu_batch_size: -3\nnum_gpu_batches: 2\nweights: {gpu: 100}\nkv_cache: {gpu: 100}\n"
                                 "activations: {gpu: 100}\n", "p.yaml"),
                    Catch::Contains("'gpu_batch_size' must be in"));
  CHECK_THROWS_WITH(parse_policy(base + "activations: {gpu: 100}\noverlap: maybe\n", "p.yaml"),
                    Catch::Contains("p.yaml:6: field 'overlap' must be true or false"));
  CHECK_THROWS_WITH(parse_policy(base, "p.yaml"), Catch::Contains("missing field 'activations'"));
  CHECK_THROWS_WITH(parse_policy(base + "activations: {gpu: 100}\ncompress_weights: {bits: 3}\n", "p.yaml"),
                    Catch::Contains("p.yaml:6: field 'compress_weights.bits' must be in [4, 8]"));
  CHECK_THROWS_WITH(parse_policy(base + "activations: {gpu: 100}\ncompress_weights: {bits: 6}\n", "p.yaml"),
                    Catch::Contains("p.yaml:6: field 'compress_weights.bits' must be 4 or 8, got 6"));
  CHECK_THROWS_WITH(parse_policy(base + "activations: {gpu: 100}\ncompress_kv_cache: {group_size: 48}\n", "p.yaml"),
                    Catch::Contains("p.yaml:6: field 'compress_kv_cache.group_size' must be 32, 64 or 128, got 48"));
  CHECK_NOTHROW(parse_policy(base + "activations: {gpu: 100}\ncompress_weights: {bits: 8, group_size: 128}\n"));
  CHECK_THROWS_WITH(parse_policy(base + "activations: {gpu: 100}\ncompress_activations: {bits: 4}\n", "p.yaml"),
                    Catch::Contains("p.yaml:6: field 'compress_activations': activations cannot be compressed"));
  CHECK_THROWS_WITH(parse_policy(base + "activations: {gpu: 100}\nprefill_tokens: 0\n", "p.yaml"),
                    Catch::Contains("p.yaml:6: field 'prefill_tokens' must be in [1,"));
  // Staggered prefill: at most the block's GPU batches start in one step.
  const int batches = parse_policy(base + "activations: {gpu: 100}\n").num_gpu_batches;
  CHECK_THROWS_WITH(parse_policy(base + "activations: {gpu: 100}\nprefill_batches_per_step: " +
                                     std::to_string(batches + 1) + "\n", "p.yaml"),
                    Catch::Contains("p.yaml:6: field 'prefill_batches_per_step' must be in [0, " +
                                    std::to_string(batches) + "]"));
  CHECK_THROWS_WITH(parse_policy(base + "activations: {gpu: 100}\nprefill_batches_per_step: -1\n", "p.yaml"),
                    Catch::Contains("field 'prefill_batches_per_step' must be in [0,"));
  CHECK_THROWS_WITH(parse_policy("weights: [1, 2\n", "p.yaml"), Catch::Contains("invalid YAML"));
  CHECK_THROWS_WITH(load_policy("/nonexistent.yaml"), Catch::Contains("cannot open policy file"));
}
