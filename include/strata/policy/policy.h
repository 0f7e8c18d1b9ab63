// A placement policy (docs/design.md, "The policy"): batch shape, the percentage of weights, KV
// cache and activations on each tier, and the on/off options. Read from and written to one YAML
// file.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

namespace strata {

struct TierSplit {  // percent of a tensor class on each tier; sums to 100
  int gpu = 100, cpu = 0, disk = 0;
};

struct Compression {  // group-wise quantization
  int bits = 4;
  int group_size = 64;
};

struct Policy {
  int gpu_batch_size = 1;   // sequences per GPU batch
  int num_gpu_batches = 1;  // GPU batches per block
  TierSplit weights, kv_cache, activations;
  // Mixtures of experts: where each layer's MLP half (its router and experts) lives, apart from
  // its attention half, which `weights` then places alone (docs/moe.md, "Experts placed apart").
  // Unset: the whole layer follows `weights`.
  std::optional<TierSplit> expert_weights;
  bool overlap = true;        // overlap I/O with compute
  bool cpu_attention = false; // decode attention on the CPU where the KV cache lives there
  // Mixtures of experts: in which phases a layer whose weights live on the CPU tier computes its
  // MLP half (router and experts) on the CPU, over its pinned home, instead of moving it to the
  // GPU (docs/moe.md, "Experts computed where they live"). Few tokens touch few experts, so a
  // decode step reads a fraction of what moving the half would copy; a prefill touches them all.
  bool cpu_experts_prefill = false, cpu_experts_decode = false;
  std::optional<Compression> compress_weights, compress_kv_cache;
  // Tokens per prefill step (the GPU workspace holds one step); 0: kDefaultPrefillTokens.
  int prefill_tokens = 0;
  // Staggered prefill: the GPU batches that start (prefill) in each token step of the block; 0
  // starts them all in the first step (FlexGen's schedule). Batch k starts at step k / this, so
  // the last batches prefill while the first ones decode: prefill's compute hides under an
  // I/O-bound decode, for one more weight read per added step (docs/offload.md).
  int prefill_batches_per_step = 0;

  int block_size() const { return gpu_batch_size * num_gpu_batches; }
  bool cpu_experts(bool prefill) const { return prefill ? cpu_experts_prefill : cpu_experts_decode; }
  // The token step in which GPU batch k prefills, and the steps over which the block's batches start.
  int start_step(int k) const { return prefill_batches_per_step > 0 ? k / prefill_batches_per_step : 0; }
  int start_steps() const { return start_step(num_gpu_batches - 1) + 1; }
  int prefill_step_tokens() const { return prefill_tokens > 0 ? prefill_tokens : kDefaultPrefillTokens; }

  // Large enough for full-rate GEMMs on every GPU we target (a T4 saturates near 256 tokens, an
  // H100 near 512), small against any budget: 1024 x 13 x hidden x 2 bytes is 330 MB for OPT-175B.
  static constexpr int kDefaultPrefillTokens = 1024;
};

// How prefill is cut (the rule the runtime and the cost model share): groups of `seqs` whole
// prompts of one GPU batch, as many as fit the policy's prefill step, at least one; steps of at
// most `step_tokens` tokens, also the GPU workspace's size (a decode step of gbs tokens included).
struct PrefillSteps {
  int seqs = 1;
  int64_t step_tokens = 1;
};
PrefillSteps prefill_steps(const Policy& p, int prompt_len);

// Parses and validates; errors name the source, the line and the field.
// The YAML spelling of the two cpu_experts flags: none, decode, prefill or both.
const char* cpu_experts_name(const Policy& p);

Policy parse_policy(const std::string& yaml_text, const std::string& source_name = "<policy>");
Policy load_policy(const std::filesystem::path& file);
std::string policy_to_yaml(const Policy& p);


}  // namespace strata
