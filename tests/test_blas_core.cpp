// The OpenBLAS kernels the CPU backend runs (strata/backend/blas_core.h). The CPU's features are
// read from /proc/cpuinfo, the kernel's view (it clears what the OS does not enable), and the
// kernels OpenBLAS loads from its own OPENBLAS_VERBOSE=2 lines, so neither side comes from Strata.
#include <catch2/catch.hpp>

#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli_support.h"
#include "strata/backend/blas_core.h"

using namespace strata;

namespace {

struct CpuInfo {
  std::string vendor;
  std::set<std::string> flags;
};

// The first processor's vendor_id and flags.
CpuInfo read_cpuinfo() {
  std::ifstream in("/proc/cpuinfo");
  CpuInfo info;
  std::string line;
  while (std::getline(in, line) && (info.vendor.empty() || info.flags.empty())) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = line.substr(0, line.find_first_of(" \t"));
    std::istringstream value(line.substr(colon + 1));
    if (key == "vendor_id") value >> info.vendor;
    if (key == "flags")
      for (std::string f; value >> f;) info.flags.insert(f);
  }
  return info;
}

// The "Core: NAME" lines OpenBLAS prints while it loads, one per process image.
std::vector<std::string> cores_loaded(const std::string& output) {
  std::vector<std::string> cores;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("Core: ", 0) == 0) cores.push_back(line.substr(6));
  return cores;
}

bool has_avx2(const std::string& core) {
  for (const char* c : {"Haswell", "Zen", "Excavator", "SkylakeX", "Cooperlake", "SapphireRapids"})
    if (core == c) return true;
  return false;
}

}  // namespace

TEST_CASE("blas_core_for_cpu names the best kernels /proc/cpuinfo's flags allow", "[blas]") {
  const CpuInfo cpu = read_cpuinfo();
  if (cpu.vendor.empty()) {
    WARN("no /proc/cpuinfo vendor_id: not an x86 Linux machine");
    return;
  }
  auto has = [&](const char* f) { return cpu.flags.count(f) > 0; };
  const bool avx2 = has("avx2") && has("fma");
  const bool avx512 = has("avx512f") && has("avx512bw") && has("avx512vl") && has("avx512dq") && has("avx512cd");
  std::string want;
  if (cpu.vendor == "GenuineIntel")
    want = avx512 ? (has("avx512_bf16") ? "Cooperlake" : "SkylakeX") : avx2 ? "Haswell" : "";
  else if (cpu.vendor == "AuthenticAMD")
    want = avx2 ? "Zen" : "";
  INFO("vendor " << cpu.vendor);
  CHECK(blas_core_for_cpu() == want);
}

TEST_CASE("strata runs OpenBLAS on kernels with the CPU's vector width, and keeps a user's OPENBLAS_CORETYPE", "[blas][cli]") {
  const std::string want = blas_core_for_cpu();
  const test::CliResult chosen = test::run_shell(std::string("env -u OPENBLAS_CORETYPE OPENBLAS_VERBOSE=2 ") + STRATA_BINARY + " --version");
  REQUIRE(chosen.code == 0);
  const std::vector<std::string> cores = cores_loaded(chosen.output);
  INFO(chosen.output);
  REQUIRE(!cores.empty());  // a DYNAMIC_ARCH OpenBLAS names its core
  if (want.empty()) {
    CHECK(cores.size() == 1);  // nothing better to ask for: no second run
  } else if (has_avx2(cores.front())) {
    CHECK(cores.size() == 1);  // OpenBLAS knew this CPU
  } else {
    // OpenBLAS fell back to pre-AVX2 kernels: the program ran again on the CPU's own.
    REQUIRE(cores.size() == 2);
    CHECK(cores.back() == want);
  }
  if (!want.empty()) CHECK(has_avx2(cores.back()));

  const test::CliResult forced = test::run_shell(std::string("OPENBLAS_CORETYPE=Prescott OPENBLAS_VERBOSE=2 ") + STRATA_BINARY + " --version");
  REQUIRE(forced.code == 0);
  CHECK(cores_loaded(forced.output) == std::vector<std::string>{"Prescott"});
}
