// A thread-per-lane CPU emulation of the CUDA features our kernels use, so their source runs on
// the host (tests/cuda_emulation/README.md). Each thread of a block is a host thread;
// the block's threads step through the grid's blocks together. __syncthreads and __syncwarp are
// barriers, shuffles exchange through a per-warp array between two barriers, and __shared__
// variables are function statics (blocks run one after another). Run under ThreadSanitizer, a
// missing barrier between lanes shows as a data race. Not a CUDA implementation: no memory
// model beyond the barriers, no timing, no hardware limits.
#pragma once
#include <algorithm>
#include <atomic>
#include <barrier>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <thread>
#include <type_traits>
#include <vector>

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

struct Warp {
  std::barrier<> bar{32};
  uint64_t exchange[32];
  float a[256], b[256], c[256];  // an MMA's operands, gathered from the lanes (mma.h)
};

struct Block {
  Block(int threads, size_t shared_bytes)
      : bar(threads), warps(size_t(threads + 31) / 32), dynamic_shared((shared_bytes + 15) / 16) {}
  std::barrier<> bar;
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
  std::vector<std::thread> pool;
  for (int tid = 0; tid < threads; ++tid) {
    pool.emplace_back([&, tid] {
      block = &ctx;
      threadIdx.x = unsigned(tid);
      blockDim = dim3(unsigned(threads));
      gridDim = grid;
      for (unsigned by = 0; by < grid.y; ++by) {
        for (unsigned bx = 0; bx < grid.x; ++bx) {
          blockIdx.x = bx;
          blockIdx.y = by;
          kernel(args...);
          ctx.bar.arrive_and_wait();  // every thread has left this block (returns are block-uniform)
        }
      }
    });
  }
  for (std::thread& t : pool) t.join();
}

// `kernel<<<grid, block, shared_bytes, stream>>>(args...)` becomes, in the rewritten sources
// (host_source.cmake), `emu::Launch([](const auto&... a) { kernel(a...); },
// emu::LaunchConfig{grid, block, shared_bytes, stream}).run(args...)`.
struct LaunchConfig {
  template <class Grid, class BlockSize>
  LaunchConfig(Grid g, BlockSize b, size_t shared, cudaStream_t)
      : grid(to_dim3(g)), threads(int(b)), shared_bytes(shared) {}
  static dim3 to_dim3(dim3 d) { return d; }
  template <class N, class = std::enable_if_t<std::is_integral_v<N>>>
  static dim3 to_dim3(N n) {
    return dim3(unsigned(n));
  }
  dim3 grid;
  int threads;
  size_t shared_bytes;
};
template <class Kernel>
struct Launch {
  Launch(Kernel k, LaunchConfig c) : kernel(k), config(c) {}
  template <class... Args>
  void run(const Args&... args) const {
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
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  w.exchange[emu::lane()] = bits;
  w.bar.arrive_and_wait();
  bits = w.exchange[src_lane & 31];
  w.bar.arrive_and_wait();
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
inline float __uint_as_float(uint32_t u) { return std::bit_cast<float>(u); }
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
