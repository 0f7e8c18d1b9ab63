// Pieces of the benchmarks that run a model through the offloading engine (bench_offload,
// bench_quant): their common options, the requests, and a measured generate() after a warm-up.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "strata/offload/engine.h"

namespace strata::bench {

// Defaults are bench_offload's; a benchmark changes them before parse_engine_args.
struct EngineArgs {
  std::string model = "dummy:opt-1.3b", device = "auto", offload_dir;
  int batch = 1, gen_len = 16, prompt_len = 32, threads = 0;
  bool skip_disk = false;
};

// Reads EngineArgs's options, and the switches in `more_switches` (no value), into `a`; prints the
// problem and exits with 2 on an unknown option or a missing value.
inline void parse_engine_args(int argc, char** argv, EngineArgs& a,
                              std::initializer_list<std::pair<const char*, bool*>> more_switches = {}) {
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--skip-disk") { a.skip_disk = true; continue; }
    bool is_switch = false;
    for (const auto& [name, on] : more_switches)
      if (k == name) *on = is_switch = true;
    if (is_switch) continue;
    if (i + 1 >= argc) { std::fprintf(stderr, "%s needs a value\n", k.c_str()); std::exit(2); }
    const std::string v = argv[++i];
    if (k == "--model") a.model = v;
    else if (k == "--device") a.device = v;
    else if (k == "--batch") a.batch = std::stoi(v);
    else if (k == "--gen-len") a.gen_len = std::stoi(v);
    else if (k == "--prompt-len") a.prompt_len = std::stoi(v);
    else if (k == "--threads") a.threads = std::stoi(v);
    else if (k == "--offload-dir") a.offload_dir = v;
    else { std::fprintf(stderr, "unknown option %s\n", k.c_str()); std::exit(2); }
  }
}

// One GPU batch of a.batch sequences, the weights split as given, the rest on the GPU.
inline OffloadOptions engine_options(const EngineArgs& a, TierSplit weights) {
  OffloadOptions o;
  o.policy.gpu_batch_size = a.batch;
  o.policy.num_gpu_batches = 1;
  o.policy.weights = weights;
  o.offload_dir = a.offload_dir;
  return o;
}

// a.batch prompts of a.prompt_len made-up tokens, each generating exactly a.gen_len tokens.
inline std::vector<GenRequest> engine_requests(const EngineArgs& a) {
  std::vector<GenRequest> reqs(size_t(a.batch));
  for (size_t i = 0; i < reqs.size(); ++i) {
    for (int t = 0; t < a.prompt_len; ++t) reqs[i].prompt.push_back(int32_t((7 * t + int(i)) % 1000 + 3));
    reqs[i].sampling.max_new_tokens = a.gen_len;
    reqs[i].sampling.ignore_eos = true;
  }
  return reqs;
}

// The engine's report before and after one generate() of `reqs`, and its stats.
struct MeasuredPass {
  OffloadReport before, after;
  GenStats stats;
};

// Runs `reqs` once to warm up (first touch of every buffer), then once measured.
inline MeasuredPass measured_pass(OffloadEngine& engine, const std::vector<GenRequest>& reqs) {
  engine.generate(reqs);
  MeasuredPass m;
  m.before = engine.report();
  engine.generate(reqs, &m.stats);
  m.after = engine.report();
  return m;
}

}  // namespace strata::bench
