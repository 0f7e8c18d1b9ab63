// fp16 for the emulated build: GCC's _Float16, converted with round-to-nearest-even as the
// device's __float2half_rn.
#pragma once
#include "emulation.h"

struct __half {
  _Float16 v;
};
struct __half2 {
  __half x, y;
};
inline float __half2float(__half h) { return float(h.v); }
inline __half __float2half_rn(float f) { return __half{_Float16(f)}; }
inline __half __float2half(float f) { return __float2half_rn(f); }
inline float2 __half22float2(__half2 h) { return {float(h.x.v), float(h.y.v)}; }
inline __half2 __floats2half2_rn(float a, float b) { return {__float2half_rn(a), __float2half_rn(b)}; }
