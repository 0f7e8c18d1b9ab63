// Reading group-wise quantized rows (include/strata/quant/quant.h) on the CPU, with AVX2 where the
// build has it: dequantization into fp32, and the factored dot and axpy decode attention reads
// cache rows with (the dot also serves the linear over a few tokens' worth of quantized weights).
#pragma once
#include <cstdint>

namespace strata::cpu {

// row: quantized_row_bytes(bits, group, n) bytes; out: n floats, equal to quant::dequantize_rows'
// bit for bit (products rounded before the add, no FMA), so the linear and prefill attention
// compute over exactly the weights and cache entries the reference describes.
void dequantize_row_f32(const uint8_t* row, int bits, int group, int64_t n, float* out);

// Decode attention reads a quantized cache row without dequantizing it (docs/offload.md, "CPU
// attention"). For the codes c and a group's scale s and minimum m, the row's values are c s + m
// exactly (in real arithmetic), so
//   q . row      = sum over groups of  s (q . c)  +  m (sum of q over the group)
//   y += w row:    y += (w s) c over each group, and w m summed per group, added once at the end.
// Codes are exact small integers in fp32, so nothing is rounded before the sums (without AVX2, c s
// is rounded once): the results are at least as close to the exact values c s + m as
// dequantize_row_f32's (which rounds c s, then + m), though not equal to them bit for bit, and
// cost a widening and one FMA per element instead of a widening, a multiply, an add and an FMA.
//
// Codes are widened 16 at a time (8 bytes of 4-bit codes, or 16 of 8-bit), and 4-bit codes come out
// even elements first: within each block of 16 elements, 0, 2, .., 14, then 1, 3, .., 15 ("code
// order"; 8-bit codes keep element order). q and y are kept in code order, so widening needs no
// shuffle. For rows whose n and group are multiples of 16 (codes_row_ok).
bool codes_row_ok(int group, int64_t n);
// x (n values in element order) into code order and back.
void to_code_order(int bits, const float* x, int64_t n, float* out);
void from_code_order(int bits, const float* x, int64_t n, float* out);
// A query as dot_packed_codes reads it: x into code order (coded, not aliasing x) and its sums
// over each group of `group` elements (ceil(n / group) values, each summed in element order).
void to_coded_query(int bits, int group, const float* x, int64_t n, float* coded, float* sums);

// A block of `queries` queries by `count` rows, queries x count <= kBlock (cpu_simd.h), read in
// registers: each 16 codes of a row are widened once for all the queries.
// q_coded: query k's n values in code order at q_coded + k n; q_sums: the sums of each query over
// each group (groups = ceil(n / group) per query); out[k out_stride + r] = query k . rows[r].
// The axpy adds w[k w_stride + r] (c s) of row r to query k's output y_coded + k n, and
// w[k w_stride + r] m to min_sums[k groups + g], rows in order, so that the caller's final value of
// element i is y_coded[code position of i] + min_sums[group of i]. A pair's results are the same
// whatever the block's shape and the pair's place in it.
void dot_packed_codes(const float* q_coded, const float* q_sums, int queries, const uint8_t* const* rows, int count,
                      int bits, int group, int64_t n, float* out, int64_t out_stride);
void axpy_packed_codes(const float* w, int64_t w_stride, int queries, const uint8_t* const* rows, int count, int bits,
                       int group, int64_t n, float* y_coded, float* min_sums);

}  // namespace strata::cpu
