// Generation benchmark in the units of the limit (docs/design.md, Habits):
//  - decode: achieved GB/s of weight reads per decode step against the device's measured copy
//    bandwidth (every step reads every weight once, so weight bytes / step time is the rate);
//  - prefill: the share of an N-token prefill spent in the GEMMs, from timing the same GEMM
//    shapes alone, and the GEMMs' achieved TFLOP/s;
//  - on CUDA, the launches a decode step issues (kernels and cuBLAS calls; a graph replay is one).
//  - with --temperature (and --top-p, --top-k), every sequence samples: the decode step then
//    includes StepSampler's sampling, which greedy decoding skips: on a GPU each row's candidates
//    (docs/cuda-backend.md, "Sampling on the device") and, for rows they cannot decide, the
//    logits' copy and the host's draws. Dummy weights give flat rows whose top-p 0.95 nucleus runs
//    past the candidates; top-k 50 stays within them.
// Usage: bench_generate [--model dummy:opt-6.7b] [--device cuda] [--batch 1] [--prompt-len 32]
//                       [--gen-len 32] [--prefill-tokens 4096] [--dtype fp16|bf16|auto]
//                       [--temperature 0] [--top-p 1] [--top-k 0]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "strata/backend/blas_core.h"
#include "strata/backend/backend.h"
#include "strata/model/model_loader.h"
#include "strata/model/weight_specs.h"
#include "strata/runtime/generator.h"

#include "bench_common.h"

using namespace strata;
using bench::Clock;
using bench::measure_copy_gbps;
using bench::seconds;

namespace {

struct Args {
  std::string model = "dummy:opt-6.7b", device = "auto", dtype = "fp16";  // --dtype fp16|bf16|auto
  int batch = 1, prompt_len = 32, gen_len = 32, prefill_tokens = 4096, threads = 0;
  float temperature = 0.0f, top_p = 1.0f;  // 0: greedy
  int top_k = 0;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--model") a.model = v;
    else if (k == "--device") a.device = v;
    else if (k == "--dtype") a.dtype = v;
    else if (k == "--batch") a.batch = std::stoi(v);
    else if (k == "--prompt-len") a.prompt_len = std::stoi(v);
    else if (k == "--gen-len") a.gen_len = std::stoi(v);
    else if (k == "--prefill-tokens") a.prefill_tokens = std::stoi(v);
    else if (k == "--threads") a.threads = std::stoi(v);
    else if (k == "--temperature") a.temperature = std::stof(v);
    else if (k == "--top-p") a.top_p = std::stof(v);
    else if (k == "--top-k") a.top_k = std::stoi(v);
    else { std::fprintf(stderr, "unknown option %s\n", k.c_str()); std::exit(2); }
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) try {
  strata::use_best_blas_core(argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines reach a pipe (tee, a log) as they are printed
  const Args args = parse(argc, argv);
  ModelBundle mb = open_model(args.model);
  std::unique_ptr<Backend> be =
      make_backend(args.device, args.threads, gpu_activation_dtype(args.dtype, mb.config.checkpoint_dtype));
  const ModelConfig cfg = mb.config;
  const double copy_gbps = measure_copy_gbps(*be);
  Transformer model(cfg, load_model_weights(cfg, *mb.weights, *be), *be);
  const double weight_bytes = double(cfg.param_count()) * double(dtype_size(be->activation_dtype()));
  std::printf("model %s on %s: %.3f B parameters, %.2f GB of weights\n", cfg.name.c_str(), be->name(),
              double(cfg.param_count()) / 1e9, weight_bytes / 1e9);
  std::printf("device copy bandwidth (read + write): %.1f GB/s\n", copy_gbps);

  // Decode: batch of identical-length prompts, fixed number of new tokens.
  std::vector<GenRequest> reqs(size_t(args.batch));
  for (int b = 0; b < args.batch; ++b) {
    for (int i = 0; i < args.prompt_len; ++i) reqs[size_t(b)].prompt.push_back(int32_t((b * 131 + i * 17) % cfg.vocab_size));
    reqs[size_t(b)].sampling.max_new_tokens = args.gen_len;
    reqs[size_t(b)].sampling.ignore_eos = true;
    reqs[size_t(b)].sampling.temperature = args.temperature;
    reqs[size_t(b)].sampling.top_p = args.top_p;
    reqs[size_t(b)].sampling.top_k = args.top_k;
    reqs[size_t(b)].sampling.seed = uint64_t(b);
  }
  generate(model, reqs);  // warm-up
  GenStats st;
  const int64_t launches_before = device_launches_issued();
  generate(model, reqs, {}, &st);
  const int64_t launches = device_launches_issued() - launches_before;
  const double step_s = st.decode_seconds / double(st.decode_steps);
  const double decode_gbps = weight_bytes / step_s / 1e9;
  std::printf("decode%s: batch %d, %lld steps, %.3f ms/step, %.1f tok/s, weights read at %.1f GB/s = %.1f%% of copy bandwidth\n",
              args.temperature > 0 ? " (sampled)" : "", args.batch, (long long)st.decode_steps, step_s * 1e3, double(args.batch) / step_s, decode_gbps,
              100.0 * decode_gbps / copy_gbps);
  if (be->device() == Device::CUDA && st.decode_steps > 0) {
    // Launches of the decode steps alone: the run above less the same prompts to their first
    // token (the prefill and its sampling, no decode step).
    std::vector<GenRequest> first = reqs;
    for (GenRequest& r : first) r.sampling.max_new_tokens = 1;
    GenStats first_st;
    const int64_t first_before = device_launches_issued();
    generate(model, first, {}, &first_st);
    const int64_t first_launches = device_launches_issued() - first_before;
    const int64_t steps = st.decode_steps - first_st.decode_steps;
    if (steps > 0)
      std::printf("launches: %.1f per decode step (%lld over %lld steps, graph replays counting one)\n",
                  double(launches - first_launches) / double(steps), (long long)(launches - first_launches),
                  (long long)steps);
  }

  // Prefill of `prefill_tokens` tokens in one step, then the same GEMMs alone.
  const int64_t T = args.prefill_tokens;
  const int64_t seq = std::min<int64_t>(T, cfg.max_positions - 1), nseq = (T + seq - 1) / seq;
  KvCache cache = make_kv_cache(cfg, *be, int(nseq), int(seq));
  StepBatch step;
  for (int64_t t = 0; t < T; ++t) {
    step.tokens.push_back(int32_t((t * 7919) % cfg.vocab_size));
    step.positions.push_back(int32_t(t % seq));
    step.slots.push_back(int32_t(t / seq));
  }
  step.logit_rows = {int32_t(T - 1)};
  model.forward(step, cache);
  be->synchronize();
  auto t0 = Clock::now();
  const int reps = 3;
  for (int r = 0; r < reps; ++r) model.forward(step, cache);
  be->synchronize();
  const double prefill_s = seconds(t0, Clock::now()) / reps;

  double gemm_flops = 0;
  {
    const DType dt = be->activation_dtype();
    const std::vector<WeightSpec> specs = layer_weight_specs(cfg, 0);
    int64_t widest = 0;
    for (const WeightSpec& s : specs)
      if (s.shape.size() == 2) widest = std::max({widest, s.shape[0], s.shape[1]});
    Buffer xbuf = be->alloc(size_t(T * widest) * dtype_size(dt)), ybuf = be->alloc(size_t(T * widest) * dtype_size(dt));
    std::vector<Buffer> wbufs;
    std::vector<std::pair<int64_t, int64_t>> shapes;  // [out, in] of each projection
    for (const WeightSpec& s : specs)
      if (s.shape.size() == 2) {
        shapes.emplace_back(s.shape[0], s.shape[1]);
        wbufs.push_back(be->alloc(size_t(s.numel()) * dtype_size(dt)));
      }
    auto run_gemms = [&] {
      for (int l = 0; l < cfg.n_layers; ++l)
        for (size_t i = 0; i < shapes.size(); ++i) {
          const auto [out, in] = shapes[i];
          be->linear(xbuf.view(0, dt, {T, in}), wbufs[i].view(0, dt, {out, in}), Tensor(), ybuf.view(0, dt, {T, out}));
        }
    };
    run_gemms();
    be->synchronize();
    t0 = Clock::now();
    for (int r = 0; r < reps; ++r) run_gemms();
    be->synchronize();
    const double gemm_s = seconds(t0, Clock::now()) / reps;
    for (const auto& [out, in] : shapes) gemm_flops += 2.0 * double(T) * double(out) * double(in) * cfg.n_layers;
    std::printf("prefill: %lld tokens in %.1f ms (%.0f tok/s); the same GEMMs alone take %.1f ms = %.1f%% of prefill, "
                "at %.1f TFLOP/s\n",
                (long long)T, prefill_s * 1e3, double(T) / prefill_s, gemm_s * 1e3, 100.0 * gemm_s / prefill_s,
                gemm_flops / gemm_s / 1e12);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_generate: %s\n", e.what());
  return 1;
}
