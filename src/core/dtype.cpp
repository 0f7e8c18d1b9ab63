#include "strata/core/dtype.h"

#if defined(__F16C__) && defined(__AVX2__)
#include <immintrin.h>
#endif

#include <cstring>

#include "strata/core/error.h"

namespace strata {

size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::F32: return 4;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::I32: return 4;
    case DType::U8: return 1;
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
    case DType::U8: return "U8";
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

namespace {

#if defined(__F16C__) && defined(__AVX2__)
// fp16 <-> fp32 eight at a time with F16C, where it gives half_to_float's and float_to_half's
// bits: both round to nearest even and are exact on every finite value and infinity. NaNs keep
// their payload bits one way and become one quiet NaN the other in the scalar functions, which
// F16C does not, so a block of eight with a NaN in it goes through them. Returns the elements done.
size_t halves_to_floats(const uint16_t* h, float* f, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i));
    const __m128i exp = _mm_and_si128(x, _mm_set1_epi16(0x7c00));
    const __m128i nan = _mm_and_si128(_mm_cmpeq_epi16(exp, _mm_set1_epi16(0x7c00)),
                                      _mm_xor_si128(_mm_cmpeq_epi16(_mm_and_si128(x, _mm_set1_epi16(0x3ff)), _mm_setzero_si128()),
                                                    _mm_set1_epi16(-1)));
    if (_mm_movemask_epi8(nan) != 0) {
      for (size_t k = i; k < i + 8; ++k) f[k] = half_to_float(h[k]);
      continue;
    }
    _mm256_storeu_ps(f + i, _mm256_cvtph_ps(x));
  }
  return i;
}
size_t floats_to_halves(const float* f, uint16_t* h, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(f + i);
    if (_mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)) != 0) {
      for (size_t k = i; k < i + 8; ++k) h[k] = float_to_half(f[k]);
      continue;
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(h + i), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  return i;
}
// Eight bf16s as the fp32s they are the top halves of, exactly.
__m256 widened_bf16s(const uint16_t* b) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
size_t bf16s_to_floats(const uint16_t* b, float* f, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(f + i, widened_bf16s(b + i));
  return i;
}
// bf16 -> fp16 (a bf16 checkpoint onto the GPU): widened exactly into fp32 lanes, then rounded as
// floats_to_halves does, NaN blocks through the scalar functions. Returns the elements done.
size_t bf16s_to_halves(const uint16_t* b, uint16_t* h, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = widened_bf16s(b + i);
    if (_mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)) != 0) {
      for (size_t k = i; k < i + 8; ++k) h[k] = float_to_half(bf16_to_float(b[k]));
      continue;
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(h + i), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  return i;
}
#endif

}  // namespace

void convert_elements(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n) {
  STRATA_CHECK(src_dtype != DType::I32 && dst_dtype != DType::I32, "convert_elements is for float types");
  if (src_dtype == dst_dtype) {
    std::memcpy(dst, src, n * dtype_size(src_dtype));
    return;
  }
#if defined(__F16C__) && defined(__AVX2__)
  // Loading fp16 and bf16 checkpoints into fp32, fp32 and bf16 into fp16, vectorized: the same bits.
  size_t done = 0;
  if (src_dtype == DType::F16 && dst_dtype == DType::F32)
    done = halves_to_floats(static_cast<const uint16_t*>(src), static_cast<float*>(dst), n);
  else if (src_dtype == DType::BF16 && dst_dtype == DType::F32)
    done = bf16s_to_floats(static_cast<const uint16_t*>(src), static_cast<float*>(dst), n);
  else if (src_dtype == DType::F32 && dst_dtype == DType::F16)
    done = floats_to_halves(static_cast<const float*>(src), static_cast<uint16_t*>(dst), n);
  else if (src_dtype == DType::BF16 && dst_dtype == DType::F16)
    done = bf16s_to_halves(static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst), n);
  // The scalar loop below takes the rest.
  src = static_cast<const uint8_t*>(src) + done * dtype_size(src_dtype);
  dst = static_cast<uint8_t*>(dst) + done * dtype_size(dst_dtype);
  n -= done;
#endif
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
