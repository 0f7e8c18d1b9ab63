// A CPU emulation of the CUDA features our kernels use, so their source runs on the host
// (tests/cuda_emulation/README.md). Each thread of a block is a lane (a fiber, or a host thread
// under ThreadSanitizer: run_lanes below); the block's lanes step through the grid's blocks
// together. __syncthreads and __syncwarp are barriers, shuffles exchange through per-warp arrays
// at a barrier, and __shared__ variables are function statics (blocks run one after
// another). Run under ThreadSanitizer, a missing barrier between lanes shows as a data race. Not
// a CUDA implementation: no memory model beyond the barriers, no timing, no hardware limits.
#pragma once
#include <algorithm>
#include <atomic>
#include <barrier>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <semaphore>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include <ucontext.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct uint2 {
  unsigned x, y;
};
struct uint4 {
  unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
struct float2 {
  float x, y;
};
struct float4 {
  float x, y, z, w;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
using cudaStream_t = void*;
using cudaError_t = int;

inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;

namespace emu {

// Lanes: a block's threads, run by run_lanes(threads, body), which returns when body(tid) has
// returned on every lane; they meet at Barriers. Under ThreadSanitizer each lane is a host thread
// (LanePool), so a missing barrier between two lanes is a data race TSan reports. Otherwise lanes
// are fibers on the launching thread, switched only at barriers (FiberLanes): a model's forward
// pass launches thousands of kernels, and with a thread per lane the emulated CUDA backend spent
// most of its time in the scheduler (README.md, "The emulated CUDA backend"). Launches from
// several host threads take turns either way, as their kernels' __shared__ statics require.
#if defined(__SANITIZE_THREAD__)
using Barrier = std::barrier<>;

// The host threads that play the lanes, kept between launches (creating a block's threads for
// each launch took longer than its kernel). Lane i always runs on pooled thread i.
class LanePool {
public:
  static LanePool& instance() {
    static LanePool* pool = new LanePool;  // never destroyed: its threads wait until the process ends
    return *pool;
  }
  // body(tid) on `threads` lanes; returns when every lane has returned.
  template <class Body>
  void run(int threads, const Body& body) {
    std::lock_guard<std::mutex> launch(launch_mu_);
    while (int(lanes_.size()) < threads) lanes_.push_back(std::make_unique<Lane>(*this));
    std::function<void(int)> job = [&body](int tid) { body(tid); };
    job_ = &job;
    running_.store(threads);
    for (int tid = 0; tid < threads; ++tid) lanes_[size_t(tid)]->start(tid);
    for (int left = running_.load(); left != 0; left = running_.load()) running_.wait(left);
    job_ = nullptr;
  }

private:
  struct Lane {
    explicit Lane(LanePool& pool) : thread([this, &pool] { loop(pool); }) {}
    void start(int id) {
      tid = id;
      go.release();
    }
    [[noreturn]] void loop(LanePool& pool) {
      while (true) {
        go.acquire();
        (*pool.job_)(tid);
        if (pool.running_.fetch_sub(1) == 1) pool.running_.notify_one();
      }
    }
    std::binary_semaphore go{0};
    int tid = 0;
    std::thread thread;  // last: starts after the members it reads
  };
  std::mutex launch_mu_;
  std::vector<std::unique_ptr<Lane>> lanes_;
  const std::function<void(int)>* job_ = nullptr;
  std::atomic<int> running_{0};
};

template <class Body>
void run_lanes(int threads, const Body& body) {
  LanePool::instance().run(threads, body);
}
#else
// Cooperative lanes: one fiber per lane, run in rounds from the launching thread. A lane runs
// until it waits at a barrier or returns, then switches to the round's next lane; the last lane
// to arrive opens the barrier, and the lanes waiting there go on when their turn comes. threadIdx is per host thread, so it is set to
// the lane's own before each resume. On x86-64 a fiber switch is strata_emu_switch
// (../fiber_switch.cpp), elsewhere ucontext's swapcontext.
#if defined(__x86_64__)
extern "C" void strata_emu_switch(void** save_sp, void* load_sp);
#endif
class FiberLanes {
public:
  static FiberLanes& instance() {
    static FiberLanes* lanes = new FiberLanes;  // never destroyed, like the stacks it keeps
    return *lanes;
  }
  template <class Body>
  void run(int threads, const Body& body) {
    std::lock_guard<std::mutex> launch(launch_mu_);
    std::function<void(int)> job = [&body](int tid) { body(tid); };
    job_ = &job;
    while (int(fibers_.size()) < threads) fibers_.push_back(std::make_unique<Fiber>(fibers_.size()));
    for (int tid = 0; tid < threads; ++tid) fibers_[size_t(tid)]->prepare(&scheduler_);
    threads_ = live_ = threads;
    // A round resumes every live lane once: each lane that waits or finishes switches straight to
    // the next live lane, the round's last back here (one switch a lane, not two).
    while (live_ > 0) {
      const uint64_t before = progress_;
      const int first = next_live(0);
      resume(scheduler_, first);
      if (live_ > 0 && progress_ == before) {
        std::fprintf(stderr, "emulation: every lane waits at a barrier that cannot open (a barrier in divergent code?)\n");
        std::abort();
      }
    }
    job_ = nullptr;
  }
  // Called by a lane at a barrier it cannot pass yet: on to the round's next lane.
  void yield() { pass_on(); }
  void opened() { ++progress_; }

private:
#if defined(__x86_64__)
  struct Context {
    void* sp = nullptr;
  };
#else
  struct Context {
    ucontext_t uc{};
  };
#endif
  struct Fiber {
    static constexpr size_t kStackBytes = size_t(256) << 10;
    // Each stack's top sits a different number of cache lines below its end: stacks from mmap
    // all start on a page, so equal tops would put every lane's hot frames in the same cache
    // sets, and each switch would miss (the switch then took half the emulated grids' time).
    // 17 lines apart, modulo 64 KiB: 1024 lanes, 1024 different lines.
    explicit Fiber(size_t index) : top_offset(index * 17 * 64 % (size_t(64) << 10)) {}
    std::unique_ptr<char[]> stack = std::make_unique_for_overwrite<char[]>(kStackBytes);  // pages touched as used
    size_t top_offset;
    Context context;
    bool done = false;
    // A fresh start of FiberLanes::start on this fiber's stack.
    void prepare([[maybe_unused]] Context* scheduler) {
      done = false;
#if defined(__x86_64__)
      // The frame strata_emu_switch pops: r15..r12, rbx, rbp (zero), then the "return" into
      // start, which begins as if called (rsp = 8 mod 16).
      auto* p = reinterpret_cast<uint64_t*>((reinterpret_cast<uintptr_t>(stack.get()) + kStackBytes - top_offset) &
                                            ~uintptr_t(15));
      *--p = 0;
      *--p = reinterpret_cast<uint64_t>(&FiberLanes::start);
      for (int r = 0; r < 6; ++r) *--p = 0;
      context.sp = p;
#else
      getcontext(&context.uc);
      context.uc.uc_stack.ss_sp = stack.get();
      context.uc.uc_stack.ss_size = kStackBytes - top_offset;
      context.uc.uc_link = &scheduler->uc;
      makecontext(&context.uc, reinterpret_cast<void (*)()>(&FiberLanes::start), 0);
#endif
    }
  };
  // Saves the running context in `from` and resumes `to`.
  static void swap(Context& from, Context& to) {
#if defined(__x86_64__)
    strata_emu_switch(&from.sp, to.sp);
#else
    swapcontext(&from.uc, &to.uc);
#endif
  }
  int next_live(int tid) const {
    while (tid < threads_ && fibers_[size_t(tid)]->done) ++tid;
    return tid;
  }
  // Saves the running context in `from` and resumes lane `tid`, or the launching thread's loop
  // when the round has no lane left (tid == threads_).
  void resume(Context& from, int tid) {
    if (tid == threads_) return swap(from, scheduler_);
    current_ = tid;
    threadIdx = uint3{};
    threadIdx.x = unsigned(tid);
    swap(from, fibers_[size_t(tid)]->context);
  }
  // From the running lane to the next live lane of the round.
  void pass_on() { resume(fibers_[size_t(current_)]->context, next_live(current_ + 1)); }
  static void start() {
    FiberLanes& self = instance();
    Fiber& f = *self.fibers_[size_t(self.current_)];
    (*self.job_)(self.current_);
    f.done = true;
    --self.live_, ++self.progress_;
    self.pass_on();  // never resumed: the next launch prepares the fiber afresh
    std::abort();
  }
  std::mutex launch_mu_;
  std::vector<std::unique_ptr<Fiber>> fibers_;
  const std::function<void(int)>* job_ = nullptr;
  Context scheduler_;
  int current_ = 0;
  int threads_ = 0, live_ = 0;  // the launch's lanes, and those not yet returned
  uint64_t progress_ = 0;  // barriers opened and lanes finished: a round without any is a deadlock
};

class Barrier {
public:
  explicit Barrier(int lanes) : lanes_(lanes) {}
  void arrive_and_wait() {
    if (++arrived_ == lanes_) {  // the last lane opens it and goes on
      arrived_ = 0;
      ++phase_;
      FiberLanes::instance().opened();
      return;
    }
    const uint64_t phase = phase_;
    while (phase_ == phase) FiberLanes::instance().yield();
  }

private:
  int lanes_, arrived_ = 0;
  uint64_t phase_ = 0;
};

template <class Body>
void run_lanes(int threads, const Body& body) {
  FiberLanes::instance().run(threads, body);
}
#endif

struct Warp {
  Barrier bar{32};
  // A shuffle's values, in two buffers taken in turn (each lane counts its shuffles; a warp's
  // lanes run the same ones): the next shuffle writes the other buffer, and the one after can
  // rewrite this one only past the next shuffle's barrier, which every lane reaches after reading
  // here. One barrier a shuffle instead of two.
  uint64_t exchange[2][32];
  uint8_t shuffles[32] = {};
  float a[256], b[256], c[256];  // an MMA's operands, gathered from the lanes (mma.h)
};

struct Block {
  Block(int threads, size_t shared_bytes)
      : bar(threads), warps(size_t(threads + 31) / 32), dynamic_shared((shared_bytes + 15) / 16) {}
  Barrier bar;
  std::atomic<int> count{0};
  std::vector<Warp> warps;
  std::vector<uint4> dynamic_shared;  // `extern __shared__` memory, 16-byte aligned
};

inline thread_local Block* block = nullptr;
inline Warp& warp() { return block->warps[threadIdx.x / 32]; }
inline int lane() { return int(threadIdx.x % 32); }
// What `extern __shared__ T name[];` becomes in the rewritten sources (host_source.cmake).
template <class T>
T* dynamic_shared() {
  return reinterpret_cast<T*>(block->dynamic_shared.data());
}

// kernel(args...) over the grid with `threads` threads per block.
template <class Kernel, class... Args>
void launch(Kernel kernel, dim3 grid, int threads, size_t shared_bytes, const Args&... args) {
  Block ctx(threads, shared_bytes);
  run_lanes(threads, [&](int tid) {
    block = &ctx;
    threadIdx = uint3{};
    threadIdx.x = unsigned(tid);
    blockDim = dim3(unsigned(threads));
    gridDim = grid;
    for (unsigned bz = 0; bz < grid.z; ++bz)
      for (unsigned by = 0; by < grid.y; ++by)
        for (unsigned bx = 0; bx < grid.x; ++bx) {
          blockIdx.x = bx;
          blockIdx.y = by;
          blockIdx.z = bz;
          kernel(args...);
          ctx.bar.arrive_and_wait();  // every thread has left this block (returns are block-uniform)
        }
  });
}

// Where a launch goes instead of running at once: ../fake_runtime.cpp's asynchronous mode
// (README.md, "Asynchronous mode") sets this to queue the launch on its stream, and clears it when
// the mode ends. Null, as always in the kernel tests (which do not link the runtime): the kernel
// runs before the launch returns.
using LaunchQueue = void (*)(cudaStream_t, std::function<void()>&&);
inline std::atomic<LaunchQueue> launch_queue{nullptr};

// `kernel<<<grid, block, shared_bytes, stream>>>(args...)` becomes, in the rewritten sources
// (host_source.cmake), `emu::Launch([](const auto&... a) { kernel(a...); },
// emu::LaunchConfig{grid, block, shared_bytes, stream}).run(args...)`.
struct LaunchConfig {
  template <class Grid, class BlockSize>
  LaunchConfig(Grid g, BlockSize b, size_t shared, cudaStream_t s)
      : grid(to_dim3(g)), threads(int(b)), shared_bytes(shared), stream(s) {}
  static dim3 to_dim3(dim3 d) { return d; }
  template <class N, class = std::enable_if_t<std::is_integral_v<N>>>
  static dim3 to_dim3(N n) {
    return dim3(unsigned(n));
  }
  dim3 grid;
  int threads;
  size_t shared_bytes;
  cudaStream_t stream;
};
template <class Kernel>
struct Launch {
  Launch(Kernel k, LaunchConfig c) : kernel(k), config(c) {}
  template <class... Args>
  void run(const Args&... args) const {
    if (LaunchQueue queue = launch_queue.load(std::memory_order_acquire)) {
      // The arguments by value, as CUDA copies them at the launch: the caller may change or free
      // its variables before the kernel runs.
      queue(config.stream, [k = kernel, c = config, values = std::tuple<std::decay_t<Args>...>(args...)] {
        std::apply([&](const auto&... a) { launch(k, c.grid, c.threads, c.shared_bytes, a...); }, values);
      });
      return;
    }
    launch(kernel, config.grid, config.threads, config.shared_bytes, args...);
  }
  Kernel kernel;
  LaunchConfig config;
};

}  // namespace emu

inline void __syncthreads() { emu::block->bar.arrive_and_wait(); }
inline int __syncthreads_count(int predicate) {
  emu::Block& b = *emu::block;
  b.bar.arrive_and_wait();
  if (predicate) b.count.fetch_add(1);
  b.bar.arrive_and_wait();
  const int n = b.count.load();
  b.bar.arrive_and_wait();
  if (threadIdx.x == 0) b.count.store(0);  // before anyone's next call passes its first barrier
  return n;
}
inline int __syncthreads_or(int predicate) { return __syncthreads_count(predicate) != 0; }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::warp().bar.arrive_and_wait(); }

template <class T>
T emu_shuffle(T v, int src_lane) {
  static_assert(sizeof(T) <= sizeof(uint64_t) && std::is_trivially_copyable_v<T>);
  emu::Warp& w = emu::warp();
  uint64_t* exchange = w.exchange[w.shuffles[emu::lane()]++ & 1];
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  exchange[emu::lane()] = bits;
  w.bar.arrive_and_wait();
  bits = exchange[src_lane & 31];
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}
template <class T>
T __shfl_sync(unsigned, T v, int src_lane) {
  return emu_shuffle(v, src_lane);
}
template <class T>
T __shfl_xor_sync(unsigned, T v, int lane_mask) {
  return emu_shuffle(v, emu::lane() ^ lane_mask);
}
template <class T>
T __shfl_down_sync(unsigned, T v, unsigned delta) {
  const int src = emu::lane() + int(delta);
  return emu_shuffle(v, src < 32 ? src : emu::lane());
}

// Memory and arithmetic intrinsics. The emulated sources build with -ffp-contract=off, so the
// _rn operations round once each, as on the device.
template <class T>
T __ldg(const T* p) {
  return *p;
}
// A device trap: the emulation stops the test, as a trapped kernel stops the GPU.
inline void __trap() {
  std::fprintf(stderr, "emulation: __trap() reached\n");
  std::abort();
}
inline float __uint_as_float(uint32_t u) { return std::bit_cast<float>(u); }
inline uint32_t __float_as_uint(float f) { return std::bit_cast<uint32_t>(f); }
// Atomic adds (row_candidates' histograms and slots): real host atomics, since under
// ThreadSanitizer the lanes are threads.
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
// Byte i of the result is byte (selector nibble i & 7) of the 8 bytes {x, y} (x first).
inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t selector) {
  const uint64_t bytes = uint64_t(x) | uint64_t(y) << 32;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= uint32_t((bytes >> (8 * ((selector >> (4 * i)) & 7))) & 0xFF) << (8 * i);
  return r;
}

using std::max;
using std::min;
