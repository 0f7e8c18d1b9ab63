// The CUDA runtime and cuBLAS calls of cuda_backend.cpp, served from host memory, so the whole
// CUDA backend (its entries, the kernels' emulated source, the offloading engine over fp16 homes)
// runs in tests without a GPU (README.md, "The emulated CUDA backend"). One device of
// kEmulatedDeviceBytes. By default every copy, kernel and GEMM completes before its call returns,
// so streams and events have nothing to wait for; STRATA_EMULATED_ASYNC=<seed> queues them on
// their streams instead and runs them in a random order that only stream order and events
// constrain (README.md, "Asynchronous mode"; the Scheduler below). Copies check that the side the
// kind calls device memory lies inside one cudaMalloc allocation and the host side does not,
// which catches a host pointer handed to the device or the reverse (a kernel's arguments are not
// checked). Arguments are checked when the call is made, in either mode.
#include <cuda_bf16.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <vector>

struct EmulatedStream {
  uint64_t id;  // the scheduler's order among streams: the same calls give the same ids' order
  // While capturing (cudaStreamBeginCapture): the work recorded so far; invalid after a call that
  // a capture cannot hold.
  std::unique_ptr<std::vector<std::function<void()>>> capture;
  bool capture_invalid = false;
};
struct EmulatedGraph {
  std::vector<std::function<void()>> work;
};
struct EmulatedEvent {
  unsigned flags = 0;
  // Asynchronous mode: whether the most recent record has run (null: never recorded there). Under
  // the scheduler's mutex.
  std::shared_ptr<bool> latest;
};
struct EmulatedCublas {
  cudaStream_t stream = nullptr;
};

namespace {

constexpr size_t kEmulatedDeviceBytes = size_t(8) << 30;
constexpr int kDevices = 1;

struct DeviceMemory {
  std::mutex mu;
  std::map<uintptr_t, size_t> blocks;  // start -> bytes
  size_t used = 0;
};
DeviceMemory& device_memory() {
  static DeviceMemory m;
  return m;
}
thread_local cudaError_t last_error = cudaSuccess;

cudaError_t fail(cudaError_t err) {
  last_error = err;
  return err;
}

// [p, p + bytes) inside one device allocation.
bool on_device(const void* p, size_t bytes) {
  DeviceMemory& m = device_memory();
  std::lock_guard<std::mutex> lock(m.mu);
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = m.blocks.upper_bound(a);
  if (it == m.blocks.begin()) return false;
  --it;
  return a >= it->first && a + bytes <= it->first + it->second;
}
// No byte of [p, p + bytes) is device memory.
bool off_device(const void* p, size_t bytes) {
  DeviceMemory& m = device_memory();
  std::lock_guard<std::mutex> lock(m.mu);
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = m.blocks.lower_bound(a + bytes);
  if (it == m.blocks.begin()) return true;
  --it;
  return it->first + it->second <= a;
}
bool sides_ok(void* dst, size_t dst_span, const void* src, size_t src_span, cudaMemcpyKind kind) {
  switch (kind) {
    case cudaMemcpyHostToDevice: return on_device(dst, dst_span) && off_device(src, src_span);
    case cudaMemcpyDeviceToHost: return off_device(dst, dst_span) && on_device(src, src_span);
    case cudaMemcpyDeviceToDevice: return on_device(dst, dst_span) && on_device(src, src_span);
    default: return false;  // the backend always names the direction
  }
}

float half_bits_to_float(uint16_t bits) { return float(std::bit_cast<_Float16>(bits)); }
uint16_t float_to_half_bits(float f) { return std::bit_cast<uint16_t>(_Float16(f)); }
// A 16-bit element of a GEMM operand (fp16 or bf16) as float, and back with round to nearest even.
float element_to_float(uint16_t bits, cudaDataType type) {
  return type == CUDA_R_16BF ? __bfloat162float(__nv_bfloat16{bits}) : half_bits_to_float(bits);
}
uint16_t float_to_element(float f, cudaDataType type) {
  return type == CUDA_R_16BF ? __float2bfloat16_rn(f).bits : float_to_half_bits(f);
}

// The asynchronous mode's one scheduler for the process. Each stream has a FIFO queue of items (a
// copy, memset, kernel, GEMM, an event's record, or a wait for a record); an item can run when it
// heads its queue and, for a wait, its record has run. Runnable heads are picked uniformly at
// random (a seeded PRNG): a few at each enqueue, so that work lags the host by random amounts,
// and the rest when the host synchronises. Every item runs under the mutex, on whichever host
// thread made progress happen; a kernel's lanes then take emulation.h's launch mutex inside this
// one, and nothing an item does calls back into the runtime, so the two cannot deadlock. An item
// only ever waits for one enqueued before it, so while anything is queued the oldest item can
// run: run_one aborts rather than hang if that ever fails.
struct Item {
  std::function<void()> work;   // empty for a wait
  std::shared_ptr<bool> after;  // a wait: the record it waits for, done when *after
};
class Scheduler {
public:
  // Read without the mutex by each call's synchronous fast path, which costs only this load.
  std::atomic<bool> on{false};

  // Reads STRATA_EMULATED_ASYNC (unset, empty or "0": synchronous; else the seed). A change of
  // mode or seed first runs what is queued, then reseeds.
  void configure();
  // Queues `item` on the stream (or, if the mode has just ended, runs it), then runs a few items.
  void enqueue(uint64_t stream, Item item) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!on.load(std::memory_order_relaxed)) {
      if (item.work) item.work();
      return;
    }
    push(stream, std::move(item));
  }
  void record(uint64_t stream, EmulatedEvent* event) {
    std::lock_guard<std::mutex> lock(mu_);
    auto done = std::make_shared<bool>(false);
    event->latest = done;
    push(stream, Item{[done] { *done = true; }, nullptr});
  }
  // The stream's later items wait for the event's most recent record as of now.
  void wait(uint64_t stream, const EmulatedEvent* event) {
    std::lock_guard<std::mutex> lock(mu_);
    if (event->latest && !*event->latest) push(stream, Item{{}, event->latest});
  }
  bool query(const EmulatedEvent* event) {
    std::lock_guard<std::mutex> lock(mu_);
    progress();  // a host polling the event sees the device move on
    return !event->latest || *event->latest;
  }
  void sync_event(const EmulatedEvent* event) {
    std::lock_guard<std::mutex> lock(mu_);
    const std::shared_ptr<bool> done = event->latest;  // later records are not waited for
    while (done && !*done) run_one();
  }
  void sync_stream(uint64_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    while (queues_.count(stream) != 0) run_one();
  }
  void drain() {
    std::lock_guard<std::mutex> lock(mu_);
    while (!queues_.empty()) run_one();
  }

private:
  void push(uint64_t stream, Item item) {
    queues_[stream].push_back(std::move(item));
    progress();
  }
  // Half the time, 0 to 3 runnable items.
  void progress() {
    if (rng_() & 1)
      for (uint64_t n = rng_() % 4; n > 0 && !queues_.empty(); --n) run_one();
  }
  void run_one() {
    runnable_.clear();
    for (auto it = queues_.begin(); it != queues_.end(); ++it)
      if (!it->second.front().after || *it->second.front().after) runnable_.push_back(it);
    if (runnable_.empty()) {
      std::fprintf(stderr, "fake_runtime: queued work that can never run (a wait for a later record?)\n");
      std::abort();
    }
    const auto it = runnable_[size_t(rng_() % runnable_.size())];
    const Item item = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) queues_.erase(it);
    if (item.work) item.work();
  }
  std::mutex mu_;
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  std::map<uint64_t, std::deque<Item>> queues_;  // by stream id, so picks depend on no address; none empty
  std::vector<std::map<uint64_t, std::deque<Item>>::iterator> runnable_;  // run_one's, kept for its capacity
};
Scheduler& scheduler() {
  static Scheduler* s = new Scheduler;  // never destroyed: host threads may still call at exit
  return *s;
}
bool async_on() { return scheduler().on.load(std::memory_order_relaxed); }
uint64_t stream_id(cudaStream_t stream) {
  return stream ? static_cast<EmulatedStream*>(stream)->id : 0;  // stream 0: a stream of its own
}
// emu::launch_queue while the asynchronous mode is on: the launch, its arguments copied, queued.
void queue_launch(cudaStream_t stream, std::function<void()>&& kernel) {
  scheduler().enqueue(stream_id(stream), Item{std::move(kernel), nullptr});
}

// Stream capture: the stream's work goes to its recording instead (a capture is one thread's, on
// its own stream, so the recording needs no lock).
std::atomic<int> capturing_streams{0};
EmulatedStream* capturing(cudaStream_t stream) {
  auto* s = static_cast<EmulatedStream*>(stream);
  return s != nullptr && s->capture ? s : nullptr;
}
// emu::launch_queue while any stream captures: record the launch, else queue or run it.
void dispatch_launch(cudaStream_t stream, std::function<void()>&& kernel) {
  if (EmulatedStream* s = capturing(stream)) return s->capture->push_back(std::move(kernel));
  if (async_on()) return queue_launch(stream, std::move(kernel));
  kernel();
}
void set_launch_queue() {
  emu::launch_queue.store(capturing_streams.load() > 0 ? &dispatch_launch : async_on() ? &queue_launch : nullptr,
                          std::memory_order_release);
}
// A call a capture cannot hold: the capture becomes invalid and the call fails, as on a GPU.
cudaError_t refuse_in_capture(EmulatedStream* s) {
  s->capture_invalid = true;
  return fail(cudaErrorStreamCaptureUnsupported);
}

void Scheduler::configure() {
  const char* v = std::getenv("STRATA_EMULATED_ASYNC");
  const bool async = v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
  uint64_t seed = 0;
  if (async) {
    errno = 0;
    seed = std::strtoull(v, nullptr, 10);
    if (!std::all_of(v, v + std::strlen(v), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }) ||
        errno != 0) {
      std::fprintf(stderr, "fake_runtime: STRATA_EMULATED_ASYNC=%s is not an unsigned 64-bit seed\n", v);
      std::abort();
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (async == on.load(std::memory_order_relaxed) && (!async || seed == seed_)) return;
  while (!queues_.empty()) run_one();
  seed_ = seed;
  rng_.seed(seed);
  on.store(async, std::memory_order_relaxed);
  set_launch_queue();
}

// Runs `work` now (synchronous mode), queues it on the stream, or records it (a capture).
template <class Work>
void submit(cudaStream_t stream, Work work) {
  if (EmulatedStream* s = capturing(stream)) return s->capture->push_back(std::move(work));
  if (!async_on()) return work();
  scheduler().enqueue(stream_id(stream), Item{std::move(work), nullptr});
}

// C = alpha op(A) op(B) + beta C for cublasGemmEx, its arguments checked.
void gemm(cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k, float al, const uint16_t* a,
          int lda, const uint16_t* b, int ldb, cudaDataType ab_type, float be, void* C, cudaDataType c_type, int ldc) {
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      float acc = 0;
      for (int l = 0; l < k; ++l) {
        const uint16_t av = transa == CUBLAS_OP_N ? a[size_t(i) + size_t(l) * size_t(lda)] : a[size_t(l) + size_t(i) * size_t(lda)];
        const uint16_t bv = transb == CUBLAS_OP_N ? b[size_t(l) + size_t(j) * size_t(ldb)] : b[size_t(j) + size_t(l) * size_t(ldb)];
        acc += element_to_float(av, ab_type) * element_to_float(bv, ab_type);
      }
      const size_t at = size_t(i) + size_t(j) * size_t(ldc);
      if (c_type == CUDA_R_32F) {
        float* c = static_cast<float*>(C);
        c[at] = al * acc + (be != 0.0f ? be * c[at] : 0.0f);  // beta 0: C is not read, as cuBLAS
      } else {
        uint16_t* c = static_cast<uint16_t*>(C);
        c[at] = float_to_element(al * acc + (be != 0.0f ? be * element_to_float(c[at], c_type) : 0.0f), c_type);
      }
    }
}

}  // namespace

cudaError_t cudaGetDeviceCount(int* count) {
  *count = kDevices;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  return device >= 0 && device < kDevices ? cudaSuccess : fail(cudaErrorInvalidDevice);
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device < 0 || device >= kDevices) return fail(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::strncpy(prop->name, "Emulated CUDA device (host)", sizeof(prop->name) - 1);
  prop->totalGlobalMem = kEmulatedDeviceBytes;
  prop->major = 9;
  // STRATA_EMULATED_CC=75 plays an older card (compute capability 7.5), for the checks that refuse
  // what it lacks (bf16 below 8.0).
  if (const char* cc = std::getenv("STRATA_EMULATED_CC"); cc && std::atoi(cc) > 0) {
    prop->major = std::atoi(cc) / 10;
    prop->minor = std::atoi(cc) % 10;
  }
  prop->multiProcessorCount = 1;
  return cudaSuccess;
}
cudaError_t cudaGetLastError() {
  const cudaError_t err = last_error;
  last_error = cudaSuccess;
  return err;
}
const char* cudaGetErrorName(cudaError_t err) {
  switch (err) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    default: return "cudaErrorUnknown";
  }
}
const char* cudaGetErrorString(cudaError_t err) {
  switch (err) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNotReady: return "device not ready";
    default: return "unknown error";
  }
}

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  DeviceMemory& m = device_memory();
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (bytes > kEmulatedDeviceBytes - m.used) return fail(cudaErrorMemoryAllocation);
  }
  const size_t rounded = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;  // cudaMalloc aligns to 256
  void* p = std::aligned_alloc(256, rounded);
  if (p == nullptr) return fail(cudaErrorMemoryAllocation);
  std::lock_guard<std::mutex> lock(m.mu);
  m.blocks[reinterpret_cast<uintptr_t>(p)] = bytes;
  m.used += bytes;
  *ptr = p;
  return cudaSuccess;
}
cudaError_t cudaFree(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  if (async_on()) scheduler().drain();  // cudaFree synchronises the device
  DeviceMemory& m = device_memory();
  std::lock_guard<std::mutex> lock(m.mu);
  auto it = m.blocks.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == m.blocks.end()) return fail(cudaErrorInvalidValue);
  m.used -= it->second;
  m.blocks.erase(it);
  std::free(ptr);
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  DeviceMemory& m = device_memory();
  std::lock_guard<std::mutex> lock(m.mu);
  *free_bytes = kEmulatedDeviceBytes - m.used;
  *total_bytes = kEmulatedDeviceBytes;
  return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned) {
  void* p = std::aligned_alloc(4096, (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096);  // page-aligned, as pinned memory
  if (p == nullptr) return fail(cudaErrorMemoryAllocation);
  *ptr = p;
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* ptr) {
  if (async_on()) scheduler().drain();  // so does cudaFreeHost
  std::free(ptr);
  return cudaSuccess;
}

// Each backend creates its streams first, so this is where a test's STRATA_EMULATED_ASYNC
// takes effect.
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned) {
  scheduler().configure();
  static std::atomic<uint64_t> next_id{1};  // 0 is stream 0's
  *stream = new EmulatedStream{next_id.fetch_add(1)};
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (async_on()) scheduler().drain();
  delete static_cast<EmulatedStream*>(stream);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (EmulatedStream* s = capturing(stream)) return refuse_in_capture(s);
  if (async_on()) scheduler().sync_stream(stream_id(stream));
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned) {
  if (!event) return fail(cudaErrorInvalidValue);
  if (EmulatedStream* s = capturing(stream)) return refuse_in_capture(s);
  if (async_on()) scheduler().wait(stream_id(stream), event);
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
  if (capturing_streams.load() > 0) return fail(cudaErrorStreamCaptureUnsupported);
  if (async_on()) scheduler().drain();
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags) {
  *event = new EmulatedEvent{flags, nullptr};
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;  // a record still queued keeps its own flag
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (!event) return fail(cudaErrorInvalidValue);
  if (EmulatedStream* s = capturing(stream)) return refuse_in_capture(s);
  if (async_on()) scheduler().record(stream_id(stream), event);
  return cudaSuccess;
}
// Not ready is no error: cudaGetLastError does not report it.
cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (!event) return fail(cudaErrorInvalidValue);
  return !async_on() || scheduler().query(event) ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (!event) return fail(cudaErrorInvalidValue);
  if (async_on()) scheduler().sync_event(event);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  if (!sides_ok(dst, bytes, src, bytes, kind)) return fail(cudaErrorInvalidValue);
  submit(stream, [=] { std::memmove(dst, src, bytes); });
  return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                              size_t rows, cudaMemcpyKind kind, cudaStream_t stream) {
  if (width == 0 || rows == 0) return cudaSuccess;
  if (width > dst_pitch || width > src_pitch) return fail(cudaErrorInvalidValue);
  const size_t dst_span = (rows - 1) * dst_pitch + width, src_span = (rows - 1) * src_pitch + width;
  if (!sides_ok(dst, dst_span, src, src_span, kind)) return fail(cudaErrorInvalidValue);
  submit(stream, [=] {
    for (size_t r = 0; r < rows; ++r)
      std::memcpy(static_cast<char*>(dst) + r * dst_pitch, static_cast<const char*>(src) + r * src_pitch, width);
  });
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  if (!on_device(ptr, bytes)) return fail(cudaErrorInvalidValue);
  submit(stream, [=] { std::memset(ptr, value, bytes); });
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode) {
  auto* s = static_cast<EmulatedStream*>(stream);
  if (s == nullptr || s->capture) return fail(cudaErrorInvalidValue);  // stream 0, or capturing already
  s->capture = std::make_unique<std::vector<std::function<void()>>>();
  s->capture_invalid = false;
  capturing_streams.fetch_add(1);
  set_launch_queue();
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  EmulatedStream* s = capturing(stream);
  if (s == nullptr || graph == nullptr) return fail(cudaErrorInvalidValue);
  std::unique_ptr<std::vector<std::function<void()>>> work = std::move(s->capture);
  capturing_streams.fetch_sub(1);
  set_launch_queue();
  *graph = nullptr;
  if (s->capture_invalid) return fail(cudaErrorStreamCaptureInvalidated);
  *graph = new EmulatedGraph{std::move(*work)};
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (exec == nullptr || graph == nullptr) return fail(cudaErrorInvalidValue);
  *exec = new EmulatedGraph{graph->work};
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (exec == nullptr) return fail(cudaErrorInvalidValue);
  if (EmulatedStream* s = capturing(stream)) return refuse_in_capture(s);  // no graphs inside graphs here
  for (const std::function<void()>& work : exec->work) submit(stream, work);
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  *handle = new EmulatedCublas;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void* workspace, size_t bytes) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  return bytes == 0 || on_device(workspace, bytes) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}
const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_UNKNOWN";
  }
}
const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    default: return "unknown status";
  }
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void* alpha, const void* A, cudaDataType a_type, int lda, const void* B,
                            cudaDataType b_type, int ldb, const void* beta, void* C, cudaDataType c_type, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if ((a_type != CUDA_R_16F && a_type != CUDA_R_16BF) || b_type != a_type || (c_type != a_type && c_type != CUDA_R_32F) ||
      compute != CUBLAS_COMPUTE_32F)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const int a_rows = transa == CUBLAS_OP_N ? m : k, b_rows = transb == CUBLAS_OP_N ? k : n;
  if (m < 0 || n < 0 || k < 0 || lda < std::max(1, a_rows) || ldb < std::max(1, b_rows) || ldc < std::max(1, m))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  const size_t c_size = c_type == CUDA_R_32F ? 4 : 2;
  const size_t a_cols = transa == CUBLAS_OP_N ? size_t(k) : size_t(m), b_cols = transb == CUBLAS_OP_N ? size_t(n) : size_t(k);
  if ((k > 0 && (!on_device(A, ((a_cols - 1) * size_t(lda) + size_t(a_rows)) * 2) ||
                 !on_device(B, ((b_cols - 1) * size_t(ldb) + size_t(b_rows)) * 2))) ||
      !on_device(C, ((size_t(n) - 1) * size_t(ldc) + size_t(m)) * c_size))
    return CUBLAS_STATUS_INVALID_VALUE;  // cuBLAS would fault; name the mistake instead
  // alpha and beta are read now, as cuBLAS reads host-mode scalars at the call; the stream is
  // the one the handle has now.
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  const auto* a = static_cast<const uint16_t*>(A);
  const auto* b = static_cast<const uint16_t*>(B);
  submit(handle->stream, [=] { gemm(transa, transb, m, n, k, al, a, lda, b, ldb, a_type, be, C, c_type, ldc); });
  return CUBLAS_STATUS_SUCCESS;
}
