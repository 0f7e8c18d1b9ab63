// Elementwise ops on fp16 tensors, computed in fp32: add, ReLU/GELU in place, SwiGLU, bias add.
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

__global__ void add_kernel(const __half* a, const __half* b, __half* out, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = __float2half_rn(__half2float(a[i]) + __half2float(b[i]));
}

__global__ void relu_kernel(__half* x, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = __float2half_rn(fmaxf(__half2float(x[i]), 0.0f));
}

// Exact GELU, as Hugging Face's ACT2FN["gelu"]: 0.5 x (1 + erf(x / sqrt(2))).
__global__ void gelu_kernel(__half* x, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = __half2float(x[i]);
    x[i] = __float2half_rn(0.5f * v * (1.0f + erff(v * 0.70710678118654752f)));
  }
}

// gate_up: [rows, 2f], gate's f columns then up's; out: [rows, f].
__global__ void swiglu_kernel(const __half* gate_up, __half* out, int64_t rows, int64_t f) {
  const int64_t n = rows * f;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / f, c = i - t * f;
    const __half* row = gate_up + t * 2 * f;
    const float g = __half2float(row[c]);
    const float silu = g / (1.0f + expf(-g));  // g -> -inf: g / inf = -0, no NaN
    out[i] = __float2half_rn(silu * __half2float(row[f + c]));
  }
}

__global__ void bias_add_kernel(__half* y, const __half* __restrict__ bias, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = __float2half_rn(__half2float(y[i]) + __half2float(bias[i % cols]));
}

}  // namespace

void launch_add(const __half* a, const __half* b, __half* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_kernel<<<elementwise_blocks(n), kThreads, 0, stream>>>(a, b, out, n);
  STRATA_CUDA_CHECK_LAUNCH("add_kernel", stream);
}

void launch_activation(ActKind act, __half* x, int64_t n, cudaStream_t stream) {
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

void launch_swiglu(const __half* gate_up, __half* out, int64_t rows, int64_t f, cudaStream_t stream) {
  if (rows == 0 || f == 0) return;
  swiglu_kernel<<<elementwise_blocks(rows * f), kThreads, 0, stream>>>(gate_up, out, rows, f);
  STRATA_CUDA_CHECK_LAUNCH("swiglu_kernel", stream);
}

void launch_bias_add(__half* y, const __half* bias, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  bias_add_kernel<<<elementwise_blocks(rows * cols), kThreads, 0, stream>>>(y, bias, rows, cols);
  STRATA_CUDA_CHECK_LAUNCH("bias_add_kernel", stream);
}

}  // namespace strata::cuda
