// Rotary position embedding (Hugging Face rotate_half convention), in place, or on the way out
// of the stacked q/k/v GEMM's rows (split_qkv_kernel). One block per token: the token's cos/sin
// table is computed once in shared memory in fp32 with accurate sincosf (the angle grows with the
// position, so fast intrinsics would lose precision).
#include "cuda_common.h"
#include "kernels.h"

namespace strata::cuda {

namespace {

constexpr int kThreads = 128;

// The token's cos (table[0, half)) and sin (table[half, 2 half)) of position x inv_freq, then a
// barrier: every thread reads the whole table after.
__device__ void fill_rope_table(float* table, int32_t position, const float* inv_freq, int half_d) {
  const float pos = float(position);
  for (int i = threadIdx.x; i < half_d; i += blockDim.x) {
    float s, c;
    sincosf(pos * inv_freq[i], &s, &c);
    table[i] = c;
    table[half_d + i] = s;
  }
  __syncthreads();
}

__global__ void rope_kernel(RopeParams p) {
  extern __shared__ float table[];  // cos in [0, half), sin in [half, 2 * half)
  const int half_d = p.head_dim / 2;
  const int64_t t = blockIdx.x;
  fill_rope_table(table, p.positions[t], p.inv_freq, half_d);
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

// One block per token: the token's cos/sin table as rope_kernel's, then q's and k's pairs
// rotated out of the stacked row, and v copied; k and v go to the token's cache rows instead where
// the caches are given (split_qkv_store).
__global__ void split_qkv_kernel(SplitQkvParams p) {
  extern __shared__ float table[];  // cos in [0, half), sin in [half, 2 * half); unused unrotated
  const int half_d = p.head_dim / 2;
  const int64_t t = blockIdx.x;
  const bool rotate = p.inv_freq != nullptr;
  if (rotate) fill_rope_table(table, p.positions[t], p.inv_freq, half_d);  // uniform over the block
  const int64_t qd = int64_t(p.heads) * p.head_dim, kvd = int64_t(p.kv_heads) * p.head_dim;
  const __half* src = p.qkv + t * (qd + 2 * kvd);
  __half* kt = p.k ? p.k + t * kvd : nullptr;
  __half* vt = p.v ? p.v + t * kvd : nullptr;
  if (p.cache_k != nullptr) {  // the cache store fused in: the token's row, or none (as kv_store)
    const int slot = p.slots[t], pos = p.positions[t];
    const bool inside = slot >= 0 && slot < p.slot_count && pos >= 0 && pos < p.capacity;
    const int64_t row = (int64_t(slot) * p.capacity + pos) * kvd;
    kt = inside ? p.cache_k + row : nullptr;
    vt = inside ? p.cache_v + row : nullptr;
  }
  __half* const dst[2] = {p.q + t * qd, kt};
  const int heads[2] = {p.heads, p.kv_heads};
  for (int part = 0; part < 2; ++part) {  // q, then k
    if (dst[part] == nullptr) continue;  // uniform over the block
    const __half* from = part == 0 ? src : src + qd;
    const int n = rotate ? heads[part] * half_d : heads[part] * p.head_dim;
    for (int k = threadIdx.x; k < n; k += blockDim.x) {
      if (!rotate) {
        dst[part][k] = from[k];
        continue;
      }
      const int head = k / half_d;
      const int i = k - head * half_d;
      const int64_t at = int64_t(head) * p.head_dim + i;
      const float x1 = __half2float(from[at]);
      const float x2 = __half2float(from[at + half_d]);
      const float c = table[i];
      const float s = table[half_d + i];
      dst[part][at] = __float2half_rn(x1 * c - x2 * s);
      dst[part][at + half_d] = __float2half_rn(x2 * c + x1 * s);
    }
  }
  if (vt == nullptr) return;
  for (int64_t k = threadIdx.x; k < kvd; k += blockDim.x) vt[k] = src[qd + kvd + k];
}

}  // namespace

void launch_split_qkv(const SplitQkvParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  const size_t smem = p.inv_freq ? size_t(p.head_dim / 2) * 2 * sizeof(float) : 0;
  split_qkv_kernel<<<dim3(unsigned(p.tokens)), kThreads, smem, stream>>>(p);
  STRATA_CUDA_CHECK_LAUNCH("split_qkv_kernel", stream);
}

void launch_rope(const RopeParams& p, cudaStream_t stream) {
  if (p.tokens == 0 || p.heads == 0 || p.head_dim < 2) return;
  const size_t smem = size_t(p.head_dim / 2) * 2 * sizeof(float);
  rope_kernel<<<dim3(unsigned(p.tokens)), kThreads, smem, stream>>>(p);
  STRATA_CUDA_CHECK_LAUNCH("rope_kernel", stream);
}

}  // namespace strata::cuda
