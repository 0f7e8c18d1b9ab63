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
};

// calibrate-cpu's grid (bench/suites/calibrate-cpu.yaml) without its 4-bit case: what every
// compute column and lane needs to be told apart (docs/cost-model.md, "Calibration").
const GridPolicy kGrid[] = {
    {"all-gpu-8x1", 8, 1, {100, 0, 0}, {100, 0, 0}, {100, 0, 0}},
    {"all-gpu-4x2", 4, 2, {100, 0, 0}, {100, 0, 0}, {100, 0, 0}},
    {"weights-cpu-8x1", 8, 1, {0, 100, 0}, {100, 0, 0}, {100, 0, 0}},
    {"weights-half-cpu-4x2", 4, 2, {50, 50, 0}, {100, 0, 0}, {100, 0, 0}},
    {"weights-half-disk-8x1", 8, 1, {50, 0, 50}, {100, 0, 0}, {100, 0, 0}},
    {"cache-cpu-attn-4x2", 4, 2, {100, 0, 0}, {0, 100, 0}, {100, 0, 0}, true},
    {"weights-cpu-act-cpu-4x2", 4, 2, {0, 100, 0}, {100, 0, 0}, {0, 100, 0}},
};

// The probes: all on the GPU tier in one GPU batch and in two (twice the units of work per step).
const GridPolicy kProbes[] = {kGrid[0], kGrid[1]};

// A probe's model: the grid model's architecture with layers too narrow to do measurable work
// (hidden 64, two heads of 32, MLP 256; its own vocabulary, so the head and the sampling over it
// cost what they do), and a short prompt: what its compute lane is busy for is the engine's cost
// per layer step and per step, which the terms do not price.
constexpr int kProbeHidden = 64, kProbeHeads = 2, kProbePromptLen = 8;
// Blocks measured per probe: each is a few milliseconds long, which the scheduler's noise moves by
// a third (three blocks a probe left the step part's sign to chance on the 2-core VM); ten steady
// it for a fraction of a second.
constexpr int kProbeRepeats = 10;
// The probes' long layer count, in grid layers: a narrow layer step costs about 0.05 ms on the 2-core
// VM, so 4 and 2 layers differ by less than the blocks' noise; 16 and 2 tell it (and cost ~10 ms).
constexpr int kProbeLayerFactor = 4;

ModelConfig probe_model(ModelConfig cfg) {
  cfg.name += "-narrow";
  cfg.hidden = kProbeHidden;
  cfg.intermediate = 4 * kProbeHidden;
  if (cfg.n_experts > 0) cfg.expert_intermediate = 4 * kProbeHidden;
  cfg.n_kv_heads = cfg.n_kv_heads < cfg.n_heads ? 1 : kProbeHeads;
  cfg.n_heads = kProbeHeads;
  cfg.head_dim = kProbeHidden / kProbeHeads;
  return cfg;
}

ModelConfig grid_model(const Backend& backend, const EngineCalibrationOptions& o, int layers) {
  const std::string preset = !o.preset.empty() ? o.preset : backend.device() == Device::CUDA ? "opt-6.7b" : "opt-1.3b";
  std::optional<ModelConfig> cfg = config_preset(preset);
  if (!cfg) STRATA_FAIL("engine calibration: unknown model preset '" << preset << "'");
  if (layers < 1) STRATA_FAIL("engine calibration: layers must be at least 1, got " << layers);
  cfg->keep_layers(std::min(cfg->n_layers, layers));
  return *cfg;
}

// The layer counts the probes run at: kProbeLayerFactor times `layers`, and `short_layers` where
// that is another count.
std::vector<int> probe_layer_counts(const EngineCalibrationOptions& o) {
  if (o.short_layers < 0) STRATA_FAIL("engine calibration: short_layers must be 0 (none) or more, got " << o.short_layers);
  std::vector<int> v = {kProbeLayerFactor * o.layers};
  if (o.short_layers > 0 && o.short_layers != v.front()) v.push_back(o.short_layers);
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

// One grid policy on the engine: a warm-up block, then `repeats` measured ones (their sums);
// nullopt (said on the progress) when a tier is too small for it. A run at the short layer count
// is named so.
std::optional<CalibrationSample> run_grid_policy(Backend& backend, const EngineCalibrationOptions& o,
                                                 const ModelConfig& cfg, const WeightSource& weights,
                                                 const GridPolicy& g, bool short_count, Workload w, int repeats = 1) {
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
  s.workload = w;
  try {
    OffloadEngine engine(cfg, weights, backend, opt, {w.prompt_len, w.gen_len});
    const std::vector<GenRequest> reqs = synthetic_requests(p.block_size(), w.prompt_len, w.gen_len, cfg.vocab_size);
    std::vector<GenRequest> warm = reqs;  // first touches of every buffer stay out of the figures
    for (GenRequest& r : warm) r.sampling.max_new_tokens = 1;
    engine.generate(warm);
    for (int i = 0; i < repeats; ++i) {
      const OffloadReport before = engine.report();
      GenStats stats;
      engine.generate(reqs, &stats);
      const PhaseBusy busy = busy_between(before, engine.report());
      s.prefill_s += stats.prefill_seconds;
      s.decode_s += stats.decode_seconds;
      for (int lane = 0; lane < kNumLanes; ++lane) {
        s.prefill_busy[size_t(lane)] += busy.prefill[size_t(lane)];
        s.decode_busy[size_t(lane)] += busy.decode[size_t(lane)];
      }
    }
    // The sample stands for one block.
    s.prefill_s /= repeats, s.decode_s /= repeats;
    for (int lane = 0; lane < kNumLanes; ++lane) s.prefill_busy[size_t(lane)] /= repeats, s.decode_busy[size_t(lane)] /= repeats;
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
  const ModelConfig cfg = grid_model(backend, o, o.layers);
  const std::unique_ptr<WeightSource> weights = make_dummy_source(cfg);
  for (const GridPolicy& g : kGrid)
    if (std::optional<CalibrationSample> s =
            run_grid_policy(backend, o, cfg, *weights, g, false, {o.prompt_len, o.gen_len}))
      samples.push_back(std::move(*s));
  if (samples.size() < 2) STRATA_FAIL("engine calibration: fewer than two runs fit this machine's memory");
  return samples;
}

std::vector<CalibrationSample> overhead_probe_runs(Backend& backend, const EngineCalibrationOptions& o) {
  std::vector<CalibrationSample> probes;
  for (const int layers : probe_layer_counts(o)) {
    const ModelConfig cfg = probe_model(grid_model(backend, o, layers));
    const std::unique_ptr<WeightSource> weights = make_dummy_source(cfg);
    for (const GridPolicy& g : kProbes)
      if (std::optional<CalibrationSample> s = run_grid_policy(backend, o, cfg, *weights, g, layers == o.short_layers,
                                                               {kProbePromptLen, o.gen_len}, kProbeRepeats))
        probes.push_back(std::move(*s));
  }
  if (probes.empty()) STRATA_FAIL("engine calibration: no overhead probe fits this machine's memory");
  return probes;
}

CalibrationFit calibrate_on_engine(const HardwareProfile& measured, Backend& backend,
                                   const EngineCalibrationOptions& options) {
  const std::vector<CalibrationSample> probes = overhead_probe_runs(backend, options);
  std::ostringstream on;
  on << probes.front().config.name << " (hidden " << kProbeHidden << "), " << layers_text(probes) << ", prompt "
     << kProbePromptLen;
  // Unmeasured (the lane's timer cannot see blocks this short), the grid's fit fits them as
  // `strata bench --calibrate` does, from the grid's one layer count.
  const std::optional<MeasuredOverheads> overheads = measure_overheads(measured, probes, on.str());
  if (options.progress) {
    std::ostringstream line;
    line.precision(3);
    if (overheads)
      line << "engine calibration: overheads measured on " << on.str() << ": " << overheads->layer_s * 1e3
           << " ms per layer-unit, " << overheads->step_s * 1e3 << " ms per step-unit";
    else
      line << "engine calibration: the probes' compute lane read no time; the overheads are fitted to the grid";
    options.progress(line.str());
  }
  const std::vector<CalibrationSample> runs = engine_calibration_runs(backend, options);
  std::ostringstream by;
  by << "strata profile on the engine (dummy " << runs.front().config.name << ", " << layers_text(runs)
     << ", prompt " << options.prompt_len << ", generation " << options.gen_len << ")";
  return calibrate_profile(measured, runs, by.str(), overheads ? &*overheads : nullptr);
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
