#include "strata/policy/placement.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>

#include "strata/core/error.h"
#include "strata/core/size.h"
#include "strata/runtime/forward_ops.h"
#include "strata/runtime/model_weights.h"

namespace strata {

const char* tier_name(Tier t) { return t == Tier::Gpu ? "gpu" : t == Tier::Cpu ? "cpu" : "disk"; }

TierBytes PlacementPlan::peak() const {
  TierBytes t = weights;
  t += kv_cache;
  t += activations;
  t += working;
  return t;
}

std::vector<Tier> assign_tiers(int n, const TierSplit& split) {
  std::vector<Tier> tiers;
  for (int i = 0; i < n; ++i) {
    const double mid = (i + 0.5) / n * 100.0;
    tiers.push_back(mid < split.gpu ? Tier::Gpu : mid < split.gpu + split.cpu ? Tier::Cpu : Tier::Disk);
  }
  return tiers;
}

namespace {

int count(const std::vector<Tier>& v, Tier t) {
  int n = 0;
  for (Tier x : v) n += x == t;
  return n;
}

TierSplit realized(const std::vector<Tier>& v) {
  if (v.empty()) return {};
  auto pct = [&](Tier t) { return int(std::lround(100.0 * count(v, t) / double(v.size()))); };
  TierSplit s{pct(Tier::Gpu), pct(Tier::Cpu), 0};
  s.disk = 100 - s.gpu - s.cpu;
  return s;
}

// Bytes of `units` tensors of `unit` bytes each, by their tiers.
TierBytes bytes_by_tier(const std::vector<Tier>& tiers, double unit, double multiplier) {
  TierBytes b;
  for (Tier t : tiers) b.at(t) += unit * multiplier;
  return b;
}

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

}  // namespace

std::optional<quant::QuantSpec> quant_spec(const std::optional<Compression>& c) {
  if (!c) return std::nullopt;
  quant::QuantSpec q;
  q.bits = c->bits;
  q.group_size = c->group_size;
  return q;
}

namespace {

// The first layer whose MLP is (or is not) a mixture of experts; 0 if none is.
int first_layer_of_kind(const ModelConfig& cfg, bool sparse) {
  for (int l = 0; l < cfg.n_layers; ++l)
    if (cfg.sparse_layer(l) == sparse) return l;
  return 0;
}

const HalvedLayout& largest(const std::vector<HalvedLayout>& kinds) {
  return *std::max_element(kinds.begin(), kinds.end(),
                           [](const HalvedLayout& a, const HalvedLayout& b) { return a.layout.bytes < b.layout.bytes; });
}

}  // namespace

std::vector<HalvedLayout> layer_kinds(const ModelConfig& cfg, DType dtype, size_t align,
                                      const std::optional<quant::QuantSpec>& compression) {
  std::vector<HalvedLayout> kinds = {halved_layer_layout(cfg, first_layer_of_kind(cfg, false), dtype, align, compression)};
  if (!cfg.uniform_layers()) kinds.push_back(halved_layer_layout(cfg, first_layer_of_kind(cfg, true), dtype, align, compression));
  return kinds;
}

PlacementPlan plan_placement(const ModelConfig& cfg, const Policy& policy, const PlanShape& shape, DType dtype) {
  STRATA_CHECK(shape.prompt_len > 0 && shape.gen_len >= 0, "plan: prompt length must be positive");
  const size_t e = dtype_size(dtype);
  const int L = cfg.n_layers, gbs = policy.gpu_batch_size, ngb = policy.num_gpu_batches;
  const size_t disk_align = 4096;  // the disk store's O_DIRECT unit

  PlacementPlan p;
  const int P = shape.prompt_len, C = shape.capacity();
  const PrefillSteps steps = prefill_steps(policy, P);
  p.prefill_seqs = steps.seqs;
  p.step_tokens = steps.step_tokens;

  p.weight_tier = assign_tiers(L, policy.weights);
  p.expert_tier = policy.expert_weights ? assign_tiers(L, *policy.expert_weights) : p.weight_tier;
  p.cache_tier = assign_tiers(L, policy.kv_cache);
  p.act_tier = assign_tiers(ngb, policy.activations);  // one hidden state per GPU batch

  const std::optional<quant::QuantSpec> wq = quant_spec(policy.compress_weights);
  const std::optional<quant::QuantSpec> cq = quant_spec(policy.compress_kv_cache);
  // A cache position: kv_heads rows of head_dim, each quantized on its own when compressed.
  const size_t kv_row = cq ? size_t(cfg.n_kv_heads) * quant::row_bytes(*cq, cfg.head_dim) : size_t(cfg.kv_dim()) * e;
  const size_t h_row = size_t(cfg.hidden) * e;
  // A layer's block as it streams: its attention half, then its MLP half, each page-aligned. A
  // model with dense MLPs among sparse ones (mlp_only_layers) has two kinds of layer: the buffers
  // take the larger, the homes each layer's own.
  const std::vector<HalvedLayout> kinds = layer_kinds(cfg, dtype, disk_align, wq);
  const HalvedLayout& halves = largest(kinds);
  p.layer_weight_bytes = halves.layout.bytes;
  p.attn_weight_bytes = halves.attn_bytes;
  for (const HalvedLayout& k : kinds) p.mlp_weight_bytes = std::max(p.mlp_weight_bytes, k.mlp_bytes);
  p.global_weight_bytes = align_up(global_block_layout(cfg, dtype).bytes, disk_align);
  p.cache_unit_bytes = 2 * align_up(size_t(gbs) * size_t(C) * kv_row, disk_align);
  // Decode brings a layer's cache to the GPU unless it is there already or the CPU attends to it
  // (in place on the CPU tier, in a pinned mirror for disk); prefill always computes it on the
  // GPU, a unit's slots at a time.
  bool decode_moves_cache = false;
  for (Tier t : p.cache_tier) decode_moves_cache |= t != Tier::Gpu && !policy.cpu_attention;
  const int stage_slots = decode_moves_cache ? gbs : p.prefill_seqs;
  p.cache_stage_bytes = 2 * align_up(size_t(stage_slots) * size_t(C) * kv_row, disk_align);
  const int units_per_batch = (gbs + p.prefill_seqs - 1) / p.prefill_seqs;
  p.act_piece_bytes = align_up(size_t(p.prefill_seqs) * size_t(P) * h_row, disk_align);
  const size_t decode_rows = align_up(size_t(gbs) * h_row, disk_align);
  p.act_unit_bytes = std::max(size_t(units_per_batch) * p.act_piece_bytes, decode_rows);
  // A prefill unit longer than a step (one prompt over prefill_tokens) is computed in steps over
  // its staged piece, so the piece, not the step, bounds the staging slot.
  p.act_stage_bytes = std::max(p.act_piece_bytes, decode_rows);

  p.realized_weights = realized(p.weight_tier);
  p.realized_expert_weights = realized(p.expert_tier);
  p.realized_kv_cache = realized(p.cache_tier);
  p.realized_activations = realized(p.act_tier);

  p.weights = bytes_by_tier(p.weight_tier, double(p.attn_weight_bytes), 1);
  for (int l = 0; l < L; ++l)
    p.mlp_weights.at(p.expert_tier[size_t(l)]) += double(kinds[layer_kind(cfg, l)].mlp_bytes);
  p.weights += p.mlp_weights;
  p.weights.gpu += double(p.global_weight_bytes);
  p.kv_cache = bytes_by_tier(p.cache_tier, double(p.cache_unit_bytes), ngb);
  p.activations = bytes_by_tier(p.act_tier, double(p.act_unit_bytes), 1);

  // Working buffers, as the schedule allocates them (src/offload/engine.cpp, engine_steps.cpp).
  const bool attn_moves = count(p.weight_tier, Tier::Gpu) < L, mlp_moves = count(p.expert_tier, Tier::Gpu) < L;
  const bool cache_moves = count(p.cache_tier, Tier::Gpu) < L;
  const bool acts_move = count(p.act_tier, Tier::Gpu) < ngb;
  TierBytes& w = p.working;
  // Every piece is carved at 4 KiB alignment (src/offload/tiers.cpp), so count it rounded up.
  w.gpu += double(align_up(ForwardOps::workspace_bytes(cfg, dtype, p.step_tokens, gbs), disk_align));
  if (cfg.pos == PosKind::Rope) w.gpu += double(align_up(size_t(cfg.head_dim / 2) * 4, disk_align));
  if (cfg.attn_sinks) w.gpu += double(align_up(size_t(cfg.n_layers) * size_t(cfg.n_heads) * 4, disk_align));
  // Weights stream half a layer at a time, each half loading while the other computes: one
  // buffer per half, one layer in all. Cache and hidden states: the unit computed, the next one
  // loaded and the previous one stored.
  if (attn_moves) w.gpu += double(p.attn_weight_bytes);
  if (mlp_moves) w.gpu += double(p.mlp_weight_bytes);
  // Compressed weights are read as codes by the fused linear in decode; a step with more tokens
  // dequantizes its half-layer once (for every unit of the block) into one buffer of the larger
  // uncompressed half.
  const std::vector<HalvedLayout> fp = wq ? layer_kinds(cfg, dtype, disk_align, std::nullopt) : kinds;
  p.uncompressed_layer_bytes = largest(fp).layout.bytes;
  if (wq) {
    for (const HalvedLayout& k : fp) p.dequant_bytes = std::max({p.dequant_bytes, k.attn_bytes, k.mlp_bytes});
    w.gpu += double(p.dequant_bytes);
  }
  if (cache_moves) w.gpu += 3.0 * double(p.cache_stage_bytes);
  if (acts_move) w.gpu += 3.0 * double(p.act_stage_bytes);
  // Disk transfers pass through pinned mirrors of whole units (O_DIRECT needs the file's page
  // alignment in memory too).
  if (count(p.weight_tier, Tier::Disk) > 0) w.cpu += double(p.attn_weight_bytes);
  if (count(p.expert_tier, Tier::Disk) > 0) w.cpu += double(p.mlp_weight_bytes);
  if (count(p.cache_tier, Tier::Disk) > 0) w.cpu += 3.0 * double(p.cache_unit_bytes);
  if (count(p.act_tier, Tier::Disk) > 0) w.cpu += 3.0 * double(p.act_unit_bytes);
  if (policy.cpu_attention && count(p.cache_tier, Tier::Gpu) < L) {
    // q, k, v and the attention output of a step cross to the host and back, two steps' worth
    // (one crossing while the CPU attends to the other's), with two GPU buffers for the output.
    // A step of continuous batching carries prompt pieces beside the decode tokens: up to
    // step_tokens of them.
    const size_t rows = size_t(p.step_tokens);
    w.cpu += 4.0 * double(align_up(rows * size_t(cfg.q_dim()) * e, disk_align));
    w.cpu += 4.0 * double(align_up(rows * size_t(cfg.kv_dim()) * e, disk_align));
    w.gpu += 2.0 * double(align_up(rows * size_t(cfg.q_dim()) * e, disk_align));
  }
  if (cpu_experts_used(cfg, policy, p.expert_tier)) {
    // Experts computed on the CPU (docs/moe.md): two buffers of a step's hidden rows crossing to
    // the host and back, the CPU's workspace, and the rows widened to fp32 for it.
    const size_t rows = size_t(p.step_tokens) * size_t(cfg.hidden);
    w.cpu += 2.0 * double(align_up(rows * e, disk_align));
    w.cpu += double(align_up(ForwardOps::workspace_bytes(cfg, DType::F32, p.step_tokens, 1), disk_align));
    if (dtype != DType::F32) w.cpu += double(align_up(rows * 4, disk_align));
  }
  return p;
}

bool cpu_experts_used(const ModelConfig& cfg, const Policy& policy, const std::vector<Tier>& expert_tier) {
  return cfg.n_experts > 0 && (policy.cpu_experts_prefill || policy.cpu_experts_decode) &&
         std::count(expert_tier.begin(), expert_tier.end(), Tier::Cpu) > 0;
}

std::string describe_plan(const PlacementPlan& plan, const Policy& policy) {
  std::ostringstream os;
  auto line = [&](const char* name, const TierBytes& b, const TierSplit& real, const TierSplit& asked,
                  const char* unit) {
    os << "  " << name << ":";
    for (Tier t : {Tier::Gpu, Tier::Cpu, Tier::Disk}) {
      const int pct = t == Tier::Gpu ? real.gpu : t == Tier::Cpu ? real.cpu : real.disk;
      os << "  " << tier_name(t) << " " << pct << "% (" << format_bytes(b.at(t)) << ")";
    }
    os << "  [policy " << asked.gpu << "/" << asked.cpu << "/" << asked.disk << ", by " << unit << "]\n";
  };
  if (policy.expert_weights) {  // each half its own split
    const TierBytes& experts = plan.mlp_weights;
    TierBytes rest = plan.weights;
    for (Tier t : {Tier::Gpu, Tier::Cpu, Tier::Disk}) rest.at(t) -= experts.at(t);
    line("weights    ", rest, plan.realized_weights, policy.weights, "attention half");
    line("experts    ", experts, plan.realized_expert_weights, *policy.expert_weights, "MLP half");
  } else {
    line("weights    ", plan.weights, plan.realized_weights, policy.weights, "layer");
  }
  line("kv_cache   ", plan.kv_cache, plan.realized_kv_cache, policy.kv_cache, "layer");
  line("activations", plan.activations, plan.realized_activations, policy.activations, "GPU batch");
  auto spec = [](const Compression& c) { return std::to_string(c.bits) + "-bit, groups of " + std::to_string(c.group_size); };
  if (policy.compress_weights)
    os << "  compressed : weights " << spec(*policy.compress_weights) << ": a layer is " << format_bytes(double(plan.layer_weight_bytes))
       << " as stored and moved, " << format_bytes(double(plan.uncompressed_layer_bytes)) << " uncompressed ("
       << std::fixed << std::setprecision(2) << double(plan.uncompressed_layer_bytes) / double(plan.layer_weight_bytes)
       << "x less)\n";
  if (policy.compress_kv_cache) os << "  compressed : kv_cache " << spec(*policy.compress_kv_cache) << ", along head_dim\n";
  os << "  working    :";
  for (Tier t : {Tier::Gpu, Tier::Cpu, Tier::Disk}) os << "  " << tier_name(t) << " " << format_bytes(plan.working.at(t));
  os << "\n  peak       :";
  const TierBytes peak = plan.peak();
  for (Tier t : {Tier::Gpu, Tier::Cpu, Tier::Disk}) os << "  " << tier_name(t) << " " << format_bytes(peak.at(t));
  os << "\n";
  return os.str();
}

}  // namespace strata
