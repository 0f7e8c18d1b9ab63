// Hardware profiles: the YAML round trip, units, errors that name the file, line and field, and
// the GEMM curve's interpolation (linear in log tokens, held flat outside the points).
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "strata/core/error.h"
#include "strata/profile/hardware.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {

HardwareProfile sample() {
  HardwareProfile hw;
  hw.name = "t4-test";
  hw.description = "a \"quoted\" description: with colons, # hashes\nand a newline";
  hw.gpu_name = "Tesla T4";
  hw.cpu_name = "Intel(R) Xeon(R) CPU @ 2.00GHz";
  hw.gpu_mem = 16e9;
  hw.cpu_mem = 208.0 * (1ull << 30);
  hw.disk_mem = 1.5e12;
  hw.cpu_to_gpu_bw = 12.34e9;
  hw.gpu_to_cpu_bw = 1.0 / 3.0 * 1e10;  // not short in decimal: the writer must still round-trip it
  hw.disk_to_cpu_bw = 2.0e9;
  hw.cpu_to_disk_bw = 1.5e9;
  hw.gpu_gemm = {{1, 0.25e12}, {16, 4.1e12}, {256, 38.5e12}, {4096, 52.0e12}};
  hw.gpu_attention_bw = 280e9;
  hw.cpu_attention_bw = 35.5e9;
  hw.cpu_flops = 1.6e12;
  hw.gpu_dequant_bw = 0;
  return hw;
}

void check_equal(const HardwareProfile& a, const HardwareProfile& b) {
  CHECK(a.name == b.name);
  CHECK(a.description == b.description);
  CHECK(a.gpu_name == b.gpu_name);
  CHECK(a.cpu_name == b.cpu_name);
  CHECK(a.gpu_mem == b.gpu_mem);
  CHECK(a.cpu_mem == b.cpu_mem);
  CHECK(a.disk_mem == b.disk_mem);
  CHECK(a.cpu_to_gpu_bw == b.cpu_to_gpu_bw);
  CHECK(a.gpu_to_cpu_bw == b.gpu_to_cpu_bw);
  CHECK(a.disk_to_cpu_bw == b.disk_to_cpu_bw);
  CHECK(a.cpu_to_disk_bw == b.cpu_to_disk_bw);
  REQUIRE(a.gpu_gemm.size() == b.gpu_gemm.size());
  for (size_t i = 0; i < a.gpu_gemm.size(); ++i) {
    CHECK(a.gpu_gemm[i].tokens == b.gpu_gemm[i].tokens);
    CHECK(a.gpu_gemm[i].flops_per_s == b.gpu_gemm[i].flops_per_s);
  }
  CHECK(a.gpu_attention_bw == b.gpu_attention_bw);
  CHECK(a.cpu_attention_bw == b.cpu_attention_bw);
  CHECK(a.cpu_flops == b.cpu_flops);
  CHECK(a.gpu_dequant_bw == b.gpu_dequant_bw);
}

// A valid profile in user-written units; `extra` lines are appended (line 16 onwards).
std::string with_units(const std::string& extra = "") {
  return "name: hand-written\n"                                      // 1
         "gpu_mem: 16GiB\n"                                          // 2
         "cpu_mem: 200G\n"                                           // 3
         "disk_mem: 1.5TB\n"                                         // 4
         "cpu_to_gpu_bw: 12GB/s\n"                                   // 5
         "gpu_to_cpu_bw: 2.5 GiB/s\n"                                // 6
         "disk_to_cpu_bw: 2e9\n"                                     // 7
         "cpu_to_disk_bw: 800 MiB/s\n"                               // 8
         "gpu_gemm:\n"                                               // 9
         "  - {tokens: 1, flops_per_s: 500 GFLOP/s}\n"               // 10
         "  - {tokens: 64, flops_per_s: 65TFLOPS}\n"                 // 11
         "gpu_attention_bw: 300GB/s\n"                               // 12
         "cpu_attention_bw: 40e9\n"                                  // 13
         "cpu_flops: 1.2 TFLOP/s\n"                                  // 14
         "gpu_dequant_bw: 0\n"                                       // 15
         + extra;
}

}  // namespace

TEST_CASE("a hardware profile survives a YAML round trip exactly", "[hardware]") {
  const HardwareProfile hw = sample();
  const std::string yaml = hardware_profile_to_yaml(hw);
  check_equal(parse_hardware_profile(yaml, "round-trip.yaml"), hw);
  // Once more through a file.
  const fs::path file = fs::temp_directory_path() / ("strata_hw_" + std::to_string(::getpid()) + ".yaml");
  std::ofstream(file) << yaml;
  check_equal(load_hardware_profile(file), hw);
  fs::remove(file);
  CHECK_THROWS_WITH(load_hardware_profile(file), Catch::Contains("cannot open hardware profile") &&
                                                     Catch::Contains(file.string()));
}

TEST_CASE("hardware profiles take sizes, bandwidths and FLOP/s with units", "[hardware]") {
  const HardwareProfile hw = parse_hardware_profile(with_units(), "units.yaml");
  CHECK(hw.name == "hand-written");
  CHECK(hw.description.empty());
  CHECK(hw.gpu_mem == 16.0 * (1ull << 30));
  CHECK(hw.cpu_mem == 200e9);
  CHECK(hw.disk_mem == 1.5e12);
  CHECK(hw.cpu_to_gpu_bw == 12e9);
  CHECK(hw.gpu_to_cpu_bw == 2.5 * (1ull << 30));
  CHECK(hw.disk_to_cpu_bw == 2e9);
  CHECK(hw.cpu_to_disk_bw == 800.0 * (1 << 20));
  REQUIRE(hw.gpu_gemm.size() == 2);
  CHECK(hw.gpu_gemm[0].flops_per_s == Approx(500e9));
  CHECK(hw.gpu_gemm[1].tokens == 64);
  CHECK(hw.gpu_gemm[1].flops_per_s == Approx(65e12));
  CHECK(hw.gpu_attention_bw == 300e9);
  CHECK(hw.cpu_attention_bw == 40e9);
  CHECK(hw.cpu_flops == Approx(1.2e12));
  CHECK(hw.gpu_dequant_bw == 0);
  // gpu_dequant_bw is the one optional number.
  std::string no_dequant = with_units();
  no_dequant.erase(no_dequant.find("gpu_dequant_bw"));
  CHECK(parse_hardware_profile(no_dequant, "x.yaml").gpu_dequant_bw == 0);
  // The compute dtype: fp16 unless the profile says otherwise (the CPU backend's are F32).
  CHECK(hw.compute_dtype == DType::F16);
  CHECK(parse_hardware_profile(with_units() + "compute_dtype: F32\n", "x.yaml").compute_dtype == DType::F32);
  CHECK_THROWS_WITH(parse_hardware_profile(with_units() + "compute_dtype: BF16\n", "x.yaml"),
                    Catch::Contains("field 'compute_dtype' must be F16 or F32, got BF16"));
}

TEST_CASE("bad hardware profiles name the file, the line and the field", "[hardware]") {
  auto replaced = [](const std::string& from, const std::string& to) {
    std::string s = with_units();
    const size_t at = s.find(from);
    REQUIRE(at != std::string::npos);
    return s.replace(at, from.size(), to);
  };
  CHECK_THROWS_WITH(parse_hardware_profile(replaced("12GB/s", "fast"), "hw.yaml"),
                    Catch::Contains("hw.yaml:5: field 'cpu_to_gpu_bw' must be a bandwidth") &&
                        Catch::Contains("'fast'"));
  CHECK_THROWS_WITH(parse_hardware_profile(replaced("12GB/s", "12GB"), "hw.yaml"),
                    Catch::Contains("hw.yaml:5: field 'cpu_to_gpu_bw'"));
  CHECK_THROWS_WITH(parse_hardware_profile(replaced("16GiB", "16 parsecs"), "hw.yaml"),
                    Catch::Contains("hw.yaml:2: field 'gpu_mem' must be a size"));
  CHECK_THROWS_WITH(parse_hardware_profile(replaced("200G", "-5"), "hw.yaml"),
                    Catch::Contains("hw.yaml:3: field 'cpu_mem' must be positive"));
  CHECK_THROWS_WITH(parse_hardware_profile(replaced("2e9", "0"), "hw.yaml"),
                    Catch::Contains("hw.yaml:7: field 'disk_to_cpu_bw' must be positive"));
  CHECK_THROWS_WITH(parse_hardware_profile(replaced("2e9", ".inf"), "hw.yaml"),
                    Catch::Contains("hw.yaml:7: field 'disk_to_cpu_bw'"));
  CHECK_THROWS_WITH(parse_hardware_profile(replaced("1.2 TFLOP/s", "1.2 TB/s"), "hw.yaml"),
                    Catch::Contains("hw.yaml:14: field 'cpu_flops' must be FLOP/s"));
  CHECK_THROWS_WITH(parse_hardware_profile(replaced("tokens: 64", "tokens: 1"), "hw.yaml"),
                    Catch::Contains("hw.yaml:11: field 'gpu_gemm[1].tokens': token counts must increase"));
  CHECK_THROWS_WITH(parse_hardware_profile(replaced("tokens: 1,", "tokens: 0,"), "hw.yaml"),
                    Catch::Contains("hw.yaml:10: field 'gpu_gemm[0].tokens' must be a number >= 1"));
  CHECK_THROWS_WITH(parse_hardware_profile(replaced("tokens: 64", "tokns: 64"), "hw.yaml"),
                    Catch::Contains("hw.yaml:11: unknown key 'gpu_gemm[1].tokns'"));
  CHECK_THROWS_WITH(parse_hardware_profile(replaced("gpu_gemm:\n  - {tokens: 1, flops_per_s: 500 GFLOP/s}\n  - "
                                                    "{tokens: 64, flops_per_s: 65TFLOPS}",
                                                    "gpu_gemm: []"),
                                           "hw.yaml"),
                    Catch::Contains("hw.yaml:9: field 'gpu_gemm' must be a non-empty list"));
  CHECK_THROWS_WITH(parse_hardware_profile(replaced("gpu_mem: 16GiB", "gpu_mem: {size: 16}"), "hw.yaml"),
                    Catch::Contains("hw.yaml:2: field 'gpu_mem' must be a single value"));
  CHECK_THROWS_WITH(parse_hardware_profile(with_units("pcie_bw: 12GB/s\n"), "hw.yaml"),
                    Catch::Contains("hw.yaml:16: unknown key 'pcie_bw'"));
  CHECK_THROWS_WITH(parse_hardware_profile(replaced("cpu_flops: 1.2 TFLOP/s\n", ""), "hw.yaml"),
                    Catch::Contains("hw.yaml: missing field 'cpu_flops'"));
  CHECK_THROWS_WITH(parse_hardware_profile(with_units("cpu_flops: [1, 2\n"), "hw.yaml"),
                    Catch::Contains("hw.yaml:") && Catch::Contains("invalid YAML"));
  CHECK_THROWS_WITH(parse_hardware_profile("- a list\n", "hw.yaml"), Catch::Contains("hw.yaml: a hardware profile is a YAML map"));
}

TEST_CASE("gemm_flops interpolates in log tokens and holds the ends", "[hardware]") {
  HardwareProfile hw;
  CHECK_THROWS_WITH(hw.gemm_flops(8), Catch::Contains("gpu_gemm is empty"));
  hw.gpu_gemm = {{1, 1e12}, {16, 5e12}, {256, 9e12}};
  // At the points.
  CHECK(hw.gemm_flops(1) == 1e12);
  CHECK(hw.gemm_flops(16) == Approx(5e12));
  CHECK(hw.gemm_flops(256) == Approx(9e12));
  // Between them: 4 is halfway from 1 to 16 in log space, 64 halfway from 16 to 256, 2 a quarter.
  CHECK(hw.gemm_flops(4) == Approx(3e12));
  CHECK(hw.gemm_flops(64) == Approx(7e12));
  CHECK(hw.gemm_flops(2) == Approx(2e12));
  // Outside: the end values.
  CHECK(hw.gemm_flops(0.5) == 1e12);
  CHECK(hw.gemm_flops(0) == 1e12);
  CHECK(hw.gemm_flops(1e6) == 9e12);
  // One point: a constant.
  hw.gpu_gemm = {{32, 7e12}};
  CHECK(hw.gemm_flops(1) == 7e12);
  CHECK(hw.gemm_flops(4096) == 7e12);
}

TEST_CASE("the CPU weight terms are optional, and a bad CPU linear curve names its field", "[hardware]") {
  // A profile written before strata profile measured them loads with them unknown (the cost model
  // then falls back to the CPU attention rate and the roofline).
  const HardwareProfile old = parse_hardware_profile(with_units(), "hw.yaml");
  CHECK(old.cpu_weight_bw == 0);
  CHECK(old.cpu_weight_q4_bw == 0);
  CHECK(old.cpu_gemm.empty());
  CHECK(old.cpu_gemm_q4.empty());
  CHECK_THROWS_WITH(old.cpu_gemm_flops(4), Catch::Contains("no GEMM curve (cpu_gemm is empty)"));
  CHECK_THROWS_WITH(old.cpu_gemm_q4_flops(4), Catch::Contains("no GEMM curve (cpu_gemm_q4 is empty)"));
  const std::string curve = "cpu_gemm:\n  - {tokens: 1, flops_per_s: 16 GFLOP/s}\n  - {tokens: 8, flops_per_s: 48 GFLOP/s}\n";
  const HardwareProfile with = parse_hardware_profile(with_units("cpu_weight_bw: 19GB/s\n" + curve), "hw.yaml");
  CHECK(with.cpu_weight_bw == Approx(19e9));
  CHECK(with.cpu_gemm_flops(8) == Approx(48e9));
  const HardwareProfile q4 = parse_hardware_profile(
      with_units("cpu_gemm_q4:\n  - {tokens: 1, flops_per_s: 4 GFLOP/s}\n  - {tokens: 16, flops_per_s: 12 GFLOP/s}\n"), "hw.yaml");
  CHECK(q4.cpu_gemm_q4_flops(4) == Approx(8e9));  // halfway in log tokens
  CHECK(parse_hardware_profile(hardware_profile_to_yaml(q4), "back.yaml").cpu_gemm_q4_flops(16) == Approx(12e9));
  CHECK_THROWS_WITH(parse_hardware_profile(with_units("cpu_gemm_q4:\n  - {tokens: 2, flops_per_s: slow}\n"), "hw.yaml"),
                    Catch::Contains("hw.yaml:17: field 'cpu_gemm_q4[0].flops_per_s'"));
  CHECK_THROWS_WITH(parse_hardware_profile(with_units("cpu_gemm:\n  - {tokens: 8, flops_per_s: 1e9}\n  - {tokens: 2, flops_per_s: 2e9}\n"),
                                           "hw.yaml"),
                    Catch::Contains("hw.yaml:18: field 'cpu_gemm[1].tokens': token counts must increase"));
  CHECK_THROWS_WITH(parse_hardware_profile(with_units("cpu_weight_bw: fast\n"), "hw.yaml"),
                    Catch::Contains("hw.yaml:16: field 'cpu_weight_bw' must be a bandwidth"));
}

TEST_CASE("a CPU linear over a matrix between the small curve's and the large one's is priced between them",
          "[hardware]") {
  // Large matrix: 64M weights, 40 GFLOP/s at every token count (one point); small: 4M weights,
  // 10 GFLOP/s. Geometric in log(weights): at 16M (halfway in log) sqrt(10 x 40) = 20; at or
  // beyond either end, that end's rate; the 4-bit curves likewise on their own points.
  HardwareProfile hw = parse_hardware_profile(
      with_units("cpu_gemm:\n  - {tokens: 1, flops_per_s: 40e9}\n"
                 "cpu_gemm_q4:\n  - {tokens: 1, flops_per_s: 20e9}\n  - {tokens: 4, flops_per_s: 80e9}\n"
                 "cpu_gemm_params: 64e6\n"
                 "cpu_gemm_small:\n  - {tokens: 1, flops_per_s: 10e9}\n"
                 "cpu_gemm_q4_small:\n  - {tokens: 1, flops_per_s: 5e9}\n  - {tokens: 4, flops_per_s: 20e9}\n"
                 "cpu_gemm_small_params: 4e6\n"),
      "hw.yaml");
  CHECK(hw.cpu_linear_flops(1, 16e6, false) == Approx(20e9));
  CHECK(hw.cpu_linear_flops(8, 4e6, false) == Approx(10e9));
  CHECK(hw.cpu_linear_flops(8, 1e6, false) == Approx(10e9));
  CHECK(hw.cpu_linear_flops(8, 64e6, false) == Approx(40e9));
  CHECK(hw.cpu_linear_flops(8, 1e9, false) == Approx(40e9));
  // 4-bit at 2 tokens: 50 (large) and 12.5 (small) GFLOP/s, halfway in log tokens; 25 at 16M.
  CHECK(hw.cpu_linear_flops(2, 64e6, true) == Approx(50e9));
  CHECK(hw.cpu_linear_flops(2, 4e6, true) == Approx(12.5e9));
  CHECK(hw.cpu_linear_flops(2, 16e6, true) == Approx(25e9));
  // Round trip.
  const HardwareProfile back = parse_hardware_profile(hardware_profile_to_yaml(hw), "back.yaml");
  CHECK(back.cpu_linear_flops(2, 16e6, true) == Approx(25e9));
  CHECK(back.cpu_gemm_small_params == 4e6);
  CHECK(back.cpu_gemm_params == 64e6);
  // Without the small curve (a profile from before it): the large curve at every size.
  hw.cpu_gemm_small.clear();
  hw.cpu_gemm_q4_small.clear();
  CHECK(hw.cpu_linear_flops(1, 4e6, false) == Approx(40e9));
  CHECK(hw.cpu_linear_flops(2, 4e6, true) == Approx(50e9));
  // A small curve without the weights it was measured over names the missing fields.
  CHECK_THROWS_WITH(parse_hardware_profile(with_units("cpu_gemm:\n  - {tokens: 1, flops_per_s: 40e9}\n"
                                                      "cpu_gemm_small:\n  - {tokens: 1, flops_per_s: 10e9}\n"),
                                           "hw.yaml"),
                    Catch::Contains("hw.yaml:19: field 'cpu_gemm_small' needs 'cpu_gemm_small_params' and 'cpu_gemm_params'"));
}

TEST_CASE("the prefill attention curve and the elementwise rate round-trip", "[hardware]") {
  HardwareProfile hw = sample();
  CHECK(hw.prefill_attention_flops(512) == 0);  // unknown: the cost model's fallback prices it
  hw.gpu_prefill_attention = {{128, 50e9}, {512, 70e9}, {2048, 90e9}};
  CHECK(hw.prefill_attention_flops(64) == Approx(50e9));    // held below the first length
  CHECK(hw.prefill_attention_flops(256) == Approx(60e9));   // halfway in log s
  CHECK(hw.prefill_attention_flops(1024) == Approx(80e9));
  CHECK(hw.prefill_attention_flops(8192) == Approx(90e9));  // held above the last
  const std::string yaml = hardware_profile_to_yaml(hw);
  CHECK_THAT(yaml, Catch::Contains("gpu_prefill_attention:  # causal prefill attention (QK^T and AV) by prompt length"));
  const HardwareProfile back = parse_hardware_profile(yaml, "back.yaml");
  check_equal(back, hw);
  REQUIRE(back.gpu_prefill_attention.size() == 3);
  CHECK(back.gpu_prefill_attention[2].tokens == 2048);
  CHECK(back.gpu_prefill_attention[2].flops_per_s == 90e9);
  // The elementwise rate rides along.
  hw.gpu_elementwise_s = 4.5e-9;
  CHECK(parse_hardware_profile(hardware_profile_to_yaml(hw), "back.yaml").gpu_elementwise_s == 4.5e-9);
  CHECK_THROWS_WITH(parse_hardware_profile(with_units("gpu_elementwise_s: -1\n"), "hw.yaml"),
                    Catch::Contains("hw.yaml:16: field 'gpu_elementwise_s' must be a number from 0 to 1"));
  // Every profile before them loads without either; a malformed curve is named with its line.
  CHECK(parse_hardware_profile(with_units(), "hw.yaml").gpu_prefill_attention.empty());
  CHECK(parse_hardware_profile(with_units(), "hw.yaml").gpu_elementwise_s == 0);
  CHECK_THROWS_WITH(parse_hardware_profile(with_units("gpu_prefill_attention: []\n"), "hw.yaml"),
                    Catch::Contains("hw.yaml:16: field 'gpu_prefill_attention' must be a non-empty list"));
  CHECK_THROWS_WITH(
      parse_hardware_profile(with_units("gpu_prefill_attention:\n  - {tokens: 512, flops_per_s: 1e9}\n"
                                        "  - {tokens: 128, flops_per_s: 1e9}\n"),
                             "hw.yaml"),
      Catch::Contains("hw.yaml:18: field 'gpu_prefill_attention[1].tokens': token counts must increase"));
}

TEST_CASE("a second GEMM curve prices a model at its own hidden size", "[hardware]") {
  // Two curves, at h = 4096 and h = 2048: a model's rate lies between them linearly in log h (a
  // geometric mean halfway), each curve interpolated in log tokens first, held at the nearer
  // curve outside the two sizes. Without the second curve, or its sizes, every h gets gpu_gemm.
  HardwareProfile hw;
  hw.gpu_gemm = {{1, 1e12}, {16, 16e12}};
  CHECK(hw.gemm_flops(4, 2048) == Approx(hw.gemm_flops(4)));
  hw.gpu_gemm_hidden = 4096;
  hw.gpu_gemm2 = {{1, 4e12}, {16, 4e12}};
  CHECK(hw.gemm_flops(4, 2048) == Approx(hw.gemm_flops(4)));  // gpu_gemm2_hidden unknown
  hw.gpu_gemm2_hidden = 2048;
  // 4 tokens: 8.5e12 on gpu_gemm (halfway in log tokens from 1 to 16), 4e12 on gpu_gemm2.
  REQUIRE(hw.gemm_flops(4) == Approx(8.5e12));
  CHECK(hw.gemm_flops(4, 4096) == Approx(8.5e12));
  CHECK(hw.gemm_flops(4, 2048) == Approx(4e12));
  CHECK(hw.gemm_flops(4, std::sqrt(4096.0 * 2048.0)) == Approx(std::sqrt(8.5e12 * 4e12)));
  CHECK(hw.gemm_flops(4, 768) == Approx(4e12));     // below the smaller size: its curve
  CHECK(hw.gemm_flops(4, 12288) == Approx(8.5e12)); // above the larger: its curve
  CHECK(hw.gemm_flops(16, 2048) == Approx(4e12));

  // The round trip keeps both curves and sizes.
  HardwareProfile full = sample();
  full.gpu_gemm_hidden = 4096;
  full.gpu_gemm2 = {{1, 0.5e12}, {64, 30e12}};
  full.gpu_gemm2_hidden = 8192;
  const HardwareProfile back = parse_hardware_profile(hardware_profile_to_yaml(full), "back.yaml");
  check_equal(back, full);
  CHECK(back.gpu_gemm_hidden == 4096);
  CHECK(back.gpu_gemm2_hidden == 8192);
  REQUIRE(back.gpu_gemm2.size() == 2);
  CHECK(back.gpu_gemm2[1].flops_per_s == 30e12);
  CHECK(back.gemm_flops(64, 8192) == Approx(30e12));

  // A profile without them (every one before 2026-11-28) loads as before.
  const HardwareProfile old = parse_hardware_profile(with_units(), "hw.yaml");
  CHECK(old.gpu_gemm_hidden == 0);
  CHECK(old.gpu_gemm2.empty());
  // A second curve needs both sizes, named (at the curve's first point).
  const std::string curve2 = "gpu_gemm2:\n  - {tokens: 1, flops_per_s: 1e12}\n";
  CHECK_THROWS_WITH(parse_hardware_profile(with_units("gpu_gemm_hidden: 4096\n" + curve2), "hw.yaml"),
                    Catch::Contains("hw.yaml:18: field 'gpu_gemm2' needs 'gpu_gemm2_hidden'"));
  CHECK_THROWS_WITH(parse_hardware_profile(with_units(curve2 + "gpu_gemm2_hidden: 2048\n"), "hw.yaml"),
                    Catch::Contains("hw.yaml:17: field 'gpu_gemm2' needs 'gpu_gemm_hidden'"));
  CHECK_THROWS_WITH(parse_hardware_profile(with_units("gpu_gemm_hidden: -2\n"), "hw.yaml"),
                    Catch::Contains("hw.yaml:16: field 'gpu_gemm_hidden' must be a number"));
}
