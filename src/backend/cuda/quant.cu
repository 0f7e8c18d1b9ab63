// Group-wise quantization (include/strata/quant/quant.h): one warp per group to quantize, one
// thread per code byte to dequantize. The arithmetic is the header's, in fp32 with explicit
// round-to-nearest intrinsics (no FMA contraction), so codes and values equal the host reference.
#include <algorithm>
#include <cmath>

#include "cuda_common.h"
#include "device_utils.cuh"
#include "kernels.h"

namespace strata::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kDequantThreads = 256;
constexpr int64_t kMaxBlocks = 65535;

__device__ __forceinline__ float load_f32(const void* x, bool f32, int64_t i) {
  return f32 ? static_cast<const float*>(x)[i] : __half2float(static_cast<const __half*>(x)[i]);
}
__device__ __forceinline__ void store_f32(void* out, bool f32, int64_t i, float v) {
  if (f32) static_cast<float*>(out)[i] = v;
  else static_cast<__half*>(out)[i] = __float2half_rn(v);
}

// Lane l of the warp holds elements [l * e, (l + 1) * e) of its group, e = group / 32 (1 to 4).
__global__ void quantize_kernel(QuantParams p, const void* __restrict__ x, bool x_f32, uint8_t* __restrict__ q) {
  const int lane = threadIdx.x & 31;
  const int e = p.group / 32;
  const int64_t groups_per_row = p.n / p.group, total = p.rows * groups_per_row;
  const float max_code = float((1 << p.bits) - 1);
  const int64_t codes_bytes = p.n * p.bits / 8;
  for (int64_t g = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5); g < total;
       g += int64_t(gridDim.x) * kWarpsPerBlock) {  // uniform across the warp: shuffles stay converged
    const int64_t r = g / groups_per_row, gi = g % groups_per_row;
    const int64_t first = gi * p.group + int64_t(lane) * e;  // this lane's first element in the row
    float v[4];
    float lo = INFINITY, hi = -INFINITY;
    for (int k = 0; k < e; ++k) {
      v[k] = load_f32(x, x_f32, r * p.n + first + k);
      lo = fminf(lo, v[k]);
      hi = fmaxf(hi, v[k]);
    }
    for (int o = 16; o > 0; o >>= 1) {
      lo = fminf(lo, __shfl_xor_sync(kFullMask, lo, o));
      hi = fmaxf(hi, __shfl_xor_sync(kFullMask, hi, o));
    }
    const __half min16 = __float2half_rn(lo);
    const __half scale16 = __float2half_rn(__fdiv_rn(__fsub_rn(hi, lo), max_code));
    const float mn = __half2float(min16), sc = __half2float(scale16);
    int code[4];
    for (int k = 0; k < e; ++k)
      code[k] = sc == 0.0f ? 0 : int(fminf(fmaxf(rintf(__fdiv_rn(__fsub_rn(v[k], mn), sc)), 0.0f), max_code));
    uint8_t* row = q + r * int64_t(p.row_bytes);
    if (p.bits == 8) {
      for (int k = 0; k < e; ++k) row[first + k] = uint8_t(code[k]);
    } else if (e >= 2) {  // e is even: this lane's pairs are its own
      for (int k = 0; k < e; k += 2) row[(first + k) / 2] = uint8_t(code[k] | (code[k + 1] << 4));
    } else {  // one element a lane: even lanes pack their odd neighbour's code
      const int next = __shfl_down_sync(kFullMask, code[0], 1);
      if ((lane & 1) == 0) row[first / 2] = uint8_t(code[0] | (next << 4));
    }
    if (lane == 0) {  // scales, then minimums, after the row's codes (2-byte aligned: codes_bytes is even)
      __half* params = reinterpret_cast<__half*>(row + codes_bytes);
      params[gi] = scale16;
      params[groups_per_row + gi] = min16;
    }
  }
}

__global__ void dequantize_kernel(QuantParams p, const uint8_t* __restrict__ q, void* __restrict__ out, bool out_f32) {
  const int per_byte = 8 / p.bits;  // codes in one byte: 2 or 1
  const int64_t bytes_per_row = p.n / per_byte, total = p.rows * bytes_per_row;
  const int64_t groups_per_row = p.n / p.group;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / bytes_per_row, b = i % bytes_per_row, elem = b * per_byte, gi = elem / p.group;
    const uint8_t* row = q + r * int64_t(p.row_bytes);
    const __half* params = reinterpret_cast<const __half*>(row + bytes_per_row);
    const float sc = __half2float(params[gi]), mn = __half2float(params[groups_per_row + gi]);
    const int byte = row[b];
    const int64_t o = r * p.n + elem;
    if (per_byte == 1) {
      store_f32(out, out_f32, o, __fadd_rn(__fmul_rn(float(byte), sc), mn));
    } else {
      store_f32(out, out_f32, o, __fadd_rn(__fmul_rn(float(byte & 15), sc), mn));
      store_f32(out, out_f32, o + 1, __fadd_rn(__fmul_rn(float(byte >> 4), sc), mn));
    }
  }
}

}  // namespace

void launch_quantize_rows(const QuantParams& p, const void* x, bool x_f32, uint8_t* q, cudaStream_t stream) {
  const int64_t groups = p.rows * (p.n / p.group);
  if (groups == 0) return;
  const int64_t blocks = std::min(kMaxBlocks, (groups + kWarpsPerBlock - 1) / kWarpsPerBlock);
  quantize_kernel<<<unsigned(blocks), kWarpsPerBlock * 32, 0, stream>>>(p, x, x_f32, q);
  STRATA_CUDA_CHECK_LAUNCH("quantize_kernel", stream);
}

void launch_dequantize_rows(const QuantParams& p, const uint8_t* q, void* out, bool out_f32, cudaStream_t stream) {
  const int64_t work = p.rows * (p.n * p.bits / 8);
  if (work == 0) return;
  const int64_t blocks = std::min(kMaxBlocks, (work + kDequantThreads - 1) / kDequantThreads);
  dequantize_kernel<<<unsigned(blocks), kDequantThreads, 0, stream>>>(p, q, out, out_f32);
  STRATA_CUDA_CHECK_LAUNCH("dequantize_kernel", stream);
}

}  // namespace strata::cuda
