// A thread-per-lane CPU emulation of the CUDA features our attention kernels use, so their source
// runs on the host (tests/cuda_emulation/README.md). Each thread of a block is a host thread;
// the block's threads step through the grid's blocks together. __syncthreads and __syncwarp are
// barriers, shuffles exchange through a per-warp array between two barriers, and __shared__
// variables are function statics (blocks run one after another). Run under ThreadSanitizer, a
// missing barrier between lanes shows as a data race. Not a CUDA implementation: no memory
// model beyond the barriers, no timing, no hardware limits.
#pragma once
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <thread>
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
struct uint4 {
  unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
struct float2 {
  float x, y;
};
using cudaStream_t = void*;
using cudaError_t = int;

inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;

namespace emu {

struct Warp {
  std::barrier<> bar{32};
  float exchange[32];
  float a[256], b[256], c[256];  // an MMA's operands, gathered from the lanes (mma.h)
};

struct Block {
  explicit Block(int threads) : bar(threads), warps(size_t(threads + 31) / 32) {}
  std::barrier<> bar;
  std::atomic<int> count{0};
  std::vector<Warp> warps;
};

inline thread_local Block* block = nullptr;
inline Warp& warp() { return block->warps[threadIdx.x / 32]; }
inline int lane() { return int(threadIdx.x % 32); }

// kernel(p) over the grid with `threads` threads per block (what `kernel<<<grid, threads, 0,
// stream>>>(p)` becomes in the rewritten sources, host_source.cmake).
template <class Kernel, class Params>
void launch(Kernel kernel, dim3 grid, int threads, const Params& p) {
  Block ctx(threads);
  std::vector<std::thread> pool;
  for (int tid = 0; tid < threads; ++tid) {
    pool.emplace_back([&, tid] {
      block = &ctx;
      threadIdx.x = unsigned(tid);
      blockDim = dim3(unsigned(threads));
      for (unsigned by = 0; by < grid.y; ++by) {
        for (unsigned bx = 0; bx < grid.x; ++bx) {
          blockIdx.x = bx;
          blockIdx.y = by;
          kernel(p);
          ctx.bar.arrive_and_wait();  // every thread has left this block (returns are block-uniform)
        }
      }
    });
  }
  for (std::thread& t : pool) t.join();
}

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

inline float emu_shuffle(float v, int src_lane) {
  emu::Warp& w = emu::warp();
  w.exchange[emu::lane()] = v;
  w.bar.arrive_and_wait();
  const float r = w.exchange[src_lane & 31];
  w.bar.arrive_and_wait();
  return r;
}
inline float __shfl_sync(unsigned, float v, int src_lane) { return emu_shuffle(v, src_lane); }
inline float __shfl_xor_sync(unsigned, float v, int lane_mask) { return emu_shuffle(v, emu::lane() ^ lane_mask); }

using std::max;
using std::min;
