// `strata bench`: a suite of cases through the offloading engine, measured beside the cost
// model's predictions (src/job/bench.cpp).
#include <filesystem>
#include <fstream>
#include <iostream>

#include "commands.h"
#include "strata/core/error.h"
#include "strata/job/bench.h"

namespace strata::cli {

void add_bench_command(CLI::App& app) {
  auto opt = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand("bench", "run a benchmark suite: measured throughput beside the cost model's");
  auto report = std::make_shared<std::string>();
  auto* suite =
      cmd->add_option("--suite", opt->suite, "suite YAML, or a name in bench/suites/ (smoke-cpu, calibrate-cpu, overlap-cpu, paper-table2, h100, calibrate-gpu)");
  auto* rep = cmd->add_option("--report", *report,
                              "run nothing: rewrite DIR/results.md from DIR/results.jsonl and the peers' "
                              "DIR/peers.jsonl (bench/peers/)");
  suite->excludes(rep);
  rep->excludes(suite);
  cmd->add_option("--device", opt->device, "cpu, cuda or auto (cuda when a GPU is present)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str();
  cmd->add_option("--dtype", opt->dtype,
                  "GPU activations and weights: auto (bf16 for a bf16 checkpoint on sm_80 and newer, else fp16), "
                  "fp16 or bf16; the cpu backend computes in fp32")
      ->check(CLI::IsMember({"auto", "fp16", "bf16"}))
      ->capture_default_str();
  cmd->add_option("--hardware", opt->hardware,
                  "hardware profile for predictions and policy: auto (default: the cached one of strata profile, "
                  "measured now when there is none)");
  cmd->add_flag("!--no-profile", opt->measure_profile,
                "never measure a hardware profile: with none given or cached, no predictions");
  cmd->add_option("--offload-dir", opt->offload_dir, "directory for the disk tier");
  cmd->add_option("--out", opt->out, "directory for results.jsonl and results.md")->capture_default_str();
  cmd->add_option("--repeat", opt->repeat, "timed runs per case (mean ± sd)")->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--gpu-mem", opt->gpu_mem, "GPU tier cap for cases that give none, e.g. 16GiB");
  cmd->add_option("--cpu-mem", opt->cpu_mem, "CPU tier cap for cases that give none");
  cmd->add_option("--disk-mem", opt->disk_mem, "disk tier cap for cases that give none");
  cmd->add_option("--threads", opt->threads, "CPU threads (0: all cores)")->capture_default_str();
  cmd->add_flag("!--no-progress", opt->progress, "no progress lines");
  cmd->add_flag("--calibrate", opt->calibrate,
                "fit the hardware profile to the runs: OUT/calibrated-profile.yaml and OUT/calibration.md; with --report DIR, to DIR's recorded runs");
  cmd->callback([opt, report] {
    if (!report->empty() && opt->calibrate) {  // fit the profile to an earlier run's results
      if (opt->hardware.empty()) STRATA_FAIL("bench --calibrate --report DIR needs --hardware HW.yaml, the profile to refine");
      const std::filesystem::path dir = *report;
      write_calibration(load_hardware_profile(opt->hardware), calibration_samples(dir / "results.jsonl"), dir, std::cerr);
      std::ifstream md(dir / "calibration.md");
      std::cout << md.rdbuf();
      return;
    }
    if (!report->empty()) {
      write_bench_report(*report);
      std::ifstream md(std::filesystem::path(*report) / "results.md");
      std::cout << md.rdbuf();
      return;
    }
    if (opt->suite.empty()) STRATA_FAIL("bench: --suite is required (or --report DIR)");
    const std::vector<BenchCaseResult> results = run_bench(*opt, std::cerr);
    std::ifstream md(opt->out / "results.md");
    std::cout << md.rdbuf();
  });
}

}  // namespace strata::cli
