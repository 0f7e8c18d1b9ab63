// Hardware profiles as YAML: parsing with file:line errors (the same habits as policy.cpp), the
// writer `strata profile` uses, and the GEMM curve's interpolation.
#include "strata/profile/hardware.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "strata/core/error.h"
#include "strata/core/yaml_reader.h"
#include "strata/core/size.h"
#include "strata/profile/profiler.h"

namespace strata {
namespace {

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

std::string without_spaces(const std::string& s) {
  std::string out;
  for (char c : s)
    if (c != ' ' && c != '\t') out += c;
  return out;
}

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool ends_with_ci(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && lower(s.substr(s.size() - suffix.size())) == suffix;
}

// A whole string that is one finite decimal number ("25", "2.5e10"); false otherwise.
bool parse_number(const std::string& s, double& v) {
  if (s.empty()) return false;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && end == s.data() + s.size() && std::isfinite(v);
}

struct Reader : YamlReader {

  std::string scalar(const YAML::Node& n, const std::string& field) const {
    if (!n.IsScalar()) fail(n, "field '" + field + "' must be a single value, got a " + (n.IsMap() ? "map" : "list"));
    return trim(n.Scalar());
  }

  std::string text(const YAML::Node& n, const std::string& field) const {
    if (n.IsNull()) return {};
    return scalar(n, field);
  }

  double checked(const YAML::Node& n, const std::string& field, double v, bool zero_ok) const {
    if (v < 0 || (v == 0 && !zero_ok))
      fail(n, "field '" + field + "' must be " + (zero_ok ? "non-negative" : "positive") + ", got '" + n.Scalar() + "'");
    return v;
  }

  // A plain number in [0, max].
  double number(const YAML::Node& n, const std::string& field, double max) const {
    double v = 0;
    if (!parse_number(scalar(n, field), v) || v < 0 || v > max)
      fail(n, "field '" + field + "' must be a number from 0 to " + std::to_string(int(max)) + ", got '" + n.Scalar() + "'");
    return v;
  }

  // Bytes: a number or a size with a suffix (parse_size: 16GiB, 16G, 512MB).
  double size(const YAML::Node& n, const std::string& field) const {
    const std::string s = scalar(n, field);
    double v = 0;
    if (!parse_number(s, v)) {
      try {
        v = double(parse_size(without_spaces(s), field));
      } catch (const Error&) {
        fail(n, "field '" + field + "' must be a size in bytes (4096, 16GiB, 16GB), got '" + s + "'");
      }
    }
    return checked(n, field, v, false);
  }

  // Bytes/s: a number or a size per second (12GB/s, 2.5 GiB/s, 800MiB/s).
  double bandwidth(const YAML::Node& n, const std::string& field, bool zero_ok = false) const {
    const std::string s = scalar(n, field);
    double v = 0;
    if (!parse_number(s, v)) {
      std::string t = without_spaces(s);
      bool ok = ends_with_ci(t, "/s");
      if (ok) {
        t.resize(t.size() - 2);
        if (!parse_number(t, v)) {
          try {
            v = double(parse_size(t, field));
          } catch (const Error&) {
            ok = false;
          }
        }
      }
      if (!ok) fail(n, "field '" + field + "' must be a bandwidth in bytes/s (12e9, 12GB/s, 2.5GiB/s), got '" + s + "'");
    }
    return checked(n, field, v, zero_ok);
  }

  // FLOP/s: a number or one with an SI prefix (65TFLOP/s, 900 GFLOPS).
  double flops(const YAML::Node& n, const std::string& field) const {
    const std::string s = scalar(n, field);
    double v = 0;
    if (!parse_number(s, v)) {
      std::string t = without_spaces(s);
      bool ok = false;
      for (const char* unit : {"flop/s", "flops"})
        if (ends_with_ci(t, unit)) {
          t.resize(t.size() - std::string(unit).size());
          ok = true;
          break;
        }
      double scale = 1;
      if (ok && !t.empty()) {
        const std::string prefixes = "kmgtp";
        const size_t i = prefixes.find(char(std::tolower(static_cast<unsigned char>(t.back()))));
        if (i != std::string::npos) {
          scale = std::pow(1e3, double(i + 1));
          t.pop_back();
        }
      }
      if (!ok || !parse_number(t, v))
        fail(n, "field '" + field + "' must be FLOP/s (8.1e12, 65TFLOP/s, 900GFLOPS), got '" + s + "'");
      v *= scale;
    }
    return checked(n, field, v, false);
  }

  std::vector<GemmPoint> gemm_curve(const YAML::Node& n, const std::string& field) const {
    if (!n.IsSequence() || n.size() == 0)
      fail(n, "field '" + field + "' must be a non-empty list of {tokens, flops_per_s}");
    std::vector<GemmPoint> curve;
    for (size_t i = 0; i < n.size(); ++i) {
      const YAML::Node p = n[i];
      const std::string at = field + "[" + std::to_string(i) + "]";
      if (!p.IsMap()) fail(p, "field '" + at + "' must be a map {tokens, flops_per_s}");
      only_keys(p, {"tokens", "flops_per_s"}, at + ".");
      if (!p["tokens"] || !p["flops_per_s"]) fail(p, "field '" + at + "' needs both tokens and flops_per_s");
      GemmPoint g;
      const std::string tok = scalar(p["tokens"], at + ".tokens");
      if (!parse_number(tok, g.tokens) || g.tokens < 1)
        fail(p["tokens"], "field '" + at + ".tokens' must be a number >= 1, got '" + tok + "'");
      if (!curve.empty() && g.tokens <= curve.back().tokens)
        fail(p["tokens"], "field '" + at + ".tokens': token counts must increase (" + tok + " after " +
                              std::to_string(curve.back().tokens) + ")");
      g.flops_per_s = flops(p["flops_per_s"], at + ".flops_per_s");
      curve.push_back(g);
    }
    return curve;
  }
};

// The shortest text that reads back as the same double; integers (capacities) in full.
std::string number(double v) {
  char buf[64];
  if (v == std::floor(v) && std::fabs(v) < 1e18) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
    return buf;
  }
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// A YAML double-quoted string.
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}

}  // namespace

namespace {

// Linear in log(tokens) between a curve's points, its end values outside them.
double interpolate(const std::vector<GemmPoint>& curve, double tokens, const std::string& profile, const char* field) {
  if (curve.empty()) throw Error("hardware profile '" + profile + "': no GEMM curve (" + field + " is empty)");
  if (tokens <= curve.front().tokens) return curve.front().flops_per_s;
  for (size_t i = 1; i < curve.size(); ++i) {
    const GemmPoint &a = curve[i - 1], &b = curve[i];
    STRATA_CHECK(b.tokens > a.tokens, "hardware profile '" << profile << "': " << field << " token counts must increase");
    if (tokens <= b.tokens) {
      const double f = (std::log(tokens) - std::log(a.tokens)) / (std::log(b.tokens) - std::log(a.tokens));
      return a.flops_per_s + f * (b.flops_per_s - a.flops_per_s);
    }
  }
  return curve.back().flops_per_s;
}

}  // namespace

double HardwareProfile::gemm_flops(double tokens) const { return interpolate(gpu_gemm, tokens, name, "gpu_gemm"); }

double HardwareProfile::gemm_flops(double tokens, double hidden) const {
  const double at_h1 = gemm_flops(tokens);
  if (gpu_gemm2.empty() || gpu_gemm_hidden <= 0 || gpu_gemm2_hidden <= 0 || gpu_gemm2_hidden == gpu_gemm_hidden)
    return at_h1;
  const double at_h2 = interpolate(gpu_gemm2, tokens, name, "gpu_gemm2");
  // Linear in log(h) between the two curves' rates (geometric), held at the nearer one outside.
  const double f = std::clamp((std::log(hidden) - std::log(gpu_gemm_hidden)) /
                                  (std::log(gpu_gemm2_hidden) - std::log(gpu_gemm_hidden)),
                              0.0, 1.0);
  return std::exp((1 - f) * std::log(at_h1) + f * std::log(at_h2));
}

double HardwareProfile::prefill_attention_flops(double prompt_len) const {
  return gpu_prefill_attention.empty() ? 0 : interpolate(gpu_prefill_attention, prompt_len, name, "gpu_prefill_attention");
}

double HardwareProfile::cpu_gemm_flops(double tokens) const { return interpolate(cpu_gemm, tokens, name, "cpu_gemm"); }

double HardwareProfile::cpu_gemm_q4_flops(double tokens) const {
  return interpolate(cpu_gemm_q4, tokens, name, "cpu_gemm_q4");
}

double HardwareProfile::cpu_linear_flops(double tokens, double params, bool q4) const {
  const double large = q4 ? cpu_gemm_q4_flops(tokens) : cpu_gemm_flops(tokens);
  const std::vector<GemmPoint>& small_curve = q4 ? cpu_gemm_q4_small : cpu_gemm_small;
  if (small_curve.empty() || cpu_gemm_params <= 0 || cpu_gemm_small_params <= 0 || cpu_gemm_small_params >= cpu_gemm_params)
    return large;
  const double small = interpolate(small_curve, tokens, name, q4 ? "cpu_gemm_q4_small" : "cpu_gemm_small");
  const double f = std::clamp((std::log(params) - std::log(cpu_gemm_small_params)) /
                                  (std::log(cpu_gemm_params) - std::log(cpu_gemm_small_params)),
                              0.0, 1.0);
  return std::exp((1 - f) * std::log(small) + f * std::log(large));
}

HardwareProfile parse_hardware_profile(const std::string& yaml_text, const std::string& source) {
  Reader r{source};
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::ParserException& e) {
    throw Error(source + ":" + std::to_string(e.mark.line + 1) + ": invalid YAML: " + e.msg);
  }
  if (!root.IsMap()) throw Error(source + ": a hardware profile is a YAML map of fields");
  r.only_keys(root, {"name", "description", "gpu_name", "cpu_name", "gpu_mem", "cpu_mem", "disk_mem", "cpu_to_gpu_bw",
                     "gpu_to_cpu_bw", "disk_to_cpu_bw", "cpu_to_disk_bw", "gpu_gemm", "gpu_attention_bw",
                     "cpu_attention_bw", "cpu_flops", "gpu_dequant_bw", "gpu_attention_q4_bw", "cpu_attention_q4_bw", "cpu_weight_bw",
                     "cpu_weight_q4_bw", "cpu_gemm", "cpu_gemm_q4", "cpu_gemm_params", "cpu_gemm_small",
                     "cpu_gemm_q4_small", "cpu_gemm_small_params", "compute_dtype", "gpu_gemm_hidden", "gpu_gemm2",
                     "gpu_gemm2_hidden", "gpu_prefill_attention", "gpu_elementwise_s",
                     "compute_overhead_s", "step_overhead_s", "link_interference", "overlap_slowdown", "calibrated"},
              "");
  for (const char* required : {"gpu_mem", "cpu_mem", "disk_mem", "cpu_to_gpu_bw", "gpu_to_cpu_bw", "disk_to_cpu_bw",
                               "cpu_to_disk_bw", "gpu_gemm", "gpu_attention_bw", "cpu_attention_bw", "cpu_flops"})
    if (!root[required]) throw Error(source + ": missing field '" + required + "'");
  HardwareProfile hw;
  if (root["name"]) hw.name = r.text(root["name"], "name");
  if (root["description"]) hw.description = r.text(root["description"], "description");
  if (root["gpu_name"]) hw.gpu_name = r.text(root["gpu_name"], "gpu_name");
  if (root["cpu_name"]) hw.cpu_name = r.text(root["cpu_name"], "cpu_name");
  if (root["calibrated"]) hw.calibrated = r.text(root["calibrated"], "calibrated");
  if (root["compute_dtype"]) {
    const std::string dt = r.text(root["compute_dtype"], "compute_dtype");
    if (dt != "F16" && dt != "F32") r.fail(root["compute_dtype"], "field 'compute_dtype' must be F16 or F32, got " + dt);
    hw.compute_dtype = dt == "F16" ? DType::F16 : DType::F32;
  }
  hw.gpu_mem = r.size(root["gpu_mem"], "gpu_mem");
  hw.cpu_mem = r.size(root["cpu_mem"], "cpu_mem");
  hw.disk_mem = r.size(root["disk_mem"], "disk_mem");
  hw.cpu_to_gpu_bw = r.bandwidth(root["cpu_to_gpu_bw"], "cpu_to_gpu_bw");
  hw.gpu_to_cpu_bw = r.bandwidth(root["gpu_to_cpu_bw"], "gpu_to_cpu_bw");
  hw.disk_to_cpu_bw = r.bandwidth(root["disk_to_cpu_bw"], "disk_to_cpu_bw");
  hw.cpu_to_disk_bw = r.bandwidth(root["cpu_to_disk_bw"], "cpu_to_disk_bw");
  hw.gpu_gemm = r.gemm_curve(root["gpu_gemm"], "gpu_gemm");
  if (root["gpu_gemm_hidden"]) hw.gpu_gemm_hidden = r.number(root["gpu_gemm_hidden"], "gpu_gemm_hidden", 1e6);
  if (root["gpu_gemm2"]) {
    hw.gpu_gemm2 = r.gemm_curve(root["gpu_gemm2"], "gpu_gemm2");
    if (!root["gpu_gemm2_hidden"]) r.fail(root["gpu_gemm2"], "field 'gpu_gemm2' needs 'gpu_gemm2_hidden', the hidden size it was measured at");
    if (!(hw.gpu_gemm_hidden > 0))
      r.fail(root["gpu_gemm2"], "field 'gpu_gemm2' needs 'gpu_gemm_hidden', the hidden size gpu_gemm was measured at");
  }
  if (root["gpu_gemm2_hidden"]) hw.gpu_gemm2_hidden = r.number(root["gpu_gemm2_hidden"], "gpu_gemm2_hidden", 1e6);
  if (root["gpu_prefill_attention"])
    hw.gpu_prefill_attention = r.gemm_curve(root["gpu_prefill_attention"], "gpu_prefill_attention");
  hw.gpu_attention_bw = r.bandwidth(root["gpu_attention_bw"], "gpu_attention_bw");
  hw.cpu_attention_bw = r.bandwidth(root["cpu_attention_bw"], "cpu_attention_bw");
  hw.cpu_flops = r.flops(root["cpu_flops"], "cpu_flops");
  if (root["gpu_elementwise_s"]) hw.gpu_elementwise_s = r.number(root["gpu_elementwise_s"], "gpu_elementwise_s", 1.0);
  if (root["gpu_dequant_bw"]) hw.gpu_dequant_bw = r.bandwidth(root["gpu_dequant_bw"], "gpu_dequant_bw", true);
  if (root["gpu_attention_q4_bw"])
    hw.gpu_attention_q4_bw = r.bandwidth(root["gpu_attention_q4_bw"], "gpu_attention_q4_bw", true);
  if (root["cpu_attention_q4_bw"])
    hw.cpu_attention_q4_bw = r.bandwidth(root["cpu_attention_q4_bw"], "cpu_attention_q4_bw", true);
  if (root["cpu_gemm"]) hw.cpu_gemm = r.gemm_curve(root["cpu_gemm"], "cpu_gemm");
  if (root["cpu_gemm_q4"]) hw.cpu_gemm_q4 = r.gemm_curve(root["cpu_gemm_q4"], "cpu_gemm_q4");
  if (root["cpu_gemm_params"]) hw.cpu_gemm_params = r.number(root["cpu_gemm_params"], "cpu_gemm_params", 1e9);
  if (root["cpu_gemm_small_params"])
    hw.cpu_gemm_small_params = r.number(root["cpu_gemm_small_params"], "cpu_gemm_small_params", 1e9);
  for (const auto& [key, curve] : {std::pair{"cpu_gemm_small", &hw.cpu_gemm_small}, {"cpu_gemm_q4_small", &hw.cpu_gemm_q4_small}}) {
    if (!root[key]) continue;
    *curve = r.gemm_curve(root[key], key);
    if (!(hw.cpu_gemm_small_params > 0 && hw.cpu_gemm_params > 0))
      r.fail(root[key], std::string("field '") + key +
                            "' needs 'cpu_gemm_small_params' and 'cpu_gemm_params', the weights of the two matrices it was measured over");
  }
  if (root["cpu_weight_bw"]) hw.cpu_weight_bw = r.bandwidth(root["cpu_weight_bw"], "cpu_weight_bw", true);
  if (root["cpu_weight_q4_bw"]) hw.cpu_weight_q4_bw = r.bandwidth(root["cpu_weight_q4_bw"], "cpu_weight_q4_bw", true);
  if (root["compute_overhead_s"]) hw.compute_overhead_s = r.number(root["compute_overhead_s"], "compute_overhead_s", 1.0);
  if (root["step_overhead_s"]) hw.step_overhead_s = r.number(root["step_overhead_s"], "step_overhead_s", 1.0);
  if (root["link_interference"]) hw.link_interference = r.number(root["link_interference"], "link_interference", 10.0);
  if (root["overlap_slowdown"]) hw.overlap_slowdown = r.number(root["overlap_slowdown"], "overlap_slowdown", 1.0);
  return hw;
}

HardwareProfile load_hardware_profile(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) STRATA_FAIL("cannot open hardware profile " << file.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_hardware_profile(ss.str(), file.string());
}

std::string hardware_profile_to_yaml(const HardwareProfile& hw) {
  std::ostringstream os;
  os << "# Strata hardware profile: bytes, bytes/s and FLOP/s (strata profile writes it; see hardware.h).\n";
  os << "name: " << quoted(hw.name) << "\n";
  os << "description: " << quoted(hw.description) << "\n";
  os << "gpu_name: " << quoted(hw.gpu_name) << "\n";
  os << "cpu_name: " << quoted(hw.cpu_name) << "\n";
  os << "compute_dtype: " << dtype_name(hw.compute_dtype) << "  # of the gpu tier's compute and uncompressed data\n";
  auto bytes = [&](const char* key, double v) { os << key << ": " << number(v) << "  # " << format_bytes(v) << "\n"; };
  auto per_s = [&](const char* key, double v, const char* unit) {
    os << key << ": " << number(v) << "  # " << format_rate(v, unit) << "\n";
  };
  bytes("gpu_mem", hw.gpu_mem);
  bytes("cpu_mem", hw.cpu_mem);
  bytes("disk_mem", hw.disk_mem);
  per_s("cpu_to_gpu_bw", hw.cpu_to_gpu_bw, "B/s");
  per_s("gpu_to_cpu_bw", hw.gpu_to_cpu_bw, "B/s");
  per_s("disk_to_cpu_bw", hw.disk_to_cpu_bw, "B/s");
  per_s("cpu_to_disk_bw", hw.cpu_to_disk_bw, "B/s");
  auto curve = [&](const char* key, const std::vector<GemmPoint>& points, const char* what,
                   const char* by = "by tokens (rows of x in x @ w^T)") {
    os << key << ":  # " << what << " " << by << "\n";
    for (const GemmPoint& p : points)
      os << "  - {tokens: " << number(p.tokens) << ", flops_per_s: " << number(p.flops_per_s) << "}  # "
         << format_rate(p.flops_per_s, "FLOP/s") << "\n";
  };
  curve("gpu_gemm", hw.gpu_gemm, "GEMM throughput");
  if (hw.gpu_gemm_hidden > 0) os << "gpu_gemm_hidden: " << number(hw.gpu_gemm_hidden) << "  # h of gpu_gemm's layers\n";
  if (!hw.gpu_gemm2.empty()) {
    curve("gpu_gemm2", hw.gpu_gemm2, "the same over layers of gpu_gemm2_hidden");
    os << "gpu_gemm2_hidden: " << number(hw.gpu_gemm2_hidden) << "\n";
  }
  if (!hw.gpu_prefill_attention.empty())
    curve("gpu_prefill_attention", hw.gpu_prefill_attention, "causal prefill attention (QK^T and AV)",
          "by prompt length (tokens: s)");
  per_s("gpu_attention_bw", hw.gpu_attention_bw, "B/s of KV cache");
  per_s("cpu_attention_bw", hw.cpu_attention_bw, "B/s of KV cache");
  per_s("cpu_flops", hw.cpu_flops, "FLOP/s");
  auto optional = [&](const char* key, double v, const char* unit) {
    if (v > 0) per_s(key, v, unit);
    else os << key << ": 0  # not measured\n";
  };
  if (hw.gpu_elementwise_s > 0)
    os << "gpu_elementwise_s: " << number(hw.gpu_elementwise_s) << "  # per token and hidden unit of a layer's norms, adds and activation\n";
  optional("gpu_dequant_bw", hw.gpu_dequant_bw, "B/s of output in compute_dtype");
  optional("gpu_attention_q4_bw", hw.gpu_attention_q4_bw, "B/s of the uncompressed KV cache it stands for");
  optional("cpu_attention_q4_bw", hw.cpu_attention_q4_bw, "B/s of the uncompressed KV cache it stands for");
  optional("cpu_weight_bw", hw.cpu_weight_bw, "B/s of weights a CPU linear streams for a few tokens");
  optional("cpu_weight_q4_bw", hw.cpu_weight_q4_bw, "B/s of the uncompressed weights 4-bit codes stand for");
  if (!hw.cpu_gemm.empty()) curve("cpu_gemm", hw.cpu_gemm, "a CPU linear's throughput over the CPU tier's weights");
  if (!hw.cpu_gemm_q4.empty()) curve("cpu_gemm_q4", hw.cpu_gemm_q4, "the same over 4-bit g64 codes");
  if (hw.cpu_gemm_params > 0) os << "cpu_gemm_params: " << number(hw.cpu_gemm_params) << "  # weights of their matrix\n";
  if (!hw.cpu_gemm_small.empty()) curve("cpu_gemm_small", hw.cpu_gemm_small, "cpu_gemm over a small matrix");
  if (!hw.cpu_gemm_q4_small.empty()) curve("cpu_gemm_q4_small", hw.cpu_gemm_q4_small, "cpu_gemm_q4 over the small matrix");
  if (hw.cpu_gemm_small_params > 0)
    os << "cpu_gemm_small_params: " << number(hw.cpu_gemm_small_params) << "  # weights of the small matrix\n";
  if (!hw.calibrated.empty()) os << "calibrated: " << quoted(hw.calibrated) << "\n";
  if (hw.compute_overhead_s > 0 || hw.step_overhead_s > 0 || hw.link_interference > 0 || hw.overlap_slowdown > 0)
    os << "compute_overhead_s: " << number(hw.compute_overhead_s) << "  # per layer and unit of work (measured or calibrated)\n"
       << "step_overhead_s: " << number(hw.step_overhead_s) << "  # per step and unit of work, outside the layers (measured or calibrated)\n"
       << "link_interference: " << number(hw.link_interference) << "  # compute seconds lost per second of copies (calibrated)\n"
       << "overlap_slowdown: " << number(hw.overlap_slowdown) << "  # 0: perfect overlap, 1: none (calibrated)\n";
  return os.str();
}

}  // namespace strata
