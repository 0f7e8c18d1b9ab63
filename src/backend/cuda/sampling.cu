// Greedy sampling: argmax over each row of logits, one block per row, lowest index on ties. And
// the rows' sampling candidates (runtime/row_candidates.h), so that sampled rows need not copy
// their logits to the host.
#include <climits>
#include <cmath>
#include <cstdint>

#include "strata/runtime/row_candidates.h"

#include "cuda_common.h"
#include "device_utils.cuh"
#include "kernels.h"

namespace strata::cuda {

namespace {

constexpr int kThreads = 512;

// Does candidate (v, i) beat the current best (bv, bi)? NaN never wins (comparisons are false).
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }


template <class T>
__global__ void argmax_rows_kernel(const T* __restrict__ logits, int64_t cols, int32_t* __restrict__ out) {
  __shared__ float warp_val[32];
  __shared__ int warp_idx[32];
  const T* row = logits + int64_t(blockIdx.x) * cols;
  float best = -INFINITY;
  int best_i = INT_MAX;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float v = to_float(row[j]);
    if (better(v, int(j), best, best_i)) {
      best = v;
      best_i = int(j);
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_xor_sync(kFullMask, best, o);
    const int i = __shfl_xor_sync(kFullMask, best_i, o);
    if (better(v, i, best, best_i)) {
      best = v;
      best_i = i;
    }
  }
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  if (lane == 0) {
    warp_val[warp] = best;
    warp_idx[warp] = best_i;
  }
  __syncthreads();
  if (warp == 0) {
    const int nwarps = blockDim.x >> 5;
    best = lane < nwarps ? warp_val[lane] : -INFINITY;
    best_i = lane < nwarps ? warp_idx[lane] : INT_MAX;
    for (int o = 16; o > 0; o >>= 1) {
      const float v = __shfl_xor_sync(kFullMask, best, o);
      const int i = __shfl_xor_sync(kFullMask, best_i, o);
      if (better(v, i, best, best_i)) {
        best = v;
        best_i = i;
      }
    }
    // A row of NaNs has no winner: report index 0 rather than an out-of-vocabulary id.
    if (lane == 0) out[blockIdx.x] = best_i == INT_MAX ? 0 : best_i;
  }
}

template <class T>
void launch_argmax(const T* logits, int64_t rows, int64_t cols, int32_t* out, cudaStream_t stream) {
  if (rows == 0) return;
  argmax_rows_kernel<T><<<dim3(unsigned(rows)), kThreads, 0, stream>>>(logits, cols, out);
  STRATA_CUDA_CHECK_LAUNCH("argmax_rows_kernel", stream);
}

// ---- Sampling candidates ----

constexpr int kCandidateThreads = 512;
constexpr int kCandidateWarps = kCandidateThreads / 32;

// A logit's place in the row's order as an unsigned key: a larger logit, a larger key; -0 as +0
// (they tie, as the host's comparisons have them); NaN below every number.
__device__ __forceinline__ uint32_t order_key(float v) {
  if (v != v) return 0u;
  const uint32_t b = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// The key, then the id: unique within a row, so the candidates are exactly the `count` largest,
// and among equal logits the higher id ranks first (the sampler's walk order).
__device__ __forceinline__ unsigned long long rank_of(float v, int64_t id) {
  return (static_cast<unsigned long long>(order_key(v)) << 32) | static_cast<unsigned long long>(id);
}

// The block's sum, the same on every thread: warps by shuffles, then the warps' sums in warp
// order, so a row's sums do not depend on anything but the row.
__device__ __forceinline__ double block_sum_f64(double v, double* partial) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  __syncthreads();  // a previous call may still be reading partial
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
  __syncthreads();
  double total = 0;
  for (int w = 0; w < kCandidateWarps; ++w) total += partial[w];
  return total;
}

// One block per row: the maximum, the two sums of exponentials, then the `capacity` largest ranks
// by radix selection (a byte of the 64-bit rank per pass, from the top, until the bucket holding
// the last candidate is taken whole), gathered and sorted by a bitonic network in shared memory.
template <class T>
__global__ void row_candidates_kernel(const T* __restrict__ logits, int64_t cols,
                                      const float* __restrict__ temperatures, int capacity, uint8_t* __restrict__ out) {
  __shared__ float max_part[kCandidateWarps];
  __shared__ double sum_part[kCandidateWarps];
  __shared__ unsigned hist[256];
  __shared__ unsigned long long picked[kMaxRowCandidates];
  __shared__ unsigned long long chosen_prefix;
  __shared__ int chosen_need;
  __shared__ int settled;
  __shared__ unsigned slots;
  const int tid = threadIdx.x;
  const T* row = logits + int64_t(blockIdx.x) * cols;

  float mx = -INFINITY;  // fmaxf passes NaN over, as the host's std::max does
  for (int64_t j = tid; j < cols; j += blockDim.x) mx = fmaxf(mx, to_float(row[j]));
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, o));
  if ((tid & 31) == 0) max_part[tid >> 5] = mx;
  __syncthreads();
  mx = max_part[0];
  for (int w = 1; w < kCandidateWarps; ++w) mx = fmaxf(mx, max_part[w]);

  // As the host's sampler computes them: inv_t in double, each term in double.
  const float t = temperatures[blockIdx.x];
  const double inv_t = t > 0 ? 1.0 / double(t) : 1.0;
  const double top = double(mx) * inv_t;
  double part_t = 0, part_1 = 0;
  for (int64_t j = tid; j < cols; j += blockDim.x) {
    const double l = double(to_float(row[j]));
    part_t += exp(l * inv_t - top);
    part_1 += exp(l - double(mx));
  }
  const double sum_t = block_sum_f64(part_t, sum_part);
  const double sum_1 = block_sum_f64(part_1, sum_part);

  const int count = int(cols < capacity ? cols : capacity);
  unsigned long long prefix = 0;  // the ranks' bits fixed so far
  int need = count;               // candidates still to find among the ranks that match them
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int i = tid; i < 256; i += blockDim.x) hist[i] = 0u;
    __syncthreads();
    const unsigned long long fixed = shift == 56 ? 0ull : ~0ull << (shift + 8);
    for (int64_t j = tid; j < cols; j += blockDim.x) {
      const unsigned long long r = rank_of(to_float(row[j]), j);
      if ((r & fixed) == prefix) atomicAdd(&hist[(r >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (tid == 0) {
      int digit = 255, above = 0;
      while (above + int(hist[digit]) < need) above += int(hist[digit--]);
      chosen_need = need - above;
      chosen_prefix = prefix | (static_cast<unsigned long long>(digit) << shift);
      settled = int(hist[digit]) == chosen_need;
    }
    __syncthreads();
    prefix = chosen_prefix;
    need = chosen_need;
    const bool done = settled;
    __syncthreads();  // all have read before thread 0 writes again
    if (done) break;  // the last bucket is taken whole: the candidates are the ranks >= prefix
  }

  if (tid == 0) slots = 0u;
  __syncthreads();
  for (int64_t j = tid; j < cols; j += blockDim.x) {
    const unsigned long long r = rank_of(to_float(row[j]), j);
    if (r >= prefix) picked[atomicAdd(&slots, 1u)] = r;
  }
  int width = 1;
  while (width < count) width <<= 1;
  for (int i = count + tid; i < width; i += blockDim.x) picked[i] = 0ull;
  __syncthreads();
  for (int size = 2; size <= width; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = tid; i < width; i += blockDim.x) {
        const int partner = i ^ stride;
        if (partner > i) {
          const unsigned long long a = picked[i], b = picked[partner];
          if ((i & size) == 0 ? a < b : a > b) {  // descending where (i & size) == 0: all of it at the end
            picked[i] = b;
            picked[partner] = a;
          }
        }
      }
      __syncthreads();
    }
  }

  uint8_t* dst = out + size_t(blockIdx.x) * (kRowCandidatesHeaderBytes + 8 * size_t(capacity));
  float* cand_logits = reinterpret_cast<float*>(dst + kRowCandidatesHeaderBytes);
  int32_t* cand_ids = reinterpret_cast<int32_t*>(dst + kRowCandidatesHeaderBytes + 4 * size_t(capacity));
  for (int i = tid; i < count; i += blockDim.x) {
    const int32_t id = int32_t(picked[i] & 0xffffffffull);
    cand_ids[i] = id;
    cand_logits[i] = to_float(row[id]);
  }
  if (tid == 0) {
    *reinterpret_cast<float*>(dst) = mx;
    *reinterpret_cast<int32_t*>(dst + 4) = count;
    *reinterpret_cast<double*>(dst + 8) = sum_t;
    *reinterpret_cast<double*>(dst + 16) = sum_1;
  }
}

// One block per row: the target's logit, and the logits at least as large counted by each thread,
// then summed over the block.
template <class T>
__global__ void target_ranks_kernel(const T* __restrict__ logits, int64_t cols, const int32_t* __restrict__ targets,
                                    uint8_t* __restrict__ out) {
  __shared__ int warp_count[32];
  const T* row = logits + int64_t(blockIdx.x) * cols;
  const float own = to_float(row[targets[blockIdx.x]]);
  int count = 0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) count += to_float(row[j]) >= own ? 1 : 0;
  for (int o = 16; o > 0; o >>= 1) count += __shfl_xor_sync(kFullMask, count, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_count[warp] = count;
  __syncthreads();
  if (threadIdx.x == 0) {
    int total = 0;
    for (int w = 0; w < int(blockDim.x >> 5); ++w) total += warp_count[w];
    uint8_t* dst = out + size_t(blockIdx.x) * 8;
    *reinterpret_cast<float*>(dst) = own;
    *reinterpret_cast<int32_t*>(dst + 4) = total;
  }
}

}  // namespace

template <class L>
void launch_target_ranks(const L* logits, int64_t rows, int64_t cols, const int32_t* targets, uint8_t* out,
                         cudaStream_t stream) {
  if (rows == 0) return;
  target_ranks_kernel<L><<<dim3(unsigned(rows)), kThreads, 0, stream>>>(logits, cols, targets, out);
  STRATA_CUDA_CHECK_LAUNCH("target_ranks_kernel", stream);
}

template void launch_target_ranks<__half>(const __half*, int64_t, int64_t, const int32_t*, uint8_t*, cudaStream_t);
template void launch_target_ranks<bf16>(const bf16*, int64_t, int64_t, const int32_t*, uint8_t*, cudaStream_t);
template void launch_target_ranks<float>(const float*, int64_t, int64_t, const int32_t*, uint8_t*, cudaStream_t);

template <class L>
void launch_row_candidates(const L* logits, int64_t rows, int64_t cols, const float* temperatures, int capacity,
                           uint8_t* out, cudaStream_t stream) {
  if (rows == 0) return;
  row_candidates_kernel<L><<<dim3(unsigned(rows)), kCandidateThreads, 0, stream>>>(logits, cols, temperatures,
                                                                                  capacity, out);
  STRATA_CUDA_CHECK_LAUNCH("row_candidates_kernel", stream);
}

template void launch_row_candidates<__half>(const __half*, int64_t, int64_t, const float*, int, uint8_t*,
                                            cudaStream_t);
template void launch_row_candidates<bf16>(const bf16*, int64_t, int64_t, const float*, int, uint8_t*, cudaStream_t);
template void launch_row_candidates<float>(const float*, int64_t, int64_t, const float*, int, uint8_t*, cudaStream_t);

template <class L>
void launch_argmax_rows(const L* logits, int64_t rows, int64_t cols, int32_t* out, cudaStream_t stream) {
  launch_argmax(logits, rows, cols, out, stream);
}

template void launch_argmax_rows<__half>(const __half*, int64_t, int64_t, int32_t*, cudaStream_t);
template void launch_argmax_rows<bf16>(const bf16*, int64_t, int64_t, int32_t*, cudaStream_t);
template void launch_argmax_rows<float>(const float*, int64_t, int64_t, int32_t*, cudaStream_t);

}  // namespace strata::cuda
