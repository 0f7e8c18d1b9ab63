// Element types of tensors and host-side conversions between them.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace strata {

// Q4 and Q8: rows of group-wise quantized codes (include/strata/quant/quant.h). Their elements have
// no size of their own; a quantized tensor's bytes come from quantized_row_bytes() over its rows.
// U8: raw bytes of a checkpoint (GPT-OSS's MXFP4 blocks and scales), read by the source that knows them.
enum class DType : uint8_t { F32, F16, BF16, I32, Q4, Q8, U8 };

size_t dtype_size(DType dt);  // throws for Q4 and Q8
inline bool is_quantized(DType dt) { return dt == DType::Q4 || dt == DType::Q8; }
inline int quantized_bits(DType dt) { return dt == DType::Q4 ? 4 : 8; }
// Bytes of one quantized row of n elements in groups of `group`: codes padded to 4 bytes, then an
// fp16 scale and an fp16 minimum per group (the last group shorter when `group` does not divide n).
inline size_t quantized_row_bytes(int bits, int group, int64_t n) {
  const size_t groups = size_t((n + group - 1) / group);
  return (size_t(n) * size_t(bits) + 31) / 32 * 4 + 4 * groups;
}
const char* dtype_name(DType dt);

float half_to_float(uint16_t h);
uint16_t float_to_half(float f);  // round to nearest even
inline float bf16_to_float(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
uint16_t float_to_bf16(float f);  // round to nearest even

// f rounded to a float type's precision (F16, BF16; F32: itself), as a float.
inline float round_to_dtype(float f, DType dt) {
  if (dt == DType::F16) return half_to_float(float_to_half(f));
  if (dt == DType::BF16) return bf16_to_float(float_to_bf16(f));
  return f;
}

// Converts n elements between float types (F32/F16/BF16); same-type conversion is a copy.
void convert_elements(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n);

}  // namespace strata
