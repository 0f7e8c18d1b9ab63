// Elementwise ops on fp16 or bf16 tensors, computed in fp32: add, ReLU/GELU in place, SwiGLU, bias add.
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

// gate_up: [rows, 2f], gate's f columns then up's; out: [rows, f].
template <class T>
__global__ void swiglu_kernel(const T* gate_up, T* out, int64_t rows, int64_t f) {
  const int64_t n = rows * f;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / f, c = i - t * f;
    const T* row = gate_up + t * 2 * f;
    const float g = to_float(row[c]);
    const float silu = g / (1.0f + expf(-g));  // g -> -inf: g / inf = -0, no NaN
    out[i] = from_float<T>(silu * to_float(row[f + c]));
  }
}

template <class T>
__global__ void bias_add_kernel(T* y, const T* __restrict__ bias, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = from_float<T>(to_float(y[i]) + to_float(bias[i % cols]));
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
  swiglu_kernel<<<elementwise_blocks(rows * f), kThreads, 0, stream>>>(gate_up, out, rows, f);
  STRATA_CUDA_CHECK_LAUNCH("swiglu_kernel", stream);
}

template <class T>
void launch_bias_add(T* y, const T* bias, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  bias_add_kernel<<<elementwise_blocks(rows * cols), kThreads, 0, stream>>>(y, bias, rows, cols);
  STRATA_CUDA_CHECK_LAUNCH("bias_add_kernel", stream);
}

#define STRATA_INSTANTIATE(T)                                                             \
  template void launch_add<T>(const T*, const T*, T*, int64_t, cudaStream_t);             \
  template void launch_activation<T>(ActKind, T*, int64_t, cudaStream_t);                 \
  template void launch_swiglu<T>(const T*, T*, int64_t, int64_t, cudaStream_t);           \
  template void launch_bias_add<T>(T*, const T*, int64_t, int64_t, cudaStream_t);
STRATA_FOR_EACH_ACT(STRATA_INSTANTIATE)

}  // namespace strata::cuda
