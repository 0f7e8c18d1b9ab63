// The CPU backend: fp32 everywhere, OpenBLAS for the GEMMs, a thread pool for the rest.
// It is the reference the CUDA kernels are tested against and the stand-in GPU in CI.
// kv_store and attention also take fp16 and bf16 data (converted on the fly, computed in fp32):
// with cpu_attention the GPU computes in 16 bits and delegates decode attention to the KV cache in
// CPU memory.
#include <cblas.h>
#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <type_traits>
#include <vector>

#include "strata/backend/backend.h"
#include "strata/backend/cpu_linear.h"
#include "strata/core/error.h"
#include "strata/core/thread_pool.h"
#include "strata/quant/quant.h"
#include "cpu_prefill_attention.h"
#include "cpu_quant.h"
#include "cpu_simd.h"

namespace strata {
namespace {

using cpu::bf16;
using cpu::dot;
using cpu::f16;
// Tags for attention over caches of group-wise quantized rows, and for a tile that reads their
// packed codes in place (cpu_quant.h).
struct QuantRow {};
struct PackedCodes {};

// Copies n values from src to dst, converting between F32, F16 and BF16 when their dtypes differ:
// to or from fp32 with the rows' conversions, fp16 <-> bf16 (activations of one 16-bit type, a
// cache of the other) by convert_elements, through fp32 with one rounding.
inline void copy_converted(const void* src, DType src_dt, void* dst, DType dst_dt, int64_t n) {
  if (src_dt == dst_dt)
    std::memcpy(dst, src, size_t(n) * dtype_size(src_dt));
  else if (dst_dt == DType::F32)
    cpu::to_f32(src, src_dt, static_cast<float*>(dst), n);
  else if (src_dt == DType::F32)
    cpu::from_f32(static_cast<const float*>(src), dst, dst_dt, n);
  else
    convert_elements(src, src_dt, dst, dst_dt, size_t(n));
}

// PyTorch's gelu(approximate="tanh") in fp32.
inline float gelu_tanh(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
}

void check_f32(const Tensor& t, const char* what) {
  STRATA_CHECK(t.device == Device::CPU && t.dtype == DType::F32 && t.data,
               "cpu backend: " << what << " must be a CPU F32 tensor, got " << dtype_name(t.dtype));
}
// For kv_store and attention, which also take the GPU's 16-bit data.
void check_f32_or_16bit(const Tensor& t, const char* what) {
  STRATA_CHECK(t.device == Device::CPU && (t.dtype == DType::F32 || t.dtype == DType::F16 || t.dtype == DType::BF16) &&
                   t.data,
               "cpu backend: " << what << " must be a CPU F32, F16 or BF16 tensor, got " << dtype_name(t.dtype));
}
// A weight vector (a norm's scale or shift, a bias) as F32: itself, or widened from F16 or BF16
// into `store`. The offloading engine computes experts on the CPU over the GPU's 16-bit weights.
Tensor widened(const Tensor& t, std::vector<float>& store, const char* what) {
  if (t.empty() || t.dtype == DType::F32) return t;
  check_f32_or_16bit(t, what);
  store.resize(size_t(t.numel()));
  copy_converted(t.data, t.dtype, store.data(), DType::F32, t.numel());
  Tensor w(store.data(), DType::F32, Device::CPU, {t.numel()});
  return w;
}

void check_same_dtype(const Tensor& a, const char* a_name, const Tensor& b, const char* b_name) {
  STRATA_CHECK(a.dtype == b.dtype, "cpu backend: " << a_name << " and " << b_name << " must share one dtype, got "
                                                   << dtype_name(a.dtype) << " and " << dtype_name(b.dtype));
}
void check_i32(const Tensor& t, const char* what) {
  STRATA_CHECK(t.device == Device::CPU && t.dtype == DType::I32 && t.data,
               "cpu backend: " << what << " must be a CPU I32 tensor");
}

// One token's rotary angles (fp32 products, as Hugging Face computes them) and the rotation of
// its heads, rope()'s arithmetic for rope() and split_qkv() alike.
class RopeAngles {
public:
  explicit RopeAngles(const Tensor& inv_freq)
      : inv_freq_(inv_freq.ptr<float>()), cos_(size_t(inv_freq.numel())), sin_(size_t(inv_freq.numel())) {}
  void at(int32_t position) {
    const float pos = float(position);
    for (size_t i = 0; i < cos_.size(); ++i) {
      const float a = pos * inv_freq_[i];
      cos_[i] = std::cos(a);
      sin_[i] = std::sin(a);
    }
  }
  // dst's heads = src's rotated (rotate_half); dst may be src.
  void rotate(const float* src, float* dst, int64_t heads, int64_t d) const {
    const int64_t half = d / 2;
    for (int64_t hd = 0; hd < heads; ++hd, src += d, dst += d)
      for (int64_t i = 0; i < half; ++i) {
        const float a = src[i], b = src[i + half];
        dst[i] = a * cos_[size_t(i)] - b * sin_[size_t(i)];
        dst[i + half] = b * cos_[size_t(i)] + a * sin_[size_t(i)];
      }
  }

private:
  const float* inv_freq_;
  std::vector<float> cos_, sin_;
};

// Up to this many tokens the engine computes a quantized step with linear over the codes; beyond
// it, it dequantizes the sub-layer once for every unit of its block and runs the plain GEMM. On a
// 2-core Xeon (OpenBLAS Cooperlake kernels, OPT-1.3B's MLP matrices, 4-bit g64) the codes took
// 0.4-0.5x the time of dequantize + sgemm at 8 tokens, 0.75-0.9x at 16, 1.3-1.7x at 32
// (bench/results/2026-11-26-cpu-linear-codes.md). The CUDA backend's limit is 16 too
// (quant::kCudaFusedDequantMaxTokens), which the cost model prices.
constexpr int64_t kFusedDequantMaxTokens = 16;
// linear()'s own limits, where it changes kernel with the token count: cpu_linear.h.

// OpenBLAS serves one call at a time; a thread that calls while another's call runs does not
// sleep but competes for the cores, and with as many BLAS threads as cores both crawl (on the
// 2-core VM a scratch program saw a 32-token linear of a Qwen3-30B-A3B expert take 8-27x its time
// alone beside another thread's sgemm loop). The engine calls from two threads where the CPU
// backend stands in for the GPU and the CPU lane computes experts, so every linear that calls BLAS
// takes one turn for all its calls: the second caller sleeps, and callers take turns in the order
// they came (a plain mutex let a thread calling back to back keep it while the other waited; a
// turn per sgemm made a linear over blocks of dequantized rows wait once per block).
// `bench_quant --beside-sgemm` measures it (bench/results/2026-11-28-cpu-moe-q4-sgemm.md).
class BlasTurns {
public:
  void lock() {
    std::unique_lock<std::mutex> hold(m_);
    const uint64_t mine = next_++;
    turn_.wait(hold, [&] { return serving_ == mine; });
  }
  void unlock() {
    {
      std::lock_guard<std::mutex> hold(m_);
      ++serving_;
    }
    turn_.notify_all();
  }

private:
  std::mutex m_;
  std::condition_variable turn_;
  uint64_t next_ = 0, serving_ = 0;
};
BlasTurns& blas_turns() {
  static BlasTurns turns;
  return turns;
}

// y[T, n] = x[T, k] @ w[n, k]^T + beta y, row-major with leading dimensions k, k and ldy. The
// caller holds a BLAS turn.
void sgemm_xwt(int64_t T, int64_t n, int64_t k, const float* x, const float* w, float beta, float* y, int64_t ldy) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(T), int(n), int(k), 1.0f, x, int(k), w, int(k), beta, y,
              int(ldy));
}

void check_quantized(const Tensor& t, const char* what) {
  STRATA_CHECK(t.device == Device::CPU && t.quantized() && t.data,
               "cpu backend: " << what << " must be a quantized (Q4/Q8) CPU tensor, got " << dtype_name(t.dtype));
}

// linear()'s arguments: fp32 activations, weights as fp32, fp16 or bf16 (the GPU's, read in
// place) or codes, bias fp32 or empty.
void check_linear(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y) {
  check_f32(x, "x");
  check_f32(y, "y");
  if (w.quantized()) check_quantized(w, "w");
  else if (w.dtype != DType::F16 && w.dtype != DType::BF16) check_f32(w, "w");
  STRATA_CHECK(w.device == Device::CPU && w.data, "cpu backend: w must be a CPU tensor");
  const int64_t T = x.dim(0), in = x.row_size(), out = w.dim(0);
  STRATA_CHECK(w.ndim == 2 && w.dim(1) == in && y.dim(0) == T && y.row_size() == out,
               "linear: x " << x.shape_str() << " w " << w.shape_str() << " y " << y.shape_str());
  STRATA_CHECK(y.data != x.data, "linear: y must not alias x");
  if (!bias.empty()) {
    check_f32(bias, "bias");
    STRATA_CHECK(bias.numel() == out, "linear: bias " << bias.shape_str());
  }
}

class CpuBackend final : public Backend {
public:
  explicit CpuBackend(int threads) : pool_(threads) {}

  const char* name() const override { return "cpu"; }
  Device device() const override { return Device::CPU; }
  DType activation_dtype() const override { return DType::F32; }

  Buffer alloc(size_t bytes) override {
    // 64-byte alignment keeps rows vector-aligned for BLAS.
    void* p = std::aligned_alloc(64, std::max<size_t>(64, (bytes + 63) / 64 * 64));
    if (!p) STRATA_FAIL("cpu backend: out of memory allocating " << bytes << " bytes");
    return Buffer(this, p, bytes);
  }
  void release(void* data) override { std::free(data); }
  void copy_to_device(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copy_on_device(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void fill(void* dst, uint8_t byte, size_t bytes) override { std::memset(dst, byte, bytes); }
  void synchronize() override {}

  void* alloc_host(size_t bytes) override {
    void* p = std::aligned_alloc(4096, std::max<size_t>(4096, (bytes + 4095) / 4096 * 4096));
    if (!p) STRATA_FAIL("cpu backend: out of host memory allocating " << bytes << " bytes");
    return p;
  }
  void free_host(void* p) override { std::free(p); }
  // The stand-in "device" is host memory, so a copy is memcpy on the calling (copy-lane) thread.
  void copy_2d(CopyKind, void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
               size_t rows) override {
    if (dst_pitch == width && src_pitch == width) {
      std::memcpy(dst, src, width * rows);
      return;
    }
    for (size_t r = 0; r < rows; ++r)
      std::memcpy(static_cast<char*>(dst) + r * dst_pitch, static_cast<const char*>(src) + r * src_pitch, width);
  }

  size_t available_memory() const override {
    const size_t b = host_memory_available();
    return b == 0 ? SIZE_MAX : b;
  }

  void embedding(const Tensor& ids, const Tensor& table, const Tensor& out, bool accumulate) override {
    check_i32(ids, "ids");
    check_f32(table, "table");
    check_f32(out, "out");
    const int64_t h = table.dim(1), vocab = table.dim(0);
    STRATA_CHECK(out.dim(0) == ids.numel() && out.row_size() == h, "embedding: out " << out.shape_str());
    const int32_t* id = ids.ptr<int32_t>();
    pool_.parallel_for(ids.numel(), [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        STRATA_CHECK(id[t] >= 0 && id[t] < vocab, "embedding: id " << id[t] << " outside [0, " << vocab << ")");
        const float* src = table.ptr<float>() + id[t] * h;
        float* dst = out.ptr<float>() + t * h;
        if (accumulate)
          for (int64_t i = 0; i < h; ++i) dst[i] += src[i];
        else
          std::memcpy(dst, src, size_t(h) * 4);
      }
    });
  }

  void layer_norm(const Tensor& x, const Tensor& w16, const Tensor& b16, float eps, const Tensor& out) override {
    std::vector<float> ws, bs;
    const Tensor w = widened(w16, ws, "w"), b = widened(b16, bs, "b");
    check_norm("layer_norm", x, w, out);
    pool_.parallel_for(x.dim(0), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) norm_row(x, Norm::Layer, w, b, eps, 0.0f, out, r);
    });
  }

  void rms_norm(const Tensor& x, const Tensor& w16, float eps, const Tensor& out, float w_offset = 0.0f) override {
    std::vector<float> ws;
    const Tensor w = widened(w16, ws, "w");
    check_norm("rms_norm", x, w, out);
    pool_.parallel_for(x.dim(0), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) norm_row(x, Norm::Rms, w, Tensor(), eps, w_offset, out, r);
    });
  }

  void add_norm(const Tensor& x, const Tensor& delta, Norm norm, const Tensor& w16, const Tensor& b16, float eps,
                const Tensor& out, float w_offset = 0.0f) override {
    std::vector<float> ws, bs;
    const Tensor w = widened(w16, ws, "w"), b = widened(b16, bs, "b");
    check_norm("add_norm", x, w, out);
    check_f32(delta, "delta");
    STRATA_CHECK(delta.numel() == x.numel() && out.data != x.data, "add_norm: delta " << delta.shape_str() << " out "
                                                                                      << out.shape_str());
    STRATA_CHECK(norm == Norm::Rms || w_offset == 0.0f, "add_norm: a weight offset is for RMS norms");
    const int64_t h = x.row_size();
    pool_.parallel_for(x.dim(0), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        float* xr = x.ptr<float>() + r * h;
        const float* dr = delta.ptr<float>() + r * h;
        for (int64_t i = 0; i < h; ++i) xr[i] += dr[i];
        norm_row(x, norm, w, b, eps, w_offset, out, r);
      }
    });
  }

  int64_t fused_dequant_max_tokens() const override { return kFusedDequantMaxTokens; }

  void linear(const Tensor& x, const Tensor& w, const Tensor& bias16, const Tensor& y) override {
    std::vector<float> bs;
    const Tensor bias = widened(bias16, bs, "bias");
    check_linear(x, w, bias, y);
    const int64_t T = x.dim(0), in = x.row_size(), out = w.dim(0);
    if (T == 0) return;
    const float* b = bias.empty() ? nullptr : bias.ptr<float>();
    if (T == 1 && w.dtype == DType::F32) {  // one token: OpenBLAS's matrix-vector product is tuned for exactly this
      if (b) std::memcpy(y.data, b, size_t(out) * 4);
      std::lock_guard<BlasTurns> turn(blas_turns());
      cblas_sgemv(CblasRowMajor, CblasNoTrans, int(out), int(in), 1.0f, w.ptr<float>(), int(in), x.ptr<float>(), 1,
                  b ? 1.0f : 0.0f, y.ptr<float>(), 1);
      return;
    }
    if (streams(T, w)) return run_streamed({streamed(x, w, b, y)});
    if (w.quantized()) return linear_quantized_blocks(x, w, b, y);
    if (w.dtype == DType::F16) return linear_16bit_blocks<f16>(x, w, b, y);
    if (w.dtype == DType::BF16) return linear_16bit_blocks<bf16>(x, w, b, y);
    float beta = 0.0f;
    if (b) {  // BLAS adds to y when beta = 1, so y starts as the bias
      for (int64_t t = 0; t < T; ++t) std::memcpy(y.ptr<float>() + t * out, b, size_t(out) * 4);
      beta = 1.0f;
    }
    std::lock_guard<BlasTurns> turn(blas_turns());
    sgemm_xwt(T, out, in, x.ptr<float>(), w.ptr<float>(), beta, y.ptr<float>(), out);
  }

  // The jobs that linear() would stream share one parallel region, each output row computed as
  // linear() computes it; the others (a single fp32 token, for sgemv; more tokens than stream) run
  // one linear() each.
  void linears(const std::vector<LinearJob>& jobs) override {
    std::vector<StreamedLinear> few;
    std::vector<std::vector<float>> biases(jobs.size());  // widened to fp32, alive until run_streamed
    for (size_t i = 0; i < jobs.size(); ++i) {
      const LinearJob& j = jobs[i];
      const Tensor bias = widened(j.b, biases[i], "bias");
      check_linear(j.x, j.w, bias, j.y);
      const int64_t T = j.x.dim(0);
      if (T == 0) continue;
      if (streams(T, j.w)) few.push_back(streamed(j.x, j.w, bias.empty() ? nullptr : bias.ptr<float>(), j.y));
      else linear(j.x, j.w, j.b, j.y);
    }
    run_streamed(few);
  }

  void add(const Tensor& a, const Tensor& b, const Tensor& out) override {
    check_f32(a, "a");
    check_f32(b, "b");
    check_f32(out, "out");
    STRATA_CHECK(a.numel() == b.numel() && a.numel() == out.numel(), "add: sizes differ");
    const float *pa = a.ptr<float>(), *pb = b.ptr<float>();
    float* po = out.ptr<float>();
    for_elements(a.numel(), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) po[i] = pa[i] + pb[i];
    });
  }

  void activation(Activation act, const Tensor& x) override {
    check_f32(x, "x");
    float* p = x.ptr<float>();
    const int64_t n = x.numel();
    for_elements(n, [&](int64_t i0, int64_t i1) {
      switch (act) {
        case Activation::ReLU:
          for (int64_t i = i0; i < i1; ++i) p[i] = std::max(p[i], 0.0f);
          break;
        case Activation::GELU:  // exact erf form, as transformers' "gelu"
          cpu::gelu_inplace(p + i0, i1 - i0);
          break;
      }
    });
  }

  // split_qkv's pass with each token's k and v rows written where kv_rows(t) points.
  template <class KvRows>
  void split_qkv_into(const Tensor& qkv, const Tensor& positions, const Tensor& inv_freq, const Tensor& q,
                      int64_t kv_heads, KvRows kv_rows) {
    check_f32(qkv, "qkv");
    check_f32(q, "q");
    check_i32(positions, "positions");
    const int64_t T = q.dim(0), qd = q.row_size(), d = q.dim(2), kvd = kv_heads * d;
    STRATA_CHECK(q.ndim == 3 && qkv.dim(0) == T && qkv.row_size() == qd + 2 * kvd && positions.numel() == T,
                 "split_qkv: qkv " << qkv.shape_str() << " q " << q.shape_str() << " for " << kv_heads << " kv heads");
    const bool rotate = !inv_freq.empty();
    if (rotate) {
      check_f32(inv_freq, "inv_freq");
      STRATA_CHECK(inv_freq.numel() * 2 == d, "split_qkv: inv_freq " << inv_freq.shape_str());
    }
    for (int64_t t = 0; t < T; ++t) kv_rows(t);  // checks every destination before any write
    pool_.parallel_for(T, [&](int64_t t0, int64_t t1) {
      std::optional<RopeAngles> angles;
      if (rotate) angles.emplace(inv_freq);
      for (int64_t t = t0; t < t1; ++t) {
        const float* src = qkv.ptr<float>() + t * (qd + 2 * kvd);
        float* qt = q.ptr<float>() + t * qd;
        const auto [kt, vt] = kv_rows(t);
        if (rotate) {
          angles->at(positions.ptr<int32_t>()[t]);
          angles->rotate(src, qt, q.dim(1), d);
          angles->rotate(src + qd, kt, kv_heads, d);
        } else {
          std::memcpy(qt, src, size_t(qd) * 4);
          std::memcpy(kt, src + qd, size_t(kvd) * 4);
        }
        std::memcpy(vt, src + qd + kvd, size_t(kvd) * 4);
      }
    });
  }

  void check_norm(const char* op, const Tensor& x, const Tensor& w, const Tensor& out) {
    check_f32(x, "x");
    check_f32(w, "w");
    check_f32(out, "out");
    STRATA_CHECK(w.numel() == x.row_size() && out.numel() == x.numel(), op << ": x " << x.shape_str() << " w "
                                                                           << w.shape_str() << " out " << out.shape_str());
  }

  // Row r of out = the norm of x's row r (statistics in double).
  static void norm_row(const Tensor& x, Norm norm, const Tensor& w, const Tensor& b, float eps, float w_offset,
                       const Tensor& out, int64_t r) {
    const int64_t h = x.row_size();
    const float* xr = x.ptr<float>() + r * h;
    const float* wr = w.ptr<float>();
    float* o = out.ptr<float>() + r * h;
    if (norm == Norm::Rms) {
      double ss = 0;
      for (int64_t i = 0; i < h; ++i) ss += double(xr[i]) * xr[i];
      const float inv = float(1.0 / std::sqrt(ss / double(h) + eps));
      for (int64_t i = 0; i < h; ++i) o[i] = xr[i] * inv * (w_offset + wr[i]);
      return;
    }
    const float* bias = b.empty() ? nullptr : b.ptr<float>();
    double mean = 0, var = 0;
    for (int64_t i = 0; i < h; ++i) mean += xr[i];
    mean /= double(h);
    for (int64_t i = 0; i < h; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    var /= double(h);
    const float inv = float(1.0 / std::sqrt(var + eps));
    for (int64_t i = 0; i < h; ++i) o[i] = (xr[i] - float(mean)) * inv * wr[i] + (bias ? bias[i] : 0.0f);
  }

  // out[t, i] = combine(gate_up[t, i], gate_up[t, f + i]): gate(g) * up for swiglu and geglu.
  template <class Combine>
  void gated(const Tensor& gate_up, const Tensor& out, const char* op, Combine combine) {
    check_f32(gate_up, "gate_up");
    check_f32(out, "out");
    const int64_t T = out.dim(0), f = out.row_size();
    STRATA_CHECK(gate_up.dim(0) == T && gate_up.row_size() == 2 * f && out.data != gate_up.data,
                 op << ": gate_up " << gate_up.shape_str() << " out " << out.shape_str());
    pool_.parallel_for(T, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const float *g = gate_up.ptr<float>() + t * 2 * f, *u = g + f;
        float* o = out.ptr<float>() + t * f;
        for (int64_t i = 0; i < f; ++i) o[i] = combine(g[i], u[i]);
      }
    });
  }

  void swiglu(const Tensor& gate_up, const Tensor& out) override {
    gated(gate_up, out, "swiglu", [](float g, float u) { return g / (1.0f + std::exp(-g)) * u; });
  }

  void geglu(const Tensor& gate_up, const Tensor& out) override {
    gated(gate_up, out, "geglu", [](float g, float u) { return gelu_tanh(g) * u; });
  }

  void clamped_swiglu(const Tensor& gate_up, const Tensor& out, float limit, float alpha) override {
    gated(gate_up, out, "clamped_swiglu", [limit, alpha](float g, float u) {
      g = std::min(g, limit);
      return (std::clamp(u, -limit, limit) + 1.0f) * (g / (1.0f + std::exp(-alpha * g)));
    });
  }

  void scale(const Tensor& x, float s) override {
    check_f32(x, "x");
    float* p = x.ptr<float>();
    for_elements(x.numel(), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) p[i] *= s;
    });
  }

  void soft_cap(const Tensor& x, float cap) override {
    check_f32(x, "x");
    STRATA_CHECK(cap > 0.0f, "soft_cap: cap " << cap << " is not positive");
    float* p = x.ptr<float>();
    for_elements(x.numel(), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) p[i] = cap * std::tanh(p[i] / cap);
    });
  }

  void rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq) override {
    check_f32(x, "x");
    check_i32(positions, "positions");
    check_f32(inv_freq, "inv_freq");
    STRATA_CHECK(x.ndim == 3 && positions.numel() == x.dim(0) && inv_freq.numel() * 2 == x.dim(2),
                 "rope: x " << x.shape_str() << " inv_freq " << inv_freq.shape_str());
    const int64_t heads = x.dim(1), d = x.dim(2);
    pool_.parallel_for(x.dim(0), [&](int64_t t0, int64_t t1) {
      RopeAngles angles(inv_freq);
      for (int64_t t = t0; t < t1; ++t) {
        angles.at(positions.ptr<int32_t>()[t]);
        float* xt = x.ptr<float>() + t * heads * d;
        angles.rotate(xt, xt, heads, d);
      }
    });
  }

  void split_qkv(const Tensor& qkv, const Tensor& positions, const Tensor& inv_freq, const Tensor& q, const Tensor& k,
                 const Tensor& v) override {
    check_f32(k, "k");
    check_f32(v, "v");
    const int64_t kvd = k.row_size();
    STRATA_CHECK(k.ndim == 3 && v.ndim == 3 && k.dim(0) == q.dim(0) && v.dim(0) == q.dim(0) && v.row_size() == kvd &&
                     k.dim(2) == q.dim(2),
                 "split_qkv: q " << q.shape_str() << " k " << k.shape_str() << " v " << v.shape_str());
    split_qkv_into(qkv, positions, inv_freq, q, k.dim(1), [&](int64_t t) {
      return std::pair{k.ptr<float>() + t * kvd, v.ptr<float>() + t * kvd};
    });
  }

  void split_qkv_store(const Tensor& qkv, const Tensor& positions, const Tensor& inv_freq, const Tensor& q,
                       const Tensor& slots, const Tensor& cache_k, const Tensor& cache_v) override {
    if (cache_k.quantized() || cache_v.quantized()) {
      // No launch to save on the CPU: split into scratch rows, then quantize them as kv_store does.
      const int64_t T = q.dim(0), kvd = cache_k.dim(2) * cache_k.dim(3);
      std::vector<float> k(size_t(T * kvd)), v(k.size());
      split_qkv_into(qkv, positions, inv_freq, q, cache_k.dim(2),
                     [&](int64_t t) { return std::pair{k.data() + t * kvd, v.data() + t * kvd}; });
      const Tensor kt(k.data(), DType::F32, Device::CPU, {T, cache_k.dim(2), cache_k.dim(3)});
      const Tensor vt(v.data(), DType::F32, Device::CPU, {T, cache_k.dim(2), cache_k.dim(3)});
      return kv_store(kt, vt, cache_k, cache_v, slots, positions);
    }
    check_f32(cache_k, "cache_k");
    check_f32(cache_v, "cache_v");
    check_i32(slots, "slots");
    STRATA_CHECK(cache_k.ndim == 4 && cache_k.shape == cache_v.shape && cache_k.dim(3) == q.dim(2) &&
                     slots.numel() == q.dim(0),
                 "split_qkv_store: q " << q.shape_str() << " caches " << cache_k.shape_str());
    const int64_t S = cache_k.dim(0), C = cache_k.dim(1), kvd = cache_k.dim(2) * cache_k.dim(3);
    split_qkv_into(qkv, positions, inv_freq, q, cache_k.dim(2), [&](int64_t t) {
      const int32_t s = slots.ptr<int32_t>()[t], p = positions.ptr<int32_t>()[t];
      STRATA_CHECK(s >= 0 && s < S && p >= 0 && p < C, "split_qkv_store: slot " << s << " position " << p
                                                                                 << " outside the cache");
      const int64_t row = (int64_t(s) * C + p) * kvd;
      return std::pair{cache_k.ptr<float>() + row, cache_v.ptr<float>() + row};
    });
  }

  void kv_store(const Tensor& k, const Tensor& v, const Tensor& cache_k, const Tensor& cache_v, const Tensor& slots,
                const Tensor& positions) override {
    if (cache_k.quantized()) return kv_store_quantized(k, v, cache_k, cache_v, slots, positions);
    check_f32_or_16bit(k, "k");
    check_f32_or_16bit(v, "v");
    check_f32_or_16bit(cache_k, "cache_k");
    check_f32_or_16bit(cache_v, "cache_v");
    check_same_dtype(k, "k", v, "v");
    check_same_dtype(cache_k, "cache_k", cache_v, "cache_v");
    check_i32(slots, "slots");
    check_i32(positions, "positions");
    const int64_t S = cache_k.dim(0), C = cache_k.dim(1), row = cache_k.dim(2) * cache_k.dim(3);
    STRATA_CHECK(cache_k.ndim == 4 && k.row_size() == row && v.row_size() == row && slots.numel() == k.dim(0),
                 "kv_store: k " << k.shape_str() << " cache " << cache_k.shape_str());
    const size_t src_row = size_t(row) * dtype_size(k.dtype), dst_row = size_t(row) * dtype_size(cache_k.dtype);
    for (int64_t t = 0; t < k.dim(0); ++t) {
      const int32_t s = slots.ptr<int32_t>()[t], p = positions.ptr<int32_t>()[t];
      STRATA_CHECK(s >= 0 && s < S && p >= 0 && p < C, "kv_store: slot " << s << " position " << p << " outside cache");
      const size_t dst = size_t(s * C + p) * dst_row, src = size_t(t) * src_row;
      copy_converted(k.ptr<char>() + src, k.dtype, cache_k.ptr<char>() + dst, cache_k.dtype, row);
      copy_converted(v.ptr<char>() + src, v.dtype, cache_v.ptr<char>() + dst, cache_v.dtype, row);
    }
  }

  // q and out share one dtype, cache_k and cache_v another; each may be F32, F16 or BF16.
  void attention(const Tensor& q, const Tensor& cache_k, const Tensor& cache_v, const Tensor& slots,
                 const Tensor& positions, const AttentionSpec& spec, const Tensor& out) override {
    check_f32_or_16bit(q, "q");
    check_f32_or_16bit(out, "out");
    if (cache_k.quantized()) {
      check_quantized(cache_k, "cache_k");
      check_quantized(cache_v, "cache_v");
      STRATA_CHECK(cache_k.dtype == cache_v.dtype && cache_k.group == cache_v.group, "attention: cache_k and cache_v differ");
    } else {
      check_f32_or_16bit(cache_k, "cache_k");
      check_f32_or_16bit(cache_v, "cache_v");
      check_same_dtype(cache_k, "cache_k", cache_v, "cache_v");
    }
    check_same_dtype(q, "q", out, "out");
    check_i32(slots, "slots");
    check_i32(positions, "positions");
    STRATA_CHECK(q.ndim == 3 && cache_k.ndim == 4 && cache_k.dim(3) == q.dim(2) && q.dim(1) % cache_k.dim(2) == 0 &&
                     out.numel() == q.numel() && slots.numel() == q.dim(0) && positions.numel() == q.dim(0),
                 "attention: q " << q.shape_str() << " cache " << cache_k.shape_str());
    // Prefill runs attend a tile of queries at a time; decode tokens stream the cache.
    const std::vector<cpu::QueryRun> runs = cpu::query_runs(slots.ptr<int32_t>(), positions.ptr<int32_t>(), q.dim(0));
    if (cpu::has_prefill_run(runs)) return cpu::attend_runs(pool_, q, cache_k, cache_v, runs, spec, out);
    cpu::with_element(q.dtype, [&](auto q_element) {
      using Q = decltype(q_element);
      if (cache_k.quantized()) return attend<Q, QuantRow>(q, cache_k, cache_v, slots, positions, spec, out);
      cpu::with_element(cache_k.dtype, [&](auto cache_element) {
        attend<Q, decltype(cache_element)>(q, cache_k, cache_v, slots, positions, spec, out);
      });
    });
  }

  void gather_rows(const Tensor& x, const Tensor& rows, const Tensor& out) override {
    check_f32(x, "x");
    check_i32(rows, "rows");
    check_f32(out, "out");
    const int64_t h = x.row_size();
    STRATA_CHECK(out.dim(0) == rows.numel() && out.row_size() == h, "gather_rows: out " << out.shape_str());
    for (int64_t i = 0; i < rows.numel(); ++i) {
      const int32_t r = rows.ptr<int32_t>()[i];
      STRATA_CHECK(r >= 0 && r < x.dim(0), "gather_rows: row " << r << " outside " << x.shape_str());
      std::memcpy(out.ptr<float>() + i * h, x.ptr<float>() + r * h, size_t(h) * 4);
    }
  }

  void combine_rows(const Tensor& src, const Tensor& rows, const Tensor& weights, const Tensor& out) override {
    check_f32(src, "src");
    check_i32(rows, "rows");
    check_f32(weights, "weights");
    check_f32(out, "out");
    const int64_t T = out.dim(0), h = out.row_size(), k = rows.row_size();
    STRATA_CHECK(rows.dim(0) == T && weights.dim(0) == T && weights.row_size() == k && src.row_size() == h &&
                     src.data != out.data,
                 "combine_rows: src " << src.shape_str() << " rows " << rows.shape_str() << " weights "
                                      << weights.shape_str() << " out " << out.shape_str());
    for (int64_t i = 0; i < rows.numel(); ++i) {
      const int32_t r = rows.ptr<int32_t>()[i];
      STRATA_CHECK(r >= 0 && r < src.dim(0), "combine_rows: row " << r << " outside " << src.shape_str());
    }
    pool_.parallel_for(T, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        float* o = out.ptr<float>() + t * h;
        std::fill(o, o + h, 0.0f);
        for (int64_t j = 0; j < k; ++j) {
          const float wj = weights.ptr<float>()[t * k + j];
          const float* x = src.ptr<float>() + int64_t(rows.ptr<int32_t>()[t * k + j]) * h;
          for (int64_t i = 0; i < h; ++i) o[i] += wj * x[i];
        }
      }
    });
  }

  void quantize_rows(const quant::QuantSpec& spec, const Tensor& x, void* q) override {
    STRATA_CHECK(x.device == Device::CPU && x.ndim >= 1, "quantize_rows: x must be a tensor on the CPU");
    const int64_t n = x.dim(x.ndim - 1), rows = n > 0 ? x.numel() / n : 0;
    if (rows == 0) return;
    const size_t row_bytes = quant::row_bytes(spec, n), es = dtype_size(x.dtype);
    pool_.parallel_for(rows, [&](int64_t r0, int64_t r1) {
      quant::quantize_rows(spec, static_cast<const char*>(x.data) + size_t(r0 * n) * es, x.dtype, r1 - r0, n,
                           static_cast<char*>(q) + size_t(r0) * row_bytes);
    });
  }

  void dequantize_rows(const quant::QuantSpec& spec, const void* q, const Tensor& out) override {
    STRATA_CHECK(out.device == Device::CPU && out.ndim >= 1, "dequantize_rows: out must be a tensor on the CPU");
    const int64_t n = out.dim(out.ndim - 1), rows = n > 0 ? out.numel() / n : 0;
    if (rows == 0) return;
    const size_t row_bytes = quant::row_bytes(spec, n), es = dtype_size(out.dtype);
    pool_.parallel_for(rows, [&](int64_t r0, int64_t r1) {
      if (out.dtype == DType::F32) {  // the SIMD path, equal to the reference to the bit
        for (int64_t r = r0; r < r1; ++r)
          cpu::dequantize_row_f32(static_cast<const uint8_t*>(q) + size_t(r) * row_bytes, spec.bits, spec.group_size, n,
                                  out.ptr<float>() + r * n);
        return;
      }
      quant::dequantize_rows(spec, static_cast<const char*>(q) + size_t(r0) * row_bytes, r1 - r0, n,
                             static_cast<char*>(out.data) + size_t(r0 * n) * es, out.dtype);
    });
  }

  void argmax_rows(const Tensor& logits, const Tensor& out) override {
    check_f32(logits, "logits");
    check_i32(out, "out");
    const int64_t V = logits.row_size();
    STRATA_CHECK(out.numel() == logits.dim(0), "argmax_rows: out " << out.shape_str());
    for (int64_t r = 0; r < logits.dim(0); ++r) {
      const float* l = logits.ptr<float>() + r * V;
      out.ptr<int32_t>()[r] = int32_t(std::max_element(l, l + V) - l);  // first maximum on ties
    }
  }

private:
  // An elementwise loop over n values, fn(begin, end): on the pool when there are enough values to
  // pay for waking it (a prefill's MLP activations), inline for a few decode rows. Each value's
  // result is the same either way.
  template <class F>
  void for_elements(int64_t n, F fn) {
    constexpr int64_t kPoolMin = int64_t(1) << 15;
    if (n < kPoolMin) fn(int64_t(0), n);
    else pool_.parallel_for(n, fn);
  }

  // Whether linear() streams T tokens over w: within cpu_linear::streamed_max_tokens, but a single
  // fp32 token, which OpenBLAS's sgemv serves.
  static bool streams(int64_t T, const Tensor& w) {
    return T <= cpu_linear::streamed_max_tokens(w.quantized()) && !(T == 1 && w.dtype == DType::F32);
  }

  // A linear over few tokens (at most cpu_linear::streamed_max_tokens) that computes each output
  // row on its own: rows(o0, o1) writes y's columns [o0, o1) for every token, reading those weight
  // rows once. A range starts at a multiple of `align` (the codes kernel's blocks of rows), so a
  // row's arithmetic does not depend on how the rows are shared among threads.
  struct StreamedLinear {
    int64_t out = 0, align = 1;
    std::function<void(int64_t, int64_t)> rows;
  };

  // The streamed form of y = x @ w^T + b (linear() checked the arguments): each weight row read
  // once against every token, as fp32 or 16-bit values (widened in registers), or as codes, in
  // place (streamed_codes) or each row dequantized into an fp32 row first.
  static StreamedLinear streamed(const Tensor& x, const Tensor& w, const float* b, const Tensor& y) {
    if (w.dtype == DType::F16) return streamed_rows(x, w.ptr<f16>(), b, y);
    if (w.dtype == DType::BF16) return streamed_rows(x, w.ptr<bf16>(), b, y);
    if (!w.quantized()) return streamed_rows(x, w.ptr<float>(), b, y);
    const quant::QuantSpec spec = quant::spec_of(w);
    const int64_t in = x.row_size(), out = w.dim(0);
    if (cpu::codes_row_ok(spec.group_size, in)) return streamed_codes(x, w, b, y, spec);
    const size_t row_bytes = quant::row_bytes(spec, in);
    const uint8_t* codes = w.ptr<uint8_t>();
    const int64_t T = x.dim(0);
    const float* xp = x.ptr<float>();
    float* yp = y.ptr<float>();
    return {out, 1, [=](int64_t o0, int64_t o1) {
              std::vector<float> wr(static_cast<size_t>(in));
              for (int64_t o = o0; o < o1; ++o) {
                cpu::dequantize_row_f32(codes + size_t(o) * row_bytes, spec.bits, spec.group_size, in, wr.data());
                row_times_tokens(xp, T, in, wr.data(), b, o, yp, out);
              }
            }};
  }

  template <class W>
  static StreamedLinear streamed_rows(const Tensor& x, const W* wp, const float* b, const Tensor& y) {
    const int64_t T = x.dim(0), in = x.row_size(), out = y.row_size();
    const float* xp = x.ptr<float>();
    float* yp = y.ptr<float>();
    return {out, 1, [=](int64_t o0, int64_t o1) {
              if (T > 1) {
                for (int64_t o = o0; o < o1; ++o) row_times_tokens(xp, T, in, wp + o * in, b, o, yp, out);
                return;
              }
              // One token (over 16-bit weights; fp32 goes to sgemv): rows in blocks that share its loads.
              for (int64_t o = o0; o < o1; o += cpu::kDotPairs) {
                const int count = int(std::min<int64_t>(cpu::kDotPairs, o1 - o));
                const W* rows[cpu::kDotPairs];
                for (int r = 0; r < count; ++r) rows[r] = wp + (o + r) * in;
                cpu::dot_pairs(xp, 1, rows, count, in, yp + o, 1);
                for (int r = 0; r < count; ++r) yp[o + r] = (b ? b[o + r] : 0.0f) + yp[o + r];
              }
            }};
  }

  // y[t, o] = b[o] + x_t . row for each of the T tokens: output column o of a streamed linear,
  // the tokens in blocks of up to cpu::kDotPairs that share each widening of the row.
  template <class W>
  static void row_times_tokens(const float* x, int64_t T, int64_t in, const W* row, const float* b, int64_t o, float* y,
                               int64_t out) {
    const int64_t blocks = (T + cpu::kDotPairs - 1) / cpu::kDotPairs;
    for (int64_t k = 0, t0 = 0; k < blocks; ++k) {
      const int queries = int(T / blocks + (k < T % blocks ? 1 : 0));  // 8 tokens: 3, 3, 2
      cpu::dot_pairs(x + t0 * in, queries, &row, 1, in, y + t0 * out + o, out);
      t0 += queries;
    }
    for (int64_t t = 0; t < T; ++t) y[t * out + o] = (b ? b[o] : 0.0f) + y[t * out + o];
  }

  // Over codes that can be read in place (cpu_quant.h): y[t, o] is sum_g s_g (x_t . c_g) + m_g (sum
  // of x_t over g), each token in code order with its group sums computed once, here, and the
  // weight rows read as codes in blocks of cpu::kBlock (token, row) pairs: four rows for one
  // token, else up to four tokens sharing each widening of a row.
  static StreamedLinear streamed_codes(const Tensor& x, const Tensor& w, const float* bias, const Tensor& y,
                                       const quant::QuantSpec& spec) {
    const int64_t T = x.dim(0), in = x.row_size(), out = w.dim(0);
    const int64_t groups = (in + spec.group_size - 1) / spec.group_size;
    const size_t row_bytes = quant::row_bytes(spec, in);
    auto coded = std::make_shared<std::vector<float>>(size_t(T * in));
    auto sums = std::make_shared<std::vector<float>>(size_t(T * groups));
    for (int64_t t = 0; t < T; ++t)
      cpu::to_coded_query(spec.bits, spec.group_size, x.ptr<float>() + t * in, in, coded->data() + t * in,
                          sums->data() + t * groups);
    const uint8_t* codes = w.ptr<uint8_t>();
    float* yp = y.ptr<float>();
    return {out, cpu::kBlock, [=](int64_t o0, int64_t o1) {
              for (int64_t o = o0; o < o1; o += cpu::kBlock) {
                const int64_t chunk = std::min<int64_t>(cpu::kBlock, o1 - o);
                const uint8_t* rows[cpu::kBlock];
                for (int64_t r = 0; r < chunk; ++r) rows[r] = codes + size_t(o + r) * row_bytes;
                for (int64_t t0 = 0; t0 < T; t0 += cpu::kBlock) {
                  const int queries = int(std::min<int64_t>(cpu::kBlock, T - t0)), per_block = cpu::kBlock / queries;
                  for (int64_t r = 0; r < chunk; r += per_block)
                    cpu::dot_packed_codes(coded->data() + t0 * in, sums->data() + t0 * groups, queries, rows + r,
                                          int(std::min<int64_t>(per_block, chunk - r)), spec.bits, spec.group_size,
                                          in, yp + t0 * out + o + r, out);
                }
                if (bias)
                  for (int64_t t = 0; t < T; ++t)
                    for (int64_t r = 0; r < chunk; ++r) yp[t * out + o + r] += bias[o + r];
              }
            }};
  }

  // One parallel region over the rows of every linear in `work`, in units of about a 16th of a
  // thread's share (rounded up to each linear's alignment; a unit never spans two linears): one
  // wake of the pool for a step's small experts instead of one each.
  void run_streamed(const std::vector<StreamedLinear>& work) {
    int64_t rows = 0;
    for (const StreamedLinear& l : work) rows += l.out;
    if (rows == 0) return;
    const int64_t target = std::max<int64_t>(1, rows / (int64_t(pool_.size()) * 16));
    std::vector<int64_t> unit(work.size()), first_unit(work.size() + 1, 0);
    for (size_t i = 0; i < work.size(); ++i) {
      unit[i] = (target + work[i].align - 1) / work[i].align * work[i].align;
      first_unit[i + 1] = first_unit[i] + (work[i].out + unit[i] - 1) / unit[i];
    }
    pool_.parallel_for(first_unit.back(), [&](int64_t u0, int64_t u1) {
      size_t i = size_t(std::upper_bound(first_unit.begin(), first_unit.end(), u0) - first_unit.begin()) - 1;
      while (u0 < u1) {
        while (first_unit[i + 1] <= u0) ++i;
        const int64_t last = std::min(u1, first_unit[i + 1]);
        work[i].rows((u0 - first_unit[i]) * unit[i], std::min(work[i].out, (last - first_unit[i]) * unit[i]));
        u0 = last;
      }
    });
  }

  // y = x @ w^T + b over 16-bit weights W (f16 or bf16: the GPU's copy, computed where it lives)
  // for more tokens than stream: blocks of rows widened for sgemm.
  template <class W>
  void linear_16bit_blocks(const Tensor& x, const Tensor& w, const float* b, const Tensor& y) {
    const int64_t in = x.row_size();
    const W* wp = w.ptr<W>();
    linear_widened_blocks(x, b, y, w.dim(0), [&](int64_t r0, int64_t n, float* rows) { cpu::to_f32(wp + r0 * in, rows, n * in); });
  }

  // y = x @ w^T + bias over weights that sgemm cannot read (16-bit or codes), for enough tokens
  // that widening them first pays: blocks of about 16 MB of fp32 rows, widened on the pool by
  // widen(first_row, rows, out), then one sgemm a block, whose packing amortizes over T tokens.
  template <class Widen>
  void linear_widened_blocks(const Tensor& x, const float* b, const Tensor& y, int64_t out, Widen widen) {
    const int64_t T = x.dim(0), in = x.row_size();
    float* yp = y.ptr<float>();
    const int64_t block = std::max<int64_t>(64, (int64_t(1) << 22) / std::max<int64_t>(in, 1));
    float* rows = widened_rows(size_t(std::min(block, out) * in));
    std::lock_guard<BlasTurns> turn(blas_turns());
    for (int64_t o = 0; o < out; o += block) {
      const int64_t n = std::min(block, out - o);
      pool_.parallel_for(n, [&](int64_t r0, int64_t r1) { widen(o + r0, r1 - r0, rows + r0 * in); });
      for (int64_t t = 0; t < T; ++t)
        for (int64_t r = 0; r < n; ++r) yp[t * out + o + r] = b ? b[o + r] : 0.0f;
      sgemm_xwt(T, n, in, x.ptr<float>(), rows, 1.0f, yp + o, out);
    }
  }

  // The calling thread's buffer for widened weight rows, kept between calls: a fresh one (up to
  // 16 MB) pays its zeroing and page faults on every call, which a small expert's linear feels.
  static float* widened_rows(size_t n) {
    thread_local std::unique_ptr<float[]> buffer;
    thread_local size_t capacity = 0;
    if (capacity < n) {
      buffer.reset(new float[n]);
      capacity = n;
    }
    return buffer.get();
  }

  // y = x @ dequantized(w)^T + b for more tokens than the codes are read for: blocks of
  // dequantized rows through sgemm, so a CPU computing an expert over a prefill's tokens (the
  // engine's cpu_experts) runs near sgemm's rate, not the dot products'.
  void linear_quantized_blocks(const Tensor& x, const Tensor& w, const float* b, const Tensor& y) {
    const int64_t in = x.row_size();
    const quant::QuantSpec spec = quant::spec_of(w);
    const size_t row_bytes = quant::row_bytes(spec, in);
    linear_widened_blocks(x, b, y, w.dim(0), [&](int64_t r0, int64_t n, float* rows) {
      for (int64_t r = 0; r < n; ++r)
        cpu::dequantize_row_f32(w.ptr<uint8_t>() + size_t(r0 + r) * row_bytes, spec.bits, spec.group_size, in,
                                rows + r * in);
    });
  }

  // kv_store into quantized caches: each (token, kv head) row is quantized by the reference.
  void kv_store_quantized(const Tensor& k, const Tensor& v, const Tensor& cache_k, const Tensor& cache_v,
                          const Tensor& slots, const Tensor& positions) {
    check_f32_or_16bit(k, "k");
    check_f32_or_16bit(v, "v");
    check_same_dtype(k, "k", v, "v");
    check_quantized(cache_k, "cache_k");
    check_quantized(cache_v, "cache_v");
    check_i32(slots, "slots");
    check_i32(positions, "positions");
    STRATA_CHECK(cache_k.dtype == cache_v.dtype && cache_k.group == cache_v.group, "kv_store: cache_k and cache_v differ");
    const int64_t S = cache_k.dim(0), C = cache_k.dim(1), heads = cache_k.dim(2), d = cache_k.dim(3);
    STRATA_CHECK(cache_k.ndim == 4 && k.row_size() == heads * d && v.row_size() == heads * d && slots.numel() == k.dim(0),
                 "kv_store: k " << k.shape_str() << " cache " << cache_k.shape_str());
    const quant::QuantSpec spec = quant::spec_of(cache_k);
    const size_t src_row = size_t(heads * d) * dtype_size(k.dtype), dst_row = size_t(heads) * quant::row_bytes(spec, d);
    for (int64_t t = 0; t < k.dim(0); ++t) {
      const int32_t s = slots.ptr<int32_t>()[t], p = positions.ptr<int32_t>()[t];
      STRATA_CHECK(s >= 0 && s < S && p >= 0 && p < C, "kv_store: slot " << s << " position " << p << " outside cache");
      const size_t dst = size_t(s * C + p) * dst_row, src = size_t(t) * src_row;
      quant::quantize_rows(spec, k.ptr<char>() + src, k.dtype, heads, d, cache_k.ptr<char>() + dst);
      quant::quantize_rows(spec, v.ptr<char>() + src, v.dtype, heads, d, cache_v.ptr<char>() + dst);
    }
  }

  // Decode attention() (one token per sequence; prefill runs go to cpu_prefill_attention.cpp) with
  // q and out of element type Q (float, f16 or bf16) and caches of element type Cache (the same,
  // or QuantRow for quantized rows), arguments already checked; scores, softmax and the weighted
  // sum of values in fp32. Decode attention is bound by reading the cache, so the loop is shaped by
  // memory (docs/offload.md, "CPU attention"):
  // - A work item is one token and a run of consecutive kv heads with all of their query heads,
  //   so a key or value row is read once for its whole grouped-query group, and the run's rows of
  //   one position are adjacent in memory ([S, C, kv_heads, d]); the next positions' rows are
  //   prefetched, since a walk over positions strides kv_heads rows and the hardware prefetcher
  //   does not follow it across pages.
  // - Keys are visited in tiles of kTile with an online softmax (running max and denominator per
  //   query row), so the scores stay in L1 whatever the context; exponentials eight at a time.
  // - Rows are read as stored. fp16 and bf16 rows are widened in registers (F16C for fp16, a
  //   shift for bf16), in blocks of up to cpu::kBlock (query, position) pairs of one kv head: a
  //   grouped-query group's queries, else four positions. Each widening of a row serves the
  //   block's queries, and the rows share the queries' loads (or the outputs' loads and stores).
  //   fp32 rows: one dot per pair.
  // - Quantized rows are read as codes (cpu_quant.h), in the same blocks: the queries and the
  //   output are kept in code order, a score is sum_g s_g (q . c) + m_g (sum of q over g), and the
  //   minimums' share of the output is summed per group and added at the end. Head dims that are
  //   not multiples of 16 dequantize each row into an fp32 scratch row by the reference formula
  //   instead, one position at a time.
  template <class Q, class Cache>
  void attend(const Tensor& q, const Tensor& cache_k, const Tensor& cache_v, const Tensor& slots,
              const Tensor& positions, const AttentionSpec& scores, const Tensor& out) {
    constexpr bool quantized = std::is_same_v<Cache, QuantRow>;
    constexpr int64_t kTile = 64, kPrefetchAhead = 4;
    const int64_t T = q.dim(0), heads = q.dim(1), d = q.dim(2);
    const int64_t S = cache_k.dim(0), C = cache_k.dim(1), kv_heads = cache_k.dim(2);
    const int64_t group = heads / kv_heads;
    quant::QuantSpec spec;
    size_t row_bytes = size_t(d) * sizeof(std::conditional_t<quantized, uint8_t, Cache>);
    if constexpr (quantized) {
      spec = quant::spec_of(cache_k);
      row_bytes = quant::row_bytes(spec, d);
    }
    const size_t position_bytes = size_t(kv_heads) * row_bytes;
    const bool coded = quantized && cpu::codes_row_ok(spec.group_size, d);
    const int64_t code_groups = coded ? (d + spec.group_size - 1) / spec.group_size : 0;
    // Blocks of up to kBlock (query, position) pairs: the queries of a group first, the rest in
    // consecutive positions (4 without grouped queries).
    const int block_queries = int(std::min<int64_t>(group, cpu::kBlock));
    const int block_rows = cpu::kBlock / block_queries;
    // Enough runs per token that every thread gets a few items even for one token.
    const int64_t runs = std::clamp<int64_t>((4 * pool_.size() + T - 1) / T, 1, kv_heads);
    const int64_t run_heads = (kv_heads + runs - 1) / runs, runs_per_token = (kv_heads + run_heads - 1) / run_heads;
    const int64_t max_rows = run_heads * group;  // query rows of one item

    pool_.parallel_for(T * runs_per_token, [&](int64_t w0, int64_t w1) {
      auto floats = [](int64_t n) { return std::vector<float>(static_cast<size_t>(n)); };
      std::vector<float> qs = floats(max_rows * d), o = floats(max_rows * d), sc = floats(max_rows * kTile),
                         m = floats(max_rows), l = floats(max_rows), reorder = floats(coded ? d : 0),
                         widened = floats(quantized && !coded ? run_heads * d : 0),
                         q_sums = floats(max_rows * code_groups), min_sums = floats(max_rows * code_groups);
      for (int64_t w = w0; w < w1; ++w) {
        const int64_t t = w / runs_per_token, h0 = (w % runs_per_token) * run_heads;
        const int64_t run = std::min(run_heads, kv_heads - h0), rows = run * group;
        const int32_t s = slots.ptr<int32_t>()[t], p = positions.ptr<int32_t>()[t];
        STRATA_CHECK(s >= 0 && s < S && p >= 0 && p < C, "attention: slot " << s << " position " << p);
        const int64_t q0 = (t * heads + h0 * group) * d;  // the item's first query element
        cpu::to_f32(q.ptr<Q>() + q0, qs.data(), rows * d);
        if (coded)
          for (int64_t r = 0; r < rows; ++r) {
            float* qr = qs.data() + r * d;
            cpu::to_coded_query(spec.bits, spec.group_size, qr, d, reorder.data(), q_sums.data() + r * code_groups);
            std::copy(reorder.begin(), reorder.end(), qr);
          }
        std::fill(o.begin(), o.begin() + rows * d, 0.0f);
        std::fill(min_sums.begin(), min_sums.begin() + rows * code_groups, 0.0f);
        std::fill(m.begin(), m.begin() + rows, -INFINITY);
        std::fill(l.begin(), l.begin() + rows, 0.0f);
        const size_t first_row = size_t(s) * size_t(C) * position_bytes + size_t(h0) * row_bytes;
        const uint8_t* k_base = cache_k.ptr<uint8_t>() + first_row;
        const uint8_t* v_base = cache_v.ptr<uint8_t>() + first_row;
        const size_t run_bytes = size_t(run) * row_bytes;
        // Quantized rows whose codes cannot be read in place are dequantized into `widened`.
        const bool widen = quantized && !coded;
        // The run's rows at position j ([run, d]: dequantized, else as stored), prefetching
        // position j + kPrefetchAhead.
        auto run_rows = [&](const uint8_t* base, int64_t j) -> const void* {
          if (j + kPrefetchAhead <= p) {
            const char* ahead = reinterpret_cast<const char*>(base + size_t(j + kPrefetchAhead) * position_bytes);
            for (size_t b = 0; b < run_bytes; b += 64) __builtin_prefetch(ahead + b, 0, 3);
          }
          const uint8_t* row = base + size_t(j) * position_bytes;
          if (!widen) return row;
          for (int64_t h = 0; h < run; ++h)
            cpu::dequantize_row_f32(row + size_t(h) * row_bytes, spec.bits, spec.group_size, d, widened.data() + h * d);
          return widened.data();
        };
        // The tile's scores and weighted values for query rows r over run rows stored as Row
        // (float, f16, bf16 or PackedCodes; float for dequantized rows too), 16-bit rows and codes
        // in blocks of block_queries queries of a kv head by block_rows positions (`at`: their run
        // rows).
        auto tile = [&](auto row_kind, int64_t start, int64_t n) {
          using Row = decltype(row_kind);
          constexpr bool packed = std::is_same_v<Row, PackedCodes>;
          using Stored = std::conditional_t<packed, uint8_t, Row>;
          // fp32 rows need no widening to share, and one dot per (query, row) pair measured faster
          // than the blocks for them (bench/results/2026-11-26-cpu-attention-code-blocks.md).
          constexpr bool blocked = !std::is_same_v<Row, float>;
          const int step = blocked ? block_rows : 1;
          const void* at[cpu::kBlock];
          // Calls f(r, queries, head_rows) for each block: kv head h's rows at the block's count
          // positions and `queries` of its query rows from r on.
          auto for_each_block = [&](int count, auto&& f) {
            for (int64_t h = 0; h < run; ++h) {
              const Stored* head_rows[cpu::kBlock];
              for (int c = 0; c < count; ++c)
                head_rows[c] = reinterpret_cast<const Stored*>(static_cast<const uint8_t*>(at[c]) + size_t(h) * row_bytes);
              for (int64_t k = 0; k < group; k += block_queries)
                f(h * group + k, int(std::min<int64_t>(block_queries, group - k)), head_rows);
            }
          };
          for (int64_t j = 0; j < n; j += step) {
            const int count = int(std::min<int64_t>(step, n - j));
            for (int c = 0; c < count; ++c) at[c] = run_rows(k_base, start + j + c);
            if constexpr (blocked)
              for_each_block(count, [&](int64_t r, int queries, const Stored* const* head_rows) {
                float* scores = sc.data() + r * kTile + j;
                if constexpr (packed)
                  cpu::dot_packed_codes(qs.data() + r * d, q_sums.data() + r * code_groups, queries, head_rows, count,
                                        spec.bits, spec.group_size, d, scores, kTile);
                else
                  cpu::dot_block(qs.data() + r * d, queries, head_rows, count, d, scores, kTile);
              });
            else
              for (int64_t r = 0; r < rows; ++r)
                sc[size_t(r * kTile + j)] = cpu::dot(qs.data() + r * d, static_cast<const float*>(at[0]) + (r / group) * d, d);
            for (int64_t r = 0; r < rows; ++r)
              for (int c = 0; c < count; ++c) {
                float& score = sc[size_t(r * kTile + j + c)];
                score = scores.cap(score * scores.scale);
              }
          }
          for (int64_t r = 0; r < rows; ++r) {  // online softmax: the tile's weights, old sums rescaled
            float* row_sc = sc.data() + r * kTile;
            const float mx = std::max(m[size_t(r)], *std::max_element(row_sc, row_sc + n));
            const float alpha = std::exp(m[size_t(r)] - mx);  // 0 on the first tile
            l[size_t(r)] = l[size_t(r)] * alpha + cpu::exp_shifted_sum(row_sc, n, mx);
            m[size_t(r)] = mx;
            if (alpha != 1.0f) {
              for (float* x = o.data() + r * d; x != o.data() + (r + 1) * d; ++x) *x *= alpha;
              for (int64_t g = 0; g < code_groups; ++g) min_sums[size_t(r * code_groups + g)] *= alpha;
            }
          }
          for (int64_t j = 0; j < n; j += step) {
            const int count = int(std::min<int64_t>(step, n - j));
            for (int c = 0; c < count; ++c) at[c] = run_rows(v_base, start + j + c);
            if constexpr (blocked)
              for_each_block(count, [&](int64_t r, int queries, const Stored* const* head_rows) {
                const float* weights = sc.data() + r * kTile + j;
                if constexpr (packed)
                  cpu::axpy_packed_codes(weights, kTile, queries, head_rows, count, spec.bits, spec.group_size, d,
                                         o.data() + r * d, min_sums.data() + r * code_groups);
                else
                  cpu::axpy_block(weights, kTile, queries, head_rows, count, d, o.data() + r * d);
              });
            else
              for (int64_t r = 0; r < rows; ++r)
                cpu::axpy(sc[size_t(r * kTile + j)], static_cast<const float*>(at[0]) + (r / group) * d, o.data() + r * d, d);
          }
        };
        for (int64_t start = scores.first_key(p); start <= p; start += kTile) {
          const int64_t n = std::min<int64_t>(kTile, p + 1 - start);
          if (coded) tile(PackedCodes(), start, n);
          else if (widen) tile(float(), start, n);
          else if constexpr (!quantized) tile(Cache(), start, n);
        }
        for (int64_t r = 0; r < rows; ++r) {
          float* orow = o.data() + r * d;
          if (coded) {  // back to element order, each group's share of the minimums added
            cpu::from_code_order(spec.bits, orow, d, reorder.data());
            for (int64_t i = 0; i < d; ++i) orow[i] = reorder[size_t(i)] + min_sums[size_t(r * code_groups + i / spec.group_size)];
          }
          const float* sink = scores.sinks ? scores.sinks + h0 * group + r : nullptr;
          const float inv = softmax_normalizer(m[size_t(r)], l[size_t(r)], sink);
          for (float* x = orow; x != orow + d; ++x) *x *= inv;
        }
        cpu::from_f32(o.data(), out.ptr<Q>() + q0, rows * d);
      }
    });
  }

  ThreadPool pool_;
};

}  // namespace

size_t host_memory_available() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  size_t kib = 0;
  while (in >> key >> kib) {
    if (key == "MemAvailable:") return kib * 1024;
    in.ignore(256, '\n');
  }
  return 0;
}

std::unique_ptr<Backend> make_cpu_backend(int threads) { return std::make_unique<CpuBackend>(threads); }

}  // namespace strata
