// The policy search: the LP against a brute-force grid over the nine fractions (twelve with a
// mixture of experts' MLP halves placed apart), the constraints of every returned policy, and the
// diagnosis when nothing fits.
#include "test_paths.h"
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <set>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_support.h"
#include "policy_fixtures.h"
#include "strata/core/error.h"
#include "strata/policy/search.h"
#include "temp_files.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {

HardwareProfile machine() { return test::gpu16_machine(); }

// A batch shape, every tensor class left all on the GPU (the search chooses the splits).
Policy shape(int gbs, int ngb, bool cpu_attention, bool overlap = true) {
  return test::policy_of(gbs, ngb, {}, {}, {}, cpu_attention, overlap);
}

double block_time(const CostForms& F, const Fractions& x) { return predict(F, x).total_s; }

bool within(const CostForms& F, const Fractions& x, const TierBytes& budget, std::optional<double> max_latency) {
  return fits(predict(F, x), budget, max_latency);
}

// Grid steps per class: weights, KV cache, activations, and the MLP halves placed apart.
using ClassSteps = std::array<double, 4>;

// One class's splits in steps of `step`, summing to 1.
std::vector<std::array<double, 3>> class_grid(double step) {
  const int k = int(std::lround(1 / step));
  std::vector<std::array<double, 3>> splits;
  for (int g = 0; g <= k; ++g)
    for (int c = 0; g + c <= k; ++c) splits.push_back({g * step, c * step, (k - g - c) * step});
  return splits;
}

// The best T over the grid of fractions, each class summing to 1. The MLP halves' class is
// gridded only where the forms leave it free (ExpertSplit::Free).
double grid_best(const CostForms& F, const TierBytes& budget, std::optional<double> max_latency,
                 const ClassSteps& steps) {
  const std::vector<std::array<double, 3>> ws = class_grid(steps[0]), cs = class_grid(steps[1]),
                                           hs = class_grid(steps[2]);
  const std::vector<std::array<double, 3>> ms =
      F.experts_free ? class_grid(steps[3]) : std::vector<std::array<double, 3>>{{0, 0, 0}};
  double best = INFINITY;
  for (const auto& w : ws)
    for (const auto& c : cs)
      for (const auto& a : hs)
        for (const auto& m : ms) {
          const Fractions x = {w[0], w[1], w[2], c[0], c[1], c[2], a[0], a[1], a[2], m[0], m[1], m[2]};
          if (within(F, x, budget, max_latency)) best = std::min(best, block_time(F, x));
        }
  return best;
}

// How much T can change when every fraction moves by at most its class's step: each term by at
// most the sum of |coefficient| * step, the compute pipeline of COMP and CATT by at most their sum.
double lipschitz_bound(const CostForms& F, const ClassSteps& steps) {
  auto worst = [&](const std::array<LinearForm, kNumTerms>& forms) {
    std::array<double, kNumTerms> s{};
    for (int t = 0; t < kNumTerms; ++t)
      for (int v = 0; v < kNumVars; ++v) s[size_t(t)] += std::fabs(forms[size_t(t)].coef[v]) * steps[size_t(v / 3)];
    const double w = std::max({s[CTOG], s[GTOC], s[DTOC], s[CTOD], s[COMP] + s[CATT]});
    double sum = 0;
    for (double v : s) sum += v;
    return F.overlap ? std::min(w + F.overlap_slowdown * sum, sum) : sum;
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

// The LP's optimum against a brute-force grid: no grid point beats it, and the grid comes within
// what one step can change (a bound from the coefficients, and relatively: the instances here are
// within 10%, under one step). With ExpertSplit::Free the grid takes the MLP halves' fractions
// too, in steps of 0.1 like the weights', and the KV cache's and activations' in steps of 0.25
// (four classes at 0.1 would take minutes); the bounds then take each class's step, and the
// relative one the coarsest.
LpSolution check_lp_against_grid(const Instance& in, const HardwareProfile& hw,
                                 ExpertSplit experts = ExpertSplit::Fixed) {
  const CostForms F = cost_forms(*config_preset(in.model), in.shape, in.w, hw, experts);
  const LpSolution lp = solve_placement_lp(F, in.budget, in.max_latency);
  REQUIRE(lp.feasible);
  CHECK(lp.total_s == Approx(block_time(F, lp.x)).epsilon(1e-6));
  CHECK(within(F, lp.x, in.budget, in.max_latency));
  for (int cls = 0; cls < (F.experts_free ? 4 : 3); ++cls)
    CHECK(lp.x[3 * cls] + lp.x[3 * cls + 1] + lp.x[3 * cls + 2] == Approx(1.0));
  const double step = 0.1;
  const ClassSteps steps = F.experts_free ? ClassSteps{step, 0.25, 0.25, step} : ClassSteps{step, step, step, step};
  const double grid = grid_best(F, in.budget, in.max_latency, steps);
  REQUIRE(std::isfinite(grid));
  INFO("LP T = " << lp.total_s << " s, grid T = " << grid << " s");
  CHECK(lp.total_s <= grid * (1 + 1e-9));
  CHECK(grid - lp.total_s <= 2 * lipschitz_bound(F, steps));
  CHECK(grid <= lp.total_s * (1 + *std::max_element(steps.begin(), steps.end())));
  return lp;
}

}  // namespace

TEST_CASE("the LP's optimum equals a brute-force grid over the fractions, within the grid's step", "[search]") {
  const HardwareProfile hw = machine();
  // Small models and budgets that bind: the GPU, the CPU, overlap off, CPU attention, a latency bound.
  const std::vector<Instance> cases = {
      {"gpu binds", "opt-1.3b", shape(16, 4, false), {128, 16}, {2.5e9, 64e9, 1e12}, {}},
      {"cpu and gpu bind", "opt-1.3b", shape(8, 8, false), {256, 16}, {1.5e9, 2.5e9, 1e12}, {}},
      {"no overlap", "opt-1.3b", shape(8, 4, false, false), {128, 8}, {2e9, 3e9, 1e12}, {}},
      {"cpu attention", "opt-1.3b", shape(32, 4, true), {256, 32}, {2e9, 20e9, 1e12}, {}},
      // The CPU attention outweighs the GPU's work: the pipeline's second piece bounds decode.
      {"cpu attention pipeline", "opt-1.3b", shape(8, 8, true), {512, 32}, {2e9, 20e9, 1e12}, {}},
      {"disk binds", "opt-125m", shape(16, 8, false), {256, 32}, {0.3e9, 0.35e9, 1e12}, {}},
      {"no disk", "opt-1.3b", shape(4, 2, true), {512, 8}, {1.2e9, 3e9, 0}, {}},
  };
  for (const Instance& in : cases)
    SECTION(in.name) { check_lp_against_grid(in, hw); }
}

TEST_CASE("with a calibrated overlap shortfall and overhead the LP still equals the brute-force grid", "[search]") {
  HardwareProfile hw = machine();
  hw.overlap_slowdown = 0.4;       // stage = max + 0.4 (sum - max): no longer the max of the terms
  hw.compute_overhead_s = 2e-4;    // per layer and unit of work
  const std::vector<Instance> cases = {
      {"gpu binds", "opt-1.3b", shape(16, 4, false), {128, 16}, {2.5e9, 64e9, 1e12}, {}},
      {"cpu attention", "opt-1.3b", shape(32, 4, true), {256, 32}, {2e9, 20e9, 1e12}, {}},
      {"cpu attention pipeline", "opt-1.3b", shape(8, 8, true), {512, 32}, {2e9, 20e9, 1e12}, {}},
      {"disk binds", "opt-125m", shape(16, 8, false), {256, 32}, {0.3e9, 0.35e9, 1e12}, {}},
  };
  for (const Instance& in : cases)
    SECTION(in.name) { check_lp_against_grid(in, hw); }
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
      CHECK_FALSE(k.policy.expert_weights);  // dense: nothing to place apart
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

// A candidate with only what the frontier looks at.
Candidate point(double latency_s, double throughput) {
  Candidate c;
  c.prediction.latency_s = latency_s;
  c.prediction.throughput_tok_s = throughput;
  return c;
}

// The frontier's rows against brute force over the candidates: each row's choice is within its
// bound and no candidate within the bound has a higher throughput; throughput never falls as the
// bound loosens.
void check_points(const std::vector<Candidate>& cands, const std::vector<ParetoPoint>& pts) {
  double last = 0;
  for (const ParetoPoint& pt : pts) {
    INFO("bound " << pt.max_latency_s);
    double brute = 0;
    bool any = false;
    for (const Candidate& c : cands)
      if (c.prediction.latency_s <= pt.max_latency_s * (1 + 1e-9)) {
        any = true;
        brute = std::max(brute, c.prediction.throughput_tok_s);
      }
    REQUIRE(pt.best.has_value() == any);
    if (!any) continue;
    CHECK(pt.best->prediction.latency_s <= pt.max_latency_s * (1 + 1e-9));
    CHECK(pt.best->prediction.throughput_tok_s == Approx(brute).epsilon(1e-9));
    CHECK(pt.best->prediction.throughput_tok_s >= last * (1 - 1e-9));
    last = pt.best->prediction.throughput_tok_s;
  }
}

}  // namespace

TEST_CASE("pareto rows are the best candidate within each bound, brute force over a small set", "[search][pareto]") {
  // Latency and throughput in a fixed pseudo-random spread, with ties on both.
  std::vector<Candidate> cands;
  uint32_t state = 12345;
  auto next = [&] { return (state = state * 1664525u + 1013904223u) >> 16; };
  for (int i = 0; i < 40; ++i) {
    const double latency = 1 + (next() % 997) / 10.0;
    cands.push_back(point(latency, 1 + next() % 49));
  }
  cands.push_back(point(60, 50));  // the best, twice, and as good but slower
  cands.push_back(point(60, 50));
  cands.push_back(point(80, 50));
  const std::vector<double> sweep = latency_sweep(cands, 15);
  REQUIRE(sweep.size() == 15);
  double lo = 1e300;
  for (const Candidate& c : cands) lo = std::min(lo, c.prediction.latency_s);
  CHECK(sweep.front() == Approx(lo));  // from the fastest candidate to the best one (latency 60)
  CHECK(sweep.back() == 60);
  for (size_t i = 1; i < sweep.size(); ++i) CHECK(sweep[i] > sweep[i - 1]);
  std::vector<double> bounds = sweep;
  for (double b : {0.5, 3.0, 60.0, 50.5, 1e9}) bounds.push_back(b);  // below all, exact hits, above all
  std::sort(bounds.begin(), bounds.end());
  const std::vector<ParetoPoint> pts = pareto_points(cands, bounds);
  REQUIRE(pts.size() == bounds.size());
  check_points(cands, pts);
  CHECK_FALSE(pts.front().best.has_value());  // 0.5 s: nothing is that fast
  // The loosest sweep bound admits every candidate: its row is the overall best.
  const ParetoPoint& loosest = pareto_points(cands, {sweep.back()}).front();
  REQUIRE(loosest.best.has_value());
  CHECK(loosest.best->prediction.throughput_tok_s == 50);
  CHECK(loosest.best->prediction.latency_s == 60);
  // Of equal throughputs, the lower latency, however loose the bound.
  CHECK(pts.back().best->prediction.latency_s == 60);

  // The frontier: strictly better throughput with each step in latency, and no candidate
  // dominates a point of it.
  const std::vector<Candidate> front = pareto_frontier(cands);
  REQUIRE_FALSE(front.empty());
  for (size_t i = 1; i < front.size(); ++i) {
    CHECK(front[i].prediction.latency_s > front[i - 1].prediction.latency_s);
    CHECK(front[i].prediction.throughput_tok_s > front[i - 1].prediction.throughput_tok_s);
  }
  for (const Candidate& f : front)
    for (const Candidate& c : cands)
      CHECK_FALSE((c.prediction.latency_s <= f.prediction.latency_s &&
                   c.prediction.throughput_tok_s > f.prediction.throughput_tok_s));
  // Every row's choice is on the frontier.
  for (const ParetoPoint& pt : pts)
    if (pt.best)
      CHECK(std::any_of(front.begin(), front.end(), [&](const Candidate& f) {
        return f.prediction.latency_s == pt.best->prediction.latency_s &&
               f.prediction.throughput_tok_s == pt.best->prediction.throughput_tok_s;
      }));
  CHECK(latency_sweep({}, 5).empty());
  CHECK(latency_sweep({point(3, 1), point(3, 2)}, 5) == std::vector<double>{3.0});
}

TEST_CASE("the search's frontier agrees with the search under each latency bound", "[search][pareto]") {
  const HardwareProfile hw = machine();
  for (const char* model : {"opt-1.3b", "opt-6.7b"}) {
    INFO(model);
    const ModelConfig cfg = *config_preset(model);
    SearchOptions opts;
    opts.workload = {256, 16};
    opts.budget = {4e9, 16e9, 1e12};
    int lps = 0;
    const std::vector<Candidate> cands = search_candidates(cfg, hw, opts, &lps);
    CHECK(lps > 0);
    REQUIRE(cands.size() > 1);
    for (const Candidate& c : cands) CHECK(fits(c.prediction, opts.budget, std::nullopt));
    // search_candidates ranks as search_policy does: the same best.
    CHECK(cands.front().prediction.throughput_tok_s ==
          Approx(search_policy(cfg, hw, opts).ranked.front().prediction.throughput_tok_s));
    const std::vector<ParetoPoint> pts = pareto_points(cands, latency_sweep(cands, 8));
    check_points(cands, pts);
    // Each row is what the search itself picks under that bound (one LP per shape with the bound
    // as a constraint): the per-shape optimum minimizes latency and maximizes throughput at once.
    for (const ParetoPoint& pt : pts) {
      REQUIRE(pt.best.has_value());
      opts.max_latency_s = pt.max_latency_s;
      const SearchResult bounded = search_policy(cfg, hw, opts);
      INFO("bound " << pt.max_latency_s);
      CHECK(pt.best->prediction.throughput_tok_s ==
            Approx(bounded.ranked.front().prediction.throughput_tok_s).epsilon(1e-6));
      opts.max_latency_s.reset();
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
  // The paper's machine is bare rates: the prediction says so. A calibrated profile names its fit.
  CHECK(j["hardware_calibrated"] == false);
  CHECK_THAT(text.output, Catch::Contains("is not calibrated (bare rates only)"));
  const fs::path fitted = dir / "fitted.yaml";
  {
    std::ifstream in(kPaperMachine);
    std::ofstream(fitted) << in.rdbuf() << "calibrated: \"a test's fit over 3 runs\"\n";
  }
  const std::string fitted_base = "policy --model opt-6.7b --hardware " + fitted.string() + " --prompt-len 512 --gen-len 32";
  const CliResult fj = strata_cli(fitted_base + " --json");
  REQUIRE(fj.code == 0);
  CHECK(nlohmann::json::parse(fj.output)["hardware_calibrated"] == "a test's fit over 3 runs");
  CHECK_THAT(strata_cli(fitted_base).output, !Catch::Contains("is not calibrated"));
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

// Issue 10 point 5: on the paper's machine the search finds, for the paper's flagship rows, a policy
// that Strata's runtime can hold and that the model predicts at least as fast as FlexGen measured
// (paper Table 2, prompt 512, generation 32; uncompressed).
TEST_CASE("on the FlexGen paper's machine the search's choice is predicted at least as fast as FlexGen measured",
          "[search]") {
  const HardwareProfile hw = load_hardware_profile(kPaperMachine);
  struct Row {
    const char* model;
    double paper_tok_s;
  };
  for (const Row& row : {Row{"opt-30b", 7.32}, Row{"opt-175b", 0.69}}) {
    const ModelConfig cfg = *config_preset(row.model);
    SearchOptions opts;
    opts.workload = {512, 32};
    opts.budget = {hw.gpu_mem, hw.cpu_mem, hw.disk_mem};
    const SearchResult r = search_policy(cfg, hw, opts);
    REQUIRE_FALSE(r.ranked.empty());
    const Candidate& best = r.ranked.front();
    INFO(row.model << ": " << policy_to_yaml(best.policy));
    CHECK(best.prediction.throughput_tok_s >= row.paper_tok_s);
    REQUIRE(best.plan_peak);  // the runtime's own plan, uncompressed
    for (Tier t : {Tier::Gpu, Tier::Cpu, Tier::Disk}) CHECK(best.plan_peak->at(t) <= opts.budget.at(t));
  }
}

TEST_CASE("strata policy pareto prints the frontier as a table and as JSON", "[search][pareto]") {
  const fs::path dir = fs::temp_directory_path() / ("strata_pareto_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string file = (dir / "pareto.json").string();
  const std::string base =
      "policy --model opt-6.7b --hardware " + kPaperMachine + " --prompt-len 512 --gen-len 32 --pareto";
  const CliResult r = strata_cli(base + " --pareto-points 6 --json-file " + file);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("bound_s") && Catch::Contains("frontier:") && Catch::Contains("wrote "));
  std::ifstream in(file);
  const nlohmann::json j = nlohmann::json::parse(in);
  REQUIRE(j["points"].size() == 6);
  double last = 0;
  for (const auto& pt : j["points"]) {
    REQUIRE_FALSE(pt["policy"].is_null());  // the default sweep starts at the fastest candidate
    CHECK(pt["latency_s"].get<double>() <= pt["max_latency_s"].get<double>() * (1 + 1e-9));
    CHECK(pt["throughput_tok_s"].get<double>() >= last);
    last = pt["throughput_tok_s"].get<double>();
  }
  REQUIRE_FALSE(j["frontier"].empty());
  CHECK(j["search"]["candidates"].get<int>() >= int(j["frontier"].size()));
  // The loosest bound's row is the search's own choice.
  const nlohmann::json best = nlohmann::json::parse(strata_cli(base.substr(0, base.size() - 9) + " --json").output);
  CHECK(last == Approx(best["predicted"]["throughput_tok_s"].get<double>()));

  // Given bounds, as JSON on stdout; one below every candidate's latency fits nothing.
  const CliResult b = strata_cli(base + " --latency-bounds 0.001,100,1000 --json");
  REQUIRE(b.code == 0);
  const nlohmann::json bj = nlohmann::json::parse(b.output);
  REQUIRE(bj["points"].size() == 3);
  CHECK(bj["points"][0]["policy"].is_null());
  CHECK(bj["points"][2]["throughput_tok_s"].get<double>() >= bj["points"][1]["throughput_tok_s"].get<double>());
  CHECK(strata_cli(base + " --max-latency 10").code == 1);
  CHECK(strata_cli("policy --model opt-6.7b --hardware " + kPaperMachine + " --latency-bounds 5").code == 1);
  fs::remove_all(dir);
}

// OPT-175B with its cache on disk decodes bound by the disk, the GPU mostly idle: starting GPU
// batches later hides their prefill under the first batches' decode (docs/cost-model.md,
// "Staggered prefill"). The search's choice is at least as fast as its placement unstaggered, and
// no other stagger of that placement is faster.
TEST_CASE("on the paper's machine the search staggers OPT-175B's prefill, and no stagger of its placement beats it",
          "[search]") {
  const HardwareProfile hw = load_hardware_profile(kPaperMachine);
  const ModelConfig cfg = *config_preset("opt-175b");
  SearchOptions opts;
  opts.workload = {512, 32};
  opts.budget = {hw.gpu_mem, hw.cpu_mem, hw.disk_mem};
  const Candidate best = search_policy(cfg, hw, opts).ranked.front();
  INFO(policy_to_yaml(best.policy));
  CHECK(best.policy.prefill_batches_per_step > 0);
  CHECK(best.policy.prefill_batches_per_step < best.policy.num_gpu_batches);
  CHECK(evaluate(cfg, best.policy, opts.workload, hw).throughput_tok_s == Approx(best.prediction.throughput_tok_s));
  Policy p = best.policy;
  for (int per_step = 0; per_step < p.num_gpu_batches; ++per_step) {
    p.prefill_batches_per_step = per_step;
    INFO("prefill_batches_per_step " << per_step);
    CHECK(evaluate(cfg, p, opts.workload, hw).throughput_tok_s <= best.prediction.throughput_tok_s * (1 + 1e-12));
  }
  p.prefill_batches_per_step = 0;
  CHECK(best.prediction.throughput_tok_s > evaluate(cfg, p, opts.workload, hw).throughput_tok_s);
}

TEST_CASE("a staggered choice survives strata policy --out and --evaluate", "[search]") {
  const fs::path dir = test::temp_dir("stagger");
  const std::string out = (dir / "chosen.yaml").string();
  const std::string base = "policy --model opt-175b --hardware " + kPaperMachine + " --prompt-len 512 --gen-len 32";
  const CliResult r = strata_cli(base + " --json --out " + out);
  REQUIRE(r.code == 0);
  const nlohmann::json j = nlohmann::json::parse(r.output);
  const int per_step = j["policy"]["prefill_batches_per_step"].get<int>();
  CHECK(per_step > 0);
  CHECK(load_policy(out).prefill_batches_per_step == per_step);
  const CliResult e = strata_cli(base + " --json --evaluate " + out);
  REQUIRE(e.code == 0);
  const nlohmann::json ej = nlohmann::json::parse(e.output);
  CHECK(ej["policy"]["prefill_batches_per_step"].get<int>() == per_step);
  for (const char* field : {"throughput_tok_s", "latency_s", "prefill_s", "decode_s"})
    CHECK(ej["predicted"][field].get<double>() == Approx(j["predicted"][field].get<double>()).epsilon(1e-9));
  const CliResult text = strata_cli(base + " --evaluate " + out);
  CHECK(text.code == 0);
  CHECK_THAT(text.output, Catch::Contains("staggered    " + std::to_string(per_step) + " GPU batch") &&
                             Catch::Contains(" start per step over "));
  fs::remove_all(dir);
}

TEST_CASE("the search computes Mixtral's experts on the CPU in decode only, where that beats moving them",
          "[search][moe]") {
  // Mixtral-8x7B under 16 GB of GPU memory and a minute per block: most layers live on the CPU
  // tier and blocks are small. Moving a layer's 2.8 GB of experts over the 12 GB/s link costs
  // 235 ms per layer and step; a decode step's few tokens touch a few experts, which a CPU
  // streaming weights at 60 GB/s reads or computes sooner. A prefill step's thousands of tokens
  // touch every expert at 0.7 GFLOP each per layer, beyond the CPU's 1 TFLOP/s. So decode computes
  // them where they live and prefill moves them; with a slow CPU nothing is computed there.
  // (Without the latency bound the search picks blocks of 1600 sequences, whose decode steps
  // activate every expert for 160 tokens a GPU batch: moving them wins there, and it does.)
  const ModelConfig mx = *config_preset("mixtral-8x7b");
  SearchOptions opts;
  opts.workload = {512, 32};
  opts.budget = {16e9, 200e9, 1e12};
  opts.max_latency_s = 60;
  HardwareProfile hw = machine();
  hw.cpu_attention_bw = 60e9;
  const SearchResult fast = search_policy(mx, hw, opts);
  const Policy& best = fast.ranked.front().policy;
  INFO(policy_to_yaml(best));
  CHECK(best.weights.cpu > 0);
  CHECK(best.cpu_experts_decode);
  CHECK_FALSE(best.cpu_experts_prefill);
  // Brute force over the phases at the chosen placement: the choice is the fastest of the four.
  double fastest = 0;
  for (const bool prefill : {false, true})
    for (const bool decode : {false, true}) {
      Policy p = best;
      p.cpu_experts_prefill = prefill;
      p.cpu_experts_decode = decode;
      fastest = std::max(fastest, evaluate(mx, p, opts.workload, hw).throughput_tok_s);
    }
  CHECK(evaluate(mx, best, opts.workload, hw).throughput_tok_s == Approx(fastest).epsilon(1e-9));
  hw.cpu_attention_bw = 1e9;
  hw.cpu_flops = 1e10;
  opts.max_latency_s.reset();  // nothing meets it on this CPU
  const Policy& slow = search_policy(mx, hw, opts).ranked.front().policy;
  INFO(policy_to_yaml(slow));
  CHECK_FALSE(slow.cpu_experts_decode);
  CHECK_FALSE(slow.cpu_experts_prefill);
}

TEST_CASE("the LP with experts on the CPU equals a brute-force grid over the fractions", "[search][moe]") {
  // Experts on the CPU make the GPU's compute fall as the CPU tier's share of the weights grows
  // (a negative coefficient), and experts placed apart turn the MLP halves into constants: the
  // LP must still find the grid's optimum.
  const HardwareProfile hw = machine();
  Policy decode = shape(16, 4, false), both = shape(8, 2, true), apart = shape(16, 2, false);
  decode.cpu_experts_decode = true;
  both.cpu_experts_decode = both.cpu_experts_prefill = true;
  apart.expert_weights = TierSplit{0, 100, 0};  // the fractions place the attention halves alone
  apart.cpu_experts_decode = true;
  const std::vector<Instance> cases = {
      {"decode", "qwen3-30b-a3b", decode, {256, 16}, {16e9, 80e9, 1e12}, {}},
      {"both phases, cpu attention", "qwen3-30b-a3b", both, {128, 8}, {16e9, 80e9, 1e12}, {}},
      {"experts apart", "qwen3-30b-a3b", apart, {256, 16}, {4e9, 80e9, 1e12}, {}},
  };
  for (const Instance& in : cases)
    SECTION(in.name) { check_lp_against_grid(in, hw); }
}

TEST_CASE("the LP with the MLP halves as a second weight class equals a brute-force grid over both classes",
          "[search][moe]") {
  // Placed apart, the MLP halves' gpu, cpu and disk shares are LP variables beside the attention
  // halves': the grid tries every pair of splits of the two classes. Where GPU memory is short,
  // every optimum here gives the GPU a share of the MLP halves, a placement neither the tied
  // fractions nor every MLP half on the CPU can express.
  const HardwareProfile hw = machine();
  Policy decode = shape(16, 4, false), both = shape(8, 2, true);
  decode.cpu_experts_decode = true;
  both.cpu_experts_decode = both.cpu_experts_prefill = true;
  const std::vector<Instance> cases = {
      {"gpu binds", "qwen3-30b-a3b", shape(16, 2, false), {256, 16}, {16e9, 80e9, 1e12}, {}},
      {"experts on the CPU in decode", "qwen3-30b-a3b", decode, {256, 16}, {16e9, 80e9, 1e12}, {}},
      {"cpu and gpu bind", "qwen3-30b-a3b", shape(16, 2, false), {256, 16}, {8e9, 55e9, 1e12}, {}},
      {"both phases, cpu attention", "qwen3-30b-a3b", both, {128, 8}, {12e9, 80e9, 1e12}, {}},
      {"mixtral on 16 GB", "mixtral-8x7b", shape(8, 2, false), {256, 16}, {16e9, 200e9, 1e12}, {}},
  };
  for (const Instance& in : cases)
    SECTION(in.name) {
      const LpSolution lp = check_lp_against_grid(in, hw, ExpertSplit::Free);
      INFO("wg " << lp.x[WG] << " wc " << lp.x[WC] << " wd " << lp.x[WD] << ", mg " << lp.x[MG] << " mc " << lp.x[MC]
                 << " md " << lp.x[MD]);
      CHECK((lp.x[MG] > 0.01 && lp.x[MG] < 0.99));
    }
}

namespace {

// Whether the runtime's plan for `p` is within the budgets.
bool plan_fits(const ModelConfig& cfg, const Policy& p, const SearchOptions& opts, const HardwareProfile& hw) {
  const PlanShape shape{opts.workload.prompt_len, opts.workload.gen_len};
  const TierBytes peak = plan_placement(cfg, p, shape, hw.compute_dtype).peak();
  for (Tier t : {Tier::Gpu, Tier::Cpu, Tier::Disk})
    if (peak.at(t) > opts.budget.at(t)) return false;
  return true;
}

// The best throughput of `base` (batch shape, options, KV cache and activations as given) over
// every whole-layer split of its weights, each priced by evaluate, that fits the budgets (the
// model's and the runtime plan's) and the latency bound; 0 where none does.
double best_over_weight_splits(const ModelConfig& cfg, Policy base, const SearchOptions& opts,
                               const HardwareProfile& hw) {
  double best = 0;
  for (int ng = 0; ng <= cfg.n_layers; ++ng)
    for (int nc = 0; ng + nc <= cfg.n_layers; ++nc)
      if (const auto split = split_for_layers(cfg.n_layers, ng, nc)) {
        base.weights = *split;
        const Prediction p = evaluate(cfg, base, opts.workload, hw);
        if (fits(p, opts.budget, opts.max_latency_s) && plan_fits(cfg, base, opts, hw))
          best = std::max(best, p.throughput_tok_s);
      }
  return best;
}

// Mixtral-8x7B on 16 GiB of GPU memory, 200 GB of host memory (its 90 GB of experts fit) and two
// minutes per block of 128 tokens per sequence, on a CPU that streams weights at 60 GB/s (as in
// "the search computes Mixtral's experts on the CPU in decode only"), with the overlap shortfall
// that calibration measures on the engine (0.44 on both calibrated CPU profiles in
// policies/hardware: a stage also pays 44% of the lanes that do not bound it).
struct MixtralOn16GiB {
  ModelConfig cfg = *config_preset("mixtral-8x7b");
  HardwareProfile hw = machine();
  SearchOptions opts;
  MixtralOn16GiB() {
    hw.cpu_attention_bw = 60e9;
    hw.overlap_slowdown = 0.44;
    opts.workload = {512, 128};
    opts.budget = {16.0 * (1 << 30), 200e9, 1e12};
    opts.max_latency_s = 120;
  }
};

// Some MLP halves on the GPU, not all.
bool partial_split(const Policy& p) {
  return p.expert_weights && p.expert_weights->gpu > 0 && p.expert_weights->gpu < 100;
}

}  // namespace

TEST_CASE("the search splits Mixtral's MLP halves between the GPU and the CPU where that beats both other placements",
          "[search][moe]") {
  // Small blocks (the latency bound) decode a few tokens a step, and compute the CPU tier's
  // experts there. An attention half on the CPU tier would cross the link every step (84 MB),
  // which the stage pays in part even where the CPU's work bounds it; an MLP half on the GPU
  // takes a layer's experts off the CPU. So every attention half stays resident (2.7 GB) and the
  // GPU's remaining room holds MLP halves: neither whole layers (tied) nor no MLP half (every
  // one on the CPU) does as well, at this batch shape or any other.
  const MixtralOn16GiB m;
  const Candidate best = search_policy(m.cfg, m.hw, m.opts).ranked.front();
  INFO(policy_to_yaml(best.policy));
  CHECK(partial_split(best.policy));
  const double tput = evaluate(m.cfg, best.policy, m.opts.workload, m.hw).throughput_tok_s;
  CHECK(tput == Approx(best.prediction.throughput_tok_s).epsilon(1e-9));
  // The two other placements at the same batch shape and options, each at its best split of the
  // attention halves (brute force over whole layers).
  Policy tied = best.policy, on_cpu = best.policy;
  tied.expert_weights.reset();
  on_cpu.expert_weights = TierSplit{0, 100, 0};
  const double best_tied = best_over_weight_splits(m.cfg, tied, m.opts, m.hw);
  const double best_on_cpu = best_over_weight_splits(m.cfg, on_cpu, m.opts, m.hw);
  INFO("split " << tput << " tok/s, tied " << best_tied << ", every MLP half on the CPU " << best_on_cpu);
  CHECK(tput > 1.03 * best_tied);
  CHECK(tput > 1.03 * best_on_cpu);
  // And the best of them over every batch shape and options the search tries.
  for (const Candidate& c : search_candidates(m.cfg, m.hw, m.opts))
    if (!c.policy.expert_weights || c.policy.expert_weights->gpu == 0)
      CHECK(tput > 1.03 * c.prediction.throughput_tok_s);
}

TEST_CASE("a searched expert split is the one priced and re-checked against the runtime's plan", "[search][moe]") {
  // Each candidate's prediction is evaluate's of its policy (the rounded expert_weights fixed,
  // with the runtime's buffers), and its plan is the runtime's for that policy, within the budgets.
  const MixtralOn16GiB m;
  int partial = 0;
  for (const Candidate& c : search_candidates(m.cfg, m.hw, m.opts)) {
    INFO(policy_to_yaml(c.policy));
    partial += partial_split(c.policy);
    const Prediction again = evaluate(m.cfg, c.policy, m.opts.workload, m.hw);
    CHECK(again.throughput_tok_s == Approx(c.prediction.throughput_tok_s).epsilon(1e-9));
    REQUIRE(c.plan_peak);
    const PlacementPlan plan = plan_placement(m.cfg, c.policy, PlanShape{512, 128}, m.hw.compute_dtype);
    for (Tier t : {Tier::Gpu, Tier::Cpu, Tier::Disk}) {
      CHECK(again.peak.at(t) == Approx(c.prediction.peak.at(t)).epsilon(1e-12));
      CHECK(c.plan_peak->at(t) == plan.peak().at(t));
      CHECK(plan.peak().at(t) <= m.opts.budget.at(t));
    }
  }
  CHECK(partial > 0);
}

TEST_CASE("with compression allowed, the search tries the checkpoint's own codes", "[search]") {
  const HardwareProfile hw = machine();
  const ModelConfig cfg = *config_preset("opt-6.7b");
  SearchOptions opts;
  opts.budget = {4e9, 64e9, 1e12};  // tight on the GPU: compressed weights pay
  // The weight compressions among the candidates, as (bits, group).
  auto weight_specs = [&](const SearchOptions& o) {
    std::set<std::pair<int, int>> specs;
    for (const Candidate& c : search_candidates(cfg, hw, o))
      specs.insert(c.policy.compress_weights ? std::pair{c.policy.compress_weights->bits, c.policy.compress_weights->group_size}
                                             : std::pair{0, 0});
    return specs;
  };
  // Without --compress the file's codes change nothing: weights stay uncompressed.
  opts.kept_codes = Compression{8, 32};
  CHECK(weight_specs(opts) == std::set<std::pair<int, int>>{{0, 0}});
  // 8-bit codes (MXFP4 experts, Q8_0): beside 4-bit group 64, the throughput deciding.
  opts.allow_compression = true;
  CHECK(weight_specs(opts) == std::set<std::pair<int, int>>{{0, 0}, {4, 64}, {8, 32}});
  // 4-bit codes (Q4_0, GPTQ 4-bit group 128): in its place, the file's values kept.
  opts.kept_codes = Compression{4, 128};
  CHECK(weight_specs(opts) == std::set<std::pair<int, int>>{{0, 0}, {4, 128}});
  opts.kept_codes.reset();
  CHECK(weight_specs(opts) == std::set<std::pair<int, int>>{{0, 0}, {4, 64}});
}
