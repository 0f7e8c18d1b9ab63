// The offloading engine: setup (tiers, homes, weights placed) and the public API. The
// transfers are in engine_transfers.cpp, the steps and the block schedule in engine_steps.cpp.
#include "strata/offload/engine.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <tuple>
#include "strata/core/error.h"
#include "strata/core/size.h"
#include "strata/core/thread_pool.h"
#include "strata/offload/lanes.h"
#include "strata/offload/tiers.h"
#include "strata/runtime/forward_ops.h"
#include "strata/runtime/model_weights.h"
#include "strata/runtime/sequence.h"

#include "engine_impl.h"

namespace strata {


double OffloadReport::overlap() const {
  const double lanes[] = {compute_busy, h2d_busy, d2h_busy, disk_busy};
  double sum = 0, mx = 0;
  for (double b : lanes) {
    sum += b;
    mx = std::max(mx, b);
  }
  if (sum - mx <= 1e-9) return 1.0;
  return std::clamp((sum - schedule_seconds) / (sum - mx), 0.0, 1.0);
}

TierBytes default_budgets(Backend& backend, const OffloadOptions& options) {
  TierBytes b;
  const size_t gpu_free = backend.available_memory();
  b.gpu = options.gpu_budget > 0 ? options.gpu_budget : gpu_free == SIZE_MAX ? 1e18 : 0.95 * double(gpu_free);
  b.cpu = options.cpu_budget > 0 ? options.cpu_budget : 0.9 * double(host_memory_available());
  const std::filesystem::path dir = options.offload_dir.empty() ? default_offload_dir() : options.offload_dir;
  std::error_code ec;
  std::filesystem::path probe = dir;
  while (!probe.empty() && !std::filesystem::exists(probe, ec)) probe = probe.parent_path();
  b.disk = double(free_disk_space(probe.empty() ? std::filesystem::path(".") : probe));
  if (options.disk_budget > 0) b.disk = std::min(b.disk, options.disk_budget);
  return b;
}

std::string describe_weight_codes(const OffloadReport& report, const Compression& compression) {
  std::ostringstream os;
  os << "compressed weights (" << compression.bits << "-bit, group " << compression.group_size << "): "
     << report.weights_kept_codes << " matrices keep the file's codes, " << report.weights_quantized
     << " quantized at load";
  return os.str();
}

void check_plan_fits(const PlacementPlan& plan, const TierBytes& budgets, bool shared_host_memory) {
  const TierBytes peak = plan.peak();
  for (Tier t : {Tier::Gpu, Tier::Cpu, Tier::Disk}) {
    if (peak.at(t) <= budgets.at(t)) continue;
    STRATA_FAIL("policy does not fit: the " << tier_name(t) << " tier needs " << format_bytes(peak.at(t)) << " (weights "
                                           << format_bytes(plan.weights.at(t)) << ", kv_cache "
                                           << format_bytes(plan.kv_cache.at(t)) << ", activations "
                                           << format_bytes(plan.activations.at(t)) << ", working buffers "
                                           << format_bytes(plan.working.at(t)) << ") but its budget is "
                                           << format_bytes(budgets.at(t))
                                           << (t == Tier::Gpu ? " (--gpu-mem)" : t == Tier::Cpu ? " (--cpu-mem)"
                                                                                                : " (--disk-mem, or the offload dir's free space)")
                                           << (t == Tier::Gpu ? "; the working buffers hold prefill steps of " +
                                                                    std::to_string(plan.step_tokens) +
                                                                    " tokens (--prefill-tokens)"
                                                              : std::string()));
  }
  // With the CPU backend the "GPU" tier is host memory too; both must fit in it together.
  const double host = double(host_memory_available());
  if (shared_host_memory && host > 0 && peak.gpu + peak.cpu > host)
    STRATA_FAIL("policy does not fit: the gpu and cpu tiers are both host memory on the cpu backend and need "
                << format_bytes(peak.gpu + peak.cpu) << " together, but only " << format_bytes(host) << " are available");
}

void OffloadEngine::Impl::reserve() {
  const TierBytes peak = plan.peak();
  gpu_mem = be.alloc(size_t(peak.gpu) + kPage);
  gpu = Region("gpu", static_cast<char*>(gpu_mem.data()), gpu_mem.bytes());
  if (peak.cpu > 0) {
    pinned_mem = static_cast<char*>(be.alloc_host(size_t(peak.cpu) + kPage));
    cpu = Region("cpu", pinned_mem, size_t(peak.cpu) + kPage);
  }
  if (peak.disk > 0) {
    disk = std::make_unique<DiskStore>(opt.offload_dir.empty() ? default_offload_dir() : opt.offload_dir,
                                       size_t(peak.disk), opt.disk_mode);
  }
}

Home OffloadEngine::Impl::place(Tier tier, size_t bytes, const char* what) {
  Home h;
  h.tier = tier;
  if (tier == Tier::Gpu) h.ptr = gpu.take(bytes, what);
  else if (tier == Tier::Cpu) h.ptr = cpu.take(bytes, what);
  else h.disk_offset = disk->allocate(bytes);
  return h;
}

void OffloadEngine::Impl::load_weights(const WeightSource& src) {
  std::set<std::string> used;
  const BlockLayout gl = global_block_layout(cfg, dt);
  // Conversions, dequantization of GGUF block types and quantization at load use the host threads
  // the job was given (--threads).
  ThreadPool pool(opt.cpu_threads);
  std::vector<uint8_t> staging(gl.bytes);
  read_block(gl, src, staging.data(), used, nullptr, &pool);
  char* g = gpu.take(gl.bytes, "global weights");
  be.copy_to_device(g, staging.data(), gl.bytes);
  set_global_views(cfg, gl, g, be.device(), globals);
  globals.attn_sinks_host = read_attention_sinks(cfg, src, used);
  if (!globals.attn_sinks_host.empty()) {
    const size_t bytes = globals.attn_sinks_host.size() * 4;
    char* p = gpu.take(bytes, "attention sinks");
    be.copy_to_device(p, globals.attn_sinks_host.data(), bytes);
    globals.attn_sinks = Tensor(p, DType::F32, be.device(), {cfg.n_layers, cfg.n_heads});
  }
  if (cfg.pos == PosKind::Rope) {
    const std::vector<float> inv = rope_inv_freq(cfg);
    char* p = gpu.take(inv.size() * 4, "rope frequencies");
    be.copy_to_device(p, inv.data(), inv.size() * 4);
    globals.inv_freq = Tensor(p, DType::F32, be.device(), {int64_t(inv.size())});
  }

  const std::vector<HalvedLayout> stored = layer_kinds(cfg, dt, kPage, weight_quant);
  const std::vector<HalvedLayout> fp = weight_quant ? layer_kinds(cfg, dt, kPage, std::nullopt) : stored;
  kinds.resize(stored.size());
  for (size_t k = 0; k < kinds.size(); ++k) {
    kinds[k].halves = stored[k];
    for (int half : {0, 1}) {
      kinds[k].half_layout[half] = half_block_layout(stored[k], half);
      kinds[k].fp_half_layout[half] = half_block_layout(fp[k], half);
    }
  }
  // Each half of a layer has its own home (a mixture of experts may place its halves apart): a
  // CPU home is read in place, a GPU or disk one through an aligned host buffer (O_DIRECT wants
  // aligned memory) of the larger half.
  const size_t bounce_bytes = std::max(largest_half(0), largest_half(1));
  std::unique_ptr<char, void (*)(void*)> bounce(static_cast<char*>(std::aligned_alloc(kPage, bounce_bytes)), std::free);
  weight_home.resize(size_t(L));
  for (auto& r : resident) r.resize(size_t(L));
  for (int l = 0; l < L; ++l) {
    const HalvedLayout layer = halved_layer_layout(cfg, l, dt, kPage, weight_quant);  // same offsets, this layer's names
    for (int half : {0, 1}) {
      const size_t bytes = half_bytes(l, half);
      Home& h = weight_home[size_t(l)][size_t(half)] =
          place(plan.half_tier(l, half), bytes, half ? "layer weights (mlp)" : "layer weights (attention)");
      char* dst = h.tier == Tier::Cpu ? h.ptr : bounce.get();
      if (h.tier != Tier::Cpu) std::memset(dst, 0, bytes);
      read_block(half_block_layout(layer, half), src, dst, used, &weight_codes, &pool);
      if (h.tier == Tier::Gpu) {
        be.copy_to_device(h.ptr, dst, bytes);
        resident[size_t(half)][size_t(l)] = layer_views(kind(l).half_layout[half], h.ptr, be.device());
      } else if (h.tier == Tier::Disk) {
        disk->write(h.disk_offset, dst, bytes);
      }
    }
    if (opt.on_layer_loaded) opt.on_layer_loaded(l + 1, L);
  }
  check_no_extra_tensors(cfg, src, used);
}

void OffloadEngine::Impl::place_cache_and_activations() {
  cache_half = plan.cache_unit_bytes / 2;
  cache_home.assign(size_t(ngb), {});
  for (int k = 0; k < ngb; ++k)
    for (int j = 0; j < L; ++j) cache_home[size_t(k)].push_back(place(plan.cache_tier[size_t(j)], plan.cache_unit_bytes, "kv cache"));
  for (int k = 0; k < ngb; ++k) act_home.push_back(place(plan.act_tier[size_t(k)], plan.act_unit_bytes, "activations"));

  auto moves = [](const std::vector<Tier>& v) { return std::count(v.begin(), v.end(), Tier::Gpu) < long(v.size()); };
  auto on_disk = [](const std::vector<Tier>& v) { return std::count(v.begin(), v.end(), Tier::Disk) > 0; };
  const int64_t max_tokens = plan.step_tokens;
  ops.bind_workspace(gpu.take(ForwardOps::workspace_bytes(cfg, dt, max_tokens, gbs), "workspace"), max_tokens, gbs);
  stage_half = plan.cache_stage_bytes / 2;
  if (plan.dequant_bytes > 0) dequant_mem = gpu.take(plan.dequant_bytes, "dequantized weights");
  // A layer streams half by half (attention, then MLP), each half loading while the other
  // computes: one slot per half is the double buffer.
  if (moves(plan.weight_tier)) w_gpu[0] = SlotPool("gpu attention weight buffer", gpu, 1, largest_half(0));
  if (moves(plan.expert_tier)) w_gpu[1] = SlotPool("gpu mlp weight buffer", gpu, 1, largest_half(1));
  if (moves(plan.cache_tier)) c_gpu = SlotPool("gpu cache staging", gpu, 3, plan.cache_stage_bytes);
  if (moves(plan.act_tier)) a_gpu = SlotPool("gpu activation staging", gpu, 3, plan.act_stage_bytes);
  if (on_disk(plan.weight_tier)) w_pin[0] = SlotPool("pinned attention weight buffer", cpu, 1, largest_half(0));
  if (on_disk(plan.expert_tier)) w_pin[1] = SlotPool("pinned mlp weight buffer", cpu, 1, largest_half(1));
  if (on_disk(plan.cache_tier)) c_pin = SlotPool("pinned cache staging", cpu, 3, plan.cache_unit_bytes);
  if (on_disk(plan.act_tier)) a_pin = SlotPool("pinned activation staging", cpu, 3, plan.act_unit_bytes);

  if (opt.policy.cpu_attention && moves(plan.cache_tier)) {
    const size_t rows = size_t(plan.step_tokens);  // a served step's prompt pieces attend on the CPU too
    const size_t q_bytes = rows * size_t(cfg.q_dim()) * esize, kv_bytes = rows * size_t(cfg.kv_dim()) * esize;
    for (AttentionBuffers& a : attn_buf) {
      a.q = cpu.take(q_bytes, "cpu attention q");
      a.o = cpu.take(q_bytes, "cpu attention out");
      a.k = cpu.take(kv_bytes, "cpu attention k");
      a.v = cpu.take(kv_bytes, "cpu attention v");
      a.out = gpu.take(q_bytes, "cpu attention out (gpu)");
    }
    use_cpu_backend();
  }
  if (cpu_experts_used(cfg, opt.policy, plan.expert_tier)) {
    use_cpu_backend();
    const int64_t max_rows = plan.step_tokens;
    const size_t rows_bytes = size_t(max_rows) * size_t(cfg.hidden);
    for (MlpBuffers& m : mlp_buf) m.rows = cpu.take(rows_bytes * esize, "cpu experts rows");
    if (dt != DType::F32) mlp_f32 = cpu.take(rows_bytes * 4, "cpu experts rows (fp32)");
    cpu_mlp_ops = std::make_unique<ForwardOps>(cfg, *cpu_attn);
    cpu_mlp_ops->bind_workspace(cpu.take(ForwardOps::workspace_bytes(cfg, DType::F32, max_rows, 1), "cpu experts workspace"),
                                max_rows, 1);
    cpu_mlp_weights.resize(size_t(L));
    for (int l = 0; l < L; ++l)
      if (weight_home[size_t(l)][1].tier == Tier::Cpu && cfg.sparse_layer(l))
        cpu_mlp_weights[size_t(l)] = layer_views(kind(l).half_layout[1], weight_home[size_t(l)][1].ptr, Device::CPU);
  }
}

void OffloadEngine::Impl::use_cpu_backend() {
  if (cpu_attn) return;
  if (be.device() == Device::CPU) {
    cpu_attn = &be;
  } else {
    cpu_backend_owned = make_cpu_backend(opt.cpu_threads);
    cpu_attn = cpu_backend_owned.get();
  }
}


namespace {
OffloadOptions with_fault_from_env(OffloadOptions o) {
  const char* env = std::getenv("STRATA_DISK_FAULT");
  if (!env || !*env || o.fault != DiskFault::None) return o;
  const std::string v(env);
  const size_t colon = v.find(':');
  const std::string kind = v.substr(0, colon);
  STRATA_CHECK(colon != std::string::npos && (kind == "read" || kind == "write"),
               "STRATA_DISK_FAULT must be read:N or write:N, got '" << v << "'");
  o.fault = kind == "read" ? DiskFault::ReadError : DiskFault::DiskFull;
  o.fault_after = std::stoi(v.substr(colon + 1));
  return o;
}
}  // namespace

OffloadEngine::OffloadEngine(const ModelConfig& cfg, const WeightSource& weights, Backend& backend,
                             const OffloadOptions& options, const PlanShape& shape)
    : impl_(std::make_unique<Impl>(cfg, backend, with_fault_from_env(options), shape)) {
  cfg.validate();
  if (!cfg.lm_head)
    STRATA_FAIL(cfg.name << (cfg.num_labels > 0 ? ": a sequence classifier" : ": the checkpoint has no lm_head.weight "
                                                                           "(an embedding model)")
                         << "; the offloading engine generates and scores, which needs an LM head");
  const Policy& p = options.policy;
  STRATA_CHECK(cfg.n_experts > 0 || !(p.cpu_experts_prefill || p.cpu_experts_decode),
               "policy: cpu_experts is " << cpu_experts_name(p) << ", but " << cfg.name
                                         << " has no experts (the option is for mixtures of experts)");
  STRATA_CHECK(cfg.n_experts > 0 || !p.expert_weights,
               "policy: expert_weights places experts, but " << cfg.name << " has none (the field is for mixtures of experts)");
  STRATA_CHECK(p.gpu_batch_size > 0 && p.num_gpu_batches > 0, "policy: batch sizes must be positive");
  // The last generated token is sampled but never fed back, so it takes no position: a prompt of
  // the whole context may still produce (or, scoring, just end with) one token.
  STRATA_CHECK(shape.prompt_len + std::max(shape.gen_len - 1, 0) <= cfg.max_positions,
               "prompt " << shape.prompt_len << " + generation " << shape.gen_len << " exceeds the model's context of "
                         << cfg.max_positions);
  impl_->plan = plan_placement(cfg, p, shape, backend.activation_dtype());
  check_plan_fits(impl_->plan, default_budgets(backend, options), backend.device() == Device::CPU);
  impl_->reserve();
  impl_->load_weights(weights);
  impl_->place_cache_and_activations();
  impl_->start_lanes();
}

OffloadEngine::~OffloadEngine() = default;

const PlacementPlan& OffloadEngine::plan() const { return impl_->plan; }
int OffloadEngine::block_size() const { return impl_->gbs * impl_->ngb; }

std::vector<GenResult> OffloadEngine::generate(const std::vector<GenRequest>& requests, GenStats* stats) {
  if (requests.empty()) return {};
  return impl_->generate(requests, stats);
}

void OffloadEngine::serve(const std::function<Admission()>& next,
                          const std::function<void(size_t, std::vector<GenResult>)>& finished, GenStats* stats) {
  impl_->serve(next, finished, stats);
}

OffloadReport OffloadEngine::report() const {
  const Impl& m = *impl_;
  OffloadReport r = m.totals;
  r.compute_busy = m.compute_lane->busy_seconds();
  r.cpu_attention_seconds = m.cpu_attention_seconds.load();
  r.cpu_attention_bytes = m.cpu_attention_bytes.load();
  r.cpu_experts_seconds = m.cpu_experts_seconds.load();
  r.graph_replays = m.graphs.replays();
  r.h2d_busy = m.h2d->busy_seconds();
  r.d2h_busy = m.d2h->busy_seconds();
  r.disk_busy = m.disk_lane->busy_seconds();
  r.cpu_to_gpu = {m.bytes_ctog.load(), r.h2d_busy};
  r.gpu_to_cpu = {m.bytes_gtoc.load(), r.d2h_busy};
  if (m.disk) {
    const DiskIoStats s = m.disk->stats();
    r.disk_to_cpu = {m.bytes_dtoc.load(), s.read_seconds - m.disk_at_start.read_seconds};
    r.cpu_to_disk = {m.bytes_ctod.load(), s.write_seconds - m.disk_at_start.write_seconds};
    r.disk_io = m.disk->io_name();
  }
  r.weights_kept_codes = m.weight_codes.kept_codes;
  r.weights_quantized = m.weight_codes.quantized;
  r.peak.gpu = double(m.gpu.size());
  r.peak.cpu = double(m.cpu.size());
  r.used.gpu = double(m.gpu.used());
  r.used.cpu = double(m.cpu.used());
  r.used.disk = m.disk ? double(m.disk->allocated()) : 0;
  r.peak.disk = m.disk ? double(m.disk->capacity()) : 0;
  return r;
}

void OffloadEngine::write_trace(const std::filesystem::path& file) const { impl_->trace.write(file); }

}  // namespace strata
