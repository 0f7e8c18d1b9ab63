// Element types of tensors and host-side conversions between them.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace strata {

enum class DType : uint8_t { F32, F16, BF16, I32 };

size_t dtype_size(DType dt);
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

// Converts n elements between float types (F32/F16/BF16); same-type conversion is a copy.
void convert_elements(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n);

}  // namespace strata
