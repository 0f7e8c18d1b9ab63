// A hardware profile: what the cost model needs to know about one machine (capacities, link
// bandwidths, compute rates). `strata profile` measures it; policies/hardware/ ships examples,
// among them the FlexGen paper's T4 machine. All quantities in bytes, bytes/s and FLOP/s.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>

#include "strata/core/dtype.h"
#include <vector>

namespace strata {

// Achieved fp16 GEMM throughput as a function of the number of tokens (the GEMM's M); shapes of
// the models' projections. Evaluated by interpolating linearly in log(tokens) between points and
// holding the end values outside them.
struct GemmPoint {
  double tokens = 0;
  double flops_per_s = 0;
};

struct HardwareProfile {
  std::string name;         // e.g. "t4-paper", "h100-x1"
  std::string description;  // where the numbers come from
  // What fitted the calibrated terms below ("strata profile on the engine (...) over 7 runs"); empty:
  // the bare rates alone (a --quick profile, or one written before the profile fitted itself), whose
  // predictions run optimistic (docs/cost-model.md, "Calibration").
  std::string calibrated;
  std::string gpu_name, cpu_name;
  // The dtype the "gpu" tier computes in and keeps uncompressed weights, cache and activations
  // in: F16 on CUDA, F32 on the CPU backend standing in for a GPU. The cost model's byte counts
  // follow it.
  DType compute_dtype = DType::F16;
  // The CPU backend (compute_dtype F32): its "GPU" is the host's own cores, so work delegated to
  // the CPU runs inline on them rather than beside the compute (the cost model's pipeline).
  bool cpu_backend() const { return compute_dtype == DType::F32; }

  // Capacities (bytes) usable by Strata on each tier.
  double gpu_mem = 0, cpu_mem = 0, disk_mem = 0;

  // Links (bytes/s): pinned host-to-device and device-to-host, disk reads into and writes from
  // pinned memory through the disk store.
  double cpu_to_gpu_bw = 0, gpu_to_cpu_bw = 0, disk_to_cpu_bw = 0, cpu_to_disk_bw = 0;

  // Compute. GEMM curve on the GPU (the device the "gpu" tier computes on; the CPU backend on a
  // machine without one); attention for decode as bytes of KV cache read per second, on the GPU
  // and on the CPU (for cpu_attention); CPU fp32 FLOP/s for delegated work.
  std::vector<GemmPoint> gpu_gemm;
  // Optional (0 / empty = unknown): the hidden size h of the layers gpu_gemm was measured on, and
  // the same curve over layers of another hidden size (gpu_gemm2, h = gpu_gemm2_hidden). With
  // both, a model's GEMMs are priced at its own h, between the two curves in log h (at the nearer
  // one outside them): a GEMM's rate depends on its matrices' size as well as its rows (on the
  // 2-core VM, 4-token GEMMs of h = 2048 ran 1.46x the rate of h = 4096's, 1024-token ones 0.95x).
  double gpu_gemm_hidden = 0;
  std::vector<GemmPoint> gpu_gemm2;
  double gpu_gemm2_hidden = 0;
  double gpu_attention_bw = 0, cpu_attention_bw = 0;
  double cpu_flops = 0;
  // Optional (empty = unknown): causal prefill attention on the GPU by prompt length (`tokens`
  // holds the prompt's s), in FLOP/s of its QK^T and AV (2 s (s + 1) q_dim per sequence and layer),
  // measured over 32 heads of 128. Unknown, the cost model prices it as a GEMM of s rows over the
  // whole s x s (at s = 128 the CPU backend's own kernel takes 2.1x that, 2026-11-28).
  std::vector<GemmPoint> gpu_prefill_attention;

  // Optional (0 = unknown): seconds per token and hidden unit of a layer's elementwise work
  // outside its GEMMs and attention (two norms, two residual adds, the MLP's activation over 4h),
  // measured at h = gpu_gemm_hidden. It grows as tokens x h where the GEMMs grow as tokens x h^2,
  // so it is a larger share of a narrow model's layer (on the 2-core VM, 8.0-8.3 ns per token and
  // hidden unit at h = 4096: bench/results/2026-11-28-cpu-prefill-attention.md).
  double gpu_elementwise_s = 0;

  // Optional (0 = unknown): 4-bit (group 64) dequantization of a weight matrix on the GPU, bytes of
  // output (compute_dtype) per second; decode attention over a 4-bit (group 64) cache on the GPU
  // and on the CPU, in bytes of the uncompressed (compute_dtype) cache it stands for per second
  // (so the cost model divides the same uncompressed bytes by either rate).
  double gpu_dequant_bw = 0;
  double gpu_attention_q4_bw = 0, cpu_attention_q4_bw = 0;

  // Optional (0 = unknown): a CPU linear streaming a weight matrix for decode's few tokens (experts
  // computed where they live, cpu_experts), in bytes per second of the weights as the CPU tier keeps
  // them (compute_dtype), and over 4-bit (group 64) codes in bytes of the compute_dtype weights they
  // stand for. Unknown, the cost model falls back to cpu_attention_bw (cpu_attention_q4_bw), which
  // calibration scales for the attention lane's fixed costs and so understates a stream of rows.
  double cpu_weight_bw = 0, cpu_weight_q4_bw = 0;
  // Optional (empty = unknown): a CPU linear's FLOP/s by tokens over one [4h, h] matrix stored as
  // the CPU tier keeps weights (compute_dtype), from 1 token (a stream of rows) to 256 (sgemm): the
  // rate an expert computed on the CPU runs at with the tokens routed to it, few in decode and many
  // in prefill. Interpolated as gpu_gemm.
  std::vector<GemmPoint> cpu_gemm;
  // Optional (empty = unknown): the same linear over 4-bit (group 64) codes, in FLOP/s of the
  // multiply-adds (2 per weight and token, as cpu_gemm): 4-bit experts computed on the CPU.
  std::vector<GemmPoint> cpu_gemm_q4;
  // The weights of the matrix cpu_gemm and cpu_gemm_q4 were timed over (rows x h; 0 = unknown),
  // and optional (empty = unknown) the same two curves over a small matrix of cpu_gemm_small_params
  // weights ([1536, 2048]: an expert of Qwen3-30B-A3B's size). A call's fixed costs (the thread
  // pool's hand-off, the query's coding) weigh on a small matrix: on the 2-core VM it ran at about
  // 0.6x the large matrix's rate for 1 or 2 tokens. cpu_linear_flops prices a matrix between them.
  double cpu_gemm_params = 0;
  std::vector<GemmPoint> cpu_gemm_small, cpu_gemm_q4_small;
  double cpu_gemm_small_params = 0;

  // Calibration (0 = none; `strata bench --calibrate` fits them to measured runs, and `strata
  // profile` to its engine runs after measuring the two overheads on probes; docs/cost-model.md).
  // compute_overhead_s: seconds of compute-lane work outside the modeled GEMMs, attention and
  // dequantization (norms, residuals, sampling, launches), per layer and unit of work (a prefill
  // group or a decode GPU batch). overlap_slowdown: how far overlapped lanes fall short of perfect
  // overlap, in [0, 1]: a stage takes max(terms) + overlap_slowdown * (sum(terms) - max(terms))
  // (0: the paper's max; 1: no overlap at all, as when copies and compute share the same cores).
  // step_overhead_s: seconds of compute-lane work per unit of work and step outside every layer
  // (the embedding, the head's launches, sampling, the step's token uploads): what a whole step
  // costs beyond L times a layer, told apart from compute_overhead_s by runs of two layer counts.
  // link_interference: seconds the compute lane loses per second of link work in the same stage,
  // where copies run on the compute's own cores and memory (the CPU backend; near 0 on a GPU,
  // whose copies are DMA engines').
  double compute_overhead_s = 0;
  double step_overhead_s = 0;
  double link_interference = 0;
  double overlap_slowdown = 0;

  // FLOP/s of an fp16 GEMM with `tokens` rows (interpolated on gpu_gemm). Throws when empty.
  double gemm_flops(double tokens) const;
  // The same for the layers of a model of hidden size `hidden`: between gpu_gemm and gpu_gemm2
  // where the profile has both, gemm_flops(tokens) otherwise.
  double gemm_flops(double tokens, double hidden) const;
  // FLOP/s of causal prefill attention over a prompt of `prompt_len` (gpu_prefill_attention,
  // interpolated as gpu_gemm); 0 where the profile has no such curve.
  double prefill_attention_flops(double prompt_len) const;
  // The same on cpu_gemm and cpu_gemm_q4. Throw when empty.
  double cpu_gemm_flops(double tokens) const;
  double cpu_gemm_q4_flops(double tokens) const;
  // A CPU linear's FLOP/s with `tokens` rows over a matrix of `params` weights, stored (q4: as
  // 4-bit codes) as the CPU tier keeps them: linear in log(params) between the small matrix's curve
  // and the large one's rates (geometric), held at the nearer outside them; the large curve alone
  // where the profile has no small one. Throws when the large curve is empty.
  double cpu_linear_flops(double tokens, double params, bool q4) const;
};

// YAML round trip; parse errors name the file, the line and the field; unknown keys are errors.
// Sizes accept suffixes (parse_size), bandwidths plain numbers or "12GB/s"-style strings.
HardwareProfile load_hardware_profile(const std::filesystem::path& file);
HardwareProfile parse_hardware_profile(const std::string& yaml_text, const std::string& source_name);
std::string hardware_profile_to_yaml(const HardwareProfile& hw);

}  // namespace strata
