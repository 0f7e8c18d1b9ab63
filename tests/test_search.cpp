// The policy search: the LP against a brute-force grid over the nine fractions, the constraints
// of every returned policy, and the diagnosis when nothing fits.
#include "test_paths.h"
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli_support.h"
#include "strata/core/error.h"
#include "strata/policy/search.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {

HardwareProfile machine() {
  HardwareProfile hw;
  hw.name = "test";
  hw.gpu_mem = 16e9;
  hw.cpu_mem = 64e9;
  hw.disk_mem = 1e12;
  hw.cpu_to_gpu_bw = 12e9;
  hw.gpu_to_cpu_bw = 12e9;
  hw.disk_to_cpu_bw = 2e9;
  hw.cpu_to_disk_bw = 1e9;
  hw.gpu_gemm = {{1, 0.3e12}, {16, 4e12}, {256, 18e12}, {2048, 20e12}};
  hw.gpu_attention_bw = 250e9;
  hw.cpu_attention_bw = 12e9;
  hw.cpu_flops = 1e12;
  hw.gpu_dequant_bw = 25e9;
  return hw;
}

Policy shape(int gbs, int ngb, bool cpu_attention, bool overlap = true) {
  Policy p;
  p.gpu_batch_size = gbs;
  p.num_gpu_batches = ngb;
  p.cpu_attention = cpu_attention;
  p.overlap = overlap;
  return p;
}

double block_time(const CostForms& F, const Fractions& x) { return predict(F, x).total_s; }

bool within(const CostForms& F, const Fractions& x, const TierBytes& budget, std::optional<double> max_latency) {
  return fits(predict(F, x), budget, max_latency);
}

// The best T over the grid of fractions in steps of `step`, each class summing to 1.
double grid_best(const CostForms& F, const TierBytes& budget, std::optional<double> max_latency, double step) {
  const int k = int(std::lround(1 / step));
  std::vector<std::array<double, 3>> splits;
  for (int g = 0; g <= k; ++g)
    for (int c = 0; g + c <= k; ++c) splits.push_back({g * step, c * step, (k - g - c) * step});
  double best = INFINITY;
  for (const auto& w : splits)
    for (const auto& c : splits)
      for (const auto& a : splits) {
        const Fractions x = {w[0], w[1], w[2], c[0], c[1], c[2], a[0], a[1], a[2]};
        if (within(F, x, budget, max_latency)) best = std::min(best, block_time(F, x));
      }
  return best;
}

// How much T can change when every fraction moves by at most `step`: each term by at most
// step * (sum of its |coefficients|).
double lipschitz_bound(const CostForms& F, double step) {
  auto worst = [&](const std::array<LinearForm, kNumTerms>& forms) {
    double w = 0, sum = 0;
    for (const LinearForm& f : forms) {
      double s = 0;
      for (double c : f.coef) s += std::fabs(c);
      w = std::max(w, s);
      sum += s;
    }
    return (F.overlap ? std::min(w + F.overlap_slowdown * sum, sum) : sum) * step;
  };
  return F.n_layers * worst(F.prefill) + (F.gen_len - 1) * F.n_layers * worst(F.decode);
}

struct Instance {
  const char* name;
  const char* model;
  Policy shape;
  Workload w;
  TierBytes budget;
  std::optional<double> max_latency;
};

}  // namespace

TEST_CASE("the LP's optimum equals a brute-force grid over the fractions, within the grid's step", "[search]") {
  const HardwareProfile hw = machine();
  // Small models and budgets that bind: the GPU, the CPU, overlap off, CPU attention, a latency bound.
  const std::vector<Instance> cases = {
      {"gpu binds", "opt-1.3b", shape(16, 4, false), {128, 16}, {2.5e9, 64e9, 1e12}, {}},
      {"cpu and gpu bind", "opt-1.3b", shape(8, 8, false), {256, 16}, {1.5e9, 2.5e9, 1e12}, {}},
      {"no overlap", "opt-1.3b", shape(8, 4, false, false), {128, 8}, {2e9, 3e9, 1e12}, {}},
      {"cpu attention", "opt-1.3b", shape(32, 4, true), {256, 32}, {2e9, 20e9, 1e12}, {}},
      {"disk binds", "opt-125m", shape(16, 8, false), {256, 32}, {0.3e9, 0.35e9, 1e12}, {}},
      {"no disk", "opt-1.3b", shape(4, 2, true), {512, 8}, {1.2e9, 3e9, 0}, {}},
  };
  for (const Instance& in : cases) {
    SECTION(in.name) {
      const CostForms F = cost_forms(*config_preset(in.model), in.shape, in.w, hw);
      const LpSolution lp = solve_placement_lp(F, in.budget, in.max_latency);
      REQUIRE(lp.feasible);
      CHECK(lp.total_s == Approx(block_time(F, lp.x)).epsilon(1e-6));
      CHECK(within(F, lp.x, in.budget, in.max_latency));
      for (int cls = 0; cls < 3; ++cls) CHECK(lp.x[3 * cls] + lp.x[3 * cls + 1] + lp.x[3 * cls + 2] == Approx(1.0));
      const double step = 0.1;
      const double grid = grid_best(F, in.budget, in.max_latency, step);
      REQUIRE(std::isfinite(grid));
      INFO("LP T = " << lp.total_s << " s, grid T = " << grid << " s");
      // No grid point beats the LP, and the grid comes within what one step can change (a bound
      // from the coefficients, and relatively: the instances here are within 7%, under one step).
      CHECK(lp.total_s <= grid * (1 + 1e-9));
      CHECK(grid - lp.total_s <= 2 * lipschitz_bound(F, step));
      CHECK(grid <= lp.total_s * (1 + step));
    }
  }
}

TEST_CASE("with a calibrated overlap shortfall and overhead the LP still equals the brute-force grid", "[search]") {
  HardwareProfile hw = machine();
  hw.overlap_slowdown = 0.4;       // stage = max + 0.4 (sum - max): no longer the max of the terms
  hw.compute_overhead_s = 2e-4;    // per layer and unit of work
  const std::vector<Instance> cases = {
      {"gpu binds", "opt-1.3b", shape(16, 4, false), {128, 16}, {2.5e9, 64e9, 1e12}, {}},
      {"cpu attention", "opt-1.3b", shape(32, 4, true), {256, 32}, {2e9, 20e9, 1e12}, {}},
      {"disk binds", "opt-125m", shape(16, 8, false), {256, 32}, {0.3e9, 0.35e9, 1e12}, {}},
  };
  for (const Instance& in : cases) {
    SECTION(in.name) {
      const CostForms F = cost_forms(*config_preset(in.model), in.shape, in.w, hw);
      const LpSolution lp = solve_placement_lp(F, in.budget, in.max_latency);
      REQUIRE(lp.feasible);
      CHECK(lp.total_s == Approx(block_time(F, lp.x)).epsilon(1e-6));
      const double step = 0.1;
      const double grid = grid_best(F, in.budget, in.max_latency, step);
      REQUIRE(std::isfinite(grid));
      INFO("LP T = " << lp.total_s << " s, grid T = " << grid << " s");
      CHECK(lp.total_s <= grid * (1 + 1e-9));
      CHECK(grid - lp.total_s <= 2 * lipschitz_bound(F, step));
    }
  }
}

TEST_CASE("an LP with nothing that fits is infeasible", "[search]") {
  const CostForms F = cost_forms(*config_preset("opt-1.3b"), shape(8, 1, false), {128, 8}, machine());
  CHECK_FALSE(solve_placement_lp(F, {1e6, 64e9, 1e12}, {}).feasible);  // global weights alone exceed 1 MB
  CHECK_FALSE(solve_placement_lp(F, {16e9, 64e9, 1e12}, 1e-3).feasible);
}

TEST_CASE("no returned policy violates a constraint", "[search]") {
  const HardwareProfile hw = machine();
  struct Case {
    const char* model;
    Workload w;
    TierBytes budget;
    bool compress;
    std::optional<double> max_latency;
  };
  const std::vector<Case> cases = {
      {"opt-6.7b", {512, 32}, {16e9, 64e9, 1e12}, false, {}},
      {"opt-6.7b", {256, 16}, {4e9, 8e9, 200e9}, true, {}},
      {"opt-13b", {512, 32}, {8e9, 16e9, 1e12}, false, 2000.0},
      {"opt-1.3b", {128, 64}, {1e9, 2e9, 0}, false, {}},
      {"llama-3-8b", {512, 32}, {12e9, 32e9, 1e12}, true, {}},
  };
  for (const Case& c : cases) {
    const ModelConfig cfg = *config_preset(c.model);
    SearchOptions opts;
    opts.workload = c.w;
    opts.budget = c.budget;
    opts.allow_compression = c.compress;
    opts.max_latency_s = c.max_latency;
    opts.keep = 8;
    const SearchResult r = search_policy(cfg, hw, opts);
    INFO(c.model << " budget gpu " << c.budget.gpu);
    REQUIRE_FALSE(r.ranked.empty());
    CHECK(r.lps_solved > 0);
    for (size_t i = 0; i < r.ranked.size(); ++i) {
      const Candidate& k = r.ranked[i];
      if (i > 0) CHECK(k.prediction.throughput_tok_s <= r.ranked[i - 1].prediction.throughput_tok_s);
      // The prediction is that of the policy as the runtime realizes it.
      const Prediction again = evaluate(cfg, k.policy, c.w, hw);
      CHECK(again.total_s == Approx(k.prediction.total_s));
      CHECK(fits(again, c.budget, c.max_latency));
      if (k.plan_peak) {
        const PlacementPlan plan = plan_placement(cfg, k.policy, PlanShape{c.w.prompt_len, c.w.gen_len}, DType::F16);
        for (Tier t : {Tier::Gpu, Tier::Cpu, Tier::Disk}) CHECK(plan.peak().at(t) <= c.budget.at(t));
      } else {
        CHECK((k.policy.compress_weights || k.policy.compress_kv_cache));
      }
      if (!c.compress) CHECK_FALSE((k.policy.compress_weights || k.policy.compress_kv_cache));
      // A policy file that loads back to the same policy.
      const Policy back = parse_policy(policy_to_yaml(k.policy));
      CHECK(back.gpu_batch_size == k.policy.gpu_batch_size);
      CHECK(back.num_gpu_batches == k.policy.num_gpu_batches);
      CHECK(back.weights.gpu == k.policy.weights.gpu);
      CHECK(back.kv_cache.disk == k.policy.kv_cache.disk);
      CHECK(back.activations.cpu == k.policy.activations.cpu);
      CHECK(back.cpu_attention == k.policy.cpu_attention);
    }
  }
}

TEST_CASE("a tight latency bound trades throughput for latency", "[search]") {
  const HardwareProfile hw = machine();
  const ModelConfig cfg = *config_preset("opt-6.7b");
  SearchOptions opts;
  opts.budget = {16e9, 64e9, 1e12};
  const SearchResult free = search_policy(cfg, hw, opts);
  const double bound = free.ranked[0].prediction.latency_s / 1.5;
  opts.max_latency_s = bound;
  const SearchResult tight = search_policy(cfg, hw, opts);
  for (const Candidate& c : tight.ranked) CHECK(c.prediction.latency_s <= bound * (1 + 1e-9));
  CHECK(tight.ranked[0].prediction.throughput_tok_s <= free.ranked[0].prediction.throughput_tok_s);
}

TEST_CASE("budgets that nothing fits name the binding tier", "[search]") {
  const HardwareProfile hw = machine();
  SearchOptions opts;
  // The embeddings alone exceed 64 MB of GPU memory.
  opts.budget = {64e6, 64e9, 1e12};
  CHECK_THROWS_WITH(search_policy(*config_preset("opt-1.3b"), hw, opts),
                    Catch::Contains("no policy fits") && Catch::Contains("the gpu tier is the binding one"));
  // OPT-30B's 60 GB of weights: 15 GB of GPU and 10 GB of CPU memory, no disk.
  opts.budget = {15e9, 10e9, 0};
  CHECK_THROWS_WITH(search_policy(*config_preset("opt-30b"), hw, opts),
                    Catch::Contains("no policy fits") && Catch::Contains("the disk tier is the binding one"));
  // With a disk, 1 GB of CPU memory cannot stage the layers read from it.
  opts.budget = {4e9, 1e9, 1e12};
  CHECK_THROWS_WITH(search_policy(*config_preset("opt-30b"), hw, opts),
                    Catch::Contains("no policy fits") && Catch::Contains("binding one"));
  // Enough memory, but no block finishes within a millisecond.
  opts.budget = {16e9, 64e9, 1e12};
  opts.max_latency_s = 1e-3;
  CHECK_THROWS_WITH(search_policy(*config_preset("opt-1.3b"), hw, opts), Catch::Contains("latency bound"));
}

TEST_CASE("whole-percent splits express every layer count of up to 100 layers", "[search]") {
  for (int n : {1, 3, 7, 32, 48, 96, 100}) {
    for (int g = 0; g <= n; ++g)
      for (int c = 0; g + c <= n; ++c) {
        const auto s = split_for_layers(n, g, c);
        REQUIRE(s.has_value());
        CHECK(s->gpu + s->cpu + s->disk == 100);
        int count[3] = {0, 0, 0};
        for (Tier t : assign_tiers(n, *s)) ++count[int(t)];
        CHECK(count[0] == g);
        CHECK(count[1] == c);
      }
  }
}

namespace {

using strata::test::CliResult;
CliResult strata_cli(const std::string& args) { return strata::test::run_strata(args); }

const std::string kPaperMachine = std::string(STRATA_FIXTURES_DIR) + "/../../policies/hardware/t4-paper.yaml";

}  // namespace

TEST_CASE("strata policy prints the chosen policy as JSON and writes it as YAML", "[search]") {
  const fs::path dir = fs::temp_directory_path() / ("strata_policy_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string out = (dir / "chosen.yaml").string();
  const std::string base = "policy --model opt-6.7b --hardware " + kPaperMachine + " --prompt-len 512 --gen-len 32";
  const CliResult r = strata_cli(base + " --json --out " + out);
  REQUIRE(r.code == 0);
  const nlohmann::json j = nlohmann::json::parse(r.output);
  CHECK(j["policy"]["gpu_batch_size"].get<int>() >= 1);
  CHECK(j["predicted"]["throughput_tok_s"].get<double>() > 0);
  CHECK(j["predicted"]["latency_s"].get<double>() > 0);
  for (const char* tier : {"gpu", "cpu", "disk"})
    CHECK(j["predicted"]["peak_bytes"][tier].get<double>() <= j["budget_bytes"][tier].get<double>());
  CHECK(j["fits"].get<bool>());
  CHECK_FALSE(j["candidates"].empty());
  // The file loads back to the policy printed, and --evaluate predicts what the search did.
  const Policy p = load_policy(out);
  CHECK(p.gpu_batch_size == j["policy"]["gpu_batch_size"].get<int>());
  CHECK(p.num_gpu_batches == j["policy"]["num_gpu_batches"].get<int>());
  CHECK(p.weights.gpu == j["policy"]["weights"]["gpu"].get<int>());
  CHECK(p.kv_cache.cpu == j["policy"]["kv_cache"]["cpu"].get<int>());
  const CliResult e = strata_cli(base + " --json --evaluate " + out);
  REQUIRE(e.code == 0);
  const nlohmann::json ej = nlohmann::json::parse(e.output);
  CHECK(ej["predicted"]["throughput_tok_s"].get<double>() ==
        Approx(j["predicted"]["throughput_tok_s"].get<double>()));
  CHECK(ej.find("candidates") == ej.end());

  const CliResult text = strata_cli(base);
  CHECK(text.code == 0);
  CHECK_THAT(text.output, Catch::Contains("chosen policy") && Catch::Contains("best candidates"));
  // A model directory works as well as a preset name.
  const CliResult d = strata_cli("policy --model " + std::string(STRATA_FIXTURES_DIR) + "/models/tiny-opt --hardware " +
                                 kPaperMachine + " --prompt-len 16 --gen-len 8 --json");
  CHECK(d.code == 0);
  fs::remove_all(dir);
}

TEST_CASE("strata policy explains what does not fit", "[search]") {
  const CliResult r = strata_cli("policy --model opt-6.7b --hardware " + kPaperMachine + " --gpu-mem 1MB");
  CHECK(r.code == 1);
  CHECK_THAT(r.output, Catch::Contains("no policy fits") && Catch::Contains("gpu tier"));
  const CliResult m = strata_cli("policy --model no-such-model --hardware " + kPaperMachine);
  CHECK(m.code == 1);
  CHECK_THAT(m.output, Catch::Contains("not a preset"));
}
