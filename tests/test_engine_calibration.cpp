// The profiler's engine runs (job/engine_calibration.h): the grid's runs keep the lanes busy that
// each policy should, the fit refines the measured profile and says on what, and a quick profile
// skips them. The fit's arithmetic is tests/test_calibrate.cpp's.
#include <catch2/catch.hpp>
#include <string>

#include "strata/core/error.h"
#include "strata/job/engine_calibration.h"
#include "strata/profile/profiler.h"
#include "temp_files.h"
#include "test_paths.h"

using namespace strata;

namespace {

EngineCalibrationOptions small_grid(std::vector<std::string>* lines = nullptr) {
  EngineCalibrationOptions o;
  o.preset = "opt-125m";
  o.layers = 2;
  o.short_layers = 1;
  o.prompt_len = 16;
  o.gen_len = 4;
  o.offload_dir = test::temp_dir("engine_calibration");
  o.threads = 2;
  if (lines) o.progress = [lines](const std::string& l) { lines->push_back(l); };
  return o;
}

// This machine class's measured (uncalibrated) profile, as `strata profile` wrote it.
HardwareProfile test_profile_for_calibration() {
  return load_hardware_profile(std::string(STRATA_FIXTURES_DIR) + "/../../policies/hardware/cpu-epyc-2core.yaml");
}

const CalibrationSample& run_named(const std::vector<CalibrationSample>& runs, const std::string& name) {
  for (const CalibrationSample& s : runs)
    if (s.name == name) return s;
  FAIL("no run " << name);
  return runs.front();
}

}  // namespace

TEST_CASE("the profiler's engine runs keep each policy's lanes busy", "[calibrate][profile]") {
  auto backend = make_cpu_backend(2);
  std::vector<std::string> lines;
  const std::vector<CalibrationSample> runs = engine_calibration_runs(*backend, small_grid(&lines));
  REQUIRE(runs.size() == 7);
  CHECK(lines.size() == 7);
  for (const CalibrationSample& s : runs) {
    INFO(s.name);
    CHECK(s.config.n_layers == 2);
    CHECK(s.config.hidden == 768);
    CHECK(s.workload.prompt_len == 16);
    CHECK(s.prefill_s > 0);
    CHECK(s.decode_s > 0);
    CHECK(s.prefill_busy[kLaneCompute] > 0);
    CHECK(s.decode_busy[kLaneCompute] > 0);
    CHECK(s.prefill_busy[kLaneCpuAttention] == 0);  // prefill never delegates
  }
  CHECK(run_named(runs, "all-gpu-8x1").decode_busy[kLaneH2d] == 0);
  CHECK(run_named(runs, "weights-cpu-8x1").decode_busy[kLaneH2d] > 0);
  CHECK(run_named(runs, "weights-half-disk-8x1").decode_busy[kLaneDisk] > 0);
  CHECK(run_named(runs, "cache-cpu-attn-4x2").decode_busy[kLaneCpuAttention] > 0);
  CHECK(run_named(runs, "all-gpu-8x1").decode_busy[kLaneCpuAttention] == 0);
  CHECK(run_named(runs, "weights-cpu-act-cpu-4x2").decode_busy[kLaneD2h] > 0);
}

TEST_CASE("the overhead probes run a model whose layers do almost no work at two layer counts", "[calibrate][profile]") {
  auto backend = make_cpu_backend(2);
  std::vector<std::string> lines;
  const std::vector<CalibrationSample> probes = overhead_probe_runs(*backend, small_grid(&lines));
  REQUIRE(probes.size() == 4);
  CHECK(lines.size() == 4);
  const std::vector<std::string> names = {"all-gpu-8x1", "all-gpu-4x2", "all-gpu-8x1-1l", "all-gpu-4x2-1l"};
  const ModelConfig grid_model = *config_preset("opt-125m");
  for (size_t i = 0; i < probes.size(); ++i) {
    const CalibrationSample& s = probes[i];
    INFO(s.name);
    CHECK(s.name == names[i]);
    CHECK(s.config.name == "opt-125m-narrow");
    CHECK(s.config.n_layers == (i < 2 ? 8 : 1));  // 4 x the grid's, and short_layers
    CHECK(s.config.hidden == 64);
    CHECK(s.config.n_heads * s.config.head_dim == 64);
    CHECK(s.config.intermediate == 256);
    CHECK(s.config.vocab_size == grid_model.vocab_size);  // the head and the sampling as the model's
    CHECK(s.workload.prompt_len == 8);
    CHECK(s.workload.gen_len == 4);
    CHECK(s.policy.weights.gpu == 100);
    CHECK(s.policy.num_gpu_batches == (i % 2 == 0 ? 1 : 2));
    CHECK(s.prefill_busy[kLaneCompute] > 0);
    CHECK(s.decode_busy[kLaneCompute] > 0);
    CHECK(s.decode_busy[kLaneH2d] == 0);  // nothing moves
  }
  // Real blocks cost something beyond the terms' GEMMs and attention (the sampling over the
  // vocabulary, the engine's bookkeeping); neither part is negative.
  const MeasuredOverheads m = measure_overheads(test_profile_for_calibration(), probes, "the probes").value();
  CHECK(m.layer_s >= 0);
  CHECK(m.step_s >= 0);
  CHECK(m.layer_s + m.step_s > 0);
}

TEST_CASE("the engine runs refine the measured profile, and a quick profile skips them", "[calibrate][profile]") {
  auto backend = make_cpu_backend(2);
  HardwareProfile measured = test_profile_for_calibration();
  const CalibrationFit fit = calibrate_on_engine(measured, *backend, small_grid());
  CHECK(fit.error_after.size() == 7);
  CHECK(measured.calibrated.empty());  // a profile of the bare rates, as older ones are
  CHECK(fit.profile.calibrated ==
        "strata profile on the engine (dummy opt-125m, 2 layers, prompt 16, generation 4) over 7 runs");
  CHECK_THAT(fit.profile.description,
             Catch::StartsWith(measured.description) &&
                 Catch::Contains("calibrated by strata profile on the engine (dummy opt-125m, 2 layers, prompt 16, "
                                 "generation 4) over 7 runs") &&
                 Catch::Contains("per step-unit (measured on opt-125m-narrow (hidden 64), 8 and 1 layers, prompt 8)"));
  // The overheads are the probes', not columns of the fit: never dropped, never negative.
  CHECK(fit.overhead_s >= 0);
  CHECK(fit.step_overhead_s >= 0);
  CHECK(fit.overhead_s + fit.step_overhead_s > 0);
  CHECK(fit.profile.compute_overhead_s == fit.overhead_s);
  CHECK(dropped_list(fit).find("overhead") == std::string::npos);
  const HardwareProfile back = parse_hardware_profile(hardware_profile_to_yaml(fit.profile), "refined.yaml");
  CHECK(back.overlap_slowdown == Approx(fit.overlap_slowdown));
  CHECK(back.cpu_attention_bw == Approx(measured.cpu_attention_bw / fit.cpu_attention_factor));

  // profile_machine applies the refinement to a full measurement only.
  ProfileOptions quick;
  quick.quick = true;
  quick.backend = "cpu";
  quick.offload_dir = test::temp_dir("engine_calibration_quick");
  bool refined = false;
  quick.refine = [&](const HardwareProfile& hw, Backend&, const ProfileOptions&) {
    refined = true;
    return hw;
  };
  profile_machine(quick);
  CHECK_FALSE(refined);
}

TEST_CASE("engine calibration refuses a model it cannot build", "[calibrate]") {
  auto backend = make_cpu_backend(1);
  EngineCalibrationOptions o = small_grid();
  o.layers = 0;
  CHECK_THROWS_WITH(engine_calibration_runs(*backend, o), Catch::Contains("layers must be at least 1"));
  o = small_grid();
  o.short_layers = -1;
  CHECK_THROWS_WITH(overhead_probe_runs(*backend, o), Catch::Contains("short_layers must be 0 (none) or more, got -1"));
  o = small_grid();
  o.preset = "gpt-9";
  CHECK_THROWS_WITH(engine_calibration_runs(*backend, o), Catch::Contains("unknown model preset 'gpt-9'"));
}

TEST_CASE("CUDA: the overhead probes run on the GPU backend", "[cuda][calibrate]") {
  if (!cuda_available()) {
    WARN("no GPU: skipped");
    return;
  }
  // The probes' narrow layers (two heads of 32) take the CUDA kernels' small-shape paths; the
  // profile on a GPU depends on them (a probe that throws would be left out, and none left fails
  // the profile). On the emulated backend in CI, on a GPU under [cuda].
  auto backend = make_cuda_backend(0);
  EngineCalibrationOptions o = small_grid();
  o.gen_len = 2;
  const std::vector<CalibrationSample> probes = overhead_probe_runs(*backend, o);
  REQUIRE(probes.size() == 4);
  for (const CalibrationSample& s : probes) {
    INFO(s.name);
    CHECK(s.config.hidden == 64);
    CHECK(s.prefill_s > 0);
    CHECK(s.decode_s > 0);
  }
  // What the overheads come to is the GPU's own figure, reported by gpu_suite.sh's profile: the
  // emulated backend's lanes, timed by its events, are not a GPU's (they can read 0: the profile
  // then fits the overheads to the grid, as measure_overheads returns none).
}
