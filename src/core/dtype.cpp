#include "strata/core/dtype.h"

#include <cstring>

#include "strata/core/error.h"

namespace strata {

size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::F32: return 4;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::I32: return 4;
    case DType::Q4:
    case DType::Q8: break;
  }
  STRATA_FAIL("internal: " << dtype_name(dt) << " is quantized: its elements have no size of their own");
}

const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::I32: return "I32";
    case DType::Q4: return "Q4";
    case DType::Q8: return "Q8";
  }
  return "?";
}

float half_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalize
      int e = -1;
      do { mant <<= 1; ++e; } while ((mant & 0x400) == 0);
      bits = sign | uint32_t(127 - 15 - e) << 23 | (mant & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 112) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t absx = x & 0x7fffffff;
  if (absx >= 0x7f800000) return uint16_t(sign | 0x7c00 | (absx > 0x7f800000 ? 0x200 : 0));  // inf/nan
  if (absx >= 0x477ff000) return uint16_t(sign | 0x7c00);  // rounds past the largest half
  if (absx < 0x38800000) {  // subnormal or zero in half
    float af;
    std::memcpy(&af, &absx, 4);
    // 2^-24 is the smallest half subnormal; adding 0.5 makes the FPU round to nearest even.
    float scaled = af * 16777216.0f;
    uint32_t m = uint32_t(scaled);
    float frac = scaled - float(m);
    if (frac > 0.5f || (frac == 0.5f && (m & 1))) ++m;
    return uint16_t(sign | m);
  }
  uint32_t mant = absx & 0x7fffff;
  uint32_t exp = (absx >> 23) - 112;
  uint32_t h = exp << 10 | mant >> 13;
  uint32_t rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;  // carries into the exponent correctly
  return uint16_t(sign | h);
}

uint16_t float_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000) return uint16_t((x >> 16) | 0x40);  // quiet nan
  x += 0x7fff + ((x >> 16) & 1);
  return uint16_t(x >> 16);
}

void convert_elements(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n) {
  STRATA_CHECK(src_dtype != DType::I32 && dst_dtype != DType::I32, "convert_elements is for float types");
  if (src_dtype == dst_dtype) {
    std::memcpy(dst, src, n * dtype_size(src_dtype));
    return;
  }
  auto load = [&](size_t i) -> float {
    switch (src_dtype) {
      case DType::F32: return static_cast<const float*>(src)[i];
      case DType::F16: return half_to_float(static_cast<const uint16_t*>(src)[i]);
      default: return bf16_to_float(static_cast<const uint16_t*>(src)[i]);
    }
  };
  for (size_t i = 0; i < n; ++i) {
    float v = load(i);
    switch (dst_dtype) {
      case DType::F32: static_cast<float*>(dst)[i] = v; break;
      case DType::F16: static_cast<uint16_t*>(dst)[i] = float_to_half(v); break;
      default: static_cast<uint16_t*>(dst)[i] = float_to_bf16(v); break;
    }
  }
}

}  // namespace strata
