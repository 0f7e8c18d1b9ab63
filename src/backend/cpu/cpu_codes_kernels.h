// The factored dot and axpy of cpu_quant.h over a block of Q queries by R rows of packed codes
// (Q R <= kBlock), written once for any vector width. cpu_quant.cpp instantiates them with AVX2
// vectors, cpu_quant_avx512.cpp (which includes this header under its AVX-512 target) with
// AVX-512 ones. `Isa` provides the vector type V and:
//   zero(), set1(x), load(p), store(p, v), add(a, b), fma(a, b, c) = a b + c,
//   fold(v): v's lanes summed pairwise down to one __m256 (for reduce4),
//   step(i, end, n): how many elements the step at element i covers,
//   widen(codes, bits, i, width, n): those elements' codes as fp32 vectors, each with the code
//   position of its first lane (Isa::Widened: v[0 .. count), at[0 .. count)).
// Each (query, row) pair keeps one accumulator per vector of a step, summed in the same order
// whatever Q and R, so the blocks only change how often codes and queries are loaded; the axpy
// adds a block's rows in order, one FMA per element, so it gives the same bits on every Isa.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cpu_quant.h"
#include "cpu_simd.h"

// An anonymous namespace: each including file compiles its own copy for its own target, so no
// inline function here is shared (and perhaps compiled for AVX-512) between them.
namespace strata::cpu::codes {
namespace {

// Offsets of a row's groups' scales and minimums (cpu_quant.h's layout).
struct RowLayout {
  size_t groups, scales, mins;
  RowLayout(int bits, int group, int64_t n)
      : groups(size_t((n + group - 1) / group)), scales(row_code_bytes(bits, n)), mins(scales + 2 * groups) {}
};

template <class Isa, int Q, int R>
void dot(const float* q, const float* q_sums, const uint8_t* const* rows, int bits, int group, int64_t n, float* out,
         int64_t out_stride) {
  static_assert(Q * R <= kBlock);
  using V = typename Isa::V;
  const RowLayout layout(bits, group, n);
  V total[kBlock];
  for (V& t : total) t = Isa::zero();
  float min_part[Q * R] = {};
  for (int64_t g = 0, first = 0; first < n; ++g, first += group) {
    const int64_t end = std::min<int64_t>(n, first + group);
    V acc[2][Q * R];
    for (int p = 0; p < Q * R; ++p) acc[0][p] = acc[1][p] = Isa::zero();
    for (int64_t i = first, width; i < end; i += width) {
      width = Isa::step(i, end, n);
      for (int r = 0; r < R; ++r) {
        const typename Isa::Widened x = Isa::widen(rows[r], bits, i, width, n);
        for (int k = 0; k < Q; ++k)
          for (int v = 0; v < x.count; ++v)
            acc[v][k * R + r] = Isa::fma(x.v[v], Isa::load(q + k * n + x.at[v]), acc[v][k * R + r]);
      }
    }
    for (int r = 0; r < R; ++r) {
      const V scale = Isa::set1(half_at(rows[r] + layout.scales + 2 * g));
      const float min = half_at(rows[r] + layout.mins + 2 * g);
      for (int k = 0; k < Q; ++k) {
        const int p = k * R + r;
        total[p] = Isa::fma(scale, Isa::add(acc[0][p], acc[1][p]), total[p]);
        min_part[p] = std::fma(min, q_sums[size_t(k) * layout.groups + size_t(g)], min_part[p]);
      }
    }
  }
  alignas(16) float sums[4];
  _mm_store_ps(sums, reduce4(Isa::fold(total[0]), Isa::fold(total[1]), Isa::fold(total[2]), Isa::fold(total[3])));
  for (int k = 0; k < Q; ++k)
    for (int r = 0; r < R; ++r) out[k * out_stride + r] = sums[k * R + r] + min_part[k * R + r];
}

template <class Isa, int Q, int R>
void axpy(const float* w, int64_t w_stride, const uint8_t* const* rows, int bits, int group, int64_t n, float* y,
          float* min_sums) {
  static_assert(Q * R <= kBlock);
  using V = typename Isa::V;
  const RowLayout layout(bits, group, n);
  for (int64_t g = 0, first = 0; first < n; ++g, first += group) {
    const int64_t end = std::min<int64_t>(n, first + group);
    V ws[Q * R];
    for (int r = 0; r < R; ++r) {
      const float scale = half_at(rows[r] + layout.scales + 2 * g), min = half_at(rows[r] + layout.mins + 2 * g);
      for (int k = 0; k < Q; ++k) {
        ws[k * R + r] = Isa::set1(w[k * w_stride + r] * scale);
        float& sum = min_sums[size_t(k) * layout.groups + size_t(g)];
        sum = std::fma(w[k * w_stride + r], min, sum);
      }
    }
    for (int64_t i = first, width; i < end; i += width) {
      width = Isa::step(i, end, n);
      typename Isa::Widened x[R];
      for (int r = 0; r < R; ++r) x[r] = Isa::widen(rows[r], bits, i, width, n);
      for (int k = 0; k < Q; ++k)
        for (int v = 0; v < x[0].count; ++v) {
          float* yk = y + k * n + x[0].at[v];
          V acc = Isa::load(yk);
          for (int r = 0; r < R; ++r) acc = Isa::fma(ws[k * R + r], x[r].v[v], acc);  // rows in order
          Isa::store(yk, acc);
        }
    }
  }
}

// The two above for a block of `queries` x `count`, by shape.
template <class Isa>
void dot_block(const float* q, const float* q_sums, int queries, const uint8_t* const* rows, int count, int bits,
               int group, int64_t n, float* out, int64_t out_stride) {
  with_block(queries, count, [&]<int Q, int R>() { dot<Isa, Q, R>(q, q_sums, rows, bits, group, n, out, out_stride); });
}
template <class Isa>
void axpy_block(const float* w, int64_t w_stride, int queries, const uint8_t* const* rows, int count, int bits,
                int group, int64_t n, float* y, float* min_sums) {
  with_block(queries, count, [&]<int Q, int R>() { axpy<Isa, Q, R>(w, w_stride, rows, bits, group, n, y, min_sums); });
}

}  // namespace
}  // namespace strata::cpu::codes
