// LoRA adapters (PEFT's format: adapter_config.json and adapter_model.safetensors), merged into
// the weights as they are read: each adapted matrix W is served as W + s B A, s being
// lora_alpha / r (alpha / sqrt(r) with use_rslora, per module with rank_pattern / alpha_pattern), so
// the rest of Strata (the policy, the tiers, quantization, both backends) sees one ordinary model.
// One adapter per job, as llama.cpp's --lora; vLLM's per-request adapters would need the
// unmerged product at run time (docs/architecture.md, "LoRA adapters").
#pragma once
#include <filesystem>
#include <memory>
#include <string>

#include "strata/model/config.h"
#include "strata/model/weight_source.h"

namespace strata {

// What an adapter directory holds, read and checked against the base model's tensors.
struct LoraSummary {
  int rank = 0;            // adapter_config.json's r (modules may differ through rank_pattern)
  double alpha = 0;        // its lora_alpha
  bool rslora = false;
  int merged = 0;          // base tensors that get a low-rank update
  int replaced = 0;        // base tensors the adapter stores whole (trained biases, modules_to_save)
};

// `base` in the checkpoint's own names (as its container stores them, before any renaming
// source), seen through the adapter in `dir`. Refused, naming the file and key: a directory
// without adapter_config.json or adapter_model.safetensors (a .bin adapter must be converted), a
// peft_type other than LORA, variants whose product is not W + s B A (DoRA, aLoRA, ...),
// fan_in_fan_out, an adapter tensor whose module is not in the model or whose shape disagrees
// with it, a bias added to a module that has none, and any change to the embeddings or the output
// matrix of a model that ties them (PEFT would untie them).
std::unique_ptr<WeightSource> lora_source(std::unique_ptr<WeightSource> base, const std::filesystem::path& dir,
                                          const ModelConfig& cfg, LoraSummary* summary = nullptr);

// The job's log line about a merged adapter.
std::string lora_load_note(const std::filesystem::path& dir, const LoraSummary& s);

}  // namespace strata
