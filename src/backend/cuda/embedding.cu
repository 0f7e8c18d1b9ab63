// Row gathers: token embedding lookup (optionally accumulating, for learned positions),
// gather_rows (picking the last token of each sequence before the LM head; a mixture of experts'
// rows for each expert) and combine_rows (a token's expert outputs, weighted). One block per row.
#include <cmath>

#include "cuda_common.h"
#include "device_utils.cuh"
#include "kernels.h"

namespace strata::cuda {

namespace {

template <class T>
__global__ void gather_rows_kernel(const T* __restrict__ src, int64_t src_rows, const int32_t* __restrict__ idx,
                                   int64_t width, bool accumulate, T* __restrict__ out) {
  const int64_t i = blockIdx.x;
  const int64_t r = idx[i];
  T* dst = out + i * width;
  if (r < 0 || r >= src_rows) {  // callers validate on the host; never read outside the table
    for (int64_t j = threadIdx.x; j < width; j += blockDim.x) dst[j] = from_float<T>(NAN);
    return;
  }
  const T* row = src + r * width;
  if (accumulate) {
    for (int64_t j = threadIdx.x; j < width; j += blockDim.x)
      dst[j] = from_float<T>(to_float(dst[j]) + to_float(row[j]));
  } else {
    for (int64_t j = threadIdx.x; j < width; j += blockDim.x) dst[j] = row[j];
  }
}

template <class T>
__global__ void combine_rows_kernel(const T* __restrict__ src, int64_t src_rows, const int32_t* __restrict__ rows,
                                    const float* __restrict__ weights, int64_t k, int64_t width,
                                    T* __restrict__ out) {
  const int64_t t = blockIdx.x;
  T* dst = out + t * width;
  for (int64_t j = 0; j < k; ++j) {
    const int64_t r = rows[t * k + j];
    if (r < 0 || r >= src_rows) {
      for (int64_t i = threadIdx.x; i < width; i += blockDim.x) dst[i] = from_float<T>(NAN);
      return;
    }
  }
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < k; ++j) acc += weights[t * k + j] * to_float(src[int64_t(rows[t * k + j]) * width + i]);
    dst[i] = from_float<T>(acc);
  }
}

}  // namespace

template <class T>
void launch_combine_rows(const T* src, int64_t src_rows, const int32_t* rows, const float* weights,
                         int64_t tokens, int64_t k, int64_t h, T* out, cudaStream_t stream) {
  if (tokens == 0 || h == 0) return;
  combine_rows_kernel<<<dim3(unsigned(tokens)), row_block_threads(h), 0, stream>>>(src, src_rows, rows, weights, k, h, out);
  STRATA_CUDA_CHECK_LAUNCH("combine_rows_kernel", stream);
}

template <class T>
void launch_gather_rows(const T* src, int64_t src_rows, const int32_t* idx, int64_t n, int64_t width,
                        bool accumulate, T* out, cudaStream_t stream) {
  if (n == 0 || width == 0) return;
  gather_rows_kernel<<<dim3(unsigned(n)), row_block_threads(width), 0, stream>>>(src, src_rows, idx, width,
                                                                                  accumulate, out);
  STRATA_CUDA_CHECK_LAUNCH("gather_rows_kernel", stream);
}

#define STRATA_INSTANTIATE(T)                                                                                   \
  template void launch_combine_rows<T>(const T*, int64_t, const int32_t*, const float*, int64_t, int64_t, int64_t, \
                                       T*, cudaStream_t);                                                       \
  template void launch_gather_rows<T>(const T*, int64_t, const int32_t*, int64_t, int64_t, bool, T*, cudaStream_t);
STRATA_FOR_EACH_ACT(STRATA_INSTANTIATE)

}  // namespace strata::cuda
