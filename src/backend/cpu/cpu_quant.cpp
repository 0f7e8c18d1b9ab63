#include "cpu_quant.h"

#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "cpu_simd.h"
#include "strata/core/error.h"
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

// A group's scale or minimum (fp16 bits) as fp32; one instruction with F16C.
float half_at(const uint8_t* p) {
#if defined(__F16C__)
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
#else
  return load_half(p);
#endif
}

// Where element i sits in code order (cpu_quant.h): 4-bit blocks of 16 hold the even elements
// first, then the odd ones.
int64_t code_position(int bits, int64_t i) {
  if (bits == 8) return i;
  const int64_t r = i % 16;
  return i - r + (r % 2 == 0 ? r / 2 : 8 + r / 2);
}

#if defined(__AVX2__) && defined(__FMA__)
// Sixteen codes from element i on (i a multiple of 16) as fp32 in code order.
struct Sixteen {
  __m256 lo, hi;
};
inline Sixteen packed16(const uint8_t* codes, int bits, int64_t i) {
  if (bits == 4) {  // byte k holds elements 2k (low nibble) and 2k + 1 (high nibble)
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i / 2)));
    return {_mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(0xf))), _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4))};
  }
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i));
  return {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(b, 8)))};
}
// The factored dot and axpy of cpu_quant.h for Q queries and R rows (Q R <= 4). Each 16 codes of
// a row are widened once for every query; each (query, row) pair keeps its own accumulator, summed
// in the same order whatever Q and R, so the blocks only change how often codes and queries are
// loaded.
template <int Q, int R>
void dot_block(const float* q, const float* q_sums, const uint8_t* const* rows, int bits, int group, int64_t n,
               float* out, int64_t out_stride) {
  static_assert(Q * R <= kBlock);
  const size_t groups = size_t((n + group - 1) / group), scales = code_bytes(bits, n), mins = scales + 2 * groups;
  __m256 total[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  float min_part[Q * R] = {};
  for (int64_t g = 0, first = 0; first < n; ++g, first += group) {
    const int64_t end = std::min<int64_t>(n, first + group);
    __m256 acc[Q * R];
    for (__m256& a : acc) a = _mm256_setzero_ps();
    for (int64_t i = first; i < end; i += 16)
      for (int r = 0; r < R; ++r) {
        const Sixteen x = packed16(rows[r], bits, i);
        for (int k = 0; k < Q; ++k) {
          const float* qk = q + k * n + i;
          acc[k * R + r] = _mm256_fmadd_ps(x.hi, _mm256_loadu_ps(qk + 8), _mm256_fmadd_ps(x.lo, _mm256_loadu_ps(qk), acc[k * R + r]));
        }
      }
    for (int r = 0; r < R; ++r) {
      const __m256 scale = _mm256_set1_ps(half_at(rows[r] + scales + 2 * g));
      const float min = half_at(rows[r] + mins + 2 * g);
      for (int k = 0; k < Q; ++k) {
        total[k * R + r] = _mm256_fmadd_ps(scale, acc[k * R + r], total[k * R + r]);
        min_part[k * R + r] = std::fma(min, q_sums[size_t(k) * groups + size_t(g)], min_part[k * R + r]);
      }
    }
  }
  alignas(16) float sums[4];
  _mm_store_ps(sums, reduce4(total[0], total[1], total[2], total[3]));
  for (int k = 0; k < Q; ++k)
    for (int r = 0; r < R; ++r) out[k * out_stride + r] = sums[k * R + r] + min_part[k * R + r];
}
template <int Q, int R>
void axpy_block(const float* w, int64_t w_stride, const uint8_t* const* rows, int bits, int group, int64_t n, float* y,
                float* min_sums) {
  static_assert(Q * R <= kBlock);
  const size_t groups = size_t((n + group - 1) / group), scales = code_bytes(bits, n), mins = scales + 2 * groups;
  for (int64_t g = 0, first = 0; first < n; ++g, first += group) {
    const int64_t end = std::min<int64_t>(n, first + group);
    __m256 ws[Q * R];
    for (int r = 0; r < R; ++r) {
      const float scale = half_at(rows[r] + scales + 2 * g), min = half_at(rows[r] + mins + 2 * g);
      for (int k = 0; k < Q; ++k) {
        ws[k * R + r] = _mm256_set1_ps(w[k * w_stride + r] * scale);
        float& sum = min_sums[size_t(k) * groups + size_t(g)];
        sum = std::fma(w[k * w_stride + r], min, sum);
      }
    }
    for (int64_t i = first; i < end; i += 16) {
      Sixteen x[R];
      for (int r = 0; r < R; ++r) x[r] = packed16(rows[r], bits, i);
      for (int k = 0; k < Q; ++k) {
        float* yk = y + k * n + i;
        __m256 y_lo = _mm256_loadu_ps(yk), y_hi = _mm256_loadu_ps(yk + 8);
        for (int r = 0; r < R; ++r) {  // rows in order: the same sums as one row at a time
          y_lo = _mm256_fmadd_ps(ws[k * R + r], x[r].lo, y_lo);
          y_hi = _mm256_fmadd_ps(ws[k * R + r], x[r].hi, y_hi);
        }
        _mm256_storeu_ps(yk, y_lo);
        _mm256_storeu_ps(yk + 8, y_hi);
      }
    }
  }
}
#else
// Without AVX2: each row widened into c s (code order) and its groups' minimums, then plain sums.
void widen_scaled_codes(const uint8_t* row, int bits, int group, int64_t n, float* scaled, float* mins) {
  const int64_t groups = (n + group - 1) / group;
  const uint8_t* params = row + code_bytes(bits, n);
  for (int64_t g = 0, first = 0; g < groups; ++g, first += group) {
    const float scale = half_at(params + 2 * g);
    mins[g] = half_at(params + 2 * (groups + g));
    for (int64_t i = first; i < std::min<int64_t>(n, first + group); ++i)
      scaled[code_position(bits, i)] = float(code_at(row, bits, i)) * scale;
  }
}
// Calls f(k, r, scaled, mins) for each (query, row) pair of a block, row r widened as above.
template <class F>
void for_each_widened_pair(const uint8_t* const* rows, int count, int queries, int bits, int group, int64_t n, F&& f) {
  std::vector<float> scaled(static_cast<size_t>(n)), mins(static_cast<size_t>((n + group - 1) / group));
  for (int r = 0; r < count; ++r) {
    widen_scaled_codes(rows[r], bits, group, n, scaled.data(), mins.data());
    for (int k = 0; k < queries; ++k) f(k, r, scaled.data(), mins.data());
  }
}
#endif

void check_block(int queries, int count) {
  STRATA_CHECK(queries >= 1 && count >= 1 && queries * count <= kBlock,
               "packed codes: " << queries << " queries x " << count << " rows in one block");
}

}  // namespace

bool codes_row_ok(int group, int64_t n) { return group > 0 && group % 16 == 0 && n > 0 && n % 16 == 0; }

void to_code_order(int bits, const float* x, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[code_position(bits, i)] = x[i];
}
void from_code_order(int bits, const float* x, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[code_position(bits, i)];
}
void to_coded_query(int bits, int group, const float* x, int64_t n, float* coded, float* sums) {
  for (int64_t g = 0, first = 0; first < n; ++g, first += group)
    sums[g] = std::accumulate(x + first, x + std::min<int64_t>(n, first + group), 0.0f);
  to_code_order(bits, x, n, coded);
}

void dot_packed_codes(const float* q_coded, const float* q_sums, int queries, const uint8_t* const* rows, int count,
                      int bits, int group, int64_t n, float* out, int64_t out_stride) {
  check_block(queries, count);
#if defined(__AVX2__) && defined(__FMA__)
  with_block(queries, count, [&]<int Q, int R>() { dot_block<Q, R>(q_coded, q_sums, rows, bits, group, n, out, out_stride); });
#else
  const int64_t groups = (n + group - 1) / group;
  for_each_widened_pair(rows, count, queries, bits, group, n, [&](int k, int r, const float* scaled, const float* mins) {
    float min_part = 0;
    for (int64_t g = 0; g < groups; ++g) min_part = std::fma(mins[g], q_sums[k * groups + g], min_part);
    out[k * out_stride + r] = dot(q_coded + k * n, scaled, n) + min_part;
  });
#endif
}

void axpy_packed_codes(const float* w, int64_t w_stride, int queries, const uint8_t* const* rows, int count, int bits,
                       int group, int64_t n, float* y_coded, float* min_sums) {
  check_block(queries, count);
#if defined(__AVX2__) && defined(__FMA__)
  with_block(queries, count,
             [&]<int Q, int R>() { axpy_block<Q, R>(w, w_stride, rows, bits, group, n, y_coded, min_sums); });
#else
  const int64_t groups = (n + group - 1) / group;
  for_each_widened_pair(rows, count, queries, bits, group, n, [&](int k, int r, const float* scaled, const float* mins) {
    const float wk = w[k * w_stride + r];
    for (int64_t g = 0; g < groups; ++g) min_sums[k * groups + g] = std::fma(wk, mins[g], min_sums[k * groups + g]);
    axpy(wk, scaled, y_coded + k * n, n);
  });
#endif
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
