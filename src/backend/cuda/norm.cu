// LayerNorm and RMSNorm: one block per row, statistics in fp32 via block reductions. Each
// thread rereads its own elements for the output, so out may alias x.
#include "cuda_common.h"
#include "device_utils.cuh"
#include "kernels.h"

namespace strata::cuda {

namespace {

__global__ void layer_norm_kernel(const __half* x, const __half* __restrict__ w,
                                  const __half* __restrict__ b, float eps, int64_t h, __half* out) {
  const int64_t row = blockIdx.x;
  const __half* xr = x + row * h;
  __half* outr = out + row * h;
  // Two passes (mean, then squared deviations) avoid the cancellation of E[x^2] - E[x]^2.
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) s += __half2float(xr[i]);
  const float mean = block_sum(s) / float(h);
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

__global__ void rms_norm_kernel(const __half* x, const __half* __restrict__ w, float eps, int64_t h,
                                __half* out) {
  const int64_t row = blockIdx.x;
  const __half* xr = x + row * h;
  __half* outr = out + row * h;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
    const float v = __half2float(xr[i]);
    ss += v * v;
  }
  const float inv_rms = 1.0f / sqrtf(block_sum(ss) / float(h) + eps);
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x)
    outr[i] = __float2half_rn(__half2float(xr[i]) * inv_rms * __half2float(w[i]));
}

}  // namespace

// x and out are not __restrict__ in the kernels: they may alias.
void launch_layer_norm(const __half* x, const __half* w, const __half* b, float eps, int64_t rows, int64_t h,
                       __half* out, cudaStream_t stream) {
  if (rows == 0 || h == 0) return;
  layer_norm_kernel<<<dim3(unsigned(rows)), row_block_threads(h), 0, stream>>>(x, w, b, eps, h, out);
  STRATA_CUDA_CHECK_LAUNCH("layer_norm_kernel", stream);
}

void launch_rms_norm(const __half* x, const __half* w, float eps, int64_t rows, int64_t h, __half* out,
                     cudaStream_t stream) {
  if (rows == 0 || h == 0) return;
  rms_norm_kernel<<<dim3(unsigned(rows)), row_block_threads(h), 0, stream>>>(x, w, eps, h, out);
  STRATA_CUDA_CHECK_LAUNCH("rms_norm_kernel", stream);
}

}  // namespace strata::cuda
