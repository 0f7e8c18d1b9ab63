// cpu_codes_kernels.h's dot and axpy on AVX-512: 16 lanes, and a block of 32 4-bit codes (16 bytes)
// widened by one zero-extension into its even and odd halves, which code order puts side by side.
// Compiled under `#pragma GCC target` rather than -mavx512f, so that only the code after the pragma
// (the kernels, their template instances and this file's own helpers, all internal to it) may use
// AVX-512; inline functions of the headers included before it stay AVX2 code, whichever copy the
// linker keeps. Called only where the CPU has AVX-512 (codes_isa(), cpu_quant.cpp).
#include "cpu_quant.h"

#if defined(STRATA_CPU_AVX512)
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cpu_simd.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl")

#include "cpu_codes_kernels.h"

namespace strata::cpu {
namespace {

// A step covers 32 elements (16 bytes of 4-bit codes, 32 of 8-bit), as two vectors of 16 lanes at
// code positions i and i + 16, or a row's last 16 (n % 32 == 16) as one.
struct Avx512 {
  using V = __m512;
  struct Widened {
    V v[2];
    int64_t at[2];
    int count;
  };
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static __m256 fold(V v) { return _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)); }
  static int64_t step(int64_t i, int64_t end, int64_t) { return i + 32 <= end ? 32 : 16; }
  static Widened widen(const uint8_t* codes, int bits, int64_t i, int64_t width, int64_t) {
    const __m512i nibble = _mm512_set1_epi32(0xf);
    auto sixteen_bytes = [](const uint8_t* p) {
      return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    };
    if (bits == 8) {
      const V a = _mm512_cvtepi32_ps(sixteen_bytes(codes + i));
      if (width == 16) return {{a, a}, {i, i}, 1};
      return {{a, _mm512_cvtepi32_ps(sixteen_bytes(codes + i + 16))}, {i, i + 16}, 2};
    }
    if (width == 32) {  // byte k holds elements 2k (low nibble) and 2k + 1 (high nibble)
      const __m512i b = sixteen_bytes(codes + i / 2);
      return {{_mm512_cvtepi32_ps(_mm512_and_si512(b, nibble)), _mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4))},
              {i, i + 16},
              2};
    }
    // 8 bytes: the even elements' nibbles into lanes 0..7, the odd ones' into 8..15.
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i / 2)));
    const V both = _mm512_cvtepi32_ps(
        _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(b), _mm256_srli_epi32(b, 4), 1), nibble));
    return {{both, both}, {i, i}, 1};
  }
};

}  // namespace

void dot_packed_codes_avx512(const float* q_coded, const float* q_sums, int queries, const uint8_t* const* rows,
                             int count, int bits, int group, int64_t n, float* out, int64_t out_stride) {
  codes::dot_block<Avx512>(q_coded, q_sums, queries, rows, count, bits, group, n, out, out_stride);
}

void axpy_packed_codes_avx512(const float* w, int64_t w_stride, int queries, const uint8_t* const* rows, int count,
                              int bits, int group, int64_t n, float* y_coded, float* min_sums) {
  codes::axpy_block<Avx512>(w, w_stride, queries, rows, count, bits, group, n, y_coded, min_sums);
}

}  // namespace strata::cpu

#pragma GCC pop_options
#endif
