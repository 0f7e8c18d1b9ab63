// `strata policy`: a dry run of the policy search (or, with --evaluate, the cost model's
// prediction for a given policy) for a model, a machine and a workload. Nothing is loaded.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.h"
#include "strata/core/error.h"
#include "strata/core/size.h"
#include "strata/model/config.h"
#include "strata/model/model_loader.h"
#include "strata/policy/refill.h"
#include "strata/policy/search.h"

namespace strata::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// A preset name (or dummy:PRESET), a model directory with config.json, or a .gguf file.
ModelConfig resolve_model(const std::string& spec) {
  const std::string name = spec.rfind("dummy:", 0) == 0 ? spec.substr(6) : spec;
  if (auto c = config_preset(name)) return *c;
  const fs::path p(spec);
  if (fs::is_directory(p) && fs::exists(p / "config.json")) return config_from_hf_json(p / "config.json");
  if (fs::is_regular_file(p) && p.filename() == "config.json") return config_from_hf_json(p);
  if (fs::is_regular_file(p) && p.extension() == ".gguf") return open_model(spec).config;
  std::string presets;
  for (const std::string& n : config_preset_names()) presets += (presets.empty() ? "" : ", ") + n;
  STRATA_FAIL("--model " << spec << ": not a preset (" << presets
                         << "), a model directory with config.json, or a .gguf file");
}

// The compression that keeps a checkpoint's own codes (WeightSource::codes_spec), where its weights
// are here to say: a config.json alone, or a preset, has none.
std::optional<Compression> kept_codes_of(const std::string& spec) {
  const fs::path p(spec);
  bool weights = fs::is_regular_file(p) && p.extension() == ".gguf";
  if (fs::is_directory(p))
    for (const fs::directory_entry& e : fs::directory_iterator(p))
      weights = weights || e.path().extension() == ".safetensors";
  if (!weights) return std::nullopt;
  return kept_codes_compression(open_model(spec).weights->codes_spec());
}

double rounded(double v, int digits) {  // for JSON fields that read better short
  const double scale = std::pow(10.0, digits);
  return std::round(v * scale) / scale;
}

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string split_str(const TierSplit& s) {
  return std::to_string(s.gpu) + "/" + std::to_string(s.cpu) + "/" + std::to_string(s.disk);
}

// "w4", "kv4", "w8+kv4": what is compressed, and to how many bits.
std::string compression_str(const Policy& p) {
  std::string s;
  if (p.compress_weights) s = "w" + std::to_string(p.compress_weights->bits);
  if (p.compress_kv_cache) s += (s.empty() ? "kv" : "+kv") + std::to_string(p.compress_kv_cache->bits);
  return s.empty() ? "-" : s;
}

json tiers_json(const TierBytes& b) { return {{"gpu", b.gpu}, {"cpu", b.cpu}, {"disk", b.disk}}; }

json policy_json(const Policy& p) {
  auto split = [](const TierSplit& s) { return json{{"gpu", s.gpu}, {"cpu", s.cpu}, {"disk", s.disk}}; };
  auto comp = [](const std::optional<Compression>& c) {
    return c ? json{{"bits", c->bits}, {"group_size", c->group_size}} : json(nullptr);
  };
  return {{"gpu_batch_size", p.gpu_batch_size}, {"num_gpu_batches", p.num_gpu_batches},
          {"weights", split(p.weights)},
          {"expert_weights", p.expert_weights ? split(*p.expert_weights) : json(nullptr)},
          {"kv_cache", split(p.kv_cache)},
          {"activations", split(p.activations)}, {"overlap", p.overlap},
          {"cpu_attention", p.cpu_attention},   {"cpu_experts", cpu_experts_name(p)},
          {"compress_weights", comp(p.compress_weights)},
          {"compress_kv_cache", comp(p.compress_kv_cache)}, {"prefill_batches_per_step", p.prefill_batches_per_step}};
}

// What a policy needs: the larger of the cost model's peak and the runtime plan's reservation.
TierBytes needed(const Prediction& pred, const std::optional<TierBytes>& plan) {
  TierBytes b = pred.peak;
  if (plan)
    for (Tier t : {Tier::Gpu, Tier::Cpu, Tier::Disk}) b.at(t) = std::max(b.at(t), plan->at(t));
  return b;
}

json prediction_json(const Candidate& c) {
  const Prediction& p = c.prediction;
  auto stage = [](const StageTime& st) {
    json j;
    for (int t = 0; t < kNumTerms; ++t) j[term_name(t)] = st.terms[t];
    j["compute"] = st.compute;  // comp and catt as the pipeline overlaps them
    j["total"] = st.total;
    j["bound"] = term_name(st.bound);
    return j;
  };
  json fr;
  // The MLP halves' fractions only where they are placed apart: tied, wg, wc, wd place them.
  const int vars = c.policy.expert_weights ? kNumVars : int(MG);
  for (int v = 0; v < vars; ++v) fr[var_name(v)] = rounded(p.fractions[v], 6);
  return {{"throughput_tok_s", p.throughput_tok_s},
          {"latency_s", p.latency_s},
          {"prefill_s", p.prefill_s},
          {"decode_s", p.decode_s},
          {"block_size", c.policy.block_size()},
          {"peak_bytes", tiers_json(needed(p, c.plan_peak))},
          {"model_peak_bytes", tiers_json(p.peak)},
          {"runtime_plan_peak_bytes", c.plan_peak ? tiers_json(*c.plan_peak) : json(nullptr)},
          {"per_layer", {{"prefill", stage(p.prefill)}, {"decode", stage(p.decode)}}},
          {"fractions", fr}};
}

void print_prediction(std::ostream& os, const Candidate& c, const TierBytes& budget) {
  const Prediction& p = c.prediction;
  os << "predicted:\n";
  os << "  throughput   " << fixed(p.throughput_tok_s, 2) << " tok/s  (block of " << c.policy.block_size()
     << " sequences)\n";
  os << "  latency      " << fixed(p.latency_s, 1) << " s  (prefill " << fixed(p.prefill_s, 1) << " s, decode "
     << fixed(p.decode_s, 1) << " s)\n";
  const bool staggered = c.policy.start_steps() > 1;
  if (staggered)
    os << "  staggered    " << c.policy.prefill_batches_per_step << " GPU batch"
       << (c.policy.prefill_batches_per_step == 1 ? "" : "es") << " start per step over " << c.policy.start_steps()
       << " steps\n";
  auto stage = [&](const char* name, const StageTime& st) {
    os << "  " << name;
    for (int t = 0; t < kNumTerms; ++t)
      os << "  " << term_name(t) << " " << fixed(st.terms[t] * 1e3, 2) << (t == st.bound ? "*" : "");
    // Delegated attention overlaps the GPU's work of the other GPU batches (compute_stage).
    if (st.terms[CATT] > 0) os << "  (comp with catt " << fixed(st.compute * 1e3, 2) << ")";
    os << "  (ms per layer; * bounds it)\n";
  };
  // Staggered, the stages are super-steps (cost_model.h, Prediction).
  stage(staggered ? "first step " : "prefill    ", p.prefill);
  stage(staggered ? "steady step" : "decode step", p.decode);
  const TierBytes need = needed(p, c.plan_peak);
  os << "  peak memory ";
  for (Tier t : {Tier::Gpu, Tier::Cpu, Tier::Disk})
    os << (t == Tier::Gpu ? " " : ", ") << tier_name(t) << " " << format_bytes(need.at(t)) << " of "
       << format_bytes(budget.at(t));
  os << "\n";
}

// The tables' "experts" column: the MLP halves' split where the policy places them apart, "=" where
// they follow the weights.
std::string experts_str(const Policy& p) { return p.expert_weights ? split_str(*p.expert_weights) : "="; }

// The tables' "cpuX" column: the phases whose experts the CPU computes (mixtures of experts).
const char* cpu_experts_str(const Policy& p) {
  return p.cpu_experts_prefill || p.cpu_experts_decode ? cpu_experts_name(p) : "-";
}

// The tables' "stag" column: GPU batches starting per super-step, "-" for FlexGen's schedule.
std::string stagger_str(const Policy& p) {
  return p.start_steps() > 1 ? std::to_string(p.prefill_batches_per_step) : "-";
}

// `refill`: each candidate's continuous-batching throughput, a column of its own when given.
void print_table(std::ostream& os, const std::vector<Candidate>& cands, const std::vector<double>& refill = {}) {
  char line[256];
  std::snprintf(line, sizeof line, "  %-2s %5s %4s %6s  %-10s %-10s %-10s %-10s %-4s %-7s %-6s %4s %9s %10s %10s %10s %10s%s\n",
                "#", "gbs", "ngb", "block", "weights", "experts", "kv_cache", "activ.", "cpuA", "cpuX", "quant", "stag", "tok/s",
                "latency_s", "gpu", "cpu", "disk", refill.empty() ? "" : "     refill");
  os << line;
  for (size_t i = 0; i < cands.size(); ++i) {
    const Candidate& c = cands[i];
    const TierBytes need = needed(c.prediction, c.plan_peak);
    std::snprintf(line, sizeof line,
                  "  %-2zu %5d %4d %6d  %-10s %-10s %-10s %-10s %-4s %-7s %-6s %4s %9.3f %10.1f %10s %10s %10s\n", i + 1,
                  c.policy.gpu_batch_size, c.policy.num_gpu_batches, c.policy.block_size(),
                  split_str(c.policy.weights).c_str(), experts_str(c.policy).c_str(), split_str(c.policy.kv_cache).c_str(),
                  split_str(c.policy.activations).c_str(), c.policy.cpu_attention ? "yes" : "no",
                  cpu_experts_str(c.policy), compression_str(c.policy).c_str(), stagger_str(c.policy).c_str(), c.prediction.throughput_tok_s,
                  c.prediction.latency_s, format_bytes(need.gpu).c_str(), format_bytes(need.cpu).c_str(),
                  format_bytes(need.disk).c_str());
    std::string row = line;
    if (i < refill.size()) {
      row.pop_back();  // the newline
      char cell[32];
      std::snprintf(cell, sizeof cell, " %10.3f\n", refill[i]);
      row += cell;
    }
    os << row;
  }
}

struct Args {
  std::string model, hardware, evaluate, out, gpu_mem, cpu_mem, disk_mem, json_file, gen_lens;
  int prompt_len = 512, gen_len = 32, top = 5, pareto_points = 12;
  double max_latency = 0, gen_len_mean = 0;
  bool compress = false, json_out = false, pareto = false;
  std::vector<double> latency_bounds;
};

// The answer lengths continuous batching is predicted for: --gen-lens FILE (observed), or
// --gen-len-mean (a mean, every block reaching --gen-len); none given, none predicted.
std::optional<GenLengths> answer_lengths(const Args& a) {
  if (!a.gen_lens.empty() && a.gen_len_mean > 0) STRATA_FAIL("--gen-lens and --gen-len-mean: give one of them");
  if (a.gen_len_mean > 0) {
    if (a.gen_len_mean > a.gen_len)
      STRATA_FAIL("--gen-len-mean " << a.gen_len_mean << " is longer than --gen-len " << a.gen_len
                                    << " (the longest answer, which the policy is sized for)");
    return GenLengths::assumed(a.gen_len_mean, a.gen_len);
  }
  if (a.gen_lens.empty()) return std::nullopt;
  GenLengths g = GenLengths::from_file(a.gen_lens);
  const int longest = *std::max_element(g.samples.begin(), g.samples.end());
  if (longest > a.gen_len)
    STRATA_FAIL(a.gen_lens << ": an answer of " << longest << " tokens is longer than --gen-len " << a.gen_len
                           << " (the longest answer, which the policy is sized for)");
  return g;
}

json refill_json(const RefillPrediction& r, const GenLengths& g) {
  return {{"answers", g.samples.size()},         {"mean_len", r.mean_len},
          {"block_len", r.block_len},            {"blocks_tok_s", r.blocks_tok_s},
          {"blocks_occupancy", r.blocks_occupancy}, {"refill_tok_s", r.refill_tok_s},
          {"refill_step_s", r.steady_step.total}, {"refill_bound", term_name(r.steady_step.bound)}};
}

void print_refill(std::ostream& os, const RefillPrediction& r, const GenLengths& g, const std::string& source) {
  os << "\ncontinuous batching, answers of " << fixed(r.mean_len, 1) << " tokens on average ("
     << (g.samples.empty() ? "--gen-len-mean" : std::to_string(g.samples.size()) + " answers in " + source)
     << "):\n  blocks  " << fixed(r.blocks_tok_s, 2) << " tok/s  (each block waits for its longest answer, "
     << fixed(r.block_len, 1) << " tokens expected: slots live in " << fixed(100 * r.blocks_occupancy, 0)
     << "% of its decode steps)\n  refill  " << fixed(r.refill_tok_s, 2) << " tok/s  ("
     << fixed(r.refill_tok_s / r.blocks_tok_s, 2) << "x; a finished slot takes the next request: each step "
     << fixed(1e3 * r.steady_step.total, 3) << " ms per layer, bound by " << term_name(r.steady_step.bound) << ")\n";
}

void write_json_file(const std::string& path, const json& j) {
  std::ofstream f(path);
  f << j.dump(1) << "\n";
  if (!f) STRATA_FAIL("--json-file: cannot write " << path);
}

std::string command_line(const Args& a) {
  std::ostringstream os;
  os << "strata policy --model " << a.model << " --hardware " << a.hardware << " --prompt-len " << a.prompt_len
     << " --gen-len " << a.gen_len << (a.compress ? " --compress" : "");
  for (auto [flag, v] : {std::pair{" --gpu-mem ", &a.gpu_mem}, {" --cpu-mem ", &a.cpu_mem}, {" --disk-mem ", &a.disk_mem}})
    if (!v->empty()) os << flag << *v;
  return os.str();
}

// The frontier rows' figures (policy_json for the policy itself).
json frontier_json(const Candidate& c) {
  return {{"latency_s", c.prediction.latency_s},
          {"throughput_tok_s", c.prediction.throughput_tok_s},
          {"prefill_s", c.prediction.prefill_s},
          {"decode_s", c.prediction.decode_s},
          {"block_size", c.policy.block_size()},
          {"peak_bytes", tiers_json(needed(c.prediction, c.plan_peak))},
          {"policy", policy_json(c.policy)}};
}

// `strata policy --pareto`: the best policy under each of a sweep of latency bounds (FlexGen's
// Figure 1), from one search's candidates (search.h, pareto_points).
void run_pareto(const Args& a, const ModelConfig& cfg, const HardwareProfile& hw, const SearchOptions& opts) {
  const auto start = std::chrono::steady_clock::now();
  int lps = 0;
  const std::vector<Candidate> cands = search_candidates(cfg, hw, opts, &lps);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::vector<double> bounds = a.latency_bounds;
  if (bounds.empty()) bounds = latency_sweep(cands, a.pareto_points);
  std::sort(bounds.begin(), bounds.end());
  const std::vector<ParetoPoint> points = pareto_points(cands, bounds);
  const std::vector<Candidate> frontier = pareto_frontier(cands);

  json j = {{"model", cfg.name},
            {"hardware", hw.name},
            {"command", command_line(a) + " --pareto"},
            {"workload", {{"prompt_len", a.prompt_len}, {"gen_len", a.gen_len}}},
            {"budget_bytes", tiers_json(opts.budget)},
            {"compress", a.compress},
            {"search", {{"lps_solved", lps}, {"seconds", seconds}, {"candidates", cands.size()}}}};
  json rows = json::array();
  for (const ParetoPoint& pt : points) {
    json row = pt.best ? frontier_json(*pt.best) : json{{"policy", nullptr}};
    row["max_latency_s"] = pt.max_latency_s;
    rows.push_back(row);
  }
  j["points"] = rows;
  json fr = json::array();
  for (const Candidate& c : frontier) fr.push_back(frontier_json(c));
  j["frontier"] = fr;
  if (!a.json_file.empty()) write_json_file(a.json_file, j);
  if (a.json_out) {
    std::cout << j.dump() << "\n";
    return;
  }

  std::ostream& os = std::cout;
  os << "strata policy --pareto: " << cfg.name << " on " << (hw.name.empty() ? a.hardware : hw.name) << ", prompt "
     << a.prompt_len << ", generation " << a.gen_len << "  (" << cands.size() << " candidates, " << lps << " LPs in "
     << fixed(seconds, 3) << " s)\nbudgets: gpu " << format_bytes(opts.budget.gpu) << ", cpu "
     << format_bytes(opts.budget.cpu) << ", disk " << format_bytes(opts.budget.disk)
     << "\n\nthe best policy within each latency bound (latency: the time of one block):\n";
  char line[256];
  std::snprintf(line, sizeof line, "  %10s %10s %9s %5s %4s %6s  %-10s %-10s %-10s %-10s %-4s %-7s %-6s %4s\n", "bound_s",
                "latency_s", "tok/s", "gbs", "ngb", "block", "weights", "experts", "kv_cache", "activ.", "cpuA", "cpuX",
                "quant", "stag");
  os << line;
  for (const ParetoPoint& pt : points) {
    if (!pt.best) {
      std::snprintf(line, sizeof line, "  %10.3g %10s  none fits this bound\n", pt.max_latency_s, "-");
      os << line;
      continue;
    }
    const Candidate& c = *pt.best;
    std::snprintf(line, sizeof line, "  %10.3g %10.3g %9.3f %5d %4d %6d  %-10s %-10s %-10s %-10s %-4s %-7s %-6s %4s\n",
                  pt.max_latency_s, c.prediction.latency_s, c.prediction.throughput_tok_s, c.policy.gpu_batch_size,
                  c.policy.num_gpu_batches, c.policy.block_size(), split_str(c.policy.weights).c_str(),
                  experts_str(c.policy).c_str(), split_str(c.policy.kv_cache).c_str(), split_str(c.policy.activations).c_str(),
                  c.policy.cpu_attention ? "yes" : "no", cpu_experts_str(c.policy), compression_str(c.policy).c_str(),
                  stagger_str(c.policy).c_str());
    os << line;
  }
  os << "\nfrontier: " << frontier.size() << " policies that no other beats in both latency and throughput"
     << (a.json_file.empty() ? " (--json-file FILE lists them)" : "") << "\n";
  if (!a.json_file.empty()) os << "wrote " << a.json_file << "\n";
}

void run(const Args& a, bool latency_given) {
  const ModelConfig cfg = resolve_model(a.model);
  const HardwareProfile hw = load_hardware_profile(a.hardware);
  SearchOptions opts;
  opts.workload = {a.prompt_len, a.gen_len};
  opts.budget = {hw.gpu_mem, hw.cpu_mem, hw.disk_mem};
  if (!a.gpu_mem.empty()) opts.budget.gpu = double(parse_size(a.gpu_mem, "--gpu-mem"));
  if (!a.cpu_mem.empty()) opts.budget.cpu = double(parse_size(a.cpu_mem, "--cpu-mem"));
  if (!a.disk_mem.empty()) opts.budget.disk = double(parse_size(a.disk_mem, "--disk-mem"));
  opts.allow_compression = a.compress;
  if (a.compress) opts.kept_codes = kept_codes_of(a.model);
  if (latency_given) opts.max_latency_s = a.max_latency;
  opts.keep = a.top;
  if (a.pareto) {
    if (!a.evaluate.empty() || !a.out.empty() || latency_given)
      STRATA_FAIL("--pareto sweeps latency bounds itself: it takes neither --evaluate, --out nor --max-latency");
    for (double b : a.latency_bounds)
      if (!(b > 0)) STRATA_FAIL("--latency-bounds: bounds are positive seconds, got " << b);
    run_pareto(a, cfg, hw, opts);
    return;
  }
  if (!a.latency_bounds.empty()) STRATA_FAIL("--latency-bounds goes with --pareto");

  const std::optional<GenLengths> lengths = answer_lengths(a);
  // With answer lengths the search's candidates are ranked by continuous batching's steady state:
  // a wider pool of them, since the LP ranks by blocks of --gen-len.
  if (lengths) opts.keep = std::max(a.top, 20);
  std::vector<Candidate> cands;
  std::optional<SearchResult> searched;
  if (!a.evaluate.empty()) {
    Candidate c;
    c.policy = load_policy(a.evaluate);
    c.prediction = evaluate(cfg, c.policy, opts.workload, hw);
    c.plan_peak = plan_placement(cfg, c.policy, PlanShape{a.prompt_len, a.gen_len}, DType::F16).peak();
    cands.push_back(c);
  } else {
    searched = search_policy(cfg, hw, opts);
    cands = searched->ranked;
  }
  std::vector<double> refill_tok_s;
  std::optional<RefillPrediction> refill;  // the chosen policy's
  if (lengths) {
    std::vector<std::pair<RefillPrediction, Candidate>> ranked;
    for (const Candidate& c : cands) ranked.emplace_back(predict_refill(cfg, c.policy, a.prompt_len, *lengths, hw), c);
    std::stable_sort(ranked.begin(), ranked.end(),
                     [](const auto& x, const auto& y) { return x.first.refill_tok_s > y.first.refill_tok_s; });
    if (ranked.size() > size_t(a.top)) ranked.resize(size_t(a.top));
    refill = ranked.front().first;
    cands.clear();
    for (auto& [r, c] : ranked) refill_tok_s.push_back(r.refill_tok_s), cands.push_back(std::move(c));
  }
  const Candidate& best = cands.front();
  Prediction need_pred = best.prediction;
  need_pred.peak = needed(best.prediction, best.plan_peak);
  const bool ok = fits(need_pred, opts.budget, opts.max_latency_s);

  if (!a.out.empty()) {
    std::ofstream f(a.out);
    if (!f) STRATA_FAIL("--out: cannot write " << a.out);
    f << "# strata policy --model " << a.model << " --hardware " << a.hardware << " --prompt-len " << a.prompt_len
      << " --gen-len " << a.gen_len << (a.compress ? " --compress" : "") << "\n# predicted "
      << fixed(best.prediction.throughput_tok_s, 3) << " tok/s, latency " << fixed(best.prediction.latency_s, 1)
      << " s\n"
      << policy_to_yaml(best.policy);
    if (!f) STRATA_FAIL("--out: cannot write " << a.out);
  }

  if (a.json_out) {
    json j = {{"model", cfg.name},
              {"hardware", hw.name},
              {"hardware_calibrated", hw.calibrated.empty() ? json(false) : json(hw.calibrated)},
              {"workload", {{"prompt_len", a.prompt_len}, {"gen_len", a.gen_len}}},
              {"budget_bytes", tiers_json(opts.budget)},
              {"max_latency_s", opts.max_latency_s ? json(*opts.max_latency_s) : json(nullptr)},
              {"policy", policy_json(best.policy)},
              {"predicted", prediction_json(best)},
              {"fits", ok}};
    if (refill) j["continuous_batching"] = refill_json(*refill, *lengths);
    if (searched) {
      json list = json::array();
      for (size_t i = 0; i < cands.size(); ++i) {
        const Candidate& c = cands[i];
        list.push_back({{"policy", policy_json(c.policy)},
                        {"throughput_tok_s", c.prediction.throughput_tok_s},
                        {"latency_s", c.prediction.latency_s},
                        {"peak_bytes", tiers_json(needed(c.prediction, c.plan_peak))},
                        {"lp_throughput_tok_s", c.lp_throughput_tok_s}});
        if (i < refill_tok_s.size()) list.back()["refill_tok_s"] = refill_tok_s[i];
      }
      j["candidates"] = list;
      j["search"] = {{"lps_solved", searched->lps_solved}, {"seconds", searched->seconds}};
    }
    if (!a.json_file.empty()) write_json_file(a.json_file, j);
    std::cout << j.dump() << "\n";
    return;
  }

  std::ostream& os = std::cout;
  os << "strata policy: " << cfg.name << " on " << (hw.name.empty() ? a.hardware : hw.name) << ", prompt "
     << a.prompt_len << ", generation " << a.gen_len;
  if (searched)
    os << "  (" << searched->lps_solved << " LPs in " << fixed(searched->seconds, 3) << " s)";
  os << "\nbudgets: gpu " << format_bytes(opts.budget.gpu) << ", cpu " << format_bytes(opts.budget.cpu) << ", disk "
     << format_bytes(opts.budget.disk);
  if (opts.max_latency_s) os << ", latency " << *opts.max_latency_s << " s";
  if (hw.calibrated.empty())
    os << "\nnote: hardware profile " << (hw.name.empty() ? a.hardware : hw.name)
       << " is not calibrated (bare rates only): its predictions run optimistic; `strata profile` without "
          "--quick fits it on the engine";
  os << "\n\n" << (searched ? "chosen policy" : "policy " + a.evaluate) << ":\n";
  std::istringstream yaml(policy_to_yaml(best.policy));
  for (std::string line; std::getline(yaml, line);) os << "  " << line << "\n";
  print_prediction(os, best, opts.budget);
  if (refill) print_refill(os, *refill, *lengths, a.gen_lens);
  if (!searched) os << (ok ? "fits the budgets\n" : "DOES NOT FIT the budgets\n");
  if (searched) {
    os << "\nbest candidates"
       << (lengths ? " (ranked by refill: continuous batching's tok/s for these answer lengths; tok/s is blocks of "
                     "--gen-len)"
                   : "")
       << ":\n";
    print_table(os, cands, refill_tok_s);
  }
  if (!a.out.empty()) os << "\nwrote " << a.out << "\n";
}

}  // namespace

void add_policy_command(CLI::App& app) {
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("policy", "search the placement policy with the cost model (a dry run)");
  cmd->add_option("--model", a->model, "preset (opt-6.7b, ...), model directory, or .gguf file")->required();
  cmd->add_option("--hardware", a->hardware, "hardware profile YAML (strata profile, or policies/hardware/)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--prompt-len", a->prompt_len, "prompt tokens per sequence")->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--gen-len", a->gen_len, "generated tokens per sequence")->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--gen-lens", a->gen_lens,
                  "answer lengths (one integer per line, or strata run's output JSONL): also predict continuous "
                  "batching against blocks for them")
      ->check(CLI::ExistingFile);
  cmd->add_option("--gen-len-mean", a->gen_len_mean,
                  "the mean answer length, every block reaching --gen-len: also predict continuous batching")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--gpu-mem", a->gpu_mem, "GPU budget (default: the profile's gpu_mem), e.g. 15GB");
  cmd->add_option("--cpu-mem", a->cpu_mem, "CPU budget (default: the profile's cpu_mem)");
  cmd->add_option("--disk-mem", a->disk_mem, "disk budget (default: the profile's disk_mem)");
  cmd->add_flag("--compress", a->compress,
                "also consider 4-bit weights and KV cache, and the weights' own codes (GPTQ/AWQ, GGUF, MXFP4)");
  auto* lat = cmd->add_option("--max-latency", a->max_latency, "bound on the time of one block, seconds")
                  ->check(CLI::PositiveNumber);
  cmd->add_flag("--json", a->json_out, "print one JSON object");
  cmd->add_option("--json-file", a->json_file, "with --json or --pareto: also write the JSON object to this file");
  cmd->add_flag("--pareto", a->pareto,
                "the latency-throughput frontier: the best policy within each of a sweep of latency bounds");
  cmd->add_option("--latency-bounds", a->latency_bounds, "with --pareto: these bounds (seconds, e.g. 10,30,100)")
      ->delimiter(',');
  cmd->add_option("--pareto-points", a->pareto_points,
                  "with --pareto: bounds log-spaced from the fastest candidate's latency to the best one's")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--out", a->out, "write the chosen policy as YAML");
  cmd->add_option("--evaluate", a->evaluate, "predict for this policy file instead of searching")
      ->check(CLI::ExistingFile);
  cmd->add_option("--top", a->top, "candidates to list")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->callback([a, lat] { run(*a, lat->count() > 0); });
}

}  // namespace strata::cli
