// fake_runtime.cpp's asynchronous mode (README.md, "Asynchronous mode"), through the runtime
// calls alone: work queued on streams runs late and in a random order among streams, which only
// stream order and events constrain; the same seed gives the same order; the synchronous mode
// still completes each call before it returns; arguments are still checked at the call.
#include <catch2/catch.hpp>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

// The asynchronous mode with `seed` for the scope (nullptr: synchronous). The runtime reads
// STRATA_EMULATED_ASYNC when a stream is created, as when a test creates its backend.
class Mode {
public:
  explicit Mode(const char* seed) { set(seed); }
  explicit Mode(int seed) : Mode(std::to_string(seed).c_str()) {}
  ~Mode() { set(nullptr); }
  Mode(const Mode&) = delete;
  Mode& operator=(const Mode&) = delete;

private:
  static void set(const char* seed) {
    if (seed)
      setenv("STRATA_EMULATED_ASYNC", seed, 1);
    else
      unsetenv("STRATA_EMULATED_ASYNC");
    cudaStream_t s;
    REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
  }
};

struct Stream {
  Stream() { REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess); }
  ~Stream() { cudaStreamDestroy(s); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t s;
};
struct Event {
  Event() { REQUIRE(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess); }
  ~Event() { cudaEventDestroy(e); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t e;
};
struct DeviceBytes {
  explicit DeviceBytes(size_t n) : bytes(n) { REQUIRE(cudaMalloc(&p, n) == cudaSuccess); }
  ~DeviceBytes() { cudaFree(p); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  void* p;
  size_t bytes;
};
struct HostBytes {
  explicit HostBytes(size_t n, unsigned char fill = 0) : bytes(n) {
    REQUIRE(cudaHostAlloc(reinterpret_cast<void**>(&p), n, cudaHostAllocPortable) == cudaSuccess);
    std::memset(p, fill, n);
  }
  ~HostBytes() { cudaFreeHost(p); }
  HostBytes(const HostBytes&) = delete;
  HostBytes& operator=(const HostBytes&) = delete;
  bool all(unsigned char v) const { return std::all_of(p, p + bytes, [v](unsigned char b) { return b == v; }); }
  unsigned char* p;
  size_t bytes;
};

constexpr size_t kBytes = 4096;

// A kernel that records which launch ran, in order: (stream, index) from lane 0 of its one block.
std::vector<std::pair<int, int>> trace;
void trace_kernel(int stream, int index) {
  __syncthreads();  // every lane of the block takes part, as in a real kernel
  if (threadIdx.x == 0) trace.emplace_back(stream, index);
}
void launch_trace(int stream, int index, cudaStream_t s) {
  emu::Launch([](const auto&... a) { trace_kernel(a...); }, emu::LaunchConfig{1, 32, 0, s}).run(stream, index);
}

// Three streams of ten launches each, issued round-robin, then the device synchronised: the order
// the kernels ran in.
std::vector<std::pair<int, int>> traced_run(int seed) {
  Mode mode(seed);
  Stream streams[3];
  trace.clear();
  for (int i = 0; i < 10; ++i)
    for (int s = 0; s < 3; ++s) launch_trace(s, i, streams[s].s);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  return trace;
}

}  // namespace

TEST_CASE("emulated async: a copy on another stream sees a write only after waiting for its event",
          "[emulated][async]") {
  for (bool by_copy : {false, true}) {
    int stale = 0, fresh = 0;
    for (int seed = 1; seed <= 64; ++seed) {
      for (bool wait : {false, true}) {
        Mode mode(seed);
        Stream a, b;
        Event written;
        DeviceBytes d(kBytes);
        HostBytes source(kBytes, 0xAB), seen(kBytes);
        REQUIRE(cudaMemsetAsync(d.p, 0, kBytes, a.s) == cudaSuccess);
        REQUIRE(cudaStreamSynchronize(a.s) == cudaSuccess);
        // Stream a writes 0xAB; stream b copies the buffer back.
        if (by_copy)
          REQUIRE(cudaMemcpyAsync(d.p, source.p, kBytes, cudaMemcpyHostToDevice, a.s) == cudaSuccess);
        else
          REQUIRE(cudaMemsetAsync(d.p, 0xAB, kBytes, a.s) == cudaSuccess);
        REQUIRE(cudaEventRecord(written.e, a.s) == cudaSuccess);
        if (wait) REQUIRE(cudaStreamWaitEvent(b.s, written.e, 0) == cudaSuccess);
        REQUIRE(cudaMemcpyAsync(seen.p, d.p, kBytes, cudaMemcpyDeviceToHost, b.s) == cudaSuccess);
        REQUIRE(cudaStreamSynchronize(b.s) == cudaSuccess);
        INFO("seed " << seed << (by_copy ? ", written by a copy" : ", written by a memset"));
        REQUIRE((seen.all(0) || seen.all(0xAB)));  // an item runs whole
        if (wait)
          CHECK(seen.all(0xAB));
        else
          ++(seen.all(0xAB) ? fresh : stale);
      }
    }
    INFO((by_copy ? "written by a copy" : "written by a memset"));
    CHECK(stale > 0);  // without the wait, some seeds run the copy back first
    CHECK(fresh > 0);
  }
}

TEST_CASE("emulated async: a wait is for the event's record as of the call, not a later one", "[emulated][async]") {
  int early = 0;
  for (int seed = 1; seed <= 64; ++seed) {
    Mode mode(seed);
    Stream a, b;
    Event e;
    DeviceBytes d(kBytes);
    HostBytes seen(kBytes);
    REQUIRE(cudaMemsetAsync(d.p, 1, kBytes, a.s) == cudaSuccess);
    REQUIRE(cudaEventRecord(e.e, a.s) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(b.s, e.e, 0) == cudaSuccess);
    REQUIRE(cudaMemsetAsync(d.p, 2, kBytes, a.s) == cudaSuccess);
    REQUIRE(cudaEventRecord(e.e, a.s) == cudaSuccess);  // after the wait: b does not wait for this one
    REQUIRE(cudaMemcpyAsync(seen.p, d.p, kBytes, cudaMemcpyDeviceToHost, b.s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(b.s) == cudaSuccess);
    INFO("seed " << seed);
    CHECK((seen.all(1) || seen.all(2)));
    early += seen.all(1);
  }
  CHECK(early > 0);
}

TEST_CASE("emulated async: one stream's work runs in issue order", "[emulated][async]") {
  for (int seed = 1; seed <= 32; ++seed) {
    Mode mode(seed);
    Stream a, other;
    DeviceBytes d(kBytes), copy(kBytes), noise(kBytes);
    HostBytes seen(kBytes), pattern(kBytes, 0x5A);
    for (int v = 1; v <= 20; ++v) {
      REQUIRE(cudaMemsetAsync(d.p, v, kBytes, a.s) == cudaSuccess);
      REQUIRE(cudaMemcpyAsync(copy.p, d.p, kBytes, cudaMemcpyDeviceToDevice, a.s) == cudaSuccess);
      REQUIRE(cudaMemsetAsync(noise.p, v, kBytes, other.s) == cudaSuccess);  // something else to pick
    }
    REQUIRE(cudaMemcpy2DAsync(d.p, 64, pattern.p, 64, 64, kBytes / 64, cudaMemcpyHostToDevice, a.s) == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(seen.p, copy.p, kBytes, cudaMemcpyDeviceToHost, a.s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(a.s) == cudaSuccess);
    INFO("seed " << seed);
    CHECK(seen.all(20));
    REQUIRE(cudaMemcpyAsync(seen.p, d.p, kBytes, cudaMemcpyDeviceToHost, a.s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(a.s) == cudaSuccess);
    CHECK(seen.all(0x5A));
  }
  // Kernels too: each stream's launches in the trace in issue order.
  for (int seed = 1; seed <= 8; ++seed) {
    const std::vector<std::pair<int, int>> t = traced_run(seed);
    REQUIRE(t.size() == 30);
    int next[3] = {};
    for (const auto& [s, i] : t) CHECK(i == next[s]++);
  }
}

TEST_CASE("emulated async: synchronising on an event or a stream makes the work visible on the host",
          "[emulated][async]") {
  int not_ready = 0;
  for (int seed = 1; seed <= 32; ++seed) {
    Mode mode(seed);
    Stream a;
    Event e;
    DeviceBytes d(kBytes);
    HostBytes seen(kBytes);
    INFO("seed " << seed);
    CHECK(cudaEventQuery(e.e) == cudaSuccess);  // never recorded
    CHECK(cudaEventSynchronize(e.e) == cudaSuccess);
    for (int v = 1; v <= 8; ++v) REQUIRE(cudaMemsetAsync(d.p, v, kBytes, a.s) == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(seen.p, d.p, kBytes, cudaMemcpyDeviceToHost, a.s) == cudaSuccess);
    REQUIRE(cudaEventRecord(e.e, a.s) == cudaSuccess);
    const cudaError_t first = cudaEventQuery(e.e);
    CHECK((first == cudaSuccess || first == cudaErrorNotReady));
    CHECK(cudaGetLastError() == cudaSuccess);  // not ready is no error
    not_ready += first == cudaErrorNotReady;
    REQUIRE(cudaEventSynchronize(e.e) == cudaSuccess);
    CHECK(seen.all(8));
    CHECK(cudaEventQuery(e.e) == cudaSuccess);

    // A host polling the event sees it complete: the device makes progress meanwhile.
    REQUIRE(cudaMemsetAsync(d.p, 9, kBytes, a.s) == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(seen.p, d.p, kBytes, cudaMemcpyDeviceToHost, a.s) == cudaSuccess);
    REQUIRE(cudaEventRecord(e.e, a.s) == cudaSuccess);
    while (cudaEventQuery(e.e) == cudaErrorNotReady) {
    }
    CHECK(seen.all(9));

    REQUIRE(cudaMemsetAsync(d.p, 10, kBytes, a.s) == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(seen.p, d.p, kBytes, cudaMemcpyDeviceToHost, a.s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(a.s) == cudaSuccess);
    CHECK(seen.all(10));
  }
  CHECK(not_ready > 0);
}

TEST_CASE("emulated async: kernel launches are queued with their arguments copied", "[emulated][async]") {
  int queued = 0;
  for (int seed = 1; seed <= 16; ++seed) {
    Mode mode(seed);
    Stream a;
    trace.clear();
    int index = 7;
    launch_trace(0, index, a.s);
    queued += trace.empty();
    index = 8;  // too late for the launch
    REQUIRE(cudaStreamSynchronize(a.s) == cudaSuccess);
    INFO("seed " << seed);
    REQUIRE(trace.size() == 1);
    CHECK(trace[0].second == 7);
  }
  CHECK(queued > 0);
}

TEST_CASE("emulated async: the GEMM reads alpha and the handle's stream at the call", "[emulated][async]") {
  // C (2x2, fp32) = alpha A B with A = B = I (fp16): C = alpha I.
  const _Float16 identity[4] = {1, 0, 0, 1};
  for (int seed = 1; seed <= 16; ++seed) {
    Mode mode(seed);
    Stream a, b;
    cublasHandle_t handle;
    REQUIRE(cublasCreate(&handle) == CUBLAS_STATUS_SUCCESS);
    DeviceBytes ab(sizeof identity), c(4 * sizeof(float));
    REQUIRE(cudaMemcpyAsync(ab.p, identity, sizeof identity, cudaMemcpyHostToDevice, a.s) == cudaSuccess);
    REQUIRE(cublasSetStream(handle, a.s) == CUBLAS_STATUS_SUCCESS);
    float alpha = 2, beta = 0;
    REQUIRE(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &alpha, ab.p, CUDA_R_16F, 2, ab.p, CUDA_R_16F, 2,
                         &beta, c.p, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
    alpha = 100;
    REQUIRE(cublasSetStream(handle, b.s) == CUBLAS_STATUS_SUCCESS);  // the GEMM stays on a
    float out[4] = {};
    HostBytes seen(sizeof out);
    REQUIRE(cudaMemcpyAsync(seen.p, c.p, sizeof out, cudaMemcpyDeviceToHost, a.s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(a.s) == cudaSuccess);
    std::memcpy(out, seen.p, sizeof out);
    INFO("seed " << seed);
    CHECK(out[0] == 2.0f);
    CHECK(out[1] == 0.0f);
    CHECK(out[2] == 0.0f);
    CHECK(out[3] == 2.0f);
    REQUIRE(cublasDestroy(handle) == CUBLAS_STATUS_SUCCESS);
  }
}

TEST_CASE("emulated async: the same seed and calls give the same interleaving", "[emulated][async]") {
  const std::vector<std::pair<int, int>> first = traced_run(5);
  CHECK(traced_run(5) == first);
  // Different seeds, different interleavings, and not only the issue order.
  std::vector<std::pair<int, int>> issued;
  for (int i = 0; i < 10; ++i)
    for (int s = 0; s < 3; ++s) issued.emplace_back(s, i);
  std::vector<std::vector<std::pair<int, int>>> seen;
  for (int seed = 1; seed <= 8; ++seed) {
    std::vector<std::pair<int, int>> t = traced_run(seed);
    if (std::find(seen.begin(), seen.end(), t) == seen.end()) seen.push_back(std::move(t));
  }
  CHECK(seen.size() > 4);
  CHECK(std::any_of(seen.begin(), seen.end(), [&](const auto& t) { return t != issued; }));
}

TEST_CASE("emulated async: without the variable (or with 0) every call completes before it returns",
          "[emulated][async]") {
  for (const char* setting : {static_cast<const char*>(nullptr), "", "0"}) {
    Mode mode(setting);
    Stream a, b;
    Event e;
    DeviceBytes d(kBytes);
    HostBytes seen(kBytes);
    INFO("STRATA_EMULATED_ASYNC=" << (setting ? setting : "(unset)"));
    REQUIRE(cudaMemsetAsync(d.p, 0x33, kBytes, a.s) == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(seen.p, d.p, kBytes, cudaMemcpyDeviceToHost, b.s) == cudaSuccess);
    CHECK(seen.all(0x33));
    REQUIRE(cudaEventRecord(e.e, a.s) == cudaSuccess);
    CHECK(cudaEventQuery(e.e) == cudaSuccess);
    trace.clear();
    launch_trace(0, 1, a.s);
    CHECK(trace.size() == 1);
  }
}

TEST_CASE("emulated async: bad arguments fail at the call, and nothing is queued", "[emulated][async]") {
  Mode mode(11);
  Stream a;
  DeviceBytes d(kBytes);
  HostBytes host(kBytes, 0x44), other(kBytes, 0x55);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  // A host pointer on the device side, and the reverse.
  CHECK(cudaMemcpyAsync(host.p, other.p, kBytes, cudaMemcpyHostToDevice, a.s) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaMemcpyAsync(d.p, host.p, kBytes, cudaMemcpyDeviceToHost, a.s) == cudaErrorInvalidValue);
  // Past the allocation's end.
  CHECK(cudaMemcpyAsync(host.p, d.p, kBytes + 1, cudaMemcpyDeviceToHost, a.s) == cudaErrorInvalidValue);
  CHECK(cudaMemsetAsync(host.p, 0, kBytes, a.s) == cudaErrorInvalidValue);
  CHECK(cudaMemsetAsync(d.p, 0, kBytes + 1, a.s) == cudaErrorInvalidValue);
  // A row wider than its pitch.
  CHECK(cudaMemcpy2DAsync(host.p, 16, d.p, 64, 32, 4, cudaMemcpyDeviceToHost, a.s) == cudaErrorInvalidValue);
  CHECK(cudaStreamWaitEvent(a.s, nullptr, 0) == cudaErrorInvalidValue);
  cublasHandle_t handle;
  REQUIRE(cublasCreate(&handle) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasSetStream(handle, a.s) == CUBLAS_STATUS_SUCCESS);
  const float alpha = 1, beta = 0;
  CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &alpha, d.p, CUDA_R_16F, 2, d.p, CUDA_R_16F, 2, &beta,
                     host.p, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE);
  REQUIRE(cublasDestroy(handle) == CUBLAS_STATUS_SUCCESS);
  (void)cudaGetLastError();
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(host.all(0x44));
  CHECK(other.all(0x55));
}

TEST_CASE("emulated async: host threads issuing and synchronising at once", "[emulated][async]") {
  // Four threads (the engine's most), each on its own stream; whichever thread makes progress runs
  // the others' items, kernels included. Under ThreadSanitizer a missing order between an item
  // and the host reading its result is a data race.
  Mode mode(3);
  constexpr int kThreads = 4, kRounds = 40;
  std::vector<int> results(kThreads * kRounds, -1);
  std::vector<int> failures(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([t, &results, &failures] {
      cudaStream_t s;
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      void* d = nullptr;
      unsigned char* seen = nullptr;
      cudaMalloc(&d, kBytes);
      cudaHostAlloc(reinterpret_cast<void**>(&seen), kBytes, cudaHostAllocPortable);
      for (int r = 0; r < kRounds; ++r) {
        cudaMemsetAsync(d, r + t, kBytes, s);
        cudaMemcpyAsync(seen, d, kBytes, cudaMemcpyDeviceToHost, s);
        int* slot = &results[size_t(t * kRounds + r)];
        emu::Launch([](int* out, int v) { if (threadIdx.x == 0) *out = v; }, emu::LaunchConfig{1, 32, 0, s})
            .run(slot, r * 10 + t);
        cudaStreamSynchronize(s);
        failures[size_t(t)] += !std::all_of(seen, seen + kBytes, [&](unsigned char b) { return b == r + t; });
      }
      cudaFreeHost(seen);
      cudaFree(d);
      cudaStreamDestroy(s);
    });
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    CHECK(failures[size_t(t)] == 0);
    for (int r = 0; r < kRounds; ++r) CHECK(results[size_t(t * kRounds + r)] == r * 10 + t);
  }
}

TEST_CASE("emulated graphs: a capture records a stream's work, and each replay redoes it in order", "[emulated][graphs]") {
  for (const char* seed : {static_cast<const char*>(nullptr), "5"}) {
    Mode mode(seed);
    Stream s, other;
    DeviceBytes d(kBytes);
    HostBytes h(kBytes, 7);
    trace.clear();
    REQUIRE(cudaStreamBeginCapture(s.s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    int index = 1;
    launch_trace(0, index, s.s);
    index = 2;  // the launch copied its arguments: the graph keeps 1
    REQUIRE(cudaMemcpyAsync(d.p, h.p, kBytes, cudaMemcpyHostToDevice, s.s) == cudaSuccess);
    launch_trace(0, index, s.s);
    launch_trace(1, 9, other.s);  // another stream's launch runs as ever
    REQUIRE(cudaStreamSynchronize(other.s) == cudaSuccess);
    CHECK(trace == std::vector<std::pair<int, int>>{{1, 9}});  // nothing of the capture ran
    cudaGraph_t graph = nullptr;
    REQUIRE(cudaStreamEndCapture(s.s, &graph) == cudaSuccess);
    cudaGraphExec_t exec = nullptr;
    REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
    REQUIRE(cudaGraphDestroy(graph) == cudaSuccess);
    for (int replay = 0; replay < 2; ++replay) {
      std::memset(h.p, 40 + replay, kBytes);  // the copy reads the host bytes as they are at the replay
      REQUIRE(cudaGraphLaunch(exec, s.s) == cudaSuccess);
    }
    REQUIRE(cudaStreamSynchronize(s.s) == cudaSuccess);
    CHECK(trace == std::vector<std::pair<int, int>>{{1, 9}, {0, 1}, {0, 2}, {0, 1}, {0, 2}});
    HostBytes back(kBytes);
    REQUIRE(cudaMemcpyAsync(back.p, d.p, kBytes, cudaMemcpyDeviceToHost, s.s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s.s) == cudaSuccess);
    CHECK(back.all(41));
    REQUIRE(cudaGraphExecDestroy(exec) == cudaSuccess);
  }
}

TEST_CASE("emulated graphs: waiting for a capturing stream fails and invalidates the capture, as on a GPU",
          "[emulated][graphs]") {
  Stream s;
  Event e;
  trace.clear();
  for (int how = 0; how < 3; ++how) {
    REQUIRE(cudaStreamBeginCapture(s.s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    CHECK(cudaStreamBeginCapture(s.s, cudaStreamCaptureModeThreadLocal) == cudaErrorInvalidValue);
    launch_trace(0, how, s.s);
    const cudaError_t refused = how == 0   ? cudaStreamSynchronize(s.s)
                                : how == 1 ? cudaDeviceSynchronize()
                                           : cudaEventRecord(e.e, s.s);
    CHECK(refused == cudaErrorStreamCaptureUnsupported);
    cudaGraph_t graph = reinterpret_cast<cudaGraph_t>(&s);
    const cudaError_t ended = cudaStreamEndCapture(s.s, &graph);
    if (how != 1) {  // a call on the capturing stream itself invalidates its capture
      CHECK(ended == cudaErrorStreamCaptureInvalidated);
      CHECK(graph == nullptr);
    }
    if (graph) cudaGraphDestroy(graph);
  }
  CHECK(trace.empty());  // captured launches never ran
  CHECK(cudaStreamEndCapture(s.s, nullptr) == cudaErrorInvalidValue);  // not capturing
  (void)cudaGetLastError();
}
