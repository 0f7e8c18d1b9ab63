// `strata profile`: measures capacities, links and kernels through the runtime's own abstractions
// (Backend copies and ops, DiskStore I/O), so the cost model sees what the runtime achieves.
// Every rate is a median over repeats after a warm-up, rounded to four significant digits (the
// run-to-run noise is larger than that).
#include "strata/profile/profiler.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <ctime>
#include <memory>
#include <random>
#include <sstream>
#include <vector>

#include "strata/backend/backend.h"
#include "strata/backend/blas_core.h"
#include "strata/backend/device_info.h"
#include "strata/core/dtype.h"
#include "strata/core/error.h"
#include "strata/core/size.h"
#include "strata/offload/disk_store.h"

namespace strata {
namespace {

// FlexGen's default compression, the one the search tries.
const quant::QuantSpec kQ4G64{4, 64};
// The small matrix of the CPU linear's second curves: an expert of Qwen3-30B-A3B ([2 x 768, 2048]).
constexpr int64_t kSmallRows = 1536, kSmallCols = 2048;

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  STRATA_CHECK(!v.empty(), "median of nothing");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Through decimal text, so the double is the one nearest a 4-digit number and prints as one.
double round4(double v) {
  if (!std::isfinite(v)) return v;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return std::strtod(buf, nullptr);
}

size_t round_down(size_t v, size_t multiple) { return v / multiple * multiple; }

// How much work each measurement does: --quick stays within seconds on a 2-core CPU, the full run
// within a few minutes on a GPU machine.
struct Settings {
  size_t copy_bytes;                 // pinned host <-> device buffer
  int copy_reps;
  size_t disk_bytes, disk_request;   // file size and request size
  int disk_passes;                   // timed passes, after one that allocates the file's blocks
  double disk_pass_s;                // a slow disk gets fewer bytes than disk_bytes
  int64_t hidden;                    // GEMM shapes: one transformer layer of this hidden size
  std::vector<int64_t> gemm_tokens;
  // The same curve at a second hidden size (0: none), over these token counts: a GEMM's rate
  // depends on its matrices' size too, and the cost model prices a model's own (gpu_gemm2).
  int64_t hidden2 = 0;
  std::vector<int64_t> gemm2_tokens;
  double gemm_max_run_s;             // stop growing the token count once one layer takes this long
  int reps;                          // timed samples per kernel measurement
  double min_sample_s;               // back-to-back calls per sample, so short kernels time well
  int64_t attn_slots, attn_context;  // decode attention: sequences x cached tokens
  // The CPU linear's weights, in all: copies of its matrix, one per call in turn (cpu_linear).
  size_t cpu_weights_bytes;
  // Prefill attention: prompt lengths, each over enough sequences for prefill_tokens in all.
  std::vector<int64_t> prefill_lens;
  int64_t prefill_tokens;
};

Settings settings_for(bool quick, bool on_gpu) {
  Settings s{};
  if (quick) {
    s.copy_bytes = size_t(64) << 20;
    s.copy_reps = 3;
    s.disk_bytes = size_t(64) << 20;
    s.disk_request = size_t(16) << 20;
    s.disk_passes = 1;
    s.disk_pass_s = 1;
    s.hidden = 2048;
    s.gemm_tokens = {1, 4, 16, 64, 256, 1024};
    s.gemm_max_run_s = 0.25;
    s.reps = 3;
    s.min_sample_s = 0.002;
    s.attn_slots = on_gpu ? 16 : 8;
    s.attn_context = 512;
    s.cpu_weights_bytes = size_t(64) << 20;
    s.prefill_lens = {128, 512};
    s.prefill_tokens = 1024;
  } else {
    s.copy_bytes = size_t(1) << 30;
    s.copy_reps = 5;
    s.disk_bytes = size_t(2) << 30;
    s.disk_request = size_t(64) << 20;
    s.disk_passes = 2;
    s.disk_pass_s = 8;
    s.hidden = 4096;
    for (int64_t t = 1; t <= 8192; t *= 2) s.gemm_tokens.push_back(t);
    // A GPU's models reach past h = 4096 (OPT-30B 7168, Llama 3 70B 8192); the CPU backend's are
    // smaller (OPT-1.3B 2048), and its long GEMMs take seconds: up to 1024 tokens there.
    s.hidden2 = on_gpu ? 8192 : 2048;
    for (int64_t t : s.gemm_tokens)
      if (on_gpu || t <= 1024) s.gemm2_tokens.push_back(t);
    s.gemm_max_run_s = 1.5;
    s.reps = 5;
    s.min_sample_s = 0.02;
    s.attn_slots = on_gpu ? 64 : 16;
    s.attn_context = 1024;
    s.cpu_weights_bytes = size_t(1) << 30;
    // The CPU backend's kernel takes ~0.1 s for one 1024-token prompt; a GPU reaches long contexts.
    s.prefill_lens = on_gpu ? std::vector<int64_t>{128, 512, 2048, 8192} : std::vector<int64_t>{128, 512, 1024};
    s.prefill_tokens = on_gpu ? 8192 : 1024;
  }
  return s;
}

// Median seconds of one call of `fn` on `be`: a warm-up call (cuBLAS picks kernels and loads
// modules on first use) and, when that was short, a second one to estimate the time; then `reps`
// samples, each as many back-to-back calls between synchronizations as last about min_sample_s.
double time_op(Backend& be, int reps, double min_sample_s, const std::function<void()>& fn) {
  auto t0 = Clock::now();
  fn();
  be.synchronize();
  double first = since(t0);
  if (first < 0.05) {
    t0 = Clock::now();
    fn();
    be.synchronize();
    first = since(t0);
  }
  const int inner = first >= min_sample_s ? 1 : int(std::clamp(std::ceil(min_sample_s / std::max(first, 1e-7)), 1.0, 1000.0));
  std::vector<double> samples;
  for (int r = 0; r < reps; ++r) {
    t0 = Clock::now();
    for (int i = 0; i < inner; ++i) fn();
    be.synchronize();
    samples.push_back(since(t0) / inner);
  }
  return median(samples);
}

// Fills device memory with small random values of the backend's activation dtype (GEMM and
// attention speed must not depend on zeros or denormals) by copying one host pattern over it.
void fill_random(Backend& be, const Buffer& buf, uint32_t seed, DType dt) {
  const size_t es = dtype_size(dt), chunk = std::min(buf.bytes(), size_t(4) << 20) / es * es;
  if (chunk == 0) return;
  std::vector<float> f(chunk / es);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-0.05f, 0.05f);
  for (float& v : f) v = dist(rng);
  std::vector<uint8_t> host(chunk);
  convert_elements(f.data(), DType::F32, host.data(), dt, f.size());
  for (size_t off = 0; off < buf.bytes(); off += chunk)
    be.copy_to_device(static_cast<char*>(buf.data()) + off, host.data(), std::min(chunk, buf.bytes() - off));
}

// Pinned host memory from a backend, freed on scope exit.
struct HostBuffer {
  Backend& be;
  void* p;
  HostBuffer(Backend& b, size_t bytes) : be(b), p(b.alloc_host(bytes)) {}
  ~HostBuffer() { be.free_host(p); }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
};

struct Profiler {
  const ProfileOptions& opt;
  Settings s;
  Backend& dev;  // the "gpu" tier's device (the CPU backend on a machine without a GPU)
  size_t dev_free = 0, host_free = 0;

  void say(const std::string& line) const {
    if (opt.progress) opt.progress(line);
  }

  // Pinned host-to-device and device-to-host bandwidth, each direction on its copy stream.
  void copies(HardwareProfile& hw) {
    const size_t bytes = std::max<size_t>(round_down(std::min({s.copy_bytes, dev_free / 4, host_free / 4}), 1 << 20),
                                          size_t(4) << 20);
    HostBuffer host(dev, bytes);
    std::memset(host.p, 0x5a, bytes);  // touch every page, so page faults are not timed
    Buffer d = dev.alloc(bytes);
    for (CopyKind kind : {CopyKind::HostToDevice, CopyKind::DeviceToHost}) {
      const bool h2d = kind == CopyKind::HostToDevice;
      const double t = time_op(dev, s.copy_reps, 0, [&] {
        if (h2d) dev.copy(kind, d.data(), host.p, bytes);
        else dev.copy(kind, host.p, d.data(), bytes);
      });
      const double bw = round4(double(bytes) / t);
      (h2d ? hw.cpu_to_gpu_bw : hw.gpu_to_cpu_bw) = bw;
      say(std::string(h2d ? "host -> device" : "device -> host") + ": " + format_rate(bw, "B/s") + " (" +
          format_bytes(double(bytes)) + " pinned, median of " + std::to_string(s.copy_reps) + ")");
    }
  }

  // Disk write then read bandwidth through the DiskStore, in large requests from pinned memory.
  std::string disk(HardwareProfile& hw, const std::filesystem::path& dir) {
    const size_t request = s.disk_request;
    const size_t bytes = round_down(std::min(s.disk_bytes, size_t(hw.disk_mem / 4)), request);
    if (bytes < request)
      STRATA_FAIL("profile: too little free space in " << dir.string() << " to measure the disk ("
                                                        << format_bytes(hw.disk_mem) << " free)");
    DiskStore store(dir, bytes);
    const size_t base = store.allocate(bytes);
    const bool buffered = std::string(store.io_name()).find("buffered") != std::string::npos;
    HostBuffer src(dev, request), dst(dev, request);
    std::mt19937 rng(7);
    for (size_t i = 0; i < request / 4; ++i) static_cast<uint32_t*>(src.p)[i] = uint32_t(rng());
    std::memset(dst.p, 0, request);
    // Without O_DIRECT the page cache would absorb writes and serve reads: flush and drop it, and
    // count the flush as part of writing.
    auto flush = [&](bool drop) {
      if (!buffered) return;
      const int fd = ::open(store.path().c_str(), O_RDONLY);
      if (fd < 0) return;
      (void)::fdatasync(fd);
      if (drop) (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      ::close(fd);
    };
    // The first pass allocates the file's blocks (the runtime overwrites them from then on, so it
    // is not counted) and decides how much of the file a slow disk gets: what fits in disk_pass_s.
    size_t used = 0;
    auto t0 = Clock::now();
    while (used < bytes && (used == 0 || since(t0) < s.disk_pass_s)) {
      store.write(base + used, src.p, request);
      used += request;
    }
    flush(true);
    std::vector<double> w, r;
    for (int pass = 0; pass < s.disk_passes; ++pass) {
      t0 = Clock::now();
      for (size_t off = 0; off < used; off += request) store.write(base + off, src.p, request);
      flush(false);
      w.push_back(double(used) / since(t0));
      flush(true);
      t0 = Clock::now();
      for (size_t off = 0; off < used; off += request) store.read(base + off, dst.p, request);
      r.push_back(double(used) / since(t0));
      if (std::memcmp(src.p, dst.p, request) != 0)
        STRATA_FAIL("profile: the disk store read back other bytes than it wrote in " << store.path().string());
    }
    hw.cpu_to_disk_bw = round4(median(w));
    hw.disk_to_cpu_bw = round4(median(r));
    say("disk write: " + format_rate(hw.cpu_to_disk_bw, "B/s") + ", read: " + format_rate(hw.disk_to_cpu_bw, "B/s") + " (" +
        store.io_name() + ", " + format_bytes(double(used)) + " in " + format_bytes(double(request)) + " requests)");
    return store.io_name();
  }

  // FLOP/s of one transformer layer's projections (fused QKV [3h, h], output [h, h], MLP up
  // [4h, h] and down [h, 4h]) over growing token counts, until one layer takes gemm_max_run_s.
  std::vector<GemmPoint> gemm_curve(Backend& be, int64_t h, const std::vector<int64_t>& tokens, size_t free_bytes,
                                    const char* label) {
    const DType dt = be.activation_dtype();
    const size_t es = dtype_size(dt);
    const int64_t f = 4 * h;
    const size_t weight_bytes = size_t(12 * h * h) * es;
    int64_t max_t = 0;
    for (int64_t t : tokens)  // activations per token: x, qkv, o, mid, y = 10 h
      if (weight_bytes + size_t(10 * h * t) * es <= free_bytes / 2) max_t = t;
    STRATA_CHECK(max_t > 0, "profile: " << format_bytes(double(free_bytes)) << " free is too little for GEMMs of h = " << h);
    Buffer w = be.alloc(weight_bytes), act = be.alloc(size_t(10 * h * max_t) * es);
    fill_random(be, w, 1, be.activation_dtype());
    {  // inputs in [-1, 1]: the first max_t rows of `act` are x for every token count
      std::vector<float> vals(size_t(h * max_t));
      std::mt19937 rng(2);
      std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
      for (float& v : vals) v = dist(rng);
      std::vector<uint8_t> host(vals.size() * es);
      convert_elements(vals.data(), DType::F32, host.data(), dt, vals.size());
      be.copy_to_device(act.data(), host.data(), host.size());
    }
    const Tensor wqkv = w.view(0, dt, {3 * h, h}), wo = w.view(size_t(3 * h * h) * es, dt, {h, h}),
                 wup = w.view(size_t(4 * h * h) * es, dt, {f, h}), wdown = w.view(size_t(8 * h * h) * es, dt, {h, f});
    std::vector<GemmPoint> curve;
    for (int64_t t : tokens) {
      if (t > max_t) break;
      size_t off = 0;
      auto next = [&](int64_t cols) {
        const Tensor v = act.view(off, dt, {t, cols});
        off += size_t(t * cols) * es;
        return v;
      };
      const Tensor x = next(h), qkv = next(3 * h), o = next(h), mid = next(f), y = next(h);
      const double sec = time_op(be, s.reps, s.min_sample_s, [&] {
        be.linear(x, wqkv, {}, qkv);
        be.linear(x, wo, {}, o);
        be.linear(x, wup, {}, mid);
        be.linear(mid, wdown, {}, y);
      });
      const double flops = round4(2.0 * double(t) * double(12 * h * h) / sec);
      curve.push_back({double(t), flops});
      char ms[32];
      std::snprintf(ms, sizeof ms, "%.3g ms", sec * 1e3);
      say(std::string(label) + " GEMM h=" + std::to_string(h) + ", " + std::to_string(t) + " tokens: " +
          format_rate(flops, "FLOP/s") + " (" + ms + " per layer)");
      if (sec > s.gemm_max_run_s) break;
    }
    return curve;
  }

  // Decode attention: one new token per sequence against a full cache (kv_store then attention,
  // as the runtime's decode step), in bytes of K and V read per second. 32 heads of 128. `dt` is
  // the cache's dtype where the runtime keeps it: the GPU's fp16 also when the CPU attends to it.
  // With `q4`, the cache is 4-bit (group 64) and the rate counts the `dt` bytes it stands for.
  double attention(Backend& be, DType dt, int64_t slots, int64_t context, size_t free_bytes, const char* label,
                   bool q4 = false) {
    const size_t es = dtype_size(dt);
    const int64_t heads = 32, d = 128;
    while (slots > 1 && size_t(2 * slots * context * heads * d) * es > free_bytes / 4) slots /= 2;
    const size_t uncompressed_bytes = size_t(slots * context * heads * d) * es;
    const size_t cache_bytes =
        q4 ? size_t(slots * context * heads) * quantized_row_bytes(4, 64, d) : size_t(slots * context * heads * d) * es;
    Buffer ck = be.alloc(cache_bytes), cv = be.alloc(cache_bytes), qkv = be.alloc(size_t(4 * slots * heads * d) * es);
    if (q4) {  // codes from random fp data, so every group has a real scale
      Buffer fp = be.alloc(size_t(slots * context * heads * d) * es);
      fill_random(be, fp, 3, dt);
      const Tensor rows = fp.view(0, dt, {slots * context * heads, d});
      be.quantize_rows(kQ4G64, rows, ck.data());
      be.quantize_rows(kQ4G64, rows, cv.data());
    } else {
      fill_random(be, ck, 3, dt);
      fill_random(be, cv, 4, dt);
    }
    fill_random(be, qkv, 5, dt);
    std::vector<int32_t> host_idx(size_t(2 * slots));
    for (int64_t i = 0; i < slots; ++i) {
      host_idx[size_t(i)] = int32_t(i);                          // slots
      host_idx[size_t(slots + i)] = int32_t(context - 1);       // positions: the cache's last entry
    }
    Buffer idx = be.alloc(host_idx.size() * 4);
    be.copy_to_device(idx.data(), host_idx.data(), host_idx.size() * 4);
    const Tensor slot_t = idx.view(0, DType::I32, {slots}), pos_t = idx.view(size_t(slots) * 4, DType::I32, {slots});
    auto cache_view = [&](const Buffer& b) {
      return q4 ? Tensor::quantized(b.data(), DType::Q4, 64, be.device(), {slots, context, heads, d})
                : b.view(0, dt, {slots, context, heads, d});
    };
    const Tensor cache_k = cache_view(ck), cache_v = cache_view(cv);
    const size_t tok = size_t(slots * heads * d) * es;
    const Tensor q = qkv.view(0, dt, {slots, heads, d}), k = qkv.view(tok, dt, {slots, heads, d}),
                 v = qkv.view(2 * tok, dt, {slots, heads, d}), out = qkv.view(3 * tok, dt, {slots, heads, d});
    const float scale = float(1.0 / std::sqrt(double(d)));
    const double sec = time_op(be, s.reps, s.min_sample_s, [&] {
      be.kv_store(k, v, cache_k, cache_v, slot_t, pos_t);
      be.attention(q, cache_k, cache_v, slot_t, pos_t, scale, out);
    });
    const double bw = round4(2.0 * double(q4 ? uncompressed_bytes : cache_bytes) / sec);
    say(std::string(label) + " decode attention: " + format_rate(bw, "B/s") + (q4 ? " of the uncompressed KV cache it stands for (" : " of KV cache (") +
        std::to_string(slots) + " sequences x " + std::to_string(context) + " tokens, " + std::to_string(heads) +
        " heads of " + std::to_string(d) + ", " + (q4 ? std::string("4-bit g64") : std::string(dtype_name(dt))) + ")");
    return bw;
  }

  // Causal prefill attention by prompt length: each sequence's s query rows against its own s
  // cached positions (the runtime's prefill step after kv_store), over max(1, prefill_tokens / s)
  // sequences, 32 heads of 128, in FLOP/s of QK^T and AV over the causal half (2 s (s + 1) per head
  // dimension and sequence).
  std::vector<GemmPoint> prefill_attention(Backend& be, DType dt, size_t free_bytes, const char* label) {
    const size_t es = dtype_size(dt);
    const int64_t heads = 32, d = 128;
    std::vector<GemmPoint> curve;
    for (int64_t len : s.prefill_lens) {
      const int64_t seqs = std::max<int64_t>(1, s.prefill_tokens / len), T = seqs * len;
      const size_t rows_bytes = size_t(T * heads * d) * es;  // q, out, and K and V's caches alike
      if (4 * rows_bytes > free_bytes / 2) break;
      Buffer ck = be.alloc(rows_bytes), cv = be.alloc(rows_bytes), qo = be.alloc(2 * rows_bytes);
      fill_random(be, ck, 6, dt);
      fill_random(be, cv, 7, dt);
      fill_random(be, qo, 8, dt);
      std::vector<int32_t> host_idx(size_t(2 * T));
      for (int64_t t = 0; t < T; ++t) {
        host_idx[size_t(t)] = int32_t(t / len);        // slots
        host_idx[size_t(T + t)] = int32_t(t % len);    // positions
      }
      Buffer idx = be.alloc(host_idx.size() * 4);
      be.copy_to_device(idx.data(), host_idx.data(), host_idx.size() * 4);
      const Tensor slot_t = idx.view(0, DType::I32, {T}), pos_t = idx.view(size_t(T) * 4, DType::I32, {T});
      const Tensor cache_k = ck.view(0, dt, {seqs, len, heads, d}), cache_v = cv.view(0, dt, {seqs, len, heads, d});
      const Tensor q = qo.view(0, dt, {T, heads, d}), out = qo.view(rows_bytes, dt, {T, heads, d});
      const float scale = float(1.0 / std::sqrt(double(d)));
      const double sec = time_op(be, s.reps, s.min_sample_s, [&] { be.attention(q, cache_k, cache_v, slot_t, pos_t, scale, out); });
      const double flops = round4(double(seqs) * 2.0 * double(len) * double(len + 1) * double(heads * d) / sec);
      curve.push_back({double(len), flops});
      char ms[32];
      std::snprintf(ms, sizeof ms, "%.3g ms", sec * 1e3);
      say(std::string(label) + " prefill attention, prompt " + std::to_string(len) + " x " + std::to_string(seqs) +
          ": " + format_rate(flops, "FLOP/s") + " (" + ms + ", " + std::to_string(heads) + " heads of " +
          std::to_string(d) + ", " + dtype_name(dt) + ")");
    }
    return curve;
  }

  // Seconds of a CPU linear over a [rows, h] weight matrix stored in `wdt` (with `q4`, as 4-bit
  // group-64 codes) for each of `tokens`: the CPU tier's weights in the CPU's hands, as experts
  // computed where they live (cpu_experts). Fewer rows where memory is short.
  // The engine reads each of those weights once a step, from memory: one matrix timed again and
  // again stays in the last-level cache (4-bit codes of 16384 x 4096 are 38 MB): on the 2-core VM
  // the codes kernel read them 2x as fast at 1 to 4 tokens as from memory, and the blocks and sgemm
  // 1.4x at 64 (bench/results/2026-11-28-cpu-cold-weights.md). So the calls take copies in turn,
  // s.cpu_weights_bytes of them in all (as memory allows): no call finds its weights cached.
  struct CpuLinear {
    int64_t rows = 0;
    std::vector<double> seconds;  // per token count
  };
  CpuLinear cpu_linear(Backend& be, DType wdt, int64_t rows, int64_t h, size_t free_bytes, const std::vector<int64_t>& tokens,
                       bool q4) {
    const DType xt = be.activation_dtype();
    const int64_t max_t = *std::max_element(tokens.begin(), tokens.end());
    while (rows > 256 && size_t(rows * h) * (dtype_size(wdt) + dtype_size(xt)) > free_bytes / 4) rows /= 2;
    const size_t matrix_bytes = q4 ? size_t(rows) * quantized_row_bytes(4, 64, h) : size_t(rows * h) * dtype_size(wdt);
    const size_t copies = cold_weight_copies(matrix_bytes, s.cpu_weights_bytes, free_bytes);
    Buffer w = be.alloc(copies * matrix_bytes);
    if (q4) {  // codes from random data, so every group has a real scale
      Buffer fp = be.alloc(size_t(rows * h) * dtype_size(xt));
      fill_random(be, fp, 8, xt);
      be.quantize_rows(kQ4G64, fp.view(0, xt, {rows, h}), w.data());
      for (size_t c = 1; c < copies; ++c)
        be.copy_on_device(static_cast<char*>(w.data()) + c * matrix_bytes, w.data(), matrix_bytes);
    } else {
      fill_random(be, w, 8, wdt);
    }
    Buffer act = be.alloc(size_t(max_t * (h + rows)) * dtype_size(xt));
    fill_random(be, act, 9, xt);
    auto matrix = [&](size_t c) {
      void* at = static_cast<char*>(w.data()) + c * matrix_bytes;
      return q4 ? Tensor::quantized(at, DType::Q4, 64, be.device(), {rows, h}) : Tensor(at, wdt, be.device(), {rows, h});
    };
    CpuLinear out{rows, {}};
    size_t next = 0;
    for (int64_t t : tokens) {
      const Tensor x = act.view(0, xt, {t, h}), y = act.view(size_t(max_t * h) * dtype_size(xt), xt, {t, rows});
      out.seconds.push_back(time_op(be, s.reps, s.min_sample_s, [&] { be.linear(x, matrix(next++ % copies), {}, y); }));
    }
    return out;
  }

  // FLOP/s of a CPU linear over a [rows, h] matrix of `wdt` weights (with `q4`, over 4-bit
  // group-64 codes of them) from 1 to 256 tokens, and the weights it was timed over. The second
  // point is 2 tokens: the weight-streaming rates come from it.
  struct CpuCurve {
    std::vector<GemmPoint> curve;
    double params = 0;
  };
  CpuCurve cpu_gemm_curve(Backend& be, DType wdt, int64_t rows, int64_t h, size_t free_bytes, bool q4) {
    const std::vector<int64_t> tokens = {1, 2, 4, 8, 16, 64, 256};
    const CpuLinear l = cpu_linear(be, wdt, rows, h, free_bytes, tokens, q4);
    CpuCurve out{{}, double(l.rows * h)};
    std::ostringstream line;
    line << "cpu linear over " << (q4 ? std::string("4-bit g64 codes of ") : std::string()) << dtype_name(wdt)
         << " weights (" << l.rows << " x " << h << "):";
    for (size_t i = 0; i < tokens.size(); ++i) {
      out.curve.push_back({double(tokens[i]), round4(2.0 * double(tokens[i] * l.rows * h) / l.seconds[i])});
      line << " " << tokens[i] << " tokens " << format_rate(out.curve.back().flops_per_s, "FLOP/s") << (i + 1 < tokens.size() ? "," : "");
    }
    say(line.str());
    return out;
  }

  // A layer's elementwise work outside its GEMMs and attention, as the runtime runs it for T
  // tokens: two layer norms, two residual adds and the MLP's GELU over [T, 4h]; in seconds per
  // token and hidden unit (it grows as T h, where the GEMMs grow as T h^2).
  double elementwise(Backend& be, int64_t h, size_t free_bytes, const char* label) {
    const DType dt = be.activation_dtype();
    const size_t es = dtype_size(dt);
    int64_t T = 1024;
    while (T > 64 && size_t(8 * T * h) * es > free_bytes / 4) T /= 2;
    Buffer xb = be.alloc(size_t(3 * T * h) * es), mb = be.alloc(size_t(4 * T * h) * es), wb = be.alloc(size_t(2 * h) * es);
    fill_random(be, xb, 9, dt);
    fill_random(be, mb, 10, dt);
    fill_random(be, wb, 11, dt);
    const size_t rows = size_t(T * h) * es;
    const Tensor x = xb.view(0, dt, {T, h}), y = xb.view(rows, dt, {T, h}), n = xb.view(2 * rows, dt, {T, h});
    const Tensor mid = mb.view(0, dt, {T, 4 * h}), w = wb.view(0, dt, {h}), b = wb.view(size_t(h) * es, dt, {h});
    // Each call leaves x = norm output + y, so repeated calls stay bounded. Repeated GELU shrinks
    // values in (0, 1) about 2x a call: the CPU's few calls per sample stay far from fp32's
    // subnormals (which would slow it), and a GPU's fp16 ones cost it nothing.
    const double sec = time_op(be, s.reps, s.min_sample_s, [&] {
      be.layer_norm(x, w, b, 1e-5f, n);
      be.add(x, y, x);
      be.layer_norm(x, w, b, 1e-5f, n);
      be.activation(Activation::GELU, mid);
      be.add(n, y, x);
    });
    const double per = sec / double(T * h);
    char ns[48];
    std::snprintf(ns, sizeof ns, "%.3g ns", per * 1e9);
    say(std::string(label) + " elementwise work of a layer: " + ns + " per token and hidden unit (" + std::to_string(T) +
        " tokens, h = " + std::to_string(h) + ", " + dtype_name(dt) + ")");
    return per;
  }

  // 4-bit (group 64) dequantization of one h x 4h matrix through the backend's kernel, in bytes of
  // output (the compute dtype) per second (what the runtime does once per (token, sub-layer) for
  // long steps).
  double dequant(Backend& be, int64_t h, const char* label) {
    const DType dt = be.activation_dtype();
    const int64_t rows = 4 * h;
    Buffer fp = be.alloc(size_t(rows * h) * dtype_size(dt)), q = be.alloc(size_t(rows) * quantized_row_bytes(4, 64, h));
    fill_random(be, fp, 6, dt);
    const Tensor x = fp.view(0, dt, {rows, h});
    be.quantize_rows(kQ4G64, x, q.data());
    const double sec = time_op(be, s.reps, s.min_sample_s, [&] { be.dequantize_rows(kQ4G64, q.data(), x); });
    const double bw = round4(double(dtype_size(dt)) * double(rows * h) / sec);
    say(std::string(label) + " 4-bit dequantization: " + format_rate(bw, "B/s") + " of " + dtype_name(dt) + " output (" +
        std::to_string(rows) + " x " + std::to_string(h) + ")");
    return bw;
  }
};

std::filesystem::path cache_root() {
  const char* cache = std::getenv("STRATA_CACHE");
  const char* home = std::getenv("HOME");
  return cache && *cache ? std::filesystem::path(cache) : std::filesystem::path(home ? home : ".") / ".cache" / "strata";
}

std::string slug(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::isalnum(static_cast<unsigned char>(c))) out += char(std::tolower(static_cast<unsigned char>(c)));
    else if (!out.empty() && out.back() != '-') out += '-';
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out;
}

std::string today_utc() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

}  // namespace

std::filesystem::path default_hardware_profile_path() { return cache_root() / "hardware.yaml"; }

HardwareProfile cached_or_measured_profile(const ProfileOptions& options, std::ostream& log, const std::string& who) {
  const std::filesystem::path path = default_hardware_profile_path();
  if (std::filesystem::exists(path)) return load_hardware_profile(path);
  log << who << ": no hardware profile at " << path.string() << "; profiling this machine once\n";
  ProfileOptions o = options;
  if (!o.progress) o.progress = [&log](const std::string& line) { log << "  " << line << "\n"; };
  const HardwareProfile hw = profile_machine(o);
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path) << hardware_profile_to_yaml(hw);
  log << who << ": wrote " << path.string() << "\n";
  return hw;
}

size_t cold_weight_copies(size_t matrix_bytes, size_t want_bytes, size_t free_bytes) {
  if (matrix_bytes == 0) return 1;
  const size_t fit = std::min(want_bytes, free_bytes / 4) / matrix_bytes;
  return std::max<size_t>(fit, 1);
}

HardwareProfile profile_machine(const ProfileOptions& opt) {
  std::unique_ptr<Backend> dev_owner = make_backend(opt.backend, opt.threads);
  Backend& dev = *dev_owner;
  const bool on_gpu = dev.device() == Device::CUDA;
  std::unique_ptr<Backend> cpu_owner = on_gpu ? make_cpu_backend(opt.threads) : nullptr;
  Backend& cpu = on_gpu ? *cpu_owner : dev;
  const std::filesystem::path dir = opt.offload_dir.empty() ? default_offload_dir() : opt.offload_dir;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) STRATA_FAIL("profile: cannot create the offload directory " << dir.string() << ": " << ec.message());

  Profiler p{opt, settings_for(opt.quick, on_gpu), dev};
  HardwareProfile hw;
  // Capacities first, before the profiler's own buffers take their share.
  p.host_free = cpu.available_memory();
  p.dev_free = on_gpu ? dev.available_memory() : p.host_free;
  STRATA_CHECK(p.host_free != SIZE_MAX && p.dev_free != SIZE_MAX, "profile: the backend cannot tell its free memory");
  hw.gpu_mem = double(p.dev_free);
  hw.cpu_mem = double(p.host_free);
  hw.disk_mem = double(free_disk_space(dir));
  hw.gpu_name = on_gpu ? cuda_device_name(0) : "none (cpu backend)";
  hw.compute_dtype = dev.activation_dtype();
  hw.cpu_name = cpu_model_name();
  p.say("memory: device " + format_bytes(hw.gpu_mem) + ", host " + format_bytes(hw.cpu_mem) + ", disk " +
        format_bytes(hw.disk_mem) + " free in " + dir.string());

  p.copies(hw);
  const std::string io = p.disk(hw, dir);
  hw.gpu_gemm = p.gemm_curve(dev, p.s.hidden, p.s.gemm_tokens, p.dev_free, on_gpu ? "gpu" : "cpu");
  hw.gpu_gemm_hidden = double(p.s.hidden);
  if (p.s.hidden2 > 0) {
    try {
      hw.gpu_gemm2 = p.gemm_curve(dev, p.s.hidden2, p.s.gemm2_tokens, p.dev_free, on_gpu ? "gpu" : "cpu");
      hw.gpu_gemm2_hidden = double(p.s.hidden2);
    } catch (const Error& e) {  // too little memory for that layer: the one curve prices every model
      p.say(std::string("GEMMs of h = ") + std::to_string(p.s.hidden2) + " left out: " + e.what());
    }
  }
  const DType cache_dt = dev.activation_dtype();
  hw.gpu_attention_bw =
      p.attention(dev, cache_dt, p.s.attn_slots, p.s.attn_context, p.dev_free, on_gpu ? "gpu" : "cpu");
  hw.gpu_attention_q4_bw =
      p.attention(dev, cache_dt, p.s.attn_slots, p.s.attn_context, p.dev_free, on_gpu ? "gpu" : "cpu", true);
  hw.gpu_prefill_attention = p.prefill_attention(dev, cache_dt, p.dev_free, on_gpu ? "gpu" : "cpu");
  hw.gpu_dequant_bw = p.dequant(dev, p.s.hidden, on_gpu ? "gpu" : "cpu");
  hw.gpu_elementwise_s = p.elementwise(dev, p.s.hidden, p.dev_free, on_gpu ? "gpu" : "cpu");
  if (on_gpu) {
    // The CPU attends to the offloaded cache as the GPU wrote it (fp16); an fp32 figure overstated
    // it 3x on the first H100 run (74 GB/s profiled, 24 GB/s in the engine).
    hw.cpu_attention_bw = p.attention(cpu, cache_dt, p.s.attn_slots / 4, p.s.attn_context, p.host_free, "cpu");
    hw.cpu_attention_q4_bw = p.attention(cpu, cache_dt, p.s.attn_slots / 4, p.s.attn_context, p.host_free, "cpu", true);
    // CPU FLOP/s where the delegated work's GEMMs saturate: a few hundred tokens.
    const std::vector<GemmPoint> c = p.gemm_curve(cpu, p.s.hidden / 2, {256}, p.host_free, "cpu");
    hw.cpu_flops = c.back().flops_per_s;
  } else {  // the CPU is the compute device: its curve is already measured
    hw.cpu_attention_bw = hw.gpu_attention_bw;
    hw.cpu_attention_q4_bw = hw.gpu_attention_q4_bw;
    for (const GemmPoint& g : hw.gpu_gemm) hw.cpu_flops = std::max(hw.cpu_flops, g.flops_per_s);
  }
  // The CPU's linear over the CPU tier's weights, kept as the compute device computes in them. Its
  // 2-token point is the weight-streaming rate: 2 FLOPs per weight and token.
  // The same over 4-bit codes, whose 2-token point counts the compute-dtype bytes they stand for.
  const Profiler::CpuCurve plain = p.cpu_gemm_curve(cpu, cache_dt, 4 * p.s.hidden, p.s.hidden, p.host_free, false),
                           codes = p.cpu_gemm_curve(cpu, cache_dt, 4 * p.s.hidden, p.s.hidden, p.host_free, true);
  hw.cpu_gemm = plain.curve;
  hw.cpu_gemm_q4 = codes.curve;
  hw.cpu_gemm_params = std::min(plain.params, codes.params);
  // The same over a small expert's matrix (Qwen3-30B-A3B's gate and up): what a call's fixed costs
  // take from a fine-grained mixture of experts.
  const Profiler::CpuCurve small_plain = p.cpu_gemm_curve(cpu, cache_dt, kSmallRows, kSmallCols, p.host_free, false),
                           small_codes = p.cpu_gemm_curve(cpu, cache_dt, kSmallRows, kSmallCols, p.host_free, true);
  hw.cpu_gemm_small = small_plain.curve;
  hw.cpu_gemm_q4_small = small_codes.curve;
  hw.cpu_gemm_small_params = std::min(small_plain.params, small_codes.params);
  const auto weight_rate = [&](const std::vector<GemmPoint>& curve) {
    const GemmPoint& two = curve[1];
    STRATA_CHECK(two.tokens == 2, "internal: the CPU linear curve's second point is not 2 tokens");
    return round4(two.flops_per_s / (2.0 * two.tokens) * double(dtype_size(cache_dt)));
  };
  hw.cpu_weight_bw = weight_rate(hw.cpu_gemm);
  hw.cpu_weight_q4_bw = weight_rate(hw.cpu_gemm_q4);

  hw.name = on_gpu ? slug(hw.gpu_name) : "cpu-" + slug(hw.cpu_name);
  std::ostringstream d;
  d << "strata profile" << (opt.quick ? " --quick" : "") << " on " << today_utc() << ": " << dev.name() << " backend ("
    << dtype_name(dev.activation_dtype()) << ")";
  if (!on_gpu) d << ", no GPU: the CPU stands in for it, so gpu_mem and cpu_mem are the same host memory";
  d << "; GEMMs of one layer with h=" << p.s.hidden << " (CPU: OpenBLAS, " << blas_core() << " kernels); disk " << io
    << " in " << dir.string();
  hw.description = d.str();
  if (!opt.quick && opt.refine) return opt.refine(hw, dev, opt);
  return hw;
}

}  // namespace strata
