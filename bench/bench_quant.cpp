// Compression benchmark (issue 9, point 7), in the units of the limit:
//  1. kernels on the device backend, 4-bit group 64 over an [f, h] and an [h, f] weight:
//     - dequantize_rows: bytes read (codes) + written (fp output) per second, against the device's
//       copy bandwidth (read + write);
//     - the quantized linear at T tokens: code bytes read per second against the copy
//       bandwidth, and its time against the uncompressed linear of the same shape, alone and after
//       dequantizing the matrix (the engine's path beyond the fused limit); a mixture of experts'
//       expert matrices;
//     - quantization at load on the host (fp16 rows to codes, one thread);
//  2. the decode step of a model through the offloading engine with its weights on the CPU tier
//     and on disk, compressed (4-bit g64) and not: step time and bytes per step on each link.
//  1b. with --beside-sgemm: the linear over codes of the first matrix on the CPU, alone and beside
//     another thread's sgemm loop (the CPU lane's experts beside the CPU backend's compute).
//  1c. with --cold: the linear over codes of both matrices on the CPU, over one matrix every call
//     (its codes stay cached) and over copies taken in turn, 1 GiB in all (read from memory, as the
//     engine reads the CPU tier's weights and as strata profile times them).
//  1d. with --grouped, for a mixture of experts: a step's active experts on the device backend at
//     1 to 256 tokens (decode batches and a prefill's), one linear() each against one
//     Backend::linears() per matrix kind (on the CPU: the engine's experts computed there; on a
//     GPU: the grouped launches of the fused linear), 4-bit codes and the activation dtype; on a
//     GPU, at up to 16 tokens, also routed on the device (the routing and the routed launches).
//  1e. with --streamed: a linear over fp32, fp16 and bf16 weights on the CPU at 1 to 8 tokens
//     (each weight row streamed against every token) and at 16, weights read from memory.
// Usage: bench_quant [--model dummy:opt-1.3b] [--device auto] [--batch 8] [--gen-len 8]
//                    [--prompt-len 32] [--offload-dir DIR] [--skip-disk] [--skip-engine]
//                    [--beside-sgemm] [--cold] [--grouped] [--streamed]
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "bench_common.h"
#include "bench_engine.h"
#include "strata/backend/blas_core.h"
#include "strata/backend/backend.h"
#include "strata/core/dtype.h"
#include "strata/core/size.h"
#include "strata/model/model_loader.h"
#include "strata/offload/engine.h"
#include "strata/profile/profiler.h"
#include "strata/quant/quant.h"

using namespace strata;
using bench::Clock;
using bench::seconds;

namespace {

struct Args : bench::EngineArgs {
  bool skip_engine = false;
  bool beside_sgemm = false;
  bool cold = false;
  bool grouped = false;
  bool streamed = false;
};

Args parse(int argc, char** argv) {
  Args a;
  a.batch = 8;
  a.gen_len = 8;
  bench::parse_engine_args(argc, argv, a, {{"--skip-engine", &a.skip_engine}, {"--beside-sgemm", &a.beside_sgemm}, {"--cold", &a.cold}, {"--grouped", &a.grouped}, {"--streamed", &a.streamed}});
  return a;
}

// Seconds per call of `op`, the mean over enough calls to take ~0.5 s (after one warm-up call).
template <class F>
double time_per_call(Backend& be, F op) {
  op();
  be.synchronize();
  int reps = 0;
  const auto t0 = Clock::now();
  do {
    op();
    be.synchronize();
    ++reps;
  } while (seconds(t0, Clock::now()) < 0.5);
  return seconds(t0, Clock::now()) / reps;
}

// n values drawn from N(0, 0.05^2): a weight's or an activation's scale.
std::vector<float> normal_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  std::vector<float> values(n);
  for (float& x : values) x = dist(rng);
  return values;
}

void fill(Backend& be, const Tensor& t, uint32_t seed) {
  const std::vector<float> host = normal_values(size_t(t.numel()), seed);
  std::vector<uint8_t> conv(t.nbytes());
  convert_elements(host.data(), DType::F32, conv.data(), t.dtype, host.size());
  be.copy_to_device(t.data, conv.data(), conv.size());
}

// Quantization at load for one weight shape [out, in], on the host: what read_block
// (model_weights.cpp) does with a tensor of an fp16 checkpoint, one thread: widen to fp32, then
// quant::quantize_rows.
void load_quantization(int64_t out, int64_t in) {
  const quant::QuantSpec spec{4, 64};
  const size_t n = size_t(out * in);
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  std::vector<uint16_t> fp16(n);
  for (uint16_t& h : fp16) h = float_to_half(dist(rng));
  std::vector<float> fp32(n);
  std::vector<uint8_t> codes(size_t(out) * quant::row_bytes(spec, in));
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    convert_elements(fp16.data(), DType::F16, fp32.data(), DType::F32, n);
    quant::quantize_rows(spec, fp32.data(), DType::F32, out, in, codes.data());
    best = std::min(best, seconds(t0, Clock::now()));
  }
  std::printf("[%lld x %lld] quantize at load (host, one thread, from fp16): %.1f ms, %.0f M elements/s\n",
              (long long)out, (long long)in, 1e3 * best, double(n) / best / 1e6);
}

// Part 1 for one weight shape [out, in].
void kernels(Backend& be, int64_t out, int64_t in, double copy_gbps) {
  const quant::QuantSpec spec{4, 64};
  const DType dt = be.activation_dtype();
  const size_t es = dtype_size(dt), code_bytes = size_t(out) * quant::row_bytes(spec, in);
  Buffer wb = be.alloc(size_t(out * in) * es), qb = be.alloc(code_bytes);
  const Tensor w = wb.view(0, dt, {out, in});
  fill(be, w, 1);
  be.quantize_rows(spec, w, qb.data());
  const Tensor wq = Tensor::quantized(qb.data(), DType::Q4, spec.group_size, be.device(), {out, in});

  const double deq_s = time_per_call(be, [&] { be.dequantize_rows(spec, qb.data(), w); });
  const double deq_gbps = double(code_bytes + w.nbytes()) / deq_s / 1e9;
  std::printf("[%lld x %lld] dequantize: %.3f ms, %.1f GB/s read + written = %.0f%% of copy bandwidth\n",
              (long long)out, (long long)in, 1e3 * deq_s, deq_gbps, 100 * deq_gbps / copy_gbps);

  const int64_t max_t = be.fused_dequant_max_tokens();
  std::vector<int64_t> tokens{1};
  // 8: where the fused kernel's lead ends on a GPU; 24 to 64: a caller's linear over codes beyond
  // the engine's limit (experts computed on the CPU), which the CPU backend dequantizes in blocks
  // beyond 24 tokens (cpu_backend.cpp).
  for (int64_t T : {int64_t(4), int64_t(8), max_t, int64_t(24), int64_t(32), int64_t(64)})
    if (T > tokens.back()) tokens.push_back(T);
  for (int64_t T : tokens) {
    Buffer xb = be.alloc(size_t(T * in) * es), yb = be.alloc(size_t(T * out) * es);
    const Tensor x = xb.view(0, dt, {T, in}), y = yb.view(0, dt, {T, out});
    fill(be, x, 2);
    const double fused_s = time_per_call(be, [&] { be.linear(x, wq, Tensor(), y); });
    const double fp_s = time_per_call(be, [&] { be.linear(x, w, Tensor(), y); });
    // What the runtime does instead above fused_dequant_max_tokens() (engine_steps.cpp).
    const double deq_fp_s = deq_s + fp_s;
    const double gbps = double(code_bytes) / fused_s / 1e9;
    std::printf("  linear over codes T=%-3lld %.3f ms: codes at %.1f GB/s = %.0f%% of copy bandwidth; %s linear %.3f ms "
                "(%.2fx), dequantize + %s linear %.3f ms (%.2fx)\n",
                (long long)T, 1e3 * fused_s, gbps, 100 * gbps / copy_gbps, dtype_name(dt), 1e3 * fp_s, fp_s / fused_s,
                dtype_name(dt), 1e3 * deq_fp_s, deq_fp_s / fused_s);
  }
}

// The linear over codes of one [out, in] matrix at a few token counts, alone and while another
// thread runs a 256-token GEMM over an [h, h] matrix on a second CPU backend without pause: what
// the CPU lane's experts meet where the CPU backend stands in for the GPU (mean of ~1 s of calls).
void beside_sgemm(int64_t out, int64_t in, int64_t h) {
  const quant::QuantSpec spec{4, 64};
  auto be = make_cpu_backend(0), other = make_cpu_backend(0);
  Buffer wb = be->alloc(size_t(out * in) * 4), qb = be->alloc(size_t(out) * quant::row_bytes(spec, in));
  fill(*be, wb.view(0, DType::F32, {out, in}), 1);
  be->quantize_rows(spec, wb.view(0, DType::F32, {out, in}), qb.data());
  const Tensor wq = Tensor::quantized(qb.data(), DType::Q4, spec.group_size, Device::CPU, {out, in});
  const int64_t gT = 256;
  Buffer gx = other->alloc(size_t(gT * h) * 4), gw = other->alloc(size_t(h * h) * 4), gy = other->alloc(size_t(gT * h) * 4);
  fill(*other, gx.view(0, DType::F32, {gT, h}), 2);
  fill(*other, gw.view(0, DType::F32, {h, h}), 3);
  for (bool busy : {false, true}) {
    std::atomic<bool> stop{false};
    std::thread lane;
    if (busy)
      lane = std::thread([&] {
        while (!stop) other->linear(gx.view(0, DType::F32, {gT, h}), gw.view(0, DType::F32, {h, h}), Tensor(),
                                    gy.view(0, DType::F32, {gT, h}));
      });
    for (int64_t T : {16, 24, 32, 48}) {
      Buffer xb = be->alloc(size_t(T * in) * 4), yb = be->alloc(size_t(T * out) * 4);
      fill(*be, xb.view(0, DType::F32, {T, in}), 4);
      int calls = 0;
      const auto t0 = Clock::now();
      while (seconds(t0, Clock::now()) < 1.0 || calls < 3) {
        be->linear(xb.view(0, DType::F32, {T, in}), wq, Tensor(), yb.view(0, DType::F32, {T, out}));
        ++calls;
      }
      std::printf("  [%lld x %lld] linear over codes T=%-3lld %s: %.3f ms a call\n", (long long)out, (long long)in,
                  (long long)T, busy ? "beside another thread's sgemm" : "alone                        ",
                  1e3 * seconds(t0, Clock::now()) / calls);
    }
    stop = true;
    if (lane.joinable()) lane.join();
  }
}

// The linear over codes of one [out, in] matrix on the CPU at a few token counts: over the same
// matrix every call, whose codes stay in the caches, and over copies of it in turn, 1 GiB in all
// (cold_weight_copies, as strata profile's CPU linear curves): each call reads its codes from memory,
// as the engine reads the CPU tier's weights once a step.
void cached_and_cold(int64_t out, int64_t in) {
  const quant::QuantSpec spec{4, 64};
  auto be = make_cpu_backend(0);
  const size_t bytes = size_t(out) * quant::row_bytes(spec, in);
  const size_t copies = cold_weight_copies(bytes, size_t(1) << 30, be->available_memory());
  Buffer wb = be->alloc(size_t(out * in) * 4), qb = be->alloc(copies * bytes);
  fill(*be, wb.view(0, DType::F32, {out, in}), 1);
  be->quantize_rows(spec, wb.view(0, DType::F32, {out, in}), qb.data());
  for (size_t c = 1; c < copies; ++c) std::memcpy(static_cast<char*>(qb.data()) + c * bytes, qb.data(), bytes);
  auto codes = [&](size_t c) {
    return Tensor::quantized(static_cast<char*>(qb.data()) + c * bytes, DType::Q4, spec.group_size, Device::CPU, {out, in});
  };
  for (int64_t T : {1, 2, 4, 8, 16, 24, 32, 64}) {
    Buffer xb = be->alloc(size_t(T * in) * 4), yb = be->alloc(size_t(T * out) * 4);
    const Tensor x = xb.view(0, DType::F32, {T, in}), y = yb.view(0, DType::F32, {T, out});
    fill(*be, x, 4);
    const double cached_s = time_per_call(*be, [&] { be->linear(x, codes(0), Tensor(), y); });
    size_t next = 0;
    const double cold_s = time_per_call(*be, [&] { be->linear(x, codes(next++ % copies), Tensor(), y); });
    std::printf("  [%lld x %lld] linear over codes T=%-3lld cached %.3f ms, from memory (%zu copies) %.3f ms = %.2fx; "
                "codes at %.1f / %.1f GB/s\n",
                (long long)out, (long long)in, (long long)T, 1e3 * cached_s, copies, 1e3 * cold_s, cold_s / cached_s,
                double(bytes) / cached_s / 1e9, double(bytes) / cold_s / 1e9);
  }
}

// A linear over fp32, fp16 and bf16 weights [out, in] on the CPU at 1 to 8 tokens (the streamed
// rows; fp32's single token goes to sgemv) and at 16 (sgemm; widened blocks for 16-bit), the
// weights read from memory: copies taken in turn, 1 GiB in all. fp16 and bf16 weights are what
// the CPU computes in for a GPU's CPU tier (experts and delegated layers on the CPU).
void streamed_weights(int64_t out, int64_t in) {
  auto be = make_cpu_backend(0);
  const double copy_gbps = bench::measure_copy_gbps(*be);
  std::printf("  host copy bandwidth (read + write) %.1f GB/s\n", copy_gbps);
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    const size_t bytes = size_t(out * in) * dtype_size(dt);
    const size_t copies = cold_weight_copies(bytes, size_t(1) << 30, be->available_memory());
    Buffer wb = be->alloc(copies * bytes);
    fill(*be, wb.view(0, dt, {out, in}), 1);
    for (size_t c = 1; c < copies; ++c) std::memcpy(static_cast<char*>(wb.data()) + c * bytes, wb.data(), bytes);
    for (int64_t T : {1, 2, 3, 4, 6, 8, 16}) {
      Buffer xb = be->alloc(size_t(T * in) * 4), yb = be->alloc(size_t(T * out) * 4);
      const Tensor x = xb.view(0, DType::F32, {T, in}), y = yb.view(0, DType::F32, {T, out});
      fill(*be, x, 4);
      size_t next = 0;
      const double s = time_per_call(*be, [&] {
        be->linear(x, Tensor(static_cast<char*>(wb.data()) + (next++ % copies) * bytes, dt, Device::CPU, {out, in}),
                   Tensor(), y);
      });
      const double gbps = double(bytes) / s / 1e9;
      std::printf("  [%lld x %lld] %-4s T=%-2lld %.3f ms: weights at %.1f GB/s = %.0f%% of copy bandwidth, %.1f GFLOP/s\n",
                  (long long)out, (long long)in, dtype_name(dt), (long long)T, 1e3 * s, gbps, 100 * gbps / copy_gbps,
                  2.0 * double(T * out * in) / s / 1e9);
    }
  }
}

// The same step routed on the device (a GPU's decode steps, ForwardOps::routes_on_device): the
// routing from B tokens' logits (near-uniform) and the two routed launches over all E experts,
// which read each expert's rows from it; beside the linears() above, which the host's routing
// (a wait for the device per layer, not timed there) would feed.
template <class Matrix>
void routed_experts(Backend& be, const ModelConfig& cfg, int64_t B, const Tensor& x, const Tensor& gate_up,
                    const Tensor& swiglu, Buffer& gub, Buffer& downb, const Matrix& matrix) {
  const int64_t E = cfg.n_experts, k = cfg.experts_per_token, f = cfg.expert_intermediate, h = cfg.hidden, A = B * k;
  Buffer logits_b = be.alloc(size_t(B * E) * 4), index_b = be.alloc(size_t(4 * A + 2 * E + 8) * 4);
  const Tensor logits = logits_b.view(0, DType::F32, {B, E});
  fill(be, logits, 4);
  const auto piece = [&](int64_t at, DType dt, int64_t n) { return index_b.view(size_t(at) * 4, dt, {n}); };
  const Backend::DeviceRouting r{piece(0, DType::I32, A),         piece(A, DType::I32, A),
                                 piece(2 * A, DType::F32, A),     piece(3 * A, DType::I32, E + 1),
                                 piece(3 * A + E + 1, DType::I32, std::min(E, A)),
                                 piece(4 * A + 2 * E + 1, DType::I32, 3)};
  std::vector<Tensor> gu_w, down_w;
  for (int64_t e = 0; e < E; ++e) {
    gu_w.push_back(matrix(gub, gub.bytes() / size_t(E), e, 2 * f, h));
    down_w.push_back(matrix(downb, downb.bytes() / size_t(E), e, h, f));
  }
  const double routed_s = time_per_call(be, [&] {
    be.route_experts(logits, k, cfg.norm_topk_prob, r);
    be.routed_linears(x, gu_w, r, B, gate_up);
    be.routed_linears(swiglu, down_w, r, B, x);
  });
  std::printf("      routed on the device (the routing and two launches over all %lld experts): %.3f ms\n",
              (long long)E, 1e3 * routed_s);
}

// A step's active experts (on the CPU: an engine's cpu_experts; on a GPU: a resident or moved
// layer's): B tokens each choose k of the E experts at random; each active expert's gate/up
// [2f, h] and down [h, f] linears over its tokens, one linear() each (how the experts ran until
// Backend::linears) against one linears() per matrix kind. One layer's E experts lie in the
// backend's memory, 4-bit g64 codes or the activation dtype (fp32 on the CPU, fp16 on a GPU).
void grouped_experts(Backend& be, const ModelConfig& cfg, bool q4) {
  const quant::QuantSpec spec{4, 64};
  const DType act = be.activation_dtype();
  const int64_t E = cfg.n_experts, k = cfg.experts_per_token, f = cfg.expert_intermediate, h = cfg.hidden;
  const auto bytes_of = [&](int64_t out, int64_t in) {
    return q4 ? size_t(out) * quant::row_bytes(spec, in) : size_t(out * in) * dtype_size(act);
  };
  const size_t gu_bytes = bytes_of(2 * f, h), down_bytes = bytes_of(h, f);
  const char* kind = q4 ? "4-bit" : dtype_name(act);
  if (E * (gu_bytes + down_bytes) > be.available_memory() / 4) {
    std::printf("  %s experts: one layer's %s does not fit a quarter of free memory, skipped\n", kind,
                format_bytes(double(E * (gu_bytes + down_bytes))).c_str());
    return;
  }
  Buffer gub = be.alloc(size_t(E) * gu_bytes), downb = be.alloc(size_t(E) * down_bytes);
  const auto matrix = [&](Buffer& b, size_t bytes, int64_t e, int64_t out, int64_t in) {
    void* at = static_cast<char*>(b.data()) + size_t(e) * bytes;
    return q4 ? Tensor::quantized(at, DType::Q4, spec.group_size, be.device(), {out, in})
              : Tensor(at, act, be.device(), {out, in});
  };
  for (auto [b, bytes, out, in] : {std::tuple{&gub, gu_bytes, 2 * f, h}, std::tuple{&downb, down_bytes, h, f}}) {
    // One expert's values, made on the host and copied to every expert.
    const std::vector<float> values = normal_values(size_t(out * in), 1);
    std::vector<uint8_t> expert(bytes);
    if (q4) quant::quantize_rows(spec, values.data(), DType::F32, out, in, expert.data());
    else convert_elements(values.data(), DType::F32, expert.data(), act, values.size());
    for (int64_t e = 0; e < E; ++e) be.copy_to_device(static_cast<char*>(b->data()) + size_t(e) * bytes, expert.data(), bytes);
  }
  for (int64_t B : {1, 4, 8, 16, 32, 128, 256}) {
    std::mt19937 rng{uint32_t(B)};
    std::vector<int64_t> count(size_t(E), 0), order(static_cast<size_t>(E));
    for (int64_t t = 0; t < B; ++t) {
      for (int64_t e = 0; e < E; ++e) order[size_t(e)] = e;
      std::shuffle(order.begin(), order.end(), rng);
      for (int64_t j = 0; j < k; ++j) ++count[size_t(order[size_t(j)])];
    }
    const int64_t A = B * k;
    const size_t es = dtype_size(act);
    Buffer xb = be.alloc(size_t(A * h) * es), gb = be.alloc(size_t(A * 2 * f) * es), ab = be.alloc(size_t(A * f) * es);
    const Tensor x = xb.view(0, act, {A, h}), gate_up = gb.view(0, act, {A, 2 * f}), swiglu = ab.view(0, act, {A, f});
    fill(be, x, 2);
    fill(be, swiglu, 3);
    std::vector<Backend::LinearJob> gu_jobs, down_jobs;
    int64_t row = 0, active = 0;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t n = count[size_t(e)];
      if (n == 0) continue;
      ++active;
      gu_jobs.push_back({x.rows(row, n), matrix(gub, gu_bytes, e, 2 * f, h), gate_up.rows(row, n)});
      down_jobs.push_back({swiglu.rows(row, n), matrix(downb, down_bytes, e, h, f), x.rows(row, n)});
      row += n;
    }
    const double one_by_one_s = time_per_call(be, [&] {
      for (const auto& j : gu_jobs) be.linear(j.x, j.w, Tensor(), j.y);
      for (const auto& j : down_jobs) be.linear(j.x, j.w, Tensor(), j.y);
    });
    const double grouped_s = time_per_call(be, [&] {
      be.linears(gu_jobs);
      be.linears(down_jobs);
    });
    const double read = double(active) * double(gu_bytes + down_bytes), flops = 2.0 * double(A) * double(3 * f * h);
    std::printf("  %s B=%-3lld %3lld of %lld experts active, %.2f tokens each: one linear each %.3f ms, linears() %.3f "
                "ms = %.2fx; weights read at %.1f / %.1f GB/s, %.1f / %.1f GFLOP/s\n",
                kind, (long long)B, (long long)active, (long long)E, double(A) / double(active),
                1e3 * one_by_one_s, 1e3 * grouped_s, one_by_one_s / grouped_s, read / one_by_one_s / 1e9,
                read / grouped_s / 1e9, flops / one_by_one_s / 1e9, flops / grouped_s / 1e9);
    if (be.routes_on_device(B, E, k, gu_jobs.front().w)) routed_experts(be, cfg, B, x, gate_up, swiglu, gub, downb, matrix);
  }
}

struct EngineRun {
  double step_ms = 0, ctog_per_step = 0, dtoc_per_step = 0, dtoc_gbps = 0, layer_bytes = 0;
};

EngineRun decode(const ModelBundle& mb, Backend& be, const Args& a, TierSplit weights, bool compress) {
  OffloadOptions o = bench::engine_options(a, weights);
  if (compress) o.policy.compress_weights = Compression{4, 64};
  OffloadEngine engine(mb.config, *mb.weights, be, o, {a.prompt_len, a.gen_len});
  const bench::MeasuredPass m = bench::measured_pass(engine, bench::engine_requests(a));
  const OffloadReport &before = m.before, &after = m.after;
  const GenStats& stats = m.stats;
  const double passes = double(stats.decode_steps + 1);
  EngineRun r;
  r.step_ms = 1e3 * stats.decode_seconds / double(std::max<int64_t>(stats.decode_steps, 1));
  r.ctog_per_step = double(after.cpu_to_gpu.bytes - before.cpu_to_gpu.bytes) / passes;
  r.dtoc_per_step = double(after.disk_to_cpu.bytes - before.disk_to_cpu.bytes) / passes;
  const double dtoc_s = after.disk_to_cpu.seconds - before.disk_to_cpu.seconds;
  r.dtoc_gbps = dtoc_s > 0 ? double(after.disk_to_cpu.bytes - before.disk_to_cpu.bytes) / dtoc_s / 1e9 : 0;
  r.layer_bytes = double(engine.plan().layer_weight_bytes);
  return r;
}

void compare(const ModelBundle& mb, Backend& be, const Args& a, TierSplit weights, const char* where) {
  const EngineRun fp = decode(mb, be, a, weights, false), q = decode(mb, be, a, weights, true);
  std::printf("weights on %s: layer %s -> %s (%.2fx less)\n", where, format_bytes(fp.layer_bytes).c_str(),
              format_bytes(q.layer_bytes).c_str(), fp.layer_bytes / q.layer_bytes);
  for (const auto& [name, r] : {std::pair<const char*, const EngineRun&>{"uncompressed", fp}, {"4-bit g64   ", q}})
    std::printf("  %s decode step %8.2f ms; per pass cpu->gpu %s, disk->cpu %s%s\n", name, r.step_ms,
                format_bytes(r.ctog_per_step).c_str(), format_bytes(r.dtoc_per_step).c_str(),
                r.dtoc_gbps > 0 ? (" at " + std::to_string(r.dtoc_gbps).substr(0, 5) + " GB/s").c_str() : "");
  std::printf("  speedup %.2fx\n", fp.step_ms / q.step_ms);
}

}  // namespace

int main(int argc, char** argv) try {
  strata::use_best_blas_core(argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const Args a = parse(argc, argv);
  std::unique_ptr<Backend> be = make_backend(a.device, a.threads);
  ModelBundle mb = open_model(a.model);
  const double copy_gbps = bench::measure_copy_gbps(*be);
  std::printf("model %s on %s (%s); device copy bandwidth (read + write) %.1f GB/s\n", mb.config.name.c_str(),
              be->name(), dtype_name(be->activation_dtype()), copy_gbps);
  std::printf("\n1. kernels, 4-bit group 64, the model's %s matrices (the engine's fused linear up to %lld tokens)\n",
              mb.config.moe() ? "expert" : "MLP", (long long)be->fused_dequant_max_tokens());
  // A mixture of experts' matrices are an expert's gate and up as one [2f, h] and its down [h, f].
  const bool moe = mb.config.moe();
  const int64_t f = moe ? mb.config.expert_intermediate : mb.config.intermediate, h = mb.config.hidden;
  kernels(*be, moe ? 2 * f : f, h, copy_gbps);
  kernels(*be, h, f, copy_gbps);
  load_quantization(f, h);
  if (a.beside_sgemm) {
    std::printf("\n1b. the linear over codes beside another thread's sgemm (CPU backends)\n");
    beside_sgemm(moe ? 2 * f : f, h, h);
  }
  if (a.cold) {
    std::printf("\n1c. the linear over codes, cached and from memory (CPU backend)\n");
    cached_and_cold(moe ? 2 * f : f, h);
    cached_and_cold(h, f);
  }
  if (a.grouped && moe) {
    std::printf("\n1d. a step's active experts, one linear each against one linears() (%s backend)\n", be->name());
    grouped_experts(*be, mb.config, true);
    grouped_experts(*be, mb.config, false);
  }
  if (a.streamed) {
    std::printf("\n1e. a linear over fp32 and 16-bit weights at few tokens, from memory (CPU backend)\n");
    streamed_weights(moe ? 2 * f : f, h);
  }
  if (a.skip_engine) return 0;
  std::printf("\n2. decode step through the offloading engine, batch %d, prompt %d, %d new tokens\n", a.batch,
              a.prompt_len, a.gen_len);
  compare(mb, *be, a, {0, 100, 0}, "the cpu tier");
  if (!a.skip_disk) compare(mb, *be, a, {0, 0, 100}, "disk");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_quant: %s\n", e.what());
  return 1;
}
