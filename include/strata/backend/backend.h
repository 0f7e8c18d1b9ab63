// One interface for compute and copies. The transformer forward pass is written once against it;
// `cpu` (threads + OpenBLAS, fp32) and `cuda` (cuBLAS + own kernels, fp16 with fp32 accumulation)
// implement it. All tensors passed to an op live on the backend's device, are contiguous and
// have the backend's activation dtype unless the op says otherwise. Ops are enqueued in order on
// the backend's compute stream; copies to the host synchronize. Work on the compute stream and the
// two copy streams is ordered across streams by Events alone (docs/offload.md, "Events").
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "strata/core/tensor.h"
#include "strata/quant/quant.h"

namespace strata {

// Owning device allocation, released through the backend that made it.
class Backend;
class Buffer {
public:
  Buffer() = default;
  Buffer(Backend* owner, void* data, size_t bytes) : owner_(owner), data_(data), bytes_(bytes) {}
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }

  void reset();
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  // A tensor view at byte offset `offset` (must stay inside the buffer).
  Tensor view(size_t offset, DType dtype, std::initializer_list<int64_t> dims) const;

private:
  Backend* owner_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

enum class Activation : uint8_t { ReLU, GELU };

// How attention() turns scores into weights: softmax over the keys a token sees of scale * (q . k).
// window > 0 (a sliding-window layer: Gemma 2 and 3, GPT-OSS, one layer in two or five in six)
// lets token t see only keys (positions[t] - window, positions[t]]; softcap > 0 (Gemma 2) passes
// each scaled score through softcap * tanh(score / softcap) before the softmax. sinks (GPT-OSS:
// F32 [heads], in the memory of the backend that attends) give query head h one more logit,
// sinks[h], that joins the softmax's sum and weighs no value, so a head can attend to nothing.
// A bare float is a plain scale.
struct AttentionSpec {
  AttentionSpec(float scale_ = 1.0f, int window_ = 0, float softcap_ = 0.0f)  // NOLINT: implicit from a scale
      : scale(scale_), window(window_), softcap(softcap_) {}
  float scale;
  int window;
  float softcap;
  const float* sinks = nullptr;
  // The first key position token at `position` sees.
  int first_key(int position) const { return window > 0 && position >= window ? position - window + 1 : 0; }
  // The score after the soft cap (itself when softcap is 0).
  float cap(float score) const { return softcap > 0.0f ? softcap * std::tanh(score / softcap) : score; }
};

// What multiplies a row's weighted sum of values (accumulated against its running max m, with
// softmax sum l) to give its output: 1 / l, or with a sink logit the sink's share of the sum as
// well, 1 / (l + exp(sink - m)), computed against the larger of m and the sink so neither
// exponential overflows.
inline float softmax_normalizer(float m, float l, const float* sink) {
  if (sink == nullptr) return 1.0f / l;
  const float top = std::max(m, *sink), shift = std::exp(m - top);
  return shift / (l * shift + std::exp(*sink - top));
}

// Direction of a copy between host memory and the backend's device. Each direction has its own
// copy stream (CUDA), separate from the compute stream, so the offloading schedule overlaps them.
enum class CopyKind : uint8_t { HostToDevice, DeviceToHost };

// Where work is enqueued: the compute stream, and one copy stream per direction (CopyKind).
enum class Stream : uint8_t { Compute, HostToDevice, DeviceToHost };
inline Stream copy_stream(CopyKind kind) { return kind == CopyKind::HostToDevice ? Stream::HostToDevice : Stream::DeviceToHost; }

// Points in streams' work: each, everything enqueued on its stream before Backend::record; an
// Event is done when all its points are (join). CUDA: recorded cudaEvent_t's, back to the
// backend's pool when the last copy of them goes. An empty Event is already done (the CPU
// backend's work is done when its call returns).
class Event {
public:
  Event() = default;
  explicit Event(std::shared_ptr<void> handle) {
    if (handle) handles_.push_back(std::move(handle));
  }
  bool empty() const { return handles_.empty(); }
  const std::vector<std::shared_ptr<void>>& handles() const { return handles_; }
  Event& join(const Event& other) {
    handles_.insert(handles_.end(), other.handles_.begin(), other.handles_.end());
    return *this;
  }

private:
  std::vector<std::shared_ptr<void>> handles_;
};

// The calling thread's waits for device work (copies to the host, synchronize, wait_host, and
// the offloading engine's waits for its lanes): how many, and the seconds they blocked. Per
// thread, so the engine counts the thread that launches GPU work, not its copy lanes.
struct HostWaits {
  int64_t count = 0;
  double seconds = 0;
};
HostWaits& this_thread_host_waits();

class Backend {
public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;        // "cpu" or "cuda"
  virtual Device device() const = 0;
  virtual DType activation_dtype() const = 0;  // F32 on cpu, F16 on cuda; weights use it too

  // ---- memory and copies ----
  virtual Buffer alloc(size_t bytes) = 0;      // throws strata::Error naming the size when out of memory
  virtual void release(void* data) = 0;        // called by Buffer
  virtual void copy_to_device(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* src, size_t bytes) = 0;  // synchronizes
  virtual void synchronize() = 0;
  // Bytes the backend can still allocate (an estimate; SIZE_MAX when unknown). Used to refuse a
  // model that cannot fit before loading starts, instead of failing or being killed halfway.
  virtual size_t available_memory() const { return SIZE_MAX; }

  // Host memory the device can copy from at full speed (pinned: cudaHostAlloc on CUDA; 4 KiB
  // aligned, so O_DIRECT disk reads can land in it, on both). Throws strata::Error when refused.
  virtual void* alloc_host(size_t bytes) = 0;
  virtual void free_host(void* p) = 0;
  // A strided copy of `rows` rows of `width` bytes between host memory and the device, on the
  // copy stream of `kind`, returning when it is done. Thread-safe across the two kinds, so one
  // thread per direction can copy while the compute stream runs. Does not wait for compute.
  virtual void copy_2d(CopyKind kind, void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                       size_t rows) = 0;
  void copy(CopyKind kind, void* dst, const void* src, size_t bytes) { copy_2d(kind, dst, bytes, src, bytes, bytes, 1); }
  // A copy within device memory on the compute stream, ordered with the ops before and after it
  // (bytes as they are: quantized cache rows too).
  virtual void copy_on_device(void* dst, const void* src, size_t bytes) = 0;

  // ---- asynchrony: events order the streams; the host waits only where it reads a result ----
  // Marks the work enqueued on `s` so far. Thread-safe.
  virtual Event record(Stream s) {
    (void)s;
    return Event();
  }
  // Work enqueued on `s` after this call starts after `e` (an Event of any stream).
  virtual void wait(Stream s, const Event& e) {
    (void)s;
    (void)e;
  }
  // Blocks the calling thread until `e` is done (counted in this_thread_host_waits).
  virtual void wait_host(const Event& e) { (void)e; }
  // copy_2d on the copy stream of `kind`, returning at once: host memory must be pinned
  // (alloc_host) and left alone until an Event recorded on that stream after it is done.
  virtual void copy_2d_async(CopyKind kind, void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                             size_t width, size_t rows) {
    copy_2d(kind, dst, dst_pitch, src, src_pitch, width, rows);
  }
  void copy_async(CopyKind kind, void* dst, const void* src, size_t bytes) {
    copy_2d_async(kind, dst, bytes, src, bytes, bytes, 1);
  }
  // A host-to-device copy on the compute stream that returns at once; `host_src` may be reused
  // when it returns (the backend stages it). For a step's small inputs (token ids, positions).
  virtual void upload(void* dst, const void* host_src, size_t bytes) { copy_to_device(dst, host_src, bytes); }
  // Sets device bytes to `byte` on the compute stream (a released buffer's poison, in tests).
  virtual void fill(void* dst, uint8_t byte, size_t bytes) = 0;

  // ---- graphs: the compute stream's work recorded once and replayed with one launch ----
  // Records the ops `enqueue` puts on the compute stream without running them: kernel
  // arguments, addresses and shapes are fixed at the capture, so a replay redoes the same work on
  // whatever the buffers hold by then. Null where the backend has no graphs (the CPU) or the work
  // cannot be captured (an op that waits for the device, or another error): nothing then ran, and
  // the caller runs `enqueue` itself.
  virtual std::shared_ptr<void> capture(const std::function<void()>& enqueue) {
    (void)enqueue;
    return nullptr;
  }
  // Enqueues a captured graph's work on the compute stream.
  virtual void replay(const std::shared_ptr<void>& graph) { (void)graph; }

  // ---- ops; shapes in comments: T tokens, h hidden, V vocab, S cache slots, C cache capacity ----
  // out[t] = table[ids[t]] (or +=, when accumulate). ids: I32 [T], table: [V, h], out: [T, h].
  // Ids must be in [0, V): callers validate them on the host.
  virtual void embedding(const Tensor& ids, const Tensor& table, const Tensor& out, bool accumulate) = 0;

  // out = (x - mean) / sqrt(var + eps) * w + b per row, statistics in fp32. b may be empty.
  // x, out: [T, h]; w, b: [h]. out may alias x.
  virtual void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, const Tensor& out) = 0;

  // out = x / sqrt(mean(x^2) + eps) * (w_offset + w) per row, in fp32. out may alias x. w_offset 1:
  // Gemma's norms, which scale by 1 + w, the sum in fp32 as transformers computes it (a 16-bit
  // 1 + w would round w away).
  virtual void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out, float w_offset = 0.0f) = 0;

  // The residual add and the next norm in one pass: x += delta (as add()), then out = the norm of
  // the new x (layer_norm with w and b, b possibly empty; or rms_norm with w and w_offset), the
  // same values as the two ops one after the other. out may alias delta, not x.
  enum class Norm { Layer, Rms };
  virtual void add_norm(const Tensor& x, const Tensor& delta, Norm norm, const Tensor& w, const Tensor& b, float eps,
                        const Tensor& out, float w_offset = 0.0f) = 0;

  // y = x @ w^T + bias. x: [T, in], w: [out, in] (Hugging Face layout), bias: [out] or empty,
  // y: [T, out]. Accumulates in fp32. y must not alias x.
  // w may be quantized (Q4/Q8, groups along `in`, quant.h): then the op dequantizes each weight row
  // in registers as it reads it (a fused dequant-GEMV/GEMM) and never writes an fp copy. It is
  // exact for any T, but on CUDA fast only up to fused_dequant_max_tokens(); callers with more
  // tokens dequantize the matrix once (dequantize_rows) and run the plain GEMM over it. (The CPU
  // backend does that itself beyond 24 tokens, a block of rows at a time, so a caller that cannot
  // hold the whole dequantized matrix, such as the engine's experts on the CPU, is fast too.)
  virtual void linear(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y) = 0;
  virtual int64_t fused_dequant_max_tokens() const = 0;

  // Independent linears (a mixture of experts' active experts): each y = x @ w^T + b as linear()
  // computes it (b empty: none; GPT-OSS's experts have one), with no y aliasing another job's x
  // or y. By default one linear() each. The CPU backend runs those over few tokens in one parallel
  // region: a small expert's matrix then costs no wake of the thread pool of its own (docs/moe.md,
  // "The forward pass").
  struct LinearJob {
    Tensor x, w, y, b;
  };
  virtual void linears(const std::vector<LinearJob>& jobs) {
    for (const LinearJob& j : jobs) linear(j.x, j.w, j.b, j.y);
  }

  // out = a + b elementwise; out may alias a or b.
  virtual void add(const Tensor& a, const Tensor& b, const Tensor& out) = 0;

  // x = act(x) in place.
  virtual void activation(Activation act, const Tensor& x) = 0;

  // out[t, i] = silu(gate_up[t, i]) * gate_up[t, f + i]: gate_up [T, 2f] is the stacked gate/up
  // GEMM's output (gate's f columns, then up's), out [T, f]. out must not alias gate_up.
  virtual void swiglu(const Tensor& gate_up, const Tensor& out) = 0;
  // The same with GELU's tanh approximation (PyTorch's gelu(approximate="tanh"), Gemma's
  // gelu_pytorch_tanh) in place of silu: GeGLU.
  virtual void geglu(const Tensor& gate_up, const Tensor& out) = 0;
  // GPT-OSS's experts: out = (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g =
  // min(gate, limit) (MlpKind::ClampedSwiGLU); layout as swiglu.
  virtual void clamped_swiglu(const Tensor& gate_up, const Tensor& out, float limit, float alpha) = 0;

  // x *= s in place, in fp32 (Gemma's embeddings times sqrt(hidden)).
  virtual void scale(const Tensor& x, float s) = 0;
  // x = cap * tanh(x / cap) in place, in fp32 (Gemma 2's final logit soft cap). x: F32 or the
  // activation dtype.
  virtual void soft_cap(const Tensor& x, float cap) = 0;

  // Rotary embedding in place, Hugging Face's rotate_half convention: for i < d/2 with
  // a = pos[t] * inv_freq[i]: (x[i], x[i + d/2]) <- (x[i] cos a - x[i + d/2] sin a,
  //                                                   x[i + d/2] cos a + x[i] sin a).
  // x: [T, heads, d]; positions: I32 [T]; inv_freq: F32 [d/2] (scaling already applied).
  virtual void rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq) = 0;

  // The stacked q/k/v GEMM's output qkv [T, (heads + 2 kv_heads) d] (each row q's, then k's, then
  // v's columns) into q [T, heads, d], k and v [T, kv_heads, d], rotating q and k as rope() does
  // on the way unless inv_freq is empty. One pass instead of three copies and two rotations.
  virtual void split_qkv(const Tensor& qkv, const Tensor& positions, const Tensor& inv_freq, const Tensor& q,
                         const Tensor& k, const Tensor& v) = 0;
  // split_qkv with kv_store in the same pass: q as split_qkv writes it, k (rotated) and v straight
  // into cache_k and cache_v [S, C, kv_heads, d] at (slots[t], positions[t]). Caches of the
  // activation dtype, or quantized ones (k and v quantized as kv_store does, to the same bytes).
  virtual void split_qkv_store(const Tensor& qkv, const Tensor& positions, const Tensor& inv_freq, const Tensor& q,
                               const Tensor& slots, const Tensor& cache_k, const Tensor& cache_v) = 0;

  // cache_k[slots[t], positions[t]] = k[t], likewise v. (The CPU backend also takes F16 k/v and
  // caches here and in attention(), for attention delegated to the CPU from an fp16 GPU.)
  // k, v: [T, kv_heads, d]; cache_k, cache_v: [S, C, kv_heads, d]; slots, positions: I32 [T].
  // Caches may be quantized (Q4/Q8, each (position, head) row of d grouped along d): new entries
  // are quantized as they are written, bit for bit as quant::quantize_rows does on the host, so a
  // cache written on either backend holds the same bytes. attention() then reads the codes,
  // dequantizing in registers. Quantized device buffers (weights, caches, quantize_rows' q) must
  // be 4-byte aligned: rows are whole 4-byte words (quant.h), and CUDA reads them as words.
  virtual void kv_store(const Tensor& k, const Tensor& v, const Tensor& cache_k, const Tensor& cache_v,
                        const Tensor& slots, const Tensor& positions) = 0;

  // Causal attention over the cache: token t attends to cache entries [spec.first_key(positions[t]),
  // positions[t]] of slot slots[t] (its own key included, so kv_store runs first). Query head h
  // reads kv head h / (heads / kv_heads) (grouped- and multi-query). Softmax in fp32 of the scores
  // as spec makes them. q, out: [T, heads, d]; caches as in kv_store.
  virtual void attention(const Tensor& q, const Tensor& cache_k, const Tensor& cache_v, const Tensor& slots,
                         const Tensor& positions, const AttentionSpec& spec, const Tensor& out) = 0;

  // out[i] = x[rows[i]]. x: [T, h]; rows: I32 [B]; out: [B, h].
  virtual void gather_rows(const Tensor& x, const Tensor& rows, const Tensor& out) = 0;

  // A mixture of experts' weighted sum of each token's expert outputs:
  // out[t] = sum over j < k of weights[t, j] * src[rows[t, j]], accumulated in fp32 in j's order.
  // src: [A, h]; rows: I32 [T, k], each in [0, A); weights: F32 [T, k]; out: [T, h], not aliasing src.
  virtual void combine_rows(const Tensor& src, const Tensor& rows, const Tensor& weights, const Tensor& out) = 0;

  // ---- a mixture of experts' routing kept on the device (docs/moe.md, "Routing on the device") ----
  // Where the router's logits are, on the compute stream: route_tokens' result (moe_routing.h)
  // without its trip to the host, and each active expert's linear over its rows, so that the step
  // never waits for the device and can be captured in a graph.
  // gather, combine_rows: I32 [T k]; combine_weights: F32 [T k]; expert_begin: I32 [E + 1];
  // active: I32 [min(E, T k)], the active experts ascending, then -1; totals: I32 [3], to which
  // each routing adds 1, T and the number of distinct experts (ForwardOps::routing_totals).
  struct DeviceRouting {
    Tensor gather, combine_rows, combine_weights, expert_begin, active, totals;
  };
  // Whether this backend routes a step of `tokens` tokens, k of `experts` experts each, on the
  // device, with expert weights like `expert_w` (one expert's matrix; every expert's alike).
  virtual bool routes_on_device(int64_t tokens, int64_t experts, int64_t k, const Tensor& expert_w) const {
    (void)tokens, (void)experts, (void)k, (void)expert_w;
    return false;
  }
  // logits: F32 [T, E]. Where routes_on_device holds.
  virtual void route_experts(const Tensor& logits, int64_t k, bool renormalize, const DeviceRouting& r);
  // For each expert e that r names active: y rows [expert_begin[e], expert_begin[e + 1]) =
  // x's rows @ w[e]^T (+ bias[e], GPT-OSS's experts, where biases are given): as linear()
  // computes them over codes; over 16-bit weights within the same bound, in another summation
  // order. x: [T k, in], rows grouped by expert as route_experts grouped them; y: [T k, out];
  // max_rows: T, which bounds any expert's rows.
  virtual void routed_linears(const Tensor& x, const std::vector<Tensor>& w, const DeviceRouting& r, int64_t max_rows,
                              const Tensor& y, const std::vector<Tensor>& bias = {});

  // out[i] = argmax_j logits[i, j] (lowest index on ties). logits: [B, V]; out: I32 [B].
  virtual void argmax_rows(const Tensor& logits, const Tensor& out) = 0;

  // Whether row_candidates runs here: where logits live apart from the host (the GPU), so that
  // sampled rows copy their candidates rather than their rows.
  virtual bool samples_on_device() const { return false; }
  // Each row's sampling candidates (runtime/row_candidates.h) at temperatures[i] (0: sums at 1).
  // logits: [R, V], F32 or the activation dtype; temperatures: F32 [R]; out: R x
  // row_candidates_bytes(capacity) bytes on the device, capacity <= kMaxRowCandidates. Where
  // samples_on_device holds.
  virtual void row_candidates(const Tensor& logits, const Tensor& temperatures, int64_t capacity, void* out);
  // Each row's target token: its logit and rank (runtime/row_candidates.h's TargetRank). logits:
  // [R, V] as row_candidates'; targets: I32 [R] on the device; out: R x 8 bytes on the device.
  // Where samples_on_device holds (prompt logprobs read these and the candidates, not the rows).
  virtual void target_ranks(const Tensor& logits, const Tensor& targets, void* out);

  // Group-wise quantization in the format and by the formula of include/strata/quant/quant.h.
  // x, out: [rows, n] float tensors on the device (n = the last dimension; the activation dtype,
  // or F32/F16/BF16 on the CPU); q: rows x quant::row_bytes(spec, n) bytes on the device.
  virtual void quantize_rows(const quant::QuantSpec& spec, const Tensor& x, void* q) = 0;
  virtual void dequantize_rows(const quant::QuantSpec& spec, const void* q, const Tensor& out) = 0;

  // Copies a float tensor of any dtype to host fp32 (synchronizes).
  void copy_to_host_f32(const Tensor& src, float* host_dst);
};

std::unique_ptr<Backend> make_cpu_backend(int threads = 0);
// Host memory the kernel can hand out without swapping (MemAvailable, page cache included);
// 0 when /proc/meminfo cannot be read.
size_t host_memory_available();
// True when the binary has the CUDA backend and a GPU is present.
bool cuda_available();
// Device work the CUDA backend has issued in this process, for benchmarks (launches per decode
// step): kernel launches and launching library calls (a cuBLAS GEMM counts one), a graph's
// replay one, the launches recorded into a graph none. 0 in a build without CUDA.
int64_t device_launches_issued();
// Throws strata::Error when CUDA is unavailable, and for BF16 activations on a card without bf16
// (compute capability below 8.0), naming its capability.
std::unique_ptr<Backend> make_cuda_backend(int device_index = 0, DType activations = DType::F16);
// "cpu", "cuda" or "auto" (cuda when available); gpu_activations: the CUDA backend's dtype (the
// CPU backend computes in F32 whatever it is).
std::unique_ptr<Backend> make_backend(const std::string& name, int threads = 0,
                                      DType gpu_activations = DType::F16);
// The backend for a log line: "cpu", or "cuda (fp16)" / "cuda (bf16)".
std::string backend_label(const Backend& be);
// `--dtype`: "fp16", "bf16", or "auto": bf16 for a bf16 checkpoint where GPU 0 has bf16 (or no GPU
// is present), fp16 otherwise. Anything else fails naming the option.
DType gpu_activation_dtype(const std::string& requested, DType checkpoint);

}  // namespace strata
