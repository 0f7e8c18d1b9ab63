// Host buffers of the kernels' element types for the emulated kernel tests, which run each case
// for both activation types (TEMPLATE_TEST_CASE over __half and bf16), and the bf16 tolerances.
#pragma once
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernel_test_support.h"
#include "kernels.h"
#include "strata/core/dtype.h"

namespace strata::test {

using strata::cuda::bf16;

// The DType of an element type: __half, bf16 or float.
template <class E>
inline constexpr DType dtype_of = std::is_same_v<E, __half> ? DType::F16
                                  : std::is_same_v<E, bf16> ? DType::BF16
                                                            : DType::F32;

// A tolerance of the fp16 tests for activations of type T. Each fp16 bound covers an error made
// of roundings to fp16 (inputs are exact in the type, the references take the same values in fp32
// or double; the kernels round their outputs, and some intermediates, to T), each at most
// u16 = 2^-11 relative, plus fp32 arithmetic (2^-24 an operation). The same kernels round at the
// same places to T, each rounding erring by at most u_T (bf16: 2^-8), so the bound with u_T in
// place of u16 is at most tol * u_T / u16 (x 8 for bf16; the fp32 terms, multiplied as well, only
// loosen it). fp16: tol itself.
template <class T>
double act_tol(double fp16_tol) {
  return fp16_tol * (unit_roundoff(dtype_of<T>) / unit_roundoff(DType::F16));
}

// n values uniform in [lo, hi), rounded to T.
template <class T>
std::vector<float> random_act(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  return random_floats(n, rng, lo, hi, dtype_of<T>);
}

// A copy of v in E (exact for values of E), the 0xFF poison (NaN in fp16, bf16 and fp32), and back.
template <class E>
std::vector<E> elements(const std::vector<float>& v) {
  std::vector<E> e(v.size());
  for (size_t i = 0; i < v.size(); ++i) e[i] = strata::cuda::from_float<E>(v[i]);
  return e;
}
template <class E>
std::vector<E> poisoned(size_t n) {
  std::vector<E> e(n);
  std::memset(static_cast<void*>(e.data()), 0xFF, n * sizeof(E));
  return e;
}
template <class E>
std::vector<float> floats(const E* p, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = strata::cuda::to_float(p[i]);
  return v;
}
template <class E>
std::vector<float> floats(const std::vector<E>& e) {
  return floats(e.data(), e.size());
}

}  // namespace strata::test
