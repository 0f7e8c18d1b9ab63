// Reading group-wise quantized rows (include/strata/quant/quant.h) on the CPU, with AVX2 where the
// build has it: dequantization into fp32, and the factored dot and axpy decode attention reads
// cache rows with.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

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
// 4-bit codes are read 32 at a time (16 bytes; 16 with AVX2) and come out even elements first:
// within each block of 32 elements, 0, 2, .., 30, then 1, 3, .., 31 (a row's last 16 elements, when
// n % 32 == 16, are a block of their own, ordered likewise). That is "code order"; 8-bit codes keep
// element order. q and y are kept in code order, so widening needs no shuffle. For rows whose n is
// a multiple of 16 and group a multiple of 32 (codes_row_ok), so that no block spans two groups.
bool codes_row_ok(int group, int64_t n);
// Bytes of a quantized row's codes (padded to whole 4-byte words); its groups' fp16 scales, then
// their fp16 minimums, follow (strata/quant/quant.h).
inline size_t row_code_bytes(int bits, int64_t n) { return (size_t(n) * size_t(bits) + 31) / 32 * 4; }
// x (n values in element order) into code order and back.
void to_code_order(int bits, const float* x, int64_t n, float* out);
void from_code_order(int bits, const float* x, int64_t n, float* out);

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

// The instruction set dot_packed_codes and axpy_packed_codes run on: AVX-512 (16 lanes, codes
// widened 32 at a time) where the build has those kernels (cpu_quant_avx512.cpp) and the CPU runs
// them, else AVX2. STRATA_CPU_ISA=avx2 in the environment picks AVX2; tests and benches may set it.
// The axpy gives the same bits on either; the dot sums in another order, so scores differ in the
// last bits between the two (each is deterministic on its own).
enum class CodesIsa { Avx2, Avx512 };
CodesIsa codes_isa();
bool codes_isa_available(CodesIsa isa);
void set_codes_isa(CodesIsa isa);  // fails when unavailable
std::string codes_isa_name(CodesIsa isa);

// The AVX-512 kernels behind the two above (defined only in builds with them).
void dot_packed_codes_avx512(const float* q_coded, const float* q_sums, int queries, const uint8_t* const* rows,
                             int count, int bits, int group, int64_t n, float* out, int64_t out_stride);
void axpy_packed_codes_avx512(const float* w, int64_t w_stride, int queries, const uint8_t* const* rows, int count,
                              int bits, int group, int64_t n, float* y_coded, float* min_sums);

}  // namespace strata::cpu
