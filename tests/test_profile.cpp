// The profiler on this machine: a --quick run must give positive, finite, physically plausible
// numbers, a usable GEMM curve, leave no file behind, and write YAML that loads back unchanged.
// The [cuda] case skips with a warning where there is no GPU.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sys/wait.h>
#include <unistd.h>

#include "cli_support.h"
#include "strata/backend/backend.h"
#include "strata/core/error.h"
#include "strata/profile/hardware.h"
#include "strata/offload/disk_store.h"
#include "strata/profile/profiler.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag) {
    path = fs::temp_directory_path() / ("strata_profile_" + tag + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

bool plausible(double v, double lo, double hi) { return std::isfinite(v) && v >= lo && v <= hi; }

void check_sane(const HardwareProfile& hw) {
  INFO(hardware_profile_to_yaml(hw));
  CHECK_FALSE(hw.name.empty());
  CHECK_FALSE(hw.description.empty());
  CHECK_FALSE(hw.gpu_name.empty());
  CHECK_FALSE(hw.cpu_name.empty());
  // Capacities: between 64 MiB and 1 PB.
  for (double bytes : {hw.gpu_mem, hw.cpu_mem, hw.disk_mem}) CHECK(plausible(bytes, 64.0 * (1 << 20), 1e15));
  // Links and attention: between 10 MB/s and 1 TB/s (HBM3e tops out at ~5 TB/s, so GPU attention
  // gets 10 TB/s).
  for (double bw : {hw.cpu_to_gpu_bw, hw.gpu_to_cpu_bw, hw.disk_to_cpu_bw, hw.cpu_to_disk_bw, hw.cpu_attention_bw})
    CHECK(plausible(bw, 1e7, 1e12));
  CHECK(plausible(hw.gpu_attention_bw, 1e7, 1e13));
  CHECK(plausible(hw.cpu_flops, 1e8, 1e14));
  // 4-bit: dequantization through the backend's kernel, attention over a 4-bit cache on both.
  for (double bw : {hw.gpu_dequant_bw, hw.gpu_attention_q4_bw}) CHECK(plausible(bw, 1e7, 1e13));
  CHECK(plausible(hw.cpu_attention_q4_bw, 1e7, 1e12));
  // A CPU linear streaming weights for two tokens (experts computed on the CPU), plain and 4-bit.
  CHECK(plausible(hw.cpu_weight_bw, 1e7, 1e12));
  CHECK(plausible(hw.cpu_weight_q4_bw, 1e7, 1e12));
  // ... and its FLOP/s from 1 to 256 tokens.
  // ... and its FLOP/s from 1 to 256 tokens, over the weights and over their 4-bit codes; the
  // streaming rates are the curves' 2-token points (2 FLOPs per weight and token).
  for (const std::vector<GemmPoint>* curve : {&hw.cpu_gemm, &hw.cpu_gemm_q4}) {
    REQUIRE(curve->size() == 7);
    CHECK(curve->front().tokens == 1);
    CHECK((*curve)[1].tokens == 2);
    CHECK(curve->back().tokens == 256);
    for (const GemmPoint& g : *curve) CHECK(plausible(g.flops_per_s, 1e7, 1e14));
  }
  // The same two curves over a small expert's matrix [1536, 2048], below the large one's weights.
  for (const std::vector<GemmPoint>* curve : {&hw.cpu_gemm_small, &hw.cpu_gemm_q4_small}) {
    REQUIRE(curve->size() == 7);
    CHECK(curve->front().tokens == 1);
    CHECK(curve->back().tokens == 256);
    for (const GemmPoint& g : *curve) CHECK(plausible(g.flops_per_s, 1e7, 1e14));
  }
  CHECK(hw.cpu_gemm_small_params == 1536.0 * 2048.0);
  CHECK(hw.cpu_gemm_params > hw.cpu_gemm_small_params);
  const double bytes = double(dtype_size(hw.compute_dtype));
  CHECK(hw.cpu_weight_bw == Approx(hw.cpu_gemm[1].flops_per_s / 4 * bytes).epsilon(1e-3));
  CHECK(hw.cpu_weight_q4_bw == Approx(hw.cpu_gemm_q4[1].flops_per_s / 4 * bytes).epsilon(1e-3));
  // A layer's elementwise work: between 1 ps (a GPU's HBM) and 1 us per token and hidden unit.
  CHECK(plausible(hw.gpu_elementwise_s, 1e-12, 1e-6));
  // Causal prefill attention from a 128-token prompt up (128 and 512 in a quick profile).
  REQUIRE(hw.gpu_prefill_attention.size() >= 2);
  CHECK(hw.gpu_prefill_attention.front().tokens == 128);
  CHECK(hw.gpu_prefill_attention[1].tokens == 512);
  for (const GemmPoint& g : hw.gpu_prefill_attention) CHECK(plausible(g.flops_per_s, 1e7, 1e16));
  REQUIRE(hw.gpu_gemm.size() >= 2);
  CHECK(hw.gpu_gemm.front().tokens == 1);
  for (size_t i = 0; i < hw.gpu_gemm.size(); ++i) {
    CHECK(plausible(hw.gpu_gemm[i].flops_per_s, 1e8, 1e16));  // an H200 does ~1e15 in fp16
    if (i > 0) CHECK(hw.gpu_gemm[i].tokens > hw.gpu_gemm[i - 1].tokens);
  }
}

void check_round_trip(const HardwareProfile& hw) {
  const HardwareProfile back = parse_hardware_profile(hardware_profile_to_yaml(hw), "profile.yaml");
  CHECK(back.name == hw.name);
  CHECK(back.description == hw.description);
  CHECK(back.gpu_name == hw.gpu_name);
  CHECK(back.cpu_name == hw.cpu_name);
  CHECK(back.gpu_mem == hw.gpu_mem);
  CHECK(back.cpu_mem == hw.cpu_mem);
  CHECK(back.disk_mem == hw.disk_mem);
  CHECK(back.cpu_to_gpu_bw == hw.cpu_to_gpu_bw);
  CHECK(back.gpu_to_cpu_bw == hw.gpu_to_cpu_bw);
  CHECK(back.disk_to_cpu_bw == hw.disk_to_cpu_bw);
  CHECK(back.cpu_to_disk_bw == hw.cpu_to_disk_bw);
  REQUIRE(back.gpu_gemm.size() == hw.gpu_gemm.size());
  for (size_t i = 0; i < hw.gpu_gemm.size(); ++i) {
    CHECK(back.gpu_gemm[i].tokens == hw.gpu_gemm[i].tokens);
    CHECK(back.gpu_gemm[i].flops_per_s == hw.gpu_gemm[i].flops_per_s);
  }
  CHECK(back.gpu_attention_bw == hw.gpu_attention_bw);
  CHECK(back.cpu_attention_bw == hw.cpu_attention_bw);
  CHECK(back.cpu_flops == hw.cpu_flops);
  CHECK(back.gpu_dequant_bw == hw.gpu_dequant_bw);
  CHECK(back.gpu_attention_q4_bw == hw.gpu_attention_q4_bw);
  CHECK(back.compute_dtype == hw.compute_dtype);
  CHECK(back.cpu_attention_q4_bw == hw.cpu_attention_q4_bw);
  CHECK(back.cpu_weight_bw == hw.cpu_weight_bw);
  CHECK(back.cpu_weight_q4_bw == hw.cpu_weight_q4_bw);
  CHECK(back.gpu_elementwise_s == hw.gpu_elementwise_s);
  REQUIRE(back.gpu_prefill_attention.size() == hw.gpu_prefill_attention.size());
  for (size_t i = 0; i < hw.gpu_prefill_attention.size(); ++i) {
    CHECK(back.gpu_prefill_attention[i].tokens == hw.gpu_prefill_attention[i].tokens);
    CHECK(back.gpu_prefill_attention[i].flops_per_s == hw.gpu_prefill_attention[i].flops_per_s);
  }
  REQUIRE(back.cpu_gemm.size() == hw.cpu_gemm.size());
  REQUIRE(back.cpu_gemm_q4.size() == hw.cpu_gemm_q4.size());
  for (size_t i = 0; i < hw.cpu_gemm_q4.size(); ++i) CHECK(back.cpu_gemm_q4[i].flops_per_s == hw.cpu_gemm_q4[i].flops_per_s);
  for (size_t i = 0; i < hw.cpu_gemm.size(); ++i) {
    CHECK(back.cpu_gemm[i].tokens == hw.cpu_gemm[i].tokens);
    CHECK(back.cpu_gemm[i].flops_per_s == hw.cpu_gemm[i].flops_per_s);
  }
  CHECK(back.cpu_gemm_params == hw.cpu_gemm_params);
  CHECK(back.cpu_gemm_small_params == hw.cpu_gemm_small_params);
  REQUIRE(back.cpu_gemm_small.size() == hw.cpu_gemm_small.size());
  REQUIRE(back.cpu_gemm_q4_small.size() == hw.cpu_gemm_q4_small.size());
  for (size_t i = 0; i < hw.cpu_gemm_small.size(); ++i) {
    CHECK(back.cpu_gemm_small[i].flops_per_s == hw.cpu_gemm_small[i].flops_per_s);
    CHECK(back.cpu_gemm_q4_small[i].flops_per_s == hw.cpu_gemm_q4_small[i].flops_per_s);
  }
}

HardwareProfile quick_profile(const std::string& backend, const fs::path& dir, int& progress_lines) {
  ProfileOptions opt;
  opt.quick = true;
  opt.backend = backend;
  opt.offload_dir = dir;
  opt.progress = [&](const std::string&) { ++progress_lines; };
  return profile_machine(opt);
}

}  // namespace

TEST_CASE("a quick profile of the CPU backend is sane and round-trips", "[profile]") {
  TempDir dir("cpu");
  int lines = 0;
  const HardwareProfile hw = quick_profile("cpu", dir.path, lines);
  CHECK(lines >= 5);
  CHECK(hw.gpu_name == "none (cpu backend)");
  CHECK(hw.compute_dtype == DType::F32);  // the CPU backend computes and stores fp32
  // Its GEMM curve's shape is a speed, not asserted here: a build without x86-64-v3 is flat.
  check_sane(hw);
  check_round_trip(hw);
  CHECK(fs::is_empty(dir.path));  // the disk store's file is gone
}

TEST_CASE("a quick profile of the CUDA backend is sane and round-trips", "[profile][cuda]") {
  if (!cuda_available()) {
    WARN("no GPU: skipped");
    return;
  }
  TempDir dir("cuda");
  int lines = 0;
  const HardwareProfile hw = quick_profile("cuda", dir.path, lines);
  CHECK(hw.gpu_name != "none (cpu backend)");
  check_sane(hw);
  // On a GPU the fp16 curve beats one token's throughput by far, and pinned copies beat 1 GB/s.
  CHECK(hw.gemm_flops(1024) > 10 * hw.gemm_flops(1));
  CHECK(hw.cpu_to_gpu_bw > 1e9);
  check_round_trip(hw);
  CHECK(fs::is_empty(dir.path));
}

TEST_CASE("the profiler refuses an unknown device and an unusable offload directory", "[profile]") {
  ProfileOptions opt;
  opt.quick = true;
  opt.backend = "tpu";
  CHECK_THROWS_WITH(profile_machine(opt), Catch::Contains("unknown device 'tpu'"));
  TempDir dir("bad");
  const fs::path file = dir.path / "a-file";
  std::ofstream(file) << "not a directory";
  opt.backend = "cpu";
  opt.offload_dir = file / "offload";
  CHECK_THROWS_WITH(profile_machine(opt), Catch::Contains("offload directory") && Catch::Contains("a-file"));
}

TEST_CASE("strata profile --quick writes a profile that loads, and prints a summary", "[profile][cli]") {
  TempDir dir("cli");
  const fs::path out = dir.path / "sub" / "hw.yaml";
  const strata::test::CliResult r = strata::test::run_strata(
      "profile --quick --device cpu --offload-dir " + (dir.path / "offload").string() + " --out " + out.string());
  const std::string& output = r.output;
  INFO(output);
  CHECK(r.code == 0);
  CHECK_THAT(output, Catch::Contains("profile: host -> device:") && Catch::Contains("cpu -> disk") &&
                         Catch::Contains("wrote " + out.string()));
  const HardwareProfile hw = load_hardware_profile(out);
  CHECK(hw.gpu_name == "none (cpu backend)");
  CHECK_FALSE(fs::exists(out.string() + ".partial"));
  CHECK(fs::is_empty(dir.path / "offload"));
}

TEST_CASE("strata profile has a default path under the cache", "[profile]") {
  const fs::path p = default_hardware_profile_path();
  CHECK(p.filename() == "hardware.yaml");
  CHECK(default_offload_dir().filename() == "offload");
}

TEST_CASE("the CPU linear's weights take enough copies to leave every cache", "[profile]") {
  const size_t MiB = size_t(1) << 20, GiB = size_t(1) << 30;
  // A full profile's 4-bit codes of 16384 x 4096 (38 MB) over 1 GiB: 28 copies, 1.06 GB in all.
  const size_t codes = size_t(16384) * quantized_row_bytes(4, 64, 4096);
  CHECK(cold_weight_copies(codes, GiB, 64 * GiB) == 28);
  CHECK(28 * codes <= GiB);
  // fp32 16384 x 4096 (256 MiB): 4.
  CHECK(cold_weight_copies(256 * MiB, GiB, 64 * GiB) == 4);
  // Short memory: within a quarter of it (2 GiB free: 512 MiB, 14 copies of the codes).
  CHECK(cold_weight_copies(codes, GiB, 2 * GiB) == 14);
  // A small expert's codes (1.8 MB): 1 GiB of them. Never none.
  const size_t small = size_t(1536) * quantized_row_bytes(4, 64, 2048);
  CHECK(cold_weight_copies(small, GiB, 64 * GiB) == GiB / small);
  CHECK(cold_weight_copies(2 * GiB, GiB, 64 * GiB) == 1);
  CHECK(cold_weight_copies(256 * MiB, GiB, 512 * MiB) == 1);
  CHECK(cold_weight_copies(0, GiB, 64 * GiB) == 1);
}
