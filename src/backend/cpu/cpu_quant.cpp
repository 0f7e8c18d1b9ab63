#include "cpu_quant.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif
#include <algorithm>
#include <cstring>

#include "cpu_simd.h"
#include "strata/core/dtype.h"

// Built with -ffp-contract=off (src/CMakeLists.txt): the scalar tail must not fuse code * scale +
// min into an FMA, which would round once where the reference rounds twice.

namespace strata::cpu {
namespace {

float load_half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return half_to_float(h);
}

// Bytes of a row's codes (padded to whole 4-byte words); its fp16 scales, then minimums, follow.
size_t code_bytes(int bits, int64_t n) { return (size_t(n) * size_t(bits) + 31) / 32 * 4; }

uint32_t code_at(const uint8_t* codes, int bits, int64_t i) {
  if (bits == 8) return codes[i];
  return (i % 2 == 0) ? (codes[i / 2] & 0x0fu) : (codes[i / 2] >> 4);
}

#if defined(__AVX2__)
// Eight codes from element i on (i a multiple of 8), as fp32 in element order.
inline __m256 codes_x8(const uint8_t* codes, int bits, int64_t i) {
  __m256i c;
  if (bits == 4) {
    // Little-endian: element 2k sits at bits 8k..8k+3 of the word, 2k + 1 at 8k+4..8k+7, so
    // shifting by 4 e picks element e.
    uint32_t word;
    std::memcpy(&word, codes + i / 2, 4);
    c = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(int(word)), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                         _mm256_set1_epi32(0xf));
  } else {
    int64_t eight;
    std::memcpy(&eight, codes + i, 8);
    c = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(eight));
  }
  return _mm256_cvtepi32_ps(c);
}
#endif

constexpr int64_t kMaxFusedGroups = 16;

// A row's fp16 group scales and minimums widened once, and its codes dequantized 8 at a time by
// the formula of dequantize_row_f32 (product rounded, then the minimum added: no FMA here).
class RowReader {
public:
  RowReader(const uint8_t* row, int bits, int group, int64_t n) : row_(row), bits_(bits) {
    while ((int64_t(1) << shift_) < group) ++shift_;
    const int64_t groups = (n + group - 1) / group;
    const uint8_t* scales = row + code_bytes(bits, n);
    for (int64_t g = 0; g < groups; ++g) {
      scale_[g] = load_half(scales + 2 * g);
      min_[g] = load_half(scales + 2 * groups + 2 * g);
    }
  }
#if defined(__AVX2__)
  __m256 eight(int64_t i) const {  // elements [i, i + 8), i a multiple of 8
    const int64_t g = i >> shift_;
    return _mm256_add_ps(_mm256_mul_ps(codes_x8(row_, bits_, i), _mm256_set1_ps(scale_[g])), _mm256_set1_ps(min_[g]));
  }
#else
  int eight(int64_t) const { return 0; }
#endif
  float one(int64_t i) const { return float(code_at(row_, bits_, i)) * scale_[i >> shift_] + min_[i >> shift_]; }

private:
  const uint8_t* row_;
  int bits_, shift_ = 0;
  float scale_[kMaxFusedGroups], min_[kMaxFusedGroups];
};

}  // namespace

bool fused_row_ok(int group, int64_t n) {
  return group > 0 && (group & (group - 1)) == 0 && group % 8 == 0 && n % 8 == 0 &&
         (n + group - 1) / group <= kMaxFusedGroups;
}

float dot_quantized_row(const float* a, const uint8_t* row, int bits, int group, int64_t n) {
  const RowReader r(row, bits, group, n);
  return dot_with(a, n, [&r](int64_t i) { return r.eight(i); }, [&r](int64_t i) { return r.one(i); });
}

void axpy_quantized_row(float alpha, const uint8_t* row, int bits, int group, int64_t n, float* y) {
  const RowReader r(row, bits, group, n);
  axpy_with(alpha, y, n, [&r](int64_t i) { return r.eight(i); }, [&r](int64_t i) { return r.one(i); });
}

void dequantize_row_f32(const uint8_t* row, int bits, int group, int64_t n, float* out) {
  const int64_t groups = (n + group - 1) / group;
  const uint8_t* scales = row + code_bytes(bits, n);
  const uint8_t* mins = scales + 2 * groups;
  for (int64_t g = 0; g < groups; ++g) {
    const float scale = load_half(scales + 2 * g), min = load_half(mins + 2 * g);
    const int64_t first = g * group, end = std::min(n, first + group);
    int64_t i = first;
#if defined(__AVX2__)
    const __m256 s = _mm256_set1_ps(scale), m = _mm256_set1_ps(min);
    for (; i + 8 <= end; i += 8) _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_mul_ps(codes_x8(row, bits, i), s), m));
#endif
    for (; i < end; ++i) out[i] = float(code_at(row, bits, i)) * scale + min;
  }
}

}  // namespace strata::cpu
