// FlexGen's cost model as linear forms in the placement fractions (docs/cost-model.md).
#include "strata/policy/cost_model.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "strata/backend/cpu_linear.h"
#include "strata/core/error.h"
#include "strata/runtime/forward_ops.h"

namespace strata {

const char* var_name(int v) {
  static const char* names[kNumVars] = {"wg", "wc", "wd", "cg", "cc", "cd", "hg", "hc", "hd", "mg", "mc", "md"};
  return names[v];
}

const char* term_name(int t) {
  static const char* names[kNumTerms] = {"ctog", "gtoc", "dtoc", "ctod", "comp", "catt"};
  return names[t];
}

double compute_stage(double comp, double catt, double batches, double serial_share) {
  if (catt <= 0) return comp;
  return std::max(comp + catt / batches, catt + comp * (serial_share + (1 - serial_share) / batches));
}

double LinearForm::at(const Fractions& x) const {
  double v = constant;
  for (int i = 0; i < kNumVars; ++i) v += coef[i] * x[i];
  return v;
}

double expected_active_experts(int experts, int k, double tokens) {
  if (experts <= 0 || k <= 0 || tokens <= 0) return 0;
  const double e = experts;
  return e * (1.0 - std::pow(1.0 - std::min(double(k), e) / e, tokens));
}

double stored_bytes_per_element(const std::optional<Compression>& c) {
  if (!c) return 2.0;
  return c->bits / 8.0 + 4.0 / c->group_size;  // packed values + fp16 min and scale per group
}

Fractions requested_fractions(const Policy& p) {
  auto f = [](int pct) { return pct / 100.0; };
  const TierSplit m = p.expert_weights.value_or(TierSplit{0, 0, 0});
  return {f(p.weights.gpu),     f(p.weights.cpu),     f(p.weights.disk),     f(p.kv_cache.gpu),
          f(p.kv_cache.cpu),    f(p.kv_cache.disk),   f(p.activations.gpu),  f(p.activations.cpu),
          f(p.activations.disk), f(m.gpu),            f(m.cpu),              f(m.disk)};
}

Fractions realized_fractions(const Policy& p, int n_layers) {
  Fractions x{};
  auto count = [&](const TierSplit& split, int units, int first) {
    for (Tier t : assign_tiers(units, split)) x[first + int(t)] += 1.0 / units;
  };
  count(p.weights, n_layers, WG);
  count(p.kv_cache, n_layers, CG);
  count(p.activations, p.num_gpu_batches, HG);
  if (p.expert_weights) count(*p.expert_weights, n_layers, MG);
  return x;
}

namespace {

void check_inputs(const ModelConfig& cfg, const Policy& p, const Workload& w, const HardwareProfile& hw) {
  if (w.prompt_len < 1 || w.gen_len < 1)
    STRATA_FAIL("cost model: prompt length and generation length must be at least 1, got " << w.prompt_len << " and "
                                                                                            << w.gen_len);
  if (p.gpu_batch_size < 1 || p.num_gpu_batches < 1) STRATA_FAIL("cost model: batch sizes must be at least 1");
  if (cfg.n_layers < 1 || cfg.hidden < 1) STRATA_FAIL("cost model: model " << cfg.name << " has no layers");
  auto positive = [&](double v, const char* field) {
    if (!(v > 0)) STRATA_FAIL("hardware profile " << hw.name << ": " << field << " must be positive for the cost model");
  };
  positive(hw.cpu_to_gpu_bw, "cpu_to_gpu_bw");
  positive(hw.gpu_to_cpu_bw, "gpu_to_cpu_bw");
  positive(hw.disk_to_cpu_bw, "disk_to_cpu_bw");
  positive(hw.cpu_to_disk_bw, "cpu_to_disk_bw");
  positive(hw.gpu_attention_bw, "gpu_attention_bw");
  positive(hw.cpu_attention_bw, "cpu_attention_bw");
  if (cfg.moe() && (p.cpu_experts_prefill || p.cpu_experts_decode)) positive(hw.cpu_flops, "cpu_flops");
  if (hw.gpu_gemm.empty()) STRATA_FAIL("hardware profile " << hw.name << ": gpu_gemm has no points");
}

// `dt`: the compute dtype (the profile's): what an uncompressed element takes (the "_fp16" sizes
// are in it: fp16 on a GPU, fp32 on the CPU backend).
CostSizes sizes_of(const ModelConfig& cfg, const Policy& p, const Workload& w, DType dt) {
  const double s = w.prompt_len, n = w.gen_len, gbs = p.gpu_batch_size, bls = p.block_size();
  const double h = cfg.hidden, q = cfg.q_dim(), kv = cfg.kv_dim(), f = cfg.intermediate;
  const double e = double(dtype_size(dt));
  const double rw = p.compress_weights ? stored_bytes_per_element(p.compress_weights) / e : 1.0;  // stored / uncompressed
  const double rc = p.compress_kv_cache ? stored_bytes_per_element(p.compress_kv_cache) / e : 1.0;
  CostSizes z;
  z.layer_weights_fp16 = e * double(cfg.layer_param_count());
  z.layer_weights = rw * z.layer_weights_fp16;
  const double attn_params = h * (q + 2 * kv) + q * h;
  // The MLP half's matrices, and those one token multiplies by: a mixture of experts stores all
  // its experts (and the router) but runs each token through k of them (ForwardOps).
  double mlp_params = (cfg.gated_mlp() ? 3 : 2) * h * f, mlp_token_params = mlp_params;
  if (cfg.moe()) {
    const double experts = cfg.n_experts, fe = cfg.expert_intermediate;
    mlp_params = experts * 3 * h * fe + experts * h;
    mlp_token_params = cfg.experts_per_token * 3 * h * fe + experts * h;
  }
  z.dequant_buffer = e * std::max(attn_params, mlp_params);
  z.mlp_weights_fp16 = e * mlp_params;
  z.mlp_weights = rw * z.mlp_weights_fp16;
  z.mlp_flops_per_token = 2.0 * mlp_token_params;
  if (cfg.moe()) {
    z.expert_params = 3.0 * h * cfg.expert_intermediate;
    z.router_params = double(cfg.n_experts) * h;
    z.expert_flops_per_token = 2.0 * cfg.experts_per_token * z.expert_params;
    z.expert_weights_fp16 = e * z.expert_params;
    z.router_weights_fp16 = e * z.router_params;
  }
  z.global_weights = e * double(cfg.global_param_count());
  z.layer_flops_per_token = 2.0 * (attn_params + mlp_token_params);
  z.attention_flops_per_token = 2.0 * attn_params;
  z.kv_per_token_fp16 = 2.0 * e * kv;  // K and V, uncompressed
  z.kv_per_token = rc * z.kv_per_token_fp16;
  z.hidden_per_token = e * h;
  z.cache_avg = bls * (s + n / 2.0) * z.kv_per_token;  // the context grows from s to s + n
  z.cache_capacity = bls * (s + n) * z.kv_per_token;
  if (!cfg.window_layers.empty() && cfg.layer_window > 0) {
    const double context = s + n / 2.0, windowed = double(cfg.window_layers.size());
    const double read = std::min(1.0, cfg.layer_window / std::max(context, 1.0));
    z.attended_fraction = (cfg.n_layers - windowed + windowed * read) / cfg.n_layers;
  }
  z.act_prefill = bls * s * z.hidden_per_token;
  z.act_decode = bls * z.hidden_per_token;
  // The runtime's own workspace (its attention never materializes the scores), sized for its
  // largest step: a prefill step of whole prompts (policy.h, prefill_steps) or a decode step.
  const PrefillSteps steps = prefill_steps(p, w.prompt_len);
  z.prefill_seqs = steps.seqs;
  z.step_tokens = double(steps.step_tokens);
  z.workspace = double(ForwardOps::workspace_bytes(cfg, dt, steps.step_tokens, int64_t(gbs)));
  return z;
}

}  // namespace

double cpu_weight_rate(const HardwareProfile& hw, bool compressed) {
  if (compressed && hw.cpu_weight_q4_bw > 0) return hw.cpu_weight_q4_bw;
  if (!compressed && hw.cpu_weight_bw > 0) return hw.cpu_weight_bw;
  // A profile without the weight rates (older, or hand-written): the CPU attention lane's.
  return compressed && hw.cpu_attention_q4_bw > 0 ? hw.cpu_attention_q4_bw : hw.cpu_attention_bw;
}

double cpu_experts_seconds(const ModelConfig& cfg, const CostSizes& z, double tokens, bool compressed,
                           const HardwareProfile& hw) {
  const double active = expected_active_experts(cfg.n_experts, cfg.experts_per_token, tokens);
  const std::vector<GemmPoint>& expert_curve = compressed ? hw.cpu_gemm_q4 : hw.cpu_gemm;
  if (!expert_curve.empty()) {
    const double per_expert = tokens * cfg.experts_per_token / active;  // active * per_expert = tokens k
    // The router stays in the compute dtype when the experts are codes (docs/moe.md). Each matrix
    // at its own size's rate: an expert's gate and up [2f, h] and its down [h, f]. Experts that
    // the CPU backend streams (cpu_linear.h) run together, one parallel region per kind of matrix
    // (Backend::linears), which reads like one matrix of all the active experts' weights: over
    // codes up to 24 tokens each, over 16-bit weights (a GPU host's) up to 8. Over fp32 (the CPU
    // backend's) a single token goes to sgemv alone, so there they run together from a mean of 2.
    const double router_flops = hw.cpu_linear_flops(tokens, z.router_params, hw.cpu_gemm.empty());
    const double h = cfg.hidden, f = cfg.expert_intermediate, routed = tokens * cfg.experts_per_token;
    const bool streamed = compressed ? per_expert <= double(cpu_linear::kCodesMaxTokens)
                                     : per_expert <= double(cpu_linear::kStreamingMaxTokens) &&
                                           (!hw.cpu_backend() || per_expert >= 2.0);
    const double together = streamed ? active : 1.0;
    return 2.0 * tokens * z.router_params / router_flops +
           2.0 * routed * (2 * f * h) / hw.cpu_linear_flops(per_expert, together * 2 * f * h, compressed) +
           2.0 * routed * (h * f) / hw.cpu_linear_flops(per_expert, together * h * f, compressed);
  }
  const double bw = cpu_weight_rate(hw, compressed);
  const double read = (z.router_weights_fp16 + active * z.expert_weights_fp16) / bw;
  return std::max(read, tokens * z.mlp_flops_per_token / hw.cpu_flops);
}

namespace {

// Adds `seconds` (or bytes) per unit of each fraction in `vars` to `form`.
void add(LinearForm& form, double seconds, std::initializer_list<int> vars) {
  for (int v : vars) form.coef[v] += seconds;
}

// to += k * from.
void add_scaled(LinearForm& to, const LinearForm& from, double k) {
  if (k == 0) return;
  to.constant += k * from.constant;
  for (int v = 0; v < kNumVars; ++v) to.coef[v] += k * from.coef[v];
}

// The forms of cost_forms without their split by GPU batches.
CostForms unsplit_forms(const ModelConfig& cfg, const Policy& p, const Workload& w, const HardwareProfile& hw,
                        ExpertSplit experts) {
  CostForms F;
  F.n_layers = cfg.n_layers;
  F.gen_len = w.gen_len;
  F.block_size = p.block_size();
  F.num_gpu_batches = p.num_gpu_batches;
  F.prefill_batches_per_step = p.prefill_batches_per_step;
  F.overlap = p.overlap;
  F.overlap_slowdown = hw.overlap_slowdown;
  F.dtype = hw.compute_dtype;
  const CostSizes z = F.sizes = sizes_of(cfg, p, w, hw.compute_dtype);
  const double e = double(dtype_size(hw.compute_dtype));

  const double s = w.prompt_len, n = w.gen_len, l = cfg.n_layers, h_dim = cfg.hidden;
  const double gbs = p.gpu_batch_size, ngb = p.num_gpu_batches, bls = p.block_size();
  const bool cw = p.compress_weights.has_value(), cc = p.compress_kv_cache.has_value();
  const bool cpu_attn = p.cpu_attention;
  // Dequantization streams bytes through GPU memory like decode attention does; use that rate
  // when the profile has no measured one.
  const double dequant_bw = hw.gpu_dequant_bw > 0 ? hw.gpu_dequant_bw : hw.gpu_attention_bw;
  const double ctog = hw.cpu_to_gpu_bw, gtoc = hw.gpu_to_cpu_bw, dtoc = hw.disk_to_cpu_bw, ctod = hw.cpu_to_disk_bw;

  const double W = z.layer_weights;
  const double cache_prefill = bls * s * z.kv_per_token;  // the prompt's K and V, written once
  const double cache_new = bls * z.kv_per_token;          // one decode step's K and V
  const double cache_avg_fp16 = z.cache_avg / (z.kv_per_token / z.kv_per_token_fp16);
  // What a decode step loads of an offloaded cache: a sliding-window layer's window only
  // (load_range, engine_transfers.cpp), as its attention reads.
  const double cache_read = z.cache_avg * z.attended_fraction;
  const double Ap = z.act_prefill, Ag = z.act_decode;
  // The runtime steps through a layer's attention and MLP blocks separately (its weights stream
  // half by half), so an offloaded hidden state goes out and comes back twice per layer.
  const double Ap_moved = 2 * Ap, Ag_moved = 2 * Ag;

  // Prefill of one layer. Weights not on the GPU cross PCIe (from disk through the CPU); the
  // prompt's KV cache and the hidden states go out to their tiers and the hidden states come back
  // for the next layer. Attention runs on the GPU (FlexGen delegates only decode attention).
  // Experts computed where they live (cpu_experts): in the phases it names, a layer on the CPU
  // tier moves only its attention half; its hidden rows cross to the host and back instead, and
  // the CPU lane (CATT) computes the MLP half while the GPU computes the rest
  // (docs/cost-model.md, "Experts on the CPU").
  const bool experts_p = cfg.moe() && p.cpu_experts_prefill, experts_d = cfg.moe() && p.cpu_experts_decode;
  // A layer's weights as its two halves: the attention half Wa follows the fractions wg, wc, wd;
  // the MLP half Wm too, unless a mixture of experts' MLP halves are placed apart: at the
  // policy's expert_weights, whose tiers are then fixed (the runtime's whole layers), constants
  // here; or, for the search, at fractions of their own, mg, mc, md.
  const double Wm = z.mlp_weights, Wa = W - Wm;
  const bool free = cfg.moe() && experts == ExpertSplit::Free;
  const bool fixed = cfg.moe() && p.expert_weights.has_value() && !free;
  F.experts_free = free;
  const int mlp_vars = free ? MG : WG;  // the MLP halves' fractions on gpu, cpu, disk, unless fixed
  std::array<double, 3> xm{};  // the MLP halves' realized fractions, when fixed
  if (fixed)
    for (Tier t : assign_tiers(cfg.n_layers, *p.expert_weights)) xm[size_t(t)] += 1.0 / l;
  // Adds `v` per unit of MLP halves on tier t: a coefficient of their fraction there, or a constant.
  auto add_mlp = [&](LinearForm& f, double v, Tier t) {
    if (fixed) f.constant += v * xm[size_t(t)];
    else f.coef[mlp_vars + int(t)] += v;
  };
  auto& P = F.prefill;
  add(P[CTOG], Wa / ctog, {WC, WD});
  add_mlp(P[CTOG], Wm / ctog, Tier::Disk);
  if (!experts_p) add_mlp(P[CTOG], Wm / ctog, Tier::Cpu);
  add(P[CTOG], Ap_moved / ctog, {HC, HD});
  add(P[GTOC], cache_prefill / gtoc, {CC, CD});
  add(P[GTOC], Ap_moved / gtoc, {HC, HD});
  add(P[DTOC], Wa / dtoc, {WD});
  add_mlp(P[DTOC], Wm / dtoc, Tier::Disk);
  add(P[DTOC], Ap_moved / dtoc, {HD});
  add(P[CTOD], cache_prefill / ctod, {CD});
  add(P[CTOD], Ap_moved / ctod, {HD});
  // Attention (QK^T and AV per head): over the causal half at the profile's measured prefill rate,
  // or, in a profile without one, as GEMMs of s rows over the whole s x s.
  const double prefill_attention = hw.gpu_prefill_attention.empty()
                                       ? 4.0 * s * s * cfg.q_dim() / hw.gemm_flops(s, h_dim)
                                       : 2.0 * s * (s + 1) * cfg.q_dim() / hw.prefill_attention_flops(s);
  // A layer's elementwise work (norms, residual adds, the activation) for each token, at the
  // profile's measured seconds per token and hidden unit (0 in a profile without it).
  const double elementwise_per_token = hw.gpu_elementwise_s * h_dim;
  // The GEMMs of `tokens` tokens that run `rows` at a time. A mixture of experts' experts run
  // over the rows routed to each: rows k / E_act(rows) on average (ForwardOps), where the GEMM
  // reads an expert's weights for far fewer rows than the step's. Not where a compressed decode
  // step reads the codes in the fused linear (gbs within its limit): there the GEMM term over the
  // step's rows stands for it, as for every other matrix (the profile has no GPU curve over codes).
  const bool fused_codes = cw && gbs <= double(quant::kCudaFusedDequantMaxTokens);
  const auto gemm_seconds = [&](double tokens, double flops_per_token, double rows, bool by_expert = true) {
    const double expert_flops = by_expert ? z.expert_flops_per_token : 0;  // every caller's flops include them
    double seconds = tokens * (flops_per_token - expert_flops) / hw.gemm_flops(rows, h_dim);
    if (expert_flops > 0) {
      const double per_expert =
          rows * cfg.experts_per_token / expected_active_experts(cfg.n_experts, cfg.experts_per_token, rows);
      seconds += tokens * expert_flops / hw.gemm_flops(per_expert, h_dim);
    }
    return seconds;
  };
  const double prefill_rows = std::min(z.step_tokens, gbs * s);
  P[COMP].constant = gemm_seconds(bls * s, z.layer_flops_per_token, prefill_rows) + bls * prefill_attention +
                     bls * s * elementwise_per_token;
  if (cw) P[COMP].constant += z.layer_weights_fp16 / dequant_bw;
  // The LM head runs after the last layer on the logit rows (a prefill group's last tokens, a
  // decode step's GPU batch): a per-step cost, spread over the layers here so the stage totals
  // carry it. FlexGen's model leaves it out; for OPT-125M it is 45% of a decode step's FLOPs.
  const double head_flops = 2.0 * double(cfg.vocab_size) * h_dim;
  P[COMP].constant += bls * head_flops / hw.gemm_flops(z.prefill_seqs, h_dim) / l;
  if (cc) P[COMP].constant += bls * s * z.kv_per_token_fp16 / dequant_bw;  // quantizing the prompt's cache
  // Calibrated per-unit work outside the terms above: once per prefill group and layer. The
  // runtime cuts groups within each GPU batch (engine_steps.cpp, build_units).
  // And once per prefill group and step outside the layers, spread over them as the head is.
  const double prefill_groups = ngb * std::ceil(gbs / z.prefill_seqs);
  P[COMP].constant += (hw.compute_overhead_s + hw.step_overhead_s / l) * prefill_groups;
  if (experts_p) {
    const double group_tokens = std::min(z.prefill_seqs, gbs) * s;
    add_mlp(P[CTOG], Ap / ctog, Tier::Cpu);
    add_mlp(P[GTOC], Ap / gtoc, Tier::Cpu);
    add_mlp(P[COMP], -gemm_seconds(bls * s, z.mlp_flops_per_token, prefill_rows), Tier::Cpu);
    add_mlp(P[CATT], prefill_groups * cpu_experts_seconds(cfg, z, group_tokens, cw, hw), Tier::Cpu);
    if (cw) add_mlp(P[COMP], -z.mlp_weights_fp16 / dequant_bw, Tier::Cpu);  // its half is never dequantized
  }

  // One decode step of one layer. With cpu_attention, attention over the cache on the CPU or disk
  // runs on the CPU (CATT): q, k, v go down and the attention output comes back instead of the cache.
  auto& D = F.decode;
  add(D[CTOG], Wa / ctog, {WC, WD});
  add_mlp(D[CTOG], Wm / ctog, Tier::Disk);
  if (!experts_d) add_mlp(D[CTOG], Wm / ctog, Tier::Cpu);
  if (experts_d) {
    add_mlp(D[CTOG], Ag / ctog, Tier::Cpu);
    add_mlp(D[GTOC], Ag / gtoc, Tier::Cpu);
    add_mlp(D[CATT], ngb * cpu_experts_seconds(cfg, z, gbs, cw, hw), Tier::Cpu);
  }
  add(D[CTOG], Ag_moved / ctog, {HC, HD});
  add(D[GTOC], Ag_moved / gtoc, {HC, HD});
  if (cpu_attn) {
    const double qkv = bls * e * (cfg.q_dim() + 2.0 * cfg.kv_dim()), out = bls * e * cfg.q_dim();
    add(D[CTOG], out / ctog, {CC, CD});
    add(D[GTOC], qkv / gtoc, {CC, CD});
  } else {
    add(D[CTOG], cache_read / ctog, {CC, CD});
    add(D[GTOC], cache_new / gtoc, {CC, CD});
  }
  add(D[DTOC], Wa / dtoc, {WD});
  add_mlp(D[DTOC], Wm / dtoc, Tier::Disk);
  add(D[DTOC], cache_read / dtoc, {CD});
  add(D[DTOC], Ag_moved / dtoc, {HD});
  add(D[CTOD], cache_new / ctod, {CD});
  add(D[CTOD], Ag_moved / ctod, {HD});
  D[COMP].constant = gemm_seconds(bls, z.layer_flops_per_token + head_flops / l, gbs, !fused_codes) +
                     bls * elementwise_per_token +
                     (hw.compute_overhead_s + hw.step_overhead_s / l) * ngb;  // calibrated: per GPU batch (and layer)
  if (experts_d) add_mlp(D[COMP], -gemm_seconds(bls, z.mlp_flops_per_token, gbs, !fused_codes), Tier::Cpu);
  // What of it waits for delegated attention (compute_stage): all but the attention half's GEMMs;
  // on the CPU backend all of it (the attention runs inline on the same cores: G + C).
  F.comp_serial_share =
      hw.cpu_backend() ? 1.0 : 1 - z.attention_flops_per_token / (z.layer_flops_per_token + head_flops / l);
  // Compressed weights: a decode step of up to quant::kCudaFusedDequantMaxTokens tokens reads the codes in the
  // fused linear (no separate pass; the GEMM term stands for it); a larger GPU batch dequantizes
  // the layer once, shared by the block's GPU batches (the runtime's rule, engine_steps.cpp).
  if (cw && gbs > double(quant::kCudaFusedDequantMaxTokens)) {
    D[COMP].constant += z.layer_weights_fp16 / dequant_bw;
    if (experts_d) add_mlp(D[COMP], -z.mlp_weights_fp16 / dequant_bw, Tier::Cpu);
  }
  // Attention reads the cache where it is computed; a compressed cache is read as codes and
  // dequantized in registers, at the profile's rate over a 4-bit cache where it has one.
  auto attn_bw = [&](double fp16_bw, double q4_bw) { return cc && q4_bw > 0 ? q4_bw : fp16_bw; };
  const double attended = cache_avg_fp16 * z.attended_fraction;
  const double gpu_attn = attended / attn_bw(hw.gpu_attention_bw, hw.gpu_attention_q4_bw);
  add(D[COMP], gpu_attn, {CG});
  if (cpu_attn) add(D[CATT], attended / attn_bw(hw.cpu_attention_bw, hw.cpu_attention_q4_bw), {CC, CD});
  else add(D[COMP], gpu_attn, {CC, CD});
  // Copies that run on the compute's own cores (the CPU backend's memcpy and disk threads) slow it:
  // the calibrated link_interference seconds of compute per second of link work in the stage.
  for (auto* stage : {&P, &D})
    for (int link : {CTOG, GTOC, DTOC, CTOD}) add_scaled((*stage)[COMP], (*stage)[link], hw.link_interference);

  // Peak memory, linear in the fractions where the runtime's plan (placement.h) has steps. GPU:
  // global weights, the workspace, the homes of what is placed there, one layer's buffer for
  // offloaded weights (its halves load in turn), three staging slots for offloaded cache and hidden states: a prefill
  // group's rows, or a whole GPU batch's cache where decode brings it to the GPU (without
  // cpu_attention). CPU: homes, plus pinned mirrors of units on disk (with cpu_attention the CPU
  // attends over the mirror).
  const double Cm = z.cache_capacity, cache_unit = Cm / ngb, act_unit = Ap / ngb;
  const double cache_group = z.prefill_seqs * (s + n) * z.kv_per_token;
  const double act_stage = std::max(z.prefill_seqs * s, gbs) * z.hidden_per_token;
  LinearForm& G = F.peak[int(Tier::Gpu)];
  // Each half's transfer buffer, unless every such half is resident; tied halves interpolate.
  G.constant = z.global_weights + z.workspace + Wa;
  add(G, l * Wa - Wa, {WG});
  if (fixed) {
    G.constant += l * Wm * xm[0] + (xm[0] < 1 ? Wm : 0.0);
  } else if (free) {
    // The buffer whole: every split but all resident needs it, and spread over mg, as tied, it
    // would favour MLP halves on the GPU by a share of a buffer their rounding then lacks.
    G.constant += Wm;
    add(G, l * Wm, {MG});
  } else {
    G.constant += Wm;
    add(G, l * Wm - Wm, {WG});
  }
  add(G, l * Cm, {CG});
  add(G, 3 * (cpu_attn ? cache_group : cache_unit), {CC, CD});
  add(G, Ap, {HG});
  add(G, 3 * act_stage, {HC, HD});
  if (cw) G.constant += z.dequant_buffer;  // the larger half-layer, dequantized for long steps
  LinearForm& C = F.peak[int(Tier::Cpu)];
  add(C, l * Wa, {WC});
  add(C, Wa, {WD});  // the pinned buffer of a half read from disk
  add_mlp(C, l * Wm, Tier::Cpu);
  if (fixed) C.constant += xm[2] > 0 ? Wm : 0.0;
  else add(C, Wm, {mlp_vars + 2});
  add(C, l * Cm, {CC});
  add(C, 3 * cache_unit, {CD});
  add(C, Ap, {HC});
  add(C, 3 * act_unit, {HD});
  // Delegated attention: q/k/v and the output of one GPU batch, and its fp32 scores.
  if (cpu_attn) C.constant += gbs * (e * (2 * cfg.q_dim() + 2 * cfg.kv_dim()) + 4.0 * cfg.n_heads * (s + n));
  // Experts on the CPU: two buffers of a step's hidden rows, the rows in fp32 and the CPU's
  // workspace (placement.cpp); counted whatever the fractions, an upper bound where none is on the CPU.
  if (experts_p || experts_d)
    C.constant += z.step_tokens * h_dim * (2 * e + 4) +
                  double(ForwardOps::workspace_bytes(cfg, DType::F32, int64_t(z.step_tokens), 1));
  LinearForm& Dk = F.peak[int(Tier::Disk)];
  add(Dk, l * Wa, {WD});
  add_mlp(Dk, l * Wm, Tier::Disk);
  add(Dk, l * Cm, {CD});
  add(Dk, Ap, {HD});
  return F;
}

LinearForm difference(const LinearForm& a, const LinearForm& b) {
  LinearForm d;
  d.constant = a.constant - b.constant;
  for (int v = 0; v < kNumVars; ++v) d.coef[v] = a.coef[v] - b.coef[v];
  return d;
}

// Every term is affine in the number of GPU batches (the weights' part does not grow with it), so
// the forms at one and two GPU batches give both parts exactly.
void split_by_batches(CostForms& F, const ModelConfig& cfg, const Policy& p, const Workload& w,
                      const HardwareProfile& hw, ExpertSplit experts) {
  Policy one = p, two = p;
  one.num_gpu_batches = 1;
  two.num_gpu_batches = 2;
  const CostForms F1 = unsplit_forms(cfg, one, w, hw, experts), F2 = unsplit_forms(cfg, two, w, hw, experts);
  for (int t = 0; t < kNumTerms; ++t) {
    F.prefill_batch[t] = difference(F2.prefill[t], F1.prefill[t]);
    F.prefill_fixed[t] = difference(F1.prefill[t], F.prefill_batch[t]);
    F.decode_batch[t] = difference(F2.decode[t], F1.decode[t]);
    F.decode_fixed[t] = difference(F1.decode[t], F.decode_batch[t]);
  }
}

}  // namespace

CostForms cost_forms(const ModelConfig& cfg, const Policy& p, const Workload& w, const HardwareProfile& hw,
                     ExpertSplit experts) {
  check_inputs(cfg, p, w, hw);
  CostForms F = unsplit_forms(cfg, p, w, hw, experts);
  split_by_batches(F, cfg, p, w, hw, experts);
  return F;
}

CostForms with_stagger(CostForms forms, int prefill_batches_per_step) {
  forms.prefill_batches_per_step = prefill_batches_per_step;
  return forms;
}

StageTime stage_time(const std::array<double, kNumTerms>& terms, const CostForms& F, double batches) {
  StageTime st;
  st.terms = terms;
  st.compute = compute_stage(terms[COMP], terms[CATT], batches, F.comp_serial_share);
  const std::array<double, 5> items = {terms[CTOG], terms[GTOC], terms[DTOC], terms[CTOD], st.compute};
  double sum = 0, max = 0, serial = 0;
  for (int t = 0; t < 5; ++t) {
    if (items[size_t(t)] > items[size_t(st.bound)]) st.bound = t;
    sum += items[size_t(t)];
    max = std::max(max, items[size_t(t)]);
  }
  if (st.bound == COMP && terms[CATT] > terms[COMP]) st.bound = CATT;
  for (double t : terms) serial += t;
  st.total = F.overlap ? max + F.overlap_slowdown * (sum - max) : serial;
  return st;
}

namespace {

std::array<double, kNumTerms> at(const std::array<LinearForm, kNumTerms>& forms, const Fractions& x) {
  std::array<double, kNumTerms> v{};
  for (int t = 0; t < kNumTerms; ++t) v[t] = forms[t].at(x);
  return v;
}

// GPU batches prefilling and decoding in each super-step of a staggered block: batch k prefills
// in super-step start_step(k) and decodes in the n - 1 after it (policy.h).
struct SuperStep {
  double prefilling = 0, decoding = 0;  // whole batches in a block; shares of them in refill's steady state
};
std::vector<SuperStep> super_steps(int num_gpu_batches, int per_step, int gen_len) {
  Policy p;
  p.num_gpu_batches = num_gpu_batches;
  p.prefill_batches_per_step = per_step;
  std::vector<SuperStep> steps(size_t(p.start_steps() + gen_len - 1));
  for (int k = 0; k < num_gpu_batches; ++k) {
    const int start = p.start_step(k);
    ++steps[size_t(start)].prefilling;
    for (int t = start + 1; t < start + gen_len; ++t) ++steps[size_t(t)].decoding;
  }
  return steps;
}

// The four parts of the terms at x (CostForms: fixed + batches * per batch).
struct SplitTerms {
  std::array<double, kNumTerms> prefill_fixed, prefill_batch, decode_fixed, decode_batch;
};

// One layer of a super-step: the weights are read (and dequantized) once and serve every active
// batch, prefilling or decoding.
std::array<double, kNumTerms> super_step_terms(const SplitTerms& s, const SuperStep& b) {
  std::array<double, kNumTerms> v{};
  for (int t = 0; t < kNumTerms; ++t) {
    const double fixed = b.prefilling > 0 && b.decoding > 0 ? std::max(s.prefill_fixed[t], s.decode_fixed[t])
                         : b.prefilling > 0                 ? s.prefill_fixed[t]
                                                            : s.decode_fixed[t];
    v[t] = fixed + b.prefilling * s.prefill_batch[t] + b.decoding * s.decode_batch[t];
  }
  return v;
}

SplitTerms split_at(const CostForms& F, const Fractions& x) {
  return {at(F.prefill_fixed, x), at(F.prefill_batch, x), at(F.decode_fixed, x), at(F.decode_batch, x)};
}

// The block's totals from the per-layer phase times.
void finish(Prediction& r, const CostForms& F, const Fractions& x, double prefill_per_layer, double decode_per_layer) {
  r.fractions = x;
  r.prefill_s = prefill_per_layer * F.n_layers;
  r.decode_s = decode_per_layer * F.n_layers;
  r.total_s = r.prefill_s + r.decode_s;
  r.throughput_tok_s = double(F.block_size) * F.gen_len / r.total_s;
  r.latency_s = r.total_s;
  r.peak = {F.peak[0].at(x), F.peak[1].at(x), F.peak[2].at(x)};
}

Prediction predict_staggered(const CostForms& F, const Fractions& x) {
  const SplitTerms split = split_at(F, x);
  Prediction r;
  double prefill = 0, decode = 0;  // per layer, summed over the super-steps
  int most_decoding = 0;
  const std::vector<SuperStep> steps = super_steps(F.num_gpu_batches, F.prefill_batches_per_step, F.gen_len);
  for (size_t t = 0; t < steps.size(); ++t) {
    const StageTime st = stage_time(super_step_terms(split, steps[t]), F, steps[t].prefilling + steps[t].decoding);
    if (t == 0) r.prefill = st;
    if (steps[t].decoding > most_decoding) most_decoding = steps[t].decoding, r.decode = st;
    (steps[t].prefilling > 0 ? prefill : decode) += st.total;
  }
  finish(r, F, x, prefill, decode);
  return r;
}

}  // namespace

std::array<double, kNumTerms> mixed_step_terms(const CostForms& F, const Fractions& x, double prefilling,
                                               double decoding) {
  return super_step_terms(split_at(F, x), SuperStep{prefilling, decoding});
}

PhaseTerms phase_terms(const CostForms& F, const Fractions& x) {
  PhaseTerms out;
  if (!F.staggered()) {
    out.prefill = at(F.prefill, x);
    out.decode = at(F.decode, x);
    for (double& t : out.decode) t *= F.gen_len - 1;
    return out;
  }
  const SplitTerms split = split_at(F, x);
  for (const SuperStep& step : super_steps(F.num_gpu_batches, F.prefill_batches_per_step, F.gen_len)) {
    const std::array<double, kNumTerms> terms = super_step_terms(split, step);
    std::array<double, kNumTerms>& sum = step.prefilling > 0 ? out.prefill : out.decode;
    for (int t = 0; t < kNumTerms; ++t) sum[t] += terms[t];
  }
  return out;
}

Prediction predict(const CostForms& F, const Fractions& x) {
  if (F.staggered()) return predict_staggered(F, x);
  Prediction r;
  r.prefill = stage_time(at(F.prefill, x), F, F.num_gpu_batches);
  r.decode = stage_time(at(F.decode, x), F, F.num_gpu_batches);
  finish(r, F, x, r.prefill.total, r.decode.total * (F.gen_len - 1));
  return r;
}

Prediction evaluate(const ModelConfig& cfg, const Policy& p, const Workload& w, const HardwareProfile& hw) {
  return predict(cost_forms(cfg, p, w, hw), realized_fractions(p, cfg.n_layers));
}

}  // namespace strata
