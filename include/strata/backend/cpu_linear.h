// Where the CPU backend's linear changes kernel with the token count. The cost model prices an
// expert computed on the CPU by these too (cost_model.cpp, cpu_experts_seconds).
#pragma once
#include <cstdint>

namespace strata::cpu_linear {

// Up to this many tokens, a linear over fp32 or 16-bit weights streams each weight row once
// against every token instead of calling sgemm (OpenBLAS would first pack all of w, which for few
// tokens costs as much as the multiplication itself).
constexpr int64_t kStreamingMaxTokens = 8;

// Up to this many tokens a linear over quantized weights reads their codes; beyond it, it
// dequantizes blocks of rows for sgemm, once per call (a caller's many tokens over a matrix it
// does not dequantize first: the engine's experts computed on the CPU). On Mixtral's and
// Qwen3-30B-A3B's expert matrices at 24 tokens the codes took 0.64-0.89x the time of dequantizing
// the matrix first on Mixtral's and 1.06-1.16x on Qwen's, which dequantize in cache; at 64 the
// blocks take 0.41-0.62x the codes' time (bench/results/2026-11-28-cpu-moe-q4-sgemm.md).
constexpr int64_t kCodesMaxTokens = 24;

// Linears at or below their streaming limit (the two above) compute each output row on its own,
// so Backend::linears runs several of them (a step's experts) in one parallel region. A single
// token over fp32 weights goes to OpenBLAS's sgemv instead, in linear() and linears() alike.
constexpr int64_t streamed_max_tokens(bool quantized) { return quantized ? kCodesMaxTokens : kStreamingMaxTokens; }

}  // namespace strata::cpu_linear
