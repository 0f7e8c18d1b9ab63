// Rotary position embedding in place (Hugging Face rotate_half convention). One block per
// token: the token's cos/sin table is computed once in shared memory in fp32 with accurate
// sincosf (the angle grows with the position, so fast intrinsics would lose precision).
#include "cuda_common.h"
#include "kernels.h"

namespace strata::cuda {

namespace {

constexpr int kThreads = 128;

__global__ void rope_kernel(RopeParams p) {
  extern __shared__ float table[];  // cos in [0, half), sin in [half, 2 * half)
  const int half_d = p.head_dim / 2;
  const int64_t t = blockIdx.x;
  const float pos = float(p.positions[t]);
  for (int i = threadIdx.x; i < half_d; i += blockDim.x) {
    float s, c;
    sincosf(pos * p.inv_freq[i], &s, &c);
    table[i] = c;
    table[half_d + i] = s;
  }
  __syncthreads();
  __half* xt = p.x + t * p.token_stride;
  const int pairs = p.heads * half_d;
  for (int k = threadIdx.x; k < pairs; k += blockDim.x) {
    const int head = k / half_d;
    const int i = k - head * half_d;
    __half* xh = xt + int64_t(head) * p.head_dim;
    const float x1 = __half2float(xh[i]);
    const float x2 = __half2float(xh[i + half_d]);
    const float c = table[i];
    const float s = table[half_d + i];
    xh[i] = __float2half_rn(x1 * c - x2 * s);
    xh[i + half_d] = __float2half_rn(x2 * c + x1 * s);
  }
}

}  // namespace

void launch_rope(const RopeParams& p, cudaStream_t stream) {
  if (p.tokens == 0 || p.heads == 0 || p.head_dim < 2) return;
  const size_t smem = size_t(p.head_dim / 2) * 2 * sizeof(float);
  rope_kernel<<<dim3(unsigned(p.tokens)), kThreads, smem, stream>>>(p);
  STRATA_CUDA_CHECK_LAUNCH("rope_kernel", stream);
}

}  // namespace strata::cuda
