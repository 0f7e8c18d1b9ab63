// Host reference for group-wise 4/8-bit quantization: the formula of quant.h computed in fp32,
// one row at a time. GPU kernels and the tests check themselves against this.
#include "strata/quant/quant.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "strata/core/error.h"

// The header's dequantization rounds the product before adding, as numpy does: src/CMakeLists.txt
// builds this file with -ffp-contract=off so the compiler does not fuse it into an FMA (x86-64-v3
// has one), and the reference matches its numpy twin exactly.

namespace strata::quant {
namespace {

void check_fields(const QuantSpec& spec) {
  if (spec.bits != 4 && spec.bits != 8) STRATA_FAIL("quantization: bits must be 4 or 8, got " << spec.bits);
  if (spec.group_size != 32 && spec.group_size != 64 && spec.group_size != 128)
    STRATA_FAIL("quantization: group_size must be 32, 64 or 128, got " << spec.group_size);
}

void check_float_dtype(DType dt, const char* which) {
  if (dt != DType::F32 && dt != DType::F16 && dt != DType::BF16)
    STRATA_FAIL("quantization: " << which << " must be F32, F16 or BF16, got " << dtype_name(dt));
}

// Where a quantized row keeps its codes, scales and minimums (quant.h's layout).
struct RowLayout {
  size_t code_bytes;
  size_t groups;
  size_t bytes;
};

RowLayout row_layout(const QuantSpec& spec, int64_t n) {
  RowLayout l;
  // Codes padded to 4 bytes, so the fp16 parameters after them stay aligned on every device.
  l.code_bytes = (size_t(n) * size_t(spec.bits) + 31) / 32 * 4;
  l.groups = size_t((n + spec.group_size - 1) / spec.group_size);
  l.bytes = quantized_row_bytes(spec.bits, spec.group_size, n);
  return l;
}

// memcpy: a row's parameters need not be 2-byte aligned in a caller's buffer.
void store_half(uint8_t* base, size_t index, float v) {
  const uint16_t h = float_to_half(v);
  std::memcpy(base + index * sizeof(uint16_t), &h, sizeof(uint16_t));
}

float load_half(const uint8_t* base, size_t index) {
  uint16_t h;
  std::memcpy(&h, base + index * sizeof(uint16_t), sizeof(uint16_t));
  return half_to_float(h);
}

void store_code(uint8_t* codes, int bits, size_t i, uint32_t code) {
  if (bits == 8) {
    codes[i] = uint8_t(code);
  } else if (i % 2 == 0) {  // the low nibble, written first, clears the byte's high one
    codes[i / 2] = uint8_t(code);
  } else {
    codes[i / 2] = uint8_t(codes[i / 2] | (code << 4));
  }
}

uint32_t load_code(const uint8_t* codes, int bits, size_t i) {
  if (bits == 8) return codes[i];
  return (i % 2 == 0) ? (codes[i / 2] & 0x0fu) : (codes[i / 2] >> 4);
}

// A group's extremes as the scalar loop finds them: std::min and std::max keep the first of equal
// values, which decides the sign of a zero extreme. False if an element is not finite.
bool group_extremes(const float* xg, size_t g, float& lo, float& hi) {
#if defined(__AVX2__)
  // Eight lanes at a time where that gives the same answer: every element finite and neither
  // extreme a zero (a lane's min of -0 and +0 depends on the order it met them). Otherwise the
  // scalar loop below decides, and names the group if it holds a NaN or an infinity.
  if (g % 8 == 0) {
    __m256 vlo = _mm256_loadu_ps(xg), vhi = vlo, bad = _mm256_setzero_ps();
    const __m256 inf = _mm256_set1_ps(INFINITY), abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (size_t i = 0; i < g; i += 8) {
      const __m256 x = _mm256_loadu_ps(xg + i);
      vlo = _mm256_min_ps(vlo, x);
      vhi = _mm256_max_ps(vhi, x);
      bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_and_ps(x, abs_mask), inf, _CMP_NLT_UQ));  // inf or NaN
    }
    if (_mm256_movemask_ps(bad) == 0) {
      alignas(32) float l[8], h[8];
      _mm256_store_ps(l, vlo);
      _mm256_store_ps(h, vhi);
      lo = *std::min_element(l, l + 8);
      hi = *std::max_element(h, h + 8);
      if (lo != 0.0f && hi != 0.0f) return true;
    }
  }
#endif
  lo = xg[0], hi = xg[0];
  bool finite = true;
  for (size_t i = 0; i < g; ++i) {
    finite = finite && std::isfinite(xg[i]);
    lo = std::min(lo, xg[i]);
    hi = std::max(hi, xg[i]);
  }
  return finite;
}

// The codes of one group, from element `first` of the row: round((x - min) / scale) half to even,
// clamped to [0, max_code], into zeroed code bytes. The vector path computes the same fp32
// operations (IEEE division and round-to-nearest-even are exact in either form).
void group_codes(int bits, const float* xg, size_t g, size_t first, float min16, float scale16, uint8_t* codes) {
  const uint32_t max_code = (1u << bits) - 1;
  if (scale16 == 0.0f) return;  // every code is 0
  size_t i = 0;
#if defined(__AVX2__)
  const __m256 m = _mm256_set1_ps(min16), s = _mm256_set1_ps(scale16), top = _mm256_set1_ps(float(max_code));
  // `first` is a multiple of the group size, so eight 4-bit codes fill four whole bytes.
  for (; i + 8 <= g; i += 8) {
    const __m256 q = _mm256_round_ps(_mm256_div_ps(_mm256_sub_ps(_mm256_loadu_ps(xg + i), m), s),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256i c = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(q, _mm256_setzero_ps()), top));
    __m128i words = _mm_packus_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));  // 8 x u16
    if (bits == 8) {
      const int64_t eight = _mm_cvtsi128_si64(_mm_packus_epi16(words, words));
      std::memcpy(codes + first + i, &eight, 8);
    } else {  // 32-bit lane k holds codes 2k (low half) and 2k + 1 (high half): one byte each
      words = _mm_and_si128(_mm_or_si128(words, _mm_srli_epi32(words, 12)), _mm_set1_epi32(0xff));
      const __m128i bytes = _mm_packus_epi16(_mm_packus_epi32(words, words), _mm_setzero_si128());
      const int32_t four = _mm_cvtsi128_si32(bytes);
      std::memcpy(codes + (first + i) / 2, &four, 4);
    }
  }
#endif
  for (; i < g; ++i) {
    const float q = std::nearbyint((xg[i] - min16) / scale16);  // half to even by default
    store_code(codes, bits, first + i, uint32_t(std::clamp(q, 0.0f, float(max_code))));
  }
}

// x: one row of n elements in fp32; out: its row_bytes(spec, n) bytes.
void quantize_row(const QuantSpec& spec, const RowLayout& l, const float* x, size_t n, uint8_t* out) {
  const uint32_t max_code = (1u << spec.bits) - 1;
  uint8_t* codes = out;
  std::memset(codes, 0, l.code_bytes);  // padding and a lone last nibble are zero
  uint8_t* scales = out + l.code_bytes;
  uint8_t* mins = scales + l.groups * sizeof(uint16_t);
  for (size_t grp = 0; grp < l.groups; ++grp) {
    const size_t first = grp * size_t(spec.group_size);
    const size_t g = std::min(size_t(spec.group_size), n - first);  // the last group may be shorter
    const float* xg = x + first;
    float lo, hi;
    STRATA_CHECK(group_extremes(xg, g, lo, hi), "quantization: inputs must be finite (group " << grp << ")");
    const uint16_t min_bits = float_to_half(lo), scale_bits = float_to_half((hi - lo) / float(max_code));
    const float min16 = half_to_float(min_bits), scale16 = half_to_float(scale_bits);
    // fp16 tops out at 65504: a group beyond it has no representable parameters.
    STRATA_CHECK(std::isfinite(min16) && std::isfinite(scale16),
                 "quantization: group " << grp << " spans [" << lo << ", " << hi << "], beyond fp16's range");
    std::memcpy(scales + grp * sizeof(uint16_t), &scale_bits, sizeof(uint16_t));
    std::memcpy(mins + grp * sizeof(uint16_t), &min_bits, sizeof(uint16_t));
    group_codes(spec.bits, xg, g, first, min16, scale16, codes);
  }
}

void dequantize_row(const QuantSpec& spec, const RowLayout& l, const uint8_t* in, size_t n, float* y) {
  const size_t g = size_t(spec.group_size);
  const uint8_t* codes = in;
  const uint8_t* scales = in + l.code_bytes;
  const uint8_t* mins = scales + l.groups * sizeof(uint16_t);
  for (size_t grp = 0; grp < l.groups; ++grp) {
    const float scale = load_half(scales, grp);
    const float min = load_half(mins, grp);
    for (size_t i = grp * g; i < std::min((grp + 1) * g, n); ++i)
      y[i] = float(load_code(codes, spec.bits, i)) * scale + min;
  }
}

}  // namespace

void check_spec(const QuantSpec& spec, int64_t n) {
  check_fields(spec);
  if (n <= 0) STRATA_FAIL("quantization: a row must have at least one element, got n = " << n);
}

QuantSpec spec_of(const Tensor& t) {
  STRATA_CHECK(t.quantized(), "internal: a " << dtype_name(t.dtype) << " tensor is not quantized");
  QuantSpec s;
  s.bits = quantized_bits(t.dtype);
  s.group_size = t.group;
  check_fields(s);
  return s;
}

size_t row_bytes(const QuantSpec& spec, int64_t n) {
  check_spec(spec, n);
  return row_layout(spec, n).bytes;
}

double bytes_per_element(const QuantSpec& spec) {
  check_fields(spec);
  return double(spec.bits) / 8.0 + 2.0 * double(sizeof(uint16_t)) / double(spec.group_size);
}

namespace {

// The checks both directions share, then the layout of one quantized row.
RowLayout checked_layout(const QuantSpec& spec, int64_t rows, int64_t n, DType float_dtype, const char* which) {
  check_spec(spec, n);
  check_float_dtype(float_dtype, which);
  if (rows < 0) STRATA_FAIL("quantization: rows must not be negative, got " << rows);
  return row_layout(spec, n);
}

}  // namespace

void quantize_rows(const QuantSpec& spec, const void* src, DType src_dtype, int64_t rows, int64_t n, void* dst) {
  const RowLayout l = checked_layout(spec, rows, n, src_dtype, "source dtype");
  const size_t in_row_bytes = size_t(n) * dtype_size(src_dtype);
  // fp32 rows are read in place where they are aligned as floats; others are widened or copied.
  const bool in_place = src_dtype == DType::F32 && reinterpret_cast<uintptr_t>(src) % alignof(float) == 0;
  std::vector<float> row(in_place ? 0 : static_cast<size_t>(n));
  for (int64_t r = 0; r < rows; ++r) {
    const auto* in = static_cast<const uint8_t*>(src) + size_t(r) * in_row_bytes;
    const float* x = reinterpret_cast<const float*>(in);
    if (!in_place) {
      convert_elements(in, src_dtype, row.data(), DType::F32, size_t(n));
      x = row.data();
    }
    quantize_row(spec, l, x, size_t(n), static_cast<uint8_t*>(dst) + size_t(r) * l.bytes);
  }
}

void dequantize_rows(const QuantSpec& spec, const void* src, int64_t rows, int64_t n, void* dst, DType dst_dtype) {
  const RowLayout l = checked_layout(spec, rows, n, dst_dtype, "destination dtype");
  const size_t out_row_bytes = size_t(n) * dtype_size(dst_dtype);
  std::vector<float> row(static_cast<size_t>(n));
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(spec, l, static_cast<const uint8_t*>(src) + size_t(r) * l.bytes, size_t(n), row.data());
    convert_elements(row.data(), DType::F32, static_cast<uint8_t*>(dst) + size_t(r) * out_row_bytes, dst_dtype,
                     size_t(n));
  }
}

}  // namespace strata::quant

namespace strata::quant {

bool pack_row(const QuantSpec& spec, int64_t n, const uint8_t* codes, const float* scales, const float* mins,
              void* dst) {
  check_spec(spec, n);
  const RowLayout l = row_layout(spec, n);
  const uint32_t max_code = (1u << spec.bits) - 1;
  auto* out = static_cast<uint8_t*>(dst);
  std::memset(out, 0, l.code_bytes);  // padding and a lone last nibble are zero
  for (int64_t i = 0; i < n; ++i) {
    STRATA_CHECK(codes[i] <= max_code, "internal: code " << int(codes[i]) << " does not fit " << spec.bits << " bits");
    store_code(out, spec.bits, size_t(i), codes[i]);
  }
  uint8_t* scale_out = out + l.code_bytes;
  uint8_t* min_out = scale_out + l.groups * sizeof(uint16_t);
  for (size_t g = 0; g < l.groups; ++g) {
    const float scale16 = half_to_float(float_to_half(scales[g]));
    const float min16 = half_to_float(float_to_half(mins[g]));
    if (!std::isfinite(scale16) || !std::isfinite(min16)) return false;
    store_half(scale_out, g, scale16);
    store_half(min_out, g, min16);
  }
  return true;
}

}  // namespace strata::quant

namespace strata::quant {

void scale_row(const QuantSpec& spec, int64_t n, void* row, float factor) {
  check_spec(spec, n);
  const RowLayout l = row_layout(spec, n);
  // code x scale + min: both parameters times the factor scale every value, the codes unchanged.
  uint8_t* params = static_cast<uint8_t*>(row) + l.code_bytes;
  for (size_t i = 0; i < 2 * l.groups; ++i) store_half(params, i, load_half(params, i) * factor);
}

}  // namespace strata::quant
