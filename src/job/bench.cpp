#include "strata/job/bench.h"
#include "strata/job/engine_calibration.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <memory>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "strata/backend/backend.h"
#include "strata/backend/device_info.h"
#include "strata/core/error.h"
#include "strata/core/size.h"
#include "strata/core/yaml_reader.h"
#include "strata/model/config.h"
#include "strata/model/model_loader.h"
#include "strata/model/weight_source.h"
#include "strata/offload/engine.h"
#include "strata/policy/cost_model.h"
#include "strata/policy/search.h"
#include "strata/profile/hardware.h"
#include "strata/profile/profiler.h"
#include "strata_build_id.h"  // STRATA_BUILD_ID, generated at build time (src/CMakeLists.txt)

namespace strata {

std::vector<nlohmann::json> read_jsonl(const std::filesystem::path& file) {
  std::vector<nlohmann::json> rows;
  std::ifstream in(file);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      rows.push_back(nlohmann::json::parse(line));
    } catch (const nlohmann::json::exception& e) {
      STRATA_FAIL(file.string() << ":" << n << ": not a JSON object: " << e.what());
    }
    if (!rows.back().is_object()) STRATA_FAIL(file.string() << ":" << n << ": not a JSON object");
  }
  return rows;
}

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

int positive_int(const YamlReader& r, const YAML::Node& n, const std::string& field) {
  try {
    const int v = n.as<int>();
    if (v > 0) return v;
  } catch (const YAML::Exception&) {
  }
  r.fail(n, "field '" + field + "' must be a positive integer");
}

double positive_number(const YamlReader& r, const YAML::Node& n, const std::string& field) {
  try {
    const double v = n.as<double>();
    if (v > 0) return v;
  } catch (const YAML::Exception&) {
  }
  r.fail(n, "field '" + field + "' must be a positive number");
}

std::string text(const YamlReader& r, const YAML::Node& n, const std::string& field) {
  if (!n.IsScalar() || n.Scalar().empty()) r.fail(n, "field '" + field + "' must be a non-empty string");
  return n.Scalar();
}

// The commit this binary was built from (cmake/build_id.cmake), "-dirty" when the tree had
// uncommitted changes; a build made without git: the checkout the run starts in ("unknown" outside
// one). The build's id is the one that matters where a baseline's binary runs in a newer checkout.
std::string git_commit() {
  if (std::string(STRATA_BUILD_ID) != "unknown") return STRATA_BUILD_ID;
  std::string out;
  if (FILE* p = popen("git describe --always --dirty --abbrev=7 2>/dev/null", "r")) {
    char buf[64];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out.empty() ? "unknown" : out;
}

// FNV-1a over the tokens of every result, in order.
uint64_t tokens_digest(const std::vector<GenResult>& results) {
  uint64_t h = 1469598103934665603ull;
  for (const GenResult& r : results)
    for (int32_t t : r.tokens)
      for (int b = 0; b < 4; ++b) h = (h ^ ((uint32_t(t) >> (8 * b)) & 0xFF)) * 1099511628211ull;
  return h;
}

// A model spec: a preset name runs on dummy weights.
std::string model_spec(const std::string& model) {
  if (model.rfind("dummy:", 0) == 0 || !config_preset(model)) return model;
  return "dummy:" + model;
}

// FlexGen's definitions: prefill counts prompt tokens; decode the tokens after each sequence's
// first (which prefill produces); total all generated tokens over both times.
BenchMeasure measure_of(const GenStats& s, int sequences) {
  BenchMeasure m;
  if (s.prefill_seconds > 0) m.prefill_tok_s = double(s.prompt_tokens) / s.prefill_seconds;
  if (s.decode_seconds > 0) m.decode_tok_s = double(s.generated_tokens - sequences) / s.decode_seconds;
  const double t = s.prefill_seconds + s.decode_seconds;
  if (t > 0) m.total_tok_s = double(s.generated_tokens) / t;
  return m;
}

// The cost model's figures in the measured ones' terms (one block, FlexGen's definitions).
BenchMeasure measure_of(const Prediction& p, const Policy& policy, const BenchCase& c) {
  BenchMeasure m;
  const double seqs = policy.block_size();
  if (p.prefill_s > 0) m.prefill_tok_s = seqs * c.prompt_len / p.prefill_s;
  if (p.decode_s > 0) m.decode_tok_s = seqs * (c.gen_len - 1) / p.decode_s;
  m.total_tok_s = p.throughput_tok_s;
  return m;
}

class Progress {
public:
  Progress(std::ostream& log, bool enabled, size_t cases) : log_(log), enabled_(enabled), cases_(cases), t0_(Clock::now()) {}
  void say(size_t index, const std::string& name, const std::string& step) {
    if (!enabled_) return;
    const double t = since(t0_);
    log_ << "[bench] case " << index + 1 << "/" << cases_ << " " << name << ": " << step << ", " << std::fixed
         << std::setprecision(0) << t << " s";
    if (index > 0) log_ << ", ETA " << t / double(index) * double(cases_ - index) << " s";
    log_ << "\n" << std::flush;
  }

private:
  std::ostream& log_;
  bool enabled_;
  size_t cases_;
  Clock::time_point t0_;
};

// The profile that predictions and `auto` use: --hardware's, else the cached one, else (unless
// --no-profile) one measured now on the bench's device and cached for later commands.
std::optional<HardwareProfile> machine_profile(const BenchOptions& opt, const Backend& backend, std::ostream& log) {
  if (!opt.hardware.empty()) {
    if (!std::filesystem::exists(opt.hardware)) STRATA_FAIL("--hardware " << opt.hardware.string() << ": no such file");
    return load_hardware_profile(opt.hardware);
  }
  if (opt.measure_profile) {
    ProfileOptions p;
    p.quick = opt.quick_profile;
    p.backend = backend.device() == Device::CUDA ? "cuda" : "cpu";
    p.offload_dir = opt.offload_dir;
    p.threads = opt.threads;
    p.refine = engine_refinement();
    return cached_or_measured_profile(p, log, "[bench]");
  }
  if (std::filesystem::exists(default_hardware_profile_path())) return load_hardware_profile(default_hardware_profile_path());
  return std::nullopt;
}

struct Machine {
  std::string backend, gpu, cpu, profile;
};

class Runner {
public:
  Runner(const BenchOptions& opt, std::ostream& log) : opt_(opt), log_(log) {
    // One backend serves every case, so `auto` cannot follow each model's checkpoint: fp16.
    backend_ = make_backend(opt.device, opt.threads, gpu_activation_dtype(opt.dtype, DType::F16));
    hw_ = machine_profile(opt, *backend_, log);
    machine_.backend = backend_->name();
    machine_.gpu = backend_->device() == Device::CUDA ? cuda_device_name(0) : "none (cpu backend)";
    machine_.cpu = cpu_model_name();
    machine_.profile = hw_ ? hw_->name : "";
  }

  const Machine& machine() const { return machine_; }
  const std::optional<HardwareProfile>& profile() const { return hw_; }

  BenchCaseResult run(const BenchSuite& suite, size_t index, Progress& progress) {
    const BenchCase& c = suite.cases[index];
    BenchCaseResult r;
    r.spec = c;
    try {
      run_case(suite, c, index, r, progress);
    } catch (const Error& e) {
      r.status = e.what();
      r.runs.clear();
      log_ << "[bench] case " << c.name << ": " << r.status << "\n";
    }
    return r;
  }

private:
  void run_case(const BenchSuite& suite, const BenchCase& c, size_t index, BenchCaseResult& r, Progress& progress) {
    progress.say(index, c.name, "loading " + c.model);
    ModelBundle model = open_model(model_spec(c.model));
    if (c.layers > 0) {
      model.config = bench_config(c.model, c.layers);
      model.weights = make_dummy_source(model.config);
    }
    OffloadOptions o;
    const std::string gpu = c.gpu_mem.empty() ? opt_.gpu_mem : c.gpu_mem;
    const std::string cpu = c.cpu_mem.empty() ? opt_.cpu_mem : c.cpu_mem;
    const std::string disk = c.disk_mem.empty() ? opt_.disk_mem : c.disk_mem;
    if (!gpu.empty()) o.gpu_budget = double(parse_size(gpu, "gpu_mem"));
    if (!cpu.empty()) o.cpu_budget = double(parse_size(cpu, "cpu_mem"));
    if (!disk.empty()) o.disk_budget = double(parse_size(disk, "disk_mem"));
    o.offload_dir = opt_.offload_dir;
    o.cpu_threads = opt_.threads;
    const Workload w{c.prompt_len, c.gen_len};
    if (c.policy == "auto") {
      if (!hw_) STRATA_FAIL("policy auto needs a hardware profile: --hardware HW.yaml, or run strata profile (or drop --no-profile)");
      SearchOptions s;
      s.workload = w;
      s.budget = default_budgets(*backend_, o);
      s.allow_compression = c.compress;
      s.kept_codes = kept_codes_compression(model.weights->codes_spec());
      if (c.max_latency_s > 0) s.max_latency_s = c.max_latency_s;
      o.policy = search_policy(model.config, *hw_, s).ranked.front().policy;
    } else {
      o.policy = load_policy(suite.dir / c.policy);
    }
    r.policy_yaml = policy_to_yaml(o.policy);
    r.policy = o.policy;
    r.config = model.config;
    if (hw_) {
      const Prediction pred = evaluate(model.config, o.policy, w, *hw_);
      r.predicted = measure_of(pred, o.policy, c);
      // Seconds per layer on each link, back to bytes over the block's layers and steps.
      const double steps = double(model.config.n_layers), decode_steps = steps * (c.gen_len - 1);
      r.ctog_bytes_predicted =
          (pred.prefill.terms[CTOG] * steps + pred.decode.terms[CTOG] * decode_steps) * hw_->cpu_to_gpu_bw;
      r.gtoc_bytes_predicted =
          (pred.prefill.terms[GTOC] * steps + pred.decode.terms[GTOC] * decode_steps) * hw_->gpu_to_cpu_bw;
    }
    if (hw_) {
      r.ctog_peak_gbps = hw_->cpu_to_gpu_bw / 1e9;
      r.dtoc_peak_gbps = hw_->disk_to_cpu_bw / 1e9;
    }

    progress.say(index, c.name, "placing weights");
    OffloadEngine engine(model.config, *model.weights, *backend_, o, {c.prompt_len, c.gen_len});
    // A projected case runs its first decode_steps steps only; the plan is the full run's.
    const bool project = c.decode_steps > 0 && c.decode_steps < c.gen_len - 1;
    // Projection takes the mean of steps in which every batch decodes; a staggered prefill's
    // first steps mix prefill and decode, and its last ones run a part of the batches.
    STRATA_CHECK(!project || o.policy.start_steps() == 1,
                 "bench case " << c.name << ": decode_steps projects decode from its first steps, which a staggered "
                               << "prefill (prefill_batches_per_step) mixes with prefill; drop one of them");
    r.decode_steps_run = project ? c.decode_steps : c.gen_len - 1;
    const std::vector<GenRequest> reqs =
        synthetic_requests(o.policy.block_size(), c.prompt_len, r.decode_steps_run + 1, model.config.vocab_size);
    // Warm-up: prefill and one token, so first touches of every buffer stay out of the figures.
    std::vector<GenRequest> warm = reqs;
    for (GenRequest& q : warm) q.sampling.max_new_tokens = 1;
    progress.say(index, c.name, "warm-up");
    GenStats warm_stats;
    engine.generate(warm, &warm_stats);
    for (int k = 0; k < opt_.repeat; ++k) {
      progress.say(index, c.name, "run " + std::to_string(k + 1) + "/" + std::to_string(opt_.repeat));
      const OffloadReport before = engine.report();
      GenStats stats;
      const std::vector<GenResult> results = engine.generate(reqs, &stats);
      const OffloadReport after = engine.report();
      r.tokens_digest = tokens_digest(results);
      r.ctog_bytes = double(after.cpu_to_gpu.bytes - before.cpu_to_gpu.bytes);
      r.gtoc_bytes = double(after.gpu_to_cpu.bytes - before.gpu_to_cpu.bytes);
      r.cpu_experts_s = after.cpu_experts_seconds - before.cpu_experts_seconds;
      const RoutingTotals decode_routing = stats.routing - warm_stats.routing;  // the same prompts' prefill
      if (decode_routing.layer_steps > 0) {
        r.decode_active_experts = double(decode_routing.active_experts) / double(decode_routing.layer_steps);
        r.decode_active_experts_expected = expected_active_experts(
            model.config.n_experts, model.config.experts_per_token,
            double(decode_routing.tokens) / double(decode_routing.layer_steps));
      }
      const double share = 1.0 / opt_.repeat;
      r.prefill_s += share * stats.prefill_seconds;
      r.decode_s += share * stats.decode_seconds;
      if (project) {  // the mean step for every step after the first token
        const double scale = double(c.gen_len - 1) / r.decode_steps_run;
        stats.decode_seconds *= scale;
        stats.generated_tokens = int64_t(o.policy.block_size()) * c.gen_len;
      }
      r.runs.push_back(measure_of(stats, o.policy.block_size()));
      const PhaseBusy busy = busy_between(before, after);
      for (int lane = 0; lane < kNumLanes; ++lane) {
        r.prefill_busy[size_t(lane)] += share * busy.prefill[size_t(lane)];
        r.decode_busy[size_t(lane)] += share * busy.decode[size_t(lane)];
      }
      auto rate = [](const LinkStats& a, const LinkStats& b) {
        const double s = b.seconds - a.seconds;
        return s > 0 ? double(b.bytes - a.bytes) / s / 1e9 : 0.0;
      };
      r.ctog_gbps = rate(before.cpu_to_gpu, after.cpu_to_gpu);
      r.cpu_attention_s = after.cpu_attention_seconds - before.cpu_attention_seconds;
      r.cpu_attention_gbps =
          r.cpu_attention_s > 0 ? (after.cpu_attention_bytes - before.cpu_attention_bytes) / r.cpu_attention_s / 1e9 : 0;
      r.dtoc_gbps = rate(before.disk_to_cpu, after.disk_to_cpu);
      const int64_t decode_steps = after.gen.decode_steps - before.gen.decode_steps;
      r.host_waits_per_decode_step =
          decode_steps > 0 ? double(after.decode_host_waits - before.decode_host_waits) / double(decode_steps) : 0;
      r.host_wait_s = after.host_wait_seconds - before.host_wait_seconds;
      r.peak_gpu = after.peak.gpu;
      r.peak_cpu = after.peak.cpu;
      r.peak_disk = after.peak.disk;
    }
  }

  const BenchOptions& opt_;
  std::ostream& log_;
  std::unique_ptr<Backend> backend_;
  std::optional<HardwareProfile> hw_;
  Machine machine_;
};

json measure_json(const BenchMeasure& m) {
  return {{"prefill_tok_s", m.prefill_tok_s}, {"decode_tok_s", m.decode_tok_s}, {"total_tok_s", m.total_tok_s}};
}

std::string fixed(double v, int digits) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(digits) << v;
  return os.str();
}

// "12.3 ± 0.4" (the ± part only with several runs).
std::string mean_sd(double mean, double sd, size_t runs) {
  return fixed(mean, 2) + (runs > 1 ? " ± " + fixed(sd, 2) : "");
}

// One results.jsonl line per case (the fields peers' runners write too: bench/peers/README.md).
json case_json(const BenchSuite& suite, const Machine& m, const std::string& commit, const BenchCaseResult& r) {
  const BenchCase& c = r.spec;
  json j = {{"name", c.name},     {"engine", "strata"}, {"suite", suite.name},     {"model", c.model},
            {"prompt_len", c.prompt_len}, {"gen_len", c.gen_len}, {"status", r.status}, {"policy", r.policy_yaml},
            {"commit", commit},
            {"machine", {{"backend", m.backend}, {"gpu", m.gpu}, {"cpu", m.cpu}, {"hardware_profile", m.profile}}}};
  if (r.status != "ok") return j;
  const BenchMeasure mean = r.mean(), sd = r.sd();
  j["measured"] = measure_json(mean);
  j["measured"]["sd"] = measure_json(sd);
  j["measured"]["repeats"] = r.runs.size();
  if (r.projected()) {
    j["projected"] = true;
    j["measured"]["decode_steps_run"] = r.decode_steps_run;
  }
  j["predicted"] = r.predicted ? measure_json(*r.predicted) : json(nullptr);
  j["links"] = {{"cpu_to_gpu_gbps", r.ctog_gbps}, {"cpu_to_gpu_peak_gbps", r.ctog_peak_gbps},
                {"disk_to_cpu_gbps", r.dtoc_gbps}, {"disk_to_cpu_peak_gbps", r.dtoc_peak_gbps}};
  j["peak_memory"] = {{"gpu", r.peak_gpu}, {"cpu", r.peak_cpu}, {"disk", r.peak_disk}};
  if (r.cpu_attention_s > 0) j["cpu_attention"] = {{"seconds", r.cpu_attention_s}, {"gbps", r.cpu_attention_gbps}};
  j["host_waits"] = {{"per_decode_step", r.host_waits_per_decode_step}, {"seconds", r.host_wait_s}};
  j["bytes"] = {{"cpu_to_gpu", r.ctog_bytes}, {"gpu_to_cpu", r.gtoc_bytes}};
  if (r.predicted) j["bytes"].update({{"cpu_to_gpu_predicted", r.ctog_bytes_predicted}, {"gpu_to_cpu_predicted", r.gtoc_bytes_predicted}});
  std::ostringstream digest;
  digest << std::hex << std::setw(16) << std::setfill('0') << r.tokens_digest;
  j["tokens_digest"] = digest.str();
  if (c.layers > 0) j["layers"] = c.layers;
  if (r.config.moe())
    j["moe"] = {{"cpu_experts", cpu_experts_name(r.policy)},
                {"cpu_experts_seconds", r.cpu_experts_s},
                {"decode_active_experts", r.decode_active_experts},
                {"decode_active_experts_expected", r.decode_active_experts_expected}};
  // Per phase, the wall time and each lane's busy time (what --calibrate fits; mean over repeats).
  auto lanes = [](const std::array<double, kNumLanes>& b) {
    return json{{"compute", b[kLaneCompute]}, {"cpu_to_gpu", b[kLaneH2d]}, {"gpu_to_cpu", b[kLaneD2h]},
                {"disk", b[kLaneDisk]}, {"cpu_attention", b[kLaneCpuAttention]}};
  };
  j["seconds"] = {{"prefill", r.prefill_s}, {"decode", r.decode_s}, {"decode_steps", r.decode_steps_run},
                  {"prefill_busy", lanes(r.prefill_busy)}, {"decode_busy", lanes(r.decode_busy)}};
  return j;
}

double num(const json& j, const char* key, double fallback = 0) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : fallback;
}
std::string str(const json& j, const char* key, const std::string& fallback = "") {
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : fallback;
}

// " (4-bit)" where everything compressed is 4-bit, else each part's bits: " (8-bit weights)",
// " (8-bit weights, 4-bit cache)"; "" without compression.
std::string compression_of(const Policy& p) {
  const std::optional<Compression>&w = p.compress_weights, &c = p.compress_kv_cache;
  if (!w && !c) return "";
  if ((!w || w->bits == 4) && (!c || c->bits == 4)) return " (4-bit)";
  std::string s = w ? std::to_string(w->bits) + "-bit weights" : "";
  if (c) s += (s.empty() ? "" : ", ") + std::to_string(c->bits) + "-bit cache";
  return " (" + s + ")";
}

// "8 x 1 (4-bit)": Strata's lines carry the policy YAML, peers' lines the batch shape.
std::string block_of(const json& j) {
  if (j.contains("policy") && j["policy"].is_string()) {
    try {
      const Policy p = parse_policy(j["policy"].get<std::string>(), str(j, "name"));
      return std::to_string(p.gpu_batch_size) + " x " + std::to_string(p.num_gpu_batches) + compression_of(p);
    } catch (const Error&) {  // not a whole policy: its batch shape alone
      const std::string y = j["policy"].get<std::string>();
      std::smatch g, n;
      if (!std::regex_search(y, g, std::regex("gpu_batch_size:\\s*(\\d+)"))) return "";
      const bool has_n = std::regex_search(y, n, std::regex("num_gpu_batches:\\s*(\\d+)"));
      return g[1].str() + " x " + (has_n ? n[1].str() : std::string("1"));
    }
  }
  if (!j.contains("gpu_batch_size")) return "";
  return std::to_string(int(num(j, "gpu_batch_size"))) + " x " + std::to_string(int(num(j, "num_gpu_batches", 1))) +
         (j.value("compress_weight", false) || j.value("compress_cache", false) ? " (4-bit)" : "");
}

// One table row from one results line. `strata_total`: the Strata row's total of the same case,
// for a peer's ratio.
std::string markdown_row(const json& j, double strata_total) {
  std::ostringstream md;
  const std::string engine = str(j, "engine", "strata");
  md << "| " << str(j, "name") << " | " << engine << " | " << str(j, "model") << " | " << int(num(j, "prompt_len"))
     << " | " << int(num(j, "gen_len")) << " | ";
  if (str(j, "status", "ok") != "ok" || !j.contains("measured")) {
    md << " | " << str(j, "status", "no measurement") << " | | | | | | |\n";
    return md.str();
  }
  const json& m = j["measured"];
  const json sd = m.contains("sd") ? m["sd"] : json::object();
  const size_t runs = size_t(num(m, "repeats", 1));
  const double total = num(m, "total_tok_s");
  md << block_of(j) << " | " << mean_sd(num(m, "prefill_tok_s"), num(sd, "prefill_tok_s"), runs) << " | "
     << mean_sd(num(m, "decode_tok_s"), num(sd, "decode_tok_s"), runs) << " | "
     << mean_sd(total, num(sd, "total_tok_s"), runs);
  if (engine != "strata" && strata_total > 0 && total > 0) md << " (strata " << fixed(strata_total / total, 2) << "x)";
  if (j.value("projected", false)) md << " (projected)";
  md << " | ";
  const bool predicted = j.contains("predicted") && j["predicted"].is_object();
  const double pred = predicted ? num(j["predicted"], "total_tok_s") : 0;
  std::string error;
  if (predicted && total > 0) error = (pred >= total ? "+" : "") + fixed(100.0 * (pred / total - 1), 0) + "%";
  md << (predicted ? fixed(pred, 2) : "") << " | " << error << " | ";
  if (j.contains("links")) {
    const json& l = j["links"];
    const double peak = num(l, "cpu_to_gpu_peak_gbps");
    md << fixed(num(l, "cpu_to_gpu_gbps"), 2) << (peak > 0 ? " (" + fixed(peak, 1) + ")" : "");
  }
  md << " | ";
  if (j.contains("peak_memory")) {
    const json& p = j["peak_memory"];
    md << format_bytes(num(p, "gpu"));
    if (p.contains("cpu")) md << " / " << format_bytes(num(p, "cpu")) << " / " << format_bytes(num(p, "disk"));
  }
  md << " |\n";
  return md.str();
}


// results.md from the results lines: each Strata row, then the peers' rows of the same case;
// peers' cases that Strata did not run come last.
std::string results_markdown(const std::string& suite, const std::vector<json>& rows, const std::vector<json>& peers) {
  std::ostringstream md;
  const json first = rows.empty() ? json::object() : rows.front();
  const json machine = first.contains("machine") ? first["machine"] : json::object();
  size_t repeats = 0;
  for (const json& r : rows)
    if (r.contains("measured")) repeats = std::max(repeats, size_t(num(r["measured"], "repeats", 1)));
  const std::string profile = str(machine, "hardware_profile");
  md << "# strata bench: " << suite << "\n\n"
     << "- commit: " << str(first, "commit", "unknown") << "\n- backend: " << str(machine, "backend")
     << "\n- gpu: " << str(machine, "gpu") << "\n- cpu: " << str(machine, "cpu")
     << "\n- hardware profile: " << (profile.empty() ? "none (no predictions)" : profile) << "\n- repeats: " << repeats
     << " (mean ± sd); total = generated tokens / (prefill + decode time)\n";
  if (!peers.empty())
    md << "- peers (bench/peers/): their own rows under each case, with strata's total over theirs; their commands "
          "are in peers.jsonl\n";
  md << "\n| case | engine | model | prompt | gen | block | prefill tok/s | decode tok/s | total tok/s | predicted | "
        "error | cpu->gpu GB/s (peak) | peak gpu / cpu / disk |\n"
     << "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  std::vector<bool> shown(peers.size(), false);
  for (const json& r : rows) {
    md << markdown_row(r, 0);
    const double total = r.contains("measured") ? num(r["measured"], "total_tok_s") : 0;
    for (size_t i = 0; i < peers.size(); ++i)
      if (str(peers[i], "name") == str(r, "name")) {
        md << markdown_row(peers[i], total);
        shown[i] = true;
      }
  }
  for (size_t i = 0; i < peers.size(); ++i)
    if (!shown[i]) md << markdown_row(peers[i], 0);
  return md.str();
}

void write_results(const BenchOptions& opt, const BenchSuite& suite, const Machine& m, const std::string& commit,
                   const std::vector<BenchCaseResult>& results) {
  std::filesystem::create_directories(opt.out);
  std::vector<json> rows;
  for (const BenchCaseResult& r : results) rows.push_back(case_json(suite, m, commit, r));
  std::ofstream jl(opt.out / "results.jsonl");
  for (const json& j : rows) jl << j.dump() << "\n";
  const std::filesystem::path peers = opt.out / "peers.jsonl";
  const std::string md = results_markdown(suite.name, rows, std::filesystem::exists(peers) ? read_jsonl(peers)
                                                                                         : std::vector<json>{});
  std::ofstream out(opt.out / "results.md");
  out << md;
  if (!jl || !out) STRATA_FAIL("bench: cannot write results into " << opt.out.string());
}

}  // namespace

ModelConfig bench_config(const std::string& model, int layers) {
  const std::string name = model.rfind("dummy:", 0) == 0 ? model.substr(6) : model;
  const std::optional<ModelConfig> preset = config_preset(name);
  STRATA_CHECK(preset || layers == 0, "model '" << model << "': only a preset can be cut to " << layers << " layers");
  ModelConfig cfg = preset ? *preset : open_model(model).config;
  if (layers == 0) return cfg;
  STRATA_CHECK(layers <= cfg.n_layers, "model '" << model << "' has " << cfg.n_layers << " layers, not " << layers);
  cfg.keep_layers(layers);
  return cfg;
}

std::vector<GenRequest> synthetic_requests(int count, int len, int gen, int vocab) {
  std::vector<GenRequest> reqs(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    for (int t = 0; t < len; ++t) reqs[size_t(i)].prompt.push_back(int32_t((7919LL * (t + 1) + 104729LL * i) % vocab));
    reqs[size_t(i)].sampling.max_new_tokens = gen;
    reqs[size_t(i)].sampling.ignore_eos = true;
  }
  return reqs;
}

PhaseBusy busy_between(const OffloadReport& before, const OffloadReport& after) {
  // The CPU attention lane works in decode only (FlexGen delegates decode attention alone).
  const std::array<double, kNumLanes> total{after.compute_busy - before.compute_busy, after.h2d_busy - before.h2d_busy,
                                            after.d2h_busy - before.d2h_busy, after.disk_busy - before.disk_busy,
                                            after.cpu_attention_seconds - before.cpu_attention_seconds};
  PhaseBusy b;
  b.prefill = {after.prefill_compute_busy - before.prefill_compute_busy,
               after.prefill_h2d_busy - before.prefill_h2d_busy, after.prefill_d2h_busy - before.prefill_d2h_busy,
               after.prefill_disk_busy - before.prefill_disk_busy, 0.0};
  for (int lane = 0; lane < kNumLanes; ++lane) b.decode[size_t(lane)] = total[size_t(lane)] - b.prefill[size_t(lane)];
  return b;
}

BenchMeasure BenchCaseResult::mean() const {
  BenchMeasure m;
  for (const BenchMeasure& r : runs) {
    m.prefill_tok_s += r.prefill_tok_s / double(runs.size());
    m.decode_tok_s += r.decode_tok_s / double(runs.size());
    m.total_tok_s += r.total_tok_s / double(runs.size());
  }
  return m;
}

BenchMeasure BenchCaseResult::sd() const {
  BenchMeasure s;
  if (runs.size() < 2) return s;
  const BenchMeasure m = mean();
  for (const BenchMeasure& r : runs) {
    s.prefill_tok_s += std::pow(r.prefill_tok_s - m.prefill_tok_s, 2);
    s.decode_tok_s += std::pow(r.decode_tok_s - m.decode_tok_s, 2);
    s.total_tok_s += std::pow(r.total_tok_s - m.total_tok_s, 2);
  }
  const double n = double(runs.size() - 1);
  return {std::sqrt(s.prefill_tok_s / n), std::sqrt(s.decode_tok_s / n), std::sqrt(s.total_tok_s / n)};
}

BenchSuite parse_bench_suite(const std::string& yaml_text, const std::string& source, const std::filesystem::path& dir) {
  YamlReader r{source};
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::ParserException& e) {
    throw Error(source + ":" + std::to_string(e.mark.line + 1) + ": invalid YAML: " + e.msg);
  }
  if (!root.IsMap()) throw Error(source + ": a bench suite is a YAML map with a 'cases' list");
  r.only_keys(root, {"name", "cases"}, "");
  if (!root["cases"] || !root["cases"].IsSequence() || root["cases"].size() == 0)
    r.fail(root, "field 'cases' must be a non-empty list");
  BenchSuite s;
  s.name = root["name"] ? text(r, root["name"], "name") : std::filesystem::path(source).stem().string();
  s.dir = dir;
  for (const YAML::Node& n : root["cases"]) {
    if (!n.IsMap()) r.fail(n, "each case is a map {name, model, prompt_len, gen_len, policy, ...}");
    r.only_keys(n, {"name", "model", "prompt_len", "gen_len", "policy", "compress", "gpu_mem", "cpu_mem", "disk_mem",
                    "decode_steps", "layers", "max_latency"},
                "case.");
    for (const char* required : {"name", "model", "prompt_len", "gen_len", "policy"})
      if (!n[required]) r.fail(n, std::string("case: missing field '") + required + "'");
    BenchCase c;
    c.line = n.Mark().line + 1;
    c.name = text(r, n["name"], "name");
    for (const BenchCase& other : s.cases)
      if (other.name == c.name) r.fail(n["name"], "case name '" + c.name + "' is used twice");
    c.model = text(r, n["model"], "model");
    c.prompt_len = positive_int(r, n["prompt_len"], "prompt_len");
    c.gen_len = positive_int(r, n["gen_len"], "gen_len");
    c.policy = text(r, n["policy"], "policy");
    if (n["decode_steps"]) c.decode_steps = positive_int(r, n["decode_steps"], "decode_steps");
    if (n["max_latency"]) {
      c.max_latency_s = positive_number(r, n["max_latency"], "max_latency");
      if (c.policy != "auto") r.fail(n["max_latency"], "field 'max_latency' bounds the search: it needs policy auto");
    }
    if (n["layers"]) {
      c.layers = positive_int(r, n["layers"], "layers");
      if (!config_preset(c.model.rfind("dummy:", 0) == 0 ? c.model.substr(6) : c.model))
        r.fail(n["layers"], "field 'layers' cuts a preset (dummy weights); model '" + c.model + "' is not one");
    }
    if (n["compress"]) {
      try {
        c.compress = n["compress"].as<bool>();
      } catch (const YAML::Exception&) {
        r.fail(n["compress"], "field 'compress' must be true or false");
      }
    }
    for (auto [key, field] : {std::pair{"gpu_mem", &c.gpu_mem}, {"cpu_mem", &c.cpu_mem}, {"disk_mem", &c.disk_mem}})
      if (n[key]) {
        *field = text(r, n[key], key);
        try {
          parse_size(*field, key);
        } catch (const Error& e) {
          r.fail(n[key], e.what());
        }
      }
    s.cases.push_back(std::move(c));
  }
  return s;
}

BenchSuite load_bench_suite(const std::string& file_or_name) {
  std::filesystem::path path = file_or_name;
  if (!std::filesystem::exists(path)) path = std::filesystem::path("bench/suites") / (file_or_name + ".yaml");
  if (!std::filesystem::exists(path))
    STRATA_FAIL("bench suite '" << file_or_name << "': no such file, nor bench/suites/" << file_or_name
                                << ".yaml (run from the repository root, or give a path)");
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_bench_suite(ss.str(), path.string(), path.parent_path());
}

void write_bench_report(const std::filesystem::path& dir) {
  const std::filesystem::path results = dir / "results.jsonl", peers = dir / "peers.jsonl";
  if (!std::filesystem::exists(results) && !std::filesystem::exists(peers))
    STRATA_FAIL("--report " << dir.string() << ": neither results.jsonl nor peers.jsonl there");
  const std::vector<json> rows = std::filesystem::exists(results) ? read_jsonl(results) : std::vector<json>{};
  std::string suite = rows.empty() ? "" : str(rows.front(), "suite");
  if (suite.empty()) suite = std::filesystem::absolute(dir).lexically_normal().filename().string();
  const std::string md =
      results_markdown(suite, rows, std::filesystem::exists(peers) ? read_jsonl(peers) : std::vector<json>{});
  std::ofstream out(dir / "results.md");
  out << md;
  if (!out) STRATA_FAIL("--report: cannot write " << (dir / "results.md").string());
}

std::vector<BenchCaseResult> run_bench(const BenchOptions& opt, std::ostream& log) {
  STRATA_CHECK(opt.repeat >= 1, "--repeat must be at least 1, got " << opt.repeat);
  const BenchSuite suite = load_bench_suite(opt.suite);
  Runner runner(opt, log);
  if (opt.calibrate && !runner.profile())
    STRATA_FAIL("--calibrate needs a hardware profile to refine: --hardware HW.yaml, or run strata profile first");
  const std::string commit = git_commit();
  Progress progress(log, opt.progress, suite.cases.size());
  std::vector<BenchCaseResult> results;
  for (size_t i = 0; i < suite.cases.size(); ++i) {
    results.push_back(runner.run(suite, i, progress));
    write_results(opt, suite, runner.machine(), commit, results);  // a long suite keeps what it has
  }
  log << "[bench] wrote " << (opt.out / "results.jsonl").string() << " and " << (opt.out / "results.md").string()
      << "\n";
  if (opt.calibrate) write_calibration(*runner.profile(), results, opt.out, log);
  return results;
}

}  // namespace strata
