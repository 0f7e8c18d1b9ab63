// `strata profile`: measure this machine once and write its hardware profile (YAML) for the
// policy search. Progress goes to stderr, a summary table to stdout.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>

#include "commands.h"
#include "strata/backend/blas_core.h"
#include "strata/core/error.h"
#include "strata/core/size.h"
#include "strata/job/engine_calibration.h"
#include "strata/offload/disk_store.h"
#include "strata/profile/profiler.h"

namespace strata::cli {
namespace {

struct ProfileArgs {
  std::string out;
  bool quick = false;
  std::string device = "auto";
  std::string offload_dir;
  int threads = 0;
};

void print_summary(const HardwareProfile& hw, std::ostream& os) {
  auto row = [&](const char* what, const std::string& value) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "  %-16s ", what);
    os << buf << value << "\n";
  };
  os << "hardware profile " << hw.name << "\n";
  row("gpu", hw.gpu_name);
  row("cpu", hw.cpu_name);
  row("free memory", "gpu " + format_bytes(hw.gpu_mem) + ", cpu " + format_bytes(hw.cpu_mem) + ", disk " +
                         format_bytes(hw.disk_mem));
  row("cpu -> gpu", format_rate(hw.cpu_to_gpu_bw, "B/s"));
  row("gpu -> cpu", format_rate(hw.gpu_to_cpu_bw, "B/s"));
  row("disk -> cpu", format_rate(hw.disk_to_cpu_bw, "B/s"));
  row("cpu -> disk", format_rate(hw.cpu_to_disk_bw, "B/s"));
  row("gpu attention", format_rate(hw.gpu_attention_bw, "B/s of KV cache"));
  row("cpu attention", format_rate(hw.cpu_attention_bw, "B/s of KV cache"));
  if (hw.cpu_weight_bw > 0) row("cpu weights", format_rate(hw.cpu_weight_bw, "B/s streamed by a linear for 2 tokens"));
  if (hw.cpu_weight_q4_bw > 0)
    row("cpu q4 weights", format_rate(hw.cpu_weight_q4_bw, "B/s of the weights 4-bit codes stand for, 2 tokens"));
  row("cpu GEMM", format_rate(hw.cpu_flops, "FLOP/s") + " (OpenBLAS, " + blas_core() + " kernels)");
  // `x` formats a point's x value: its tokens, or a prompt length.
  auto curve = [&](const char* label, const std::vector<GemmPoint>& points, const char* x = "%6.0f tokens: ") {
    for (size_t i = 0; i < points.size(); ++i) {
      char at[32];
      std::snprintf(at, sizeof at, x, points[i].tokens);
      row(i == 0 ? label : "", at + format_rate(points[i].flops_per_s, "FLOP/s"));
    }
  };
  const auto at_h = [](const char* what, double h) { return std::string(what) + " h=" + std::to_string(int64_t(h)); };
  curve(hw.gpu_gemm_hidden > 0 ? at_h("gpu GEMM", hw.gpu_gemm_hidden).c_str() : "gpu GEMM", hw.gpu_gemm);
  if (!hw.gpu_gemm2.empty()) curve(at_h("gpu GEMM", hw.gpu_gemm2_hidden).c_str(), hw.gpu_gemm2);
  curve("gpu prefill attention", hw.gpu_prefill_attention, "prompt %5.0f: ");
  curve("cpu linear", hw.cpu_gemm);
  curve("cpu linear q4", hw.cpu_gemm_q4);
  curve("cpu linear, small", hw.cpu_gemm_small);
  curve("cpu linear q4, small", hw.cpu_gemm_q4_small);
  if (hw.calibrated.empty()) return;
  auto ms = [](double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g ms", s * 1e3);
    return std::string(buf);
  };
  char fractions[96];
  std::snprintf(fractions, sizeof fractions, "%.2f s of compute per second of copies, overlap slowdown %.3g",
                hw.link_interference, hw.overlap_slowdown);
  row("overheads", ms(hw.compute_overhead_s) + " per layer step and unit of work, " + ms(hw.step_overhead_s) +
                       " per step and unit");
  row("interference", fractions);
  row("calibrated by", hw.calibrated);
}

// Writes through a temporary file and a rename, so an interrupted run leaves no half a profile.
void write_file(const std::filesystem::path& path, const std::string& text) {
  if (path.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(path.parent_path(), ec);
    if (ec) STRATA_FAIL("cannot create " << path.parent_path().string() << ": " << ec.message());
  }
  const std::filesystem::path tmp = path.string() + ".partial";
  {
    std::ofstream out(tmp);
    out << text;
    out.close();
    if (!out) STRATA_FAIL("cannot write " << tmp.string());
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) STRATA_FAIL("cannot rename " << tmp.string() << " to " << path.string() << ": " << ec.message());
}

}  // namespace

void add_profile_command(CLI::App& app) {
  auto args = std::make_shared<ProfileArgs>();
  CLI::App* cmd = app.add_subcommand("profile", "measure this machine and write its hardware profile (YAML)");
  cmd->add_option("--out", args->out,
                  "where to write the profile; '-' prints it to stdout (default: " +
                      default_hardware_profile_path().string() + ")");
  cmd->add_flag("--quick", args->quick,
                "small buffers and few points, and no engine runs: seconds instead of minutes (CI)");
  cmd->add_option("--device", args->device, "cpu, cuda or auto (cuda when a GPU is present)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str();
  cmd->add_option("--offload-dir", args->offload_dir,
                  "directory whose disk is measured (default: " + default_offload_dir().string() + ")");
  cmd->add_option("--threads", args->threads, "CPU threads for the cpu backend (0: all cores)")->capture_default_str();
  cmd->callback([args] {
    ProfileOptions opt;
    opt.quick = args->quick;
    opt.backend = args->device;
    opt.offload_dir = args->offload_dir;
    opt.threads = args->threads;
    opt.progress = [](const std::string& line) { std::cerr << "profile: " << line << std::endl; };
    opt.refine = engine_refinement();
    const auto t0 = std::chrono::steady_clock::now();
    const HardwareProfile hw = profile_machine(opt);
    char took[32];
    std::snprintf(took, sizeof took, "%.1f s",
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    const std::string yaml = hardware_profile_to_yaml(hw);
    if (args->out == "-") {
      std::cout << yaml;
      std::cerr << "profile: measured in " << took << "\n";
      return;
    }
    const std::filesystem::path out = args->out.empty() ? default_hardware_profile_path() : std::filesystem::path(args->out);
    write_file(out, yaml);
    print_summary(hw, std::cout);
    std::cout << "wrote " << out.string() << " (measured in " << took << ")\n";
  });
}

}  // namespace strata::cli
