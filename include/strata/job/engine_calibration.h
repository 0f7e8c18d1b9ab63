// The last measurement of `strata profile` (issue 40; docs/cost-model.md, "Calibration"): the
// offloading engine itself, on probes of a model whose layers do almost no work (the compute
// lane's cost per layer step and per step, measured) and on a small grid of policies over a dummy
// model of a few layers, fitted as `strata bench --calibrate` fits (policy/calibrate.h) with those
// overheads held. The profile then carries what the measured rates alone miss: the overheads, each
// lane's efficiency in the schedule against its bare rate, and how far the overlap falls short.
#pragma once
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "strata/backend/backend.h"
#include "strata/policy/calibrate.h"
#include "strata/profile/hardware.h"
#include "strata/profile/profiler.h"

namespace strata {

struct EngineCalibrationOptions {
  std::string preset;   // the model class: empty picks opt-1.3b on the CPU backend, opt-6.7b on a GPU
  int layers = 4;       // of the preset's: the rates are per layer, so a few are enough
  // The overhead probes again at this many layers (0: none; their other count is 4 x `layers`):
  // what a step costs outside its layers shows only between runs of two layer counts.
  int short_layers = 2;
  int prompt_len = 64, gen_len = 8;
  std::filesystem::path offload_dir;  // the grid's disk case writes here; empty: default_offload_dir()
  int threads = 0;                    // CPU threads for the engine's CPU work (0: all cores)
  std::function<void(const std::string&)> progress;  // one line per run, or null
};

// The grid: every lane busy in two runs at least (all on the GPU tier in one and two GPU batches,
// weights on the CPU, half on the CPU, half on disk, the cache on the CPU with CPU attention,
// activations on the CPU) at `layers`, each run measured once after a warm-up. Runs that do not
// fit the backend's memory are left out; throws when fewer than two fit.
std::vector<CalibrationSample> engine_calibration_runs(Backend& backend, const EngineCalibrationOptions& options);

// The overhead probes (policy/calibrate.h, measure_overheads): the model narrowed to layers that do
// almost no work (hidden 64), all on the GPU tier in one GPU batch and in two, at 4 x `layers`
// (up to the preset's) and `short_layers`, prompt 8, each the mean of ten blocks after a warm-up.
// The progress names each as a grid run. Throws when none fits.
std::vector<CalibrationSample> overhead_probe_runs(Backend& backend, const EngineCalibrationOptions& options);

// `measured` refined by the probes' overheads and the fit of the grid's runs; its description says
// what each was measured and fitted on.
CalibrationFit calibrate_on_engine(const HardwareProfile& measured, Backend& backend,
                                   const EngineCalibrationOptions& options);

// ProfileOptions::refine: calibrate_on_engine in the profiler's offload directory and threads,
// reporting each run and the fit's errors to its progress.
ProfileRefinement engine_refinement();

}  // namespace strata
