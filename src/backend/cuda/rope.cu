// Rotary position embedding (Hugging Face rotate_half convention), in place, or on the way out
// of the stacked q/k/v GEMM's rows (split_qkv_kernel). One block per token: the token's cos/sin
// table is computed once in shared memory in fp32 with accurate sincosf (the angle grows with the
// position, so fast intrinsics would lose precision).
#include "cuda_common.h"
#include "kernels.h"
#include "quant_common.cuh"

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

// A token's `heads` heads of head_dim from `from` to `to`, each pair rotated by the token's table
// (rotate_half) or copied as they are; the block's threads share the pairs. `to` may be `from`.
template <class T>
__device__ void rotate_heads(const T* from, T* to, int heads, int head_dim, const float* table, bool rotate) {
  const int half_d = head_dim / 2;
  const int n = rotate ? heads * half_d : heads * head_dim;
  for (int k = threadIdx.x; k < n; k += blockDim.x) {
    if (!rotate) {
      to[k] = from[k];
      continue;
    }
    const int head = k / half_d;
    const int i = k - head * half_d;
    const int64_t at = int64_t(head) * head_dim + i;
    const float x1 = to_float(from[at]);
    const float x2 = to_float(from[at + half_d]);
    const float c = table[i];
    const float s = table[half_d + i];
    to[at] = from_float<T>(x1 * c - x2 * s);
    to[at + half_d] = from_float<T>(x2 * c + x1 * s);
  }
}

template <class T>
__global__ void rope_kernel(RopeParams<T> p) {
  extern __shared__ float table[];  // cos in [0, half), sin in [half, 2 * half)
  const int64_t t = blockIdx.x;
  fill_rope_table(table, p.positions[t], p.inv_freq, p.head_dim / 2);
  T* xt = p.x + t * p.token_stride;
  rotate_heads(xt, xt, p.heads, p.head_dim, table, true);  // in place: each pair read, then written, by one thread
}

// One block per token: the token's cos/sin table as rope_kernel's, then q's and k's pairs
// rotated out of the stacked row, and v copied; k and v go to the token's cache rows instead where
// the caches are given (split_qkv_store).
template <class T>
__global__ void split_qkv_kernel(SplitQkvParams<T> p) {
  extern __shared__ float table[];  // cos in [0, half), sin in [half, 2 * half); unused unrotated
  const int half_d = p.head_dim / 2;
  const int64_t t = blockIdx.x;
  const bool rotate = p.inv_freq != nullptr;
  if (rotate) fill_rope_table(table, p.positions[t], p.inv_freq, half_d);  // uniform over the block
  const int64_t qd = int64_t(p.heads) * p.head_dim, kvd = int64_t(p.kv_heads) * p.head_dim;
  const T* src = p.qkv + t * (qd + 2 * kvd);
  T* kt = p.k ? p.k + t * kvd : nullptr;
  T* vt = p.v ? p.v + t * kvd : nullptr;
  if (p.cache_k != nullptr) {  // the cache store fused in: the token's row, or none (as kv_store)
    const int slot = p.slots[t], pos = p.positions[t];
    const bool inside = slot >= 0 && slot < p.slot_count && pos >= 0 && pos < p.capacity;
    const int64_t row = (int64_t(slot) * p.capacity + pos) * kvd;
    kt = inside ? p.cache_k + row : nullptr;
    vt = inside ? p.cache_v + row : nullptr;
  }
  rotate_heads(src, p.q + t * qd, p.heads, p.head_dim, table, rotate);
  if (kt != nullptr) rotate_heads(src + qd, kt, p.kv_heads, p.head_dim, table, rotate);  // uniform over the block
  if (vt == nullptr) return;
  for (int64_t k = threadIdx.x; k < kvd; k += blockDim.x) vt[k] = src[qd + kvd + k];
}

// split_qkv_store into quantized caches, one block per token: q as split_qkv_kernel writes it; k
// rotated into shared memory, rounded to T (the value kv_store would read back); then each warp
// quantizes groups of the token's k and v rows into its cache rows with warp_quantize_group, as
// quant_kv_store_kernel does, so the codes are the unfused path's bit for bit.
template <class T>
__global__ void split_qkv_quant_kernel(SplitQkvParams<T> p) {
  extern __shared__ float shared[];  // the cos/sin table where rotating, then k's row
  const int half_d = p.head_dim / 2;
  const int64_t t = blockIdx.x;
  const bool rotate = p.inv_freq != nullptr;
  float* table = shared;
  T* k_row = reinterpret_cast<T*>(shared + (rotate ? p.head_dim : 0));
  if (rotate) fill_rope_table(table, p.positions[t], p.inv_freq, half_d);  // uniform over the block
  const int64_t qd = int64_t(p.heads) * p.head_dim, kvd = int64_t(p.kv_heads) * p.head_dim;
  const T* src = p.qkv + t * (qd + 2 * kvd);
  rotate_heads(src, p.q + t * qd, p.heads, p.head_dim, table, rotate);
  rotate_heads(src + qd, k_row, p.kv_heads, p.head_dim, table, rotate);
  __syncthreads();
  const int slot = p.slots[t], pos = p.positions[t];
  if (slot < 0 || slot >= p.slot_count || pos < 0 || pos >= p.capacity) return;  // as kv_store: no write
  const QuantRowLayout& l = p.quant_row;
  const int64_t k_groups = int64_t(p.kv_heads) * l.groups;
  const T* v_row = src + qd + kvd;
  for (int64_t g = threadIdx.x >> 5; g < 2 * k_groups; g += blockDim.x >> 5) {  // uniform over each warp
    const bool is_v = g >= k_groups;
    const int64_t rg = is_v ? g - k_groups : g;
    const int64_t head = rg / l.groups;
    const int64_t cache_row = (int64_t(slot) * p.capacity + pos) * p.kv_heads + head;
    uint8_t* out = (is_v ? p.quant_cache_v : p.quant_cache_k) + cache_row * l.row_bytes;
    const T* row = (is_v ? v_row : k_row) + head * l.n;
    warp_quantize_group(l, int(rg % l.groups), [row](int i) { return to_float(row[i]); }, out);
  }
}

}  // namespace

template <class T>
void launch_split_qkv(const SplitQkvParams<T>& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  const size_t table = p.inv_freq ? size_t(p.head_dim / 2) * 2 * sizeof(float) : 0;
  if (p.quant_cache_k != nullptr) {
    const size_t smem = table + size_t(p.kv_heads) * size_t(p.head_dim) * sizeof(T);
    split_qkv_quant_kernel<<<dim3(unsigned(p.tokens)), kThreads, smem, stream>>>(p);
    STRATA_CUDA_CHECK_LAUNCH("split_qkv_quant_kernel", stream);
    return;
  }
  split_qkv_kernel<<<dim3(unsigned(p.tokens)), kThreads, table, stream>>>(p);
  STRATA_CUDA_CHECK_LAUNCH("split_qkv_kernel", stream);
}

template <class T>
void launch_rope(const RopeParams<T>& p, cudaStream_t stream) {
  if (p.tokens == 0 || p.heads == 0 || p.head_dim < 2) return;
  const size_t smem = size_t(p.head_dim / 2) * 2 * sizeof(float);
  rope_kernel<<<dim3(unsigned(p.tokens)), kThreads, smem, stream>>>(p);
  STRATA_CUDA_CHECK_LAUNCH("rope_kernel", stream);
}

#define STRATA_INSTANTIATE(T)                                                    \
  template void launch_split_qkv<T>(const SplitQkvParams<T>&, cudaStream_t);    \
  template void launch_rope<T>(const RopeParams<T>&, cudaStream_t);
STRATA_FOR_EACH_ACT(STRATA_INSTANTIATE)

}  // namespace strata::cuda
