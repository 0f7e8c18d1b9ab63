// LayerNorm and RMSNorm: one block per row, statistics in fp32 via block reductions. Each
// thread rereads its own elements for the output, so out may alias x. The same kernels add a
// residual first where given one (add_norm): each thread rounds x + delta to T, as add_kernel
// does, stores it back to x and takes its statistics from the stored values, so the result is
// add then norm's, bit for bit, in one launch.
#include "cuda_common.h"
#include "device_utils.cuh"
#include "kernels.h"

namespace strata::cuda {

namespace {

// Adds delta's row to x's in place (when delta is given) and returns this thread's sum of f over
// the row's stored values.
template <class T, class F>
__device__ float load_row(T* xr, const T* dr, int64_t h, F f) {
  float acc = 0.0f;
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
    if (dr != nullptr) xr[i] = from_float<T>(to_float(xr[i]) + to_float(dr[i]));
    acc += f(to_float(xr[i]));
  }
  return acc;
}

template <class T>
__global__ void layer_norm_kernel(T* x, const T* delta, const T* __restrict__ w,
                                  const T* __restrict__ b, float eps, int64_t h, T* out) {
  const int64_t row = blockIdx.x;
  T* xr = x + row * h;
  T* outr = out + row * h;
  // Two passes (mean, then squared deviations) avoid the cancellation of E[x^2] - E[x]^2.
  const float mean = block_sum(load_row(xr, delta ? delta + row * h : nullptr, h, [](float v) { return v; })) / float(h);
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
    const float d = to_float(xr[i]) - mean;
    ss += d * d;
  }
  const float inv_std = 1.0f / sqrtf(block_sum(ss) / float(h) + eps);
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
    float y = (to_float(xr[i]) - mean) * inv_std * to_float(w[i]);
    if (b != nullptr) y += to_float(b[i]);
    outr[i] = from_float<T>(y);
  }
}

template <class T>
__global__ void rms_norm_kernel(T* x, const T* delta, const T* __restrict__ w, float eps, float w_offset, int64_t h,
                                T* out) {
  const int64_t row = blockIdx.x;
  T* xr = x + row * h;
  T* outr = out + row * h;
  const float ss = load_row(xr, delta ? delta + row * h : nullptr, h, [](float v) { return v * v; });
  const float inv_rms = 1.0f / sqrtf(block_sum(ss) / float(h) + eps);
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x)
    outr[i] = from_float<T>(to_float(xr[i]) * inv_rms * (w_offset + to_float(w[i])));
}

}  // namespace

// x and out are not __restrict__ in the kernels: they may alias (out and delta too). Without a
// delta the kernels never write x, so a const x is safe to pass as non-const.
template <class T>
void launch_layer_norm(const T* x, const T* w, const T* b, float eps, int64_t rows, int64_t h,
                       T* out, cudaStream_t stream) {
  launch_add_layer_norm<T>(const_cast<T*>(x), nullptr, w, b, eps, rows, h, out, stream);
}

template <class T>
void launch_rms_norm(const T* x, const T* w, float eps, int64_t rows, int64_t h, T* out,
                     cudaStream_t stream, float w_offset) {
  launch_add_rms_norm<T>(const_cast<T*>(x), nullptr, w, eps, rows, h, out, stream, w_offset);
}

template <class T>
void launch_add_layer_norm(T* x, const T* delta, const T* w, const T* b, float eps, int64_t rows,
                           int64_t h, T* out, cudaStream_t stream) {
  if (rows == 0 || h == 0) return;
  layer_norm_kernel<<<dim3(unsigned(rows)), row_block_threads(h), 0, stream>>>(x, delta, w, b, eps, h, out);
  STRATA_CUDA_CHECK_LAUNCH("layer_norm_kernel", stream);
}

template <class T>
void launch_add_rms_norm(T* x, const T* delta, const T* w, float eps, int64_t rows, int64_t h,
                         T* out, cudaStream_t stream, float w_offset) {
  if (rows == 0 || h == 0) return;
  rms_norm_kernel<<<dim3(unsigned(rows)), row_block_threads(h), 0, stream>>>(x, delta, w, eps, w_offset, h, out);
  STRATA_CUDA_CHECK_LAUNCH("rms_norm_kernel", stream);
}

#define STRATA_INSTANTIATE(T)                                                                                    \
  template void launch_layer_norm<T>(const T*, const T*, const T*, float, int64_t, int64_t, T*, cudaStream_t);   \
  template void launch_rms_norm<T>(const T*, const T*, float, int64_t, int64_t, T*, cudaStream_t, float);        \
  template void launch_add_layer_norm<T>(T*, const T*, const T*, const T*, float, int64_t, int64_t, T*,          \
                                         cudaStream_t);                                                         \
  template void launch_add_rms_norm<T>(T*, const T*, const T*, float, int64_t, int64_t, T*, cudaStream_t, float);
STRATA_FOR_EACH_ACT(STRATA_INSTANTIATE)

}  // namespace strata::cuda
