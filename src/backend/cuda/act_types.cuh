// The activation element types every kernel is instantiated for, fp16 (`__half`) and bf16
// (`bf16`), and their conversions. Kernels load 16-bit elements, compute in fp32 and round once
// on store (round to nearest even in both types), so one template body serves both; bf16 trades
// fp16's 3 extra mantissa bits for fp32's exponent range, which is why bf16 checkpoints (Llama 3,
// Qwen 2.5, Mistral) run in it: their activations outgrow fp16's 65504.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace strata::cuda {

using bf16 = __nv_bfloat16;

__host__ __device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__host__ __device__ __forceinline__ float to_float(bf16 v) { return __bfloat162float(v); }
__host__ __device__ __forceinline__ float to_float(float v) { return v; }

template <class T>
__host__ __device__ __forceinline__ T from_float(float f);
template <>
__host__ __device__ __forceinline__ __half from_float<__half>(float f) { return __float2half_rn(f); }
template <>
__host__ __device__ __forceinline__ bf16 from_float<bf16>(float f) { return __float2bfloat16_rn(f); }
template <>
__host__ __device__ __forceinline__ float from_float<float>(float f) { return f; }  // fp32 outputs (quant.cu)

// Two adjacent elements, for 4-byte loads and stores.
template <class T>
struct PairOf;
template <>
struct PairOf<__half> {
  using type = __half2;
};
template <>
struct PairOf<bf16> {
  using type = __nv_bfloat162;
};
template <class T>
using Pair = typename PairOf<T>::type;

__device__ __forceinline__ float2 to_float2(__half2 v) { return __half22float2(v); }
__device__ __forceinline__ float2 to_float2(__nv_bfloat162 v) { return __bfloat1622float2(v); }

template <class T>
__device__ __forceinline__ Pair<T> pair_from_floats(float a, float b);
template <>
__device__ __forceinline__ __half2 pair_from_floats<__half>(float a, float b) { return __floats2half2_rn(a, b); }
template <>
__device__ __forceinline__ __nv_bfloat162 pair_from_floats<bf16>(float a, float b) {
  return __floats2bfloat162_rn(a, b);
}

}  // namespace strata::cuda

// Explicit instantiation of a launcher for both types: STRATA_FOR_EACH_ACT(MACRO) expands
// MACRO(__half) MACRO(strata::cuda::bf16).
#define STRATA_FOR_EACH_ACT(X) X(__half) X(::strata::cuda::bf16)
