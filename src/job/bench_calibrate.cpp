// `strata bench --calibrate`: the suite's runs as calibration samples, the fit, and its records
// (include/strata/job/bench.h, include/strata/policy/calibrate.h).
#include <algorithm>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "strata/core/error.h"
#include "strata/job/bench.h"
#include "strata/model/model_loader.h"

namespace strata {
namespace {

std::string percent(double error) {
  if (std::isnan(error)) return "n/a";  // a leave-one-out fit that could not be made
  std::ostringstream os;
  os << (error >= 0 ? "+" : "") << std::fixed << std::setprecision(0) << 100 * error << "%";
  return os.str();
}

// "median / worst" of |errors|, NaN (no figure) left out.
std::string summary(std::vector<double> errors) {
  errors.erase(std::remove_if(errors.begin(), errors.end(), [](double e) { return std::isnan(e); }), errors.end());
  if (errors.empty()) return "";
  for (double& e : errors) e = std::fabs(e);
  std::sort(errors.begin(), errors.end());
  const size_t n = errors.size();
  const double median = n % 2 ? errors[n / 2] : (errors[n / 2 - 1] + errors[n / 2]) / 2;
  std::ostringstream os;
  os << std::fixed << std::setprecision(0) << 100 * median << "% / " << 100 * errors.back() << "%";
  return os.str();
}

}  // namespace

std::vector<CalibrationSample> calibration_samples(const std::vector<BenchCaseResult>& results) {
  std::vector<CalibrationSample> samples;
  for (const BenchCaseResult& r : results) {
    if (r.status != "ok" || r.runs.empty()) continue;
    CalibrationSample s;
    s.name = r.spec.name;
    s.config = r.config;
    s.policy = r.policy;
    s.workload = {r.spec.prompt_len, r.decode_steps_run + 1};  // what ran (a projected case: fewer steps)
    s.prefill_s = r.prefill_s;
    s.decode_s = r.decode_s;
    s.prefill_busy = r.prefill_busy;
    s.decode_busy = r.decode_busy;
    samples.push_back(std::move(s));
  }
  return samples;
}

std::vector<CalibrationSample> calibration_samples(const std::filesystem::path& file) {
  std::vector<CalibrationSample> samples;
  for (const nlohmann::json& row : read_jsonl(file)) {
    if (row.value("engine", std::string("strata")) != "strata" || row.value("status", std::string()) != "ok") continue;
    const std::string name = row.value("name", std::string("?"));
    if (!row.contains("seconds") || !row["seconds"].contains("prefill_busy"))
      STRATA_FAIL(file.string() << ": case " << name
                                << " has no phase seconds (results.jsonl from before calibration support; rerun the suite)");
    try {
      CalibrationSample s;
      s.name = name;
      s.config = bench_config(row.at("model").get<std::string>(), row.value("layers", 0));
      s.policy = parse_policy(row.at("policy").get<std::string>(), file.string() + ": case " + name);
      const nlohmann::json& sec = row.at("seconds");
      const int gen_len = row.at("gen_len").get<int>();
      s.workload = {row.at("prompt_len").get<int>(), sec.value("decode_steps", gen_len - 1) + 1};
      s.prefill_s = sec.at("prefill").get<double>();
      s.decode_s = sec.at("decode").get<double>();
      for (auto [key, busy] : {std::pair{"prefill_busy", &s.prefill_busy}, {"decode_busy", &s.decode_busy}}) {
        const nlohmann::json& b = sec.at(key);
        // "cpu_attention" is absent from results of before it had a lane: unmeasured then (calibrate.h).
        *busy = {b.at("compute").get<double>(), b.at("cpu_to_gpu").get<double>(), b.at("gpu_to_cpu").get<double>(),
                 b.at("disk").get<double>(), b.value("cpu_attention", 0.0)};
      }
      samples.push_back(std::move(s));
    } catch (const nlohmann::json::exception& e) {
      STRATA_FAIL(file.string() << ": case " << name << ": " << e.what());
    }
  }
  return samples;
}

CalibrationFit write_calibration(const HardwareProfile& hw, const std::vector<BenchCaseResult>& results,
                                 const std::filesystem::path& out, std::ostream& log) {
  return write_calibration(hw, calibration_samples(results), out, log);
}

CalibrationFit write_calibration(const HardwareProfile& hw, const std::vector<CalibrationSample>& samples,
                                 const std::filesystem::path& out, std::ostream& log) {
  const CalibrationFit f = calibrate_profile(hw, samples);
  std::filesystem::create_directories(out);
  const std::filesystem::path yaml = out / "calibrated-profile.yaml", md_path = out / "calibration.md";
  std::ofstream(yaml) << hardware_profile_to_yaml(f.profile);
  std::ofstream md(md_path);
  if (!md) STRATA_FAIL("bench: cannot write " << md_path.string());
  md << "# Calibration of " << hw.name << "\n\n"
     << "Error = predicted / measured total throughput - 1. Leave-one-out: each case predicted by a\n"
     << "profile fitted to the other cases only (the out-of-sample figure).\n\n"
     << "| case | measured tok/s | before | after | leave-one-out |\n|---|---|---|---|---|\n";
  for (size_t i = 0; i < samples.size(); ++i) {
    const CalibrationSample& s = samples[i];
    const double measured = double(s.policy.block_size()) * s.workload.gen_len / (s.prefill_s + s.decode_s);
    md << "| " << s.name << " | " << std::fixed << std::setprecision(2) << measured << " | "
       << percent(f.error_before[i]) << " | " << percent(f.error_after[i]) << " | "
       << (f.error_leave_one_out.empty() ? "" : percent(f.error_leave_one_out[i])) << " |\n";
  }
  md << "| median / worst | | " << summary(f.error_before) << " | " << summary(f.error_after) << " | "
     << summary(f.error_leave_one_out) << " |\n\n"
     << "Fitted: compute lane x" << f.gemm_factor << " on GEMMs and dequantization, x" << f.gpu_attention_factor
     << " on the GPU tier's attention, " << f.overhead_s * 1e3 << " ms per layer and unit of work, "
     << f.step_overhead_s * 1e3 << " ms per step and unit of work outside the layers, " << f.link_interference
     << " s per second of the stage's copies; cpu attention x"
     << f.cpu_attention_factor << "; cpu->gpu x"
     << f.link_factor[kLaneH2d] << ", gpu->cpu x" << f.link_factor[kLaneD2h] << ", disk x"
     << f.link_factor[kLaneDisk] << " (busy time per predicted second); overlap slowdown "
     << f.overlap_slowdown << ".\n\n";
  if (!f.undetermined.empty())
    md << "Not determined by these runs: " << undetermined_list(f) << ". Their compute terms are combinations\n"
       << "of the others', so the fit kept the GPU attention factor at the GEMM's and the overhead at 0;\n"
       << "cases that differ in GPU batch size, prompt length or attention placement would determine them.\n"
       << "(\"cpu attention\": no case measured the CPU attention lane; its factor stays 1.)\n\n";
  if (!f.dropped.empty())
    md << "Dropped: " << dropped_list(f) << ". A negative overhead or a non-positive attention factor\n"
       << "has no physical meaning, and a part less than 3 standard errors from 0 is one the runs' scatter\n"
       << "could have made: the fit set each as for an undetermined part and refitted. A sign drop says the\n"
       << "compute terms miss a cost that grows another way than the fitted columns.\n\n";
  md << "## Per term, before calibration\n\n"
     << "Each lane's busy seconds against the cost model's term for it (the base profile), and each\n"
     << "phase's wall time against the predicted stage total (with overlap, the max of the links and\n"
     << "the compute pipeline of the GPU and the CPU attention; docs/cost-model.md). A\n"
     << "staggered case's phases are its super-steps in which some GPU batch prefills, and the others.\n\n"
     << "| case | phase | compute | cpu->gpu | gpu->cpu | disk | cpu attention | wall |\n"
     << "|---|---|---|---|---|---|---|---|\n";
  auto pair = [](double predicted, double measured) {
    std::ostringstream os;
    os << std::fixed << std::setprecision(3) << predicted << " / " << measured;
    return os.str();
  };
  for (const CalibrationSample& s : samples) {
    const auto lanes = predicted_lane_seconds(hw, s);
    const Prediction p = evaluate(s.config, s.policy, s.workload, hw);
    for (int phase = 0; phase < 2; ++phase) {
      const auto& busy = phase == 0 ? s.prefill_busy : s.decode_busy;
      md << "| " << s.name << " | " << (phase == 0 ? "prefill" : "decode");
      for (int lane = 0; lane < kNumLanes; ++lane) md << " | " << pair(lanes[size_t(phase)][size_t(lane)], busy[size_t(lane)]);
      md << " | " << pair(phase == 0 ? p.prefill_s : p.decode_s, phase == 0 ? s.prefill_s : s.decode_s) << " |\n";
    }
  }
  md << "\n(predicted / measured seconds per block.)\n";
  log << "[bench] calibration: median / worst |error| " << summary(f.error_before) << " before, "
      << summary(f.error_after) << " after (leave-one-out " << summary(f.error_leave_one_out) << "); wrote "
      << yaml.string() << " and " << md_path.string() << "\n";
  if (!f.undetermined.empty())
    log << "[bench] calibration: these runs do not determine " << undetermined_list(f)
        << " (kept at the factor it folds into / 0; see " << md_path.string() << ")\n";
  if (!f.dropped.empty())
    log << "[bench] calibration: dropped: " << dropped_list(f) << " (see " << md_path.string() << ")\n";
  return f;
}

}  // namespace strata
