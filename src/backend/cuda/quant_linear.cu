// Fused dequant-GEMV/GEMM for quantized weights: y[T, out] = x[T, in] @ dequant(w)^T + bias,
// decode-oriented (T small), fp32 accumulation, weights read once per pass of up to kTokens tokens.
//
// A block of kWarps warps owns kWarps * kRows output rows; each warp owns kRows (2). `in` is
// walked in tiles of kTileK = 512 elements: the block stages the tile of x for its kTokens tokens
// in shared memory as fp32, then lane l of each warp takes elements [16 l, 16 l + 16) of the tile
// for each of its rows: 16 codes (8 bytes at 4 bits, 16 at 8; one vector load where the rows are
// aligned for it), always in one group, whose scale and minimum come from the row's tail. Each
// code is dequantized once (code * scale + min, one FMA) and reused for all kTokens tokens, so a
// weight costs 1/T of an FMA on top of the T multiply-adds. (Computing s * sum(x c) + m * sum(x)
// per group instead would save that 1/T but needs a second set of kTokens x kRows accumulators
// per lane, and registers are what limits kRows already; see kRows.) The next tile's codes are
// loaded before the current one is computed. At the end each warp sums its lanes' partial dot
// products and adds the bias before the one rounding to fp16.
//
// Shared memory holds x as [token][sub-block b][lane] float4s (x[t][16 lane + 4 b .. + 4]), so
// the 32 lanes' float4 reads of one (token, b) are consecutive: no bank conflicts.
//
// The routed launch (a decode step's experts, their rows read from the routing on the device)
// also takes 16-bit weights (kBits 16: rows of T, no groups), which cuBLAS cannot take with row
// counts it does not know on the host: the same loop, each weight converted instead of
// dequantized.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cuda_common.h"
#include "kernels.h"
#include "quant_common.cuh"

namespace strata::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kChunk = 16;              // elements per lane per tile
constexpr int kTileK = 32 * kChunk;     // elements of `in` per tile
constexpr int kSubBlocks = kChunk / 4;  // float4 reads of x per lane, token and tile

// Output rows per warp. Each x value read from shared memory serves kRows rows, so more would
// ease the shared-memory reads, but at 4 rows ptxas (sm_90) took all 255 registers and spilled
// at 16 tokens; 2 rows stay under 170 registers without spills for every token count.
constexpr int kRows = 2;

template <int kBits>
constexpr int chunk_words() { return kChunk * kBits / 32; }  // words per lane and row: 2, 4 or 8 (16-bit)

// kWords code words of one row from word first_word on (this lane's 16 codes of a tile); words past
// the row's codes read as 0 (their x is 0 too). vec: rows and the base are aligned for one vector load.
template <int kWords>
__device__ __forceinline__ void load_codes(uint32_t (&c)[kWords], const uint8_t* row, int64_t first_word,
                                           int64_t code_words, bool vec) {
  const uint32_t* src = reinterpret_cast<const uint32_t*>(row) + first_word;
  if (vec && first_word + kWords <= code_words) {
    if constexpr (kWords == 8) {
      const uint4 a = __ldg(reinterpret_cast<const uint4*>(src)), b = __ldg(reinterpret_cast<const uint4*>(src) + 1);
      c[0] = a.x, c[1] = a.y, c[2] = a.z, c[3] = a.w;
      c[4] = b.x, c[5] = b.y, c[6] = b.z, c[7] = b.w;
    } else if constexpr (kWords == 2) {
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(src));
      c[0] = v.x;
      c[1] = v.y;
    } else {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(src));
      c[0] = v.x;
      c[1] = v.y;
      c[2] = v.z;
      c[3] = v.w;
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < kWords; ++j) c[j] = first_word + j < code_words ? __ldg(src + j) : 0u;
}

// Stages x[t0 + t][k0 + e] (0 outside [T, in]) for t < kTokens, e < kTileK, in the swizzled layout.
// Thread i writes float4 i, so the stores are conflict-free; x_vec: 8-byte loads are aligned.
template <int kTokens, class T>
__device__ __forceinline__ void stage_x(float4* x_s, const QuantLinearParams<T>& p, int64_t t0, int64_t k0, bool x_vec) {
  const int64_t in = p.row.n;
  for (int i = threadIdx.x; i < kTokens * kSubBlocks * 32; i += kThreads) {
    const int t = i / (kSubBlocks * 32), b = (i / 32) % kSubBlocks, lane = i % 32;
    const int64_t e = k0 + lane * kChunk + b * 4;  // element of the row
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (t0 + t < p.tokens && e < in) {
      const T* src = p.x + (t0 + t) * in + e;
      if (x_vec && e + 4 <= in) {
        const uint2 raw = *reinterpret_cast<const uint2*>(src);
        const float2 a = to_float2(*reinterpret_cast<const Pair<T>*>(&raw.x));
        const float2 b2 = to_float2(*reinterpret_cast<const Pair<T>*>(&raw.y));
        v = make_float4(a.x, a.y, b2.x, b2.y);
      } else {
        float f[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int k = 0; k < 4; ++k)
          if (e + k < in) f[k] = to_float(src[k]);
        v = make_float4(f[0], f[1], f[2], f[3]);
      }
    }
    x_s[i] = v;
  }
}

// One block's rows of y for every pass of kTokens tokens; x_s is the block's shared tile of x.
template <int kBits, int kTokens, class T>
__device__ __forceinline__ void quant_linear_rows(const QuantLinearParams<T>& p, bool w_vec, bool x_vec, float4* x_s) {
  constexpr int kWords = chunk_words<kBits>();
  const QuantRowLayout& l = p.row;
  const int lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * kWarps + (threadIdx.x >> 5)) * kRows;
  const int64_t code_words = l.code_bytes / 4;
  const int tiles = int((int64_t(l.n) + kTileK - 1) / kTileK);

  // Rows past `out` read the last row (every warp must reach the block's barriers) and store nothing.
  const uint8_t* rows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) rows[r] = p.w + int64_t(min(row0 + r, p.out - 1)) * l.row_bytes;

  for (int64_t t0 = int64_t(blockIdx.y) * kTokens; t0 < p.tokens; t0 += int64_t(gridDim.y) * kTokens) {
    float acc[kTokens][kRows];
#pragma unroll
    for (int t = 0; t < kTokens; ++t)
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[t][r] = 0.0f;

    uint32_t cur[kRows][kWords];
#pragma unroll
    for (int r = 0; r < kRows; ++r) load_codes(cur[r], rows[r], int64_t(lane) * kWords, code_words, w_vec);

    for (int tile = 0; tile < tiles; ++tile) {
      const int64_t k0 = int64_t(tile) * kTileK;
      __syncthreads();  // the previous tile's x is no longer read
      stage_x<kTokens>(x_s, p, t0, k0, x_vec);
      __syncthreads();

      uint32_t next[kRows][kWords] = {};
      if (tile + 1 < tiles) {
        const int64_t next_word = (k0 + kTileK) * kBits / 32 + int64_t(lane) * kWords;
#pragma unroll
        for (int r = 0; r < kRows; ++r) load_codes(next[r], rows[r], next_word, code_words, w_vec);
      }

      // This lane's 16 elements lie in one group; past the row's end the clamped group's
      // parameters are finite and x is 0.
      float2 sm[kRows];
      if constexpr (kBits != 16) {
        const int64_t chunk_group = (k0 + int64_t(lane) * kChunk) / l.group;
        const int group = chunk_group < l.groups ? int(chunk_group) : l.groups - 1;
#pragma unroll
        for (int r = 0; r < kRows; ++r) sm[r] = group_params(rows[r], l, group);
      }

#pragma unroll
      for (int b = 0; b < kSubBlocks; ++b) {
        float w[kRows][4];
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          if constexpr (kBits == 16) {  // elements 4b .. 4b + 3 are words 2b and 2b + 1
            const float2 lo = to_float2(*reinterpret_cast<const Pair<T>*>(&cur[r][2 * b]));
            const float2 hi = to_float2(*reinterpret_cast<const Pair<T>*>(&cur[r][2 * b + 1]));
            w[r][0] = lo.x, w[r][1] = lo.y, w[r][2] = hi.x, w[r][3] = hi.y;
          } else {
#pragma unroll
            for (int k = 0; k < 4; ++k) {
              const int e = b * 4 + k;  // element of the chunk
              constexpr int kPer = 32 / kBits;
              w[r][k] = fmaf(word_code<kBits>(cur[r][e / kPer], e % kPer), sm[r].x, sm[r].y);
            }
          }
        }
#pragma unroll
        for (int t = 0; t < kTokens; ++t) {
          const float4 xv = x_s[(t * kSubBlocks + b) * 32 + lane];
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            float a = acc[t][r];
            a = fmaf(xv.x, w[r][0], a);
            a = fmaf(xv.y, w[r][1], a);
            a = fmaf(xv.z, w[r][2], a);
            a = fmaf(xv.w, w[r][3], a);
            acc[t][r] = a;
          }
        }
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int j = 0; j < kWords; ++j) cur[r][j] = next[r][j];
    }

    // Every lane gets every sum; lane (t * kRows + r) % 32 stores output (t, r).
#pragma unroll
    for (int t = 0; t < kTokens; ++t)
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float sum = warp_sum(acc[t][r]);
        const int row = row0 + r;
        if (lane == (t * kRows + r) % 32 && t0 + t < p.tokens && row < p.out) {
          const float bias = p.bias ? to_float(p.bias[row]) : 0.0f;
          p.y[(t0 + t) * p.out + row] = from_float<T>(sum + bias);
        }
      }
  }
}

// (Minimum 1 block per SM in the launch bounds: without it ptxas capped registers lower and spilled.)
template <int kBits, int kTokens, class T>
__global__ void __launch_bounds__(kThreads, 1) quant_linear_kernel(const QuantLinearParams<T> p, bool w_vec, bool x_vec) {
  __shared__ float4 x_s[kTokens * kSubBlocks * 32];
  quant_linear_rows<kBits, kTokens>(p, w_vec, x_vec, x_s);
}

// A launch's jobs for launch_quant_linears travel in the kernel's parameters, which hold 4 KB on
// every architecture: 64 jobs of 32 bytes leave room for the rest.
constexpr int kJobsPerLaunch = 64;
template <class T>
struct QuantLinearJobs {
  QuantLinearJob<T> job[kJobsPerLaunch];
  int out;
  QuantRowLayout row;
};

// Job blockIdx.z of the launch (every job at most kTokens tokens: one pass over its weights).
template <int kBits, int kTokens, class T>
__global__ void __launch_bounds__(kThreads, 1) quant_linears_kernel(const QuantLinearJobs<T> g, bool w_vec, bool x_vec) {
  __shared__ float4 x_s[kTokens * kSubBlocks * 32];
  const QuantLinearJob<T>& j = g.job[blockIdx.z];
  const QuantLinearParams<T> p{j.x, j.w, nullptr, j.y, j.tokens, g.out, g.row};
  quant_linear_rows<kBits, kTokens>(p, w_vec, x_vec, x_s);
}

// The expert of slot blockIdx.z (launch_routed_linears), its rows at the token tier they
// would get alone: every tier up to kMaxTier is compiled in, and the expert's row count, read from
// the device, picks one. x_s is sized for kMaxTier.
template <int kBits, int kMaxTier, class T>
__global__ void __launch_bounds__(kThreads, 1) routed_linears_kernel(const RoutedLinears<T> g, bool w_vec, bool x_vec) {
  __shared__ float4 x_s[kMaxTier * kSubBlocks * 32];
  const int e = g.active[blockIdx.z];
  if (e < 0) return;
  const int64_t first = g.expert_begin[e], rows = g.expert_begin[e + 1] - first;
  const QuantLinearParams<T> p{g.x + first * g.row.n, g.w[e], g.b[e], g.y + first * g.out, rows, g.out, g.row};
  if (rows <= 1) quant_linear_rows<kBits, 1>(p, w_vec, x_vec, x_s);
  else if constexpr (kMaxTier >= 2) {
    if (rows <= 2) quant_linear_rows<kBits, 2>(p, w_vec, x_vec, x_s);
    else if constexpr (kMaxTier >= 4) {
      if (rows <= 4) quant_linear_rows<kBits, 4>(p, w_vec, x_vec, x_s);
      else if constexpr (kMaxTier >= 8) {
        if (rows <= 8) quant_linear_rows<kBits, 8>(p, w_vec, x_vec, x_s);
        else if constexpr (kMaxTier >= kQuantLinearTokens) quant_linear_rows<kBits, kQuantLinearTokens>(p, w_vec, x_vec, x_s);
      }
    }
  }
}

bool aligned(const void* ptr, int bytes) { return reinterpret_cast<uintptr_t>(ptr) % unsigned(bytes) == 0; }
template <int kBits>
constexpr int vec_bytes() { return chunk_words<kBits>() * 4; }
int64_t row_blocks(int out) { return ceil_div(int64_t(out), int64_t(kWarps) * kRows); }

// Whether the kernel may read w's codes, and x, in vector loads.
template <int kBits>
bool w_vectors(const uint8_t* w, const QuantRowLayout& row) {
  return aligned(w, vec_bytes<kBits>()) && row.row_bytes % vec_bytes<kBits>() == 0;
}
bool x_vectors(const void* x, const QuantRowLayout& row) { return aligned(x, 8) && row.n % 4 == 0; }

template <int kBits, int kTokens, class T>
void launch_shape(const QuantLinearParams<T>& p, cudaStream_t stream) {
  const bool w_vec = w_vectors<kBits>(p.w, p.row), x_vec = x_vectors(p.x, p.row);
  const int64_t token_passes = std::min<int64_t>(ceil_div(p.tokens, kTokens), 65535);
  const dim3 grid(static_cast<unsigned>(row_blocks(p.out)), static_cast<unsigned>(token_passes));
  quant_linear_kernel<kBits, kTokens><<<grid, kThreads, 0, stream>>>(p, w_vec, x_vec);
  STRATA_CUDA_CHECK_LAUNCH("quant_linear_kernel", stream);
}

template <int kBits, int kTokens, class T>
void launch_jobs(const QuantLinearJobs<T>& g, int count, cudaStream_t stream) {
  bool w_vec = true, x_vec = true;
  for (int i = 0; i < count; ++i) {
    w_vec = w_vec && w_vectors<kBits>(g.job[i].w, g.row);
    x_vec = x_vec && x_vectors(g.job[i].x, g.row);
  }
  const dim3 grid(static_cast<unsigned>(row_blocks(g.out)), 1, static_cast<unsigned>(count));
  quant_linears_kernel<kBits, kTokens><<<grid, kThreads, 0, stream>>>(g, w_vec, x_vec);
  STRATA_CUDA_CHECK_LAUNCH("quant_linears_kernel", stream);
}

// The token counts a pass is compiled for. A linear takes the fewest that cover its tokens: each
// token slot costs its FMAs whether used or not.
constexpr int kTokenTiers[] = {1, 2, 4, 8, kQuantLinearTokens};
int token_tier(int64_t tokens) {
  for (int tier : kTokenTiers)
    if (tokens <= tier) return tier;
  return kQuantLinearTokens;
}

// f(bits, tokens) with the weights' bits and a token tier as std::integral_constants.
template <class F>
void with_shape(int bits, int tier, F&& f) {
  const auto tokens = [&](auto b) {
    switch (tier) {
      case 1: return f(b, std::integral_constant<int, 1>{});
      case 2: return f(b, std::integral_constant<int, 2>{});
      case 4: return f(b, std::integral_constant<int, 4>{});
      case 8: return f(b, std::integral_constant<int, 8>{});
      default: return f(b, std::integral_constant<int, kQuantLinearTokens>{});
    }
  };
  if (bits == 4) tokens(std::integral_constant<int, 4>{});
  else if (bits == 8) tokens(std::integral_constant<int, 8>{});
  else tokens(std::integral_constant<int, 16>{});  // 16-bit rows (the routed launch only)
}

// launch_quant_linears' jobs at one token tier (each job at its own tier, as launch_quant_linear
// runs it alone), kJobsPerLaunch a launch.
template <class T>
void launch_tier(const QuantLinearJob<T>* jobs, int count, int out, const QuantRowLayout& row, int tier,
                 cudaStream_t stream) {
  QuantLinearJobs<T> g{};
  g.out = out;
  g.row = row;
  int n = 0;
  const auto flush = [&] {
    if (n > 0)
      with_shape(row.bits, tier, [&](auto bits, auto tokens) {
        launch_jobs<decltype(bits)::value, decltype(tokens)::value>(g, n, stream);
      });
    n = 0;
  };
  for (int i = 0; i < count; ++i) {
    if (jobs[i].tokens == 0 || token_tier(jobs[i].tokens) != tier) continue;
    g.job[n++] = jobs[i];
    if (n == kJobsPerLaunch) flush();
  }
  flush();
}

}  // namespace

template <class T>
void launch_routed_linears(const RoutedLinears<T>& g, int experts, int64_t max_rows, cudaStream_t stream) {
  if (g.active_slots == 0 || g.out == 0 || g.row.n == 0 || max_rows == 0) return;
  with_shape(g.row.bits, token_tier(max_rows), [&](auto bits, auto tokens) {
    constexpr int kBits = decltype(bits)::value, kMaxTier = decltype(tokens)::value;
    bool w_vec = true;
    for (int e = 0; e < experts; ++e) w_vec = w_vec && w_vectors<kBits>(g.w[e], g.row);
    const dim3 grid(static_cast<unsigned>(row_blocks(g.out)), 1, static_cast<unsigned>(g.active_slots));
    routed_linears_kernel<kBits, kMaxTier><<<grid, kThreads, 0, stream>>>(g, w_vec, x_vectors(g.x, g.row));
    STRATA_CUDA_CHECK_LAUNCH("routed_linears_kernel", stream);
  });
}

template <class T>
void launch_quant_linear(const QuantLinearParams<T>& p, cudaStream_t stream) {
  if (p.tokens == 0 || p.out == 0 || p.row.n == 0) return;
  with_shape(p.row.bits, token_tier(p.tokens),
             [&](auto bits, auto tokens) { launch_shape<decltype(bits)::value, decltype(tokens)::value>(p, stream); });
}

template <class T>
void launch_quant_linears(const QuantLinearJob<T>* jobs, int count, int out, const QuantRowLayout& row,
                          cudaStream_t stream) {
  if (out == 0 || row.n == 0) return;
  for (int tier : kTokenTiers) launch_tier(jobs, count, out, row, tier, stream);
}

#define STRATA_INSTANTIATE(T)                                                      \
  template void launch_quant_linear<T>(const QuantLinearParams<T>&, cudaStream_t); \
  template void launch_quant_linears<T>(const QuantLinearJob<T>*, int, int, const QuantRowLayout&, cudaStream_t); \
  template void launch_routed_linears<T>(const RoutedLinears<T>&, int, int64_t, cudaStream_t);
STRATA_FOR_EACH_ACT(STRATA_INSTANTIATE)

}  // namespace strata::cuda
