// WeightSource: named weight tensors in Hugging Face naming and layout, from any container
// (safetensors, GGUF, dummy). The loader asks for each tensor the config implies and converts it
// to the backend's dtype; every stored tensor must be used, so extra tensors are caught too.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/core/dtype.h"
#include "strata/model/config.h"
#include "strata/quant/quant.h"

namespace strata {

class SafetensorsSet;
class ThreadPool;

class WeightSource {
public:
  virtual ~WeightSource() = default;
  virtual std::string describe() const = 0;  // e.g. the file path, for error messages
  virtual bool contains(const std::string& name) const = 0;
  virtual std::vector<int64_t> shape(const std::string& name) const = 0;  // throws naming a missing tensor
  virtual std::vector<std::string> names() const = 0;

  // Writes the tensor, converted to dst_dtype (F32, F16 or BF16), into dst (numel elements).
  // With a pool, a source whose conversion is work per row (GGUF's block types, GPTQ/AWQ codes)
  // spreads the rows over it; the values do not depend on it.
  void read(const std::string& name, DType dst_dtype, void* dst, ThreadPool* pool = nullptr) const {
    read_into(name, dst_dtype, dst, pool);
  }
  // Writes a matrix as quantized rows of `spec` (quant.h) straight from the codes it is stored
  // with, when they fit: a GGUF file's 4-bit types at {4 or 8 bits, group 32}, its 5- and 8-bit
  // ones at {8, 32}. The values are then the file's own, not quantized a second time. Returns
  // false, dst unspecified, when they do not fit; the caller quantizes what read() gives.
  bool read_codes(const std::string& name, const quant::QuantSpec& spec, void* dst, ThreadPool* pool = nullptr) const {
    return read_codes_into(name, spec, dst, pool);
  }
  // The spec under which read_codes() keeps the most of the stored codes (GPTQ/AWQ: its bits,
  // the largest group of Strata's dividing its groups; GGUF: {4, 32} when every coded matrix is
  // 4-bit, else {8, 32}; MXFP4 experts: {8, 32}); nullopt for a source without codes.
  virtual std::optional<quant::QuantSpec> codes_spec() const { return std::nullopt; }

protected:
  virtual void read_into(const std::string& name, DType dst_dtype, void* dst, ThreadPool* pool) const = 0;
  virtual bool read_codes_into(const std::string& name, const quant::QuantSpec& spec, void* dst,
                               ThreadPool* pool) const {
    (void)name, (void)spec, (void)dst, (void)pool;
    return false;
  }
};

// A .safetensors file, an index json, or a directory holding either.
std::unique_ptr<WeightSource> make_safetensors_source(const std::filesystem::path& path);
// The same over files already mapped (the GPTQ/AWQ source shares them; `path` names them).
std::unique_ptr<WeightSource> make_safetensors_source(std::shared_ptr<const SafetensorsSet> set,
                                                      const std::filesystem::path& path);
// Shows Phi-3's fused qkv_proj and gate_up_proj as LLaMA's q/k/v_proj and gate/up_proj (rows cut
// out on reading); any other tensor passes through. Without fused tensors it changes nothing.
std::unique_ptr<WeightSource> split_fused_projections(std::unique_ptr<WeightSource> inner, const ModelConfig& cfg);
// Partial or interleaved rotary (ModelConfig::rotary_dim, rope_interleaved; Phi-4-mini, GLM): each
// q/k head's rows reordered so that its rotated pairs are (i, i + d/2) and its passing dims meet
// the zero frequencies of rope_inv_freq's table, and the query's passing rows divided by
// LongRoPE's attention factor squared (rotary_layout_source.cpp). Over a source showing LLaMA's
// q_proj / k_proj (split_fused_projections'); `inner` itself for LLaMA's layout.
std::unique_ptr<WeightSource> rotary_layout_source(std::unique_ptr<WeightSource> inner, const ModelConfig& cfg);
// Granite's residual_multiplier (ModelConfig::residual_multiplier) folded into o_proj and down_proj,
// whose outputs are the residual branches (residual_scale_source.cpp); `inner` itself when it is 1.
std::unique_ptr<WeightSource> residual_scale_source(std::unique_ptr<WeightSource> inner, const ModelConfig& cfg);
// Gemma's safetensors checkpoints: norms shown as 1 + the stored w (Gemma's RMSNorm), a
// multimodal Gemma 3's text tensors under LLaMA's names and its vision tensors hidden
// (gemma_source.cpp). For configs with norm_plus_one.
std::unique_ptr<WeightSource> gemma_source(std::unique_ptr<WeightSource> inner);
// GPT-OSS's safetensors checkpoint at `path`: each layer's fused experts (gate_up_proj,
// down_proj and their biases, as floats or MXFP4 blocks and scales) shown as each expert's
// tensors under Qwen3-MoE's names (gpt_oss_source.cpp); other tensors as stored. MXFP4 matrices
// are also read_codes() at {8 bits, group 32}, exactly; `mxfp4`, when given, is set to whether
// any are stored so.
std::unique_ptr<WeightSource> gpt_oss_source(const std::filesystem::path& path, const ModelConfig& cfg,
                                             bool* mxfp4 = nullptr);
// The line a job logs about a GPT-OSS checkpoint with MXFP4 experts: which policy keeps them.
std::string mxfp4_load_note();
// Deterministic small random values for every tensor the config implies; fast, no files.
std::unique_ptr<WeightSource> make_dummy_source(const ModelConfig& cfg, uint64_t seed = 0);

}  // namespace strata
