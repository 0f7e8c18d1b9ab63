// Dequantization of one group-wise quantized row (include/strata/quant/quant.h) into fp32, with
// AVX2 where the build has it. The values equal quant::dequantize_rows' bit for bit (products
// rounded before the add, no FMA), so the fused paths of the CPU backend compute over exactly the
// weights and cache entries the reference describes.
#pragma once
#include <cstdint>

namespace strata::cpu {

// row: quantized_row_bytes(bits, group, n) bytes; out: n floats.
void dequantize_row_f32(const uint8_t* row, int bits, int group, int64_t n, float* out);

}  // namespace strata::cpu
