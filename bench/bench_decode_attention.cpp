// Decode attention on one backend (default the GPU): one new query token per sequence against a
// cache of `--context` positions, over fp16, 4-bit and 8-bit (group 64) caches. Reports the cache
// bytes read per second (as stored: codes and parameters for the quantized ones) against the
// device's copy bandwidth (read + write of a 1 GiB copy).
// On the CUDA backend the split-KV kernels follow STRATA_SPLIT_KV (src/backend/cuda/split_kv.h):
// unset or `auto` the rule, `0` never, N chunks forced; running it under each times the crossover
// the rule was chosen without (docs/cuda-backend.md, "Split-KV decode").
// Calls rotate over `--layers` copies of the cache (default: enough for 1 GiB of K and V), as a
// decode step reads each layer's cache once: one small cache would be served from L2.
// Usage: bench_decode_attention [--device cuda] [--slots 1] [--context 4096] [--heads 32]
//                               [--kv-heads 8] [--head-dim 128] [--caches f16,q4,q8] [--layers N]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_common.h"
#include "strata/backend/backend.h"
#include "strata/core/dtype.h"
#include "strata/quant/quant.h"

using namespace strata;
using bench::Clock;
using bench::seconds;

namespace {

struct Args {
  std::string device = "cuda";
  DType dtype = DType::F16;  // --dtype fp16|bf16: the activations, q and the uncompressed cache
  int64_t slots = 1, context = 4096, heads = 32, kv_heads = 8, head_dim = 128, layers = 0;
  std::string caches = "f16,q4,q8";
};

Args parse(int argc, char** argv) {
  Args a;
  bench::for_each_option(argc, argv, [&](const std::string& k, const std::string& v) {
    if (k == "--device") a.device = v;
    else if (k == "--dtype") a.dtype = gpu_activation_dtype(v, DType::F16);
    else if (k == "--slots") a.slots = std::stoll(v);
    else if (k == "--context") a.context = std::stoll(v);
    else if (k == "--heads") a.heads = std::stoll(v);
    else if (k == "--kv-heads") a.kv_heads = std::stoll(v);
    else if (k == "--head-dim") a.head_dim = std::stoll(v);
    else if (k == "--caches") a.caches = v;
    else if (k == "--layers") a.layers = std::stoll(v);
    else STRATA_FAIL("unknown option " << k);
  });
  STRATA_CHECK(a.slots > 0 && a.context > 0 && a.kv_heads > 0 && a.heads % a.kv_heads == 0 && a.head_dim > 0,
               "bad shape");
  return a;
}

// A cache format: fp16 rows, or group-64 quantized rows of `bits`.
struct Format {
  std::string name;
  int bits;  // 0: fp16
};

size_t row_bytes(const Format& f, int64_t d) {
  if (f.bits == 0) return size_t(d) * 2;
  quant::QuantSpec spec;
  spec.bits = f.bits;
  spec.group_size = 64;
  return quant::row_bytes(spec, d);
}

// One layer's K (or V) cache bytes: random rows in the format (16-bit rows in `act`), the same for every copy.
std::vector<uint8_t> cache_bytes(const Format& f, int64_t rows, int64_t d, uint32_t seed, DType act) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(size_t(rows * d));
  for (float& v : x) v = dist(rng);
  std::vector<uint8_t> bytes(size_t(rows) * row_bytes(f, d));
  if (f.bits == 0) {
    convert_elements(x.data(), DType::F32, bytes.data(), act, x.size());
  } else {
    quant::QuantSpec spec;
    spec.bits = f.bits;
    spec.group_size = 64;
    quant::quantize_rows(spec, x.data(), DType::F32, rows, d, bytes.data());
  }
  return bytes;
}

void run(Backend& be, const Args& a, const Format& f, double copy_gbps) {
  const int64_t T = a.slots, H = a.heads, KV = a.kv_heads, d = a.head_dim, C = a.context;
  const int64_t rows = T * C * KV;
  const size_t layer_bytes = size_t(rows) * row_bytes(f, d);  // K or V of one layer
  const int64_t layers = a.layers > 0 ? a.layers : std::max<int64_t>(1, int64_t((size_t(1) << 30) / (2 * layer_bytes)));
  const std::vector<uint8_t> k_host = cache_bytes(f, rows, d, 1, be.activation_dtype()),
                              v_host = cache_bytes(f, rows, d, 2, be.activation_dtype());
  std::vector<Buffer> keep;
  std::vector<Tensor> ks, vs;
  for (int64_t l = 0; l < layers; ++l) {
    for (auto [host, list] : {std::pair{&k_host, &ks}, std::pair{&v_host, &vs}}) {
      keep.push_back(be.alloc(layer_bytes));
      be.copy_to_device(keep.back().data(), host->data(), layer_bytes);
      list->push_back(f.bits == 0 ? keep.back().view(0, be.activation_dtype(), {T, C, KV, d})
                                  : Tensor::quantized(keep.back().data(), f.bits == 4 ? DType::Q4 : DType::Q8, 64,
                                                      be.device(), {T, C, KV, d}));
    }
  }
  const std::vector<uint8_t> q_host = cache_bytes(Format{"f16", 0}, T * H, d, 3, be.activation_dtype());
  keep.push_back(be.alloc(q_host.size()));
  be.copy_to_device(keep.back().data(), q_host.data(), q_host.size());
  const Tensor q = keep.back().view(0, be.activation_dtype(), {T, H, d});
  keep.push_back(be.alloc(q_host.size()));
  const Tensor out = keep.back().view(0, be.activation_dtype(), {T, H, d});
  std::vector<int32_t> idx(size_t(2 * T));
  for (int64_t i = 0; i < T; ++i) {
    idx[size_t(i)] = int32_t(i);              // slots
    idx[size_t(T + i)] = int32_t(C - 1);      // positions: the cache's last entry
  }
  keep.push_back(be.alloc(idx.size() * 4));
  be.copy_to_device(keep.back().data(), idx.data(), idx.size() * 4);
  const Tensor slots = keep.back().view(0, DType::I32, {T}), pos = keep.back().view(size_t(T) * 4, DType::I32, {T});
  const float scale = float(1.0 / std::sqrt(double(d)));

  // Calls back to back between synchronizations (one call is a few microseconds on a GPU).
  int64_t layer = 0;
  auto call = [&] {
    be.attention(q, ks[size_t(layer)], vs[size_t(layer)], slots, pos, scale, out);
    layer = (layer + 1) % layers;
  };
  for (int64_t l = 0; l < layers; ++l) call();  // warm-up: modules loaded, split scratch allocated
  be.synchronize();
  int64_t calls = 0, batch = layers;
  double best = 1e30;
  const auto t0 = Clock::now();
  while (seconds(t0, Clock::now()) < 1.0) {
    const auto b0 = Clock::now();
    for (int64_t i = 0; i < batch; ++i) call();
    be.synchronize();
    best = std::min(best, seconds(b0, Clock::now()) / double(batch));
    calls += batch;
  }
  const double gbps = 2.0 * double(layer_bytes) / best / 1e9;
  std::printf("%-4s %lld x %lld tokens, %lld heads (%lld kv) of %lld: %8.2f us a call, %7.1f GB/s of cache (%.0f%% of "
              "copy), %lld layers, %lld calls\n",
              f.name.c_str(), (long long)T, (long long)C, (long long)H, (long long)KV, (long long)d, best * 1e6, gbps,
              100.0 * gbps / copy_gbps, (long long)layers, (long long)calls);
}

}  // namespace

int main(int argc, char** argv) try {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const Args a = parse(argc, argv);
  std::unique_ptr<Backend> be = make_backend(a.device, 0, a.dtype);
  const char* split = std::getenv("STRATA_SPLIT_KV");
  const double copy_gbps = bench::measure_copy_gbps(*be);
  std::printf("decode attention on %s; STRATA_SPLIT_KV=%s; device copy bandwidth (read + write) %.1f GB/s\n",
              backend_label(*be).c_str(), split ? split : "(unset: auto)", copy_gbps);
  for (const Format& f : {Format{"f16", 0}, Format{"q4", 4}, Format{"q8", 8}})
    if (("," + a.caches + ",").find("," + f.name + ",") != std::string::npos) run(*be, a, f, copy_gbps);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_decode_attention: %s\n", e.what());
  return 1;
}
