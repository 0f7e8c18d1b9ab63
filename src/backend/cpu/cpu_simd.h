// SIMD building blocks of the CPU backend's kernels (AVX2, FMA and F16C where the build has them),
// and the fp32 <-> fp16 / bf16 conversions of its rows.
// Shared by cpu_backend.cpp and cpu_quant.cpp (whose scaled-codes dot and axpy are these over a
// widened row). Every multiply-add is an explicit FMA (std::fma in scalar tails), whatever the
// translation unit's -ffp-contract setting.
#pragma once
#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

#include <cmath>
#include <cstdint>
#include <cstring>

#include "strata/core/dtype.h"

namespace strata::cpu {

// fp16 values travel as their IEEE bit patterns, as in strata/core/dtype.h; bf16 values too (the
// top halves of fp32s), in a type of their own so that kernels can take either as an element type.
using f16 = uint16_t;
enum class bf16 : uint16_t {};

#if defined(__AVX2__) && defined(__FMA__)
inline float hsum(__m256 s) {
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps(q, q, 1)));
}
#endif
#if defined(__F16C__)
inline __m256 load_f16x8(const f16* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
#endif
#if defined(__AVX2__)
// Eight bf16s widened exactly: each shifted into the top half of an fp32 lane.
inline __m256 load_bf16x8(const bf16* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
#endif
#if defined(__AVX2__) && defined(__FMA__)
// Eight values of a row (fp32, fp16 or bf16) as fp32: what the kernels below widen with.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const f16* p) { return load_f16x8(p); }
inline __m256 load8(const bf16* p) { return load_bf16x8(p); }
#endif
inline float value_at(const float* p, int64_t i) { return p[i]; }
inline float value_at(const f16* p, int64_t i) { return half_to_float(p[i]); }
inline float value_at(const bf16* p, int64_t i) { return bf16_to_float(uint16_t(p[i])); }

// Dot product and axpy with explicit SIMD: without it the compiler keeps float sums in order and
// runs one lane at a time. Four accumulators hide the FMA latency so the loop streams at memory
// speed. `Load8(i)` yields b[i, i + 8) as fp32 and `at(i)` b[i] (the scalar tail), so fp32 and
// fp16 rows share one accumulation order.
template <class Load8, class At>
inline float dot_with(const float* a, int64_t n, [[maybe_unused]] Load8 load8, At at) {
  int64_t i = 0;
  float acc = 0;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
  for (; i + 32 <= n; i += 32) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load8(i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), load8(i + 8), s1);
    s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), load8(i + 16), s2);
    s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), load8(i + 24), s3);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load8(i), s0);
  acc = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
#endif
  for (; i < n; ++i) acc = std::fma(a[i], at(i), acc);
  return acc;
}
template <class Load8, class At>
inline void axpy_with(float alpha, float* y, int64_t n, [[maybe_unused]] Load8 load8, At at) {
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 va = _mm256_set1_ps(alpha);
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, load8(i), _mm256_loadu_ps(y + i)));
#endif
  for (; i < n; ++i) y[i] = std::fma(alpha, at(i), y[i]);
}

// dot(a, b) and axpy(alpha, x, y) over a row b / x of fp32, fp16 or bf16 (a cache row or a weight
// row), 16-bit values widened 8 at a time in registers.
template <class T>
inline float dot(const float* a, const T* b, int64_t n) {
#if defined(__AVX2__) && defined(__FMA__)
  return dot_with(a, n, [b](int64_t i) { return load8(b + i); }, [b](int64_t i) { return value_at(b, i); });
#else
  return dot_with(a, n, [](int64_t) { return 0; }, [b](int64_t i) { return value_at(b, i); });
#endif
}
template <class T>
inline void axpy(float alpha, const T* x, float* y, int64_t n) {
#if defined(__AVX2__) && defined(__FMA__)
  axpy_with(alpha, y, n, [x](int64_t i) { return load8(x + i); }, [x](int64_t i) { return value_at(x, i); });
#else
  axpy_with(alpha, y, n, [](int64_t) { return 0; }, [x](int64_t i) { return value_at(x, i); });
#endif
}

// out[k out_stride + r] = dot(q_k, rows[r], n) for a block of `queries` queries (consecutive, n
// floats apart) by `count` rows, queries x count <= kDotPairs, each pair bit for bit what dot()
// gives it: its own four accumulators over the same strides, reduced in the same order. The pairs
// share each widening and load of a row or a query, which dot() repeats for every pair (a linear's
// few tokens over a weight row, or one token over a few rows). Three pairs' twelve accumulators
// still leave AVX2's sixteen registers room for the loads.
constexpr int kDotPairs = 3;
#if defined(__AVX2__) && defined(__FMA__)
template <int Q, int R, class T>
void dot_pairs_of_shape(const float* q, const T* const* rows, int64_t n, float* out, int64_t out_stride) {
  __m256 s[Q * R][4];
  for (auto& pair : s)
    for (__m256& acc : pair) acc = _mm256_setzero_ps();
  // One 8-float chunk j of every pair: each row's chunk widened once, each query's loaded once per row.
  const auto chunk = [&](int64_t i, int j) {
#pragma GCC unroll 3
    for (int r = 0; r < R; ++r) {
      const __m256 b = load8(rows[r] + i);
#pragma GCC unroll 3
      for (int k = 0; k < Q; ++k) s[k * R + r][j] = _mm256_fmadd_ps(_mm256_loadu_ps(q + k * n + i), b, s[k * R + r][j]);
    }
  };
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) chunk(i + 8 * j, j);
  }
  for (; i + 8 <= n; i += 8) chunk(i, 0);
  for (int k = 0; k < Q; ++k)
    for (int r = 0; r < R; ++r) {
      const __m256* p = s[k * R + r];
      float acc = hsum(_mm256_add_ps(_mm256_add_ps(p[0], p[1]), _mm256_add_ps(p[2], p[3])));
      for (int64_t t = i; t < n; ++t) acc = std::fma(q[k * n + t], value_at(rows[r], t), acc);
      out[k * out_stride + r] = acc;
    }
}
#endif
template <class T>
void dot_pairs(const float* q, int queries, const T* const* rows, int count, int64_t n, float* out, int64_t out_stride) {
#if defined(__AVX2__) && defined(__FMA__)
  switch (queries * 4 + count) {
    case 4 + 1: return dot_pairs_of_shape<1, 1>(q, rows, n, out, out_stride);
    case 4 + 2: return dot_pairs_of_shape<1, 2>(q, rows, n, out, out_stride);
    case 4 + 3: return dot_pairs_of_shape<1, 3>(q, rows, n, out, out_stride);
    case 8 + 1: return dot_pairs_of_shape<2, 1>(q, rows, n, out, out_stride);
    case 12 + 1: return dot_pairs_of_shape<3, 1>(q, rows, n, out, out_stride);
    default: break;
  }
#endif
  for (int k = 0; k < queries; ++k)
    for (int r = 0; r < count; ++r) out[k * out_stride + r] = dot(q + k * n, rows[r], n);
}

// Decode attention's blocks: up to kBlock (query, row) pairs, `queries` queries (consecutive, n
// floats apart) by `count` rows (consecutive positions of one kv head; for the linear over codes,
// tokens by weight rows), so that each widening of a
// row (fp16, or codes in cpu_quant.h) serves every query and the rows share the queries' loads, or
// the outputs' loads and stores. Each pair keeps its own accumulators, summed in the same order
// whatever the block's shape, so a pair's result does not depend on the block it falls in.
constexpr int kBlock = 4;
#if defined(__AVX2__) && defined(__FMA__)
// Four sums (each an fp32 vector) reduced together: lane k of the result is sum k's total, and a
// sum does not depend on the others (a lone sum reduces with zeros beside it).
inline __m128 reduce4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}
// Calls f.template operator()<Q, R>() for a block of Q queries by R rows, Q R <= kBlock.
template <class F>
void with_block(int queries, int count, F&& f) {
  switch (queries * 4 + count) {
    case 4 + 1: return f.template operator()<1, 1>();
    case 4 + 2: return f.template operator()<1, 2>();
    case 4 + 3: return f.template operator()<1, 3>();
    case 4 + 4: return f.template operator()<1, 4>();
    case 8 + 1: return f.template operator()<2, 1>();
    case 8 + 2: return f.template operator()<2, 2>();
    case 12 + 1: return f.template operator()<3, 1>();
    default: return f.template operator()<4, 1>();
  }
}
#endif

// out[k out_stride + r] = query k . rows[r] for a block of fp32, fp16 or bf16 rows of n.
template <class T>
void dot_block(const float* q, int queries, const T* const* rows, int count, int64_t n, float* out,
               int64_t out_stride) {
  float sums[kBlock] = {};
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  with_block(queries, count, [&]<int Q, int R>() {
    // Two accumulators per pair (the chunk's halves), so that four pairs keep eight FMAs in flight.
    __m256 lo_acc[4], hi_acc[4];
    for (int p = 0; p < 4; ++p) lo_acc[p] = hi_acc[p] = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16)
      for (int r = 0; r < R; ++r) {
        const __m256 lo = load8(rows[r] + i), hi = load8(rows[r] + i + 8);
        for (int k = 0; k < Q; ++k) {
          const float* qk = q + k * n + i;
          lo_acc[k * R + r] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(qk), lo_acc[k * R + r]);
          hi_acc[k * R + r] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(qk + 8), hi_acc[k * R + r]);
        }
      }
    _mm_storeu_ps(sums, reduce4(_mm256_add_ps(lo_acc[0], hi_acc[0]), _mm256_add_ps(lo_acc[1], hi_acc[1]),
                                _mm256_add_ps(lo_acc[2], hi_acc[2]), _mm256_add_ps(lo_acc[3], hi_acc[3])));
  });
#endif
  for (int k = 0; k < queries; ++k)
    for (int r = 0; r < count; ++r) {
      float s = sums[k * count + r];
      for (int64_t j = i; j < n; ++j) s = std::fma(q[k * n + j], value_at(rows[r], j), s);
      out[k * out_stride + r] = s;
    }
}
// Adds w[k w_stride + r] rows[r] to query k's output y + k n, rows in order.
template <class T>
void axpy_block(const float* w, int64_t w_stride, int queries, const T* const* rows, int count, int64_t n, float* y) {
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  with_block(queries, count, [&]<int Q, int R>() {
    __m256 ws[Q * R];
    for (int k = 0; k < Q; ++k)
      for (int r = 0; r < R; ++r) ws[k * R + r] = _mm256_set1_ps(w[k * w_stride + r]);
    for (; i + 16 <= n; i += 16) {
      __m256 lo[R], hi[R];
      for (int r = 0; r < R; ++r) lo[r] = load8(rows[r] + i), hi[r] = load8(rows[r] + i + 8);
      for (int k = 0; k < Q; ++k) {
        float* yk = y + k * n + i;
        __m256 y_lo = _mm256_loadu_ps(yk), y_hi = _mm256_loadu_ps(yk + 8);
        for (int r = 0; r < R; ++r) {
          y_lo = _mm256_fmadd_ps(ws[k * R + r], lo[r], y_lo);
          y_hi = _mm256_fmadd_ps(ws[k * R + r], hi[r], y_hi);
        }
        _mm256_storeu_ps(yk, y_lo);
        _mm256_storeu_ps(yk + 8, y_hi);
      }
    }
  });
#endif
  for (int k = 0; k < queries; ++k)
    for (int64_t j = i; j < n; ++j)
      for (int r = 0; r < count; ++r) y[k * n + j] = std::fma(w[k * w_stride + r], value_at(rows[r], j), y[k * n + j]);
}

#if defined(__AVX2__) && defined(__FMA__)
// e^v for eight v by Cephes' expf (range reduction by ln 2 in two parts, a degree-6 polynomial,
// the exponent added as bits; within 2 ulp of std::exp). Arguments below -87.3 (results under
// 1e-38) give about 1e-38 instead of a subnormal.
inline __m256 exp8(__m256 v) {
  const __m256 log2e = _mm256_set1_ps(1.44269504088896341f), c1 = _mm256_set1_ps(0.693359375f),
               c2 = _mm256_set1_ps(-2.12194440e-4f), one = _mm256_set1_ps(1.0f);
  v = _mm256_max_ps(v, _mm256_set1_ps(-87.3365478515625f));
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(v, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 r = _mm256_fnmadd_ps(k, c2, _mm256_fnmadd_ps(k, c1, v));  // v - k ln 2
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), one);  // e^r = 1 + r + r^2 p(r)
  const __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(scale));  // times 2^k
}
#endif

// x[i] = exp(x[i] - mx) for n values, returning their sum: the softmax's weights, eight at a time
// by exp8, which keeps the exponentials off the critical path of a decode step.
inline float exp_shifted_sum(float* x, int64_t n, float mx) {
  int64_t i = 0;
  float sum = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 vmx = _mm256_set1_ps(mx);
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmx));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  sum = hsum(acc);
#endif
  for (; i < n; ++i) sum += (x[i] = std::exp(x[i] - mx));
  return sum;
}

// x[i] = x Phi(x) = x (1 + erf(x / sqrt 2)) / 2 for n values in place: transformers' exact "gelu".
// Eight at a time, erfc(z) for z = |x| / sqrt 2 by Abramowitz and Stegun 7.1.26 (a degree-5
// polynomial in t = 1 / (1 + p z) times e^(-z^2): |error| <= 1.5e-7), so a value is within
// 0.75e-7 |x| and a few ulp of the float64 one (tests/test_cpu_gelu.cpp). About 4x the scalar
// std::erf on the 2-core VM, where that was a tenth of OPT-125M's prefill (2026-11-28,
// bench/results/2026-11-28-cpu-prefill-attention.md).
inline void gelu_inplace(float* x, int64_t n) {
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
  const __m256 inv_sqrt2 = _mm256_set1_ps(0.70710678118654752f), p = _mm256_set1_ps(0.3275911f);
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 z = _mm256_mul_ps(_mm256_andnot_ps(sign_bit, v), inv_sqrt2);
    const __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(p, z, one));
    __m256 poly = _mm256_set1_ps(1.061405429f);
    poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(-1.453152027f));
    poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(1.421413741f));
    poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(-0.284496736f));
    poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(0.254829592f));
    const __m256 erfc = _mm256_mul_ps(_mm256_mul_ps(poly, t), exp8(_mm256_sub_ps(zero, _mm256_mul_ps(z, z))));
    const __m256 g = _mm256_mul_ps(_mm256_mul_ps(half, v), erfc);  // x erfc(z) / 2: the value below 0
    _mm256_storeu_ps(x + i, _mm256_blendv_ps(_mm256_sub_ps(v, g), g, _mm256_cmp_ps(v, zero, _CMP_LT_OQ)));
  }
#endif
  for (; i < n; ++i) x[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * 0.70710678118654752f));
}

// Rows of n fp32, fp16 or bf16 values to fp32 and back; fp32 -> 16 bits rounds to nearest even,
// like float_to_half and float_to_bf16.
inline void to_f32(const float* src, float* dst, int64_t n) { std::memcpy(dst, src, size_t(n) * 4); }
inline void to_f32(const f16* src, float* dst, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_f16x8(src + i));
#endif
  for (; i < n; ++i) dst[i] = half_to_float(src[i]);
}
inline void to_f32(const bf16* src, float* dst, int64_t n) {
  int64_t i = 0;
#if defined(__AVX2__)
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_bf16x8(src + i));
#endif
  for (; i < n; ++i) dst[i] = value_at(src, i);
}
inline void from_f32(const float* src, float* dst, int64_t n) { std::memcpy(dst, src, size_t(n) * 4); }
inline void from_f32(const float* src, f16* dst, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
  for (; i < n; ++i) dst[i] = float_to_half(src[i]);
}
inline void from_f32(const float* src, bf16* dst, int64_t n) {
  int64_t i = 0;
#if defined(__AVX2__)
  // float_to_bf16's integer rounding eight lanes at a time: adding 0x7fff plus the lowest kept bit
  // carries into the top half exactly when the bits cut off are over half, or half with an odd
  // top half (ties to even). NaNs are kept quiet instead, as float_to_bf16 keeps them: rounding
  // could carry a NaN's payload into an infinity.
  const __m256i one = _mm256_set1_epi32(1), half = _mm256_set1_epi32(0x7fff), quiet = _mm256_set1_epi32(0x40);
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(src + i);
    const __m256i bits = _mm256_castps_si256(x);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), one);
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(half, odd)), 16);
    const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(bits, 16), quiet);
    const __m256i top = _mm256_blendv_epi8(rounded, nan, _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
    // Lanes hold values below 2^16, so packing with unsigned saturation keeps them; the packed
    // halves of the two 128-bit lanes are then brought together.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(top, top), 0xD8);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_castsi256_si128(packed));
  }
#endif
  for (; i < n; ++i) dst[i] = bf16(float_to_bf16(src[i]));
}

// Calls f(T()) with T the element type of float dtype dt: float, f16 or bf16.
template <class F>
decltype(auto) with_element(DType dt, F&& f) {
  switch (dt) {
    case DType::F16: return f(f16());
    case DType::BF16: return f(bf16());
    default: return f(float());
  }
}
// to_f32 and from_f32 for a row of float dtype dt.
inline void to_f32(const void* src, DType dt, float* dst, int64_t n) {
  with_element(dt, [&](auto e) { to_f32(static_cast<const decltype(e)*>(src), dst, n); });
}
inline void from_f32(const float* src, void* dst, DType dt, int64_t n) {
  with_element(dt, [&](auto e) { from_f32(src, static_cast<decltype(e)*>(dst), n); });
}

}  // namespace strata::cpu
