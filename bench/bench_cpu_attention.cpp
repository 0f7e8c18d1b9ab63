// CPU attention, both of the CPU backend's kernels, for fp32, fp16 and 4-bit / 8-bit (group 64)
// caches. Times are the fastest call of a second of calls.
// - Decode (the `cpu_attention: true` path of FlexGen's policies, where the KV cache lives in host
//   memory): one new token per sequence against a cache of `--context` positions. Reports the
//   cache bytes read per second against this machine's read bandwidth (every thread summing its
//   share of a 1 GiB buffer), the peak a memory-bound attention can reach.
// - `--mode prefill`: every sequence's `--context` tokens in one step, each attending to the positions
//   up to its own (the CPU backend's prefill, as in `strata perplexity`). Reports FLOP/s (scores
//   and weighted values, 4 * head_dim per query head and visible key) against the CPU backend's
//   GEMM at the same width (OpenBLAS sgemm over `--context` rows), a compute-bound kernel's peak.
// - Decode rotates over `--layers` copies of the cache, one per call (default: enough layers for
//   2 GiB of K and V), as a decode step reads each layer's cache once: a single cache small enough
//   for the last-level cache would be timed from it (on a 16-core Xeon, 148% of DRAM's read
//   bandwidth at 16 x 544 tokens of 32 heads), a rate the engine never sees.
// Usage: bench_cpu_attention [--threads N] [--slots 16] [--context 1024] [--heads 32]
//                            [--kv-heads 32] [--head-dim 128] [--act f16] [--mode decode|prefill]
//                            [--caches fp32,fp16,q4,q8] [--layers N] [--window W] [--softcap X]
// - `--window W`, `--softcap X`: a Gemma sliding-window layer (each token reads the last W positions;
//   GB/s counts the bytes of those) and its soft-capped scores (AttentionSpec).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.h"
#include "strata/backend/blas_core.h"
#include "strata/backend/backend.h"
#include "strata/core/dtype.h"
#include "strata/core/thread_pool.h"
#include "strata/quant/quant.h"

using namespace strata;
using bench::Clock;
using bench::seconds;

namespace {

struct Args {
  int threads = 0;
  int64_t slots = 16, context = 1024, heads = 32, kv_heads = 32, head_dim = 128;
  DType act = DType::F16;  // the GPU hands fp16 queries to the CPU
  bool prefill = false;
  int64_t layers = 0;  // decode: cache copies to rotate over (0: enough for 2 GiB)
  std::string caches = "fp32,fp16,q4,q8";  // which cache formats to time
  int window = 0;         // AttentionSpec's sliding window (0: the whole context)
  float softcap = 0.0f;   // and soft cap
};

Args parse(int argc, char** argv) {
  Args a;
  bench::for_each_option(argc, argv, [&](const std::string& k, const std::string& v) {
    if (k == "--threads") a.threads = std::stoi(v);
    else if (k == "--caches") a.caches = v;
    else if (k == "--slots") a.slots = std::stoll(v);
    else if (k == "--context") a.context = std::stoll(v);
    else if (k == "--heads") a.heads = std::stoll(v);
    else if (k == "--kv-heads") a.kv_heads = std::stoll(v);
    else if (k == "--head-dim") a.head_dim = std::stoll(v);
    else if (k == "--layers") a.layers = std::stoll(v);
    else if (k == "--window") a.window = std::stoi(v);
    else if (k == "--softcap") a.softcap = std::stof(v);
    else if (k == "--act") a.act = v == "f32" ? DType::F32 : DType::F16;
    else if (k == "--mode") {
      STRATA_CHECK(v == "decode" || v == "prefill", "--mode is decode or prefill, not " << v);
      a.prefill = v == "prefill";
    }
    else STRATA_FAIL("unknown option " << k);
  });
  STRATA_CHECK(a.heads % a.kv_heads == 0, "--heads must be a multiple of --kv-heads");
  STRATA_CHECK(a.layers >= 0, "--layers must be positive (0: enough for 2 GiB of cache)");
  return a;
}

// Bytes read per second when `threads` threads each sum their share of a 1 GiB buffer (as
// 64-bit integers: a sum the compiler vectorizes, so the loads are the limit).
double read_gbps(int threads) {
  const size_t n = (size_t(1) << 30) / sizeof(uint64_t);
  std::vector<uint64_t> buf(n, 1);
  ThreadPool pool(threads);
  std::atomic<uint64_t> total{0};
  auto pass = [&] {
    pool.parallel_for(int64_t(n), [&](int64_t i0, int64_t i1) {
      uint64_t sum = 0;
      for (int64_t i = i0; i < i1; ++i) sum += buf[size_t(i)];
      total += sum;  // keeps the loads alive
    });
  };
  pass();
  const int reps = 5;
  const auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) pass();
  const double sec = seconds(t0, Clock::now());
  STRATA_CHECK(total.load() == uint64_t(reps + 1) * n, "read bandwidth: lost a chunk");
  return double(n * sizeof(uint64_t)) * reps / sec / 1e9;
}

// Seconds of the fastest of a warm-up call and the calls of the next second: this machine is
// shared, and a slow call says more about its neighbours than about the kernel.
template <class F>
double fastest_call(F call) {
  call();
  double sec = 1e30;
  for (const auto t0 = Clock::now(); seconds(t0, Clock::now()) < 1.0;) {
    const auto c0 = Clock::now();
    call();
    sec = std::min(sec, seconds(c0, Clock::now()));
  }
  return sec;
}

// The CPU backend's GEMM rate: y[rows, width] = x[rows, width] @ w[width, width]^T, as a layer's
// projection over the prefill's rows.
double gemm_gflops(Backend& be, int64_t rows, int64_t width) {
  std::vector<float> host(size_t(std::max(rows, width) * width), 0.5f);
  Buffer xb = be.alloc(size_t(rows * width) * 4), wb = be.alloc(size_t(width * width) * 4), yb = be.alloc(size_t(rows * width) * 4);
  std::memcpy(xb.data(), host.data(), size_t(rows * width) * 4);
  std::memcpy(wb.data(), host.data(), size_t(width * width) * 4);
  const Tensor x = xb.view(0, DType::F32, {rows, width}), w = wb.view(0, DType::F32, {width, width}),
               y = yb.view(0, DType::F32, {rows, width});
  const double sec = fastest_call([&] { be.linear(x, w, Tensor(), y); });
  return 2.0 * double(rows) * double(width) * double(width) / sec / 1e9;
}

void fill_random(std::vector<float>& v, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (float& x : v) x = dist(rng);
}

struct Case {
  const char* name;
  DType cache;
  int bits;  // 0: uncompressed
};

// peak: GB/s of reads for decode, GFLOP/s of GEMM for prefill.
void run_case(Backend& be, const Args& a, const Case& c, double peak) {
  const int64_t S = a.slots, C = a.context, kvh = a.kv_heads, d = a.head_dim, rows = S * C * kvh;
  const quant::QuantSpec spec{c.bits > 0 ? c.bits : 4, 64};
  const size_t cache_bytes =
      c.bits > 0 ? size_t(rows) * quant::row_bytes(spec, d) : size_t(rows * d) * dtype_size(c.cache);
  // Decode reads a different layer's K and V each call; the copies are byte-equal (the kernel's
  // time does not depend on the values), made by copying the first.
  const int64_t layers =
      a.prefill ? 1 : a.layers > 0 ? a.layers : std::max<int64_t>(1, int64_t((size_t(2) << 30) / (2 * cache_bytes)) + 1);
  std::vector<Buffer> kbs, vbs;
  for (int64_t l = 0; l < layers; ++l) kbs.push_back(be.alloc(cache_bytes)), vbs.push_back(be.alloc(cache_bytes));
  {
    std::vector<float> fp(size_t(rows * d));
    for (Buffer* b : {&kbs[0], &vbs[0]}) {
      fill_random(fp, b == &kbs[0] ? 1 : 2);
      const Tensor src(fp.data(), DType::F32, Device::CPU, {rows, d});
      if (c.bits > 0) be.quantize_rows(spec, src, b->data());
      else convert_elements(fp.data(), DType::F32, b->data(), c.cache, fp.size());
    }
    for (int64_t l = 1; l < layers; ++l) {
      std::memcpy(kbs[size_t(l)].data(), kbs[0].data(), cache_bytes);
      std::memcpy(vbs[size_t(l)].data(), vbs[0].data(), cache_bytes);
    }
  }
  auto cache = [&](const Buffer& b) {
    return c.bits > 0 ? Tensor::quantized(b.data(), c.bits == 4 ? DType::Q4 : DType::Q8, 64, Device::CPU, {S, C, kvh, d})
                      : b.view(0, c.cache, {S, C, kvh, d});
  };
  // Decode: each sequence's token at the last position. Prefill: every position of every sequence.
  std::vector<int32_t> slots, positions;
  for (int64_t s = 0; s < S; ++s)
    for (int64_t p = a.prefill ? 0 : C - 1; p < C; ++p) slots.push_back(int32_t(s)), positions.push_back(int32_t(p));
  const int64_t T = int64_t(slots.size());
  std::vector<float> q32(size_t(T * a.heads * d));
  fill_random(q32, 3);
  Buffer qb = be.alloc(q32.size() * dtype_size(a.act)), ob = be.alloc(q32.size() * dtype_size(a.act));
  convert_elements(q32.data(), DType::F32, qb.data(), a.act, q32.size());
  const Tensor q = qb.view(0, a.act, {T, a.heads, d}), out = ob.view(0, a.act, {T, a.heads, d});
  const Tensor st(slots.data(), DType::I32, Device::CPU, {T}), pt(positions.data(), DType::I32, Device::CPU, {T});
  const AttentionSpec scores(1.0f / std::sqrt(float(d)), a.window, a.softcap);
  size_t layer = 0;
  const double sec = fastest_call([&] {
    be.attention(q, cache(kbs[layer]), cache(vbs[layer]), st, pt, scores, out);
    layer = (layer + 1) % kbs.size();
  });
  if (a.prefill) {
    const double flop = 4.0 * double(d * a.heads) * double(S) * double(C) * double(C + 1) / 2;
    const double gflops = flop / sec / 1e9;
    std::printf("  %-10s %8.3f ms per step, %6.1f GFLOP/s = %3.0f%% of the GEMM rate\n", c.name, 1e3 * sec, gflops,
                100 * gflops / peak);
    return;
  }
  // Decode reads each sequence's last min(C, window) positions.
  const double read = a.window > 0 ? std::min(1.0, double(a.window) / double(C)) : 1.0;
  const double gbps = 2.0 * double(cache_bytes) * read / sec / 1e9;
  std::printf("  %-10s %8.3f ms per step, cache read at %6.1f GB/s = %3.0f%% of the read bandwidth (%lld layers, "
              "%.2f GiB)\n",
              c.name, 1e3 * sec, gbps, 100 * gbps / peak, (long long)layers, 2.0 * double(cache_bytes) * double(layers) / (1 << 30));
}

}  // namespace

int main(int argc, char** argv) try {
  strata::use_best_blas_core(argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const Args a = parse(argc, argv);
  const int threads = a.threads > 0 ? a.threads : int(std::thread::hardware_concurrency());
  std::unique_ptr<Backend> be = make_cpu_backend(threads);
  double peak;
  if (a.prefill) {
    peak = gemm_gflops(*be, a.context, a.heads * a.head_dim);
    std::printf("cpu prefill attention: %lld sequences x %lld tokens, %lld query heads / %lld kv heads of %lld, %s "
                "queries, %d threads; GEMM %.1f GFLOP/s (OpenBLAS, %s kernels)\n",
                (long long)a.slots, (long long)a.context, (long long)a.heads, (long long)a.kv_heads,
                (long long)a.head_dim, dtype_name(a.act), threads, peak, blas_core().c_str());
  } else {
    peak = read_gbps(threads);
    std::printf("cpu decode attention: %lld sequences x %lld positions, %lld query heads / %lld kv heads of %lld, %s "
                "queries, %d threads; read bandwidth %.1f GB/s; window %d, soft cap %g\n",
                (long long)a.slots, (long long)a.context, (long long)a.heads, (long long)a.kv_heads,
                (long long)a.head_dim, dtype_name(a.act), threads, peak, a.window, double(a.softcap));
  }
  const std::pair<const char*, Case> cases[] = {{"fp32", {"fp32", DType::F32, 0}},
                                                {"fp16", {"fp16", DType::F16, 0}},
                                                {"q4", {"4-bit g64", DType::Q4, 4}},
                                                {"q8", {"8-bit g64", DType::Q8, 8}}};
  int run = 0;
  for (const auto& [key, c] : cases)
    if (("," + a.caches + ",").find(std::string(",") + key + ",") != std::string::npos) run_case(*be, a, c, peak), ++run;
  STRATA_CHECK(run > 0, "--caches lists fp32, fp16, q4 and q8 (comma-separated), not '" << a.caches << "'");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_cpu_attention: %s\n", e.what());
  return 1;
}
