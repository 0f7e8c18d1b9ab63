#include "strata/offload/engine.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

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
  gpu_pool.release(h.gpu);
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

struct BatchState {
  std::vector<Sequence*> seqs;  // index = cache slot within the GPU batch
  int pmin = 0, pmax = 0;       // shortest and longest prompt
  StepBatch step;               // this token's step
  std::vector<Sequence*> active;
};

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
                                                                                                : " (--disk-mem, or the offload dir's free space)"));
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
  SlotPool w_gpu, w_pin, c_gpu, c_pin, a_gpu, a_pin;
  DiskIoStats disk_at_start;

  // Homes.
  BlockLayout layer_layout;
  ModelWeights globals;  // embeddings, final norm, head and inv_freq; layers unused
  std::vector<Home> weight_home;
  std::vector<LayerWeights> resident_layers;  // views of GPU-homed layers
  LayerWeights staged_weights;                // views of the layer being computed from a GPU buffer
  std::vector<std::vector<Home>> cache_home;  // [batch][layer]
  std::vector<Home> act_home;                 // [batch]
  size_t cache_half = 0;                      // bytes of K (or V) of one unit

  // CPU attention.
  std::unique_ptr<Backend> cpu_backend_owned;
  Backend* cpu_attn = nullptr;
  char *q_host = nullptr, *k_host = nullptr, *v_host = nullptr, *o_host = nullptr;
  double cpu_attention_seconds = 0;

  // Schedule.
  ForwardOps ops;
  Trace trace;
  std::unique_ptr<Lane> h2d, d2h, disk_lane;
  int compute_track = 0;
  double compute_busy = 0;
  std::atomic<uint64_t> bytes_dtoc{0}, bytes_ctog{0}, bytes_gtoc{0}, bytes_ctod{0};
  OffloadReport totals;
  int disk_ops_left = 0;  // fault injection countdown (disk thread only)

  // Per block.
  std::vector<BatchState> batches;
  std::vector<Held> w_held;                 // [layer]
  std::vector<std::vector<Held>> c_held;    // [batch][layer]
  std::vector<std::vector<Ticket>> c_stored;  // [batch][layer]: last store, which a reload waits for
  std::vector<Held> a_held;                 // [batch]
  std::vector<Ticket> a_stored;             // [batch]: store of its hidden state
  std::vector<int> a_stored_layer;          // [batch]: the layer whose output is at home ...
  std::vector<int> a_stored_token;          // [batch]: ... and the token it is for
  std::unique_ptr<StepSampler> sampler;

  Impl(const ModelConfig& c, Backend& b, const OffloadOptions& o, const PlanShape& s)
      : cfg(c), be(b), opt(o), shape(s), dt(b.activation_dtype()), esize(dtype_size(dt)), L(c.n_layers),
        gbs(o.policy.gpu_batch_size), ngb(o.policy.num_gpu_batches), ops(cfg, b), trace(o.trace) {}

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

    layer_layout = layer_block_layout(cfg, 0, dt);
    const size_t bytes = plan.layer_weight_bytes;
    // Disk-bound layers pass through an aligned host buffer (O_DIRECT wants aligned memory).
    std::unique_ptr<char, void (*)(void*)> bounce(static_cast<char*>(std::aligned_alloc(kPage, bytes)), std::free);
    weight_home.resize(size_t(L));
    resident_layers.resize(size_t(L));
    for (int l = 0; l < L; ++l) {
      const BlockLayout layout = layer_block_layout(cfg, l, dt);  // same offsets, this layer's names
      Home& h = weight_home[size_t(l)] = place(plan.weight_tier[size_t(l)], bytes, "layer weights");
      if (h.tier == Tier::Cpu) {
        read_block(layout, src, h.ptr, used);
        if (opt.on_layer_loaded) opt.on_layer_loaded(l + 1, L);
        continue;
      }
      std::memset(bounce.get(), 0, bytes);
      read_block(layout, src, bounce.get(), used);
      if (h.tier == Tier::Gpu) {
        be.copy_to_device(h.ptr, bounce.get(), bytes);
        resident_layers[size_t(l)] = layer_views(layer_layout, h.ptr, be.device());
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
    const int64_t max_tokens = int64_t(gbs) * shape.prompt_len;
    ops.bind_workspace(gpu.take(ForwardOps::workspace_bytes(cfg, dt, max_tokens, gbs), "workspace"), max_tokens, gbs);
    if (moves(plan.weight_tier)) w_gpu = SlotPool("gpu weight buffer", gpu, 2, plan.layer_weight_bytes);
    if (moves(plan.cache_tier)) c_gpu = SlotPool("gpu cache staging", gpu, 3, plan.cache_unit_bytes);
    if (moves(plan.act_tier)) a_gpu = SlotPool("gpu activation staging", gpu, 3, plan.act_unit_bytes);
    if (on_disk(plan.weight_tier)) w_pin = SlotPool("pinned weight buffer", cpu, 2, plan.layer_weight_bytes);
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
  size_t cache_row_bytes() const { return size_t(cfg.kv_dim()) * esize; }
  size_t slot_pitch() const { return size_t(shape.capacity()) * cache_row_bytes(); }

  Ticket copy_cache(CopyKind kind, char* gpu_unit, char* host_unit, SlotRange r, std::vector<Ticket> deps) {
    const size_t pitch = slot_pitch(), row = cache_row_bytes();
    const size_t off = size_t(r.begin) * row, width = size_t(r.end - r.begin) * row;
    Lane& lane = kind == CopyKind::HostToDevice ? *h2d : *d2h;
    std::atomic<uint64_t>& counter = kind == CopyKind::HostToDevice ? bytes_ctog : bytes_gtoc;
    return lane.submit(
        "kv cache", [=, this, &counter] {
          for (size_t half = 0; half < 2; ++half) {
            char* g = gpu_unit + half * cache_half + off;
            char* h = host_unit + half * cache_half + off;
            if (kind == CopyKind::HostToDevice) be.copy_2d(kind, g, pitch, h, pitch, width, size_t(gbs));
            else be.copy_2d(kind, h, pitch, g, pitch, width, size_t(gbs));
          }
          counter += 2 * width * size_t(gbs);
        },
        std::move(deps));
  }

  // Disk I/O of the pages covering positions `r` of every slot of a cache unit.
  Ticket disk_cache_io(bool write, size_t disk_offset, char* pinned_unit, SlotRange r, std::vector<Ticket> deps) {
    const size_t pitch = slot_pitch(), row = cache_row_bytes();
    return disk_lane->submit(
        write ? "kv cache write" : "kv cache read", [=, this] {
          for (size_t half = 0; half < 2; ++half)
            for (int s = 0; s < gbs; ++s) {
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
  SlotRange load_range(int k, int i) const {  // cache entries that exist before token i
    return {0, i == 0 ? 0 : std::min(batches[size_t(k)].pmax + i - 1, shape.capacity())};
  }
  SlotRange store_range(int k, int i) const {  // cache entries token i writes (union over slots)
    const BatchState& b = batches[size_t(k)];
    if (i == 0) return {0, std::min(b.pmax, shape.capacity())};
    return {std::min(b.pmin + i - 1, shape.capacity()), std::min(b.pmax + i, shape.capacity())};
  }
  bool delegated(int i, int j) const {
    return opt.policy.cpu_attention && i > 0 && plan.cache_tier[size_t(j)] == Tier::Cpu;
  }
  bool cache_moves(int i, int j) const { return plan.cache_tier[size_t(j)] != Tier::Gpu && !delegated(i, j); }

  void load_weights_async(int j) {
    Held& h = w_held[size_t(j)];
    if (plan.weight_tier[size_t(j)] == Tier::Gpu || h.valid) return;
    const Home& home = weight_home[size_t(j)];
    h.valid = true;
    h.gpu = w_gpu.acquire();
    const size_t bytes = plan.layer_weight_bytes;
    char* src = home.ptr;
    std::vector<Ticket> deps;
    if (home.tier == Tier::Disk) {
      h.pin = w_pin.acquire();
      src = w_pin.data(h.pin);
      deps.push_back(disk_io(false, home.disk_offset, src, bytes, "weights read", {}));
    }
    h.ready = copy_flat(CopyKind::HostToDevice, w_gpu.data(h.gpu), src, bytes, "weights", std::move(deps));
  }

  void release_weights(int j) {
    free_slots(w_held[size_t(j)], w_gpu, w_pin);
    w_held[size_t(j)] = Held();
  }

  void load_cache_async(int i, int j, int k) {
    Held& h = c_held[size_t(k)][size_t(j)];
    if (!cache_moves(i, j) || h.valid) return;
    const Home& home = cache_home[size_t(k)][size_t(j)];
    h.valid = true;
    h.token = i;
    h.gpu = c_gpu.acquire();
    const SlotRange r = load_range(k, i);
    char* host = home.ptr;
    std::vector<Ticket> deps;
    if (c_stored[size_t(k)][size_t(j)].valid()) deps.push_back(c_stored[size_t(k)][size_t(j)]);  // its last write
    if (home.tier == Tier::Disk) {
      h.pin = c_pin.acquire();
      host = c_pin.data(h.pin);
      if (!r.empty()) deps = {disk_cache_io(false, home.disk_offset, host, r, std::move(deps))};
    }
    h.ready = r.empty() ? Ticket() : copy_cache(CopyKind::HostToDevice, c_gpu.data(h.gpu), host, r, std::move(deps));
  }

  // Moves the entries token i wrote back home; the slots are released by `after` once done.
  void store_cache(int i, int j, int k, std::vector<Ticket>& tickets, std::vector<std::function<void()>>& after) {
    Held h = c_held[size_t(k)][size_t(j)];
    if (!h.valid) return;
    c_held[size_t(k)][size_t(j)] = Held();
    const Home& home = cache_home[size_t(k)][size_t(j)];
    const SlotRange r = store_range(k, i);
    if (!batches[size_t(k)].active.empty() && !r.empty()) {
      char* host = home.tier == Tier::Disk ? c_pin.data(h.pin) : home.ptr;
      Ticket t = copy_cache(CopyKind::DeviceToHost, c_gpu.data(h.gpu), host, r, {});
      if (home.tier == Tier::Disk) t = disk_cache_io(true, home.disk_offset, host, r, {t});
      tickets.push_back(t);
      c_stored[size_t(k)][size_t(j)] = t;
    }
    after.push_back([this, h] { free_slots(h, c_gpu, c_pin); });
  }

  size_t act_bytes(int k) const { return batches[size_t(k)].step.tokens.size() * size_t(cfg.hidden) * esize; }

  // Loads batch k's hidden state (the input of layer j) into a staging slot, after its store.
  void load_act_async(int i, int j, int k) {
    Held& h = a_held[size_t(k)];
    if (act_home[size_t(k)].tier == Tier::Gpu || h.valid || j == 0) return;
    // Not stored yet (one or two GPU batches): it is loaded right before its compute instead.
    if (a_stored_layer[size_t(k)] != j - 1 || a_stored_token[size_t(k)] != i) return;
    const Home& home = act_home[size_t(k)];
    h.valid = true;
    h.layer = j;
    h.gpu = a_gpu.acquire();
    const size_t bytes = act_bytes(k);
    char* host = home.ptr;
    std::vector<Ticket> deps{a_stored[size_t(k)]};
    if (home.tier == Tier::Disk) {
      h.pin = a_pin.acquire();
      host = a_pin.data(h.pin);
      deps = {disk_io(false, home.disk_offset, host, bytes, "activations read", std::move(deps))};
    }
    h.ready = copy_flat(CopyKind::HostToDevice, a_gpu.data(h.gpu), host, bytes, "activations", std::move(deps));
  }

  void store_act(int i, int j, int k, std::vector<Ticket>& tickets, std::vector<std::function<void()>>& after) {
    Held h = a_held[size_t(k)];
    if (!h.valid) return;
    a_held[size_t(k)] = Held();
    const Home& home = act_home[size_t(k)];
    if (j < L - 1 && !batches[size_t(k)].active.empty()) {  // the last layer's output is not needed again
      const size_t bytes = act_bytes(k);
      char* host = home.tier == Tier::Disk ? a_pin.data(h.pin >= 0 ? h.pin : (h.pin = a_pin.acquire())) : home.ptr;
      Ticket t = copy_flat(CopyKind::DeviceToHost, host, a_gpu.data(h.gpu), bytes, "activations", {});
      if (home.tier == Tier::Disk) t = disk_io(true, home.disk_offset, host, bytes, "activations write", {t});
      tickets.push_back(t);
      a_stored[size_t(k)] = t;
      a_stored_layer[size_t(k)] = j;
      a_stored_token[size_t(k)] = i;
    }
    after.push_back([this, h] { free_slots(h, a_gpu, a_pin); });
  }

  // ---------------------------------------------------------------- compute
  const LayerWeights& weights_for(int j) {
    if (plan.weight_tier[size_t(j)] == Tier::Gpu) return resident_layers[size_t(j)];
    load_weights_async(j);  // no-op when prefetched
    Held& h = w_held[size_t(j)];
    if (h.ready.valid()) h.ready.get();
    staged_weights = layer_views(layer_layout, w_gpu.data(h.gpu), be.device());
    return staged_weights;
  }

  Tensor hidden_for(int i, int j, int k, int64_t T) {
    const Home& home = act_home[size_t(k)];
    char* p = nullptr;
    if (home.tier == Tier::Gpu) {
      p = home.ptr;
    } else {
      Held& h = a_held[size_t(k)];
      if (j == 0) {
        STRATA_CHECK(!h.valid, "internal: batch " << k << " holds a hidden state at layer 0");
        h.valid = true;
        h.layer = 0;
        h.gpu = a_gpu.acquire();
      } else {
        load_act_async(i, j, k);
        STRATA_CHECK(h.valid && h.layer == j, "internal: hidden state of batch " << k << " for layer " << j << " missing");
        if (h.ready.valid()) h.ready.get();
      }
      p = a_gpu.data(h.gpu);
    }
    return Tensor(p, dt, be.device(), {T, cfg.hidden});
  }

  std::pair<Tensor, Tensor> cache_for(int i, int j, int k) {
    const Home& home = cache_home[size_t(k)][size_t(j)];
    char* p = home.ptr;
    if (home.tier != Tier::Gpu) {
      load_cache_async(i, j, k);
      Held& h = c_held[size_t(k)][size_t(j)];
      STRATA_CHECK(h.token == i, "internal: kv cache of layer " << j << " batch " << k << " loaded for token " << h.token
                                                                << ", needed for token " << i);
      if (h.ready.valid()) h.ready.get();
      p = c_gpu.data(h.gpu);
    }
    auto view = [&](char* base) {
      return Tensor(base, dt, be.device(), {gbs, shape.capacity(), cfg.n_kv_heads, cfg.head_dim});
    };
    return {view(p), view(p + cache_half)};
  }

  // Attention on the CPU over the cache in pinned memory: q, k, v cross to the host, the output back.
  void attend_on_cpu(int k, int j, const Tensor& q, const Tensor& kk, const Tensor& v, const Tensor& out) {
    const auto t0 = Clock::now();
    const Home& home = cache_home[size_t(k)][size_t(j)];
    const BatchState& b = batches[size_t(k)];
    const int64_t T = q.dim(0);
    be.synchronize();
    be.copy_to_host(q_host, q.data, q.nbytes());
    be.copy_to_host(k_host, kk.data, kk.nbytes());
    be.copy_to_host(v_host, v.data, v.nbytes());
    auto host = [&](void* p, std::initializer_list<int64_t> dims) { return Tensor(p, dt, Device::CPU, dims); };
    const Tensor ck = host(home.ptr, {gbs, shape.capacity(), cfg.n_kv_heads, cfg.head_dim});
    const Tensor cv = host(home.ptr + cache_half, {gbs, shape.capacity(), cfg.n_kv_heads, cfg.head_dim});
    const Tensor slots(const_cast<int32_t*>(b.step.slots.data()), DType::I32, Device::CPU, {T});
    const Tensor pos(const_cast<int32_t*>(b.step.positions.data()), DType::I32, Device::CPU, {T});
    const Tensor qh = host(q_host, {T, cfg.n_heads, cfg.head_dim}), oh = host(o_host, {T, cfg.n_heads, cfg.head_dim});
    cpu_attn->kv_store(host(k_host, {T, cfg.n_kv_heads, cfg.head_dim}), host(v_host, {T, cfg.n_kv_heads, cfg.head_dim}),
                       ck, cv, slots, pos);
    cpu_attn->attention(qh, ck, cv, slots, pos, 1.0f / std::sqrt(float(cfg.head_dim)), oh);
    be.copy_to_device(out.data, o_host, out.nbytes());
    cpu_attention_seconds += seconds_since(t0);
  }

  void build_step(int i, int k) {
    BatchState& b = batches[size_t(k)];
    b.step = StepBatch();
    b.active.clear();
    for (size_t s = 0; s < b.seqs.size(); ++s) {
      Sequence& seq = *b.seqs[s];
      if (seq.done) continue;
      if (i == 0) {
        const std::vector<int32_t>& prompt = seq.request->prompt;
        for (size_t p = 0; p < prompt.size(); ++p) {
          b.step.tokens.push_back(prompt[p]);
          b.step.positions.push_back(int32_t(p));
          b.step.slots.push_back(int32_t(s));
        }
      } else {
        b.step.tokens.push_back(seq.next_token);
        b.step.positions.push_back(seq.length);
        b.step.slots.push_back(int32_t(s));
      }
      b.step.logit_rows.push_back(int32_t(b.step.tokens.size() - 1));
      b.active.push_back(&seq);
    }
  }

  void compute(int i, int j, int k) {
    BatchState& b = batches[size_t(k)];
    if (j == 0) build_step(i, k);
    if (b.active.empty()) return;
    ScopedSpan span(trace, compute_track, "t" + std::to_string(i) + " L" + std::to_string(j) + " B" + std::to_string(k),
                    &compute_busy);
    const int64_t T = int64_t(b.step.tokens.size());
    const LayerWeights& w = weights_for(j);
    const Tensor x = hidden_for(i, j, k, T);
    ops.begin_step(b.step, gbs, shape.capacity());
    if (j == 0) ops.embed(globals, x);
    if (delegated(i, j)) {
      ops.layer(w, globals.inv_freq, x, Tensor(), Tensor(),
                [&](const Tensor& q, const Tensor& kk, const Tensor& v, const Tensor& out) { attend_on_cpu(k, j, q, kk, v, out); });
    } else {
      const auto [ck, cv] = cache_for(i, j, k);
      ops.layer(w, globals.inv_freq, x, ck, cv);
    }
    if (j == L - 1) {
      const Tensor logits = ops.head(globals, x);
      if (i == 0)
        for (Sequence* s : b.active) s->length = int(s->request->prompt.size());
      else
        for (Sequence* s : b.active) ++s->length;
      sampler->sample(logits, b.active);
    }
    be.synchronize();
  }

  // ---------------------------------------------------------------- the schedule
  // One step of Algorithm 1: prefetch the next layer's weights, store the previous step's cache
  // and hidden state, load the next step's, compute this one, then wait for all of it.
  void step(int i, int j, int k, int n_tokens, bool has_prev, int pi, int pj, int pk) {
    std::vector<Ticket> tickets;
    std::vector<std::function<void()>> after;
    try {
      if (k == 0 && (j + 1 < L || i + 1 < n_tokens)) {
        load_weights_async((j + 1) % L);
        if (w_held[size_t((j + 1) % L)].ready.valid()) tickets.push_back(w_held[size_t((j + 1) % L)].ready);
      }
      if (has_prev) {
        store_cache(pi, pj, pk, tickets, after);
        store_act(pi, pj, pk, tickets, after);
      }
      int ni = i, nj = j, nk = k + 1;
      if (nk == ngb) nk = 0, ++nj;
      if (nj == L) nj = 0, ++ni;
      // The next step's unit is this step's own when the block has one layer and one GPU batch;
      // it cannot be prefetched before this step stores it.
      if (ni < n_tokens && !(nj == j && nk == k)) {
        load_cache_async(ni, nj, nk);
        if (c_held[size_t(nk)][size_t(nj)].ready.valid()) tickets.push_back(c_held[size_t(nk)][size_t(nj)].ready);
        if (!(nj == 0)) {
          load_act_async(ni, nj, nk);
          if (a_held[size_t(nk)].ready.valid()) tickets.push_back(a_held[size_t(nk)].ready);
        }
      }
      compute(i, j, k);
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
    if (k == ngb - 1) release_weights(j);
  }

  std::vector<GenResult> generate(const std::vector<GenRequest>& requests, GenStats* stats) {
    STRATA_CHECK(int(requests.size()) <= gbs * ngb,
                 "offload engine: " << requests.size() << " requests exceed the block of " << gbs * ngb);
    std::vector<Sequence> seqs(requests.size());
    int n_tokens = 0;
    for (size_t r = 0; r < requests.size(); ++r) {
      seqs[r] = start_sequence(requests[r], cfg, int(r % size_t(gbs)), r);
      STRATA_CHECK(int(requests[r].prompt.size()) <= shape.prompt_len && seqs[r].max_new <= shape.gen_len,
                   "offload engine: request " << r << " exceeds the planned shape (prompt " << shape.prompt_len
                                              << ", generation " << shape.gen_len << ")");
      n_tokens = std::max(n_tokens, seqs[r].max_new);
    }
    batches.assign(size_t(ngb), {});
    for (size_t r = 0; r < seqs.size(); ++r) batches[r / size_t(gbs)].seqs.push_back(&seqs[r]);
    for (BatchState& b : batches) {
      b.pmin = b.seqs.empty() ? 0 : INT32_MAX;
      for (Sequence* s : b.seqs) {
        b.pmin = std::min(b.pmin, int(s->request->prompt.size()));
        b.pmax = std::max(b.pmax, int(s->request->prompt.size()));
      }
    }
    w_held.assign(size_t(L), {});
    c_held.assign(size_t(ngb), std::vector<Held>(size_t(L)));
    c_stored.assign(size_t(ngb), std::vector<Ticket>(size_t(L)));
    a_held.assign(size_t(ngb), {});
    a_stored.assign(size_t(ngb), {});
    a_stored_layer.assign(size_t(ngb), -1);
    a_stored_token.assign(size_t(ngb), -1);
    sampler = std::make_unique<StepSampler>(be, cfg, size_t(gbs));

    GenStats local;
    const auto t_start = Clock::now();
    bool has_prev = false;
    int pi = 0, pj = 0, pk = 0;
    try {
      for (int i = 0; i < n_tokens; ++i) {
        const auto t_token = Clock::now();
        for (int j = 0; j < L; ++j)
          for (int k = 0; k < ngb; ++k) {
            step(i, j, k, n_tokens, has_prev, pi, pj, pk);
            has_prev = true, pi = i, pj = j, pk = k;
          }
        (i == 0 ? local.prefill_seconds : local.decode_seconds) += seconds_since(t_token);
        if (i > 0) ++local.decode_steps;
        if (std::all_of(seqs.begin(), seqs.end(), [](const Sequence& s) { return s.done; })) break;
      }
    } catch (...) {
      release_all();
      throw;
    }
    release_all();
    totals.schedule_seconds += seconds_since(t_start);

    std::vector<GenResult> results;
    for (size_t r = 0; r < seqs.size(); ++r) {
      local.prompt_tokens += int64_t(requests[r].prompt.size());
      local.generated_tokens += int64_t(seqs[r].result.tokens.size());
      results.push_back(std::move(seqs[r].result));
    }
    for (GenStats* s : {&totals.gen, stats}) {
      if (!s) continue;
      s->prefill_seconds += local.prefill_seconds;
      s->decode_seconds += local.decode_seconds;
      s->prompt_tokens += local.prompt_tokens;
      s->generated_tokens += local.generated_tokens;
      s->decode_steps += local.decode_steps;
    }
    return results;
  }

  // Waits for anything in flight and frees every slot (units prefetched for a token that never
  // ran, or held when an error stopped the block).
  void release_all() {
    for (const Ticket& t : a_stored) drain(t);
    for (const auto& row : c_stored)
      for (const Ticket& t : row) drain(t);
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
  check_policy_supported(p);
  STRATA_CHECK(shape.capacity() <= cfg.max_positions,
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
  r.peak.gpu = double(m.gpu.size());
  r.peak.cpu = double(m.cpu.size());
  r.peak.disk = m.disk ? double(m.disk->capacity()) : 0;
  return r;
}

void OffloadEngine::write_trace(const std::filesystem::path& file) const { impl_->trace.write(file); }

}  // namespace strata
