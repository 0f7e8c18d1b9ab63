// Elementwise ops on fp16 or bf16 tensors, computed in fp32: add, ReLU/GELU in place, SwiGLU and
// GeGLU, bias add, scale and soft cap (those two also over fp32 logits).
// Grid-stride loops; outputs may alias inputs because each element is read and written by the
// same thread (SwiGLU's output excepted: it reads two elements of another shape).
#include <algorithm>

#include "cuda_common.h"
#include "kernels.h"

namespace strata::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1 << 16;  // enough to fill any GPU; the loops stride beyond it

unsigned elementwise_blocks(int64_t n) { return unsigned(std::min(ceil_div(n, kThreads), kMaxBlocks)); }

template <class T>
__global__ void add_kernel(const T* a, const T* b, T* out, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_float<T>(to_float(a[i]) + to_float(b[i]));
}

template <class T>
__global__ void relu_kernel(T* x, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = from_float<T>(fmaxf(to_float(x[i]), 0.0f));
}

template <class T>
// Exact GELU
__global__ void gelu_kernel(T* x, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = to_float(x[i]);
    x[i] = from_float<T>(0.5f * v * (1.0f + erff(v * 0.70710678118654752f)));
  }
}

// PyTorch's gelu(approximate="tanh").
__device__ __forceinline__ float gelu_tanh(float x) {
  return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

enum class GateKind { Silu, Gelu, Clamped };

// gate_up: [rows, 2f], gate's f columns then up's; out: [rows, f]. SwiGLU, GeGLU, or GPT-OSS's
// clamped SwiGLU: (clamp(up, -limit, limit) + 1) * g sigmoid(alpha g), g = min(gate, limit).
template <GateKind kKind, class T>
__global__ void gated_kernel(const T* gate_up, T* out, int64_t rows, int64_t f, float limit, float alpha) {
  const int64_t n = rows * f;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / f, c = i - t * f;
    const T* row = gate_up + t * 2 * f;
    const float g = to_float(row[c]), u = to_float(row[f + c]);
    // silu: g -> -inf gives g / inf = -0, no NaN
    if constexpr (kKind == GateKind::Gelu) {
      out[i] = from_float<T>(gelu_tanh(g) * u);
    } else if constexpr (kKind == GateKind::Silu) {
      out[i] = from_float<T>(g / (1.0f + expf(-g)) * u);
    } else {
      const float gc = fminf(g, limit);
      out[i] = from_float<T>((fminf(fmaxf(u, -limit), limit) + 1.0f) * (gc / (1.0f + expf(-alpha * gc))));
    }
  }
}

template <class T>
__global__ void scale_kernel(T* x, float s, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = from_float<T>(to_float(x[i]) * s);
}

template <class T>
__global__ void soft_cap_kernel(T* x, float cap, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = from_float<T>(cap * tanhf(to_float(x[i]) / cap));
}

template <class Y, class B>
__global__ void bias_add_kernel(Y* y, const B* __restrict__ bias, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = from_float<Y>(to_float(y[i]) + to_float(bias[i % cols]));
}

}  // namespace

template <class T>
void launch_add(const T* a, const T* b, T* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_kernel<<<elementwise_blocks(n), kThreads, 0, stream>>>(a, b, out, n);
  STRATA_CUDA_CHECK_LAUNCH("add_kernel", stream);
}

template <class T>
void launch_activation(ActKind act, T* x, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  switch (act) {
    case ActKind::ReLU:
      relu_kernel<<<elementwise_blocks(n), kThreads, 0, stream>>>(x, n);
      STRATA_CUDA_CHECK_LAUNCH("relu_kernel", stream);
      break;
    case ActKind::GELU:
      gelu_kernel<<<elementwise_blocks(n), kThreads, 0, stream>>>(x, n);
      STRATA_CUDA_CHECK_LAUNCH("gelu_kernel", stream);
      break;
  }
}

template <class T>
void launch_swiglu(const T* gate_up, T* out, int64_t rows, int64_t f, cudaStream_t stream) {
  if (rows == 0 || f == 0) return;
  gated_kernel<GateKind::Silu><<<elementwise_blocks(rows * f), kThreads, 0, stream>>>(gate_up, out, rows, f, 0, 0);
  STRATA_CUDA_CHECK_LAUNCH("gated_kernel<silu>", stream);
}

template <class T>
void launch_geglu(const T* gate_up, T* out, int64_t rows, int64_t f, cudaStream_t stream) {
  if (rows == 0 || f == 0) return;
  gated_kernel<GateKind::Gelu><<<elementwise_blocks(rows * f), kThreads, 0, stream>>>(gate_up, out, rows, f, 0, 0);
  STRATA_CUDA_CHECK_LAUNCH("gated_kernel<gelu_tanh>", stream);
}

template <class T>
void launch_clamped_swiglu(const T* gate_up, T* out, int64_t rows, int64_t f, float limit, float alpha,
                           cudaStream_t stream) {
  if (rows == 0 || f == 0) return;
  const unsigned blocks = elementwise_blocks(rows * f);
  gated_kernel<GateKind::Clamped><<<blocks, kThreads, 0, stream>>>(gate_up, out, rows, f, limit, alpha);
  STRATA_CUDA_CHECK_LAUNCH("gated_kernel<clamped>", stream);
}

template <class T>
void launch_scale(T* x, float s, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  scale_kernel<<<elementwise_blocks(n), kThreads, 0, stream>>>(x, s, n);
  STRATA_CUDA_CHECK_LAUNCH("scale_kernel", stream);
}

template <class T>
void launch_soft_cap(T* x, float cap, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  soft_cap_kernel<<<elementwise_blocks(n), kThreads, 0, stream>>>(x, cap, n);
  STRATA_CUDA_CHECK_LAUNCH("soft_cap_kernel", stream);
}

template <class Y, class B>
void launch_bias_add(Y* y, const B* bias, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  bias_add_kernel<<<elementwise_blocks(rows * cols), kThreads, 0, stream>>>(y, bias, rows, cols);
  STRATA_CUDA_CHECK_LAUNCH("bias_add_kernel", stream);
}

#define STRATA_INSTANTIATE(T)                                                             \
  template void launch_add<T>(const T*, const T*, T*, int64_t, cudaStream_t);             \
  template void launch_activation<T>(ActKind, T*, int64_t, cudaStream_t);                 \
  template void launch_swiglu<T>(const T*, T*, int64_t, int64_t, cudaStream_t);           \
  template void launch_geglu<T>(const T*, T*, int64_t, int64_t, cudaStream_t);            \
  template void launch_clamped_swiglu<T>(const T*, T*, int64_t, int64_t, float, float, cudaStream_t); \
  template void launch_bias_add<T, T>(T*, const T*, int64_t, int64_t, cudaStream_t);      \
  template void launch_bias_add<float, T>(float*, const T*, int64_t, int64_t, cudaStream_t);
STRATA_FOR_EACH_ACT(STRATA_INSTANTIATE)
#undef STRATA_INSTANTIATE
#define STRATA_INSTANTIATE(T)                                                             \
  template void launch_scale<T>(T*, float, int64_t, cudaStream_t);                        \
  template void launch_soft_cap<T>(T*, float, int64_t, cudaStream_t);
STRATA_FOR_EACH_ACT(STRATA_INSTANTIATE)
STRATA_INSTANTIATE(float)

}  // namespace strata::cuda
