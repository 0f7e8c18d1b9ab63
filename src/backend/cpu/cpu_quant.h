// Dequantization of one group-wise quantized row (include/strata/quant/quant.h) into fp32, with
// AVX2 where the build has it. The values equal quant::dequantize_rows' bit for bit (products
// rounded before the add, no FMA), so the fused paths of the CPU backend compute over exactly the
// weights and cache entries the reference describes.
#pragma once
#include <cstdint>

namespace strata::cpu {

// row: quantized_row_bytes(bits, group, n) bytes; out: n floats.
void dequantize_row_f32(const uint8_t* row, int bits, int group, int64_t n, float* out);

// dot(a, dequantized row) and y += alpha * dequantized row, equal bit for bit to cpu_simd.h's dot
// and axpy over dequantize_row_f32's output, without writing the row: each 8 codes are widened
// and scaled in registers as the sum reads them. Only for rows fused_row_ok accepts.
bool fused_row_ok(int group, int64_t n);  // n a multiple of 8, group a power of two, few groups
float dot_quantized_row(const float* a, const uint8_t* row, int bits, int group, int64_t n);
void axpy_quantized_row(float alpha, const uint8_t* row, int bits, int group, int64_t n, float* y);

}  // namespace strata::cpu
