// The CUDA backend: fp16 activations and weights with fp32 accumulation, cuBLAS for the GEMMs
// and our own kernels (kernels.h) for the rest, all enqueued on one non-blocking stream owned by
// the backend. The entries here validate devices, dtypes and shapes, then call the launchers.
#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cstring>
#include <mutex>
#include <vector>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>

#include "cuda_common.h"
#include "kernels.h"
#include "split_kv.h"
#include "strata/backend/backend.h"
#include "strata/backend/device_info.h"
#include "strata/runtime/row_candidates.h"

namespace strata {
namespace {

constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;  // NVIDIA's recommendation for Hopper
// A host wait on an event sleeps rather than spins: with one context on a many-core host, CUDA's
// default is to spin, and a waiting thread would then hold a core the CPU attention needs.
constexpr unsigned kEventFlags = cudaEventBlockingSync | cudaEventDisableTiming;

using WaitClock = std::chrono::steady_clock;

// Counts a host wait of the calling thread and the seconds it blocked.
class TimedHostWait {
public:
  TimedHostWait() : start_(WaitClock::now()) {}
  ~TimedHostWait() {
    HostWaits& w = this_thread_host_waits();
    ++w.count;
    w.seconds += std::chrono::duration<double>(WaitClock::now() - start_).count();
  }

private:
  WaitClock::time_point start_;
};

// Recorded events come back here when their last Event copy goes: creating one costs more than
// recording it. Shared by the Events, so one may outlive the backend.
struct EventPool {
  std::mutex mu;
  std::vector<cudaEvent_t> free;
  cudaEvent_t take() {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!free.empty()) {
        cudaEvent_t e = free.back();
        free.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&e, kEventFlags));
    return e;
  }
  void give(cudaEvent_t e) {
    std::lock_guard<std::mutex> lock(mu);
    free.push_back(e);
  }
  ~EventPool() {
    for (cudaEvent_t e : free) (void)cudaEventDestroy(e);
  }
};

void check_tensor(const Tensor& t, DType dtype, const char* op, const char* what) {
  STRATA_CHECK(t.device == Device::CUDA, "cuda " << op << ": " << what << " must be on the GPU");
  STRATA_CHECK(t.dtype == dtype, "cuda " << op << ": " << what << " must be " << dtype_name(dtype) << ", got "
                                         << dtype_name(t.dtype) << " " << t.shape_str());
  STRATA_CHECK(t.data != nullptr || t.numel() == 0, "cuda " << op << ": " << what << " has no data");
}
void check_i32(const Tensor& t, const char* op, const char* what) { check_tensor(t, DType::I32, op, what); }

// A quantized (Q4/Q8) tensor on the GPU, 4-byte aligned (its rows are a multiple of 4 bytes, so
// the kernels read whole code words and aligned fp16 parameters); returns its spec.
quant::QuantSpec check_quantized(const Tensor& t, const char* op, const char* what) {
  STRATA_CHECK(t.device == Device::CUDA, "cuda " << op << ": " << what << " must be on the GPU");
  STRATA_CHECK(t.quantized(), "cuda " << op << ": " << what << " must be Q4 or Q8, got " << dtype_name(t.dtype) << " "
                                      << t.shape_str());
  STRATA_CHECK(t.data != nullptr || t.numel() == 0, "cuda " << op << ": " << what << " has no data");
  STRATA_CHECK(reinterpret_cast<uintptr_t>(t.data) % 4 == 0,
               "cuda " << op << ": quantized " << what << " must be 4-byte aligned");
  return quant::spec_of(t);
}

// The kernels' row layout for rows of n elements, checked against the host reference's size.
cuda::QuantRowLayout row_layout(const quant::QuantSpec& spec, int64_t n, const char* op) {
  quant::check_spec(spec, n);
  STRATA_CHECK(n <= INT_MAX / 8, "cuda " << op << ": quantized rows of " << n << " elements are too long");
  const cuda::QuantRowLayout l = cuda::quant_row_layout(spec.bits, spec.group_size, int(n));
  STRATA_CHECK(size_t(l.row_bytes) == quant::row_bytes(spec, n), "internal: cuda and host quantized row sizes differ");
  return l;
}

// A tensor's elements as the kernels' type E (checked by the entry before).
template <class E>
const E* elems(const Tensor& t) {
  return static_cast<const E*>(t.data);
}
template <class E>
E* elems_mut(const Tensor& t) {
  return static_cast<E*>(t.data);
}
const int32_t* i32(const Tensor& t) { return static_cast<const int32_t*>(t.data); }

class CudaBackend final : public Backend {
public:
  // act: the activation dtype, F16 or BF16 (make_cuda_backend checks the card supports it).
  CudaBackend(int device, DType act) : device_(device), act_(act) {
    STRATA_CUDA_CHECK(cudaSetDevice(device_));
    STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    try {
      for (cudaStream_t& s : copy_streams_) STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      for (cudaEvent_t& e : copy_done_) STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&e, kEventFlags));
      for (Staging& st : staging_) STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&st.done, kEventFlags));
      events_ = std::make_shared<EventPool>();
      STRATA_CUBLAS_CHECK(cublasCreate(&cublas_));
      STRATA_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
      STRATA_CUDA_CHECK(cudaMalloc(&workspace_, kCublasWorkspaceBytes));
      STRATA_CUBLAS_CHECK(cublasSetWorkspace(cublas_, workspace_, kCublasWorkspaceBytes));
      cudaDeviceProp prop{};
      STRATA_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
      sm_count_ = prop.multiProcessorCount;
      const char* split = std::getenv("STRATA_SPLIT_KV");
      STRATA_CHECK(cuda::parse_split_kv(split, split_kv_setting_),
                   "STRATA_SPLIT_KV=" << split << ": expected auto, 0 (never split) or a chunk count up to "
                                      << cuda::kSplitKvMaxChunks);
      // The rule splits only calls of fewer than kSplitKvBlocksPerSm x SMs (token, head) pairs, so
      // their partials fit a buffer sized once here (8.7 MB on 132 SMs): no allocation, and no
      // drain of the stream to free a smaller one, in the middle of a run.
      if (split_kv_setting_ == cuda::kSplitKvAuto)
        (void)split_scratch(int64_t(cuda::kSplitKvBlocksPerSm) * sm_count_, 1, cuda::kMaxHeadDim, cuda::kSplitKvMaxChunks);
    } catch (...) {
      destroy();
      throw;
    }
  }
  ~CudaBackend() override { destroy(); }

  const char* name() const override { return "cuda"; }
  Device device() const override { return Device::CUDA; }
  DType activation_dtype() const override { return act_; }

  // ---- memory and copies ----
  Buffer alloc(size_t bytes) override {
    if (bytes == 0) return Buffer(this, nullptr, 0);
    bind();
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // clear the error so later launch checks do not see it
      size_t free_b = 0, total_b = 0;
      const bool info = cudaMemGetInfo(&free_b, &total_b) == cudaSuccess;
      std::ostringstream os;
      os << "cuda: cannot allocate " << bytes << " bytes (" << (bytes >> 20) << " MiB) on GPU " << device_ << ": "
         << cudaGetErrorString(err);
      if (info) os << "; " << (free_b >> 20) << " MiB free of " << (total_b >> 20) << " MiB";
      throw Error(os.str());
    }
    return Buffer(this, p, bytes);
  }

  // Called from Buffer's destructor: must not throw.
  void release(void* data) override {
    if (data == nullptr) return;
    (void)cudaSetDevice(device_);
    const cudaError_t err = cudaFree(data);
    if (err != cudaSuccess) std::fprintf(stderr, "strata: cudaFree failed: %s\n", cudaGetErrorString(err));
  }

  // The host buffer may be freed as soon as this returns, so wait for the copy.
  void copy_to_device(void* dst, const void* host_src, size_t bytes) override {
    if (bytes == 0) return;
    bind();
    STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_));
    TimedHostWait wait;
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void copy_to_host(void* host_dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    bind();
    STRATA_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    TimedHostWait wait;
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  // Staged through one of a ring of pinned buffers, each reused after its last copy's event, so
  // the caller's buffer is free at once and the copy is still asynchronous.
  void upload(void* dst, const void* host_src, size_t bytes) override {
    if (bytes == 0) return;
    bind();
    std::lock_guard<std::mutex> lock(staging_mu_);
    Staging& st = staging_[next_staging_++ % staging_.size()];
    if (st.used && cudaEventQuery(st.done) != cudaSuccess) {
      (void)cudaGetLastError();  // cudaErrorNotReady is a state, not a fault: the wait reports faults
      TimedHostWait wait;
      STRATA_CUDA_CHECK(cudaEventSynchronize(st.done));
    }
    if (st.bytes < bytes) {
      if (st.host) STRATA_CUDA_CHECK(cudaFreeHost(st.host));
      st.host = nullptr;
      st.bytes = 0;
      const size_t grown = std::max<size_t>(bytes, size_t(64) << 10);
      STRATA_CUDA_CHECK(cudaHostAlloc(&st.host, grown, cudaHostAllocPortable));
      st.bytes = grown;
    }
    std::memcpy(st.host, host_src, bytes);
    STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, st.host, bytes, cudaMemcpyHostToDevice, stream_));
    STRATA_CUDA_CHECK(cudaEventRecord(st.done, stream_));
    st.used = true;
    if (sync_debug()) STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void fill(void* dst, uint8_t byte, size_t bytes) override {
    if (bytes == 0) return;
    bind();
    STRATA_CUDA_CHECK(cudaMemsetAsync(dst, byte, bytes, stream_));
  }

  Event record(Stream s) override {
    bind();
    cudaEvent_t e = events_->take();
    const cudaError_t err = cudaEventRecord(e, stream_of(s));
    std::shared_ptr<EventPool> pool = events_;
    Event event(std::shared_ptr<void>(e, [pool](void* p) { pool->give(static_cast<cudaEvent_t>(p)); }));
    STRATA_CUDA_CHECK(err);
    return event;
  }

  void wait(Stream s, const Event& e) override {
    if (e.empty()) return;
    bind();
    for (const std::shared_ptr<void>& h : e.handles())
      STRATA_CUDA_CHECK(cudaStreamWaitEvent(stream_of(s), static_cast<cudaEvent_t>(h.get()), 0));
  }

  void wait_host(const Event& e) override {
    if (e.empty()) return;
    bind();
    TimedHostWait wait;
    for (const std::shared_ptr<void>& h : e.handles())
      STRATA_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(h.get())));
  }

  void copy_on_device(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    bind();
    STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }

  std::shared_ptr<void> capture(const std::function<void()>& enqueue) override {
    bind();
    // Thread-local mode: the engine's copy threads may call unsafe APIs meanwhile on other streams.
    if (cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    bool enqueued = true;
    try {
      const cuda::RecordingLaunches recording;
      enqueue();
    } catch (const Error&) {  // an op the capture could not hold; the caller runs the work eagerly
      enqueued = false;
    }
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
    cudaGraphExec_t exec = nullptr;
    const bool made = enqueued && ended == cudaSuccess && graph && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
    if (graph) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();  // a failed capture's error is answered by running eagerly, not kept
    if (!made) return nullptr;
    return std::shared_ptr<void>(exec, [](void* e) { (void)cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(e)); });
  }

  void replay(const std::shared_ptr<void>& graph) override {
    bind();
    STRATA_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph.get()), stream_));
    cuda::count_graph_launch();
  }

  void synchronize() override {
    bind();
    TimedHostWait wait;
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void* alloc_host(size_t bytes) override {
    bind();
    void* p = nullptr;
    const cudaError_t err = cudaHostAlloc(&p, std::max<size_t>(bytes, 1), cudaHostAllocPortable);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      throw Error("cuda: cannot allocate " + std::to_string(bytes >> 20) + " MiB of pinned host memory: " +
                  cudaGetErrorString(err));
    }
    return p;  // cudaHostAlloc returns page-aligned memory, as O_DIRECT needs
  }
  void free_host(void* p) override {
    if (p) (void)cudaFreeHost(p);
  }

  // Each direction has its own stream; the caller's thread waits on that stream only, so a copy
  // never waits for compute. The wait sleeps on a blocking-sync event (kEventFlags); a copy is
  // large, so the wake-up's microseconds do not count.
  void copy_2d(CopyKind kind, void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
               size_t rows) override {
    if (width == 0 || rows == 0) return;
    copy_2d_async(kind, dst, dst_pitch, src, src_pitch, width, rows);
    const int direction = kind == CopyKind::HostToDevice ? 0 : 1;
    // A later record by another thread only makes this wait longer, never too short: the stream
    // runs in order.
    STRATA_CUDA_CHECK(cudaEventRecord(copy_done_[direction], copy_streams_[direction]));
    TimedHostWait wait;
    STRATA_CUDA_CHECK(cudaEventSynchronize(copy_done_[direction]));
  }

  void copy_2d_async(CopyKind kind, void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                     size_t rows) override {
    if (width == 0 || rows == 0) return;
    bind();
    cudaStream_t s = stream_of(copy_stream(kind));
    const cudaMemcpyKind k = kind == CopyKind::HostToDevice ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    if (rows == 1) STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, width, k, s));
    else STRATA_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, k, s));
    if (sync_debug()) STRATA_CUDA_CHECK(cudaStreamSynchronize(s));
  }

  size_t available_memory() const override {
    size_t free_b = 0, total_b = 0;
    if (cudaSetDevice(device_) != cudaSuccess || cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return SIZE_MAX;
    return free_b;
  }

  // ---- ops ----
  void embedding(const Tensor& ids, const Tensor& table, const Tensor& out, bool accumulate) override {
    check_i32(ids, "embedding", "ids");
    check_act(table, "embedding", "table");
    check_act(out, "embedding", "out");
    STRATA_CHECK(table.ndim == 2 && out.dim(0) == ids.numel() && out.row_size() == table.dim(1),
                 "cuda embedding: ids " << ids.shape_str() << " table " << table.shape_str() << " out "
                                        << out.shape_str());
    bind();
    dispatch([&](auto e) {
      using E = decltype(e);
      cuda::launch_gather_rows(elems<E>(table), table.dim(0), i32(ids), ids.numel(), table.dim(1), accumulate,
                               elems_mut<E>(out), stream_);
    });
  }

  void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, const Tensor& out) override {
    check_act(x, "layer_norm", "x");
    check_act(w, "layer_norm", "w");
    check_act(out, "layer_norm", "out");
    const int64_t h = x.row_size();
    STRATA_CHECK(w.numel() == h && out.dim(0) == x.dim(0) && out.numel() == x.numel(),
                 "cuda layer_norm: x " << x.shape_str() << " w " << w.shape_str() << " out " << out.shape_str());
    if (!b.empty()) {
      check_act(b, "layer_norm", "b");
      STRATA_CHECK(b.numel() == h, "cuda layer_norm: b " << b.shape_str() << " for rows of " << h);
    }
    bind();
    dispatch([&](auto e) {
      using E = decltype(e);
      cuda::launch_layer_norm(elems<E>(x), elems<E>(w), b.empty() ? nullptr : elems<E>(b), eps, x.dim(0), h,
                              elems_mut<E>(out), stream_);
    });
  }

  void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out, float w_offset = 0.0f) override {
    check_act(x, "rms_norm", "x");
    check_act(w, "rms_norm", "w");
    check_act(out, "rms_norm", "out");
    const int64_t h = x.row_size();
    STRATA_CHECK(w.numel() == h && out.dim(0) == x.dim(0) && out.numel() == x.numel(),
                 "cuda rms_norm: x " << x.shape_str() << " w " << w.shape_str() << " out " << out.shape_str());
    bind();
    dispatch([&](auto e) {
      using E = decltype(e);
      cuda::launch_rms_norm(elems<E>(x), elems<E>(w), eps, x.dim(0), h, elems_mut<E>(out), stream_, w_offset);
    });
  }

  void add_norm(const Tensor& x, const Tensor& delta, Norm norm, const Tensor& w, const Tensor& b, float eps,
                const Tensor& out, float w_offset = 0.0f) override {
    STRATA_CHECK(norm == Norm::Rms || w_offset == 0.0f, "cuda add_norm: a weight offset is for RMS norms");
    for (const auto& [t, name] : {std::pair{&x, "x"}, {&delta, "delta"}, {&w, "w"}, {&out, "out"}})
      check_act(*t, "add_norm", name);
    const int64_t h = x.row_size();
    STRATA_CHECK(w.numel() == h && delta.numel() == x.numel() && out.dim(0) == x.dim(0) && out.numel() == x.numel() &&
                     out.data != x.data && (b.empty() || (norm == Norm::Layer && b.numel() == h)),
                 "cuda add_norm: x " << x.shape_str() << " delta " << delta.shape_str() << " w " << w.shape_str()
                                     << " out " << out.shape_str());
    if (!b.empty()) check_act(b, "add_norm", "b");
    bind();
    dispatch([&](auto e) {
      using E = decltype(e);
      if (norm == Norm::Layer)
        cuda::launch_add_layer_norm(elems_mut<E>(x), elems<E>(delta), elems<E>(w), b.empty() ? nullptr : elems<E>(b), eps,
                                    x.dim(0), h, elems_mut<E>(out), stream_);
      else
        cuda::launch_add_rms_norm(elems_mut<E>(x), elems<E>(delta), elems<E>(w), eps, x.dim(0), h, elems_mut<E>(out),
                                  stream_, w_offset);
    });
  }

  // Up to 16 tokens (kQuantLinearTokens) the fused kernel reads a quantized matrix once; each
  // token adds one fp32 FMA per weight on CUDA cores, and beyond 16 each further 16 tokens re-read
  // the weights. Estimated on an H100 (not yet measured): the fused kernel is bound by its
  // shared-memory reads of x at ~15 T FMA/s, ~0.07 ps per weight and token, while dequantizing
  // once and running cuBLAS moves ~4.6 bytes per 4-bit weight (read 0.56, write 2, read 2), ~1.5 ps
  // at 3 TB/s. They break even near 22 tokens; 16 keeps the fused path ahead and in one pass.
  int64_t fused_dequant_max_tokens() const override { return cuda::kQuantLinearTokens; }

  // Row-major y[T, out] = x[T, in] @ w[out, in]^T. In cuBLAS's column-major view, y is
  // C = [out x T] (ld out), w is [in x out] (ld in) used transposed, x is [in x T] (ld in):
  // C = op_T(w) * x with m = out, n = T, k = in.
  void linear(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y) override {
    if (w.quantized()) {
      quant_linear(x, w, bias, y);
      return;
    }
    check_act(x, "linear", "x");
    check_act(w, "linear", "w");
    // y may be fp32 (the head's logits, forward_ops.cpp): cuBLAS stores its fp32 accumulators as they are.
    const bool y_f32 = y.dtype == DType::F32;
    check_tensor(y, y_f32 ? DType::F32 : act_, "linear", "y");
    const int64_t T = x.dim(0), in = x.row_size(), out = w.dim(0);
    STRATA_CHECK(w.ndim == 2 && w.dim(1) == in && y.dim(0) == T && y.row_size() == out,
                 "cuda linear: x " << x.shape_str() << " w " << w.shape_str() << " y " << y.shape_str());
    STRATA_CHECK(y.data != x.data, "cuda linear: y must not alias x");
    STRATA_CHECK(T <= INT_MAX && in <= INT_MAX && out <= INT_MAX, "cuda linear: dimensions exceed cuBLAS's int");
    if (!bias.empty()) {
      check_act(bias, "linear", "bias");
      STRATA_CHECK(bias.numel() == out, "cuda linear: bias " << bias.shape_str() << " for " << out << " outputs");
    }
    if (T == 0 || out == 0) return;
    bind();
    const float alpha = 1.0f;
    const float beta = 0.0f;
    const cudaDataType act = act_ == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
    STRATA_CUBLAS_CHECK(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, int(out), int(T), int(in), &alpha, w.data, act,
                                     int(in), x.data, act, int(in), &beta, y.data, y_f32 ? CUDA_R_32F : act, int(out),
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    STRATA_CUDA_CHECK_LAUNCH("cublasGemmEx (linear)", stream_);
    if (bias.empty()) return;
    dispatch([&](auto e) {
      using E = decltype(e);
      if (y_f32) cuda::launch_bias_add(static_cast<float*>(y.data), elems<E>(bias), T, out, stream_);
      else cuda::launch_bias_add(elems_mut<E>(y), elems<E>(bias), T, out, stream_);
    });
  }

  // Jobs over quantized weights within one pass of the fused kernel (a decode step's experts): one
  // grouped launch per matrix shape and token tier (quant_linear.cu) instead of one per job, each
  // job computed as linear() computes it alone. The others run one linear() each.
  void linears(const std::vector<LinearJob>& jobs) override {
    struct Group {
      int64_t out, in;
      quant::QuantSpec spec;
      std::vector<const LinearJob*> jobs;
    };
    std::vector<Group> groups;
    for (const LinearJob& j : jobs) {
      if (!j.w.quantized() || j.x.dim(0) > cuda::kQuantLinearTokens) {
        linear(j.x, j.w, j.b, j.y);
        continue;
      }
      const quant::QuantSpec spec = check_quant_linear(j.x, j.w, j.b, j.y);
      const int64_t out = j.w.dim(0), in = j.x.row_size();
      auto g = std::find_if(groups.begin(), groups.end(), [&](const Group& g) {
        return g.out == out && g.in == in && g.spec.bits == spec.bits && g.spec.group_size == spec.group_size;
      });
      if (g == groups.end()) g = groups.insert(groups.end(), Group{out, in, spec, {}});
      g->jobs.push_back(&j);
    }
    if (groups.empty()) return;
    bind();
    for (const Group& g : groups)
      dispatch([&](auto e) {
        using E = decltype(e);
        std::vector<cuda::QuantLinearJob<E>> q;
        for (const LinearJob* j : g.jobs)
          q.push_back({elems<E>(j->x), static_cast<const uint8_t*>(j->w.data), elems_mut<E>(j->y), j->x.dim(0)});
        cuda::launch_quant_linears(q.data(), int(q.size()), int(g.out), row_layout(g.spec, g.in, "linears"), stream_);
        for (const LinearJob* j : g.jobs)  // biases after the grouped launch (GPT-OSS's experts)
          if (!j->b.empty()) cuda::launch_bias_add(elems_mut<E>(j->y), elems<E>(j->b), j->x.dim(0), g.out, stream_);
      });
  }

  void add(const Tensor& a, const Tensor& b, const Tensor& out) override {
    check_act(a, "add", "a");
    check_act(b, "add", "b");
    check_act(out, "add", "out");
    STRATA_CHECK(a.numel() == b.numel() && a.numel() == out.numel(),
                 "cuda add: a " << a.shape_str() << " b " << b.shape_str() << " out " << out.shape_str());
    bind();
    dispatch([&](auto e) {
      using E = decltype(e);
      cuda::launch_add(elems<E>(a), elems<E>(b), elems_mut<E>(out), a.numel(), stream_);
    });
  }

  void activation(Activation act, const Tensor& x) override {
    check_act(x, "activation", "x");
    bind();
    dispatch([&](auto e) {
      using E = decltype(e);
      const cuda::ActKind kind = act == Activation::ReLU ? cuda::ActKind::ReLU : cuda::ActKind::GELU;
      cuda::launch_activation(kind, elems_mut<E>(x), x.numel(), stream_);
    });
  }

  // The checks of swiglu and geglu, then launch(gate_up, out, rows, f) in the activation type.
  template <class Launch>
  void gated(const Tensor& gate_up, const Tensor& out, const char* op, Launch launch) {
    check_act(gate_up, op, "gate_up");
    check_act(out, op, "out");
    STRATA_CHECK(gate_up.dim(0) == out.dim(0) && gate_up.row_size() == 2 * out.row_size() && gate_up.data != out.data,
                 "cuda " << op << ": gate_up " << gate_up.shape_str() << " out " << out.shape_str());
    bind();
    dispatch([&](auto e) {
      using E = decltype(e);
      launch(elems<E>(gate_up), elems_mut<E>(out), out.dim(0), out.row_size());
    });
  }

  void swiglu(const Tensor& gate_up, const Tensor& out) override {
    gated(gate_up, out, "swiglu",
          [&](auto* g, auto* o, int64_t rows, int64_t f) { cuda::launch_swiglu(g, o, rows, f, stream_); });
  }

  void geglu(const Tensor& gate_up, const Tensor& out) override {
    gated(gate_up, out, "geglu",
          [&](auto* g, auto* o, int64_t rows, int64_t f) { cuda::launch_geglu(g, o, rows, f, stream_); });
  }

  void clamped_swiglu(const Tensor& gate_up, const Tensor& out, float limit, float alpha) override {
    gated(gate_up, out, "clamped_swiglu", [&](auto* g, auto* o, int64_t rows, int64_t f) {
      cuda::launch_clamped_swiglu(g, o, rows, f, limit, alpha, stream_);
    });
  }

  // x: the activation dtype, or F32 (logits).
  template <class F>
  void act_or_f32(const Tensor& x, const char* op, F&& launch) {
    STRATA_CHECK(x.device == Device::CUDA && x.data && (x.dtype == DType::F32 || x.dtype == act_),
                 "cuda " << op << ": x must be a CUDA F32 or " << dtype_name(act_) << " tensor, got "
                         << dtype_name(x.dtype));
    bind();
    if (x.dtype == DType::F32) return launch(static_cast<float*>(x.data));
    dispatch([&](auto e) {
      using E = decltype(e);
      launch(elems_mut<E>(x));
    });
  }

  void scale(const Tensor& x, float s) override {
    act_or_f32(x, "scale", [&](auto* p) { cuda::launch_scale(p, s, x.numel(), stream_); });
  }

  void soft_cap(const Tensor& x, float cap) override {
    STRATA_CHECK(cap > 0.0f, "cuda soft_cap: cap " << cap << " is not positive");
    act_or_f32(x, "soft_cap", [&](auto* p) { cuda::launch_soft_cap(p, cap, x.numel(), stream_); });
  }

  void split_qkv(const Tensor& qkv, const Tensor& positions, const Tensor& inv_freq, const Tensor& q, const Tensor& k,
                 const Tensor& v) override {
    check_act(k, "split_qkv", "k");
    check_act(v, "split_qkv", "v");
    STRATA_CHECK(k.ndim == 3 && k.shape == v.shape && k.dim(0) == q.dim(0) && k.dim(2) == q.dim(2),
                 "cuda split_qkv: q " << q.shape_str() << " k " << k.shape_str() << " v " << v.shape_str());
    dispatch([&](auto e) {
      using E = decltype(e);
      cuda::SplitQkvParams<E> p = split_qkv_params<E>(qkv, positions, inv_freq, q, k.dim(1));
      p.k = elems_mut<E>(k);
      p.v = elems_mut<E>(v);
      cuda::launch_split_qkv(p, stream_);
    });
  }

  void split_qkv_store(const Tensor& qkv, const Tensor& positions, const Tensor& inv_freq, const Tensor& q,
                       const Tensor& slots, const Tensor& cache_k, const Tensor& cache_v) override {
    const bool quantized = cache_k.quantized() || cache_v.quantized();
    cuda::QuantRowLayout l{};
    if (quantized) {
      l = quant_caches(cache_k, cache_v, "split_qkv_store");
    } else {
      check_act(cache_k, "split_qkv_store", "cache_k");
      check_act(cache_v, "split_qkv_store", "cache_v");
    }
    check_i32(slots, "split_qkv_store", "slots");
    STRATA_CHECK(cache_k.ndim == 4 && cache_k.shape == cache_v.shape && cache_k.dim(3) == q.dim(2) &&
                     slots.numel() == q.dim(0) && cache_k.dim(0) <= INT_MAX && cache_k.dim(1) <= INT_MAX,
                 "cuda split_qkv_store: q " << q.shape_str() << " caches " << cache_k.shape_str());
    dispatch([&](auto e) {
      using E = decltype(e);
      cuda::SplitQkvParams<E> p = split_qkv_params<E>(qkv, positions, inv_freq, q, cache_k.dim(2));
      if (quantized) {
        p.quant_cache_k = static_cast<uint8_t*>(cache_k.data);
        p.quant_cache_v = static_cast<uint8_t*>(cache_v.data);
        p.quant_row = l;
      } else {
        p.cache_k = elems_mut<E>(cache_k);
        p.cache_v = elems_mut<E>(cache_v);
      }
      p.slots = i32(slots);
      p.slot_count = int(cache_k.dim(0));
      p.capacity = int(cache_k.dim(1));
      cuda::launch_split_qkv(p, stream_);
    });
  }

  void rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq) override {
    check_act(x, "rope", "x");
    check_i32(positions, "rope", "positions");
    check_tensor(inv_freq, DType::F32, "rope", "inv_freq");
    STRATA_CHECK(x.ndim == 3 && x.dim(2) % 2 == 0 && positions.numel() == x.dim(0) &&
                     inv_freq.numel() * 2 == x.dim(2) && x.dim(1) * x.dim(2) <= INT_MAX,
                 "cuda rope: x " << x.shape_str() << " positions " << positions.shape_str() << " inv_freq "
                                 << inv_freq.shape_str());
    bind();
    dispatch([&](auto e) {
      using E = decltype(e);
      cuda::RopeParams<E> p{};
      p.x = elems_mut<E>(x);
      p.positions = i32(positions);
      p.inv_freq = static_cast<const float*>(inv_freq.data);
      p.tokens = x.dim(0);
      p.heads = int(x.dim(1));
      p.head_dim = int(x.dim(2));
      p.token_stride = x.dim(1) * x.dim(2);
      cuda::launch_rope(p, stream_);
    });
  }

  void kv_store(const Tensor& k, const Tensor& v, const Tensor& cache_k, const Tensor& cache_v, const Tensor& slots,
                const Tensor& positions) override {
    if (cache_k.quantized() || cache_v.quantized()) {
      quant_kv_store(k, v, cache_k, cache_v, slots, positions);
      return;
    }
    check_act(k, "kv_store", "k");
    check_act(v, "kv_store", "v");
    check_act(cache_k, "kv_store", "cache_k");
    check_act(cache_v, "kv_store", "cache_v");
    check_i32(slots, "kv_store", "slots");
    check_i32(positions, "kv_store", "positions");
    STRATA_CHECK(cache_k.ndim == 4 && cache_v.ndim == 4 && cache_k.shape == cache_v.shape,
                 "cuda kv_store: caches " << cache_k.shape_str() << " and " << cache_v.shape_str());
    const int64_t T = k.dim(0), row = cache_k.dim(2) * cache_k.dim(3);
    STRATA_CHECK(k.row_size() == row && v.numel() == k.numel() && v.dim(0) == T && slots.numel() == T &&
                     positions.numel() == T && cache_k.dim(0) <= INT_MAX && cache_k.dim(1) <= INT_MAX,
                 "cuda kv_store: k " << k.shape_str() << " v " << v.shape_str() << " cache " << cache_k.shape_str()
                                     << " slots " << slots.shape_str() << " positions " << positions.shape_str());
    bind();
    dispatch([&](auto e) {
      using E = decltype(e);
      cuda::KvStoreParams<E> p{};
      p.k = elems<E>(k);
      p.v = elems<E>(v);
      p.cache_k = elems_mut<E>(cache_k);
      p.cache_v = elems_mut<E>(cache_v);
      p.slots = i32(slots);
      p.positions = i32(positions);
      p.tokens = T;
      p.row = row;
      p.slot_count = int(cache_k.dim(0));
      p.capacity = int(cache_k.dim(1));
      cuda::launch_kv_store(p, stream_);
    });
  }

  void attention(const Tensor& q, const Tensor& cache_k, const Tensor& cache_v, const Tensor& slots,
                 const Tensor& positions, const AttentionSpec& spec, const Tensor& out) override {
    if (cache_k.quantized() || cache_v.quantized()) {
      quant_attention(q, cache_k, cache_v, slots, positions, spec, out);
      return;
    }
    check_act(q, "attention", "q");
    check_act(cache_k, "attention", "cache_k");
    check_act(cache_v, "attention", "cache_v");
    check_i32(slots, "attention", "slots");
    check_i32(positions, "attention", "positions");
    check_act(out, "attention", "out");
    STRATA_CHECK(q.ndim == 3 && cache_k.ndim == 4 && cache_v.ndim == 4 && cache_k.shape == cache_v.shape,
                 "cuda attention: q " << q.shape_str() << " caches " << cache_k.shape_str() << " and "
                                      << cache_v.shape_str());
    const int64_t T = q.dim(0), heads = q.dim(1), d = q.dim(2), kv_heads = cache_k.dim(2);
    STRATA_CHECK(cache_k.dim(3) == d && kv_heads > 0 && heads % kv_heads == 0 && out.numel() == q.numel() &&
                     out.dim(0) == T && slots.numel() == T && positions.numel() == T,
                 "cuda attention: q " << q.shape_str() << " cache " << cache_k.shape_str() << " out "
                                      << out.shape_str() << " slots " << slots.shape_str() << " positions "
                                      << positions.shape_str());
    STRATA_CHECK(d <= cuda::kMaxHeadDim, "cuda attention: head dim " << d << " exceeds " << cuda::kMaxHeadDim);
    STRATA_CHECK(heads <= 65535 && T * heads <= INT_MAX && cache_k.dim(0) <= INT_MAX && cache_k.dim(1) <= INT_MAX,
                 "cuda attention: cache " << cache_k.shape_str() << " or " << heads << " heads too large");
    bind();
    dispatch([&](auto e) {
      using E = decltype(e);
      cuda::AttentionParams<E> p{};
      p.q = elems<E>(q);
      p.cache_k = elems<E>(cache_k);
      p.cache_v = elems<E>(cache_v);
      p.slots = i32(slots);
      p.positions = i32(positions);
      p.out = elems_mut<E>(out);
      p.tokens = T;
      p.heads = int(heads);
      p.kv_heads = int(kv_heads);
      p.head_dim = int(d);
      p.slot_count = int(cache_k.dim(0));
      p.capacity = int(cache_k.dim(1));
      p.scale = spec.scale;
      p.window = spec.window;
      p.softcap = spec.softcap;
      p.sinks = spec.sinks;
      p.q_token_stride = heads * d;
      p.kv_pos_stride = kv_heads * d;
      p.kv_slot_stride = cache_k.dim(1) * kv_heads * d;
      if (cuda::tensor_core_attention_enabled() && cuda::tensor_core_attention_supports(int(d), T)) {
        cuda::launch_tensor_core_attention(p, stream_);
        p.skip_tensor_core_tiles = true;
      }
      const int chunks = split_kv_chunks(T, heads, kv_heads, window_keys(spec, cache_k.dim(1)));
      if (chunks == 0) {
        cuda::launch_attention(p, stream_);
        return;
      }
      std::lock_guard<std::mutex> lock(split_mu_);
      cuda::launch_split_attention(p, split_scratch(T, int(heads), int(d), chunks), stream_);
    });
  }

  void gather_rows(const Tensor& x, const Tensor& rows, const Tensor& out) override {
    check_act(x, "gather_rows", "x");
    check_i32(rows, "gather_rows", "rows");
    check_act(out, "gather_rows", "out");
    const int64_t h = x.row_size();
    STRATA_CHECK(out.dim(0) == rows.numel() && out.row_size() == h,
                 "cuda gather_rows: x " << x.shape_str() << " rows " << rows.shape_str() << " out "
                                        << out.shape_str());
    bind();
    dispatch([&](auto e) {
      using E = decltype(e);
      cuda::launch_gather_rows(elems<E>(x), x.dim(0), i32(rows), rows.numel(), h, false, elems_mut<E>(out), stream_);
    });
  }

  void combine_rows(const Tensor& src, const Tensor& rows, const Tensor& weights, const Tensor& out) override {
    check_act(src, "combine_rows", "src");
    check_i32(rows, "combine_rows", "rows");
    check_tensor(weights, DType::F32, "combine_rows", "weights");
    check_act(out, "combine_rows", "out");
    const int64_t T = out.dim(0), h = out.row_size(), k = rows.row_size();
    STRATA_CHECK(rows.dim(0) == T && weights.dim(0) == T && weights.row_size() == k && src.row_size() == h &&
                     src.data != out.data,
                 "cuda combine_rows: src " << src.shape_str() << " rows " << rows.shape_str() << " weights "
                                           << weights.shape_str() << " out " << out.shape_str());
    bind();
    dispatch([&](auto e) {
      using E = decltype(e);
      cuda::launch_combine_rows(elems<E>(src), src.dim(0), i32(rows), static_cast<const float*>(weights.data), T, k, h,
                                elems_mut<E>(out), stream_);
    });
  }

  // A decode step's experts: the fused linear's routed launch reads the routing from the device
  // (moe_route.cu, quant_linear.cu), over 4- or 8-bit codes or 16-bit rows of whole 4-byte words.
  // Longer steps route on the host (ForwardOps asks for fewer tokens still where an expert would
  // often get more rows than one pass of the fused linear takes).
  bool routes_on_device(int64_t tokens, int64_t experts, int64_t k, const Tensor& expert_w) const override {
    const bool rows_fit = expert_w.quantized() || (expert_w.dtype == act_ && expert_w.ndim == 2 &&
                                                   expert_w.dim(1) % 2 == 0 &&
                                                   reinterpret_cast<uintptr_t>(expert_w.data) % 4 == 0);
    return rows_fit && tokens >= 1 && tokens <= cuda::kMaxRoutedTokens && k <= cuda::kMaxRoutedK &&
           experts <= cuda::kMaxRoutedExperts && k <= experts;
  }

  void route_experts(const Tensor& logits, int64_t k, bool renormalize, const DeviceRouting& r) override {
    check_tensor(logits, DType::F32, "route_experts", "logits");
    const int64_t T = logits.dim(0), E = logits.row_size(), A = T * k;
    STRATA_CHECK(T >= 1 && T <= cuda::kMaxRoutedTokens && k >= 1 && k <= cuda::kMaxRoutedK && k <= E &&
                     E <= cuda::kMaxRoutedExperts,
                 "cuda route_experts: " << k << " of " << E << " experts for " << T << " tokens (at most "
                                        << cuda::kMaxRoutedTokens << " tokens, " << cuda::kMaxRoutedK << " of "
                                        << cuda::kMaxRoutedExperts << ")");
    check_routing(r, T, E, k, "route_experts");
    cuda::RouteExpertsParams p{};
    p.logits = static_cast<const float*>(logits.data);
    p.gather = static_cast<int32_t*>(r.gather.data);
    p.combine_rows = static_cast<int32_t*>(r.combine_rows.data);
    p.combine_weights = static_cast<float*>(r.combine_weights.data);
    p.expert_begin = static_cast<int32_t*>(r.expert_begin.data);
    p.active = static_cast<int32_t*>(r.active.data);
    p.totals = static_cast<int32_t*>(r.totals.data);
    p.tokens = int(T);
    p.experts = int(E);
    p.k = int(k);
    p.active_slots = int(std::min(E, A));
    p.renormalize = renormalize;
    bind();
    cuda::launch_route_experts(p, stream_);
  }

  void routed_linears(const Tensor& x, const std::vector<Tensor>& w, const DeviceRouting& r, int64_t max_rows,
                      const Tensor& y, const std::vector<Tensor>& bias = {}) override {
    STRATA_CHECK(!w.empty() && w.size() <= size_t(cuda::kMaxRoutedExperts) && max_rows >= 1 &&
                     max_rows <= cuda::kMaxRoutedTokens,
                 "cuda routed_linears: " << w.size() << " experts of at most " << max_rows << " rows");
    const int64_t experts = int64_t(w.size()), in = x.row_size(), out = w[0].dim(0);
    check_routing(r, max_rows, experts, r.gather.numel() / max_rows, "routed_linears");
    check_act(x, "routed_linears", "x");
    check_act(y, "routed_linears", "y");
    STRATA_CHECK(x.dim(0) == r.gather.numel() && y.dim(0) == x.dim(0) && y.row_size() == out && out <= INT_MAX &&
                     in <= INT_MAX / 8 && x.data != y.data,
                 "cuda routed_linears: x " << x.shape_str() << " y " << y.shape_str() << " for " << r.gather.numel()
                                           << " routed rows of experts " << w[0].shape_str());
    const bool codes = w[0].quantized();
    const quant::QuantSpec spec = codes ? check_quantized(w[0], "routed_linears", "w") : quant::QuantSpec{};
    for (const Tensor& we : w) {
      if (codes) {
        const quant::QuantSpec s = check_quantized(we, "routed_linears", "w");
        STRATA_CHECK(s.bits == spec.bits && s.group_size == spec.group_size,
                     "cuda routed_linears: experts quantized differently (" << dtype_name(we.dtype) << "/"
                                                                           << we.group << ", " << dtype_name(w[0].dtype)
                                                                           << "/" << w[0].group << ")");
      } else {
        check_act(we, "routed_linears", "w");
        STRATA_CHECK(in % 2 == 0 && reinterpret_cast<uintptr_t>(we.data) % 4 == 0,
                     "cuda routed_linears: 16-bit expert rows must be whole 4-byte words, 4-byte aligned (rows of "
                         << in << ")");
      }
      STRATA_CHECK(we.ndim == 2 && we.dim(0) == out && we.dim(1) == in,
                   "cuda routed_linears: expert weights " << we.shape_str() << " unlike the first's "
                                                          << w[0].shape_str() << " for rows of " << in);
    }
    STRATA_CHECK(bias.empty() || bias.size() == w.size(),
                 "cuda routed_linears: " << bias.size() << " biases for " << w.size() << " experts");
    for (const Tensor& b : bias) {
      check_act(b, "routed_linears", "bias");
      STRATA_CHECK(b.numel() == out, "cuda routed_linears: bias " << b.shape_str() << " for " << out << " outputs");
    }
    const cuda::QuantRowLayout row = codes ? row_layout(spec, in, "routed_linears") : cuda::plain_row_layout(int(in));
    bind();
    dispatch([&](auto e) {
      using E = decltype(e);
      cuda::RoutedLinears<E> g{};
      for (size_t i = 0; i < w.size(); ++i) g.w[i] = static_cast<const uint8_t*>(w[i].data);
      for (size_t i = 0; i < bias.size(); ++i) g.b[i] = elems<E>(bias[i]);
      g.x = elems<E>(x);
      g.y = elems_mut<E>(y);
      g.expert_begin = i32(r.expert_begin);
      g.active = i32(r.active);
      g.active_slots = int(r.active.numel());
      g.out = int(out);
      g.row = row;
      cuda::launch_routed_linears(g, int(experts), max_rows, stream_);
    });
  }

  void quantize_rows(const quant::QuantSpec& spec, const Tensor& x, void* q) override {
    const cuda::QuantParams p = quant_params(spec, x, q, "quantize_rows", "x");
    bind();
    dispatch_float(x.dtype, [&](auto e) {
      using E = decltype(e);
      cuda::launch_quantize_rows(p, elems<E>(x), static_cast<uint8_t*>(q), stream_);
    });
  }

  void dequantize_rows(const quant::QuantSpec& spec, const void* q, const Tensor& out) override {
    const cuda::QuantParams p = quant_params(spec, out, q, "dequantize_rows", "out");
    bind();
    dispatch_float(out.dtype, [&](auto e) {
      using E = decltype(e);
      cuda::launch_dequantize_rows(p, static_cast<const uint8_t*>(q), elems_mut<E>(out), stream_);
    });
  }

  void argmax_rows(const Tensor& logits, const Tensor& out) override {
    const bool f32 = logits.dtype == DType::F32;
    check_tensor(logits, f32 ? DType::F32 : act_, "argmax_rows", "logits");
    check_i32(out, "argmax_rows", "out");
    const int64_t V = logits.row_size();
    STRATA_CHECK(out.numel() == logits.dim(0) && V > 0 && V <= INT_MAX,
                 "cuda argmax_rows: logits " << logits.shape_str() << " out " << out.shape_str());
    bind();
    int32_t* ids = static_cast<int32_t*>(out.data);
    dispatch_float(logits.dtype, [&](auto e) {
      using E = decltype(e);
      cuda::launch_argmax_rows(elems<E>(logits), logits.dim(0), V, ids, stream_);
    });
  }

  bool samples_on_device() const override { return true; }

  void row_candidates(const Tensor& logits, const Tensor& temperatures, int64_t capacity, void* out) override {
    const bool f32 = logits.dtype == DType::F32;
    check_tensor(logits, f32 ? DType::F32 : act_, "row_candidates", "logits");
    check_tensor(temperatures, DType::F32, "row_candidates", "temperatures");
    const int64_t V = logits.row_size();
    STRATA_CHECK(temperatures.numel() == logits.dim(0) && V > 0 && V <= INT_MAX && capacity > 0 &&
                     capacity <= kMaxRowCandidates && reinterpret_cast<uintptr_t>(out) % 8 == 0,
                 "cuda row_candidates: logits " << logits.shape_str() << " temperatures " << temperatures.shape_str()
                                                << " capacity " << capacity);
    bind();
    dispatch_float(logits.dtype, [&](auto e) {
      using E = decltype(e);
      cuda::launch_row_candidates(elems<E>(logits), logits.dim(0), V, static_cast<const float*>(temperatures.data),
                                  int(capacity), static_cast<uint8_t*>(out), stream_);
    });
  }

  void target_ranks(const Tensor& logits, const Tensor& targets, void* out) override {
    const bool f32 = logits.dtype == DType::F32;
    check_tensor(logits, f32 ? DType::F32 : act_, "target_ranks", "logits");
    check_i32(targets, "target_ranks", "targets");
    const int64_t V = logits.row_size();
    STRATA_CHECK(targets.numel() == logits.dim(0) && V > 0 && V <= INT_MAX && reinterpret_cast<uintptr_t>(out) % 8 == 0,
                 "cuda target_ranks: logits " << logits.shape_str() << " targets " << targets.shape_str());
    bind();
    dispatch_float(logits.dtype, [&](auto e) {
      using E = decltype(e);
      cuda::launch_target_ranks(elems<E>(logits), logits.dim(0), V, static_cast<const int32_t*>(targets.data),
                                static_cast<uint8_t*>(out), stream_);
    });
  }

private:
  // Rows, row length and spec of a quantize/dequantize call, checked (rows of the activation
  // dtype or F32 on the GPU, the quantized buffer 4-byte aligned).
  cuda::QuantParams quant_params(const quant::QuantSpec& spec, const Tensor& t, const void* q, const char* op,
                                 const char* what) const {
    STRATA_CHECK(t.device == Device::CUDA && t.ndim >= 1, "cuda " << op << ": " << what << " must be on the GPU");
    STRATA_CHECK(t.dtype == act_ || t.dtype == DType::F32, "cuda " << op << ": " << what << " must be "
                                                                    << dtype_name(act_) << " or F32, got "
                                                                    << dtype_name(t.dtype));
    STRATA_CHECK(reinterpret_cast<uintptr_t>(q) % 4 == 0, "cuda " << op << ": the quantized buffer must be 4-byte aligned");
    const int64_t n = t.dim(t.ndim - 1);
    cuda::QuantParams p;
    p.row = row_layout(spec, n, op);
    p.rows = t.numel() / n;
    return p;
  }

  // linear()'s checks for a quantized w; returns its spec.
  quant::QuantSpec check_quant_linear(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y) const {
    check_act(x, "linear", "x");
    check_act(y, "linear", "y");
    const quant::QuantSpec spec = check_quantized(w, "linear", "w");
    const int64_t T = x.dim(0), in = x.row_size(), out = w.dim(0);
    STRATA_CHECK(w.ndim == 2 && w.dim(1) == in && y.dim(0) == T && y.row_size() == out && out <= INT_MAX,
                 "cuda linear: x " << x.shape_str() << " w " << w.shape_str() << " y " << y.shape_str());
    STRATA_CHECK(y.data != x.data, "cuda linear: y must not alias x");
    if (!bias.empty()) {
      check_act(bias, "linear", "bias");
      STRATA_CHECK(bias.numel() == out, "cuda linear: bias " << bias.shape_str() << " for " << out << " outputs");
    }
    return spec;
  }

  // linear() with a quantized w: the fused dequant kernel (quant_linear.cu).
  void quant_linear(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y) {
    const quant::QuantSpec spec = check_quant_linear(x, w, bias, y);
    const int64_t T = x.dim(0), in = x.row_size(), out = w.dim(0);
    if (T == 0 || out == 0) return;
    bind();
    dispatch([&](auto e) {
      using E = decltype(e);
      cuda::QuantLinearParams<E> p{};
      p.x = elems<E>(x);
      p.w = static_cast<const uint8_t*>(w.data);
      p.bias = bias.empty() ? nullptr : elems<E>(bias);
      p.y = elems_mut<E>(y);
      p.tokens = T;
      p.out = int(out);
      p.row = row_layout(spec, in, "linear");
      cuda::launch_quant_linear(p, stream_);
    });
  }

  // Both caches quantized alike, [S, C, kv_heads, d]; returns the layout of one (position, head) row.
  static cuda::QuantRowLayout quant_caches(const Tensor& cache_k, const Tensor& cache_v, const char* op) {
    const quant::QuantSpec spec = check_quantized(cache_k, op, "cache_k");
    check_quantized(cache_v, op, "cache_v");
    STRATA_CHECK(cache_k.ndim == 4 && cache_v.ndim == 4 && cache_k.shape == cache_v.shape &&
                     cache_k.dtype == cache_v.dtype && cache_k.group == cache_v.group,
                 "cuda " << op << ": caches " << dtype_name(cache_k.dtype) << "/" << cache_k.group << " "
                         << cache_k.shape_str() << " and " << dtype_name(cache_v.dtype) << "/" << cache_v.group << " "
                         << cache_v.shape_str());
    STRATA_CHECK(cache_k.dim(0) <= INT_MAX && cache_k.dim(1) <= INT_MAX && cache_k.dim(2) <= INT_MAX,
                 "cuda " << op << ": cache " << cache_k.shape_str() << " too large");
    return row_layout(spec, cache_k.dim(3), op);
  }

  void quant_kv_store(const Tensor& k, const Tensor& v, const Tensor& cache_k, const Tensor& cache_v,
                      const Tensor& slots, const Tensor& positions) {
    check_act(k, "kv_store", "k");
    check_act(v, "kv_store", "v");
    check_i32(slots, "kv_store", "slots");
    check_i32(positions, "kv_store", "positions");
    const cuda::QuantRowLayout l = quant_caches(cache_k, cache_v, "kv_store");
    const int64_t T = k.dim(0), kv_heads = cache_k.dim(2);
    STRATA_CHECK(k.row_size() == kv_heads * l.n && v.numel() == k.numel() && v.dim(0) == T && slots.numel() == T &&
                     positions.numel() == T,
                 "cuda kv_store: k " << k.shape_str() << " v " << v.shape_str() << " cache " << cache_k.shape_str()
                                     << " slots " << slots.shape_str() << " positions " << positions.shape_str());
    bind();
    dispatch([&](auto e) {
      using E = decltype(e);
      cuda::QuantKvStoreParams<E> p{};
      p.k = elems<E>(k);
      p.v = elems<E>(v);
      p.cache_k = static_cast<uint8_t*>(cache_k.data);
      p.cache_v = static_cast<uint8_t*>(cache_v.data);
      p.slots = i32(slots);
      p.positions = i32(positions);
      p.tokens = T;
      p.kv_heads = int(kv_heads);
      p.slot_count = int(cache_k.dim(0));
      p.capacity = int(cache_k.dim(1));
      p.row = l;
      cuda::launch_quant_kv_store(p, stream_);
    });
  }

  void quant_attention(const Tensor& q, const Tensor& cache_k, const Tensor& cache_v, const Tensor& slots,
                       const Tensor& positions, const AttentionSpec& spec, const Tensor& out) {
    check_act(q, "attention", "q");
    check_i32(slots, "attention", "slots");
    check_i32(positions, "attention", "positions");
    check_act(out, "attention", "out");
    const cuda::QuantRowLayout l = quant_caches(cache_k, cache_v, "attention");
    STRATA_CHECK(q.ndim == 3, "cuda attention: q " << q.shape_str());
    const int64_t T = q.dim(0), heads = q.dim(1), d = q.dim(2), kv_heads = cache_k.dim(2);
    STRATA_CHECK(l.n == d && kv_heads > 0 && heads % kv_heads == 0 && out.numel() == q.numel() && out.dim(0) == T &&
                     slots.numel() == T && positions.numel() == T,
                 "cuda attention: q " << q.shape_str() << " cache " << cache_k.shape_str() << " out "
                                      << out.shape_str() << " slots " << slots.shape_str() << " positions "
                                      << positions.shape_str());
    STRATA_CHECK(d <= cuda::kMaxHeadDim, "cuda attention: head dim " << d << " exceeds " << cuda::kMaxHeadDim);
    STRATA_CHECK(heads <= 65535 && q.dim(0) * heads <= INT_MAX, "cuda attention: " << heads << " heads too many");
    bind();
    dispatch([&](auto e) {
      using E = decltype(e);
      cuda::QuantAttentionParams<E> p{};
      p.q = elems<E>(q);
      p.cache_k = static_cast<const uint8_t*>(cache_k.data);
      p.cache_v = static_cast<const uint8_t*>(cache_v.data);
      p.slots = i32(slots);
      p.positions = i32(positions);
      p.out = elems_mut<E>(out);
      p.tokens = T;
      p.heads = int(heads);
      p.kv_heads = int(kv_heads);
      p.slot_count = int(cache_k.dim(0));
      p.capacity = int(cache_k.dim(1));
      p.scale = spec.scale;
      p.window = spec.window;
      p.softcap = spec.softcap;
      p.sinks = spec.sinks;
      p.row = l;
      if (cuda::tensor_core_attention_enabled() && cuda::tensor_core_attention_supports(l.n, q.dim(0))) {
        cuda::launch_tensor_core_quant_attention(p, stream_);
        p.skip_tensor_core_tiles = true;
      }
      const int chunks = split_kv_chunks(q.dim(0), heads, kv_heads, window_keys(spec, cache_k.dim(1)));
      if (chunks == 0) {
        cuda::launch_quant_attention(p, stream_);
        return;
      }
      std::lock_guard<std::mutex> lock(split_mu_);
      cuda::launch_split_quant_attention(p, split_scratch(q.dim(0), int(heads), int(d), chunks), stream_);
    });
  }

  // The routing's pieces for T tokens choosing k of E experts (backend.h, DeviceRouting).
  static void check_routing(const DeviceRouting& r, int64_t T, int64_t E, int64_t k, const char* op) {
    check_i32(r.gather, op, "gather");
    check_i32(r.combine_rows, op, "combine_rows");
    check_tensor(r.combine_weights, DType::F32, op, "combine_weights");
    check_i32(r.expert_begin, op, "expert_begin");
    check_i32(r.active, op, "active");
    check_i32(r.totals, op, "totals");
    const int64_t A = T * k;
    STRATA_CHECK(r.gather.numel() == A && r.combine_rows.numel() == A && r.combine_weights.numel() == A &&
                     r.expert_begin.numel() == E + 1 && r.active.numel() == std::min(E, A) && r.totals.numel() == 3,
                 "cuda " << op << ": routing pieces gather " << r.gather.shape_str() << " combine_rows "
                         << r.combine_rows.shape_str() << " combine_weights " << r.combine_weights.shape_str()
                         << " expert_begin " << r.expert_begin.shape_str() << " active " << r.active.shape_str()
                         << " totals " << r.totals.shape_str() << " for " << T << " tokens choosing " << k << " of "
                         << E << " experts");
  }

  // split_qkv's checks and parameters but for where k and v go.
  template <class E>
  cuda::SplitQkvParams<E> split_qkv_params(const Tensor& qkv, const Tensor& positions, const Tensor& inv_freq,
                                        const Tensor& q, int64_t kv_heads) {
    check_act(qkv, "split_qkv", "qkv");
    check_act(q, "split_qkv", "q");
    check_i32(positions, "split_qkv", "positions");
    const int64_t T = q.dim(0);
    STRATA_CHECK(q.ndim == 3 && qkv.dim(0) == T && qkv.row_size() == q.row_size() + 2 * kv_heads * q.dim(2) &&
                     positions.numel() == T && qkv.row_size() <= INT_MAX,
                 "cuda split_qkv: qkv " << qkv.shape_str() << " q " << q.shape_str() << " for " << kv_heads
                                        << " kv heads");
    if (!inv_freq.empty()) {
      check_tensor(inv_freq, DType::F32, "split_qkv", "inv_freq");
      STRATA_CHECK(q.dim(2) % 2 == 0 && inv_freq.numel() * 2 == q.dim(2),
                   "cuda split_qkv: inv_freq " << inv_freq.shape_str() << " for heads of " << q.dim(2));
    }
    bind();
    cuda::SplitQkvParams<E> p{};
    p.qkv = elems<E>(qkv);
    p.positions = i32(positions);
    p.inv_freq = inv_freq.empty() ? nullptr : static_cast<const float*>(inv_freq.data);
    p.q = elems_mut<E>(q);
    p.tokens = T;
    p.heads = int(q.dim(1));
    p.kv_heads = int(kv_heads);
    p.head_dim = int(q.dim(2));
    return p;
  }

  // Chunks of split-KV attention for a call (split_kv.h's rule, or STRATA_SPLIT_KV's count); 0:
  // the per-token kernel. The host does not know the step's positions (they live on the device),
  // so the rule takes the cache's capacity as the longest context; each block cuts its chunk from
  // its own token's position, so on shorter contexts the later chunks are empty and return at once.
  int split_kv_chunks(int64_t tokens, int64_t heads, int64_t kv_heads, int64_t capacity) const {
    if (split_kv_setting_ != cuda::kSplitKvAuto) return split_kv_setting_;
    const int chunks = cuda::split_kv_chunks(tokens, int(heads), int(kv_heads), capacity, sm_count_);
    return chunks > 1 ? chunks : 0;
  }
  // The most keys one token reads: the capacity, or a sliding window shorter than it (plus the
  // tile the window may start inside).
  static int64_t window_keys(const AttentionSpec& spec, int64_t capacity) {
    return spec.window > 0 ? std::min<int64_t>(capacity, int64_t(spec.window) + cuda::kSplitKvTileKeys) : capacity;
  }

  // The split kernels' partials, grow-only (a few MiB under the rule: tokens x heads < 2 x SMs,
  // at most kSplitKvMaxChunks chunks). Callers hold split_mu_ from here through the launch, so
  // two threads' partials never share it. Before freeing a smaller one the stream drains, since
  // only its kernels read it.
  cuda::SplitKvScratch split_scratch(int64_t tokens, int heads, int head_dim, int chunks) {
    const size_t bytes = cuda::split_kv_scratch_bytes(tokens, heads, head_dim, chunks);
    if (bytes > split_scratch_bytes_) {
      if (split_scratch_) {
        TimedHostWait wait;
        STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
        STRATA_CUDA_CHECK(cudaFree(split_scratch_));
        split_scratch_ = nullptr;
        split_scratch_bytes_ = 0;
      }
      STRATA_CUDA_CHECK(cudaMalloc(&split_scratch_, bytes));
      split_scratch_bytes_ = bytes;
    }
    return cuda::split_kv_scratch(split_scratch_, tokens, heads, head_dim, chunks);
  }

  // The activation dtype's tensors reach the kernels as their element type: f(__half{}) or
  // f(bf16{}); dispatch_float also takes F32 tensors (f(float{})).
  template <class F>
  void dispatch(F&& f) const {
    if (act_ == DType::BF16) f(cuda::bf16{});
    else f(__half{});
  }
  template <class F>
  void dispatch_float(DType dt, F&& f) const {
    if (dt == DType::F32) f(float{});
    else dispatch(f);
  }
  void check_act(const Tensor& t, const char* op, const char* what) const { check_tensor(t, act_, op, what); }

  // Makes this backend's GPU current for the calling thread (cheap; callers may use many threads).
  void bind() const { STRATA_CUDA_CHECK(cudaSetDevice(device_)); }

  static bool sync_debug() { return cuda::sync_debug_enabled(); }

  cudaStream_t stream_of(Stream s) const {
    switch (s) {
      case Stream::HostToDevice: return copy_streams_[0];
      case Stream::DeviceToHost: return copy_streams_[1];
      default: return stream_;
    }
  }

  void destroy() noexcept {
    (void)cudaSetDevice(device_);
    if (stream_) (void)cudaStreamSynchronize(stream_);
    if (cublas_) (void)cublasDestroy(cublas_);
    if (workspace_) (void)cudaFree(workspace_);
    if (split_scratch_) (void)cudaFree(split_scratch_);
    if (stream_) (void)cudaStreamDestroy(stream_);
    for (cudaStream_t& s : copy_streams_) {
      if (s) (void)cudaStreamDestroy(s);
      s = nullptr;
    }
    for (cudaEvent_t& e : copy_done_) {
      if (e) (void)cudaEventDestroy(e);
      e = nullptr;
    }
    for (Staging& st : staging_) {
      if (st.done) (void)cudaEventDestroy(st.done);
      if (st.host) (void)cudaFreeHost(st.host);
      st = Staging();
    }
    cublas_ = nullptr;
    workspace_ = nullptr;
    split_scratch_ = nullptr;
    split_scratch_bytes_ = 0;
    stream_ = nullptr;
  }

  int device_ = 0;
  DType act_ = DType::F16;
  cudaStream_t stream_ = nullptr;
  cudaStream_t copy_streams_[2] = {nullptr, nullptr};  // host-to-device, device-to-host
  cudaEvent_t copy_done_[2] = {nullptr, nullptr};      // each copy stream's last copy, waited on by blocking
  cublasHandle_t cublas_ = nullptr;
  void* workspace_ = nullptr;
  int sm_count_ = 0;
  int split_kv_setting_ = cuda::kSplitKvAuto;  // STRATA_SPLIT_KV, read at construction
  void* split_scratch_ = nullptr;
  size_t split_scratch_bytes_ = 0;
  std::mutex split_mu_;
  std::shared_ptr<EventPool> events_;
  // upload()'s ring of pinned buffers, each with the event of its last copy.
  struct Staging {
    void* host = nullptr;
    size_t bytes = 0;
    cudaEvent_t done = nullptr;
    bool used = false;
  };
  std::array<Staging, 16> staging_;
  size_t next_staging_ = 0;
  std::mutex staging_mu_;
};

int device_count(cudaError_t* err_out) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    n = 0;
  }
  if (err_out) *err_out = err;
  return n;
}

}  // namespace

bool cuda_available() {
  static const bool available = device_count(nullptr) > 0;
  return available;
}

int64_t device_launches_issued() { return cuda::launches_issued(); }

std::unique_ptr<Backend> make_cuda_backend(int device_index, DType activations) {
  cudaError_t err = cudaSuccess;
  const int n = device_count(&err);
  if (err != cudaSuccess)
    STRATA_FAIL("cuda: no usable GPU (" << cudaGetErrorName(err) << ": " << cudaGetErrorString(err)
                                        << "); use --device cpu");
  if (n == 0) STRATA_FAIL("cuda: no GPU found; use --device cpu");
  if (device_index < 0 || device_index >= n)
    STRATA_FAIL("cuda: GPU index " << device_index << " out of range (" << n << " GPU(s) found)");
  STRATA_CHECK(activations == DType::F16 || activations == DType::BF16,
               "cuda: activations must be F16 or BF16, got " << dtype_name(activations));
  if (activations == DType::BF16 && !cuda_has_bf16(device_index)) {
    const CudaCapability cc = cuda_compute_capability(device_index);
    STRATA_FAIL("cuda: --dtype bf16 needs compute capability 8.0 or newer (Ampere); GPU " << device_index << " ("
                                                                                      << cuda_device_name(device_index)
                                                                                      << ") has " << cc.major << "."
                                                                                      << cc.minor
                                                                                      << "; use --dtype fp16");
  }
  return std::make_unique<CudaBackend>(device_index, activations);
}

}  // namespace strata
