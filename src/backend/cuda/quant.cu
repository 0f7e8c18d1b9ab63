// Group-wise quantization (include/strata/quant/quant.h): quantize_rows and kv_store into
// quantized caches run one warp per group (warp_quantize_group, bit-identical to the host
// reference); dequantize_rows runs one thread per 32-bit code word (8 or 4 elements, always in
// one group) with vector stores where the output allows.
#include <algorithm>
#include <cstdint>

#include "cuda_common.h"
#include "kernels.h"
#include "quant_common.cuh"

namespace strata::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kDequantThreads = 256;
constexpr int64_t kMaxBlocks = 65535;

// Warp w of the grid takes groups w, w + warps, ...; the group index is uniform across the warp,
// so the shuffles inside warp_quantize_group stay converged.
template <class T>
__global__ void quantize_kernel(const QuantParams p, const T* __restrict__ x, uint8_t* __restrict__ q) {
  const QuantRowLayout& l = p.row;
  const int64_t total = p.rows * l.groups;
  for (int64_t g = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5); g < total;
       g += int64_t(gridDim.x) * kWarpsPerBlock) {
    const int64_t r = g / l.groups;
    const T* xr = x + r * l.n;
    warp_quantize_group(l, int(g % l.groups), [xr](int i) { return to_float(xr[i]); }, q + r * l.row_bytes);
  }
}

// Rows are [k rows..., v rows...], each tokens * kv_heads rows of head_dim; a token whose slot or
// position is out of range writes nothing (callers validate them on the host).
template <class T>
__global__ void quant_kv_store_kernel(const QuantKvStoreParams<T> p) {
  const QuantRowLayout& l = p.row;
  const int64_t rows = p.tokens * p.kv_heads, total = 2 * rows * l.groups;
  for (int64_t g = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5); g < total;
       g += int64_t(gridDim.x) * kWarpsPerBlock) {
    const bool is_v = g >= rows * l.groups;
    const int64_t rg = is_v ? g - rows * l.groups : g;
    const int64_t r = rg / l.groups;  // token * kv_heads + head
    const int64_t t = r / p.kv_heads;
    const int slot = p.slots[t], pos = p.positions[t];
    if (slot < 0 || slot >= p.slot_count || pos < 0 || pos >= p.capacity) continue;  // uniform over the warp
    const T* src = (is_v ? p.v : p.k) + r * l.n;
    const int64_t cache_row = (int64_t(slot) * p.capacity + pos) * p.kv_heads + r % p.kv_heads;
    uint8_t* dst = (is_v ? p.cache_v : p.cache_k) + cache_row * l.row_bytes;
    warp_quantize_group(l, int(rg % l.groups), [src](int i) { return to_float(src[i]); }, dst);
  }
}

// Stores kN consecutive values: one or two 16-byte (or one 8-byte) stores when all kN are in the
// row and the address is aligned for them, else element by element.
template <int kN, class T>
__device__ __forceinline__ void store_values(T* out, const float (&v)[kN], int count) {
  alignas(16) T t[kN];
#pragma unroll
  for (int k = 0; k < kN; ++k) t[k] = from_float<T>(v[k]);
  constexpr int kBytes = kN * int(sizeof(T));
  const uintptr_t addr = reinterpret_cast<uintptr_t>(out);
  if (count == kN && kBytes >= 16 && addr % 16 == 0) {
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i) reinterpret_cast<uint4*>(out)[i] = reinterpret_cast<const uint4*>(t)[i];
  } else if (count == kN && kBytes == 8 && addr % 8 == 0) {
    *reinterpret_cast<uint2*>(out) = *reinterpret_cast<const uint2*>(t);
  } else {
    for (int k = 0; k < count; ++k) out[k] = t[k];
  }
}

// Thread i takes code word i % words of row i / words: elements [u * kPer, u * kPer + kPer),
// all in group u * kPer / group (groups are multiples of 32 elements).
template <int kBits, class T>
__global__ void dequantize_kernel(const QuantParams p, const uint8_t* __restrict__ q, T* __restrict__ out) {
  constexpr int kPer = 32 / kBits;
  const QuantRowLayout& l = p.row;
  const int64_t words = l.code_bytes / 4, total = p.rows * words;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / words;
    const int first = int(i % words) * kPer;
    if (first >= l.n) continue;  // a padding word
    const uint8_t* row = q + r * l.row_bytes;
    const uint32_t word = reinterpret_cast<const uint32_t*>(row)[first / kPer];
    const float2 sm = group_params(row, l, first / l.group);
    float v[kPer];
#pragma unroll
    for (int k = 0; k < kPer; ++k) v[k] = dequant_ref(word_code<kBits>(word, k), sm.x, sm.y);
    store_values<kPer>(out + r * l.n + first, v, min(kPer, l.n - first));
  }
}

unsigned grid_for(int64_t work, int64_t per_block) {
  return unsigned(std::min(kMaxBlocks, (work + per_block - 1) / per_block));
}

template <class T>
void launch_dequantize_as(const QuantParams& p, const uint8_t* q, T* out, cudaStream_t stream) {
  const unsigned blocks = grid_for(p.rows * (p.row.code_bytes / 4), kDequantThreads);
  if (p.row.bits == 4) dequantize_kernel<4, T><<<blocks, kDequantThreads, 0, stream>>>(p, q, out);
  else dequantize_kernel<8, T><<<blocks, kDequantThreads, 0, stream>>>(p, q, out);
  STRATA_CUDA_CHECK_LAUNCH("dequantize_kernel", stream);
}

}  // namespace

template <class E>
void launch_quantize_rows(const QuantParams& p, const E* x, uint8_t* q, cudaStream_t stream) {
  const int64_t groups = p.rows * p.row.groups;
  if (groups == 0) return;
  quantize_kernel<<<grid_for(groups, kWarpsPerBlock), kWarpsPerBlock * 32, 0, stream>>>(p, x, q);
  STRATA_CUDA_CHECK_LAUNCH("quantize_kernel", stream);
}

template <class E>
void launch_dequantize_rows(const QuantParams& p, const uint8_t* q, E* out, cudaStream_t stream) {
  if (p.rows == 0 || p.row.n == 0) return;
  launch_dequantize_as(p, q, out, stream);
}

template <class T>
void launch_quant_kv_store(const QuantKvStoreParams<T>& p, cudaStream_t stream) {
  const int64_t groups = 2 * p.tokens * p.kv_heads * p.row.groups;
  if (groups == 0) return;
  quant_kv_store_kernel<<<grid_for(groups, kWarpsPerBlock), kWarpsPerBlock * 32, 0, stream>>>(p);
  STRATA_CUDA_CHECK_LAUNCH("quant_kv_store_kernel", stream);
}

#define STRATA_INSTANTIATE_ROWS(E)                                                              \
  template void launch_quantize_rows<E>(const QuantParams&, const E*, uint8_t*, cudaStream_t); \
  template void launch_dequantize_rows<E>(const QuantParams&, const uint8_t*, E*, cudaStream_t);
STRATA_FOR_EACH_ACT(STRATA_INSTANTIATE_ROWS)
STRATA_INSTANTIATE_ROWS(float)
#define STRATA_INSTANTIATE(T) template void launch_quant_kv_store<T>(const QuantKvStoreParams<T>&, cudaStream_t);
STRATA_FOR_EACH_ACT(STRATA_INSTANTIATE)

}  // namespace strata::cuda
