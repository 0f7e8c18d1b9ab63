// The cost model's formulas against hand computations (docs/cost-model.md defines every term).
// The machine has round numbers so the arithmetic stays visible.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>

#include "policy_fixtures.h"
#include "strata/policy/cost_model.h"
#include "strata/runtime/forward_ops.h"

using namespace strata;
using test::policy_of;

namespace {

HardwareProfile round_machine() {
  HardwareProfile hw;
  hw.name = "round";
  hw.gpu_mem = 16e9;
  hw.cpu_mem = 200e9;
  hw.disk_mem = 1e12;
  hw.cpu_to_gpu_bw = 10e9;
  hw.gpu_to_cpu_bw = 10e9;
  hw.disk_to_cpu_bw = 2e9;
  hw.cpu_to_disk_bw = 1e9;
  hw.gpu_gemm = {{1, 10e12}};  // flat: 10 TFLOP/s at every size
  hw.gpu_attention_bw = 200e9;
  hw.cpu_attention_bw = 10e9;
  hw.cpu_flops = 1e12;
  hw.gpu_dequant_bw = 50e9;
  return hw;
}

ModelConfig opt67() { return *config_preset("opt-6.7b"); }

// OPT-6.7B: h1 = 4096, h2 = 16384, 32 layers, 32 heads, vocabulary 50272, 2048 positions (+2).
constexpr double h = 4096, h2 = 16384;
// One layer's parameters: q, k, v, o (4 h^2) + fc1, fc2 (2 h h2) + biases 3h + h + h2 + h + two
// LayerNorms with bias 4h = 201,379,840; fp16 doubles it. FlexGen's 8 h^2 + 4 h h2 omits the
// 53,248 bias and norm parameters.
constexpr double W = 2 * (4 * h * h + 2 * h * h2 + 3 * h + h + h2 + h + 4 * h);  // 402,759,680 bytes
constexpr double flops_per_token = 8 * h * h + 4 * h * h2;                       // 402,653,184
// The LM head (50272 x h) on each logit row, spread over the 32 layers in each stage's compute.
constexpr double head_per_layer = 2 * 50272 * h / 32;
const Workload wl{512, 32};  // s = 512, n = 32

}  // namespace

TEST_CASE("sizes of OPT-6.7B as the cost model counts them", "[cost]") {
  const CostForms F = cost_forms(opt67(), policy_of(8, 4, {25, 75, 0}, {0, 100, 0}, {100, 0, 0}), wl, round_machine());
  CHECK(W == 402759680.0);
  CHECK(F.sizes.layer_weights == W);
  CHECK(F.sizes.layer_weights_fp16 == W);
  CHECK(F.sizes.layer_flops_per_token == flops_per_token);
  // Token embedding 50272 x 4096 + positions 2050 x 4096 + final LayerNorm 2 x 4096, fp16; the
  // head is tied to the embedding.
  CHECK(F.sizes.global_weights == 2.0 * (50272 * h + 2050 * h + 2 * h));  // 428,638,208
  CHECK(F.sizes.kv_per_token == 4 * h);                                    // K and V, 2 bytes each
  CHECK(F.sizes.hidden_per_token == 2 * h);
  // Block of 32 sequences; the average context of a decode step is s + n/2 = 528.
  CHECK(F.sizes.cache_avg == 32 * 528 * 4 * h);       // 276,824,064
  CHECK(F.sizes.cache_capacity == 32 * 544 * 4 * h);  // 285,212,672
  CHECK(F.sizes.act_prefill == 32 * 512 * 2 * h);     // 134,217,728
  CHECK(F.sizes.act_decode == 32 * 2 * h);
  // Prefill steps of the default 1024 tokens: groups of 2 prompts of 512 (policy.h).
  CHECK(F.sizes.prefill_seqs == 2);
  CHECK(F.sizes.step_tokens == 1024);
  CHECK(F.sizes.workspace == double(ForwardOps::workspace_bytes(opt67(), DType::F16, 1024, 8)));
  CHECK(F.block_size == 32);
}

TEST_CASE("per-layer terms of a CPU-offloading policy", "[cost]") {
  // 8 of 32 layers' weights on the GPU (25%), the cache on the CPU, activations on the GPU.
  const HardwareProfile hw = round_machine();
  const Policy p = policy_of(8, 4, {25, 75, 0}, {0, 100, 0}, {100, 0, 0});
  const Prediction r = evaluate(opt67(), p, wl, hw);
  CHECK(r.fractions[WG] == 0.25);
  CHECK(r.fractions[CC] == 1.0);
  CHECK(r.fractions[HG] == 1.0);

  const double cache_avg = 32 * 528 * 4 * h;  // bytes read per decode step and layer
  // Prefill: 75% of the weights come over PCIe; the prompt's cache (32 x 512 x 4h) goes out.
  CHECK(r.prefill.terms[CTOG] == Approx(0.75 * W / 10e9));                  // 30.2 ms
  CHECK(r.prefill.terms[GTOC] == Approx(32 * 512 * 4 * h / 10e9));          // 26.8 ms
  CHECK(r.prefill.terms[DTOC] == 0);
  CHECK(r.prefill.terms[CTOD] == 0);
  const double prefill_gemm = 32 * 512 * flops_per_token / 10e12;           // 659.7 ms
  const double prefill_attn = 32 * 4.0 * 512 * 512 * h / 10e12;             // 13.7 ms
  const double prefill_head = 32 * head_per_layer / 10e12;                   // 0.4 ms: 32 logit rows
  CHECK(r.prefill.terms[COMP] == Approx(prefill_gemm + prefill_attn + prefill_head));
  CHECK(r.prefill.bound == COMP);
  // With a measured prefill attention curve: QK^T and AV over the causal half, 2 s (s + 1) q_dim
  // per prompt, at the curve's rate for s = 512 (halfway in log s from 256 to 1024: 3 TFLOP/s).
  HardwareProfile measured = hw;
  measured.gpu_prefill_attention = {{256, 2e12}, {1024, 4e12}};
  const Prediction m = evaluate(opt67(), p, wl, measured);
  const double measured_attn = 32 * 2.0 * 512 * 513 * h / 3e12;  // 22.9 ms
  CHECK(m.prefill.terms[COMP] == Approx(prefill_gemm + measured_attn + prefill_head));
  CHECK(m.decode.terms[COMP] == Approx(r.decode.terms[COMP]));  // decode attention is the cache's bandwidth
  // A measured elementwise rate: 2 ns per token and hidden unit, for the prompt's 32 x 512 tokens
  // in prefill and the block's 32 in each decode step.
  HardwareProfile elementwise = hw;
  elementwise.gpu_elementwise_s = 2e-9;
  const Prediction e = evaluate(opt67(), p, wl, elementwise);
  CHECK(e.prefill.terms[COMP] == Approx(r.prefill.terms[COMP] + 32 * 512 * h * 2e-9));  // + 134 ms
  CHECK(e.decode.terms[COMP] == Approx(r.decode.terms[COMP] + 32 * h * 2e-9));          // + 0.26 ms
  // Decode: weights and the whole cache come over PCIe for GPU attention; the new K, V go back.
  CHECK(r.decode.terms[CTOG] == Approx((0.75 * W + cache_avg) / 10e9));     // 57.9 ms
  CHECK(r.decode.terms[GTOC] == Approx(32 * 4 * h / 10e9));
  CHECK(r.decode.terms[COMP] ==
        Approx(32 * (flops_per_token + head_per_layer) / 10e12 + cache_avg / 200e9));  // 1.3 + 0.04 + 1.4 ms
  CHECK(r.decode.bound == CTOG);
  CHECK(r.decode.total == r.decode.terms[CTOG]);

  // T = T_pre * l + T_gen * (n - 1) * l; throughput = block * n / T.
  const double T = r.prefill.total * 32 + r.decode.total * 31 * 32;
  CHECK(r.total_s == Approx(T));
  CHECK(r.prefill_s == Approx(r.prefill.total * 32));
  CHECK(r.throughput_tok_s == Approx(32 * 32 / T));
  CHECK(r.latency_s == r.total_s);
}

TEST_CASE("a model's GEMMs are priced at its own hidden size where the profile has two curves", "[cost]") {
  // OPT-6.7B (h = 4096) and OPT-1.3B (h = 2048) on a profile with curves at both sizes: each is
  // priced exactly as by a profile holding only its own size's curve; a profile with one curve
  // prices both on it, as before.
  HardwareProfile one = round_machine();
  one.gpu_gemm = {{1, 0.5e12}, {64, 20e12}, {4096, 40e12}};
  HardwareProfile small = round_machine();
  small.gpu_gemm = {{1, 0.8e12}, {64, 14e12}, {4096, 30e12}};
  HardwareProfile both = one;
  both.gpu_gemm_hidden = 4096;
  both.gpu_gemm2 = small.gpu_gemm;
  both.gpu_gemm2_hidden = 2048;
  const Policy p = policy_of(8, 2, {50, 50, 0}, {0, 100, 0}, {100, 0, 0});
  for (const auto& [model, alone] : {std::pair{"opt-6.7b", &one}, std::pair{"opt-1.3b", &small}}) {
    INFO(model);
    const ModelConfig cfg = *config_preset(model);
    const Prediction got = evaluate(cfg, p, wl, both), want = evaluate(cfg, p, wl, *alone);
    CHECK(got.prefill.terms[COMP] == Approx(want.prefill.terms[COMP]).epsilon(1e-12));
    CHECK(got.decode.terms[COMP] == Approx(want.decode.terms[COMP]).epsilon(1e-12));
    CHECK(got.throughput_tok_s == Approx(want.throughput_tok_s).epsilon(1e-12));
  }
  const ModelConfig cfg13 = *config_preset("opt-1.3b");
  CHECK(evaluate(cfg13, p, wl, one).decode.terms[COMP] != Approx(evaluate(cfg13, p, wl, both).decode.terms[COMP]));
}

TEST_CASE("CPU attention moves q/k/v and the output instead of the cache", "[cost]") {
  const HardwareProfile hw = round_machine();
  const Prediction r = evaluate(opt67(), policy_of(8, 4, {25, 75, 0}, {0, 100, 0}, {100, 0, 0}, true), wl, hw);
  const double cache_avg = 32 * 528 * 4 * h;
  const double out = 32 * 2 * h, qkv = 32 * 2 * (h + 2 * h);  // fp16, block of 32
  CHECK(r.decode.terms[CTOG] == Approx((0.75 * W + out) / 10e9));
  CHECK(r.decode.terms[GTOC] == Approx(qkv / 10e9));
  CHECK(r.decode.terms[COMP] == Approx(32 * (flops_per_token + head_per_layer) / 10e12));  // 1.33 ms on the GPU
  CHECK(r.decode.terms[CATT] == Approx(cache_avg / 10e9));                                  // 27.7 ms on the CPU
  // Prefill attention stays on the GPU.
  CHECK(r.prefill.terms[GTOC] == Approx(32 * 512 * 4 * h / 10e9));
  CHECK(r.prefill.terms[CATT] == 0);
}

TEST_CASE("sliding-window layers are priced reading their window, stored and moved whole", "[cost]") {
  // OPT-6.7B's shape with half its layers sliding over 132 positions: at s = 512, n = 32 the
  // average context is 528, so those layers read a quarter of the cache and the step reads
  // (16 + 16 / 4) / 32 = 5/8 of it; the cache's copies and home stay whole.
  const HardwareProfile hw = round_machine();
  ModelConfig windowed = opt67();
  windowed.layer_window = 132;
  for (int l = 0; l < windowed.n_layers; l += 2) windowed.window_layers.push_back(l);
  const Policy cpu_attention = policy_of(8, 4, {25, 75, 0}, {0, 100, 0}, {100, 0, 0}, true);
  const Prediction whole = evaluate(opt67(), cpu_attention, wl, hw);
  const Prediction slid = evaluate(windowed, cpu_attention, wl, hw);
  CHECK(cost_forms(windowed, cpu_attention, wl, hw).sizes.attended_fraction == Approx(5.0 / 8));
  CHECK(slid.decode.terms[CATT] == Approx(whole.decode.terms[CATT] * 5 / 8));
  CHECK(slid.decode.terms[CTOG] == Approx(whole.decode.terms[CTOG]));
  const Policy gpu_cache = policy_of(8, 4, {25, 75, 0}, {0, 100, 0}, {100, 0, 0});
  const double gpu_attn = 32 * 528 * 4 * h / hw.gpu_attention_bw;  // the cache the GPU reads, whole
  CHECK(evaluate(windowed, gpu_cache, wl, hw).decode.terms[COMP] ==
        Approx(evaluate(opt67(), gpu_cache, wl, hw).decode.terms[COMP] - gpu_attn * 3 / 8));
  // A window past the context reads everything.
  windowed.layer_window = 4096;
  CHECK(cost_forms(windowed, cpu_attention, wl, hw).sizes.attended_fraction == 1.0);
}

TEST_CASE("CPU attention overlaps the GPU's work of the other GPU batches", "[cost]") {
  // The engine's pipeline (docs/cost-model.md, "CPU attention"): while the CPU attends for one GPU
  // batch the GPU runs the others' attention projections; the MLP half and the LM head wait for
  // the last batch's attention. All weights on the GPU so that compute bounds the stage.
  const HardwareProfile hw = round_machine();
  // The share of the GPU's decode FLOPs outside the attention half: 1 - 8 h^2 / (24 h^2 + head).
  const double serial = 1 - 8 * h * h / (flops_per_token + head_per_layer);  // 0.68
  for (int ngb : {1, 2, 4}) {
    INFO(ngb << " GPU batches");
    const Policy p = policy_of(32 / ngb, ngb, {100, 0, 0}, {0, 100, 0}, {100, 0, 0}, true);
    const CostForms F = cost_forms(opt67(), p, wl, hw);
    CHECK(F.comp_serial_share == Approx(serial));
    const Prediction r = evaluate(opt67(), p, wl, hw);
    const double comp = 32 * (flops_per_token + head_per_layer) / 10e12, catt = 32 * 528 * 4 * h / 10e9;
    REQUIRE(r.decode.terms[COMP] == Approx(comp));
    REQUIRE(r.decode.terms[CATT] == Approx(catt));
    // GPU-bound: all GPU work plus one batch's attention; CPU-bound: all attention plus one
    // batch's projections and the serial part. Here the CPU bounds it.
    const double expected = std::max(comp + catt / ngb, catt + comp * (serial + (1 - serial) / ngb));
    CHECK(r.decode.compute == Approx(expected));
    CHECK(r.decode.total == Approx(expected));
    CHECK(r.decode.bound == CATT);
    if (ngb == 1) CHECK(r.decode.total == Approx(comp + catt));  // one GPU batch: nothing to overlap
  }
  // GPU-bound the other piece: the GPU's work and one batch's attention.
  CHECK(compute_stage(10, 4, 4, 0.5) == Approx(10 + 4.0 / 4));
  CHECK(compute_stage(1, 4, 4, 0.5) == Approx(4 + 1 * (0.5 + 0.5 / 4)));
  CHECK(compute_stage(3, 0, 4, 0.5) == 3);  // nothing delegated: the GPU's work alone
  // On the CPU backend (compute dtype F32) the attention runs inline on the compute's cores.
  HardwareProfile cpu = hw;
  cpu.compute_dtype = DType::F32;
  const Prediction inline_run = evaluate(opt67(), policy_of(8, 4, {100, 0, 0}, {0, 100, 0}, {100, 0, 0}, true), wl, cpu);
  CHECK(inline_run.decode.terms[CATT] > 0);
  CHECK(inline_run.decode.compute == Approx(inline_run.decode.terms[COMP] + inline_run.decode.terms[CATT]));
  // Without overlap every lane runs in turn: the CPU attention adds.
  Policy serial_policy = policy_of(8, 4, {100, 0, 0}, {0, 100, 0}, {100, 0, 0}, true);
  serial_policy.overlap = false;
  const Prediction s = evaluate(opt67(), serial_policy, wl, hw);
  double sum = 0;
  for (double t : s.decode.terms) sum += t;
  CHECK(s.decode.total == Approx(sum));
}

TEST_CASE("disk terms: weights and cache behind the CPU", "[cost]") {
  // Half the weights on disk (layers 16..31), the cache on disk, activations on the CPU.
  const HardwareProfile hw = round_machine();
  const Prediction r = evaluate(opt67(), policy_of(8, 4, {0, 50, 50}, {0, 0, 100}, {0, 100, 0}), wl, hw);
  CHECK(r.fractions[WD] == 0.5);
  const double cache_avg = 32 * 528 * 4 * h, act = 32 * 2 * h, act_p = 32 * 512 * 2 * h;
  CHECK(r.decode.terms[DTOC] == Approx((0.5 * W + cache_avg) / 2e9));     // 239 ms
  CHECK(r.decode.terms[CTOD] == Approx(32 * 4 * h / 1e9));               // the new K, V
  // Everything crosses PCIe; the hidden states twice a layer (after attention, after the MLP).
  CHECK(r.decode.terms[CTOG] == Approx((W + cache_avg + 2 * act) / 10e9));
  CHECK(r.decode.terms[GTOC] == Approx((32 * 4 * h + 2 * act) / 10e9));
  CHECK(r.prefill.terms[DTOC] == Approx(0.5 * W / 2e9));
  CHECK(r.prefill.terms[CTOD] == Approx(32 * 512 * 4 * h / 1e9));        // the prompt's cache written
  CHECK(r.prefill.terms[CTOG] == Approx((W + 2 * act_p) / 10e9));
  CHECK(r.decode.bound == DTOC);
}

TEST_CASE("without overlap a stage takes the sum of its terms", "[cost]") {
  Policy p = policy_of(8, 4, {0, 50, 50}, {0, 0, 100}, {0, 100, 0});
  p.overlap = false;
  const Prediction r = evaluate(opt67(), p, wl, round_machine());
  double sum = 0;
  for (double t : r.decode.terms) sum += t;
  CHECK(r.decode.total == Approx(sum));
}

TEST_CASE("4-bit compression shrinks what moves and adds dequantization", "[cost]") {
  CHECK(stored_bytes_per_element(std::nullopt) == 2.0);
  CHECK(stored_bytes_per_element(Compression{4, 64}) == 0.5 + 4.0 / 64);  // 0.5625: 28.125% of fp16
  HardwareProfile hw = round_machine();
  Policy p = policy_of(8, 4, {0, 100, 0}, {100, 0, 0}, {100, 0, 0});
  p.compress_weights = Compression{4, 64};
  p.compress_kv_cache = Compression{4, 64};
  const Prediction r = evaluate(opt67(), p, wl, hw);
  const double Wc = W * 0.28125, cache_avg = 32 * 528 * 4 * h;
  CHECK(r.decode.terms[CTOG] == Approx(Wc / 10e9));
  // A GPU batch of 8 reads the codes in the fused linear (no dequantization pass); attention reads
  // the compressed cache at the fp16 rate when the profile has no 4-bit one.
  CHECK(r.decode.terms[COMP] == Approx(32 * (flops_per_token + head_per_layer) / 10e12 + cache_avg / 200e9));
  // Prefill dequantizes each layer once for the block (and quantizes the prompt's cache).
  const double s = 512;
  CHECK(r.prefill.terms[COMP] > W / 50e9);
  const CostForms F = cost_forms(opt67(), p, wl, hw);
  CHECK(F.sizes.kv_per_token == 4 * h * 0.28125);
  CHECK(F.sizes.layer_weights == Wc);
  CHECK(F.sizes.dequant_buffer == 2.0 * 8 * h * h);  // the MLP half, fc1 and fc2 in fp16
  // GPU peak: globals, workspace, the compressed weights' buffer (all layers stream from the
  // CPU), the cache at home compressed, the hidden states, and the dequantization buffer. The cache
  // is never dequantized into a buffer: attention reads its codes.
  const double global = 2.0 * (50272 * h + 2050 * h + 2 * h);
  const double ws = double(ForwardOps::workspace_bytes(opt67(), DType::F16, 1024, 8));
  const double cache_cap = 32 * 544 * 4 * h;
  CHECK(r.peak.gpu == Approx(global + ws + Wc + 32 * cache_cap * 0.28125 + 32 * s * 2 * h + 16 * h * h));

  // A GPU batch over the fused limit dequantizes the layer once per step, for all its GPU batches;
  // measured 4-bit attention rates replace the fp16 ones, also on the CPU.
  Policy big = policy_of(64, 2, {0, 100, 0}, {50, 50, 0}, {100, 0, 0});
  big.compress_weights = Compression{4, 64};
  big.compress_kv_cache = Compression{4, 64};
  big.cpu_attention = true;
  hw.gpu_attention_q4_bw = 100e9;
  hw.cpu_attention_q4_bw = 20e9;
  const Prediction b = evaluate(opt67(), big, wl, hw);
  const double big_avg = 128 * 528 * 4 * h;
  CHECK(b.decode.terms[COMP] ==
        Approx(128 * (flops_per_token + head_per_layer) / hw.gemm_flops(64) + W / 50e9 + big_avg * 0.5 / 100e9));
  CHECK(b.decode.terms[CATT] == Approx(big_avg * 0.5 / 20e9));
}

TEST_CASE("peak memory per tier", "[cost]") {
  const HardwareProfile hw = round_machine();
  const Policy p = policy_of(8, 4, {25, 75, 0}, {0, 100, 0}, {100, 0, 0});
  const Prediction r = evaluate(opt67(), p, wl, hw);
  const double global = 2.0 * (50272 * h + 2050 * h + 2 * h);
  const double ws = double(ForwardOps::workspace_bytes(opt67(), DType::F16, 1024, 8));  // one prefill step
  const double cache_layer = 32 * 544 * 4 * h;  // one layer's cache at s + n, whole block
  const double cache_unit = cache_layer / 4;    // one GPU batch's
  const double act = 32 * 512 * 2 * h;          // hidden states of the block at prefill
  // GPU: global weights, workspace, 8 resident layers, one layer's buffer (its two halves) for
  // the 24 others (W x 75%, linearized), three staging units for the offloaded cache, the hidden
  // states.
  CHECK(r.peak.gpu == Approx(global + ws + 32 * W * 0.25 + W * 0.75 + 3 * cache_unit + act));
  // CPU: 24 layers and the whole cache.
  CHECK(r.peak.cpu == Approx(32 * W * 0.75 + 32 * cache_layer));
  CHECK(r.peak.disk == 0);

  // With CPU attention the cache never comes back to the GPU in decode: its staging holds one
  // prefill group's rows (2 prompts, 544 positions); hidden states on the CPU stage a group's
  // piece (2 x 512 tokens).
  Policy ca = policy_of(8, 4, {25, 75, 0}, {0, 100, 0}, {0, 100, 0});
  ca.cpu_attention = true;
  const Prediction c = evaluate(opt67(), ca, wl, hw);
  const double cpu_attn_host = 8 * (2.0 * (2 * h + 2 * h) + 4.0 * 32 * 544);  // q/k/v/out and fp32 scores
  CHECK(c.peak.gpu == Approx(global + ws + 32 * W * 0.25 + W * 0.75 + 3 * (2 * 544 * 4 * h) + 3 * (2 * 512 * 2 * h)));
  CHECK(c.peak.cpu == Approx(32 * W * 0.75 + 32 * cache_layer + act + cpu_attn_host));

  // Disk-resident parts need pinned staging on the CPU: a layer's halves, 3 cache units.
  const Prediction d = evaluate(opt67(), policy_of(8, 4, {0, 50, 50}, {0, 0, 100}, {0, 100, 0}), wl, hw);
  CHECK(d.peak.cpu == Approx(16 * W + W * 0.5 + 3 * cache_unit + act));
  CHECK(d.peak.disk == Approx(16 * W + 32 * cache_layer));
}

TEST_CASE("evaluate places whole layers and GPU batches as the runtime does", "[cost]") {
  // 20% of 32 layers: layers whose midpoint (i + 0.5) / 32 lies below 20%: i = 0..5, 6 layers.
  const HardwareProfile hw = round_machine();
  const Policy p = policy_of(48, 3, {20, 80, 0}, {0, 100, 0}, {50, 50, 0});
  const Fractions x = realized_fractions(p, 32);
  CHECK(x[WG] == 6.0 / 32);
  CHECK(x[WC] == 26.0 / 32);
  // Activations by GPU batch: of 3, only the first's midpoint (16.7%) lies below 50%; the
  // second's (50%) does not.
  CHECK(x[HG] == Approx(1.0 / 3));
  CHECK(x[HC] == Approx(2.0 / 3));
  const Prediction r = evaluate(opt67(), p, wl, hw);
  const Prediction q = predict(cost_forms(opt67(), p, wl, hw), x);
  CHECK(r.total_s == q.total_s);
  CHECK(requested_fractions(p)[WG] == 0.2);
}

TEST_CASE("the cost model refuses a profile it cannot use", "[cost]") {
  HardwareProfile hw = round_machine();
  hw.disk_to_cpu_bw = 0;
  CHECK_THROWS_WITH(evaluate(opt67(), policy_of(1, 1, {100, 0, 0}, {100, 0, 0}, {100, 0, 0}), wl, hw),
                    Catch::Contains("disk_to_cpu_bw"));
  CHECK_THROWS_WITH(evaluate(opt67(), policy_of(1, 1, {100, 0, 0}, {100, 0, 0}, {100, 0, 0}), {0, 32}, round_machine()),
                    Catch::Contains("prompt length"));
}

namespace {

// Whether two linear forms agree coefficient by coefficient, relative to the larger.
bool same_form(const LinearForm& a, const LinearForm& b) {
  auto close = [](double u, double v) {
    return std::fabs(u - v) <= 1e-12 * std::max({std::fabs(u), std::fabs(v), 1e-30});
  };
  if (!close(a.constant, b.constant)) return false;
  for (int v = 0; v < kNumVars; ++v)
    if (!close(a.coef[v], b.coef[v])) return false;
  return true;
}

LinearForm affine(const LinearForm& fixed, const LinearForm& per_batch, int batches) {
  LinearForm f = fixed;
  f.constant += batches * per_batch.constant;
  for (int v = 0; v < kNumVars; ++v) f.coef[v] += batches * per_batch.coef[v];
  return f;
}

}  // namespace

TEST_CASE("each term splits into the weights' part and a part per GPU batch", "[cost]") {
  HardwareProfile hw = round_machine();
  hw.compute_overhead_s = 3e-4;  // per prefill group and decode GPU batch
  hw.overlap_slowdown = 0.2;
  Policy plain = policy_of(3, 5, {0, 50, 50}, {0, 50, 50}, {0, 60, 40});  // groups of 2 prompts: 2 per GPU batch
  Policy delegated = policy_of(8, 3, {25, 75, 0}, {0, 100, 0}, {100, 0, 0}, true);
  Policy compressed = policy_of(32, 7, {0, 100, 0}, {50, 50, 0}, {100, 0, 0});
  compressed.compress_weights = Compression{4, 64};
  compressed.compress_kv_cache = Compression{4, 64};
  for (const Policy& p : {plain, delegated, compressed}) {
    INFO(policy_to_yaml(p));
    const CostForms F = cost_forms(opt67(), p, wl, hw);
    CHECK(F.num_gpu_batches == p.num_gpu_batches);
    for (int t = 0; t < kNumTerms; ++t) {
      INFO(term_name(t));
      CHECK(same_form(affine(F.prefill_fixed[t], F.prefill_batch[t], p.num_gpu_batches), F.prefill[t]));
      CHECK(same_form(affine(F.decode_fixed[t], F.decode_batch[t], p.num_gpu_batches), F.decode[t]));
    }
  }
  // The fixed part is the weights' alone: their reads, and dequantizing compressed weights.
  const CostForms F = cost_forms(opt67(), compressed, wl, hw);
  const double Wc = W * 0.28125;
  CHECK(F.prefill_fixed[CTOG].coef[WC] == Approx(Wc / 10e9));
  CHECK(F.prefill_fixed[CTOG].coef[HC] == Approx(0).margin(1e-18));
  CHECK(F.prefill_fixed[DTOC].coef[WD] == Approx(Wc / 2e9));
  CHECK(F.prefill_fixed[GTOC].coef[CC] == Approx(0).margin(1e-18));
  CHECK(F.prefill_fixed[COMP].constant == Approx(W / 50e9));  // prefill dequantizes the layer once
  CHECK(F.decode_fixed[COMP].constant == Approx(W / 50e9));   // and so does decode at 32 rows (> 16)
  CHECK(F.decode_batch[CTOG].coef[WC] == Approx(0).margin(1e-18));
  // Per GPU batch of 32: the cache it reads, its GEMMs with the head, its overhead.
  CHECK(F.decode_batch[CTOG].coef[CC] == Approx(32 * 528 * 4 * h * 0.28125 / 10e9));
  CHECK(F.decode_batch[COMP].constant == Approx(32 * (flops_per_token + head_per_layer) / 10e12 + 3e-4));
}

TEST_CASE("a staggered block by hand: three GPU batches, one starting per step, three tokens", "[cost]") {
  // OPT-6.7B, GPU batches of 2, 4-bit weights half on the GPU and half on the CPU; cache and hidden
  // states on the GPU. Per layer only two lanes work: PCIe (the CPU half of the weights) and compute.
  const HardwareProfile hw = round_machine();
  Policy p = policy_of(2, 3, {50, 50, 0}, {100, 0, 0}, {100, 0, 0});
  p.compress_weights = Compression{4, 64};
  p.prefill_batches_per_step = 1;
  const Workload w{512, 3};
  const double s = 512, ctog = 0.5 * 0.28125 * W / 10e9;  // 5.66 ms: read once per step
  const double dequant = W / 50e9;                              // 8.06 ms: prefill dequantizes once per step;
                                                                // decode of 2 rows reads the codes (fused)
  const double prefill_batch = 2 * s * flops_per_token / 10e12 + 2 * 4 * s * s * h / 10e12 +
                               2 * head_per_layer / 10e12;  // 42.1 ms: GEMMs, attention, head
  const double decode_batch = 2 * (flops_per_token + head_per_layer) / 10e12 +
                              2 * (s + 1.5) * 4 * h / 200e9;  // 0.17 ms: GEMMs, head, attention at s + n/2
  // Super-steps (prefilling, decoding): (1,0) (1,1) (1,2) (0,2) (0,1). Overlap: the max of the lanes.
  const double with_prefill[3] = {dequant + prefill_batch, dequant + prefill_batch + decode_batch,
                                  dequant + prefill_batch + 2 * decode_batch};
  const double decode_only = std::max(ctog, 2 * decode_batch);  // both decode-only steps: PCIe
  const double prefill_s = 32 * (with_prefill[0] + with_prefill[1] + with_prefill[2]);
  const double decode_s = 32 * 2 * decode_only;
  const Prediction r = evaluate(opt67(), p, w, hw);
  CHECK(r.prefill_s == Approx(prefill_s));
  CHECK(r.decode_s == Approx(decode_s));
  CHECK(r.total_s == Approx(prefill_s + decode_s));
  CHECK(r.latency_s == r.total_s);
  CHECK(r.throughput_tok_s == Approx(6 * 3 / (prefill_s + decode_s)));
  // The stages shown: the first super-step, and the first with the most batches decoding (1,2).
  CHECK(r.prefill.total == Approx(with_prefill[0]));
  CHECK(r.prefill.terms[CTOG] == Approx(ctog));
  CHECK(r.decode.total == Approx(with_prefill[2]));
  CHECK(r.decode.bound == COMP);

  // FlexGen's schedule for the same block: one prefill step, two decode steps.
  Policy flexgen = p;
  flexgen.prefill_batches_per_step = 0;
  const Prediction f = evaluate(opt67(), flexgen, w, hw);
  CHECK(f.total_s == Approx(32 * (dequant + 3 * prefill_batch) + 32 * 2 * std::max(ctog, 6 * decode_batch)));
}

TEST_CASE("without staggering the prediction is FlexGen's schedule, exactly", "[cost]") {
  HardwareProfile hw = round_machine();
  hw.overlap_slowdown = 0.3;
  hw.compute_overhead_s = 2e-4;
  Policy p = policy_of(8, 4, {0, 50, 50}, {0, 0, 100}, {0, 100, 0});
  const Prediction r = evaluate(opt67(), p, wl, hw);
  // T = T_pre * l + T_gen * (n - 1) * l from the unsplit terms.
  const CostForms F = cost_forms(opt67(), p, wl, hw);
  const Fractions x = realized_fractions(p, 32);
  auto stage = [&](const std::array<LinearForm, kNumTerms>& forms) {
    double sum = 0, max = 0;
    for (const LinearForm& t : forms) sum += t.at(x), max = std::max(max, t.at(x));
    return max + 0.3 * (sum - max);
  };
  CHECK(r.total_s == stage(F.prefill) * 32 + stage(F.decode) * 31 * 32);
  // All GPU batches starting in the first step is the same schedule.
  for (int per_step : {4, 9}) {
    p.prefill_batches_per_step = per_step;
    const Prediction same = evaluate(opt67(), p, wl, hw);
    CHECK(same.total_s == r.total_s);
    CHECK(same.prefill.total == r.prefill.total);
    CHECK(same.decode.total == r.decode.total);
  }
}

TEST_CASE("a mixture of experts moves all its experts and computes k of them per token", "[cost][moe]") {
  // Mixtral-8x7B: h 4096, 32 heads and 8 kv heads of 128, 8 experts of 14336, 2 per token. A layer
  // stores q, k, v, o (4096 x 6144 + 4096 x 4096), the router (8 x 4096), 8 experts (3 x 4096 x
  // 14336 each) and two RMSNorms; a token runs q, k, v, o, the router and 2 experts.
  const ModelConfig mx = *config_preset("mixtral-8x7b");
  const double hm = 4096, f = 14336, attn = hm * 6144 + hm * hm, experts = 8 * 3 * hm * f + 8 * hm;
  const CostForms F = cost_forms(mx, policy_of(8, 4, {0, 100, 0}, {0, 100, 0}, {100, 0, 0}), wl, round_machine());
  CHECK(F.sizes.layer_weights_fp16 == 2.0 * (attn + experts + 2 * hm));
  CHECK(F.sizes.layer_flops_per_token == 2.0 * (attn + 2 * 3 * hm * f + 8 * hm));
  CHECK(F.sizes.dequant_buffer == 2.0 * experts);  // the MLP half, every expert
}

TEST_CASE("experts on the CPU: the attention half and the hidden rows move, the CPU reads the active experts",
          "[cost][moe]") {
  // Mixtral-8x7B, weights on the CPU tier, cache and activations on the GPU, 8 x 4 sequences.
  // Decode with cpu_experts: per layer the link carries the attention half (the layer less the
  // router and experts) and the block's hidden rows both ways; the CPU reads the router and the
  // experts a GPU batch of 8 tokens activates in expectation, 8 (1 - (1 - 2/8)^8) = 7.199, at the
  // CPU attention's 10 GB/s, or computes their 2 x (2 experts + router) FLOPs per token at 1
  // TFLOP/s, the slower of the two, for each of the 4 GPU batches; the GPU no longer runs them.
  const ModelConfig mx = *config_preset("mixtral-8x7b");
  const double hm = 4096, f = 14336, expert = 3 * hm * f, router = 8 * hm;
  const double layer = 2.0 * (hm * 6144 + hm * hm + 8 * expert + router + 2 * hm);
  const double attn_half = layer - 2.0 * (8 * expert + router), rows = 32 * 2 * hm;
  const Policy moved = policy_of(8, 4, {0, 100, 0}, {100, 0, 0}, {100, 0, 0});
  Policy computed = moved;
  computed.cpu_experts_decode = true;
  const HardwareProfile hw = round_machine();
  const Prediction a = evaluate(mx, moved, wl, hw), b = evaluate(mx, computed, wl, hw);
  CHECK(a.decode.terms[CTOG] == Approx(layer / 10e9));
  CHECK(b.decode.terms[CTOG] == Approx((attn_half + rows) / 10e9));
  CHECK(b.decode.terms[GTOC] == Approx(rows / 10e9));
  const double active = 8 * (1 - std::pow(1 - 2.0 / 8, 8));
  const double read = 2.0 * (router + active * expert) / 10e9, flops = 8 * 2.0 * (2 * expert + router) / 1e12;
  CHECK(b.decode.terms[CATT] == Approx(4 * std::max(read, flops)));
  CHECK(a.decode.terms[COMP] - b.decode.terms[COMP] == Approx(32 * 2.0 * (2 * expert + router) / 10e12));
  // Prefill is untouched without cpu_experts_prefill; with it the whole prompt's rows cross.
  CHECK(b.prefill.terms[CTOG] == Approx(a.prefill.terms[CTOG]));
  computed.cpu_experts_prefill = true;
  const Prediction c = evaluate(mx, computed, wl, hw);
  CHECK(c.prefill.terms[CTOG] == Approx((attn_half + 512 * rows) / 10e9));
  CHECK(c.prefill.terms[CATT] > 0);
  // A dense model ignores the option.
  Policy dense = policy_of(8, 4, {0, 100, 0}, {100, 0, 0}, {100, 0, 0});
  dense.cpu_experts_decode = true;
  CHECK(evaluate(opt67(), dense, wl, hw).decode.terms[CTOG] == Approx(W / 10e9));
}

TEST_CASE("experts on the CPU are priced at the profile's weight-streaming rate, else at its attention rate",
          "[cost][moe]") {
  // The same Mixtral decode as above: a GPU batch of 8 tokens reads the router and 7.199 experts
  // in expectation. With cpu_weight_bw 40 GB/s the read takes a quarter of its time at the CPU
  // attention's 10 GB/s; 4-bit experts are read at cpu_weight_q4_bw (in the fp16 bytes they stand
  // for). Without the weight rates (an older profile) both fall back to the attention rates.
  const ModelConfig mx = *config_preset("mixtral-8x7b");
  const double hm = 4096, f = 14336, expert = 3 * hm * f, router = 8 * hm;
  const double active = 8 * (1 - std::pow(1 - 2.0 / 8, 8)), fp16_read = 2.0 * (router + active * expert);
  Policy computed = policy_of(8, 4, {0, 100, 0}, {100, 0, 0}, {100, 0, 0});
  computed.cpu_experts_decode = true;
  HardwareProfile hw = round_machine();
  hw.cpu_attention_q4_bw = 20e9;
  CHECK(cpu_weight_rate(hw, false) == 10e9);
  CHECK(cpu_weight_rate(hw, true) == 20e9);
  CHECK(evaluate(mx, computed, wl, hw).decode.terms[CATT] == Approx(4 * fp16_read / 10e9));
  hw.cpu_weight_bw = 40e9;
  hw.cpu_weight_q4_bw = 80e9;
  CHECK(cpu_weight_rate(hw, false) == 40e9);
  CHECK(cpu_weight_rate(hw, true) == 80e9);
  CHECK(evaluate(mx, computed, wl, hw).decode.terms[CATT] == Approx(4 * fp16_read / 40e9));
  Policy q4 = computed;
  q4.compress_weights = Compression{4, 64};
  CHECK(evaluate(mx, q4, wl, hw).decode.terms[CATT] == Approx(4 * fp16_read / 80e9));
  // With a CPU linear curve (10 GFLOP/s at 1 token, 40 at 8, linear in log tokens between): the
  // router's GEMM over the batch's 8 tokens at 40, and each active expert over the 8 x 2 / 7.199 =
  // 2.222 tokens routed to it, at 10 + 30 log(2.222) / log(8) = 21.52 GFLOP/s. 4-bit experts keep
  // the roofline above until the profile has a curve over codes too.
  hw.cpu_gemm = {{1, 10e9}, {8, 40e9}};
  const double per_expert = 8 * 2 / active, rate = 10e9 + 30e9 * std::log(per_expert) / std::log(8.0);
  CHECK(rate == Approx(21.52e9).epsilon(1e-3));
  const double curve_s = 2.0 * 8 * router / 40e9 + 2.0 * 8 * 2 * expert / rate;
  CHECK(evaluate(mx, computed, wl, hw).decode.terms[CATT] == Approx(4 * curve_s));
  CHECK(evaluate(mx, q4, wl, hw).decode.terms[CATT] == Approx(4 * fp16_read / 80e9));
  // With the curve over 4-bit codes (5 GFLOP/s at 1 token, 20 at 8): 4-bit experts at
  // 5 + 15 log(2.222) / log(8) = 10.76 GFLOP/s, the router (kept in the compute dtype) still on
  // cpu_gemm's 40; the uncompressed experts do not change.
  hw.cpu_gemm_q4 = {{1, 5e9}, {8, 20e9}};
  const double q4_rate = 5e9 + 15e9 * std::log(per_expert) / std::log(8.0);
  CHECK(q4_rate == Approx(10.76e9).epsilon(1e-3));
  CHECK(evaluate(mx, q4, wl, hw).decode.terms[CATT] ==
        Approx(4 * (2.0 * 8 * router / 40e9 + 2.0 * 8 * 2 * expert / q4_rate)));
  CHECK(evaluate(mx, computed, wl, hw).decode.terms[CATT] == Approx(4 * curve_s));
  // A profile with the codes' curve alone prices the router on it too.
  hw.cpu_gemm.clear();
  CHECK(evaluate(mx, q4, wl, hw).decode.terms[CATT] ==
        Approx(4 * (2.0 * 8 * router / 20e9 + 2.0 * 8 * 2 * expert / q4_rate)));
}

TEST_CASE("experts on the CPU: each matrix at its own size's rate, or the step's experts together at theirs",
          "[cost][moe]") {
  // Qwen3-30B-A3B. Curves flat in tokens: the large matrix (64M weights) at 40 GFLOP/s, the small
  // (1M) at 10; a matrix of P weights at 10 x 4^(log(P / 1M) / log(64)), geometric in log(weights),
  // held at 10 below 1M and at 40 above 64M. The router [128, 2048] (262144 weights) is below the
  // small one, so at 10.
  const ModelConfig qw = *config_preset("qwen3-30b-a3b");
  const double hq = 2048, fq = 768, gate_up = 2 * fq * hq, down = hq * fq;
  auto rate = [](double params) {
    return 10e9 * std::pow(4.0, std::clamp(std::log(params / 1e6) / std::log(64.0), 0.0, 1.0));
  };
  CHECK(rate(gate_up) == Approx(14.65e9).epsilon(1e-3));
  CHECK(rate(down) == Approx(11.63e9).epsilon(1e-3));
  Policy computed = policy_of(8, 1, {0, 100, 0}, {100, 0, 0}, {100, 0, 0});
  computed.cpu_experts_decode = true;
  HardwareProfile hw = round_machine();
  hw.cpu_gemm = {{1, 40e9}};
  hw.cpu_gemm_q4 = {{1, 40e9}};
  hw.cpu_gemm_params = 64e6;
  hw.cpu_gemm_small = {{1, 10e9}};
  hw.cpu_gemm_q4_small = {{1, 10e9}};
  hw.cpu_gemm_small_params = 1e6;
  const CostSizes z = cost_forms(qw, computed, wl, hw).sizes;
  const auto seconds = [&](double tokens, double gate_up_rate, double down_rate) {
    const double routed = tokens * 8;
    return 2.0 * tokens * 128 * hq / 10e9 + 2.0 * routed * gate_up / gate_up_rate + 2.0 * routed * down / down_rate;
  };
  // A decode step's GPU batch of 8 tokens: 8 x 8 = 64 routed to 128 (1 - (1 - 1/16)^8) = 51.62
  // active experts, 1.240 tokens each. Over 4-bit codes, within the codes kernel's 24 tokens
  // (cpu_linear.h), the experts' gate/up run in one region and their downs in another
  // (Backend::linears): 51.62 x 3.15M and 51.62 x 1.57M weights, both above the large matrix, at
  // 40. So do a GPU host's fp16 experts (compute dtype F16), which stream up to 8 tokens each.
  const double active = 128 * (1 - std::pow(1 - 1.0 / 16, 8));
  CHECK(active * down > 64e6);
  CHECK(evaluate(qw, computed, wl, hw).decode.terms[CATT] == Approx(seconds(8, 40e9, 40e9)));
  CHECK(cpu_experts_seconds(qw, z, 8, false, hw) == Approx(seconds(8, 40e9, 40e9)));
  CHECK(cpu_experts_seconds(qw, z, 8, true, hw) == Approx(seconds(8, 40e9, 40e9)));
  // 512 tokens (a prefill): all 128 experts active (to 1e-14), 32 tokens each, beyond the codes'
  // limit: each expert's own linears, each matrix at its own size's rate.
  CHECK(cpu_experts_seconds(qw, z, 512, false, hw) == Approx(seconds(512, rate(gate_up), rate(down))));
  CHECK(cpu_experts_seconds(qw, z, 512, true, hw) == Approx(seconds(512, rate(gate_up), rate(down))));
  // 256 tokens, 16 each: within the codes' limit, beyond the 16-bit weights' 8.
  CHECK(cpu_experts_seconds(qw, z, 256, false, hw) == Approx(seconds(256, rate(gate_up), rate(down))));
  CHECK(cpu_experts_seconds(qw, z, 256, true, hw) == Approx(seconds(256, 40e9, 40e9)));
  // The CPU backend's fp32 experts: a single token runs alone (sgemv), so at 1.24 tokens each the
  // experts are priced one by one; at 32 tokens, 2.29 each over 111.75 active, together.
  hw.compute_dtype = DType::F32;
  CHECK(cpu_experts_seconds(qw, z, 8, false, hw) == Approx(seconds(8, rate(gate_up), rate(down))));
  const double active32 = 128 * (1 - std::pow(1 - 1.0 / 16, 32));
  CHECK(32 * 8 / active32 == Approx(2.290).epsilon(1e-3));
  CHECK(cpu_experts_seconds(qw, z, 32, false, hw) == Approx(seconds(32, 40e9, 40e9)));
  CHECK(cpu_experts_seconds(qw, z, 8, true, hw) == Approx(seconds(8, 40e9, 40e9)));
  hw.compute_dtype = DType::F16;
  // Without the small curve every matrix is at the large one's 40.
  hw.cpu_gemm_small.clear();
  CHECK(evaluate(qw, computed, wl, hw).decode.terms[CATT] == Approx(2.0 * 8 * (128 * hq + 8 * 3 * fq * hq) / 40e9));
  CHECK(cpu_experts_seconds(qw, z, 512, false, hw) == Approx(2.0 * 512 * (128 * hq + 8 * 3 * fq * hq) / 40e9));
}

TEST_CASE("a mixture of experts' GEMMs are priced over the rows routed to each expert", "[cost][moe]") {
  // Qwen3-30B-A3B with everything on the GPU, and a GEMM curve that rises with rows: 1 TFLOP/s at
  // 1 row, 64 at 64 and beyond (HardwareProfile::gemm_flops interpolates it). The attention
  // half's, the router's and the head's GEMMs run over a step's rows; each active expert's over the
  // rows routed to it, rows k / E_act(rows) on average (ForwardOps groups a step's rows by expert).
  const ModelConfig qw = *config_preset("qwen3-30b-a3b");
  HardwareProfile hw = round_machine();
  hw.gpu_gemm = {{1, 1e12}, {64, 64e12}};
  const CostForms F = cost_forms(qw, policy_of(8, 2, {100, 0, 0}, {100, 0, 0}, {100, 0, 0}), wl, hw);
  const double hq = 2048, experts = 2.0 * 8 * 3 * hq * 768, bls = 16, s = 512;
  const double head = 2.0 * double(qw.vocab_size) * hq / qw.n_layers;
  CHECK(F.sizes.expert_flops_per_token == experts);
  const auto rate = [&](double rows) { return hw.gemm_flops(rows, hq); };
  // Decode, a GPU batch of 8: 64 routed rows over 128 (1 - (1 - 1/16)^8) = 51.62 active experts,
  // 1.240 each, where the curve gives a sixth of its rate for the batch's 8 rows.
  const double decode_rows = 8 * 8 / expected_active_experts(128, 8, 8);
  CHECK(decode_rows == Approx(1.240).epsilon(1e-3));
  CHECK(rate(decode_rows) < rate(8) / 5);
  CHECK(F.decode[COMP].constant ==
        Approx(bls * (F.sizes.layer_flops_per_token - experts + head) / rate(8) + bls * experts / rate(decode_rows)));
  // Prefill in steps of min(step tokens, 8 x 512) rows; the experts over rows x 8 / E_act(rows).
  const double rows = std::min(F.sizes.step_tokens, 8 * s), prefill_rows = rows * 8 / expected_active_experts(128, 8, rows);
  CHECK(prefill_rows == Approx(rows / 16).epsilon(1e-6));  // every expert active
  const double attention = 4.0 * s * s * qw.q_dim() / rate(s);
  CHECK(F.prefill[COMP].constant ==
        Approx(bls * s * (F.sizes.layer_flops_per_token - experts) / rate(rows) + bls * s * experts / rate(prefill_rows) +
               bls * attention + bls * 2.0 * double(qw.vocab_size) * hq / rate(F.sizes.prefill_seqs) / qw.n_layers));
  // 4-bit weights in a decode batch within the fused linear's limit (16): the codes are read in
  // the fused linear, which the GEMM term over the batch's rows stands for, experts included.
  Policy q4 = policy_of(8, 2, {100, 0, 0}, {100, 0, 0}, {100, 0, 0});
  q4.compress_weights = Compression{4, 64};
  CHECK(cost_forms(qw, q4, wl, hw).decode[COMP].constant ==
        Approx(bls * (F.sizes.layer_flops_per_token + head) / rate(8)));
  // A dense model's GEMMs all run over the step's rows.
  CHECK(cost_forms(opt67(), policy_of(8, 2, {100, 0, 0}, {100, 0, 0}, {100, 0, 0}), wl, hw).sizes.expert_flops_per_token == 0);
}

TEST_CASE("experts placed apart: the attention halves follow the fractions, the experts' tiers are fixed",
          "[cost][moe]") {
  // Mixtral-8x7B with every attention half on the GPU and every MLP half on the CPU tier
  // (expert_weights {0, 100, 0}): a decode step moves each layer's router and experts, Wm, and
  // nothing else; the GPU holds 32 attention halves and one MLP buffer instead of 32 layers;
  // the CPU holds the 32 MLP halves. The fractions now price the attention halves alone.
  const ModelConfig mx = *config_preset("mixtral-8x7b");
  const double hm = 4096, f = 14336, Wm = 2.0 * (8 * 3 * hm * f + 8 * hm);
  const HardwareProfile hw = round_machine();
  const Policy all_gpu = policy_of(8, 4, {100, 0, 0}, {100, 0, 0}, {100, 0, 0});
  Policy apart = all_gpu;
  apart.expert_weights = TierSplit{0, 100, 0};
  const Prediction a = evaluate(mx, all_gpu, wl, hw), b = evaluate(mx, apart, wl, hw);
  CHECK(a.decode.terms[CTOG] == 0);
  CHECK(b.decode.terms[CTOG] == Approx(Wm / 10e9));
  CHECK(b.prefill.terms[CTOG] == Approx(Wm / 10e9));
  CHECK(b.peak.cpu == Approx(32 * Wm));
  CHECK(b.peak.gpu == Approx(a.peak.gpu - 32 * Wm + Wm));
  // The same forms for any attention split: moving attention halves to the CPU adds their bytes.
  const CostForms F = cost_forms(mx, apart, wl, hw);
  const double Wa = F.sizes.layer_weights - Wm;
  CHECK(F.decode[CTOG].coef[WC] == Approx(Wa / 10e9));
  CHECK(F.decode[CTOG].constant == Approx(Wm / 10e9));
  // Computed on the CPU in decode: the rows cross instead, and the CPU reads the active experts.
  apart.cpu_experts_decode = true;
  const Prediction c = evaluate(mx, apart, wl, hw);
  const double rows = 32 * 2 * hm;
  CHECK(c.decode.terms[CTOG] == Approx(rows / 10e9));
  CHECK(c.decode.terms[GTOC] == Approx(rows / 10e9));
  CHECK(c.decode.terms[CATT] > 0);
  // Tied (no expert_weights), the same policy's weights on the CPU move whole layers: the forms
  // of before experts could be placed apart.
  const Prediction tied = evaluate(mx, policy_of(8, 4, {0, 100, 0}, {100, 0, 0}, {100, 0, 0}), wl, hw);
  CHECK(tied.decode.terms[CTOG] == Approx((Wa + Wm) / 10e9));
}

TEST_CASE("the MLP halves' own fractions price what a fixed expert_weights prices at the same split", "[cost][moe]") {
  // ExpertSplit::Free makes the MLP halves' shares the variables mg, mc, md (the search's second
  // weight class). At a whole-layer split they give evaluate's terms and, off the disk and short
  // of all resident, its peaks: the GPU's MLP buffer is counted whole, as the runtime allocates it.
  const ModelConfig mx = *config_preset("mixtral-8x7b");
  const double hm = 4096, f = 14336, Wm = 2.0 * (8 * 3 * hm * f + 8 * hm);
  const HardwareProfile hw = round_machine();
  Policy p = policy_of(8, 4, {25, 75, 0}, {100, 0, 0}, {100, 0, 0});
  p.expert_weights = TierSplit{25, 75, 0};
  p.cpu_experts_decode = true;
  const CostForms F = cost_forms(mx, p, wl, hw, ExpertSplit::Free);
  CHECK(F.experts_free);
  CHECK(F.decode[DTOC].coef[MD] == Approx(Wm / 2e9));
  CHECK(F.prefill[CTOG].coef[MC] == Approx(Wm / 10e9));  // prefill moves them
  CHECK(F.decode[CATT].coef[MC] > 0);                     // decode computes them where they live
  CHECK(F.peak[int(Tier::Gpu)].coef[MG] == Approx(32 * Wm));
  CHECK(F.peak[int(Tier::Cpu)].coef[MC] == Approx(32 * Wm));
  const Fractions x = realized_fractions(p, 32);
  CHECK(x[MG] == 0.25);
  CHECK(x[MC] == 0.75);
  const Prediction free = predict(F, x), fixed = evaluate(mx, p, wl, hw);
  for (int t = 0; t < kNumTerms; ++t) {
    CHECK(free.prefill.terms[t] == Approx(fixed.prefill.terms[t]).margin(1e-15));
    CHECK(free.decode.terms[t] == Approx(fixed.decode.terms[t]).margin(1e-15));
  }
  CHECK(free.total_s == Approx(fixed.total_s));
  for (Tier t : {Tier::Gpu, Tier::Cpu, Tier::Disk}) CHECK(free.peak.at(t) == Approx(fixed.peak.at(t)));
  // The policy's own split is not read: the fractions are the LP's to choose.
  auto same_forms = [](const CostForms& a, const CostForms& b) {
    auto same = [](const LinearForm& x, const LinearForm& y) { return x.constant == y.constant && x.coef == y.coef; };
    for (int t = 0; t < kNumTerms; ++t)
      if (!same(a.prefill[t], b.prefill[t]) || !same(a.decode[t], b.decode[t])) return false;
    for (int t = 0; t < 3; ++t)
      if (!same(a.peak[t], b.peak[t])) return false;
    return true;
  };
  Policy other = p;
  other.expert_weights = TierSplit{0, 100, 0};
  CHECK(same_forms(cost_forms(mx, other, wl, hw, ExpertSplit::Free), F));
  // A dense model has no MLP halves to place apart: the same forms either way, none on m.
  const Policy dense = policy_of(8, 4, {25, 75, 0}, {100, 0, 0}, {100, 0, 0});
  const CostForms a = cost_forms(opt67(), dense, wl, hw, ExpertSplit::Free), b = cost_forms(opt67(), dense, wl, hw);
  CHECK_FALSE(a.experts_free);
  CHECK(same_forms(a, b));
  for (int v = MG; v <= MD; ++v) CHECK(b.peak[int(Tier::Gpu)].coef[v] == 0);
}
