// `strata bench`: throughput tables in the paper's terms (issue 12). A suite (YAML) lists cases:
// a model (a preset runs on dummy weights), a prompt and generation length, and a policy file or
// `auto` (the cost model's search). Each case runs one block of synthetic prompts of exactly
// prompt_len tokens through the offloading engine, `repeat` times, and records what it measured
// (prefill, decode and total throughput: FlexGen's generated tokens / (prefill + decode time)),
// what the cost model predicted for the same policy, the links' GB/s against the profile's peaks
// and the peak memory per tier. Results go to DIR/results.jsonl and DIR/results.md.
#pragma once
#include <filesystem>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "strata/model/config.h"
#include "strata/offload/engine.h"
#include "strata/policy/calibrate.h"
#include "strata/policy/policy.h"

namespace strata {

struct BenchCase {
  std::string name;
  std::string model;        // a preset (dummy weights), a model directory or a .gguf
  int prompt_len = 0, gen_len = 0;
  std::string policy;       // a policy file (relative to the suite's directory), or "auto"
  bool compress = false;    // with auto: the search may also pick 4-bit weights and cache
  std::string gpu_mem, cpu_mem, disk_mem;  // caps of this case (empty: the command line's)
  // > 0 and < gen_len - 1: run only this many decode steps and project decode to gen_len - 1 steps
  // from their mean (FlexGen's fewer_batch); the table marks the figures "projected".
  int decode_steps = 0;
  // > 0: a preset cut to its first `layers` layers (dummy weights only), for shapes too large to
  // run whole on the machine (a Mixtral-shaped layer is 5.6 GB in fp32).
  int layers = 0;
  double max_latency_s = 0;  // > 0, with policy auto: the search's bound on a block's time (seconds)
  int line = 0;             // in the suite file, for messages
};

// The preset `model` (a name or dummy:NAME) cut to `layers` layers (0: whole); a model directory
// or file cannot be cut. The config the bench runs and calibration re-reads.
ModelConfig bench_config(const std::string& model, int layers);

// Prompts of exactly `len` tokens, spread over the vocabulary, no EOS stop, `gen` new tokens each.
std::vector<GenRequest> synthetic_requests(int count, int len, int gen, int vocab);

// Each lane's busy seconds between two engine reports, split into prefill and decode (the CPU
// attention lane works in decode only): what calibration compares with the cost model's terms.
struct PhaseBusy {
  std::array<double, kNumLanes> prefill{}, decode{};
};
PhaseBusy busy_between(const OffloadReport& before, const OffloadReport& after);

struct BenchSuite {
  std::string name;
  std::filesystem::path dir;  // policy paths are relative to it
  std::vector<BenchCase> cases;
};

// Parses a suite; errors name the source, the line and the field.
BenchSuite parse_bench_suite(const std::string& yaml_text, const std::string& source_name,
                             const std::filesystem::path& dir = ".");
// `file_or_name`: a YAML file, or the name of one in bench/suites/ (smoke-cpu, paper-table2, h100).
BenchSuite load_bench_suite(const std::string& file_or_name);

struct BenchOptions {
  std::string suite;
  std::string device = "auto";
  std::string dtype = "auto";  // the GPU's activations (--dtype): auto (fp16 here), fp16, bf16
  // Profile for predictions and `auto`. Empty: the cached one of `strata profile`, measured and
  // cached first when there is none, unless measure_profile is false (--no-profile: then no
  // predictions).
  std::filesystem::path hardware;
  bool measure_profile = true;
  bool quick_profile = false;  // measure with --quick's settings (tests)
  std::filesystem::path offload_dir;
  std::filesystem::path out = "bench-out";
  int repeat = 1;
  std::string gpu_mem, cpu_mem, disk_mem;  // caps for every case that names none
  int threads = 0;
  bool progress = true;
  // --calibrate: fit the profile to the runs (policy/calibrate.h) and write OUT/calibrated-profile.yaml
  // and OUT/calibration.md (needs a hardware profile).
  bool calibrate = false;
};

struct BenchMeasure {
  double prefill_tok_s = 0, decode_tok_s = 0, total_tok_s = 0;
};

struct BenchCaseResult {
  BenchCase spec;
  std::string status = "ok";             // "ok", or why the case did not run (e.g. does not fit)
  std::string policy_yaml;
  std::vector<BenchMeasure> runs;         // one per repeat
  std::optional<BenchMeasure> predicted;  // the cost model's, for the policy run
  double ctog_gbps = 0, dtoc_gbps = 0;    // achieved on the links (last repeat)
  double ctog_peak_gbps = 0, dtoc_peak_gbps = 0;  // the profile's
  double peak_gpu = 0, peak_cpu = 0, peak_disk = 0;  // bytes reserved per tier
  // Attention delegated to the CPU (last repeat): its lane's seconds and cache bytes read per
  // second (OffloadReport::cpu_attention_*); 0 without it.
  double cpu_attention_s = 0, cpu_attention_gbps = 0;
  // The engine thread's waits for the device and its lanes (last repeat): per decode step, and
  // their seconds in all (OffloadReport::host_waits; docs/offload.md, "Events").
  double host_waits_per_decode_step = 0, host_wait_s = 0;
  // Bytes over the links in one run (last repeat) and the cost model's for the policy.
  double ctog_bytes = 0, gtoc_bytes = 0, ctog_bytes_predicted = 0, gtoc_bytes_predicted = 0;
  // Mixtures of experts (last repeat): the CPU lane's seconds on experts (cpu_experts), and the
  // distinct experts a decode step's GPU batch activated per sparse layer, measured (the run's
  // routing less its prefill's: the warm-up's) and as the cost model expects for uniform routing.
  double cpu_experts_s = 0, decode_active_experts = 0, decode_active_experts_expected = 0;
  // FNV-1a of every generated token of the run in request order: equal across placements of one
  // model and workload when their greedy tokens are.
  uint64_t tokens_digest = 0;
  // What calibration needs (mean over repeats): the model, the policy run, the phases' seconds
  // and each lane's busy seconds per phase (compute, cpu->gpu, gpu->cpu, disk).
  ModelConfig config;
  Policy policy;
  double prefill_s = 0, decode_s = 0;     // as run (decode: decode_steps_run steps)
  int decode_steps_run = 0;               // decode steps each run made (gen_len - 1 unless projected)
  bool projected() const { return decode_steps_run < spec.gen_len - 1; }
  std::array<double, kNumLanes> prefill_busy{}, decode_busy{};
  BenchMeasure mean() const;
  BenchMeasure sd() const;
};

// Runs every case (a case that fails, e.g. does not fit its caps, is recorded as such and the
// others run), writes OUT/results.jsonl and OUT/results.md, and returns the results.
// OUT/peers.jsonl, when there, holds the peers' lines (bench/peers/: FlexGen, accelerate), the
// same fields with "engine" naming the peer: results.md shows each under Strata's row of the same case.
std::vector<BenchCaseResult> run_bench(const BenchOptions& options, std::ostream& log);

// The JSON objects of a .jsonl file, blank lines skipped; errors name the file and the line.
std::vector<nlohmann::json> read_jsonl(const std::filesystem::path& file);

// The calibration samples of the cases that ran.
std::vector<CalibrationSample> calibration_samples(const std::vector<BenchCaseResult>& results);
// Fits `hw` to the results and writes OUT/calibrated-profile.yaml and OUT/calibration.md (per case:
// measured, predicted before and after, leave-one-out; per lane: the fitted factors). Returns the fit.
CalibrationFit write_calibration(const HardwareProfile& hw, const std::vector<BenchCaseResult>& results,
                                 const std::filesystem::path& out, std::ostream& log);
// The same from the Strata lines of an earlier run's DIR/results.jsonl (`strata bench --calibrate
// --report DIR`): their models (presets or paths), policies, phase seconds and lane busy times.
std::vector<CalibrationSample> calibration_samples(const std::filesystem::path& results_jsonl);
CalibrationFit write_calibration(const HardwareProfile& hw, const std::vector<CalibrationSample>& samples,
                                 const std::filesystem::path& out, std::ostream& log);
// Rewrites DIR/results.md from DIR/results.jsonl and DIR/peers.jsonl (after the peers ran).
void write_bench_report(const std::filesystem::path& dir);

}  // namespace strata
