// Calibration of a hardware profile (policy/calibrate.h): the two calibrated terms of the cost model
// by hand, and the fit recovering known constants from runs made up with them.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>

#include "policy_fixtures.h"
#include "strata/core/error.h"
#include "strata/policy/calibrate.h"
#include "strata/policy/cost_model.h"
#include "worst_error.h"

using namespace strata;
using test::policy_of;

namespace {

// gpu16_machine with a slower device-to-host link and GEMMs measured up to 256 tokens only.
HardwareProfile machine() {
  HardwareProfile hw = test::gpu16_machine();
  hw.name = "base";
  hw.gpu_to_cpu_bw = 11e9;
  hw.gpu_gemm = {{1, 0.3e12}, {16, 4e12}, {256, 18e12}};
  return hw;
}

// A run as a machine with the profile `truth` would measure it: each lane busy for its predicted
// terms, each phase as long as its predicted stage.
CalibrationSample run_on(const HardwareProfile& truth, const std::string& name, const Policy& p, int layers = 0) {
  CalibrationSample s;
  s.name = name;
  s.config = *config_preset("opt-125m");
  if (layers > 0) s.config.n_layers = layers;
  s.policy = p;
  s.workload = {64, 8};
  const Prediction pr = evaluate(s.config, p, s.workload, truth);
  const PhaseTerms terms = phase_terms(cost_forms(s.config, p, s.workload, truth),
                                       realized_fractions(p, s.config.n_layers));
  const double l = s.config.n_layers;
  auto lanes = [l](const std::array<double, kNumTerms>& t) {
    return std::array<double, kNumLanes>{t[COMP] * l, t[CTOG] * l, t[GTOC] * l, (t[DTOC] + t[CTOD]) * l, t[CATT] * l};
  };
  s.prefill_busy = lanes(terms.prefill);
  s.decode_busy = lanes(terms.decode);
  s.prefill_s = pr.prefill_s;
  s.decode_s = pr.decode_s;
  return s;
}

// `base` with GEMMs (and dequantization and elementwise work) `gemm` times, the GPU tier's attention (decode's, and
// prefill's where measured) `attention` times and attention delegated to the CPU `cpu_attention`
// times (default: `attention`) slower.
HardwareProfile slower_compute(const HardwareProfile& base, double gemm, double attention, double cpu_attention = 0) {
  HardwareProfile hw = base;
  for (GemmPoint& g : hw.gpu_gemm) g.flops_per_s /= gemm;
  hw.gpu_dequant_bw /= gemm;
  hw.gpu_elementwise_s *= gemm;
  hw.gpu_attention_bw /= attention;
  for (GemmPoint& g : hw.gpu_prefill_attention) g.flops_per_s /= attention;
  hw.cpu_attention_bw /= cpu_attention > 0 ? cpu_attention : attention;
  return hw;
}

// The profile's overhead probes: all on the GPU tier in one GPU batch and in two.
const Policy kProbeOneBatch = policy_of(8, 1, {100, 0, 0}, {100, 0, 0}, {100, 0, 0});
const Policy kProbeTwoBatches = policy_of(4, 2, {100, 0, 0}, {100, 0, 0}, {100, 0, 0});

// `hw` with 3e-4 s of compute per layer-unit and 2e-3 s per step-unit outside the terms.
HardwareProfile with_overheads(HardwareProfile hw) {
  hw.compute_overhead_s = 3e-4;
  hw.step_overhead_s = 2e-3;
  return hw;
}

}  // namespace

TEST_CASE("the calibrated overhead and overlap shortfall enter the stage times as documented", "[calibrate]") {
  const ModelConfig cfg = *config_preset("opt-125m");
  const Policy p = policy_of(4, 3, {0, 100, 0}, {100, 0, 0}, {100, 0, 0});
  const Workload w{64, 8};
  HardwareProfile hw = machine();
  const CostForms plain = cost_forms(cfg, p, w, hw);
  hw.compute_overhead_s = 1e-3;
  hw.step_overhead_s = 6e-3;
  hw.overlap_slowdown = 0.5;
  const CostForms cal = cost_forms(cfg, p, w, hw);
  // Copies on the compute's cores: COMP gains link_interference times the stage's four links.
  HardwareProfile interfering = hw;
  interfering.link_interference = 0.25;
  const CostForms slowed = cost_forms(cfg, p, w, interfering);
  for (const auto& [with, without] : {std::pair{&slowed.prefill, &cal.prefill}, std::pair{&slowed.decode, &cal.decode}}) {
    LinearForm links = (*without)[CTOG];
    for (int link : {GTOC, DTOC, CTOD}) {
      links.constant += (*without)[link].constant;
      for (int v = 0; v < kNumVars; ++v) links.coef[v] += (*without)[link].coef[v];
    }
    CHECK((*with)[COMP].constant == Approx((*without)[COMP].constant + 0.25 * links.constant));
    for (int v = 0; v < kNumVars; ++v) CHECK((*with)[COMP].coef[v] == Approx((*without)[COMP].coef[v] + 0.25 * links.coef[v]));
    CHECK((*with)[CTOG].constant == (*without)[CTOG].constant);  // the links themselves unchanged
  }
  REQUIRE(slowed.decode[COMP].coef[WC] > cal.decode[COMP].coef[WC]);  // weights on the CPU slow the compute
  // Prefill runs in groups of whole prompts (4096-token steps hold all 12 prompts of 64: one
  // group); decode runs the 3 GPU batches: one overhead per group or batch and layer, and one step
  // overhead per group or batch, which the per-layer terms carry as a twelfth each (12 layers).
  const PrefillSteps steps = prefill_steps(p, w.prompt_len);
  const double groups = std::ceil(12.0 / steps.seqs);
  REQUIRE(cfg.n_layers == 12);
  CHECK(cal.prefill[COMP].constant == Approx(plain.prefill[COMP].constant + (1e-3 + 6e-3 / 12) * groups));
  CHECK(cal.decode[COMP].constant == Approx(plain.decode[COMP].constant + 3 * (1e-3 + 6e-3 / 12)));
  const Prediction pr = evaluate(cfg, p, w, hw);
  for (const StageTime* st : {&pr.prefill, &pr.decode}) {
    double sum = 0, max = 0;
    for (double t : st->terms) sum += t, max = std::max(max, t);
    CHECK(st->total == Approx(max + 0.5 * (sum - max)));
    CHECK(st->total < sum);
  }
}

TEST_CASE("calibration recovers the constants of the machine that made the runs", "[calibrate]") {
  const HardwareProfile base = machine();
  // The "measured" machine: slower GEMMs and attention, links at part of their rate, work outside
  // the terms, and overlap that falls short.
  HardwareProfile truth = slower_compute(base, 1.6, 2.5, 1.7);
  truth.cpu_to_gpu_bw /= 1.8;
  truth.gpu_to_cpu_bw /= 1.3;
  truth.disk_to_cpu_bw /= 1.2;
  truth.cpu_to_disk_bw /= 1.2;
  truth.compute_overhead_s = 4e-4;
  truth.link_interference = 0.3;  // copies that slow the compute: 0.3 s per second of link work
  truth.overlap_slowdown = 0.35;
  const std::vector<CalibrationSample> runs = {
      run_on(truth, "all on gpu", policy_of(8, 1, {100, 0, 0}, {100, 0, 0}, {100, 0, 0})),
      run_on(truth, "weights on cpu", policy_of(8, 1, {0, 100, 0}, {100, 0, 0}, {100, 0, 0})),
      run_on(truth, "weights half disk", policy_of(4, 2, {0, 50, 50}, {100, 0, 0}, {100, 0, 0})),
      run_on(truth, "cache on cpu, cpu attention", policy_of(4, 2, {100, 0, 0}, {0, 100, 0}, {100, 0, 0}, true)),
      run_on(truth, "cache on cpu", policy_of(8, 2, {50, 50, 0}, {0, 100, 0}, {100, 0, 0})),
      run_on(truth, "activations on cpu", policy_of(4, 4, {0, 100, 0}, {100, 0, 0}, {0, 100, 0})),
      // Every lane busy in two runs at least, so that leaving one out still determines its factor.
      run_on(truth, "cache half on disk", policy_of(4, 2, {100, 0, 0}, {0, 50, 50}, {100, 0, 0})),
      run_on(truth, "weights and cache on cpu, cpu attention", policy_of(8, 2, {0, 100, 0}, {0, 100, 0}, {100, 0, 0}, true)),
  };
  const CalibrationFit f = calibrate_profile(base, runs);
  CHECK(f.undetermined.empty());
  CHECK(f.dropped.empty());
  CHECK(f.gemm_factor == Approx(1.6).epsilon(1e-6));
  CHECK(f.gpu_attention_factor == Approx(2.5).epsilon(1e-6));
  CHECK(f.cpu_attention_factor == Approx(1.7).epsilon(1e-6));
  CHECK(f.profile.cpu_attention_bw == Approx(truth.cpu_attention_bw).epsilon(1e-6));
  CHECK(f.profile.gpu_attention_bw == Approx(truth.gpu_attention_bw).epsilon(1e-6));
  CHECK(f.overhead_s == Approx(4e-4).epsilon(1e-6));
  CHECK(f.link_interference == Approx(0.3).epsilon(1e-6));
  CHECK(f.profile.link_interference == f.link_interference);
  CHECK(f.link_factor[kLaneH2d] == Approx(1.8).epsilon(1e-6));
  CHECK(f.link_factor[kLaneD2h] == Approx(1.3).epsilon(1e-6));
  CHECK(f.link_factor[kLaneDisk] == Approx(1.2).epsilon(1e-6));
  CHECK(f.overlap_slowdown == Approx(0.35).margin(1e-9));
  CHECK(f.profile.cpu_to_gpu_bw == Approx(truth.cpu_to_gpu_bw).epsilon(1e-6));
  // Both GEMM curves take the GEMMs' factor (base has one curve: a second one, scaled alike).
  HardwareProfile two = base;
  two.gpu_gemm_hidden = 768;  // opt-125m's: the runs are priced on gpu_gemm either way
  two.gpu_gemm2 = {{1, 0.2e12}, {256, 10e12}};
  two.gpu_gemm2_hidden = 4096;
  const CalibrationFit f2 = calibrate_profile(two, runs);
  CHECK(f2.gemm_factor == Approx(1.6).epsilon(1e-6));
  REQUIRE(f2.profile.gpu_gemm2.size() == 2);
  CHECK(f2.profile.gpu_gemm2[1].flops_per_s == Approx(10e12 / f2.gemm_factor));
  CHECK(f2.profile.gpu_gemm2_hidden == 4096);
  REQUIRE(f.error_before.size() == runs.size());
  REQUIRE(f.error_leave_one_out.size() == runs.size());
  double worst_before = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    worst_before = std::max(worst_before, std::fabs(f.error_before[i]));
    CHECK(std::fabs(f.error_after[i]) < 1e-6);
    CHECK(std::fabs(f.error_leave_one_out[i]) < 1e-6);
  }
  CHECK(worst_before > 0.3);  // the base profile was far off: the fit had something to do
  // The refined profile survives its YAML round trip.
  CHECK(f.step_overhead_s == 0);  // one layer count: no step part to fit, and none reported
  const HardwareProfile back = parse_hardware_profile(hardware_profile_to_yaml(f.profile), "calibrated");
  CHECK(back.compute_overhead_s == Approx(f.profile.compute_overhead_s));
  CHECK(back.link_interference == Approx(0.3).epsilon(1e-6));
  CHECK(back.overlap_slowdown == Approx(f.profile.overlap_slowdown));
  CHECK(f.profile.calibrated == "strata bench --calibrate over 8 runs");
  CHECK(back.calibrated == f.profile.calibrated);
  CHECK(base.calibrated.empty());
}

TEST_CASE("a measured prefill attention rate is fitted with the GPU tier's decode attention", "[calibrate]") {
  // Runs long enough in prompt for prefill attention to show: the GPU tier's attention factor
  // scales the prefill curve too, and the GEMMs' factor leaves it alone.
  HardwareProfile base = machine();
  base.gpu_prefill_attention = {{32, 0.5e12}, {512, 2e12}};
  base.gpu_elementwise_s = 1e-11;  // the GEMMs' factor scales the elementwise work too
  const HardwareProfile truth = slower_compute(base, 1.3, 2.2);
  const std::vector<CalibrationSample> runs = {
      run_on(truth, "all on gpu", policy_of(8, 1, {100, 0, 0}, {100, 0, 0}, {100, 0, 0})),
      run_on(truth, "two batches", policy_of(4, 2, {100, 0, 0}, {100, 0, 0}, {100, 0, 0})),
      run_on(truth, "weights on cpu", policy_of(8, 1, {0, 100, 0}, {100, 0, 0}, {100, 0, 0})),
      run_on(truth, "cache on cpu, cpu attention", policy_of(4, 2, {100, 0, 0}, {0, 100, 0}, {100, 0, 0}, true)),
  };
  const CalibrationFit f = calibrate_profile(base, runs);
  CHECK(f.dropped.empty());
  CHECK(f.gemm_factor == Approx(1.3).epsilon(1e-6));
  CHECK(f.gpu_attention_factor == Approx(2.2).epsilon(1e-6));
  REQUIRE(f.profile.gpu_prefill_attention.size() == 2);
  CHECK(f.profile.gpu_prefill_attention[1].flops_per_s == Approx(2e12 / 2.2).epsilon(1e-6));
  CHECK(f.profile.gpu_elementwise_s == Approx(1.3e-11).epsilon(1e-6));
  for (double e : f.error_after) CHECK(std::fabs(e) < 1e-6);
  // Priced as a GEMM instead (the profile without the curve), the same runs fit worse.
  HardwareProfile unmeasured = base;
  unmeasured.gpu_prefill_attention.clear();
  const CalibrationFit g = calibrate_profile(unmeasured, runs);
  double worst = 0;
  for (double e : g.error_after) worst = test::worst_of(worst, std::fabs(e));
  CHECK(worst > 1e-3);
}

TEST_CASE("a part fitted with a meaningless sign is dropped and reported", "[calibrate]") {
  // Runs that determine every compute column, from a machine whose work per layer-unit is less
  // than the terms count: the least squares finds a negative overhead, which the fit drops (to 0)
  // and says so, rather than keep it or drop it silently.
  const HardwareProfile base = machine();
  HardwareProfile truth = slower_compute(base, 1.6, 2.5);
  truth.compute_overhead_s = -2e-4;
  const std::vector<CalibrationSample> runs = {
      run_on(truth, "all on gpu", policy_of(8, 1, {100, 0, 0}, {100, 0, 0}, {100, 0, 0})),
      run_on(truth, "weights on cpu", policy_of(8, 1, {0, 100, 0}, {100, 0, 0}, {100, 0, 0})),
      run_on(truth, "cache on cpu, cpu attention", policy_of(4, 2, {100, 0, 0}, {0, 100, 0}, {100, 0, 0}, true)),
      run_on(truth, "activations on cpu", policy_of(4, 4, {0, 100, 0}, {100, 0, 0}, {0, 100, 0})),
  };
  const CalibrationFit f = calibrate_profile(base, runs);
  INFO(dropped_list(f));
  CHECK(f.undetermined.empty());
  REQUIRE(!f.dropped.empty());
  CHECK_THAT(f.dropped[0], Catch::StartsWith("overhead (fitted -0.2") && Catch::EndsWith(" ms per layer-unit)"));
  // Without the overhead the refit no longer matches the runs exactly: what it then fits for
  // copies slowing the compute (the truth's 0) lies within that scatter.
  for (size_t i = 1; i < f.dropped.size(); ++i) CHECK_THAT(f.dropped[i], Catch::EndsWith("within the runs' scatter)"));
  CHECK(f.overhead_s == 0);
  CHECK(f.profile.compute_overhead_s == 0);
  CHECK_THAT(f.profile.description, Catch::Contains("dropped: overhead (fitted -0.2"));
  CHECK_THAT(dropped_list(f), Catch::StartsWith(f.dropped[0]));

  // The same runs from a machine with a positive overhead drop nothing.
  truth.compute_overhead_s = 2e-4;
  std::vector<CalibrationSample> fine;
  for (const CalibrationSample& s : runs) fine.push_back(run_on(truth, s.name, s.policy));
  const CalibrationFit g = calibrate_profile(base, fine);
  CHECK(g.dropped.empty());
  CHECK(g.overhead_s == Approx(2e-4).epsilon(1e-6));
}

TEST_CASE("calibration refuses too few runs and a profile field out of range", "[calibrate]") {
  const HardwareProfile base = machine();
  const std::vector<CalibrationSample> one = {
      run_on(base, "one", policy_of(8, 1, {100, 0, 0}, {100, 0, 0}, {100, 0, 0}))};
  CHECK_THROWS_WITH(calibrate_profile(base, one), Catch::Contains("at least two measured runs"));
  std::string yaml = hardware_profile_to_yaml(base) + "overlap_slowdown: 1.5\n";
  CHECK_THROWS_WITH(parse_hardware_profile(yaml, "hw.yaml"),
                    Catch::Contains("hw.yaml:") && Catch::Contains("overlap_slowdown") &&
                        Catch::Contains("from 0 to 1"));
  yaml = hardware_profile_to_yaml(base) + "link_interference: 11\n";
  CHECK_THROWS_WITH(parse_hardware_profile(yaml, "hw.yaml"),
                    Catch::Contains("hw.yaml:") && Catch::Contains("link_interference") && Catch::Contains("from 0 to 10"));
  yaml = hardware_profile_to_yaml(base) + "step_overhead_s: -0.001\n";
  CHECK_THROWS_WITH(parse_hardware_profile(yaml, "hw.yaml"),
                    Catch::Contains("hw.yaml:") && Catch::Contains("step_overhead_s") && Catch::Contains("from 0 to 1"));
}

TEST_CASE("runs of two layer counts tell the overhead per step from the overhead per layer", "[calibrate]") {
  // A machine with work per layer-unit and per step-unit (the embedding, sampling, the head's
  // launches): runs of one layer count see only their sum per step, runs of 4 and 12 layers each.
  const HardwareProfile base = machine();
  HardwareProfile truth = slower_compute(base, 1.6, 2.5);
  truth.compute_overhead_s = 3e-4;
  truth.step_overhead_s = 2e-3;
  const std::vector<std::pair<const char*, Policy>> grid = {
      {"all on gpu", policy_of(8, 1, {100, 0, 0}, {100, 0, 0}, {100, 0, 0})},
      {"two batches", policy_of(4, 2, {100, 0, 0}, {100, 0, 0}, {100, 0, 0})},
      {"weights on cpu", policy_of(8, 1, {0, 100, 0}, {100, 0, 0}, {100, 0, 0})},
      {"cache on cpu, cpu attention", policy_of(4, 2, {100, 0, 0}, {0, 100, 0}, {100, 0, 0}, true)},
  };
  std::vector<CalibrationSample> one_count, two_counts;
  for (const auto& [name, p] : grid) {
    one_count.push_back(run_on(truth, name, p, 4));
    two_counts.push_back(run_on(truth, name, p, 4));
    two_counts.push_back(run_on(truth, std::string(name) + ", 12 layers", p, 12));
  }
  const CalibrationFit f = calibrate_profile(base, two_counts);
  CHECK(f.undetermined.empty());
  CHECK(f.dropped.empty());
  CHECK(f.gemm_factor == Approx(1.6).epsilon(1e-6));
  CHECK(f.gpu_attention_factor == Approx(2.5).epsilon(1e-6));
  CHECK(f.overhead_s == Approx(3e-4).epsilon(1e-6));
  CHECK(f.step_overhead_s == Approx(2e-3).epsilon(1e-6));
  CHECK(f.profile.step_overhead_s == f.step_overhead_s);
  for (double e : f.error_after) CHECK(std::fabs(e) < 1e-6);
  CHECK_THAT(f.profile.description, Catch::Contains("s per step-unit"));
  const HardwareProfile back = parse_hardware_profile(hardware_profile_to_yaml(f.profile), "calibrated");
  CHECK(back.step_overhead_s == Approx(2e-3));

  // One layer count: the step part is no column of its own. What it costs per step lands in the
  // per-layer overhead (as 2e-3 / 4 more per layer-unit), which then predicts these runs exactly
  // but not the 12-layer ones.
  const CalibrationFit g = calibrate_profile(base, one_count);
  CHECK(g.step_overhead_s == 0);
  CHECK(g.undetermined.empty());
  CHECK(g.overhead_s == Approx(3e-4 + 2e-3 / 4).epsilon(1e-6));
  CHECK(std::fabs(throughput_error(g.profile, two_counts[1])) > 0.01);
}

TEST_CASE("probes of two layer counts measure the overheads, which the fit then holds", "[calibrate]") {
  // A machine with work per layer-unit and per step-unit, probed (as the profile probes it) with
  // all-on-GPU blocks in one and two GPU batches at 4 and 12 layers.
  const HardwareProfile base = machine();
  const Policy &one = kProbeOneBatch, &two = kProbeTwoBatches;
  std::vector<CalibrationSample> probes;
  for (int layers : {4, 12})
    for (const Policy& p : {one, two}) probes.push_back(run_on(with_overheads(base), "probe", p, layers));
  const MeasuredOverheads m = measure_overheads(base, probes, "the probes").value();
  CHECK(m.layer_s == Approx(3e-4).epsilon(1e-6));
  CHECK(m.step_s == Approx(2e-3).epsilon(1e-6));
  CHECK(m.on == "the probes");

  // The same machine with slower GEMMs and attention, its grid fitted with the overheads held: the
  // fit recovers the rest, and holds them even from runs of one layer count.
  HardwareProfile truth = slower_compute(with_overheads(base), 1.6, 2.5);
  truth.link_interference = 0.3;
  const std::vector<CalibrationSample> runs = {
      run_on(truth, "all on gpu", one),
      run_on(truth, "two batches", two),
      run_on(truth, "weights on cpu", policy_of(8, 1, {0, 100, 0}, {100, 0, 0}, {100, 0, 0})),
      run_on(truth, "weights half disk", policy_of(4, 2, {0, 50, 50}, {100, 0, 0}, {100, 0, 0})),
      run_on(truth, "cache on cpu, cpu attention", policy_of(4, 2, {100, 0, 0}, {0, 100, 0}, {100, 0, 0}, true)),
      // Every lane busy in two runs at least, so that leaving one out still determines its factor.
      run_on(truth, "cache half on disk", policy_of(4, 2, {100, 0, 0}, {0, 50, 50}, {100, 0, 0})),
      run_on(truth, "weights and cache on cpu, cpu attention", policy_of(8, 2, {0, 100, 0}, {0, 100, 0}, {100, 0, 0}, true)),
  };
  const CalibrationFit f = calibrate_profile(base, runs, "the grid", &m);
  CHECK(f.undetermined.empty());
  CHECK(f.dropped.empty());
  CHECK(f.gemm_factor == Approx(1.6).epsilon(1e-6));
  CHECK(f.gpu_attention_factor == Approx(2.5).epsilon(1e-6));
  CHECK(f.link_interference == Approx(0.3).epsilon(1e-6));
  CHECK(f.overhead_s == m.layer_s);
  CHECK(f.step_overhead_s == m.step_s);
  CHECK(f.profile.compute_overhead_s == m.layer_s);
  CHECK(f.profile.step_overhead_s == m.step_s);
  for (double e : f.error_after) CHECK(std::fabs(e) < 1e-6);
  for (double e : f.error_leave_one_out) CHECK(std::fabs(e) < 1e-6);
  CHECK_THAT(f.profile.description, Catch::Contains("s per step-unit (measured on the probes)"));

  // Held overheads that are off are not refitted: the other parts take the misfit.
  MeasuredOverheads none = m;
  none.layer_s = none.step_s = 0;
  const CalibrationFit g = calibrate_profile(base, runs, "the grid", &none);
  CHECK(g.overhead_s == 0);
  CHECK(g.step_overhead_s == 0);
  CHECK(g.gemm_factor > 1.6);
}

TEST_CASE("probes of one layer count measure the overhead per layer only, and a negative part is none", "[calibrate]") {
  const HardwareProfile base = machine();
  HardwareProfile truth = with_overheads(base);
  const Policy &one = kProbeOneBatch, &two = kProbeTwoBatches;
  // One layer count: a step's part is the layers' (2e-3 / 4 more per layer-unit).
  const MeasuredOverheads m =
      measure_overheads(base, {run_on(truth, "probe", one, 4), run_on(truth, "probe", two, 4)}, "four layers").value();
  CHECK(m.step_s == 0);
  CHECK(m.layer_s == Approx(3e-4 + 2e-3 / 4).epsilon(1e-6));

  // Probes whose time per step falls with the layers (here a negative step part): it is measured
  // as none, and the per-layer part fitted alone lies between the two counts' per-unit figures.
  truth.step_overhead_s = -5e-4;
  std::vector<CalibrationSample> probes;
  for (int layers : {4, 12})
    for (const Policy& p : {one, two}) probes.push_back(run_on(truth, "probe", p, layers));
  const MeasuredOverheads n = measure_overheads(base, probes, "both").value();
  CHECK(n.step_s == 0);
  CHECK(n.layer_s > 3e-4 - 5e-4 / 4);
  CHECK(n.layer_s < 3e-4 - 5e-4 / 12);

  // Probes whose compute the terms already account for: no overhead at all.
  const MeasuredOverheads none =
      measure_overheads(base, {run_on(base, "probe", one, 4), run_on(base, "probe", two, 12)}, "bare").value();
  CHECK(none.layer_s == Approx(0).margin(1e-12));
  CHECK(none.step_s == Approx(0).margin(1e-12));
  CHECK_THROWS_WITH(measure_overheads(base, {}, "nothing"), Catch::Contains("no probe runs"));

  // Probes whose compute lane read no time (a backend that cannot time blocks this short): not
  // measured, rather than measured as 0.
  std::vector<CalibrationSample> unseen = {run_on(truth, "probe", one, 4), run_on(truth, "probe", two, 12)};
  for (CalibrationSample& s : unseen) s.prefill_busy[kLaneCompute] = s.decode_busy[kLaneCompute] = 0;
  unseen[1].decode_busy[kLaneCompute] = 1e-3;  // one phase alone cannot tell the two parts
  CHECK_FALSE(measure_overheads(base, unseen, "unseen").has_value());
}

TEST_CASE("a part the runs' scatter could have made is dropped and reported", "[calibrate]") {
  // The GPU attention of opt-125m at 72 positions is a small part of the compute. Runs whose
  // compute busy times scatter by +-10% around a machine with attention at the profile's rate fit
  // some factor for it, but one whose standard error is comparable to itself: the fit folds it into
  // the GEMMs' (as for an undetermined part) and names it, instead of keeping a free factor.
  const HardwareProfile base = machine();
  const HardwareProfile truth = slower_compute(base, 1.6, 1.6);
  std::vector<CalibrationSample> runs = {
      run_on(truth, "all on gpu", policy_of(8, 1, {100, 0, 0}, {100, 0, 0}, {100, 0, 0})),
      run_on(truth, "two batches", policy_of(4, 2, {100, 0, 0}, {100, 0, 0}, {100, 0, 0})),
      run_on(truth, "weights on cpu", policy_of(8, 1, {0, 100, 0}, {100, 0, 0}, {100, 0, 0})),
      run_on(truth, "four batches", policy_of(2, 4, {50, 50, 0}, {100, 0, 0}, {100, 0, 0})),
      run_on(truth, "sixteen", policy_of(16, 1, {100, 0, 0}, {100, 0, 0}, {100, 0, 0})),
  };
  const double scatter[] = {1.1, 0.9, 0.92, 1.08, 1.05, 0.95, 0.9, 1.1, 1.07, 0.93};
  size_t i = 0;
  for (CalibrationSample& s : runs)
    for (auto* busy : {&s.prefill_busy, &s.decode_busy}) (*busy)[kLaneCompute] *= scatter[i++];
  const CalibrationFit f = calibrate_profile(base, runs);
  INFO(dropped_list(f));
  const auto entry = [&](const std::string& part) {
    for (const std::string& d : f.dropped)
      if (d.rfind(part + " (fitted ", 0) == 0) return d;
    return std::string();
  };
  CHECK_THAT(entry("gpu attention"), Catch::StartsWith("gpu attention (fitted factor ") && Catch::Contains(" +- factor ") &&
                                         Catch::EndsWith("within the runs' scatter)"));
  CHECK(f.gpu_attention_factor == f.gemm_factor);
  CHECK(f.gemm_factor == Approx(1.6).epsilon(0.1));
  // The truth has no overhead and no copies slowing the compute: what the scatter fits for them is
  // dropped the same way, or for its sign.
  CHECK_FALSE(entry("overhead").empty());
  CHECK(f.overhead_s == 0);
  CHECK(f.link_interference == 0);
  CHECK_THAT(f.profile.description, Catch::Contains("dropped: ") && Catch::Contains("gpu attention (fitted factor "));

  // Without the scatter the same runs fit the truth: nothing is dropped.
  std::vector<CalibrationSample> exact;
  for (const CalibrationSample& s : runs) exact.push_back(run_on(truth, s.name, s.policy));
  const CalibrationFit g = calibrate_profile(base, exact);
  CHECK(g.dropped.empty());
  CHECK(g.gpu_attention_factor == Approx(1.6).epsilon(1e-6));
}

TEST_CASE("a staggered block's phase terms are its super-steps' sums", "[calibrate]") {
  const ModelConfig cfg = *config_preset("opt-125m");
  Policy p = policy_of(4, 4, {0, 100, 0}, {100, 0, 0}, {100, 0, 0});
  p.prefill_batches_per_step = 1;
  const Workload w{64, 3};
  const CostForms F = cost_forms(cfg, p, w, machine());
  REQUIRE(F.staggered());
  const Fractions x = realized_fractions(p, cfg.n_layers);
  // Batch k prefills in super-step k and decodes in k + 1 and k + 2: super-steps 0-3 prefill one
  // batch each while 0, 1, 2, 2 batches decode; 4 and 5 decode 2 and 1.
  const PhaseTerms t = phase_terms(F, x);
  for (int term = 0; term < kNumTerms; ++term) {
    const double pf = F.prefill_fixed[term].at(x), pb = F.prefill_batch[term].at(x);
    const double df = F.decode_fixed[term].at(x), db = F.decode_batch[term].at(x);
    CHECK(t.prefill[term] == Approx(pf + 3 * std::max(pf, df) + 4 * pb + 5 * db));
    CHECK(t.decode[term] == Approx(2 * df + 3 * db));
  }
  // Unstaggered: prefill once, decode gen_len - 1 times.
  p.prefill_batches_per_step = 0;
  const CostForms G = cost_forms(cfg, p, w, machine());
  const PhaseTerms u = phase_terms(G, x);
  for (int term = 0; term < kNumTerms; ++term) {
    CHECK(u.prefill[term] == Approx(G.prefill[term].at(x)));
    CHECK(u.decode[term] == Approx(2 * G.decode[term].at(x)));
  }
}

TEST_CASE("calibration fits staggered runs through their super-steps", "[calibrate]") {
  const HardwareProfile base = machine();
  HardwareProfile truth = base;
  for (GemmPoint& g : truth.gpu_gemm) g.flops_per_s /= 1.5;
  truth.gpu_dequant_bw /= 1.5;
  truth.gpu_attention_bw /= 2;
  truth.cpu_to_gpu_bw /= 1.4;
  truth.compute_overhead_s = 3e-4;
  truth.overlap_slowdown = 0.2;
  auto staggered = [](Policy p, int per_step) {
    p.prefill_batches_per_step = per_step;
    return p;
  };
  // One unstaggered run only: the staggered ones carry the fit.
  const std::vector<CalibrationSample> runs = {
      run_on(truth, "all on gpu", policy_of(8, 1, {100, 0, 0}, {100, 0, 0}, {100, 0, 0})),
      run_on(truth, "weights on cpu 4x4 p1", staggered(policy_of(4, 4, {0, 100, 0}, {100, 0, 0}, {100, 0, 0}), 1)),
      run_on(truth, "weights on cpu 2x6 p2", staggered(policy_of(2, 6, {0, 100, 0}, {100, 0, 0}, {100, 0, 0}), 2)),
      run_on(truth, "half on cpu 8x3 p1", staggered(policy_of(8, 3, {50, 50, 0}, {100, 0, 0}, {100, 0, 0}), 1)),
  };
  const CalibrationFit f = calibrate_profile(base, runs);
  CHECK(f.gemm_factor == Approx(1.5).epsilon(1e-6));
  CHECK(f.gpu_attention_factor == Approx(2).epsilon(1e-6));
  CHECK(f.cpu_attention_factor == 1);  // no run delegates attention: the profile's rate stands
  CHECK(f.undetermined.empty());
  CHECK(f.overhead_s == Approx(3e-4).epsilon(1e-6));
  CHECK(f.link_factor[kLaneH2d] == Approx(1.4).epsilon(1e-6));
  CHECK(f.overlap_slowdown == Approx(0.2).margin(1e-9));
  REQUIRE(f.error_after.size() == runs.size());
  for (double e : f.error_after) CHECK(std::fabs(e) < 1e-6);
}

TEST_CASE("a leave-one-out fit that cannot be made leaves a gap, not a failed calibration", "[calibrate]") {
  const HardwareProfile base = machine();
  std::vector<CalibrationSample> runs = {
      run_on(base, "a", policy_of(8, 1, {100, 0, 0}, {100, 0, 0}, {100, 0, 0})),
      run_on(base, "b", policy_of(8, 1, {0, 100, 0}, {100, 0, 0}, {100, 0, 0})),
      run_on(base, "c", policy_of(4, 2, {0, 100, 0}, {100, 0, 0}, {100, 0, 0})),
      run_on(base, "d", policy_of(4, 2, {50, 50, 0}, {100, 0, 0}, {100, 0, 0})),
  };
  // Only run "a" reports a busy compute lane (say the others ran with a profiler that missed it):
  // without it no compute fit can be made.
  for (size_t i = 1; i < runs.size(); ++i) runs[i].prefill_busy[kLaneCompute] = runs[i].decode_busy[kLaneCompute] = 0;
  const CalibrationFit f = calibrate_profile(base, runs);
  REQUIRE(f.error_leave_one_out.size() == runs.size());
  CHECK(std::isnan(f.error_leave_one_out[0]));
  for (size_t i = 1; i < runs.size(); ++i) CHECK_FALSE(std::isnan(f.error_leave_one_out[i]));
}

TEST_CASE("runs whose compute is one run's multiple fit the parts they determine", "[calibrate]") {
  // The same GPU batch once and twice: every compute term doubles (GEMMs, attention and units of
  // overhead alike), so only the prefill and decode rows tell terms apart: two columns can be
  // fitted. With attention on the GPU tier they are the GEMMs and the attention, and the overhead
  // cannot be told from the GEMMs (left at 0); with attention delegated to the CPU (its own lane,
  // its own factor) they are the GEMMs and the overhead (the truth's 0). The GPU attention no run
  // has takes the GEMMs' factor, the CPU attention no run has keeps the profile's rate.
  const HardwareProfile base = machine();
  const HardwareProfile truth = slower_compute(base, 1.6, 2.5, 1.9);
  for (const bool delegated : {false, true}) {
    INFO((delegated ? "attention on the CPU" : "attention on the GPU"));
    const TierSplit cache = delegated ? TierSplit{0, 100, 0} : TierSplit{100, 0, 0};
    const std::vector<CalibrationSample> runs = {
        run_on(truth, "one batch", policy_of(8, 1, {0, 100, 0}, cache, {100, 0, 0}, delegated)),
        run_on(truth, "two batches", policy_of(8, 2, {100, 0, 0}, cache, {100, 0, 0}, delegated)),
    };
    const CalibrationFit f = calibrate_profile(base, runs);
    CHECK(f.gemm_factor == Approx(1.6).epsilon(1e-6));
    if (delegated) {
      CHECK(f.cpu_attention_factor == Approx(1.9).epsilon(1e-6));
      CHECK(f.gpu_attention_factor == f.gemm_factor);
    } else {
      CHECK(f.gpu_attention_factor == Approx(2.5).epsilon(1e-6));
      CHECK(f.cpu_attention_factor == 1);
    }
    CHECK(f.overhead_s == 0);
    CHECK(f.dropped.empty());
    if (delegated) {
      CHECK(f.undetermined.empty());
    } else {
      CHECK(f.undetermined == std::vector<std::string>{"overhead"});
      CHECK_THAT(f.profile.description, Catch::Contains("not determined by these runs: overhead"));
    }
    for (double e : f.error_after) CHECK(std::fabs(e) < 1e-6);

    // Decode alone (runs whose prefill busy time went unrecorded): one row, doubled, so GPU
    // attention folds into the GEMMs too, and the one factor left is the rows' measured /
    // predicted. The CPU attention's lane still fits its own.
    std::vector<CalibrationSample> decode_only = runs;
    for (CalibrationSample& s : decode_only) s.prefill_busy[kLaneCompute] = 0;
    const CalibrationFit g = calibrate_profile(base, decode_only);
    CHECK(g.undetermined ==
          (delegated ? std::vector<std::string>{"overhead"} : std::vector<std::string>{"gpu attention", "overhead"}));
    CHECK(g.gpu_attention_factor == g.gemm_factor);
    CHECK(g.cpu_attention_factor == (delegated ? Approx(1.9).epsilon(1e-6) : Approx(1)));
    CHECK(g.overhead_s == 0);
    const auto lanes = predicted_lane_seconds(base, decode_only[0]);  // base: no overhead, no overlap slowdown
    CHECK(g.gemm_factor == Approx(decode_only[0].decode_busy[kLaneCompute] / lanes[1][kLaneCompute]).epsilon(1e-9));
  }
}

TEST_CASE("runs that delegate attention without a measured CPU attention lane leave its factor at 1", "[calibrate]") {
  // Results written before the CPU attention had a lane of its own (bench results.jsonl without
  // "cpu_attention" in the busy times): the lane reads 0, its factor is not fitted and is named.
  const HardwareProfile base = machine();
  const HardwareProfile truth = slower_compute(base, 1.6, 2.5, 1.9);
  std::vector<CalibrationSample> runs = {
      run_on(truth, "all on gpu", policy_of(8, 1, {100, 0, 0}, {100, 0, 0}, {100, 0, 0})),
      run_on(truth, "cache on cpu, cpu attention", policy_of(4, 2, {100, 0, 0}, {0, 100, 0}, {100, 0, 0}, true)),
      run_on(truth, "weights on cpu", policy_of(8, 1, {0, 100, 0}, {100, 0, 0}, {100, 0, 0})),
  };
  REQUIRE(runs[1].decode_busy[kLaneCpuAttention] > 0);
  runs[1].decode_busy[kLaneCpuAttention] = 0;
  const CalibrationFit f = calibrate_profile(base, runs);
  CHECK(f.cpu_attention_factor == 1);
  CHECK(f.profile.cpu_attention_bw == base.cpu_attention_bw);
  CHECK(std::find(f.undetermined.begin(), f.undetermined.end(), "cpu attention") != f.undetermined.end());
  CHECK(f.gemm_factor == Approx(1.6).epsilon(1e-6));  // the compute lane never carried the CPU's work
}
