// Launchers of the CUDA kernels, one per op family (*.cu). Each takes raw device pointers or a
// plain parameter struct and a stream, returns at once for empty work, and checks its launch.
// T, the activation element type, is __half or bf16 (act_types.cuh); each .cu instantiates both.
// Shapes are validated by the entries in cuda_backend.cpp; all layouts are contiguous row-major.
#pragma once
#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "act_types.cuh"

#include "split_kv.h"

namespace strata::cuda {

// embedding.cu: out[i] = src[idx[i]] (or += when accumulate). src: [src_rows, width],
// idx: [n], out: [n, width]. An index outside [0, src_rows) writes NaN rather than reading wild.
template <class T>
void launch_gather_rows(const T* src, int64_t src_rows, const int32_t* idx, int64_t n, int64_t width,
                        bool accumulate, T* out, cudaStream_t stream);

// norm.cu: one block per row; x, out: [rows, h] (out may alias x); w, b: [h], b may be null.
// RMS norms scale by w_offset + w (1 for Gemma's), the sum in fp32.
template <class T>
void launch_layer_norm(const T* x, const T* w, const T* b, float eps, int64_t rows, int64_t h,
                       T* out, cudaStream_t stream);
template <class T>
void launch_rms_norm(const T* x, const T* w, float eps, int64_t rows, int64_t h, T* out,
                     cudaStream_t stream, float w_offset = 0.0f);
// norm.cu, the residual add first: x += delta (rounded to T as launch_add does), then out =
// the norm of the new x. delta: [rows, h]; out may alias delta, not x.
template <class T>
void launch_add_layer_norm(T* x, const T* delta, const T* w, const T* b, float eps, int64_t rows,
                           int64_t h, T* out, cudaStream_t stream);
template <class T>
void launch_add_rms_norm(T* x, const T* delta, const T* w, float eps, int64_t rows, int64_t h,
                         T* out, cudaStream_t stream, float w_offset = 0.0f);

// elementwise.cu
enum class ActKind : int { ReLU, GELU };
template <class T>
void launch_add(const T* a, const T* b, T* out, int64_t n, cudaStream_t stream);
template <class T>
void launch_activation(ActKind act, T* x, int64_t n, cudaStream_t stream);
// out[t, c] = silu(gate_up[t, c]) * gate_up[t, f + c]; gate_up: [rows, 2f], out: [rows, f].
// out[t] = sum_j weights[t k + j] * src[rows[t k + j]] (fp32 sums, j in order); src: [src_rows, h],
// out: [tokens, h]. A row outside src gives NaN (callers validate on the host).
template <class T>
void launch_combine_rows(const T* src, int64_t src_rows, const int32_t* rows, const float* weights,
                         int64_t tokens, int64_t k, int64_t h, T* out, cudaStream_t stream);
template <class T>
void launch_swiglu(const T* gate_up, T* out, int64_t rows, int64_t f, cudaStream_t stream);
// The same with gelu(approximate="tanh") for silu (GeGLU).
template <class T>
void launch_geglu(const T* gate_up, T* out, int64_t rows, int64_t f, cudaStream_t stream);
// GPT-OSS's clamped SwiGLU (Backend::clamped_swiglu).
template <class T>
void launch_clamped_swiglu(const T* gate_up, T* out, int64_t rows, int64_t f, float limit, float alpha,
                           cudaStream_t stream);
// x *= s; x = cap * tanh(x / cap), in fp32. T: the activation types and float (logits).
template <class T>
void launch_scale(T* x, float s, int64_t n, cudaStream_t stream);
template <class T>
void launch_soft_cap(T* x, float cap, int64_t n, cudaStream_t stream);
// y[r, c] += bias[c]; y: [rows, cols] of the activation type or float (a router's fp32 logits),
// bias of the activation type.
template <class Y, class B>
void launch_bias_add(Y* y, const B* bias, int64_t rows, int64_t cols, cudaStream_t stream);

// rope.cu: x: [tokens, heads, head_dim] rotated in place; head_dim even.
template <class T>
struct RopeParams {
  T* x;
  const int32_t* positions;  // [tokens]
  const float* inv_freq;     // [head_dim / 2]
  int64_t tokens;
  int heads;
  int head_dim;
  int64_t token_stride;      // elements between tokens (heads * head_dim)
};
template <class T>
void launch_rope(const RopeParams<T>& p, cudaStream_t stream);
// ---- group-wise quantized rows (include/strata/quant/quant.h's format) ----
// A row of n elements: codes (4-bit: element 2k in the low nibble of byte k; 8-bit: one byte
// each) padded with zeros to a multiple of 4 bytes, then `groups` fp16 scales, then `groups` fp16
// minimums; the last group is shorter when group does not divide n. Rows are a multiple of 4
// bytes, so in a 4-byte-aligned buffer (the entries check it) every row's code words and
// parameters are aligned.
struct QuantRowLayout {
  int n = 0;               // elements per row
  int group = 0;           // 32, 64 or 128
  int bits = 0;            // 4 or 8 (16: plain 16-bit rows, plain_row_layout)
  int groups = 0;          // ceil(n / group)
  int64_t code_bytes = 0;  // ceil(n * bits / 32) * 4
  int64_t row_bytes = 0;   // code_bytes + 4 * groups
};
inline QuantRowLayout quant_row_layout(int bits, int group, int n) {
  QuantRowLayout l;
  l.n = n;
  l.group = group;
  l.bits = bits;
  l.groups = (n + group - 1) / group;
  l.code_bytes = (int64_t(n) * bits + 31) / 32 * 4;
  l.row_bytes = l.code_bytes + 4 * int64_t(l.groups);
  return l;
}

// rope.cu: qkv [tokens, (heads + 2 kv_heads) head_dim] (q's columns, k's, v's) into q [tokens,
// heads, head_dim], k and v [tokens, kv_heads, head_dim] (or the caches), q and k rotated as
// launch_rope does where inv_freq is not null.
template <class T>
struct SplitQkvParams {
  const T* qkv;
  const int32_t* positions;  // [tokens]
  const float* inv_freq;     // [head_dim / 2], or null: copy without rotating
  T* q;
  T* k;                 // [tokens, kv_heads, head_dim], or null: into the caches
  T* v;
  // With k and v null: k and v into cache rows (slots[t], positions[t]) of [slot_count, capacity,
  // kv_heads, head_dim] caches, kv_store_kernel's addressing (no write outside the cache).
  T* cache_k = nullptr;
  T* cache_v = nullptr;
  // Or quantized caches (quant_row's rows, one per (slot, position, kv head)): k and v quantized
  // into them as launch_quant_kv_store does, bit for bit.
  uint8_t* quant_cache_k = nullptr;
  uint8_t* quant_cache_v = nullptr;
  QuantRowLayout quant_row{};
  const int32_t* slots = nullptr;
  int slot_count = 0;
  int capacity = 0;
  int64_t tokens;
  int heads;
  int kv_heads;
  int head_dim;
};
template <class T>
void launch_split_qkv(const SplitQkvParams<T>& p, cudaStream_t stream);

// attention.cu. Caches: [slots, capacity, kv_heads, head_dim].
template <class T>
struct KvStoreParams {
  const T* k;           // [tokens, kv_heads, head_dim]
  const T* v;
  T* cache_k;
  T* cache_v;
  const int32_t* slots;      // [tokens]
  const int32_t* positions;  // [tokens]
  int64_t tokens;
  int64_t row;               // kv_heads * head_dim: elements per token and per cache position
  int slot_count;
  int capacity;
};
template <class T>
void launch_kv_store(const KvStoreParams<T>& p, cudaStream_t stream);

constexpr int kMaxHeadDim = 256;
template <class T>
struct AttentionParams {
  const T* q;           // [tokens, heads, head_dim]
  const T* cache_k;
  const T* cache_v;
  const int32_t* slots;      // [tokens]
  const int32_t* positions;  // [tokens]; token t attends to cache positions [0, positions[t]]
  T* out;               // [tokens, heads, head_dim]
  int64_t tokens;
  int heads;
  int kv_heads;
  int head_dim;              // <= kMaxHeadDim
  int slot_count;
  int capacity;
  float scale;
  int64_t q_token_stride;    // heads * head_dim
  int64_t kv_pos_stride;     // kv_heads * head_dim
  int64_t kv_slot_stride;    // capacity * kv_heads * head_dim
  bool skip_tensor_core_tiles = false;  // per-token kernel: leave the tiles the tensor-core kernel takes
  int window = 0;            // > 0: token t sees keys (positions[t] - window, positions[t]] (AttentionSpec)
  float softcap = 0.0f;      // > 0: scaled scores become softcap * tanh(score / softcap)
  const float* sinks = nullptr;  // F32 [heads]: each query head's sink logit (AttentionSpec), or none
};
// Per-token kernel: a block per (token, query head); every step shape, every head dim.
template <class T>
void launch_attention(const AttentionParams<T>& p, cudaStream_t stream);

// attention_split.cu: split-KV decode attention (flash-decoding). Each (token, kv head)'s keys
// [0, positions[t]] are cut into `splits` chunks of whole 64-key tiles; a block takes one chunk for
// up to kSplitKvGroupHeads query heads of one kv head (each K/V row read once for all of them) and
// writes, per query head, its partial: the unnormalized output sum_j exp(s_j - m) v_j, the chunk's
// max score m (-inf for an empty chunk) and denominator l = sum_j exp(s_j - m). The merge kernel
// then writes out = sum_c exp(m_c - M) acc_c / sum_c exp(m_c - M) l_c, M = max_c m_c.
// split_kv.h says when to split and into how many chunks.
struct SplitKvScratch {
  float* acc = nullptr;  // [tokens, heads, splits, head_dim]
  float* max = nullptr;  // [tokens, heads, splits]
  float* sum = nullptr;  // [tokens, heads, splits]
  int splits = 0;        // 1..kSplitKvMaxChunks (split_kv.h)
};
// Bytes of scratch for a launch, and its partials carved out of `buffer` (256-byte aligned).
size_t split_kv_scratch_bytes(int64_t tokens, int heads, int head_dim, int splits);
SplitKvScratch split_kv_scratch(void* buffer, int64_t tokens, int heads, int head_dim, int splits);
// Both kernels (split, then merge) on one stream; skip_tensor_core_tiles is honoured as by
// launch_attention. Head dims up to kMaxHeadDim, any GQA ratio.
template <class T>
void launch_split_attention(const AttentionParams<T>& p, const SplitKvScratch& s, cudaStream_t stream);

// attention_tc.cu: the query tiles of prefill runs (attention_tiles.cuh says which) on tensor
// cores; launch_attention with skip_tensor_core_tiles then does the rest. Head dims that are
// multiples of 16 up to kTensorCoreMaxHeadDim, steps of up to 65535 tiles of 64 tokens.
constexpr int kTensorCoreMaxHeadDim = 128;
bool tensor_core_attention_supports(int head_dim, int64_t tokens);
template <class T>
void launch_tensor_core_attention(const AttentionParams<T>& p, cudaStream_t stream);

// sampling.cu: out[r] = argmax over logits[r, :] (lowest index on ties; NaN never wins).
// L: __half, bf16 or float.
template <class L>
void launch_argmax_rows(const L* logits, int64_t rows, int64_t cols, int32_t* out, cudaStream_t stream);
// sampling.cu: each row's sampling candidates in runtime/row_candidates.h's layout, `capacity`
// (<= kMaxRowCandidates) per row, as compute_row_candidates writes them but for the sums' order
// (a tree over the block's threads). temperatures: one per row; 0 sums at temperature 1.
template <class L>
void launch_row_candidates(const L* logits, int64_t rows, int64_t cols, const float* temperatures, int capacity,
                           uint8_t* out, cudaStream_t stream);
// sampling.cu: each row's target logit and rank (runtime/row_candidates.h's TargetRank, 8 bytes a
// row), as compute_target_rank computes them.
template <class L>
void launch_target_ranks(const L* logits, int64_t rows, int64_t cols, const int32_t* targets, uint8_t* out,
                         cudaStream_t stream);

// quant.cu: rows x n fp16, bf16 or fp32 elements to quantized rows and back. Quantizing
// is bit-identical to the host reference (quant.cpp); dequantizing computes its formula,
// float(code) * scale rounded, plus minimum rounded, so values are identical too.
struct QuantParams {
  int64_t rows = 0;
  QuantRowLayout row;
};
// E: __half, bf16 or float.
template <class E>
void launch_quantize_rows(const QuantParams& p, const E* x, uint8_t* q, cudaStream_t stream);
template <class E>
void launch_dequantize_rows(const QuantParams& p, const uint8_t* q, E* out, cudaStream_t stream);

// quant.cu: kv_store into quantized caches. Each (token, kv head) row of head_dim elements of k
// and v is quantized (as quantize_rows would) into cache row (slot, position, head).
template <class T>
struct QuantKvStoreParams {
  const T* k;           // [tokens, kv_heads, head_dim]
  const T* v;
  uint8_t* cache_k;          // [slots, capacity, kv_heads] rows of row.row_bytes
  uint8_t* cache_v;
  const int32_t* slots;      // [tokens]
  const int32_t* positions;  // [tokens]
  int64_t tokens;
  int kv_heads;
  int slot_count;
  int capacity;
  QuantRowLayout row;        // n = head_dim
};
template <class T>
void launch_quant_kv_store(const QuantKvStoreParams<T>& p, cudaStream_t stream);

// quant_linear.cu: y[T, out] = x[T, in] @ dequant(w)^T (+ bias), fp32 accumulation, weights
// dequantized in registers. One pass over the weights serves up to kQuantLinearTokens tokens;
// more tokens take one pass per kQuantLinearTokens (correct, but the weights are re-read).
constexpr int kQuantLinearTokens = 16;
template <class T>
struct QuantLinearParams {
  const T* x;     // [tokens, in]
  const uint8_t* w;    // [out] quantized rows of `in` elements
  const T* bias;  // [out] or null
  T* y;           // [tokens, out]
  int64_t tokens;
  int out;
  QuantRowLayout row;  // n = in
};
template <class T>
void launch_quant_linear(const QuantLinearParams<T>& p, cudaStream_t stream);
// quant_linear.cu: independent linears without bias over matrices of one shape [out, n] and
// layout, each of at most kQuantLinearTokens tokens (a mixture of experts' active experts in a
// decode step): one launch per token tier in use instead of one per job, each job computed as
// launch_quant_linear computes it alone, bit for bit.
template <class T>
struct QuantLinearJob {
  const T* x;        // [tokens, n]
  const uint8_t* w;  // [out] quantized rows
  T* y;              // [tokens, out]
  int64_t tokens;    // 0 to kQuantLinearTokens
};
template <class T>
void launch_quant_linears(const QuantLinearJob<T>* jobs, int count, int out, const QuantRowLayout& row,
                          cudaStream_t stream);

// ---- a mixture of experts' routing kept on the device (a decode step's few tokens) ----
constexpr int kMaxRoutedTokens = 64;     // a step's tokens
constexpr int kMaxRoutedK = 16;          // experts per token
constexpr int kMaxRoutedExperts = 256;   // experts per layer (their weights travel in parameters)
// moe_route.cu: route_tokens' result (src/runtime/moe_routing.cpp) for `tokens` rows of fp32
// logits [tokens, experts], bit for bit but for expf's last place: the T k assignments sorted by
// expert (tokens ascending within one) in gather, each token's k rows and weights in combine_rows
// and combine_weights (its experts ascending), expert e's rows from expert_begin[e] to
// expert_begin[e + 1], and the active experts ascending in active (then -1 to active_slots).
// totals[0..2] += 1, tokens and the distinct experts (GenStats' routing counts).
struct RouteExpertsParams {
  const float* logits;
  int32_t* gather;           // [tokens k]
  int32_t* combine_rows;     // [tokens k]
  float* combine_weights;    // [tokens k]
  int32_t* expert_begin;     // [experts + 1]
  int32_t* active;           // [active_slots], active_slots = min(experts, tokens k)
  int32_t* totals;           // [3]
  int tokens;                // at most kMaxRoutedTokens
  int experts;               // at most kMaxRoutedExperts
  int k;                     // at most kMaxRoutedK
  int active_slots;
  bool renormalize;
};
void launch_route_experts(const RouteExpertsParams& p, cudaStream_t stream);
// quant_linear.cu: each active expert's linear over its rows, as launch_quant_linear computes it
// alone, bit for bit, with the routing read from the device: slot z of active names expert e (or
// -1: nothing), whose rows expert_begin[e] to expert_begin[e + 1] of x and y it computes with
// w[e]. One launch for every expert; max_rows bounds any expert's rows (an expert of more than
// kQuantLinearTokens rows takes a pass over its weights per kQuantLinearTokens, as alone).
// Weights of 4- or 8-bit codes (row.bits), or 16-bit rows of T (row = plain_row_layout(n): fp32
// sums of x w, one rounding to T, as the codes' kernel sums).
template <class T>
struct RoutedLinears {
  const uint8_t* w[kMaxRoutedExperts];  // each expert's [out] rows
  const T* b[kMaxRoutedExperts];        // each expert's bias [out], or null
  const T* x;                           // [rows, n], rows grouped by expert
  T* y;                                 // [rows, out]
  const int32_t* expert_begin;
  const int32_t* active;
  int active_slots;
  int out;
  QuantRowLayout row;
};
// The layout of a row of n 16-bit elements (n even: rows of whole 4-byte words) for RoutedLinears.
inline QuantRowLayout plain_row_layout(int n) {
  QuantRowLayout l;
  l.n = n;
  l.bits = 16;
  l.code_bytes = l.row_bytes = int64_t(n) * 2;
  return l;
}
template <class T>
void launch_routed_linears(const RoutedLinears<T>& g, int experts, int64_t max_rows, cudaStream_t stream);

// quant_attention.cu: attention() over quantized caches ([slots, capacity, kv_heads] rows of
// head_dim), same semantics as launch_attention; keys and values are dequantized in registers by
// the reference formula (float(code) * scale rounded, plus minimum rounded).
template <class T>
struct QuantAttentionParams {
  const T* q;           // [tokens, heads, head_dim]
  const uint8_t* cache_k;
  const uint8_t* cache_v;
  const int32_t* slots;      // [tokens]
  const int32_t* positions;  // [tokens]; token t attends to cache positions [0, positions[t]]
  T* out;               // [tokens, heads, head_dim]
  int64_t tokens;
  int heads;
  int kv_heads;
  int slot_count;
  int capacity;
  float scale;
  QuantRowLayout row;        // n = head_dim <= kMaxHeadDim
  bool skip_tensor_core_tiles = false;  // leave the tiles the tensor-core kernel takes
  int window = 0;            // as in AttentionParams
  float softcap = 0.0f;
  const float* sinks = nullptr;
};
template <class T>
void launch_quant_attention(const QuantAttentionParams<T>& p, cudaStream_t stream);
// quant_attention.cu: split-KV decode over quantized caches, attention_split.cu's design and
// merge (launch_split_attention above).
template <class T>
void launch_split_quant_attention(const QuantAttentionParams<T>& p, const SplitKvScratch& s, cudaStream_t stream);
// attention_split.cu: the merge of both split launchers, one block per (token, query head). Token
// fields as in the attention params; an invalid slot or position writes NaN, as the kernels do.
template <class T>
struct SplitKvMergeParams {
  SplitKvScratch part;
  T* out;               // [tokens, heads, head_dim]
  const int32_t* slots;
  const int32_t* positions;
  int64_t tokens;
  int heads;
  int head_dim;
  int slot_count;
  int capacity;
  bool skip_tensor_core_tiles = false;
  const float* sinks = nullptr;  // as in AttentionParams: the merge adds each head's sink
};
template <class T>
void launch_split_kv_merge(const SplitKvMergeParams<T>& p, cudaStream_t stream);
// attention_tc.cu: the tensor-core kernel over quantized caches (rows dequantized by the
// reference formula into shared memory as T), for the same tiles and head dims.
template <class T>
void launch_tensor_core_quant_attention(const QuantAttentionParams<T>& p, cudaStream_t stream);

}  // namespace strata::cuda
