#include "cpu_quant.h"

#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cpu_codes_kernels.h"
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

// Where element i of a row of n sits in code order (cpu_quant.h): 4-bit blocks of 32 (the row's
// last 16 a block of their own when n % 32 == 16) hold the even elements first, then the odd.
int64_t code_position(int bits, int64_t i, int64_t n) {
  if (bits == 8) return i;
  const int64_t block = i - i % 32, size = block + 32 <= n ? 32 : 16, r = i - block;
  return block + (r % 2 == 0 ? r / 2 : size / 2 + r / 2);
}

#if defined(__AVX2__) && defined(__FMA__)
// cpu_codes_kernels.h's vectors on AVX2: a step of 16 elements (8 bytes of 4-bit codes, 16 of
// 8-bit) widened into two vectors of 8 lanes.
struct Avx2 {
  using V = __m256;
  struct Widened {
    V v[2];
    int64_t at[2];
    int count = 2;
  };
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static __m256 fold(V v) { return v; }
  static int64_t step(int64_t, int64_t, int64_t) { return 16; }
  static Widened widen(const uint8_t* codes, int bits, int64_t i, int64_t, int64_t n) {
    if (bits == 8) {
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i));
      return {{_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(b, 8)))},
              {i, i + 8}};
    }
    // Byte k holds elements 2k (low nibble) and 2k + 1 (high nibble): the 8 bytes' even elements
    // are code positions block + 8 half .. of their block of 32, the odd ones 16 later (a row's
    // last 16 elements, a block of their own: i .. and i + 8 ..).
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i / 2)));
    const int64_t block = i - i % 32, half = (i - block) / 16;
    const bool own_block = block + 32 > n;
    return {{_mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(0xf))), _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4))},
            {own_block ? i : block + 8 * half, own_block ? i + 8 : block + 16 + 8 * half}};
  }
};
#else
// Without AVX2: each row widened into c s (code order) and its groups' minimums, then plain sums.
void widen_scaled_codes(const uint8_t* row, int bits, int group, int64_t n, float* scaled, float* mins) {
  const int64_t groups = (n + group - 1) / group;
  const uint8_t* params = row + row_code_bytes(bits, n);
  for (int64_t g = 0, first = 0; g < groups; ++g, first += group) {
    const float scale = half_at(params + 2 * g);
    mins[g] = half_at(params + 2 * (groups + g));
    for (int64_t i = first; i < std::min<int64_t>(n, first + group); ++i)
      scaled[code_position(bits, i, n)] = float(code_at(row, bits, i)) * scale;
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

bool cpu_runs_avx512() {
#if defined(STRATA_CPU_AVX512)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}
// The ISA in use: the fastest available, unless STRATA_CPU_ISA names one. Read inside the kernels
// (on a pool's thread), so a bad value warns once and falls back instead of throwing.
std::atomic<CodesIsa>& isa_in_use() {
  static std::atomic<CodesIsa> isa = [] {
    const CodesIsa best = cpu_runs_avx512() ? CodesIsa::Avx512 : CodesIsa::Avx2;
    const char* env = std::getenv("STRATA_CPU_ISA");
    const std::string name = env ? env : "";
    if (name.empty()) return best;
    if (name == "avx2") return CodesIsa::Avx2;
    if (name == "avx512" && best == CodesIsa::Avx512) return best;
    std::fprintf(stderr, "strata: STRATA_CPU_ISA=%s %s; CPU attention over codes runs on %s\n", name.c_str(),
                 name == "avx512" ? "but this build or CPU has no AVX-512 kernels" : "is not avx2 or avx512",
                 codes_isa_name(best).c_str());
    return best;
  }();
  return isa;
}

void check_block(int queries, int count) {
  STRATA_CHECK(queries >= 1 && count >= 1 && queries * count <= kBlock,
               "packed codes: " << queries << " queries x " << count << " rows in one block");
}

}  // namespace

bool codes_row_ok(int group, int64_t n) { return group > 0 && group % 32 == 0 && n > 0 && n % 16 == 0; }

void to_code_order(int bits, const float* x, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[code_position(bits, i, n)] = x[i];
}
void from_code_order(int bits, const float* x, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[code_position(bits, i, n)];
}

CodesIsa codes_isa() { return isa_in_use().load(std::memory_order_relaxed); }
bool codes_isa_available(CodesIsa isa) { return isa == CodesIsa::Avx2 || cpu_runs_avx512(); }
void set_codes_isa(CodesIsa isa) {
  STRATA_CHECK(codes_isa_available(isa), "no " << codes_isa_name(isa) << " kernels in this build or on this CPU");
  isa_in_use().store(isa);
}
std::string codes_isa_name(CodesIsa isa) { return isa == CodesIsa::Avx512 ? "avx512" : "avx2"; }

void dot_packed_codes(const float* q_coded, const float* q_sums, int queries, const uint8_t* const* rows, int count,
                      int bits, int group, int64_t n, float* out, int64_t out_stride) {
  check_block(queries, count);
#if defined(STRATA_CPU_AVX512)
  if (codes_isa() == CodesIsa::Avx512)
    return dot_packed_codes_avx512(q_coded, q_sums, queries, rows, count, bits, group, n, out, out_stride);
#endif
#if defined(__AVX2__) && defined(__FMA__)
  codes::dot_block<Avx2>(q_coded, q_sums, queries, rows, count, bits, group, n, out, out_stride);
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
#if defined(STRATA_CPU_AVX512)
  if (codes_isa() == CodesIsa::Avx512)
    return axpy_packed_codes_avx512(w, w_stride, queries, rows, count, bits, group, n, y_coded, min_sums);
#endif
#if defined(__AVX2__) && defined(__FMA__)
  codes::axpy_block<Avx2>(w, w_stride, queries, rows, count, bits, group, n, y_coded, min_sums);
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
  const uint8_t* scales = row + row_code_bytes(bits, n);
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
