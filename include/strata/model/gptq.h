// GPTQ checkpoints (Frantar et al. 2023; the format of AutoGPTQ and GPTQModel, which
// transformers loads): each quantized linear `P` is stored as
//   P.qweight  I32 [in * bits / 32, out]  codes, packed along the input, lowest bits first
//   P.qzeros   I32 [G, out * bits / 32]   each group's zero point, packed along the output
//   P.scales   F16 [G, out]               each group's scale
//   P.g_idx    I32 [in]                   the group of each input (optional: i / group_size)
// and w[o][i] = scale[g][o] * (code[i][o] - zero[g][o]) with g = g_idx[i]. In checkpoint format
// "gptq" (AutoGPTQ's, still what GPTQModel saves) the stored zero is the zero minus one;
// "gptq_v2" stores it as is (docs/quantization.md, "GPTQ checkpoints").
//
// The source shows each P as the Hugging Face `P.weight` [out, in], so the loader is unchanged:
// read() dequantizes, and read_codes() hands the codes over as Strata's rows (quant.h) when the
// policy's spec holds them: bits >= the file's, a group size dividing the file's, and groups of
// consecutive inputs (desc_act checkpoints permute them and are dequantized, then quantized at load).
#pragma once
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "strata/model/weight_source.h"

namespace strata {

struct GptqFormat {
  int bits = 4;             // 2, 4 or 8
  int group_size = 128;     // inputs per group; 0 when the whole row is one group (GPTQ's -1)
  bool zero_minus_one = true;  // checkpoint format "gptq": the stored zero is the zero minus one
  std::string source;       // the file the format was read from, for messages
};

// The GPTQ format of a Hugging Face model directory: config.json's quantization_config, else a
// quantize_config.json beside it (older AutoGPTQ checkpoints). nullopt when the model is not
// quantized. Throws naming the file and field for another quantization method (AWQ,
// bitsandbytes, ...) or a GPTQ variant Strata cannot read (3-bit codes, Marlin repacking,
// per-module `dynamic` overrides).
std::optional<GptqFormat> read_gptq_format(const std::filesystem::path& model_dir);
// The config.json part of it, on the file's text (`file` names it in errors).
std::optional<GptqFormat> gptq_format_from_config_text(const std::string& text, const std::string& file);

// The weights of a GPTQ checkpoint's safetensors (`path` as make_safetensors_source takes it).
// Every packed linear's shapes are checked here; a bad group index is reported when read.
std::unique_ptr<WeightSource> make_gptq_source(const std::filesystem::path& path, const GptqFormat& format);

// "GPTQ 4-bit, group 128" (for messages).
std::string describe_gptq(const GptqFormat& format);
// What happens to such a checkpoint's matrices, for the job's log: dequantized at load, unless a
// compress_weights policy holds their codes.
std::string gptq_load_note(const GptqFormat& format);

}  // namespace strata
