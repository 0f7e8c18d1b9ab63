// Checkpoints whose linears are stored as packed integer codes: GPTQ and AWQ, the two 4-bit
// formats of the Hugging Face Hub (docs/quantization.md, "GPTQ and AWQ checkpoints").
//
// GPTQ (Frantar et al. 2023; AutoGPTQ and GPTQModel save it, transformers loads it): each
// quantized linear `P` is stored as
//   P.qweight  I32 [in * bits / 32, out]  codes, packed along the input, lowest bits first
//   P.qzeros   I32 [G, out * bits / 32]   each group's zero point, packed along the output
//   P.scales   F16 [G, out]               each group's scale
//   P.g_idx    I32 [in]                   the group of each input (optional: i / group_size)
// and w[o][i] = scale[g][o] * (code[i][o] - zero[g][o]) with g = g_idx[i]. In checkpoint format
// "gptq" (AutoGPTQ's, still what GPTQModel saves) the stored zero is the zero minus one;
// "gptq_v2" stores it as is.
//
// AWQ (Lin et al. 2024; AutoAWQ's GEMM version, which GPTQModel also writes): 4-bit codes
//   P.qweight  I32 [in, out / 8]   codes, packed along the output
//   P.qzeros   I32 [G, out / 8]    zero points, packed along the output
//   P.scales   F16 [G, out]        scales; the group of input i is i / group_size
// where the word's k-th nibble holds output 8c + {0, 2, 4, 6, 1, 3, 5, 7}[k], and the weight is
// scale * (code - zero) as in GPTQ, with the zero as stored.
//
// The source shows each P as the Hugging Face `P.weight` [out, in], so the loader is unchanged:
// read() dequantizes, and read_codes() hands the codes over as Strata's rows (quant.h) when the
// policy's spec holds them: bits >= the file's, a group size dividing the file's, and groups of
// consecutive inputs (GPTQ desc_act checkpoints permute them and are dequantized, then quantized
// at load).
#pragma once
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "strata/model/weight_source.h"

namespace strata {

enum class PackedMethod { Gptq, Awq };

struct PackedFormat {
  PackedMethod method = PackedMethod::Gptq;
  int bits = 4;                // GPTQ: 2, 4 or 8; AWQ: 4
  int group_size = 128;        // inputs per group; 0 when the whole row is one group (GPTQ's -1)
  bool zero_minus_one = true;  // GPTQ checkpoint format "gptq": the stored zero is the zero minus one
  std::string source;          // the file the format was read from, for messages
};

// The packed format of a Hugging Face model directory: config.json's quantization_config, else a
// quantize_config.json (older AutoGPTQ checkpoints) or a quant_config.json (older AutoAWQ ones)
// beside it. nullopt when the model is not
// quantized. Throws naming the file and field for another quantization method (bitsandbytes,
// FP8, ...) or a variant Strata cannot read (3-bit codes, Marlin repacking, AWQ's GEMV layout,
// per-module `dynamic` overrides).
std::optional<PackedFormat> read_packed_format(const std::filesystem::path& model_dir);
// The config.json part of it, on the file's text (`file` names it in errors).
std::optional<PackedFormat> packed_format_from_config_text(const std::string& text, const std::string& file);

// The weights of a GPTQ or AWQ checkpoint's safetensors (`path` as make_safetensors_source takes it).
// Every packed linear's shapes are checked here; a bad group index is reported when read.
std::unique_ptr<WeightSource> make_packed_source(const std::filesystem::path& path, const PackedFormat& format);

// "GPTQ 4-bit, group 128", "AWQ 4-bit, group 64" (for messages).
std::string describe_packed(const PackedFormat& format);
// The compress_weights spec that keeps its codes: its bits (4, or 8 for more) and the largest of
// Strata's groups dividing its own; nullopt when its groups are not a multiple of 32. (A desc_act
// checkpoint, whose inputs are permuted, keeps none even then.)
std::optional<quant::QuantSpec> packed_codes_spec(const PackedFormat& format);
// What happens to such a checkpoint's matrices, for the job's log: dequantized at load, unless a
// compress_weights policy holds their codes.
std::string packed_load_note(const PackedFormat& format);

}  // namespace strata
