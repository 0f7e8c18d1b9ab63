// `strata bench`: suites parse with errors naming the line and field; a run measures every case,
// records the cost model's prediction beside it, reports a case that does not fit and goes on.
#include "test_paths.h"
#include "cli_support.h"
#include "temp_files.h"
#include <catch2/catch.hpp>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <nlohmann/json.hpp>

#include "strata/core/error.h"
#include "strata/job/bench.h"
#include "strata/policy/policy.h"
#include "strata/profile/hardware.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir(const std::string& what) { return test::temp_dir("bench_" + what); }

const std::string kCase = "  - {name: a, model: opt-125m, prompt_len: 16, gen_len: 4, policy: p.yaml}\n";

// A run of DIR/suite.yaml on the CPU backend (2 threads, no progress) into DIR/out, predicting with
// `hardware` (a profile in policies/hardware/) where one is named; none is measured.
BenchOptions cpu_run(const fs::path& dir, const std::string& hardware = "") {
  BenchOptions opt;
  opt.measure_profile = false;
  opt.suite = (dir / "suite.yaml").string();
  opt.device = "cpu";
  if (!hardware.empty()) opt.hardware = std::string(STRATA_FIXTURES_DIR) + "/../../policies/hardware/" + hardware;
  opt.out = dir / "out";
  opt.offload_dir = dir / "offload";
  opt.threads = 2;
  opt.progress = false;
  return opt;
}

}  // namespace

TEST_CASE("bench suites: cases parse, bad ones are refused naming the line and field", "[bench]") {
  const BenchSuite s = parse_bench_suite("name: mine\ncases:\n" + kCase +
                                             "  - {name: b, model: opt-1.3b, prompt_len: 8, gen_len: 2, policy: auto, "
                                             "compress: true, gpu_mem: 2GiB}\n",
                                         "s.yaml", "/x");
  REQUIRE(s.cases.size() == 2);
  CHECK(s.name == "mine");
  CHECK(s.cases[0].model == "opt-125m");
  CHECK(s.cases[0].prompt_len == 16);
  CHECK(s.cases[0].line == 3);
  CHECK(s.cases[1].policy == "auto");
  CHECK(s.cases[1].compress);
  CHECK(s.cases[1].gpu_mem == "2GiB");
  CHECK(s.dir == "/x");

  CHECK_THROWS_WITH(parse_bench_suite("cases:\n" + kCase + "  - {name: b, model: m, prompt_len: 4, gen_len: 2, policy: p, "
                                                           "colour: red}\n", "s.yaml"),
                    Catch::Contains("s.yaml:3: unknown key 'case.colour'"));
  CHECK_THROWS_WITH(parse_bench_suite("cases:\n  - {name: b, model: m, gen_len: 2, policy: p}\n", "s.yaml"),
                    Catch::Contains("s.yaml:2: case: missing field 'prompt_len'"));
  CHECK_THROWS_WITH(parse_bench_suite("cases:\n  - {name: b, model: m, prompt_len: -4, gen_len: 2, policy: p}\n", "s.yaml"),
                    Catch::Contains("s.yaml:2: field 'prompt_len' must be a positive integer"));
  CHECK_THROWS_WITH(parse_bench_suite("cases:\n" + kCase + kCase, "s.yaml"), Catch::Contains("s.yaml:3: case name 'a' is used twice"));
  CHECK_THROWS_WITH(parse_bench_suite("cases: []\n", "s.yaml"), Catch::Contains("'cases' must be a non-empty list"));
  CHECK_THROWS_WITH(parse_bench_suite("cases:\n  - {name: b, model: m, prompt_len: 4, gen_len: 2, policy: p, gpu_mem: lots}\n",
                                      "s.yaml"),
                    Catch::Contains("s.yaml:2:"));
  CHECK_THROWS_WITH(load_bench_suite("no-such-suite"), Catch::Contains("no such file, nor bench/suites/no-such-suite.yaml"));
}

TEST_CASE("bench runs every case, predicts beside measuring, and reports a case that does not fit", "[bench]") {
  const fs::path dir = temp_dir("run");
  std::ofstream(dir / "p.yaml") << "gpu_batch_size: 2\nnum_gpu_batches: 2\nweights: {gpu: 0, cpu: 100, disk: 0}\n"
                                   "kv_cache: {gpu: 0, cpu: 100, disk: 0}\nactivations: {gpu: 100, cpu: 0, disk: 0}\n"
                                   "compress_weights: {bits: 4, group_size: 64}\n";
  std::ofstream(dir / "p8.yaml") << "gpu_batch_size: 2\nnum_gpu_batches: 2\nweights: {gpu: 0, cpu: 100, disk: 0}\n"
                                    "kv_cache: {gpu: 0, cpu: 100, disk: 0}\nactivations: {gpu: 100, cpu: 0, disk: 0}\n"
                                    "compress_weights: {bits: 8, group_size: 32}\n"
                                    "compress_kv_cache: {bits: 4, group_size: 64}\n";
  std::ofstream(dir / "suite.yaml") << "name: tiny\ncases:\n" + kCase +
                                           "  - {name: too-big, model: opt-125m, prompt_len: 16, gen_len: 4, policy: "
                                           "p.yaml, gpu_mem: 1MB}\n"
                                           "  - {name: eight, model: opt-125m, prompt_len: 16, gen_len: 2, policy: p8.yaml}\n";
  // A profile so that the cost model predicts (the paper's machine: any profile will do here).
  BenchOptions opt = cpu_run(dir, "t4-paper.yaml");
  opt.repeat = 2;
  std::ostringstream log;
  const std::vector<BenchCaseResult> results = run_bench(opt, log);
  INFO(log.str());
  REQUIRE(results.size() == 3);
  CHECK(results[0].status == "ok");
  REQUIRE(results[0].runs.size() == 2);
  for (const BenchMeasure& m : results[0].runs) {
    CHECK(m.prefill_tok_s > 0);
    CHECK(m.decode_tok_s > 0);
    CHECK(m.total_tok_s > 0);
    // FlexGen's definitions: the total is every generated token over prefill plus decode time.
    // Block 2 x 2 = 4 sequences of 16 prompt tokens, 4 generated each, the first by prefill.
    const double prefill_s = 4 * 16 / m.prefill_tok_s;
    const double decode_s = 4 * (4 - 1) / m.decode_tok_s;
    CHECK(m.total_tok_s == Approx(4 * 4 / (prefill_s + decode_s)).epsilon(1e-9));
  }
  REQUIRE(results[0].predicted.has_value());
  CHECK(results[0].predicted->total_tok_s > 0);
  CHECK(results[0].ctog_gbps > 0);  // weights stream from the cpu tier
  CHECK_THAT(results[1].status, Catch::Contains("does not fit") && Catch::Contains("gpu"));

  std::ifstream jl(opt.out / "results.jsonl");
  std::string line;
  std::vector<nlohmann::json> rows;
  while (std::getline(jl, line)) rows.push_back(nlohmann::json::parse(line));
  REQUIRE(rows.size() == 3);
  CHECK(rows[0]["name"] == "a");
  CHECK(rows[0]["measured"]["total_tok_s"].get<double>() == Approx(results[0].mean().total_tok_s));
  CHECK(rows[0]["measured"]["repeats"] == 2);
  CHECK(rows[0]["predicted"]["total_tok_s"].get<double>() > 0);
  CHECK(rows[0]["policy"].get<std::string>().find("compress_weights") != std::string::npos);
  CHECK(rows[0]["machine"]["backend"] == "cpu");
  CHECK_FALSE(rows[0]["commit"].get<std::string>().empty());
  CHECK(rows[1]["name"] == "too-big");
  CHECK(rows[1].count("measured") == 0);
  std::ifstream md(opt.out / "results.md");
  std::stringstream text;
  text << md.rdbuf();
  CHECK_THAT(text.str(), Catch::Contains("| a | strata | opt-125m | 16 | 4 | 2 x 2 (4-bit) |") &&
                             Catch::Contains(" ± ") && Catch::Contains("| too-big | strata |"));
  // Compression of other widths is named part by part.
  CHECK_THAT(text.str(), Catch::Contains("2 x 2 (8-bit weights, 4-bit cache)"));
  CHECK(rows[0]["engine"] == "strata");
  CHECK(rows[0]["suite"] == "tiny");
  fs::remove_all(dir);
}

TEST_CASE("bench report shows peers' rows under the Strata row of the same case", "[bench]") {
  const fs::path dir = temp_dir("report");
  std::ofstream(dir / "results.jsonl")
      << R"({"name":"a","engine":"strata","suite":"s","model":"opt-6.7b","prompt_len":512,"gen_len":32,"status":"ok",)"
         R"("policy":"gpu_batch_size: 4\nnum_gpu_batches: 2\nweights: {gpu: 0, cpu: 100, disk: 0}\n",)"
         R"("commit":"abc1234","machine":{"backend":"cuda",)"
         R"("gpu":"H100","cpu":"x","hardware_profile":"h100"},"measured":{"prefill_tok_s":1000,"decode_tok_s":100,)"
         R"("total_tok_s":40,"repeats":1,"sd":{"prefill_tok_s":0,"decode_tok_s":0,"total_tok_s":0}},)"
         R"("predicted":{"prefill_tok_s":900,"decode_tok_s":110,"total_tok_s":44}})"
      << "\n";
  // What bench/peers/*_runner.py append (their README lists the fields).
  std::ofstream(dir / "peers.jsonl")
      << R"({"name":"a","engine":"flexgen","model":"opt-6.7b","prompt_len":512,"gen_len":32,"status":"ok",)"
         R"("gpu_batch_size":4,"num_gpu_batches":2,"measured":{"prefill_tok_s":800,"decode_tok_s":50,"total_tok_s":20},)"
         R"("peak_memory":{"gpu":2e9},"command":"python -m flexgen.flex_opt ..."})"
      << "\n"
      << R"({"name":"only-peer","engine":"accelerate","model":"opt-1.3b","prompt_len":64,"gen_len":8,)"
         R"("status":"out of memory"})"
      << "\n\n";
  write_bench_report(dir);
  std::ifstream md(dir / "results.md");
  std::stringstream text;
  text << md.rdbuf();
  const std::string s = text.str();
  INFO(s);
  CHECK_THAT(s, Catch::Contains("# strata bench: s") && Catch::Contains("- commit: abc1234"));
  const size_t strata = s.find("| a | strata | opt-6.7b | 512 | 32 | 4 x 2 | 1000.00 | 100.00 | 40.00 | 44.00 | +10% |");
  const size_t flexgen = s.find("| a | flexgen | opt-6.7b | 512 | 32 | 4 x 2 | 800.00 | 50.00 | 20.00 (strata 2.00x) |");
  REQUIRE(strata != std::string::npos);
  REQUIRE(flexgen != std::string::npos);
  CHECK(flexgen > strata);
  CHECK_THAT(s, Catch::Contains("| only-peer | accelerate | opt-1.3b | 64 | 8 |  | out of memory |"));
  CHECK_THAT(s, Catch::Contains("1.86 GiB |"));

  std::ofstream(dir / "peers.jsonl") << "{not json\n";
  CHECK_THROWS_WITH(write_bench_report(dir), Catch::Contains("peers.jsonl:1: not a JSON object"));
  CHECK_THROWS_WITH(write_bench_report(dir / "nothing"), Catch::Contains("neither results.jsonl nor peers.jsonl"));
  fs::remove_all(dir);
}

TEST_CASE("the shipped suites parse and name policies that load", "[bench]") {
  const fs::path suites = fs::path(STRATA_FIXTURES_DIR) / "../../bench/suites";
  int n = 0;
  for (const auto& e : fs::directory_iterator(suites)) {
    if (e.path().extension() != ".yaml") continue;
    INFO(e.path().string());
    const BenchSuite s = load_bench_suite(e.path().string());
    CHECK_FALSE(s.cases.empty());
    for (const BenchCase& c : s.cases)
      if (c.policy != "auto") CHECK_NOTHROW(load_policy(s.dir / c.policy));
    ++n;
  }
  CHECK(n == 11);  // smoke-cpu, calibrate-cpu, overlap-cpu, paper-table2, h100, calibrate-gpu, profile-accuracy-cpu,
                   // moe-cpu, moe-cpu-q4, moe-cpu-both, gpt-oss-cpu-q4
}

TEST_CASE("bench --calibrate records lane busy times per phase and writes a refined profile", "[bench][calibrate]") {
  const fs::path dir = temp_dir("calibrate");
  std::ofstream(dir / "cpu.yaml") << "gpu_batch_size: 2\nnum_gpu_batches: 1\nweights: {gpu: 0, cpu: 100, disk: 0}\n"
                                     "kv_cache: {gpu: 100, cpu: 0, disk: 0}\nactivations: {gpu: 100, cpu: 0, disk: 0}\n";
  std::ofstream(dir / "gpu.yaml") << "gpu_batch_size: 2\nnum_gpu_batches: 2\nweights: {gpu: 100, cpu: 0, disk: 0}\n"
                                     "kv_cache: {gpu: 100, cpu: 0, disk: 0}\nactivations: {gpu: 100, cpu: 0, disk: 0}\n";
  std::ofstream(dir / "attend.yaml") << "gpu_batch_size: 2\nnum_gpu_batches: 2\nweights: {gpu: 100, cpu: 0, disk: 0}\n"
                                        "kv_cache: {gpu: 0, cpu: 100, disk: 0}\nactivations: {gpu: 100, cpu: 0, disk: 0}\n"
                                        "cpu_attention: true\n";
  std::ofstream(dir / "suite.yaml")
      << "name: cal\ncases:\n"
         "  - {name: weights-cpu, model: opt-125m, prompt_len: 16, gen_len: 4, policy: cpu.yaml}\n"
         "  - {name: all-gpu, model: opt-125m, prompt_len: 16, gen_len: 4, policy: gpu.yaml}\n"
         "  - {name: cpu-attention, model: opt-125m, prompt_len: 16, gen_len: 4, policy: attend.yaml}\n";
  BenchOptions opt = cpu_run(dir, "cpu-epyc-2core.yaml");
  opt.calibrate = true;
  std::ostringstream log;
  const std::vector<BenchCaseResult> results = run_bench(opt, log);
  INFO(log.str());
  REQUIRE(results.size() == 3);
  for (const BenchCaseResult& r : results) {
    REQUIRE(r.status == "ok");
    CHECK(r.prefill_s > 0);
    CHECK(r.decode_s > 0);
    // The compute lane is one thread: busy no longer than the phase it ran in, and busy at all.
    CHECK(r.prefill_busy[kLaneCompute] > 0);
    CHECK(r.prefill_busy[kLaneCompute] <= r.prefill_s * 1.01 + 1e-3);
    CHECK(r.decode_busy[kLaneCompute] > 0);
    CHECK(r.decode_busy[kLaneCompute] <= r.decode_s * 1.01 + 1e-3);
  }
  CHECK(results[0].decode_busy[kLaneH2d] > 0);   // weights stream from the cpu tier every step
  CHECK(results[1].decode_busy[kLaneH2d] == 0);  // nothing to copy
  // The CPU attention lane: busy in decode only, and only where attention is delegated.
  CHECK(results[0].decode_busy[kLaneCpuAttention] == 0);
  CHECK(results[2].prefill_busy[kLaneCpuAttention] == 0);
  CHECK(results[2].decode_busy[kLaneCpuAttention] > 0);
  CHECK(results[2].decode_busy[kLaneCpuAttention] == Approx(results[2].cpu_attention_s));

  // The refined profile loads; the recorded results give the same samples as the run.
  const HardwareProfile refined = load_hardware_profile(opt.out / "calibrated-profile.yaml");
  CHECK_THAT(refined.description, Catch::Contains("calibrated by strata bench --calibrate over 3 runs"));
  // The delegating case's lane gives the CPU attention its own factor (test_calibrate.cpp has the
  // arithmetic of every factor).
  CHECK_THAT(log.str(), Catch::Contains("calibration: median / worst |error|"));
  CHECK_THAT(refined.description, Catch::Contains("cpu attention x"));
  CHECK_THAT(refined.description, !Catch::Contains("not determined by these runs: cpu attention"));
  const std::vector<CalibrationSample> from_file = calibration_samples(opt.out / "results.jsonl");
  REQUIRE(from_file.size() == 3);
  CHECK(from_file[0].name == "weights-cpu");
  CHECK(from_file[0].config.n_layers == 12);
  CHECK(from_file[0].policy.weights.cpu == 100);
  CHECK(from_file[0].decode_busy[kLaneH2d] == Approx(results[0].decode_busy[kLaneH2d]));
  CHECK(from_file[1].prefill_s == Approx(results[1].prefill_s));
  CHECK(from_file[2].decode_busy[kLaneCpuAttention] == Approx(results[2].decode_busy[kLaneCpuAttention]));
  std::ifstream md(opt.out / "calibration.md");
  std::stringstream text;
  text << md.rdbuf();
  CHECK_THAT(text.str(), Catch::Contains("| weights-cpu | decode |") && Catch::Contains("leave-one-out") &&
                             Catch::Contains("| disk | cpu attention | wall |"));

  // Results written before the busy times were recorded cannot be fitted: say so, naming the case.
  std::ofstream(dir / "old.jsonl") << R"({"name": "x", "engine": "strata", "status": "ok", "model": "opt-125m"})" << "\n";
  CHECK_THROWS_WITH(calibration_samples(dir / "old.jsonl"), Catch::Contains("old.jsonl: case x has no phase seconds"));
  fs::remove_all(dir);
}

// STRATA_CACHE pointed at a folder of the test's for as long as it lives.
class ScopedCache {
public:
  explicit ScopedCache(const fs::path& dir) {
    if (const char* v = std::getenv("STRATA_CACHE")) saved_ = v;
    setenv("STRATA_CACHE", dir.c_str(), 1);
  }
  ~ScopedCache() {
    if (saved_) setenv("STRATA_CACHE", saved_->c_str(), 1);
    else unsetenv("STRATA_CACHE");
  }

private:
  std::optional<std::string> saved_;
};

TEST_CASE("bench with no profile cached measures one and predicts, and --no-profile does not", "[bench]") {
  const fs::path dir = temp_dir("measures");
  std::ofstream(dir / "p.yaml") << "gpu_batch_size: 2\nnum_gpu_batches: 1\nweights: {gpu: 100, cpu: 0, disk: 0}\n"
                                   "kv_cache: {gpu: 100, cpu: 0, disk: 0}\nactivations: {gpu: 100, cpu: 0, disk: 0}\n";
  std::ofstream(dir / "suite.yaml") << "cases:\n" + kCase;
  {
    const ScopedCache cache(dir / "fresh-cache");
    BenchOptions opt = cpu_run(dir);
    opt.measure_profile = true;
    opt.quick_profile = true;
    std::ostringstream log;
    const std::vector<BenchCaseResult> results = run_bench(opt, log);
    INFO(log.str());
    CHECK_THAT(log.str(), Catch::Contains("no hardware profile at " + (dir / "fresh-cache" / "hardware.yaml").string()));
    REQUIRE(fs::exists(dir / "fresh-cache" / "hardware.yaml"));
    REQUIRE(results.size() == 1);
    CHECK(results[0].status == "ok");
    REQUIRE(results[0].predicted.has_value());
    CHECK(results[0].predicted->total_tok_s > 0);
    std::ifstream md(opt.out / "results.md");
    const std::string text((std::istreambuf_iterator<char>(md)), std::istreambuf_iterator<char>());
    CHECK_THAT(text, !Catch::Contains("none (no predictions)"));
  }
  {
    const ScopedCache cache(dir / "empty-cache");
    BenchOptions opt = cpu_run(dir);  // measure_profile false, as --no-profile
    opt.out = dir / "out-no-profile";
    std::ostringstream log;
    const std::vector<BenchCaseResult> results = run_bench(opt, log);
    INFO(log.str());
    CHECK(!fs::exists(dir / "empty-cache" / "hardware.yaml"));
    REQUIRE(results.size() == 1);
    CHECK(results[0].status == "ok");
    CHECK(!results[0].predicted.has_value());
    std::ifstream md(opt.out / "results.md");
    const std::string text((std::istreambuf_iterator<char>(md)), std::istreambuf_iterator<char>());
    CHECK_THAT(text, Catch::Contains("none (no predictions)"));
  }
}

TEST_CASE("bench projects decode from a few measured steps and marks the figures", "[bench]") {
  const fs::path dir = temp_dir("projected");
  std::ofstream(dir / "p.yaml") << "gpu_batch_size: 2\nnum_gpu_batches: 1\nweights: {gpu: 100, cpu: 0, disk: 0}\n"
                                   "kv_cache: {gpu: 100, cpu: 0, disk: 0}\nactivations: {gpu: 100, cpu: 0, disk: 0}\n";
  std::ofstream(dir / "suite.yaml")
      << "cases:\n  - {name: proj, model: opt-125m, prompt_len: 16, gen_len: 8, policy: p.yaml, decode_steps: 2}\n";
  const BenchOptions opt = cpu_run(dir);
  std::ostringstream log;
  const std::vector<BenchCaseResult> results = run_bench(opt, log);
  INFO(log.str());
  REQUIRE(results.size() == 1);
  const BenchCaseResult& r = results[0];
  REQUIRE(r.status == "ok");
  CHECK(r.decode_steps_run == 2);
  CHECK(r.projected());
  // Decode throughput is the measured steps' rate; total counts 8 tokens over prefill plus 7
  // projected steps.
  const BenchMeasure m = r.mean();
  CHECK(m.decode_tok_s == Approx(2 * 2 / r.decode_s).epsilon(1e-9));
  CHECK(m.total_tok_s == Approx(2 * 8 / (r.prefill_s + r.decode_s * 7 / 2)).epsilon(1e-9));
  const std::vector<nlohmann::json> rows = read_jsonl(opt.out / "results.jsonl");
  REQUIRE(rows.size() == 1);
  CHECK(rows[0]["projected"] == true);
  CHECK(rows[0]["measured"]["decode_steps_run"] == 2);
  CHECK(rows[0]["seconds"]["decode_steps"] == 2);
  // The engine thread's waits (docs/offload.md, "Events"): per decode step and their seconds.
  REQUIRE(rows[0].contains("host_waits"));
  CHECK(rows[0]["host_waits"]["per_decode_step"].get<double>() >= 0);
  CHECK(rows[0]["host_waits"]["seconds"].get<double>() >= 0);
  std::ifstream md(opt.out / "results.md");
  std::stringstream text;
  text << md.rdbuf();
  CHECK_THAT(text.str(), Catch::Contains("(projected)"));
  CHECK_THROWS_WITH(parse_bench_suite("cases:\n  - {name: b, model: m, prompt_len: 4, gen_len: 8, policy: p, "
                                      "decode_steps: 0}\n", "s.yaml"),
                    Catch::Contains("s.yaml:2: field 'decode_steps' must be a positive integer"));

  // A staggered prefill mixes prefill into the first steps: no projection from them.
  std::ofstream(dir / "s.yaml") << "gpu_batch_size: 1\nnum_gpu_batches: 2\nprefill_batches_per_step: 1\n"
                                   "weights: {gpu: 100}\nkv_cache: {gpu: 100}\nactivations: {gpu: 100}\n";
  std::ofstream(dir / "suite.yaml")
      << "cases:\n  - {name: stag, model: opt-125m, prompt_len: 16, gen_len: 8, policy: s.yaml, decode_steps: 2}\n";
  const std::vector<BenchCaseResult> staggered = run_bench(opt, log);
  REQUIRE(staggered.size() == 1);
  CHECK_THAT(staggered[0].status, Catch::Contains("bench case stag: decode_steps projects") &&
                                      Catch::Contains("staggered prefill (prefill_batches_per_step)"));
  fs::remove_all(dir);
}

TEST_CASE("strata bench records the commit its binary was built from wherever it runs", "[bench]") {
  // Run from a folder outside any checkout, the results still name the build's commit (a
  // baseline's binary staged beside a newer checkout must not take that checkout's id).
  const std::string source = std::string(STRATA_FIXTURES_DIR) + "/../..";
  if (test::run_shell("git -C " + source + " rev-parse --git-dir > /dev/null 2>&1").code != 0) {
    WARN("the source tree is not a git checkout, so the build has no commit id: skipped");
    return;
  }
  const fs::path dir = temp_dir("build_id");
  test::write_file(dir / "suite.yaml",
                   "name: id\ncases:\n  - {name: a, model: opt-125m, prompt_len: 8, gen_len: 2, policy: all-gpu.yaml}\n");
  test::write_file(dir / "all-gpu.yaml",
                   "gpu_batch_size: 1\nnum_gpu_batches: 1\nweights: {gpu: 100, cpu: 0, disk: 0}\n"
                   "kv_cache: {gpu: 100, cpu: 0, disk: 0}\nactivations: {gpu: 100, cpu: 0, disk: 0}\n");
  const test::CliResult r = test::run_shell("cd " + dir.string() + " && GIT_CEILING_DIRECTORIES=" +
                                            dir.parent_path().string() + " " + STRATA_BINARY +
                                            " bench --suite suite.yaml --device cpu --no-profile --out out --no-progress");
  REQUIRE(r.code == 0);
  std::ifstream jl(dir / "out" / "results.jsonl");
  std::string line;
  REQUIRE(std::getline(jl, line));
  const std::string commit = nlohmann::json::parse(line)["commit"].get<std::string>();
  INFO(commit);
  CHECK(std::regex_match(commit, std::regex("[0-9a-f]{7,}(-dirty)?")));
}

TEST_CASE("bench cuts a preset to a few layers, and records bytes moved, routing and a digest of the tokens",
          "[bench][moe]") {
  CHECK(bench_config("opt-125m", 2).n_layers == 2);
  CHECK(bench_config("dummy:opt-125m", 0).n_layers == 12);
  CHECK_THROWS_WITH(bench_config("opt-125m", 13), Catch::Contains("has 12 layers, not 13"));
  // The per-layer lists follow the cut: GPT-OSS's and Gemma's sliding layers, Qwen3-MoE's dense ones.
  const ModelConfig gpt_oss = bench_config("gpt-oss-20b", 3);
  CHECK(gpt_oss.window_layers == std::vector<int>{0, 2});
  CHECK_NOTHROW(gpt_oss.validate());
  CHECK(bench_config("gemma-3-1b", 7).window_layers == std::vector<int>{0, 1, 2, 3, 4, 6});
  CHECK_THROWS_WITH(parse_bench_suite("cases:\n  - {name: b, model: some/dir, prompt_len: 4, gen_len: 2, policy: p, "
                                      "layers: 2}\n", "s.yaml"),
                    Catch::Contains("s.yaml:2:") && Catch::Contains("'layers' cuts a preset"));
  CHECK(parse_bench_suite("cases:\n  - {name: b, model: m, prompt_len: 4, gen_len: 2, policy: auto, max_latency: 2.5}\n",
                          "s.yaml")
            .cases[0]
            .max_latency_s == 2.5);
  CHECK_THROWS_WITH(parse_bench_suite("cases:\n  - {name: b, model: m, prompt_len: 4, gen_len: 2, policy: p.yaml, "
                                      "max_latency: 3}\n", "s.yaml"),
                    Catch::Contains("s.yaml:2:") && Catch::Contains("needs policy auto"));
  CHECK_THROWS_WITH(parse_bench_suite("cases:\n  - {name: b, model: m, prompt_len: 4, gen_len: 2, policy: auto, "
                                      "max_latency: -1}\n", "s.yaml"),
                    Catch::Contains("'max_latency' must be a positive number"));
  // tiny-mixtral (a model directory) with its experts moved and computed on the CPU in decode: the
  // same tokens, the hidden rows crossing instead of the MLP halves, the decode steps' routing
  // beside the cost model's expectation; and a preset cut to 2 layers.
  const fs::path dir = temp_dir("moe");
  const std::string policy = "gpu_batch_size: 4\nnum_gpu_batches: 1\nweights: {gpu: 0, cpu: 100, disk: 0}\n"
                             "kv_cache: {gpu: 100, cpu: 0, disk: 0}\nactivations: {gpu: 100, cpu: 0, disk: 0}\n";
  std::ofstream(dir / "moved.yaml") << policy;
  std::ofstream(dir / "computed.yaml") << policy << "cpu_experts: decode\n";
  const std::string model = std::string(STRATA_FIXTURES_DIR) + "/models/tiny-mixtral";
  std::ofstream(dir / "suite.yaml") << "name: moe\ncases:\n"
                                    << "  - {name: moved, model: " << model << ", prompt_len: 8, gen_len: 6, policy: moved.yaml}\n"
                                    << "  - {name: computed, model: " << model << ", prompt_len: 8, gen_len: 6, policy: computed.yaml}\n"
                                    << "  - {name: cut, model: opt-125m, prompt_len: 8, gen_len: 2, policy: moved.yaml, layers: 2}\n";
  BenchOptions opt = cpu_run(dir, "t4-paper.yaml");
  std::ostringstream log;
  const std::vector<BenchCaseResult> results = run_bench(opt, log);
  INFO(log.str());
  REQUIRE(results.size() == 3);
  for (const BenchCaseResult& r : results) REQUIRE(r.status == "ok");
  const BenchCaseResult &moved = results[0], &computed = results[1];
  CHECK(moved.tokens_digest == computed.tokens_digest);
  CHECK(moved.gtoc_bytes == 0);
  CHECK(computed.gtoc_bytes > 0);
  CHECK(computed.ctog_bytes < moved.ctog_bytes);
  CHECK(computed.cpu_experts_s > 0);
  CHECK(moved.cpu_experts_s == 0);
  // 4 tokens a decode step, 2 of 4 experts each: at most 4 distinct, and 4 (1 - (1/2)^4) = 3.75 expected.
  CHECK(moved.decode_active_experts > 0);
  CHECK(moved.decode_active_experts <= 4);
  CHECK(moved.decode_active_experts_expected == Approx(3.75));
  CHECK(computed.decode_active_experts == moved.decode_active_experts);
  // The predicted bytes follow the same split (the cost model's terms back to bytes).
  CHECK(computed.ctog_bytes_predicted < moved.ctog_bytes_predicted);
  CHECK(computed.gtoc_bytes_predicted > 0);
  CHECK(results[2].config.n_layers == 2);
  const std::vector<nlohmann::json> rows = read_jsonl(opt.out / "results.jsonl");
  REQUIRE(rows.size() == 3);
  CHECK(rows[1]["moe"]["cpu_experts"] == "decode");
  CHECK(rows[1]["bytes"]["gpu_to_cpu"].get<double>() == computed.gtoc_bytes);
  CHECK(rows[0]["tokens_digest"] == rows[1]["tokens_digest"]);
  CHECK(rows[2]["layers"] == 2);
  CHECK(rows[2].count("moe") == 0);
  fs::remove_all(dir);
}
