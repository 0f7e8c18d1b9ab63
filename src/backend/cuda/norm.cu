// LayerNorm and RMSNorm: one block per row, statistics in fp32 via block reductions. Each
// thread rereads its own elements for the output, so out may alias x. The same kernels add a
// residual first where given one (add_norm): each thread rounds x + delta to fp16, as add_kernel
// does, stores it back to x and takes its statistics from the stored values, so the result is
// add then norm's, bit for bit, in one launch.
#include "cuda_common.h"
#include "device_utils.cuh"
#include "kernels.h"

namespace strata::cuda {

namespace {

// Adds delta's row to x's in place (when delta is given) and returns this thread's sum of f over
// the row's stored values.
template <class F>
__device__ float load_row(__half* xr, const __half* dr, int64_t h, F f) {
  float acc = 0.0f;
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
    if (dr != nullptr) xr[i] = __float2half_rn(__half2float(xr[i]) + __half2float(dr[i]));
    acc += f(__half2float(xr[i]));
  }
  return acc;
}

__global__ void layer_norm_kernel(__half* x, const __half* delta, const __half* __restrict__ w,
                                  const __half* __restrict__ b, float eps, int64_t h, __half* out) {
  const int64_t row = blockIdx.x;
  __half* xr = x + row * h;
  __half* outr = out + row * h;
  // Two passes (mean, then squared deviations) avoid the cancellation of E[x^2] - E[x]^2.
  const float mean = block_sum(load_row(xr, delta ? delta + row * h : nullptr, h, [](float v) { return v; })) / float(h);
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
    const float d = __half2float(xr[i]) - mean;
    ss += d * d;
  }
  const float inv_std = 1.0f / sqrtf(block_sum(ss) / float(h) + eps);
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
    float y = (__half2float(xr[i]) - mean) * inv_std * __half2float(w[i]);
    if (b != nullptr) y += __half2float(b[i]);
    outr[i] = __float2half_rn(y);
  }
}

__global__ void rms_norm_kernel(__half* x, const __half* delta, const __half* __restrict__ w, float eps, int64_t h,
                                __half* out) {
  const int64_t row = blockIdx.x;
  __half* xr = x + row * h;
  __half* outr = out + row * h;
  const float ss = load_row(xr, delta ? delta + row * h : nullptr, h, [](float v) { return v * v; });
  const float inv_rms = 1.0f / sqrtf(block_sum(ss) / float(h) + eps);
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x)
    outr[i] = __float2half_rn(__half2float(xr[i]) * inv_rms * __half2float(w[i]));
}

}  // namespace

// x and out are not __restrict__ in the kernels: they may alias (out and delta too). Without a
// delta the kernels never write x, so a const x is safe to pass as non-const.
void launch_layer_norm(const __half* x, const __half* w, const __half* b, float eps, int64_t rows, int64_t h,
                       __half* out, cudaStream_t stream) {
  launch_add_layer_norm(const_cast<__half*>(x), nullptr, w, b, eps, rows, h, out, stream);
}

void launch_rms_norm(const __half* x, const __half* w, float eps, int64_t rows, int64_t h, __half* out,
                     cudaStream_t stream) {
  launch_add_rms_norm(const_cast<__half*>(x), nullptr, w, eps, rows, h, out, stream);
}

void launch_add_layer_norm(__half* x, const __half* delta, const __half* w, const __half* b, float eps, int64_t rows,
                           int64_t h, __half* out, cudaStream_t stream) {
  if (rows == 0 || h == 0) return;
  layer_norm_kernel<<<dim3(unsigned(rows)), row_block_threads(h), 0, stream>>>(x, delta, w, b, eps, h, out);
  STRATA_CUDA_CHECK_LAUNCH("layer_norm_kernel", stream);
}

void launch_add_rms_norm(__half* x, const __half* delta, const __half* w, float eps, int64_t rows, int64_t h,
                         __half* out, cudaStream_t stream) {
  if (rows == 0 || h == 0) return;
  rms_norm_kernel<<<dim3(unsigned(rows)), row_block_threads(h), 0, stream>>>(x, delta, w, eps, h, out);
  STRATA_CUDA_CHECK_LAUNCH("rms_norm_kernel", stream);
}

}  // namespace strata::cuda
