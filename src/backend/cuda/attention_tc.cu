// Causal attention for prefill on tensor cores: a block per (tile of kQueryTile query tokens,
// query head), with the same semantics as attention_kernel in attention.cu.
//
// The per-token kernel reads a token's whole prefix for every token: a prefill of T tokens reads
// K and V T^2/2 times over, on CUDA cores. Here one block's 64 queries share every key and value
// row it loads, and QK^T and PV run as 16x16x16 MMAs (wmma) in the activation type, fp32 sums:
//   - the queries sit in shared memory; four warps own 16 query rows each;
//   - keys and values stream through shared memory in tiles of kKeyTile;
//   - per tile: S = Q K^T (fp32) -> shared memory; an online softmax per row (two lanes per row,
//     which hold its running max and denominator) turns S into weights P, stored in the
//     activation type (the MMA takes both operands in one type);
//     the output O, kept in accumulator fragments, is rescaled by exp(m_old - m_new) per row and
//     O += P V;
//   - the rows of a fragment are not specified by the wmma API, so each thread learns the row of
//     each of its accumulator elements once, by loading a matrix whose every element is its row
//     index (all fragments of one type share one layout).
// A tile may hold up to kMaxTileRuns runs of one slot (packed sequences meet inside a tile);
// each run is one pass over that slot's keys, and the rows of other runs are masked out of it.
// Tiles the rule in attention_tiles.cuh declines (decode steps) are left to the per-token kernel.
// Caches hold the activation type (DenseCache) or group-wise quantized rows (QuantCache: rows
// dequantized by the reference formula while loading, then rounded to the activation type for the
// MMAs). bf16 MMAs need sm_80: compiled for older cards the bf16 kernels trap, and the backend
// never runs bf16 there.
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "attention_tiles.cuh"
#include "cuda_common.h"
#include "device_utils.cuh"
#include "kernels.h"
#include "quant_common.cuh"

namespace strata::cuda {

namespace {

namespace wmma = nvcuda::wmma;

constexpr int kRowsPerWarp = 16;  // the MMA's M
constexpr int kTcWarps = kQueryTile / kRowsPerWarp;
constexpr int kTcThreads = kTcWarps * 32;
constexpr int kKeyTile = 32;  // keys per step: a row's two lanes take 16 each in the softmax
constexpr int kKeySplits = kKeyTile / 16;

template <class T>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
template <class T>
using FragKeys = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;  // K^T
template <class T>
using FragValues = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
using FragAcc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
constexpr int kAccElems = FragAcc::num_elements;

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
template <class T>
constexpr bool kHasTensorCores = !std::is_same_v<T, bf16>;
#else
template <class T>
constexpr bool kHasTensorCores = true;
#endif

// dst[r, 0:d) = src[r * stride, +d) for r < rows, zeros for rows <= r < max_rows; dst dense
// ([max_rows, d]). kVec16: src, stride and d allow 16-byte loads (d % 8 == 0).
template <bool kVec16, class T>
__device__ void load_rows(T* dst, const T* src, int64_t stride, int rows, int max_rows, int d) {
  if constexpr (kVec16) {
    const int per_row = d / 8;
    for (int e = threadIdx.x; e < max_rows * per_row; e += blockDim.x) {
      const int r = e / per_row, c = e % per_row;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r < rows) v = *reinterpret_cast<const uint4*>(src + r * stride + c * 8);
      *reinterpret_cast<uint4*>(dst + r * d + c * 8) = v;
    }
  } else {
    for (int e = threadIdx.x; e < max_rows * d; e += blockDim.x) {
      const int r = e / d, c = e % d;
      dst[e] = r < rows ? src[r * stride + c] : from_float<T>(0.0f);
    }
  }
}

// Where the key and value rows come from: load_keys fills k_s and v_s ([kKeyTile, d], dense)
// with rows [k0, k0 + n) of (slot, kv_head), zeros past n.
template <bool kVec16, class T>  // 16-byte loads (q and the caches allow them)
struct DenseCache {
  using Elem = T;
  using Params = AttentionParams<T>;
  static constexpr bool kVecQ = kVec16;
  __device__ static int head_dim(const Params& p) { return p.head_dim; }
  __device__ static int64_t q_stride(const Params& p) { return p.q_token_stride; }
  __device__ static void load_keys(const Params& p, int slot, int kv_head, int k0, int n, T* k_s, T* v_s) {
    const int64_t at = int64_t(slot) * p.kv_slot_stride + int64_t(kv_head) * p.head_dim + int64_t(k0) * p.kv_pos_stride;
    load_rows<kVec16>(k_s, p.cache_k + at, p.kv_pos_stride, n, kKeyTile, p.head_dim);
    load_rows<kVec16>(v_s, p.cache_v + at, p.kv_pos_stride, n, kKeyTile, p.head_dim);
  }
};

// The elements of code word u of a quantized row as T, dequantized by the reference formula.
template <int kBits, class T>
__device__ __forceinline__ void dequantize_word(const uint8_t* row, const QuantRowLayout& l, int u, T* dst) {
  constexpr int kPer = 32 / kBits;
  const uint32_t word = reinterpret_cast<const uint32_t*>(row)[u];
  const float2 sm = group_params(row, l, u * kPer / l.group);
#pragma unroll
  for (int k = 0; k < kPer; ++k) dst[k] = from_float<T>(dequant_ref(word_code<kBits>(word, k), sm.x, sm.y));
}

template <int kBits, class T>
struct QuantCache {
  using Elem = T;
  using Params = QuantAttentionParams<T>;
  static constexpr bool kVecQ = false;  // q is read once per block
  __device__ static int head_dim(const Params& p) { return p.row.n; }
  __device__ static int64_t q_stride(const Params& p) { return int64_t(p.heads) * p.row.n; }
  // A thread per code word; rows of a multiple of 16 elements end on a whole word.
  __device__ static void load_keys(const Params& p, int slot, int kv_head, int k0, int n, T* k_s, T* v_s) {
    constexpr int kPer = 32 / kBits;
    const QuantRowLayout& l = p.row;
    const int words = l.n / kPer;
    const int64_t pos_stride = int64_t(p.kv_heads) * l.row_bytes;
    const int64_t at = ((int64_t(slot) * p.capacity + k0) * p.kv_heads + kv_head) * l.row_bytes;
    for (int e = threadIdx.x; e < kKeyTile * words; e += blockDim.x) {
      const int r = e / words, u = e % words;
      T* k_dst = k_s + r * l.n + u * kPer;
      T* v_dst = v_s + r * l.n + u * kPer;
      if (r < n) {
        dequantize_word<kBits>(p.cache_k + at + r * pos_stride, l, u, k_dst);
        dequantize_word<kBits>(p.cache_v + at + r * pos_stride, l, u, v_dst);
      } else {
#pragma unroll
        for (int k = 0; k < kPer; ++k) k_dst[k] = v_dst[k] = from_float<T>(0.0f);
      }
    }
  }
};

// kChunks: head dims up to kChunks * 16 (the output's accumulator fragments per warp).
template <int kChunks, class Cache>
__device__ void attention_tc_body(const typename Cache::Params& p) {
  using T = typename Cache::Elem;
  constexpr int kMaxD = kChunks * 16;
  __shared__ __align__(32) T q_s[kQueryTile * kMaxD];
  __shared__ __align__(32) T k_s[kKeyTile * kMaxD];
  __shared__ __align__(32) T v_s[kKeyTile * kMaxD];
  __shared__ __align__(32) float s_s[kQueryTile * kKeyTile];  // scores; at the end, output staging
  __shared__ __align__(32) T p_s[kQueryTile * kKeyTile];
  __shared__ __align__(32) float row_ids_s[16 * 16];
  __shared__ float alpha_s[kQueryTile];  // this tile's rescale factor per row, then 1 / denominator
  __shared__ int32_t slot_s[kQueryTile];
  __shared__ int32_t pos_s[kQueryTile];

  // A tile's heads are adjacent blocks, so query heads that share a kv head load its rows through L2.
  const int64_t tile = blockIdx.y;
  if (!load_query_tile(p, tile, slot_s, pos_s)) return;  // uniform over the block

  const int head = blockIdx.x;
  const int d = Cache::head_dim(p);  // a multiple of 16, <= kMaxD
  const int chunks = d / 16;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int row0 = warp * kRowsPerWarp;  // this warp's query rows [row0, row0 + 16)
  const int64_t t0 = tile * kQueryTile;
  const int n_tokens = int(p.tokens - t0 < kQueryTile ? p.tokens - t0 : kQueryTile);
  const int kv_head = head / (p.heads / p.kv_heads);

  const int64_t q_stride = Cache::q_stride(p);
  load_rows<Cache::kVecQ>(q_s, p.q + t0 * q_stride + int64_t(head) * d, q_stride, n_tokens, kQueryTile, d);
  for (int e = threadIdx.x; e < 16 * 16; e += kTcThreads) row_ids_s[e] = float(e / 16);
  __syncthreads();

  FragAcc row_of;  // row_of.x[i]: the row in [0, 16) of element i of every FragAcc
  wmma::load_matrix_sync(row_of, row_ids_s, 16, wmma::mem_row_major);
  int elem_row[kAccElems];
#pragma unroll
  for (int i = 0; i < kAccElems; ++i) elem_row[i] = row0 + int(row_of.x[i]);

  FragAcc o[kChunks];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) wmma::fill_fragment(o[c], 0.0f);
  float m_run = -INFINITY;  // lanes 2r and 2r + 1: running max and denominator of row row0 + r
  float l_run = 0.0f;

  for (int rb = 0; rb < n_tokens;) {
    // The run [rb, re): consecutive tokens of one slot; its keys are [first key of its lowest
    // position, max position].
    const int slot = slot_s[rb];
    int re = rb + 1;
    int max_pos = pos_s[rb], min_pos = pos_s[rb];
    while (re < n_tokens && slot_s[re] == slot) {
      max_pos = max(max_pos, pos_s[re]);
      min_pos = min(min_pos, pos_s[re++]);
    }
    const bool warp_in_run = row0 < re && row0 + kRowsPerWarp > rb;
    const int n_keys = max_pos + 1;

    for (int k0 = first_key(min_pos, p.window); k0 < n_keys; k0 += kKeyTile) {
      const int n = min(kKeyTile, n_keys - k0);
      __syncthreads();  // every warp is done with the previous tile's k_s and v_s
      Cache::load_keys(p, slot, kv_head, k0, n, k_s, v_s);
      __syncthreads();
      if (!warp_in_run) continue;  // warp-uniform; the next tile's barriers are still met

      // 1. S = Q K^T for this warp's 16 rows and the tile's keys.
      FragAcc s[kKeySplits];
#pragma unroll
      for (int j = 0; j < kKeySplits; ++j) wmma::fill_fragment(s[j], 0.0f);
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        if (c >= chunks) continue;
        FragA<T> qa;
        wmma::load_matrix_sync(qa, q_s + row0 * d + c * 16, d);
#pragma unroll
        for (int j = 0; j < kKeySplits; ++j) {
          FragKeys<T> kb;
          wmma::load_matrix_sync(kb, k_s + j * 16 * d + c * 16, d);
          wmma::mma_sync(s[j], qa, kb, s[j]);
        }
      }
      float* s_w = s_s + row0 * kKeyTile;
#pragma unroll
      for (int j = 0; j < kKeySplits; ++j) wmma::store_matrix_sync(s_w + j * 16, s[j], kKeyTile, wmma::mem_row_major);
      __syncwarp();

      // 2. Online softmax. Lanes 2r and 2r + 1 share row r, 16 keys each, so a row's max and sum
      //    take one shuffle each; each lane visits its keys starting at column r, so at every
      //    step the 32 lanes read 32 different banks of s_s.
      {
        const int r = lane >> 1;
        const int first_col = (lane & 1) * 16;
        const int row = row0 + r;
        const bool in_run = row >= rb && row < re;  // else another run's token, or past the step
        const int row_pos = pos_s[row];
        const int row_first = first_key(row_pos, p.window);
        float score[16];
        float tile_max = -INFINITY;
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          const int col = first_col + ((i + r) & 15);
          const bool live = in_run && col < n && k0 + col <= row_pos && k0 + col >= row_first;
          score[i] = live ? cap_score(s_w[r * kKeyTile + col] * p.scale, p.softcap) : -INFINITY;
          tile_max = fmaxf(tile_max, score[i]);
        }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, 1));
        // -inf while a sliding window has shown the row no key yet (the run's lower positions
        // start the keys earlier); the row then keeps its empty sums.
        const float m_new = fmaxf(m_run, tile_max);
        T* p_row = p_s + row * kKeyTile;
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          const float e = score[i] == -INFINITY ? 0.0f : expf(score[i] - m_new);
          sum += e;
          p_row[first_col + ((i + r) & 15)] = from_float<T>(e);
        }
        sum += __shfl_xor_sync(kFullMask, sum, 1);
        float alpha = 1.0f;  // rows outside the run, or shown no key yet, keep their output as it is
        if (in_run && m_new != -INFINITY) {
          alpha = expf(m_run - m_new);  // 0 on the row's first tile (m_run = -inf)
          l_run = l_run * alpha + sum;
          m_run = m_new;
        }
        if (first_col == 0) alpha_s[row] = alpha;
      }
      __syncwarp();

      // 3. O = O * alpha (per row) + P V.
      float alpha[kAccElems];
#pragma unroll
      for (int i = 0; i < kAccElems; ++i) alpha[i] = alpha_s[elem_row[i]];
      FragA<T> pa[kKeySplits];
#pragma unroll
      for (int j = 0; j < kKeySplits; ++j) wmma::load_matrix_sync(pa[j], p_s + row0 * kKeyTile + j * 16, kKeyTile);
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        if (c >= chunks) continue;
#pragma unroll
        for (int i = 0; i < kAccElems; ++i) o[c].x[i] *= alpha[i];
#pragma unroll
        for (int j = 0; j < kKeySplits; ++j) {
          FragValues<T> vb;
          wmma::load_matrix_sync(vb, v_s + j * 16 * d + c * 16, d);
          wmma::mma_sync(o[c], pa[j], vb, o[c]);
        }
      }
      __syncwarp();  // p_s and alpha_s rows are rewritten by the next tile
    }
    rb = re;
  }

  // Divide by the denominators and write T, staging 16 x 16 blocks in this warp's rows of s_s.
  if ((lane & 1) == 0) alpha_s[row0 + (lane >> 1)] = l_run > 0.0f ? softmax_normalizer(m_run, l_run, p.sinks, head) : 0.0f;
  __syncwarp();
  float inv_l[kAccElems];
#pragma unroll
  for (int i = 0; i < kAccElems; ++i) inv_l[i] = alpha_s[elem_row[i]];
  float* stage = s_s + row0 * kKeyTile;
  T* out = p.out + t0 * q_stride + int64_t(head) * d;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    if (c >= chunks) continue;
#pragma unroll
    for (int i = 0; i < kAccElems; ++i) o[c].x[i] *= inv_l[i];
    wmma::store_matrix_sync(stage, o[c], 16, wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 16 * 16; e += 32) {
      const int row = row0 + e / 16;
      if (row < n_tokens) out[row * q_stride + c * 16 + e % 16] = from_float<T>(stage[e]);
    }
    __syncwarp();
  }
}

template <int kChunks, class Cache>
__global__ void __launch_bounds__(kTcThreads) attention_tc_kernel(const typename Cache::Params p) {
  if constexpr (kHasTensorCores<typename Cache::Elem>) {
    attention_tc_body<kChunks, Cache>(p);
  } else {
    (void)Cache::kVecQ;  // used by the body only; keeps nvcc from warning it is unreferenced
    __trap();            // never launched: the backend refuses bf16 below sm_80
  }
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

template <class Cache>
void launch_tc(const typename Cache::Params& p, int head_dim, const char* what, cudaStream_t stream) {
  if (p.tokens == 0 || p.heads == 0) return;
  const dim3 grid(unsigned(p.heads), unsigned(ceil_div(p.tokens, kQueryTile)));  // (head, query tile)
  if (head_dim <= 64) {
    attention_tc_kernel<4, Cache><<<grid, kTcThreads, 0, stream>>>(p);
  } else {
    attention_tc_kernel<8, Cache><<<grid, kTcThreads, 0, stream>>>(p);
  }
  STRATA_CUDA_CHECK_LAUNCH(what, stream);
}

}  // namespace

bool tensor_core_attention_supports(int head_dim, int64_t tokens) {
  // Fewer than kMinTokensPerRun tokens (decode of a small batch) fill no tile the rule takes:
  // no launch, and the per-token kernel skips nothing.
  return head_dim >= 16 && head_dim % 16 == 0 && head_dim <= kTensorCoreMaxHeadDim && tokens >= kMinTokensPerRun &&
         ceil_div(tokens, kQueryTile) <= 65535;  // tiles are the grid's y
}

template <class T>
void launch_tensor_core_attention(const AttentionParams<T>& p, cudaStream_t stream) {
  const bool vec16 = aligned16(p.q) && aligned16(p.cache_k) && aligned16(p.cache_v) && p.q_token_stride % 8 == 0 &&
                     p.kv_pos_stride % 8 == 0;
  if (vec16) {
    launch_tc<DenseCache<true, T>>(p, p.head_dim, "attention_tc_kernel<dense, vec16>", stream);
  } else {
    launch_tc<DenseCache<false, T>>(p, p.head_dim, "attention_tc_kernel<dense>", stream);
  }
}

template <class T>
void launch_tensor_core_quant_attention(const QuantAttentionParams<T>& p, cudaStream_t stream) {
  if (p.row.bits == 4) {
    launch_tc<QuantCache<4, T>>(p, p.row.n, "attention_tc_kernel<q4>", stream);
  } else {
    launch_tc<QuantCache<8, T>>(p, p.row.n, "attention_tc_kernel<q8>", stream);
  }
}

#define STRATA_INSTANTIATE(T)                                                                       \
  template void launch_tensor_core_attention<T>(const AttentionParams<T>&, cudaStream_t);          \
  template void launch_tensor_core_quant_attention<T>(const QuantAttentionParams<T>&, cudaStream_t);
STRATA_FOR_EACH_ACT(STRATA_INSTANTIATE)

}  // namespace strata::cuda
