// Group-wise asymmetric min/max quantization (FlexGen §5, issue 9): every `group_size`
// consecutive elements of a row share one fp16 scale and one fp16 minimum. Weights [out, in] are
// grouped along `in` and the KV cache along the head dimension: in both the innermost,
// contiguous dimension, so a fused dequant-GEMV and the attention kernels read a row's codes and
// its groups' parameters together (docs/quantization.md).
//
// A quantized row of n elements is self-contained, so tensors of rows (a layer's matrices, a
// cache's positions) move and slice by whole rows as their unquantized forms do:
//
//   [codes: n * bits / 8 bytes, padded to 4][scales: G fp16][minimums: G fp16],  G = ceil(n / group_size)
//
// 4-bit codes pack two to a byte, element 2k in the low nibble and 2k + 1 in the high one. When
// group_size does not divide n, the last group is shorter (FlexGen pads the same way), so every
// matrix and head size can be compressed; padding bytes are zero.
//
// The formula, in fp32, for a group x[0..g) (tests/fixtures/quant/make_quant.py is its numpy
// twin, which the tests compare against):
//   lo = min(x), hi = max(x); min16 = fp16(lo); scale16 = fp16((hi - lo) / (2^bits - 1))
//   code = clamp(rint((x - float(min16)) / float(scale16)), 0, 2^bits - 1)   (0 when scale16 == 0)
//   dequantized = code * float(scale16) + float(min16)
// rint rounds half to even. Inputs must be finite.
#pragma once
#include <cstddef>
#include <cstdint>

#include "strata/core/dtype.h"
#include "strata/core/tensor.h"

namespace strata::quant {

struct QuantSpec {
  int bits = 4;         // 4 or 8
  int group_size = 64;  // 32, 64 or 128
};

// Throws strata::Error naming the field when bits or group_size is outside the supported set, or
// when a row of `n` elements is empty.
void check_spec(const QuantSpec& spec, int64_t n);

// Bytes of one quantized row of n elements (a multiple of 4).
size_t row_bytes(const QuantSpec& spec, int64_t n);
// Bytes per element, parameters included: 4.5 bits at 4-bit, group 64 (0.5625 bytes).
double bytes_per_element(const QuantSpec& spec);

// Tokens up to which the CUDA backend's fused dequant linear pays off (its
// fused_dequant_max_tokens()); the cost model prices the runtime's choice with it. The CPU
// backend's limit is the same (measured, cpu_backend.cpp), so the price holds for both.
constexpr int64_t kCudaFusedDequantMaxTokens = 16;

// The tensor dtype of a spec (Q4 or Q8), and the spec of a quantized tensor.
inline DType dtype_of(const QuantSpec& spec) { return spec.bits == 4 ? DType::Q4 : DType::Q8; }
QuantSpec spec_of(const Tensor& t);  // throws unless t is Q4 or Q8 with a valid group

// Host reference implementation. `src` holds rows x n elements of `src_dtype` (F32, F16 or
// BF16), row after row; `dst` receives rows x row_bytes(spec, n) bytes.
void quantize_rows(const QuantSpec& spec, const void* src, DType src_dtype, int64_t rows, int64_t n, void* dst);
// The inverse: rows x n elements of `dst_dtype` (F32, F16 or BF16).
void dequantize_rows(const QuantSpec& spec, const void* src, int64_t rows, int64_t n, void* dst, DType dst_dtype);

// One row of n elements from codes quantized elsewhere (a GGUF file's Q4_0 ... Q5_K blocks keep
// theirs, gguf.h): codes[n], each below 2^bits, and the scale and minimum of each of the row's
// groups, rounded to fp16 here. Returns false, the row unspecified, when a scale or minimum is
// beyond fp16's range.
bool pack_row(const QuantSpec& spec, int64_t n, const uint8_t* codes, const float* scales, const float* mins,
              void* dst);

// Multiplies every value of one quantized row of n elements by `factor`: its groups' scales and
// minimums, each rounded to fp16 again (the codes stay).
void scale_row(const QuantSpec& spec, int64_t n, void* row, float factor);

}  // namespace strata::quant
