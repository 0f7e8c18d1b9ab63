// wmma for the emulated build (emulation.h). Each lane holds 8 elements of a 16x16 fragment at
// positions given by a fixed scrambled permutation per fragment kind: the real layout is
// unspecified, so code that assumes one fails here. Loads and stores check the API's 32-byte
// pointer alignment and 16-byte leading dimension; mma_sync gathers the operands from the
// warp's lanes between barriers and sums in fp32.
#pragma once
#include <array>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <type_traits>

#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "emulation.h"

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use>
const std::array<int, 256>& element_positions() {  // lane * 8 + i -> row * 16 + column
  static const std::array<int, 256> positions = [] {
    std::array<int, 256> a;
    for (int i = 0; i < 256; ++i) a[size_t(i)] = i;
    std::mt19937 rng(std::is_same_v<Use, matrix_a> ? 11u : std::is_same_v<Use, matrix_b> ? 12u : 13u);
    std::shuffle(a.begin(), a.end(), rng);
    return a;
  }();
  return positions;
}

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulation has the 16x16x16 shape only");
  enum { num_elements = 8, num_storage_elements = 8 };
  T x[8];
  static int position(int lane, int i) { return element_positions<Use>()[size_t(lane * 8 + i)]; }
};

inline void check_operand(const void* ptr, unsigned ldm, unsigned element_bytes) {
  if (reinterpret_cast<uintptr_t>(ptr) % 32 != 0 || ldm * element_bytes % 16 != 0) {
    std::fprintf(stderr, "wmma: pointer %p or leading dimension %u breaks the API's alignment rules\n", ptr, ldm);
    std::abort();
  }
}

inline float element_value(__half h) { return __half2float(h); }
inline float element_value(__nv_bfloat16 h) { return __bfloat162float(h); }

// fp16 or bf16 operands (bf16: sm_80 and newer on a device).
template <class Use, class Layout, class T>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* ptr, unsigned ldm) {
  check_operand(ptr, ldm, 2);
  for (int i = 0; i < 8; ++i) {
    const int at = f.position(emu::lane(), i), r = at / 16, c = at % 16;
    f.x[i] = std::is_same_v<Layout, row_major> ? ptr[r * ldm + c] : ptr[c * ldm + r];
  }
}

using Accumulator = fragment<accumulator, 16, 16, 16, float>;

inline void load_matrix_sync(Accumulator& f, const float* ptr, unsigned ldm, layout_t layout) {
  check_operand(ptr, ldm, 4);
  for (int i = 0; i < 8; ++i) {
    const int at = f.position(emu::lane(), i), r = at / 16, c = at % 16;
    f.x[i] = layout == mem_row_major ? ptr[r * ldm + c] : ptr[c * ldm + r];
  }
}

inline void store_matrix_sync(float* ptr, const Accumulator& f, unsigned ldm, layout_t layout) {
  check_operand(ptr, ldm, 4);
  for (int i = 0; i < 8; ++i) {
    const int at = f.position(emu::lane(), i), r = at / 16, c = at % 16;
    (layout == mem_row_major ? ptr[r * ldm + c] : ptr[c * ldm + r]) = f.x[i];
  }
}

inline void fill_fragment(Accumulator& f, float v) {
  for (float& e : f.x) e = v;
}

template <class LayoutA, class LayoutB, class T>
void mma_sync(Accumulator& d, const fragment<matrix_a, 16, 16, 16, T, LayoutA>& a,
              const fragment<matrix_b, 16, 16, 16, T, LayoutB>& b, const Accumulator& c) {
  emu::Warp& w = emu::warp();
  const int lane = emu::lane();
  for (int i = 0; i < 8; ++i) {
    w.a[a.position(lane, i)] = element_value(a.x[i]);
    w.b[b.position(lane, i)] = element_value(b.x[i]);
    w.c[c.position(lane, i)] = c.x[i];
  }
  w.bar.arrive_and_wait();
  float sums[8];
  for (int i = 0; i < 8; ++i) {
    const int at = d.position(lane, i), r = at / 16, col = at % 16;
    float s = w.c[at];
    for (int k = 0; k < 16; ++k) s += w.a[r * 16 + k] * w.b[k * 16 + col];
    sums[i] = s;
  }
  w.bar.arrive_and_wait();  // every lane has read the operands before the next MMA writes them
  for (int i = 0; i < 8; ++i) d.x[i] = sums[i];
}

}  // namespace nvcuda::wmma
