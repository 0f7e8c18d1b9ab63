// Reading group-wise quantized rows (include/strata/quant/quant.h) on the CPU, with AVX2 where the
// build has it: dequantization into fp32, and the factored dot and axpy decode attention reads
// cache rows with.
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
// Codes are exact small integers in fp32, so nothing is rounded before the sums (or only c s, once,
// in the scaled form below): the results are at least as close to the exact values c s + m as
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

// Rows read once per query, in registers: `count` rows (1 to kCodeRows; consecutive positions of
// one head) at once, so that they share the query's loads, or the output's loads and stores.
// q_coded: n values in code order; q_sums: the sum of q over each group; out[r]: q . rows[r]. The
// axpy adds w[r] (c s) of each row to y_coded and w[r] m to min_sums[g] per group, rows in order,
// so that the caller's final value of element i is y_coded[code position of i] + min_sums[group
// of i]. A row's results are the same whatever `count` and its place among the rows.
constexpr int kCodeRows = 4;
void dot_packed_codes(const float* q_coded, const float* q_sums, const uint8_t* const* rows, int count, int bits,
                      int group, int64_t n, float* out);
void axpy_packed_codes(const float* w, const uint8_t* const* rows, int count, int bits, int group, int64_t n,
                       float* y_coded, float* min_sums);

// A row read by several queries (grouped-query attention): widened once into c s (fp32, code
// order) and the groups' minimums, which plain fp32 dot and axpy then read.
void widen_scaled_codes(const uint8_t* row, int bits, int group, int64_t n, float* scaled, float* mins);
float dot_scaled_codes(const float* q_coded, const float* q_sums, const float* scaled, const float* mins, int group,
                       int64_t n);
void axpy_scaled_codes(float w, const float* scaled, const float* mins, int group, int64_t n, float* y_coded,
                       float* min_sums);

}  // namespace strata::cpu
