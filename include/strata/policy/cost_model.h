// The cost model of FlexGen (section 4.3 and its appendix; docs/design.md, "The cost model and the
// search"; every term is defined in docs/cost-model.md): for a model, a policy, a workload and a
// machine, the time of one block and the peak memory on each tier. It runs nothing.
//
// Every time term and every memory term is linear in the placement fractions, so one set of
// linear forms serves both `evaluate` (a dot product) and the search's LP (rows of constraints).
#pragma once
#include <array>

#include "strata/model/config.h"
#include "strata/policy/placement.h"
#include "strata/policy/policy.h"
#include "strata/profile/hardware.h"

namespace strata {

struct Workload {
  int prompt_len = 512;  // s: tokens of every prompt in the block
  int gen_len = 32;      // n: tokens generated for every sequence
};

// The placement fractions: weights (w), KV cache (c), activations (h) on gpu/cpu/disk, and a
// mixture of experts' MLP halves placed apart (m: expert_weights). The forms use m only where the
// search chooses that split (ExpertSplit::Free); otherwise w places the MLP halves too (tied), or
// the policy's expert_weights fixes them (constants).
enum Var : int { WG, WC, WD, CG, CC, CD, HG, HC, HD, MG, MC, MD, kNumVars };
using Fractions = std::array<double, kNumVars>;
const char* var_name(int v);  // "wg", "wc", ...

// The policy's percentages / 100 (m from expert_weights, 0 without).
Fractions requested_fractions(const Policy& p);
// What the runtime realizes (placement.h): whole layers of weights and KV cache (and of MLP halves
// placed apart), whole GPU batches of activations, per tier (assign_tiers), as fractions.
Fractions realized_fractions(const Policy& p, int n_layers);

// constant + sum_i coef[i] * x[i]
struct LinearForm {
  double constant = 0;
  Fractions coef{};
  double at(const Fractions& x) const;
};

// The six terms of one stage: the four links, the GPU's compute, and the attention delegated to
// the CPU (cpu_attention's decode; a lane of its own beside the GPU's).
enum Term : int { CTOG, GTOC, DTOC, CTOD, COMP, CATT, kNumTerms };
const char* term_name(int t);  // "ctog", "gtoc", "dtoc", "ctod", "comp", "catt"

// COMP and CATT as the engine's pipeline runs them over `batches` GPU batches (docs/cost-model.md,
// "CPU attention"): while the CPU attends for one batch, the GPU runs the other batches'
// projections, but the MLP half and the LM head (`serial_share` of COMP) wait for the last batch's
// attention. max(COMP + CATT / n, CATT + COMP * (s + (1 - s) / n)); COMP alone without CATT.
double compute_stage(double comp, double catt, double batches, double serial_share);

// The distinct experts a step of `tokens` tokens activates in expectation when each picks k of
// `experts` uniformly: experts (1 - (1 - k / experts)^tokens). A trained router is not uniform, so
// the runtime's count (GenStats::routing) is at most this, and lower where tokens agree.
double expected_active_experts(int experts, int k, double tokens);

// Bytes of fp16 elements stored with group-wise quantization: bits/8 per element plus a 2-byte
// minimum and a 2-byte scale per group (FlexGen's format). Without compression: 2.
double stored_bytes_per_element(const std::optional<Compression>& c);

// The quantities the terms are built from, for one batch shape and options.
struct CostSizes {
  double layer_weights = 0;       // W: one layer's weights as stored (compression applied)
  double layer_weights_fp16 = 0;  // the same in fp16: what the GPU computes with
  double dequant_buffer = 0;      // compressed weights: the larger half-layer in fp16 (the runtime's buffer)
  double global_weights = 0;      // embeddings, positions, final norm, head: fp16, always on the GPU
  double layer_flops_per_token = 0;  // 2 per matmul parameter of one layer
  double attention_flops_per_token = 0;  // the part of it in the attention half (q, k, v, o)
  double kv_per_token = 0;        // K and V of one token of one sequence in one layer, as stored
  double kv_per_token_fp16 = 0;
  double hidden_per_token = 0;    // one hidden state (fp16; activations are never compressed)
  double cache_avg = 0;           // C: KV cache of one layer read per decode step, whole block, as stored
  double cache_capacity = 0;      // KV cache of one layer at s + n tokens, whole block, as stored
  // The share of cache_avg a decode step's attention reads, over the layers: 1, or less where
  // sliding-window layers (Gemma, GPT-OSS) read only their window of an average context s + n / 2.
  // The cache is still stored whole; an offloaded one is moved (and read from disk) within the
  // windows.
  double attended_fraction = 1;
  double act_prefill = 0;         // hidden states of the block after one layer in prefill
  double act_decode = 0;          // ... in one decode step
  double prefill_seqs = 1;        // prompts per prefill group (policy.h, prefill_steps)
  double step_tokens = 0;         // tokens of the largest step: the GEMMs' rows in prefill
  double workspace = 0;           // the forward pass's GPU buffers, sized for one step
  // The MLP half: stored and in the compute dtype, and 2 per parameter one token multiplies by.
  double mlp_weights = 0, mlp_weights_fp16 = 0, mlp_flops_per_token = 0;
  // Mixtures of experts: one expert's matrices and the router, in the compute dtype and in
  // parameters.
  double expert_weights_fp16 = 0, router_weights_fp16 = 0;
  double expert_params = 0, router_params = 0;
  double expert_flops_per_token = 0;  // the k experts' part of layer_flops_per_token (2 k expert_params)
};

// Bytes per second of compute-dtype weights a CPU linear streams for a few tokens: the profile's
// cpu_weight_bw (cpu_weight_q4_bw over 4-bit codes), or, where the profile lacks them, its CPU
// attention rate (the same dot products of fp32 rows with stored rows, but calibrated for the
// attention lane's fixed costs: an understatement, bench/results/2026-11-27-cpu-moe.md).
double cpu_weight_rate(const HardwareProfile& hw, bool compressed);

// Seconds for the CPU to compute one MoE layer's MLP half over a step of `tokens` tokens where its
// weights live (policy cpu_experts; docs/cost-model.md "Experts on the CPU"). With the profile's
// cpu_gemm curve: the router's GEMM over the tokens, and each expert those tokens activate in
// expectation (expected_active_experts) over the tokens routed to it, tokens x k / E_act, at the
// curve's rate for that many. Without it, or over 4-bit experts: the roofline of reading the router
// and the active experts at cpu_weight_rate and their FLOPs at cpu_flops.
double cpu_experts_seconds(const ModelConfig& cfg, const CostSizes& z, double tokens, bool compressed,
                           const HardwareProfile& hw);

// How the forms price a mixture of experts' MLP halves placed apart: at the policy's
// expert_weights, as constants (evaluate), or as the fractions mg, mc, md, a second weight class
// beside wg, wc, wd for the search's LP to choose (the policy's expert_weights is then not used).
// For a dense model both are the tied forms.
enum class ExpertSplit { Fixed, Free };

// The linear forms for one (gpu_batch_size, num_gpu_batches, options); the policy's fractions
// are not used. Times are seconds per layer for the whole block. Peaks are bytes per tier: the
// runtime reserves every buffer before the first step, so prefill and decode share one peak.
struct CostForms {
  int n_layers = 0, gen_len = 0, block_size = 0;
  int num_gpu_batches = 1;
  int prefill_batches_per_step = 0;  // the policy's (policy.h); the terms do not depend on it
  DType dtype = DType::F16;  // the profile's compute dtype: the runtime plan's too
  bool experts_free = false;  // the MLP halves' fractions mg, mc, md are variables (ExpertSplit::Free)
  bool overlap = true;
  double overlap_slowdown = 0;  // the profile's: a stage is max + slowdown * (sum - max) of its terms
  // The share of the GPU's decode work that waits for delegated attention: the MLP half and the
  // LM head, by their FLOPs (compute_stage).
  double comp_serial_share = 1;
  CostSizes sizes;
  std::array<LinearForm, kNumTerms> prefill, decode;
  // Each term as fixed + num_gpu_batches * per batch: the fixed part is the weights' (their reads
  // and the dequantization of compressed weights, once per step whatever the batches), the per
  // batch part the rest. A staggered schedule's super-steps are built from them.
  std::array<LinearForm, kNumTerms> prefill_fixed, prefill_batch, decode_fixed, decode_batch;
  std::array<LinearForm, 3> peak;  // indexed by Tier (gpu, cpu, disk)

  // Whether predict runs the staggered schedule: some GPU batches start after the first step.
  bool staggered() const { return prefill_batches_per_step > 0 && prefill_batches_per_step < num_gpu_batches; }
};
CostForms cost_forms(const ModelConfig& cfg, const Policy& shape, const Workload& w, const HardwareProfile& hw,
                     ExpertSplit experts = ExpertSplit::Fixed);

struct StageTime {
  std::array<double, kNumTerms> terms{};
  double compute = 0;  // COMP and CATT together (compute_stage)
  // With overlap: max + slowdown * (sum - max) over the four links and `compute`; without, the
  // sum of the six terms.
  double total = 0;
  int bound = COMP;  // the largest of the links and `compute` (COMP or CATT, the larger, for it)
};

// One stage of `terms` (seconds per layer) over `batches` GPU batches. With overlap:
// max + slowdown * (sum - max) over the links and the compute pipeline (the profile's calibrated
// shortfall; 0 is the paper's max); without: the sum of the terms, every lane in turn.
StageTime stage_time(const std::array<double, kNumTerms>& terms, const CostForms& F, double batches);

// One layer's terms of a step in which `prefilling` GPU batches prefill and `decoding` decode
// (fractions allowed: refill's steady state): the weights' part once, the per-batch parts per batch.
std::array<double, kNumTerms> mixed_step_terms(const CostForms& F, const Fractions& x, double prefilling,
                                               double decoding);

// Staggered (CostForms::staggered) the block runs super-steps (docs/cost-model.md "Staggered
// prefill"): `prefill` is then the first super-step (its batches prefilling alone), `decode` the
// first super-step with the most batches decoding (the schedule's steady state, any batches
// prefilling in it included); prefill_s sums the super-steps in which some batch prefills,
// decode_s the others.
struct Prediction {
  Fractions fractions{};        // the placement evaluated
  StageTime prefill, decode;    // T_pre and T_gen: one layer
  double prefill_s = 0;         // T_pre * l
  double decode_s = 0;          // T_gen * (n - 1) * l
  double total_s = 0;           // T: one block
  double throughput_tok_s = 0;  // block_size * n / T
  double latency_s = 0;         // T: every sequence of a block finishes at the block's end
  TierBytes peak;
};

// `x` is taken as given (continuous fractions: the LP's view).
Prediction predict(const CostForms& forms, const Fractions& x);
// The same forms for another prefill_batches_per_step (cheap: the terms do not change).
CostForms with_stagger(CostForms forms, int prefill_batches_per_step);
// Each term summed over a block's steps, per layer, split as the engine's report splits its lane
// busy times: the steps in which some GPU batch prefills, and the others. Unstaggered: the prefill
// terms, and the decode terms times gen_len - 1; staggered: the super-steps' sums (calibration
// compares them with the measured lanes).
struct PhaseTerms {
  std::array<double, kNumTerms> prefill{}, decode{};
};
PhaseTerms phase_terms(const CostForms& forms, const Fractions& x);
// The runtime's view: the policy's fractions realized at layer granularity.
Prediction evaluate(const ModelConfig& cfg, const Policy& p, const Workload& w, const HardwareProfile& hw);

}  // namespace strata
