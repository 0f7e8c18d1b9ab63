#include "strata/job/engine_calibration.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>

#include "strata/core/error.h"
#include "strata/job/bench.h"
#include "strata/model/weight_source.h"
#include "strata/offload/disk_store.h"
#include "strata/offload/engine.h"

namespace strata {
namespace {

struct GridPolicy {
  const char* name;
  int gbs, ngb;
  TierSplit weights, cache, activations;
  bool cpu_attention = false;
  // Run again at the short layer count too: the four whose compute differs most in units and
  // copies are enough to tell a step's cost from a layer's, and the profile stays under 2 minutes.
  bool at_short_count = false;
};

// calibrate-cpu's grid (bench/suites/calibrate-cpu.yaml) without its 4-bit case: what every
// compute column and lane needs to be told apart (docs/cost-model.md, "Calibration").
const GridPolicy kGrid[] = {
    {"all-gpu-8x1", 8, 1, {100, 0, 0}, {100, 0, 0}, {100, 0, 0}, false, true},
    {"all-gpu-4x2", 4, 2, {100, 0, 0}, {100, 0, 0}, {100, 0, 0}, false, true},
    {"weights-cpu-8x1", 8, 1, {0, 100, 0}, {100, 0, 0}, {100, 0, 0}, false, true},
    {"weights-half-cpu-4x2", 4, 2, {50, 50, 0}, {100, 0, 0}, {100, 0, 0}},
    {"weights-half-disk-8x1", 8, 1, {50, 0, 50}, {100, 0, 0}, {100, 0, 0}},
    {"cache-cpu-attn-4x2", 4, 2, {100, 0, 0}, {0, 100, 0}, {100, 0, 0}, true, true},
    {"weights-cpu-act-cpu-4x2", 4, 2, {0, 100, 0}, {100, 0, 0}, {0, 100, 0}},
};

ModelConfig grid_model(const Backend& backend, const EngineCalibrationOptions& o, int layers) {
  const std::string preset = !o.preset.empty() ? o.preset : backend.device() == Device::CUDA ? "opt-6.7b" : "opt-1.3b";
  std::optional<ModelConfig> cfg = config_preset(preset);
  if (!cfg) STRATA_FAIL("engine calibration: unknown model preset '" << preset << "'");
  if (layers < 1) STRATA_FAIL("engine calibration: layers must be at least 1, got " << layers);
  cfg->n_layers = std::min(cfg->n_layers, layers);
  return *cfg;
}

// The layer counts the grid runs at: `layers`, and `short_layers` where that is another count.
std::vector<int> layer_counts(const EngineCalibrationOptions& o) {
  if (o.short_layers < 0) STRATA_FAIL("engine calibration: short_layers must be 0 (none) or more, got " << o.short_layers);
  std::vector<int> v = {o.layers};
  if (o.short_layers > 0 && o.short_layers != o.layers) v.push_back(o.short_layers);
  return v;
}

// "4 layers", or "4 and 2 layers" (the counts the runs actually have: a preset may have fewer).
std::string layers_text(const std::vector<CalibrationSample>& runs) {
  std::vector<int> counts;
  for (const CalibrationSample& s : runs)
    if (std::find(counts.begin(), counts.end(), s.config.n_layers) == counts.end()) counts.push_back(s.config.n_layers);
  std::string text;
  for (size_t i = 0; i < counts.size(); ++i)
    text += (i == 0 ? "" : i + 1 == counts.size() ? " and " : ", ") + std::to_string(counts[i]);
  return text + " layers";
}

// One grid policy on the engine: a warm-up block, then a measured one; nullopt (said on the
// progress) when a tier is too small for it. A run at the short layer count is named so.
std::optional<CalibrationSample> run_grid_policy(Backend& backend, const EngineCalibrationOptions& o,
                                                 const ModelConfig& cfg, const WeightSource& weights,
                                                 const GridPolicy& g, bool short_count) {
  Policy p;
  p.gpu_batch_size = g.gbs;
  p.num_gpu_batches = g.ngb;
  p.weights = g.weights;
  p.kv_cache = g.cache;
  p.activations = g.activations;
  p.cpu_attention = g.cpu_attention;
  OffloadOptions opt;
  opt.policy = p;
  opt.offload_dir = o.offload_dir.empty() ? default_offload_dir() : o.offload_dir;
  opt.cpu_threads = o.threads;
  CalibrationSample s;
  s.name = short_count ? std::string(g.name) + "-" + std::to_string(cfg.n_layers) + "l" : g.name;
  s.config = cfg;
  s.policy = p;
  s.workload = {o.prompt_len, o.gen_len};
  try {
    OffloadEngine engine(cfg, weights, backend, opt, {o.prompt_len, o.gen_len});
    const std::vector<GenRequest> reqs = synthetic_requests(p.block_size(), o.prompt_len, o.gen_len, cfg.vocab_size);
    std::vector<GenRequest> warm = reqs;  // first touches of every buffer stay out of the figures
    for (GenRequest& r : warm) r.sampling.max_new_tokens = 1;
    engine.generate(warm);
    const OffloadReport before = engine.report();
    GenStats stats;
    engine.generate(reqs, &stats);
    const PhaseBusy busy = busy_between(before, engine.report());
    s.prefill_s = stats.prefill_seconds;
    s.decode_s = stats.decode_seconds;
    s.prefill_busy = busy.prefill;
    s.decode_busy = busy.decode;
  } catch (const Error& e) {  // a tier too small for this run: the others still fit the profile
    if (o.progress) o.progress("engine calibration: " + s.name + " left out: " + e.what());
    return std::nullopt;
  }
  if (o.progress) {
    std::ostringstream line;
    line.precision(3);
    line << "engine calibration: " << s.name << " (" << cfg.name << ", " << cfg.n_layers << " layers): prefill "
         << s.prefill_s << " s, decode " << s.decode_s << " s";
    o.progress(line.str());
  }
  return s;
}

}  // namespace

std::vector<CalibrationSample> engine_calibration_runs(Backend& backend, const EngineCalibrationOptions& o) {
  std::vector<CalibrationSample> samples;
  for (const int layers : layer_counts(o)) {
    const ModelConfig cfg = grid_model(backend, o, layers);
    const std::unique_ptr<WeightSource> weights = make_dummy_source(cfg);
    const bool short_count = layers != o.layers;
    for (const GridPolicy& g : kGrid)
      if (!short_count || g.at_short_count)
        if (std::optional<CalibrationSample> s = run_grid_policy(backend, o, cfg, *weights, g, short_count))
          samples.push_back(std::move(*s));
  }
  if (samples.size() < 2) STRATA_FAIL("engine calibration: fewer than two runs fit this machine's memory");
  return samples;
}

CalibrationFit calibrate_on_engine(const HardwareProfile& measured, Backend& backend,
                                   const EngineCalibrationOptions& options) {
  const std::vector<CalibrationSample> runs = engine_calibration_runs(backend, options);
  std::ostringstream by;
  by << "strata profile on the engine (dummy " << runs.front().config.name << ", " << layers_text(runs)
     << ", prompt " << options.prompt_len << ", generation " << options.gen_len << ")";
  return calibrate_profile(measured, runs, by.str());
}

ProfileRefinement engine_refinement() {
  return [](const HardwareProfile& measured, Backend& backend, const ProfileOptions& profile) {
    EngineCalibrationOptions o;
    o.offload_dir = profile.offload_dir;
    o.threads = profile.threads;
    o.progress = profile.progress;
    const CalibrationFit fit = calibrate_on_engine(measured, backend, o);
    if (o.progress) {
      double before = 0, after = 0;
      for (double e : fit.error_before) before = std::max(before, std::fabs(e));
      for (double e : fit.error_after) after = std::max(after, std::fabs(e));
      std::ostringstream line;
      line.precision(2);
      line << "engine calibration: worst |error| of the runs' throughput " << 100 * before << "% with the bare rates, "
           << 100 * after << "% fitted";
      o.progress(line.str());
    }
    return fit.profile;
  };
}

}  // namespace strata
