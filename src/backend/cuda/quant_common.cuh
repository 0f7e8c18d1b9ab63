// Device helpers for group-wise quantized rows (layout in kernels.h, formula in
// include/strata/quant/quant.h): reading codes and group parameters, the reference dequantization,
// and the warp that quantizes one group bit for bit as the host reference does.
#pragma once
#include <climits>
#include <cmath>
#include <cstdint>

#include <cuda_fp16.h>

#include "device_utils.cuh"
#include "kernels.h"

namespace strata::cuda {

// Scale and minimum of group g of a row (the row is 4-byte aligned, so the fp16s are aligned).
__device__ __forceinline__ float2 group_params(const uint8_t* row, const QuantRowLayout& l, int g) {
  const __half* p = reinterpret_cast<const __half*>(row + l.code_bytes);
  return make_float2(__half2float(p[g]), __half2float(p[l.groups + g]));
}

// Codes of one 32-bit word as float, exactly: the code goes into the low mantissa byte of 2^23
// (one byte permute) and 2^23 is subtracted, cheaper than an int-to-float conversion.
// Element k of the word: 8-bit: byte k; 4-bit: nibble k (byte k/2, low nibble first).
template <int kBits>
__device__ __forceinline__ float word_code(uint32_t word, int k) {
  uint32_t src = word;
  int byte = k;
  if constexpr (kBits == 4) {
    src = (k % 2 == 0) ? (word & 0x0f0f0f0fu) : ((word >> 4) & 0x0f0f0f0fu);
    byte = k / 2;
  }
  // Result bytes, low to high: src byte `byte`, 0, 0, 0x4b (bytes 4..7 come from 0x4b000000).
  const uint32_t bits = __byte_perm(src, 0x4b000000u, 0x7440u | uint32_t(byte));
  return __uint_as_float(bits) - 8388608.0f;
}

// The reference dequantization: float(code) * scale, rounded, plus minimum, rounded (no FMA), so
// values equal quant::dequantize_rows' and the CPU backend's.
__device__ __forceinline__ float dequant_ref(float code, float scale, float min) {
  return __fadd_rn(__fmul_rn(code, scale), min);
}

// An fp16 parameter into a row (2-byte aligned: rows and their code bytes are multiples of 4).
__device__ __forceinline__ void store_half(uint8_t* dst, __half h) { *reinterpret_cast<__half*>(dst) = h; }

// Quantizes group gi of one row with one warp; every lane must call it (it shuffles). Lane l
// takes elements [l * e, l * e + e) of the group, e = group / 32; `load(i)` returns element i of
// the row as fp32. Writes the group's codes, scale and minimum into `row` and zeroes the code
// bytes past the row's last element: the last group's lanes cover all of them, since
// (first + group) * bits / 8 is a multiple of 4 and at least code_bytes.
//
// The arithmetic is the host reference's (quant.cpp), operation for operation, so codes and
// parameters are bit-identical: min and max keep the first of equal values as std::min/max do
// (it decides the sign of a zero minimum), fp32 with explicit round-to-nearest intrinsics, rintf
// (half to even) as nearbyint.
template <class Load>
__device__ void warp_quantize_group(const QuantRowLayout& l, int gi, Load load, uint8_t* row) {
  const int lane = threadIdx.x & 31;
  const int e = l.group / 32;                  // 1, 2 or 4
  const int first = gi * l.group;              // the group's first element in the row
  const int g = min(l.group, l.n - first);     // the last group may be shorter
  float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  float lo = INFINITY, hi = -INFINITY;
  int lo_i = INT_MAX, hi_i = INT_MAX;          // group index of the element lo / hi came from
#pragma unroll
  for (int k = 0; k < 4; ++k) {  // constant bounds keep v[] in registers
    const int i = lane * e + k;
    if (k >= e || i >= g) continue;
    v[k] = load(first + i);
    if (v[k] < lo) {  // strict: the first of equal values stays
      lo = v[k];
      lo_i = i;
    }
    if (v[k] > hi) {
      hi = v[k];
      hi_i = i;
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float olo = __shfl_xor_sync(kFullMask, lo, o), ohi = __shfl_xor_sync(kFullMask, hi, o);
    const int olo_i = __shfl_xor_sync(kFullMask, lo_i, o), ohi_i = __shfl_xor_sync(kFullMask, hi_i, o);
    if (olo < lo || (olo == lo && olo_i < lo_i)) {
      lo = olo;
      lo_i = olo_i;
    }
    if (ohi > hi || (ohi == hi && ohi_i < hi_i)) {
      hi = ohi;
      hi_i = ohi_i;
    }
  }
  const float max_code = float((1 << l.bits) - 1);
  const __half min16 = __float2half_rn(lo);
  const __half scale16 = __float2half_rn(__fdiv_rn(__fsub_rn(hi, lo), max_code));
  const float mn = __half2float(min16), sc = __half2float(scale16);
  uint32_t code[4] = {0, 0, 0, 0};             // 0 past the group's end: padding and a lone last nibble
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if (k < e && lane * e + k < g && sc != 0.0f)
      code[k] = uint32_t(fminf(fmaxf(rintf(__fdiv_rn(__fsub_rn(v[k], mn), sc)), 0.0f), max_code));
  }

  const int64_t elem = int64_t(first) + lane * e;  // this lane's first element in the row
  if (l.bits == 8) {
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (k < e && elem + k < l.code_bytes) row[elem + k] = uint8_t(code[k]);
  } else if (e >= 2) {  // e is even and elem is even: this lane's pairs are its own bytes
#pragma unroll
    for (int k = 0; k < 4; k += 2)
      if (k < e && (elem + k) / 2 < l.code_bytes) row[(elem + k) / 2] = uint8_t(code[k] | (code[k + 1] << 4));
  } else {  // one element a lane: even lanes pack their odd neighbour's code
    const uint32_t next = __shfl_down_sync(kFullMask, code[0], 1);
    if ((lane & 1) == 0 && elem / 2 < l.code_bytes) row[elem / 2] = uint8_t(code[0] | (next << 4));
  }
  if (lane == 0) {  // scales, then minimums, after the codes
    store_half(row + l.code_bytes + 2 * int64_t(gi), scale16);
    store_half(row + l.code_bytes + 2 * (int64_t(l.groups) + gi), min16);
  }
}

}  // namespace strata::cuda
