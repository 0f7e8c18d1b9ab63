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
#include "strata/offload/lanes.h"
#include "strata/offload/tiers.h"
#include "strata/runtime/forward_ops.h"
#include "strata/runtime/model_weights.h"
#include "strata/runtime/sequence.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }
constexpr size_t kPage = DiskStore::kAlign;

// Where a tensor lives when it is not being computed on.
struct Home {
  Tier tier = Tier::Gpu;
  char* ptr = nullptr;     // GPU or pinned memory
  size_t disk_offset = 0;  // in the disk store
};

// A unit brought into staging: its GPU slot (and pinned slot, for disk homes) and when it is ready.
struct Held {
  bool valid = false;
  int gpu = -1, pin = -1;
  Ticket ready;
  int layer = -1;  // activations: the layer whose input this is
  int token = -1;  // kv cache: the token it was loaded for
};

// Returns a held unit's slots to their pools.
void free_slots(const Held& h, SlotPool& gpu_pool, SlotPool& pinned_pool) {
  if (!h.valid) return;
  if (h.gpu >= 0) gpu_pool.release(h.gpu);
  if (h.pin >= 0) pinned_pool.release(h.pin);
}

// Waits for a ticket, ignoring its failure (used when unwinding after one).
void drain(const Ticket& t) {
  if (t.valid()) try {
      t.get();
    } catch (...) {
    }
}

// A strided piece of a cache tensor: positions [begin, end) of every slot.
struct SlotRange {
  int begin = 0, end = 0;
  bool empty() const { return end <= begin; }
};

// The sequences one step of the schedule computes: in decode a whole GPU batch, in prefill a
// group of its sequences (plan.prefill_seqs of them), so that the GPU holds one group's
// intermediates, cache rows and hidden state rather than the whole batch's.
struct BatchState {
  int batch = 0;                // the GPU batch: its cache and hidden-state homes
  int first_slot = 0;           // its sequences' cache slots are [first_slot, first_slot + seqs.size())
  size_t act_offset = 0;        // its piece of the batch's hidden-state home (bytes)
  std::vector<Sequence*> seqs;  // index = cache slot - first_slot
  int pmin = 0, pmax = 0;       // shortest and longest prompt
  StepBatch step;               // this token's step; slots are relative to first_slot
  std::vector<Sequence*> active;   // the sequences the step computes
  std::vector<int> prompt_start;   // prefill: [active] its first computed position (copied before it)
  std::vector<Sequence*> sampled;  // the sequences of its logit rows: active ones, and in prefill their followers
  // Decode units: (slot, source slot) of each choice that copies its source's prompt rows at token 1.
  std::vector<std::pair<int, int>> shared;
  int slots() const { return int(seqs.size()); }
};

// A unit in one super-step of the schedule, at its GPU batch's token (0: prefill).
struct StepUnit {
  BatchState* state = nullptr;
  int token = 0;
};

// One choice of one request, as placed in a GPU batch.
struct Choice {
  size_t request = 0;
  int choice = 0;
};

// Lays a block's choices out in its GPU batches, at most gbs each. A request's choices share one
// prefill only within a batch, so each request whose choices fit in one batch goes whole into the
// first batch with room for it (first fit, in request order: the job hands blocks sorted by prompt
// length, so batches stay near in length). Choices that fit no batch whole (a request of more than
// gbs, or room split by earlier requests) fill the free slots in batch order; those prefill once
// per batch they reach.
std::vector<std::vector<Choice>> pack_choices(const std::vector<GenRequest>& requests, int gbs, int ngb) {
  std::vector<std::vector<Choice>> batches(static_cast<size_t>(ngb));
  std::vector<size_t> unplaced;
  for (size_t r = 0; r < requests.size(); ++r) {
    const int n = requests[r].n;
    auto room = [&](const std::vector<Choice>& b) { return int(b.size()) + n <= gbs; };
    const auto it = std::find_if(batches.begin(), batches.end(), room);
    if (it == batches.end()) {
      unplaced.push_back(r);
      continue;
    }
    for (int c = 0; c < n; ++c) it->push_back({r, c});
  }
  size_t k = 0;
  for (size_t r : unplaced)
    for (int c = 0; c < requests[r].n; ++c) {
      while (int(batches[k].size()) == gbs) ++k;  // the caller checked that the block holds them all
      batches[k].push_back({r, c});
    }
  return batches;
}

}  // namespace

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

struct OffloadEngine::Impl {
  ModelConfig cfg;
  Backend& be;
  OffloadOptions opt;
  PlanShape shape;
  PlacementPlan plan;
  DType dt;
  size_t esize;
  int L, gbs, ngb;

  // Tiers.
  Buffer gpu_mem;
  char* pinned_mem = nullptr;
  std::unique_ptr<DiskStore> disk;
  Region gpu, cpu;
  SlotPool w_gpu[2], w_pin[2];  // [half]: one slot each for a layer's attention and MLP tensors
  SlotPool c_gpu, c_pin, a_gpu, a_pin;
  DiskIoStats disk_at_start;

  // Homes.
  HalvedLayout halves;         // a layer's block: attention tensors, then MLP tensors page-aligned
  BlockLayout half_layout[2];  // each half's tensors, offsets from the half's start
  std::optional<quant::QuantSpec> weight_quant, cache_quant;  // the policy's compression
  // Compressed weights, for steps too long for the fused linear: a half-layer dequantized once per
  // (token, sub-layer) and shared by all units of the block.
  BlockLayout fp_half_layout[2];
  char* dequant_mem = nullptr;
  LayerWeights dequantized;
  int dequant_token = -1, dequant_sub = -1;
  ModelWeights globals;  // embeddings, final norm, head and inv_freq; layers unused
  std::vector<Home> weight_home;
  std::vector<LayerWeights> resident_layers;  // views of GPU-homed layers
  LayerWeights staged_weights;                // views of the layer being computed from a GPU buffer
  std::vector<std::vector<Home>> cache_home;  // [batch][layer]
  std::vector<Home> act_home;                 // [batch]
  size_t cache_half = 0;                      // bytes of K (or V) of one unit at home
  size_t cache_row = 0;                       // bytes of one position's K (or V), all kv heads
  size_t stage_half = 0;                      // bytes of K (or V) of a GPU cache staging slot

  // CPU attention.
  std::unique_ptr<Backend> cpu_backend_owned;
  Backend* cpu_attn = nullptr;
  char *q_host = nullptr, *k_host = nullptr, *v_host = nullptr, *o_host = nullptr;
  double cpu_attention_seconds = 0;
  int64_t shared_prompt_tokens = 0;  // this block's prompt tokens copied from a shared prefix

  // Schedule.
  ForwardOps ops;
  Trace trace;
  std::unique_ptr<Lane> h2d, d2h, disk_lane;
  int compute_track = 0;
  double compute_busy = 0;
  std::atomic<uint64_t> bytes_dtoc{0}, bytes_ctog{0}, bytes_gtoc{0}, bytes_ctod{0};
  OffloadReport totals;
  CodesTally weight_codes;  // how the compressed layers were made at load
  int disk_ops_left = 0;  // fault injection countdown (disk thread only)

  // Per block.
  std::vector<BatchState> prefill_units, decode_units;  // the steps' sequence groups
  std::vector<std::vector<StepUnit>> step_units;        // [super-step]: what it computes, in order
  std::vector<Held> w_held;                 // [sub-layer]: 2 j for layer j's attention, 2 j + 1 its MLP
  std::vector<std::vector<Held>> c_held;    // [unit][layer]
  std::vector<std::vector<std::vector<Ticket>>> c_stored;  // [batch][layer]: stores a reload waits for
  std::vector<Held> a_held;                 // [unit]
  std::vector<Ticket> a_stored;             // [unit]: store of its hidden state
  std::vector<int> a_stored_layer;          // [unit]: the sub-layer whose output is at home ...
  std::vector<int> a_stored_token;          // [unit]: ... and the token it is for
  std::unique_ptr<StepSampler> sampler;
  // A request's choices in one GPU batch share the prefill of the first of them, their source.
  const Sequence* block_seqs = nullptr;
  std::vector<size_t> source_of;                // [sequence]: itself when it prefills
  std::vector<std::vector<Sequence*>> followers;  // [sequence]: the choices copying its prompt rows
  size_t index_of(const Sequence& s) const { return size_t(&s - block_seqs); }

  Impl(const ModelConfig& c, Backend& b, const OffloadOptions& o, const PlanShape& s)
      : cfg(c), be(b), opt(o), shape(s), dt(b.activation_dtype()), esize(dtype_size(dt)), L(c.n_layers),
        gbs(o.policy.gpu_batch_size), ngb(o.policy.num_gpu_batches), ops(cfg, b), trace(o.trace) {
    weight_quant = quant_spec(o.policy.compress_weights);
    cache_quant = quant_spec(o.policy.compress_kv_cache);
    cache_row = cache_quant ? size_t(cfg.n_kv_heads) * quant::row_bytes(*cache_quant, cfg.head_dim)
                            : size_t(cfg.kv_dim()) * esize;
  }

  ~Impl() {
    // Lanes first: they may still touch the regions.
    h2d.reset();
    d2h.reset();
    disk_lane.reset();
    if (pinned_mem) be.free_host(pinned_mem);
  }

  // ---------------------------------------------------------------- setup
  void reserve() {
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

  Home place(Tier tier, size_t bytes, const char* what) {
    Home h;
    h.tier = tier;
    if (tier == Tier::Gpu) h.ptr = gpu.take(bytes, what);
    else if (tier == Tier::Cpu) h.ptr = cpu.take(bytes, what);
    else h.disk_offset = disk->allocate(bytes);
    return h;
  }

  void load_weights(const WeightSource& src) {
    std::set<std::string> used;
    const BlockLayout gl = global_block_layout(cfg, dt);
    std::vector<uint8_t> staging(gl.bytes);
    read_block(gl, src, staging.data(), used);
    char* g = gpu.take(gl.bytes, "global weights");
    be.copy_to_device(g, staging.data(), gl.bytes);
    set_global_views(cfg, gl, g, be.device(), globals);
    if (cfg.pos == PosKind::Rope) {
      const std::vector<float> inv = rope_inv_freq(cfg);
      char* p = gpu.take(inv.size() * 4, "rope frequencies");
      be.copy_to_device(p, inv.data(), inv.size() * 4);
      globals.inv_freq = Tensor(p, DType::F32, be.device(), {int64_t(inv.size())});
    }

    halves = halved_layer_layout(cfg, 0, dt, kPage, weight_quant);
    for (int half : {0, 1}) half_layout[half] = half_block_layout(halves, half);
    if (weight_quant) {
      const HalvedLayout fp = halved_layer_layout(cfg, 0, dt, kPage);
      for (int half : {0, 1}) fp_half_layout[half] = half_block_layout(fp, half);
    }
    const size_t bytes = plan.layer_weight_bytes;
    // Disk-bound layers pass through an aligned host buffer (O_DIRECT wants aligned memory).
    std::unique_ptr<char, void (*)(void*)> bounce(static_cast<char*>(std::aligned_alloc(kPage, bytes)), std::free);
    weight_home.resize(size_t(L));
    resident_layers.resize(size_t(L));
    for (int l = 0; l < L; ++l) {
      const BlockLayout layout = halved_layer_layout(cfg, l, dt, kPage, weight_quant).layout;  // same offsets, this layer's names
      Home& h = weight_home[size_t(l)] = place(plan.weight_tier[size_t(l)], bytes, "layer weights");
      if (h.tier == Tier::Cpu) {
        read_block(layout, src, h.ptr, used, &weight_codes);
        if (opt.on_layer_loaded) opt.on_layer_loaded(l + 1, L);
        continue;
      }
      std::memset(bounce.get(), 0, bytes);
      read_block(layout, src, bounce.get(), used, &weight_codes);
      if (h.tier == Tier::Gpu) {
        be.copy_to_device(h.ptr, bounce.get(), bytes);
        resident_layers[size_t(l)] = layer_views(halves.layout, h.ptr, be.device());
      } else {
        disk->write(h.disk_offset, bounce.get(), bytes);
      }
      if (opt.on_layer_loaded) opt.on_layer_loaded(l + 1, L);
    }
    check_no_extra_tensors(cfg, src, used);
  }

  void place_cache_and_activations() {
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
    if (moves(plan.weight_tier)) {
      w_gpu[0] = SlotPool("gpu attention weight buffer", gpu, 1, halves.attn_bytes);
      w_gpu[1] = SlotPool("gpu mlp weight buffer", gpu, 1, halves.mlp_bytes);
    }
    if (moves(plan.cache_tier)) c_gpu = SlotPool("gpu cache staging", gpu, 3, plan.cache_stage_bytes);
    if (moves(plan.act_tier)) a_gpu = SlotPool("gpu activation staging", gpu, 3, plan.act_stage_bytes);
    if (on_disk(plan.weight_tier)) {
      w_pin[0] = SlotPool("pinned attention weight buffer", cpu, 1, halves.attn_bytes);
      w_pin[1] = SlotPool("pinned mlp weight buffer", cpu, 1, halves.mlp_bytes);
    }
    if (on_disk(plan.cache_tier)) c_pin = SlotPool("pinned cache staging", cpu, 3, plan.cache_unit_bytes);
    if (on_disk(plan.act_tier)) a_pin = SlotPool("pinned activation staging", cpu, 3, plan.act_unit_bytes);

    if (opt.policy.cpu_attention && moves(plan.cache_tier)) {
      q_host = cpu.take(size_t(gbs) * size_t(cfg.q_dim()) * esize, "cpu attention q");
      o_host = cpu.take(size_t(gbs) * size_t(cfg.q_dim()) * esize, "cpu attention out");
      k_host = cpu.take(size_t(gbs) * size_t(cfg.kv_dim()) * esize, "cpu attention k");
      v_host = cpu.take(size_t(gbs) * size_t(cfg.kv_dim()) * esize, "cpu attention v");
      if (be.device() == Device::CPU) {
        cpu_attn = &be;
      } else {
        cpu_backend_owned = make_cpu_backend(opt.cpu_threads);
        cpu_attn = cpu_backend_owned.get();
      }
    }
  }

  // Called on the disk thread before each I/O of the schedule.
  void before_disk_io(bool write) {
    if (opt.fault == DiskFault::None || (opt.fault == DiskFault::DiskFull) != write) return;
    if (--disk_ops_left == 0) disk->inject_fault(opt.fault);
  }

  void start_lanes() {
    disk_ops_left = opt.fault_after;
    const bool threaded = opt.policy.overlap;
    compute_track = trace.track("compute");
    h2d = std::make_unique<Lane>("cpu->gpu", threaded, trace);
    d2h = std::make_unique<Lane>("gpu->cpu", threaded, trace);
    disk_lane = std::make_unique<Lane>("disk", threaded, trace);
    if (disk) disk_at_start = disk->stats();
  }

  // ---------------------------------------------------------------- transfers
  // Copies rows of every slot of a cache tensor between a home and a GPU slot.
  size_t cache_row_bytes() const { return cache_row; }
  size_t slot_pitch() const { return size_t(shape.capacity()) * cache_row_bytes(); }

  // The GPU staging slot holds the unit's slots from its first; the host unit is the whole batch's.
  Ticket copy_cache(CopyKind kind, char* gpu_unit, char* host_unit, SlotRange r, const BatchState& b,
                    std::vector<Ticket> deps) {
    const size_t pitch = slot_pitch(), row = cache_row_bytes();
    const size_t off = size_t(r.begin) * row, width = size_t(r.end - r.begin) * row;
    const size_t host_off = size_t(b.first_slot) * pitch, n = size_t(b.slots());
    Lane& lane = kind == CopyKind::HostToDevice ? *h2d : *d2h;
    std::atomic<uint64_t>& counter = kind == CopyKind::HostToDevice ? bytes_ctog : bytes_gtoc;
    return lane.submit(
        "kv cache", [=, this, &counter] {
          for (size_t half = 0; half < 2; ++half) {
            char* g = gpu_unit + half * stage_half + off;
            char* h = host_unit + half * cache_half + host_off + off;
            if (kind == CopyKind::HostToDevice) be.copy_2d(kind, g, pitch, h, pitch, width, n);
            else be.copy_2d(kind, h, pitch, g, pitch, width, n);
          }
          counter += 2 * width * n;
        },
        std::move(deps));
  }

  // Disk I/O of the pages covering positions `r` of the unit's slots of a cache unit.
  Ticket disk_cache_io(bool write, size_t disk_offset, char* pinned_unit, SlotRange r, const BatchState& b,
                       std::vector<Ticket> deps) {
    const size_t pitch = slot_pitch(), row = cache_row_bytes();
    const int first = b.first_slot, last = b.first_slot + b.slots();
    return disk_lane->submit(
        write ? "kv cache write" : "kv cache read", [=, this] {
          for (size_t half = 0; half < 2; ++half)
            for (int s = first; s < last; ++s) {
              const size_t lo = half * cache_half + size_t(s) * pitch + size_t(r.begin) * row;
              const size_t hi = half * cache_half + size_t(s) * pitch + size_t(r.end) * row;
              const size_t a = lo / kPage * kPage, b = std::min(align_up(hi, kPage), 2 * cache_half);
              before_disk_io(write);
              if (write) disk->write(disk_offset + a, pinned_unit + a, b - a);
              else disk->read(disk_offset + a, pinned_unit + a, b - a);
              (write ? bytes_ctod : bytes_dtoc) += b - a;
            }
        },
        std::move(deps));
  }

  Ticket disk_io(bool write, size_t disk_offset, char* pinned, size_t bytes, const char* what, std::vector<Ticket> deps) {
    bytes = align_up(bytes, kPage);
    return disk_lane->submit(
        what, [=, this] {
          before_disk_io(write);
          if (write) disk->write(disk_offset, pinned, bytes);
          else disk->read(disk_offset, pinned, bytes);
          (write ? bytes_ctod : bytes_dtoc) += bytes;
        },
        std::move(deps));
  }

  Ticket copy_flat(CopyKind kind, char* dst, const char* src, size_t bytes, const char* what, std::vector<Ticket> deps) {
    Lane& lane = kind == CopyKind::HostToDevice ? *h2d : *d2h;
    std::atomic<uint64_t>& counter = kind == CopyKind::HostToDevice ? bytes_ctog : bytes_gtoc;
    return lane.submit(
        what, [=, this, &counter] {
          be.copy(kind, dst, src, bytes);
          counter += bytes;
        },
        std::move(deps));
  }

  // ---------------------------------------------------------------- units
  // Super-step i computes, in each sub-layer, units(i): the prefill units of the GPU batches that
  // start in it and the decode units of those started before, each at its own token.
  BatchState& unit(int i, int u) { return *step_units[size_t(i)][size_t(u)].state; }
  const BatchState& unit(int i, int u) const { return *step_units[size_t(i)][size_t(u)].state; }
  int token(int i, int u) const { return step_units[size_t(i)][size_t(u)].token; }
  int n_units(int i) const { return int(step_units[size_t(i)].size()); }

  SlotRange load_range(int i, int u) const {  // cache entries that exist before the unit's token t
    const int t = token(i, u);
    return {0, t == 0 ? 0 : std::min(unit(i, u).pmax + t - 1, shape.capacity())};
  }
  SlotRange store_range(int i, int u) const {  // cache entries token t writes (union over slots)
    const BatchState& b = unit(i, u);
    const int t = token(i, u);
    if (t == 0) return {0, std::min(b.pmax, shape.capacity())};
    // Token 1 also copied prompt rows into the followers' slots: they go home too.
    const int begin = t == 1 && !b.shared.empty() ? 0 : b.pmin + t - 1;
    return {std::min(begin, shape.capacity()), std::min(b.pmax + t, shape.capacity())};
  }
  // Decode attention on the CPU where the cache lives off the GPU: in place on the CPU tier, over
  // its pinned mirror for disk homes. The cache never crosses to the GPU then.
  // `t` is the unit's token: 0 in prefill.
  bool delegated(int t, int j) const {
    return opt.policy.cpu_attention && t > 0 && plan.cache_tier[size_t(j)] != Tier::Gpu;
  }
  bool cache_moves(int t, int j) const { return plan.cache_tier[size_t(j)] != Tier::Gpu && !delegated(t, j); }
  bool mirrored(int t, int j) const { return delegated(t, j) && plan.cache_tier[size_t(j)] == Tier::Disk; }

  // Sub-layer jj: half jj % 2 (0 attention, 1 MLP) of layer jj / 2.
  void load_weights_async(int jj) {
    Held& h = w_held[size_t(jj)];
    const int j = jj / 2, half = jj % 2;
    if (plan.weight_tier[size_t(j)] == Tier::Gpu || h.valid) return;
    const Home& home = weight_home[size_t(j)];
    h.valid = true;
    h.gpu = w_gpu[half].acquire();
    const size_t offset = half ? halves.mlp_offset : 0, bytes = half ? halves.mlp_bytes : halves.attn_bytes;
    const char* src = home.ptr + offset;
    std::vector<Ticket> deps;
    if (home.tier == Tier::Disk) {
      h.pin = w_pin[half].acquire();
      char* pinned = w_pin[half].data(h.pin);
      deps.push_back(disk_io(false, home.disk_offset + offset, pinned, bytes, "weights read", {}));
      src = pinned;
    }
    h.ready = copy_flat(CopyKind::HostToDevice, w_gpu[half].data(h.gpu), src, bytes, half ? "weights (mlp)" : "weights (attention)",
                        std::move(deps));
  }

  void release_weights(int jj) {
    free_slots(w_held[size_t(jj)], w_gpu[jj % 2], w_pin[jj % 2]);
    w_held[size_t(jj)] = Held();
  }

  // Brings unit u's cache of layer j to where token i uses it: a GPU staging slot (through a
  // pinned mirror for disk homes), or, when the CPU attends to a disk home, the mirror alone.
  void load_cache_async(int i, int j, int u) {
    Held& h = c_held[size_t(u)][size_t(j)];
    const bool mirror_only = mirrored(token(i, u), j);
    if (h.valid || !(cache_moves(token(i, u), j) || mirror_only)) return;
    const BatchState& b = unit(i, u);
    const Home& home = cache_home[size_t(b.batch)][size_t(j)];
    h.valid = true;
    h.token = i;
    if (!mirror_only) h.gpu = c_gpu.acquire();
    const SlotRange r = load_range(i, u);
    char* host = home.ptr;
    std::vector<Ticket> deps = c_stored[size_t(b.batch)][size_t(j)];  // its last writes
    if (home.tier == Tier::Disk) {
      h.pin = c_pin.acquire();
      host = c_pin.data(h.pin);
      if (!r.empty()) deps = {disk_cache_io(false, home.disk_offset, host, r, b, std::move(deps))};
    }
    if (r.empty()) h.ready = Ticket();
    else if (mirror_only) h.ready = deps.front();
    else h.ready = copy_cache(CopyKind::HostToDevice, c_gpu.data(h.gpu), host, r, b, std::move(deps));
  }

  // Moves the entries token i wrote back home; the slots are released by `after` once done.
  void store_cache(int i, int j, int u, std::vector<Ticket>& tickets, std::vector<std::function<void()>>& after) {
    Held h = c_held[size_t(u)][size_t(j)];
    if (!h.valid) return;
    c_held[size_t(u)][size_t(j)] = Held();
    const BatchState& b = unit(i, u);
    const Home& home = cache_home[size_t(b.batch)][size_t(j)];
    const SlotRange r = store_range(i, u);
    if (h.gpu < 0) {  // a pinned mirror the CPU wrote the new entries into: to disk
      if (!b.active.empty() && !r.empty()) {
        Ticket t = disk_cache_io(true, home.disk_offset, c_pin.data(h.pin), r, b, {});
        tickets.push_back(t);
        c_stored[size_t(b.batch)][size_t(j)] = {t};
      }
      after.push_back([this, h] { free_slots(h, c_gpu, c_pin); });
      return;
    }
    if (!b.active.empty() && !r.empty()) {
      std::vector<Ticket>& stored = c_stored[size_t(b.batch)][size_t(j)];
      char* host = home.tier == Tier::Disk ? c_pin.data(h.pin) : home.ptr;
      std::vector<Ticket> deps;
      // A prefill group's pages on disk may share a page with its neighbour group's rows, which
      // this pinned slot never held: read them first, after the neighbours' writes.
      if (home.tier == Tier::Disk && token(i, u) == 0)
        deps = {disk_cache_io(false, home.disk_offset, host, r, b, stored)};
      Ticket t = copy_cache(CopyKind::DeviceToHost, c_gpu.data(h.gpu), host, r, b, std::move(deps));
      if (home.tier == Tier::Disk) t = disk_cache_io(true, home.disk_offset, host, r, b, {t});
      tickets.push_back(t);
      if (token(i, u) > 0) stored.clear();  // a decode load waited for all of them
      stored.push_back(t);
    }
    after.push_back([this, h] { free_slots(h, c_gpu, c_pin); });
  }

  size_t act_bytes(int i, int u) const { return unit(i, u).step.tokens.size() * size_t(cfg.hidden) * esize; }

  // Loads unit u's hidden state (the input of sub-layer jj) into a staging slot, after its store.
  void load_act_async(int i, int jj, int u) {
    Held& h = a_held[size_t(u)];
    const BatchState& b = unit(i, u);
    const Home& home = act_home[size_t(b.batch)];
    if (home.tier == Tier::Gpu || h.valid || jj == 0) return;
    // Not stored yet (one or two units a layer): it is loaded right before its compute instead.
    if (a_stored_layer[size_t(u)] != jj - 1 || a_stored_token[size_t(u)] != i) return;
    h.valid = true;
    h.layer = jj;
    h.gpu = a_gpu.acquire();
    const size_t bytes = act_bytes(i, u);
    char* host = home.ptr + b.act_offset;
    std::vector<Ticket> deps{a_stored[size_t(u)]};
    if (home.tier == Tier::Disk) {
      h.pin = a_pin.acquire();
      host = a_pin.data(h.pin) + b.act_offset;
      deps = {disk_io(false, home.disk_offset + b.act_offset, host, bytes, "activations read", std::move(deps))};
    }
    h.ready = copy_flat(CopyKind::HostToDevice, a_gpu.data(h.gpu), host, bytes, "activations", std::move(deps));
  }

  void store_act(int i, int jj, int u, std::vector<Ticket>& tickets, std::vector<std::function<void()>>& after) {
    Held h = a_held[size_t(u)];
    if (!h.valid) return;
    a_held[size_t(u)] = Held();
    const BatchState& b = unit(i, u);
    const Home& home = act_home[size_t(b.batch)];
    if (jj < 2 * L - 1 && !b.active.empty()) {  // the last sub-layer's output is not needed again
      const size_t bytes = act_bytes(i, u);
      char* host = home.tier == Tier::Disk ? a_pin.data(h.pin >= 0 ? h.pin : (h.pin = a_pin.acquire())) : home.ptr;
      host += b.act_offset;
      Ticket t = copy_flat(CopyKind::DeviceToHost, host, a_gpu.data(h.gpu), bytes, "activations", {});
      if (home.tier == Tier::Disk)
        t = disk_io(true, home.disk_offset + b.act_offset, host, bytes, "activations write", {t});
      tickets.push_back(t);
      a_stored[size_t(u)] = t;
      a_stored_layer[size_t(u)] = jj;
      a_stored_token[size_t(u)] = i;
    }
    after.push_back([this, h] { free_slots(h, a_gpu, a_pin); });
  }

  // ---------------------------------------------------------------- compute
  // Sub-layer jj's weights on the GPU; a staged half has only that half's tensors.
  const LayerWeights& weights_for(int jj) {
    const int j = jj / 2, half = jj % 2;
    if (plan.weight_tier[size_t(j)] == Tier::Gpu) return resident_layers[size_t(j)];
    load_weights_async(jj);  // no-op when prefetched
    Held& h = w_held[size_t(jj)];
    if (h.ready.valid()) h.ready.get();
    staged_weights = layer_views(half_layout[half], w_gpu[half].data(h.gpu), be.device());
    return staged_weights;
  }

  // Sub-layer jj's compressed weights dequantized, once for token i's pass over the block.
  const LayerWeights& dequantized_for(int i, int jj) {
    if (dequant_token == i && dequant_sub == jj) return dequantized;
    dequant_token = dequant_sub = -1;  // stale until the kernels below are enqueued
    dequantized = dequantized_views(weights_for(jj), fp_half_layout[jj % 2], dequant_mem, be);
    dequant_token = i, dequant_sub = jj;
    return dequantized;
  }

  Tensor hidden_for(int i, int jj, int u, int64_t T) {
    const BatchState& b = unit(i, u);
    const Home& home = act_home[size_t(b.batch)];
    char* p = nullptr;
    if (home.tier == Tier::Gpu) {
      p = home.ptr + b.act_offset;
    } else {
      Held& h = a_held[size_t(u)];
      if (jj == 0) {
        STRATA_CHECK(!h.valid, "internal: unit " << u << " holds a hidden state at sub-layer 0");
        h.valid = true;
        h.layer = 0;
        h.gpu = a_gpu.acquire();
      } else {
        load_act_async(i, jj, u);
        STRATA_CHECK(h.valid && h.layer == jj, "internal: hidden state of unit " << u << " for sub-layer " << jj << " missing");
        if (h.ready.valid()) h.ready.get();
      }
      p = a_gpu.data(h.gpu);
    }
    return Tensor(p, dt, be.device(), {T, cfg.hidden});
  }

  // The unit's slots of layer j's cache on the GPU: a view of its home, or its staging slot.
  std::pair<Tensor, Tensor> cache_for(int i, int j, int u) {
    const BatchState& b = unit(i, u);
    const Home& home = cache_home[size_t(b.batch)][size_t(j)];
    char *k_ptr = home.ptr + size_t(b.first_slot) * slot_pitch(), *v_ptr = k_ptr + cache_half;
    if (home.tier != Tier::Gpu) {
      load_cache_async(i, j, u);
      Held& h = c_held[size_t(u)][size_t(j)];
      STRATA_CHECK(h.token == i, "internal: kv cache of layer " << j << " unit " << u << " loaded for token " << h.token
                                                                << ", needed for token " << i);
      if (h.ready.valid()) h.ready.get();
      k_ptr = c_gpu.data(h.gpu);
      v_ptr = k_ptr + stage_half;
    }
    return {cache_view(k_ptr, b, be.device()), cache_view(v_ptr, b, be.device())};
  }

  // The unit's slots of a cache tensor at `base`, as stored (quantized rows when compressed).
  Tensor cache_view(char* base, const BatchState& b, Device device) const {
    if (cache_quant)
      return Tensor::quantized(base, quant::dtype_of(*cache_quant), cache_quant->group_size, device,
                               {b.slots(), shape.capacity(), cfg.n_kv_heads, cfg.head_dim});
    return Tensor(base, dt, device, {b.slots(), shape.capacity(), cfg.n_kv_heads, cfg.head_dim});
  }

  // Attention on the CPU over the cache in pinned memory (its home, or a disk home's mirror): q, k,
  // v cross to the host, the output back.
  void attend_on_cpu(int i, int u, int j, const Tensor& q, const Tensor& kk, const Tensor& v, const Tensor& out) {
    const auto t0 = Clock::now();
    const BatchState& b = unit(i, u);
    const Home& home = cache_home[size_t(b.batch)][size_t(j)];
    const int64_t T = q.dim(0);
    be.synchronize();
    be.copy_to_host(q_host, q.data, q.nbytes());
    be.copy_to_host(k_host, kk.data, kk.nbytes());
    be.copy_to_host(v_host, v.data, v.nbytes());
    auto host = [&](void* p, std::initializer_list<int64_t> dims) { return Tensor(p, dt, Device::CPU, dims); };
    char* unit_base = home.ptr;
    if (home.tier == Tier::Disk) {  // its pinned mirror, read by the disk lane
      load_cache_async(i, j, u);
      Held& h = c_held[size_t(u)][size_t(j)];
      STRATA_CHECK(h.valid && h.token == i, "internal: kv cache mirror of layer " << j << " unit " << u << " missing");
      if (h.ready.valid()) h.ready.get();
      unit_base = c_pin.data(h.pin);
    }
    char* base = unit_base + size_t(b.first_slot) * slot_pitch();
    if (token(i, u) == 1)
      share_prompt_rows(b, base, base + cache_half, [](char* d, const char* s, size_t n) { std::memcpy(d, s, n); });
    const Tensor ck = cache_view(base, b, Device::CPU), cv = cache_view(base + cache_half, b, Device::CPU);
    const Tensor slots(const_cast<int32_t*>(b.step.slots.data()), DType::I32, Device::CPU, {T});
    const Tensor pos(const_cast<int32_t*>(b.step.positions.data()), DType::I32, Device::CPU, {T});
    const Tensor qh = host(q_host, {T, cfg.n_heads, cfg.head_dim}), oh = host(o_host, {T, cfg.n_heads, cfg.head_dim});
    cpu_attn->kv_store(host(k_host, {T, cfg.n_kv_heads, cfg.head_dim}), host(v_host, {T, cfg.n_kv_heads, cfg.head_dim}),
                       ck, cv, slots, pos);
    cpu_attn->attention(qh, ck, cv, slots, pos, cfg.attention_scale(), oh);
    be.copy_to_device(out.data, o_host, out.nbytes());
    cpu_attention_seconds += seconds_since(t0);
  }

  // Token 1, before attending: copies each follower's prompt keys and values from its source's
  // slot, in the unit's cache rows wherever they are (K at k_base, V at v_base, slots a pitch apart).
  template <typename Copy>
  void share_prompt_rows(const BatchState& b, char* k_base, char* v_base, Copy copy) const {
    for (const auto& [dst, src] : b.shared) {
      const size_t bytes = b.seqs[size_t(dst)]->request->prompt.size() * cache_row_bytes();
      for (char* base : {k_base, v_base})
        copy(base + size_t(dst) * slot_pitch(), base + size_t(src) * slot_pitch(), bytes);
    }
  }

  // Which prompts of a prefill unit share a beginning (indices are the unit's slots). Prompts that
  // are scored whole (perplexity) and choices that copy their source's rows take no part.
  std::vector<SharedPrefix> plan_unit_sharing(const BatchState& b) const {
    std::vector<const std::vector<int32_t>*> prompts(b.seqs.size(), nullptr);
    for (size_t s = 0; s < b.seqs.size() && opt.share_prefixes; ++s) {
      const Sequence& seq = *b.seqs[s];
      if (!seq.done && source_of[index_of(seq)] == index_of(seq) && !seq.request->score_prompt)
        prompts[s] = &seq.request->prompt;
    }
    return plan_shared_prefixes(prompts, opt.prefix_sharing);
  }

  // In prefill, the prompts computed whole go first and those sharing a beginning after them, each
  // copying its source's rows in the step (PrefixCopy).
  void build_step(int i, int u) {
    BatchState& b = unit(i, u);
    const bool prefill = token(i, u) == 0;
    b.step = StepBatch();
    b.active.clear();
    b.sampled.clear();
    b.prompt_start.clear();
    const std::vector<SharedPrefix> share = prefill ? plan_unit_sharing(b) : std::vector<SharedPrefix>();
    std::vector<size_t> order;  // slots; in prefill those computed whole first
    for (int pass = 0; pass < 2; ++pass)
      for (size_t s = 0; s < b.seqs.size(); ++s)
        if (prefill ? (share[s].source >= 0) == (pass == 1) : pass == 0) order.push_back(s);
    for (const size_t s : order) {
      Sequence& seq = *b.seqs[s];
      if (seq.done) continue;
      if (prefill && source_of[index_of(seq)] != index_of(seq)) continue;  // its source's prefill samples it
      if (prefill) {
        const std::vector<int32_t>& prompt = seq.request->prompt;
        const int start = share[s].length;
        if (start > 0) b.step.prefix_copies.push_back({share[s].source, int32_t(s), start});
        for (size_t p = size_t(start); p < prompt.size(); ++p) {
          b.step.tokens.push_back(prompt[p]);
          b.step.positions.push_back(int32_t(p));
          b.step.slots.push_back(int32_t(s));
        }
        b.prompt_start.push_back(start);
      } else {
        b.step.tokens.push_back(seq.next_token);
        b.step.positions.push_back(seq.length);
        b.step.slots.push_back(int32_t(s));
      }
      b.step.logit_rows.push_back(int32_t(b.step.tokens.size() - 1));
      b.active.push_back(&seq);
      b.sampled.push_back(&seq);
      if (!prefill) continue;
      totals.prefill_tokens += int64_t(seq.request->prompt.size()) - b.prompt_start.back();
      shared_prompt_tokens += b.prompt_start.back();
      for (Sequence* f : followers[index_of(seq)]) {  // the same last prompt row, each its own sampler
        b.step.logit_rows.push_back(b.step.logit_rows.back());
        b.sampled.push_back(f);
      }
    }
  }

  // Sub-layer jj (layer jj / 2's attention block when even, its MLP block when odd) for unit u.
  void compute(int i, int jj, int u) {
    BatchState& b = unit(i, u);
    const int j = jj / 2, t = token(i, u);
    const bool attention = jj % 2 == 0;
    if (jj == 0) build_step(i, u);
    if (b.active.empty()) return;
    ScopedSpan span(trace, compute_track,
                    "t" + std::to_string(t) + " L" + std::to_string(j) + (attention ? "a" : "m") + " B" +
                        std::to_string(b.batch) + (t == 0 ? " s" + std::to_string(b.first_slot) : std::string()),
                    &compute_busy);
    const int64_t T = int64_t(b.step.tokens.size());
    const LayerWeights& w = weight_quant && T > be.fused_dequant_max_tokens() ? dequantized_for(i, jj) : weights_for(jj);
    const Tensor x = hidden_for(i, jj, u, T);
    const bool cpu = attention && delegated(t, j);
    Tensor ck, cv;
    if (attention && !cpu) std::tie(ck, cv) = cache_for(i, j, u);
    if (attention && !cpu && t == 1)
      share_prompt_rows(b, static_cast<char*>(ck.data), static_cast<char*>(cv.data),
                        [this](char* d, const char* s, size_t n) { be.copy_on_device(d, s, n); });
    // Steps of at most the workspace's tokens: a group whose prompts outgrow it runs in pieces, in
    // order, so each piece finds the earlier pieces' keys in the cache.
    const int64_t step_max = ops.max_tokens();
    STRATA_CHECK(!cpu || T <= step_max, "internal: a delegated decode step of " << T << " tokens is split");
    for (int64_t t0 = 0; t0 < T; t0 += step_max) {
      const int64_t t1 = std::min(T, t0 + step_max);
      ops.begin_step(slice(b.step, t0, t1), b.slots(), shape.capacity());
      const Tensor xs = x.rows(t0, t1 - t0);
      if (jj == 0) ops.embed(globals, xs);
      if (!attention)
        ops.mlp_block(w, xs);
      else if (cpu)
        ops.attention_block(w, globals.inv_freq, xs, Tensor(), Tensor(),
                            [&](const Tensor& q, const Tensor& kk, const Tensor& v, const Tensor& out) {
                              attend_on_cpu(i, u, j, q, kk, v, out);
                            });
      else
        ops.attention_block(w, globals.inv_freq, xs, ck, cv);
    }
    if (jj == 2 * L - 1) {
      if (t == 0) score_prompts(b, x, T);
      ops.select_logit_rows(b.step.logit_rows, T);
      const Tensor logits = ops.head(globals, x);
      if (t == 0)
        for (Sequence* s : b.sampled) s->length = int(s->request->prompt.size());
      else
        for (Sequence* s : b.active) ++s->length;
      sampler->sample(logits, b.sampled);
    }
    be.synchronize();
  }

  // Prefill's last sub-layer: the next-token NLL of every prompt position of the unit's sequences
  // that asked for it, through the head a workspace's worth of rows at a time (host reduction).
  void score_prompts(const BatchState& b, const Tensor& x, int64_t T) {
    const int64_t chunk = gbs;  // the workspace's logit rows
    std::vector<float> logits;
    int32_t first = 0;  // the sequence's first row in the step
    for (size_t k = 0; k < b.active.size(); ++k) {
      Sequence* s = b.active[k];
      const std::vector<int32_t>& prompt = s->request->prompt;
      if (s->request->score_prompt) {
        STRATA_CHECK(b.prompt_start[k] == 0, "internal: a scored prompt shares its beginning");
        std::vector<double>& nll = s->result.prompt_nll;
        nll.clear();
        for (int32_t t0 = 0; t0 + 1 < int32_t(prompt.size()); t0 += int32_t(chunk)) {
          const int32_t t1 = std::min(int32_t(prompt.size()) - 1, t0 + int32_t(chunk));
          std::vector<int32_t> rows;
          for (int32_t t = t0; t < t1; ++t) rows.push_back(first + t);
          ops.select_logit_rows(rows, T);
          const Tensor l = ops.head(globals, x);
          const int64_t vocab = l.dim(1);
          logits.resize(size_t(l.numel()));
          be.copy_to_host_f32(l, logits.data());
          for (int32_t t = t0; t < t1; ++t) nll.push_back(token_nll(logits.data() + (t - t0) * vocab, vocab, prompt[size_t(t + 1)]));
        }
      }
      first += int32_t(prompt.size()) - b.prompt_start[k];
    }
  }

  // Tokens [t0, t1) of a step, without logit rows (compute() selects them over the whole step).
  // Only a unit of one prompt runs in pieces (a unit of several fits a step: PrefillSteps), and
  // one prompt shares with no other, so prefix copies come with whole steps only.
  static StepBatch slice(const StepBatch& s, int64_t t0, int64_t t1) {
    const bool whole = t0 == 0 && t1 == int64_t(s.tokens.size());
    STRATA_CHECK(whole || s.prefix_copies.empty(), "internal: a prefill unit sharing prefixes runs in pieces");
    StepBatch part;
    part.tokens.assign(s.tokens.begin() + t0, s.tokens.begin() + t1);
    part.positions.assign(s.positions.begin() + t0, s.positions.begin() + t1);
    part.slots.assign(s.slots.begin() + t0, s.slots.begin() + t1);
    if (whole) part.prefix_copies = s.prefix_copies;
    return part;
  }

  // ---------------------------------------------------------------- the schedule
  // Whether two units hold some of the same cache and hidden-state rows at one sub-layer.
  bool same_rows(int i, int u, int jj, int ni, int nu, int njj) const {
    const BatchState &a = unit(i, u), &b = unit(ni, nu);
    return jj == njj && a.batch == b.batch && a.first_slot < b.first_slot + b.slots() &&
           b.first_slot < a.first_slot + a.slots();
  }

  // One step of Algorithm 1: prefetch the next sub-layer's weights, store the previous step's
  // cache and hidden state, load the next step's, compute this one, then wait for all of it. A
  // step is (super-step i, sub-layer jj, unit u): the sub-layers are each layer's attention block
  // and its MLP block (FlexGen's "layers"), so a layer's weights stream half by half; the units
  // are, in prefill, groups of a GPU batch's sequences, in decode the GPU batches. Without a
  // staggered prefill super-step i is token i of every batch.
  void step(int i, int jj, int u, int n_steps, bool has_prev, int pi, int pjj, int pu) {
    std::vector<Ticket> tickets;
    std::vector<std::function<void()>> after;
    const int subs = 2 * L;
    try {
      if (u == 0 && (jj + 1 < subs || i + 1 < n_steps)) {
        load_weights_async((jj + 1) % subs);
        if (w_held[size_t((jj + 1) % subs)].ready.valid()) tickets.push_back(w_held[size_t((jj + 1) % subs)].ready);
      }
      if (has_prev) {
        if (pjj % 2 == 0) store_cache(pi, pjj / 2, pu, tickets, after);  // only attention touches the cache
        store_act(pi, pjj, pu, tickets, after);
      }
      int ni = i, njj = jj, nu = u + 1;
      if (nu == n_units(i)) nu = 0, ++njj;
      if (njj == subs) njj = 0, ++ni;
      // The next step's rows are this step's own when the block has one sub-layer and one unit;
      // they cannot be prefetched before this step stores them.
      if (ni < n_steps && !same_rows(i, u, jj, ni, nu, njj)) {
        if (njj % 2 == 0) {
          load_cache_async(ni, njj / 2, nu);
          if (c_held[size_t(nu)][size_t(njj / 2)].ready.valid()) tickets.push_back(c_held[size_t(nu)][size_t(njj / 2)].ready);
        }
        if (njj != 0) {
          load_act_async(ni, njj, nu);
          if (a_held[size_t(nu)].ready.valid()) tickets.push_back(a_held[size_t(nu)].ready);
        }
      }
      compute(i, jj, u);
      wait_all(tickets);
    } catch (...) {
      try {
        wait_all(tickets);  // nothing may still write into buffers being unwound
      } catch (...) {
      }
      for (auto& f : after) f();
      throw;
    }
    for (auto& f : after) f();
    if (u == n_units(i) - 1) release_weights(jj);
  }

  // Groups the block's sequences into the decode units (one per GPU batch) and the prefill units
  // (plan.prefill_seqs consecutive sequences of one batch each). `seqs` lists the batches' sequences
  // in turn, batch k's at [batch_begin[k], batch_begin[k + 1]), slot by slot. A request's choices in
  // one batch follow the first of them, their source: only it prefills, they copy its prompt rows at
  // token 1 within the batch's cache home (or its staging slot), which no other batch's schedule touches.
  void build_units(std::vector<Sequence>& seqs, const std::vector<size_t>& batch_begin) {
    auto prompt_bounds = [](BatchState& b) {
      b.pmin = b.seqs.empty() ? 0 : INT32_MAX;
      b.pmax = 0;
      for (Sequence* s : b.seqs) {
        b.pmin = std::min(b.pmin, int(s->request->prompt.size()));
        b.pmax = std::max(b.pmax, int(s->request->prompt.size()));
      }
    };
    decode_units.assign(size_t(ngb), {});
    std::vector<size_t> batch_of(seqs.size());
    for (int k = 0; k < ngb; ++k) {
      decode_units[size_t(k)].batch = k;
      for (size_t q = batch_begin[size_t(k)]; q < batch_begin[size_t(k) + 1]; ++q) {
        decode_units[size_t(k)].seqs.push_back(&seqs[q]);
        batch_of[q] = size_t(k);
      }
    }
    block_seqs = seqs.data();
    source_of.assign(seqs.size(), 0);
    followers.assign(seqs.size(), {});
    for (size_t q = 0; q < seqs.size(); ++q) {
      const size_t prev = q - 1, batch = batch_of[q];
      const bool follows = q > 0 && seqs[prev].request == seqs[q].request && batch_of[prev] == batch;
      source_of[q] = follows ? source_of[prev] : q;
      if (!follows) continue;
      followers[source_of[q]].push_back(&seqs[q]);
      decode_units[batch].shared.push_back({seqs[q].slot, seqs[source_of[q]].slot});
    }
    prefill_units.clear();
    const int m = plan.prefill_seqs;
    for (BatchState& d : decode_units) {
      prompt_bounds(d);
      for (int s0 = 0; s0 < d.slots(); s0 += m) {
        BatchState p;
        p.batch = d.batch;
        p.first_slot = s0;
        p.act_offset = size_t(s0 / m) * plan.act_piece_bytes;
        p.seqs.assign(d.seqs.begin() + s0, d.seqs.begin() + std::min(s0 + m, d.slots()));
        prompt_bounds(p);
        prefill_units.push_back(std::move(p));
      }
    }
  }

  // The block's super-steps: GPU batch k prefills in super-step policy.start_step(k) (0 for all
  // without a staggered prefill) and decodes its n_tokens - 1 tokens in the super-steps after.
  // Each super-step lists its units in batch order, each at its batch's own token. Returns the
  // number of super-steps.
  int build_step_units(int n_tokens) {
    const Policy& p = opt.policy;
    step_units.clear();
    if (n_tokens < 1) return 0;
    const int n_steps = p.start_steps() + n_tokens - 1;
    step_units.resize(size_t(n_steps));
    for (int k = 0; k < ngb; ++k) {
      const int first = p.start_step(k);
      for (BatchState& unit : prefill_units)
        if (unit.batch == k) step_units[size_t(first)].push_back({&unit, 0});
      for (int t = 1; t < n_tokens; ++t) step_units[size_t(first + t)].push_back({&decode_units[size_t(k)], t});
    }
    return n_steps;
  }

  std::vector<GenResult> generate(const std::vector<GenRequest>& requests, GenStats* stats) {
    // A request's n choices run as n sequences; those in one GPU batch share one prefill
    // (build_units), so pack_choices keeps each request's choices in one batch where it can.
    for (size_t r = 0; r < requests.size(); ++r)
      STRATA_CHECK(requests[r].n >= 1, "offload engine: request " << r << ": n must be at least 1, got " << requests[r].n);
    const size_t n_seqs = count_choices(requests);
    STRATA_CHECK(n_seqs <= size_t(gbs) * size_t(ngb),
                 "offload engine: " << n_seqs << " sequences (choices) exceed the block of " << gbs * ngb);
    const std::vector<std::vector<Choice>> batches = pack_choices(requests, gbs, ngb);
    std::vector<size_t> first_choice(requests.size() + 1, 0);  // a choice's place in the results
    for (size_t r = 0; r < requests.size(); ++r) first_choice[r + 1] = first_choice[r] + size_t(requests[r].n);
    std::vector<Sequence> seqs;
    seqs.reserve(n_seqs);
    std::vector<size_t> batch_begin{0}, result_index;
    int n_tokens = 0;
    for (const std::vector<Choice>& batch : batches) {
      for (const Choice& ch : batch) {
        const GenRequest& req = requests[ch.request];
        seqs.push_back(start_sequence(req, cfg, int(seqs.size() - batch_begin.back()), ch.request, ch.choice));
        result_index.push_back(first_choice[ch.request] + size_t(ch.choice));
        STRATA_CHECK(int(req.prompt.size()) <= shape.prompt_len && seqs.back().max_new <= shape.gen_len,
                     "offload engine: request " << ch.request << " exceeds the planned shape (prompt "
                                                << shape.prompt_len << ", generation " << shape.gen_len << ")");
        n_tokens = std::max(n_tokens, seqs.back().max_new);
      }
      batch_begin.push_back(seqs.size());
    }
    build_units(seqs, batch_begin);
    const int n_steps = build_step_units(n_tokens);
    dequant_token = dequant_sub = -1;  // super-step numbers restart with every block
    size_t units = 0;
    for (const std::vector<StepUnit>& step_list : step_units) units = std::max(units, step_list.size());
    w_held.assign(size_t(2 * L), {});
    c_held.assign(units, std::vector<Held>(size_t(L)));
    c_stored.assign(size_t(ngb), std::vector<std::vector<Ticket>>(size_t(L)));
    a_held.assign(units, {});
    a_stored.assign(units, {});
    a_stored_layer.assign(units, -1);
    a_stored_token.assign(units, -1);
    sampler = std::make_unique<StepSampler>(be, cfg, size_t(gbs));

    GenStats local;
    shared_prompt_tokens = 0;
    const auto t_start = Clock::now();
    const std::array<double, 4> busy_at_start = lane_busy();
    bool has_prev = false;
    int pi = 0, pjj = 0, pu = 0;
    try {
      // A super-step in which some batch prefills counts as prefill (all of token 0 without a
      // staggered prefill), the others as decode steps.
      std::array<double, 4> busy_before = busy_at_start;
      for (int i = 0; i < n_steps; ++i) {
        const auto t_step = Clock::now();
        for (int jj = 0; jj < 2 * L; ++jj)
          for (int u = 0; u < n_units(i); ++u) {
            step(i, jj, u, n_steps, has_prev, pi, pjj, pu);
            has_prev = true, pi = i, pjj = jj, pu = u;
          }
        const bool prefills = std::any_of(step_units[size_t(i)].begin(), step_units[size_t(i)].end(),
                                          [](const StepUnit& su) { return su.token == 0; });
        (prefills ? local.prefill_seconds : local.decode_seconds) += seconds_since(t_step);
        const std::array<double, 4> busy = lane_busy();
        if (prefills) {
          totals.prefill_compute_busy += busy[0] - busy_before[0];
          totals.prefill_h2d_busy += busy[1] - busy_before[1];
          totals.prefill_d2h_busy += busy[2] - busy_before[2];
          totals.prefill_disk_busy += busy[3] - busy_before[3];
        } else {
          ++local.decode_steps;
        }
        busy_before = busy;
        if (std::all_of(seqs.begin(), seqs.end(), [](const Sequence& s) { return s.done; })) break;
      }
    } catch (...) {
      release_all();
      throw;
    }
    release_all();
    totals.schedule_seconds += seconds_since(t_start);

    std::vector<GenResult> results(seqs.size());
    for (size_t r = 0; r < seqs.size(); ++r) {
      if (source_of[r] != r) {
        if (seqs[r].request->score_prompt) seqs[r].result.prompt_nll = seqs[source_of[r]].result.prompt_nll;
        continue;
      }
      local.prompt_tokens += int64_t(seqs[r].request->prompt.size());  // each source prefills
    }
    for (size_t r = 0; r < seqs.size(); ++r) {
      local.generated_tokens += int64_t(seqs[r].result.tokens.size());
      results[result_index[r]] = std::move(seqs[r].result);  // request order, then choice order
    }
    for (GenStats* s : {&totals.gen, stats}) {
      if (!s) continue;
      s->prefill_seconds += local.prefill_seconds;
      s->decode_seconds += local.decode_seconds;
      s->prompt_tokens += local.prompt_tokens;
      s->shared_prompt_tokens += shared_prompt_tokens;
      s->generated_tokens += local.generated_tokens;
      s->decode_steps += local.decode_steps;
    }
    return results;
  }

  // Busy seconds so far of the compute, cpu->gpu, gpu->cpu and disk lanes.
  std::array<double, 4> lane_busy() const {
    return {compute_busy, h2d->busy_seconds(), d2h->busy_seconds(), disk_lane->busy_seconds()};
  }

  // Waits for anything in flight and frees every slot (units prefetched for a token that never
  // ran, or held when an error stopped the block).
  void release_all() {
    for (const Ticket& t : a_stored) drain(t);
    for (const auto& row : c_stored)
      for (const auto& tickets : row)
        for (const Ticket& t : tickets) drain(t);
    for (size_t j = 0; j < w_held.size(); ++j) {
      drain(w_held[j].ready);
      release_weights(int(j));
    }
    for (auto& row : c_held)
      for (Held& h : row) {
        drain(h.ready);
        free_slots(h, c_gpu, c_pin);
        h = Held();
      }
    for (Held& h : a_held) {
      drain(h.ready);
      free_slots(h, a_gpu, a_pin);
      h = Held();
    }
  }
};

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
  const Policy& p = options.policy;
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

OffloadReport OffloadEngine::report() const {
  const Impl& m = *impl_;
  OffloadReport r = m.totals;
  r.compute_busy = m.compute_busy;
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
