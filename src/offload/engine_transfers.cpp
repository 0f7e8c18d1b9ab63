// The offloading engine's transfers: weights, KV cache and hidden states between their homes
// (GPU, pinned CPU memory, disk) and the GPU's staging slots, as tickets on the copy and disk lanes.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <utility>

#include "engine_impl.h"

namespace strata {
namespace {

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

bool env_set(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
}

}  // namespace

namespace engine_detail {

Lane::Span enqueue_copy(Backend& be, CopyKind kind, const std::vector<Event>& deps, const std::function<void()>& copy) {
  const Stream s = copy_stream(kind);
  for (const Event& e : deps) be.wait(s, e);
  Lane::Span span{be.record(s), Event()};
  copy();
  span.end = be.record(s);
  return span;
}

void wait_on_host(Backend& be, const std::vector<Event>& deps) {
  for (const Event& e : deps) be.wait_host(e);
}

}  // namespace engine_detail

void OffloadEngine::Impl::start_lanes() {
  disk_ops_left = opt.fault_after;
  const bool threaded = opt.policy.overlap;
  compute_lane = std::make_unique<Lane>("compute", threaded, trace, &be, SpanTiming::Apart);
  h2d = std::make_unique<Lane>("cpu->gpu", threaded, trace, &be);
  d2h = std::make_unique<Lane>("gpu->cpu", threaded, trace, &be);
  disk_lane = std::make_unique<Lane>("disk", threaded, trace, &be);
  // On the CPU backend the compute is the CPU's own threads: attending inline keeps one user of
  // them. With one GPU batch there is no other batch's work for the GPU to do while the CPU
  // attends (the cost model's compute_stage at n = 1 is serial), so the lane's thread hop is pure
  // cost: on an H200, calibrate-gpu's 16 x 1 policy decoded at 224 tok/s through the lane against
  // 268 inline (bench/results/2026-11-27-h200-peers.md).
  attn_lane = std::make_unique<Lane>("cpu attention", threaded && be.device() != Device::CPU && ngb > 1, trace, &be);
  if (disk) disk_at_start = disk->stats();
  poison_released = env_set("STRATA_TEST_POISON_RELEASED");
  const char* skip = std::getenv("STRATA_TEST_SKIP_EVENT_WAIT");
  skip_event_wait = skip ? skip : "";
  static std::atomic<bool> told{false};
  if (!skip_event_wait.empty() && !told.exchange(true))
    std::fprintf(stderr, "strata: STRATA_TEST_SKIP_EVENT_WAIT=%s: the engine skips that event wait (a test's mutation)\n",
                 skip_event_wait.c_str());
}

Event OffloadEngine::Impl::await(const Ticket& t) {
  if (!t.valid()) return Event();
  if (t.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    const auto start = std::chrono::steady_clock::now();
    t.wait();
    ++waits.count;
    waits.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return t.get();
}

void OffloadEngine::Impl::compute_after(const Ticket& t) {
  if (t.valid()) be.wait(Stream::Compute, await(t));
}

void OffloadEngine::Impl::release_slot(SlotPool& pool, int slot, std::vector<Ticket> after, bool device) {
  if (slot < 0) return;
  if (device && poison_released) {  // on the compute stream, after the last users: a late reader sees NaNs
    compute_after(after);
    be.fill(pool.data(slot), 0xFF, pool.bytes());
    after = {compute_done()};
  }
  pool.release(slot, std::move(after));
}

void OffloadEngine::Impl::release_held(const Held& h, SlotPool& gpu_pool, SlotPool& pinned_pool,
                                       const std::vector<Ticket>& gpu_after, const std::vector<Ticket>& pinned_after) {
  if (!h.valid) return;
  release_slot(gpu_pool, h.gpu, gpu_after, true);
  release_slot(pinned_pool, h.pin, pinned_after, false);
}

void OffloadEngine::Impl::release_weights(int jj, const std::vector<Ticket>& readers) {
  const Held h = w_held[size_t(jj)];
  std::vector<Ticket> gpu_after = readers;
  gpu_after.push_back(h.ready);  // the load itself, should no unit have computed
  release_held(h, w_gpu[jj % 2], w_pin[jj % 2], gpu_after, {h.ready});
  w_held[size_t(jj)] = Held();
  w_issued[size_t(jj)] = 0;
}

void OffloadEngine::Impl::check_pending() {
  std::vector<Ticket> open;
  for (Ticket& t : pending) {
    if (t.wait_for(std::chrono::seconds(0)) == std::future_status::ready) t.get();  // rethrows a failed store
    else open.push_back(std::move(t));
  }
  pending = std::move(open);
}

Ticket OffloadEngine::Impl::copy_cache(CopyKind kind, char* gpu_unit, char* host_unit, SlotRange r, const BatchState& b,
                                       std::vector<Ticket> deps) {
  const size_t pitch = slot_pitch(), row = cache_row_bytes();
  const size_t off = size_t(r.begin) * row, width = size_t(r.end - r.begin) * row;
  const size_t host_off = size_t(b.first_slot) * pitch, n = size_t(b.slots());
  Lane& lane = kind == CopyKind::HostToDevice ? *h2d : *d2h;
  std::atomic<uint64_t>& counter = kind == CopyKind::HostToDevice ? bytes_ctog : bytes_gtoc;
  return lane.submit(
      "kv cache", [=, this, &counter](const std::vector<Event>& events) {
        return enqueue_copy(be, kind, events, [&] {
          for (size_t half = 0; half < 2; ++half) {
            char* g = gpu_unit + half * stage_half + off;
            char* h = host_unit + half * cache_half + host_off + off;
            if (kind == CopyKind::HostToDevice) be.copy_2d_async(kind, g, pitch, h, pitch, width, n);
            else be.copy_2d_async(kind, h, pitch, g, pitch, width, n);
          }
          counter += 2 * width * n;
        });
      },
      std::move(deps));
}

Ticket OffloadEngine::Impl::disk_cache_io(bool write, size_t disk_offset, char* pinned_unit, SlotRange r,
                                          const BatchState& b, std::vector<Ticket> deps) {
  const size_t pitch = slot_pitch(), row = cache_row_bytes();
  const int first = b.first_slot, last = b.first_slot + b.slots();
  return disk_lane->submit(
      write ? "kv cache write" : "kv cache read", [=, this](const std::vector<Event>& events) {
        wait_on_host(be, events);
        // Each sequence's rows of K and of V, all in one call: their pieces in flight together.
        std::vector<DiskRange> ranges;
        for (size_t half = 0; half < 2; ++half)
          for (int s = first; s < last; ++s) {
            const size_t lo = half * cache_half + size_t(s) * pitch + size_t(r.begin) * row;
            const size_t hi = half * cache_half + size_t(s) * pitch + size_t(r.end) * row;
            const size_t a = lo / kPage * kPage, b = std::min(align_up(hi, kPage), 2 * cache_half);
            ranges.push_back({disk_offset + a, pinned_unit + a, b - a});
          }
        before_disk_io(write);
        (write ? bytes_ctod : bytes_dtoc) += write ? disk->write(ranges) : disk->read(ranges);
        return Lane::Span{};
      },
      std::move(deps));
}

Ticket OffloadEngine::Impl::disk_io(bool write, size_t disk_offset, char* pinned, size_t bytes, const char* what,
                                    std::vector<Ticket> deps) {
  bytes = align_up(bytes, kPage);
  return disk_lane->submit(
      what, [=, this](const std::vector<Event>& events) {
        wait_on_host(be, events);
        before_disk_io(write);
        if (write) disk->write(disk_offset, pinned, bytes);
        else disk->read(disk_offset, pinned, bytes);
        (write ? bytes_ctod : bytes_dtoc) += bytes;
        return Lane::Span{};
      },
      std::move(deps));
}

Ticket OffloadEngine::Impl::copy_flat(CopyKind kind, char* dst, const char* src, size_t bytes, const char* what,
                                      std::vector<Ticket> deps) {
  Lane& lane = kind == CopyKind::HostToDevice ? *h2d : *d2h;
  std::atomic<uint64_t>& counter = kind == CopyKind::HostToDevice ? bytes_ctog : bytes_gtoc;
  return lane.submit(
      what, [=, this, &counter](const std::vector<Event>& events) {
        return enqueue_copy(be, kind, events, [&] {
          be.copy_async(kind, dst, src, bytes);
          counter += bytes;
        });
      },
      std::move(deps));
}

SlotRange OffloadEngine::Impl::load_range(int i, int u, int layer) const {
  const BatchState& b = unit(i, u);
  SlotRange r;
  int earliest = 0;     // the step's earliest position
  bool copies = false;  // the step copies prompt rows into other slots: its store writes rows from 0
  if (served) {
    // Every slot's stored positions, as far as the steps built so far have written: the step to
    // load, or (prefetched one step ahead) the step before it, which adds nothing the step reads.
    // Rows past a slot's own are loaded and stored back unread.
    const int* valid = served->valid.data() + size_t(b.batch) * size_t(gbs);
    r = {0, std::min(*std::max_element(valid, valid + gbs), shape.capacity())};
    // A prefetch before the step is built knows neither its positions nor its prompt copies.
    if (b.step_built != i || b.step.tokens.empty()) return r;
    earliest = *std::min_element(b.step.positions.begin(), b.step.positions.end());
    copies = !b.shared.empty() || !b.step.prefix_copies.empty();
  } else {
    const int t = token(i, u);
    r = {0, t == 0 ? 0 : std::min(b.pmax + t - 1, shape.capacity())};
    earliest = b.pmin + t - 1;
    copies = t == 1 && !b.shared.empty();
  }
  // A sliding-window layer's tokens attend to the rows within the window of the earliest one
  // (AttentionSpec::first_key): rows before that stay home, unread by every later step too.
  if (cfg.window_layer(layer) && cfg.layer_window > 0 && !copies)
    r.begin = std::clamp(earliest - cfg.layer_window + 1, 0, std::max(r.end, 0));
  return r;
}

SlotRange OffloadEngine::Impl::store_range(int i, int u) const {
  const BatchState& b = unit(i, u);
  const int t = token(i, u);
  if (served) {  // what the step writes: its tokens' positions, copied prompt beginnings from 0
    if (b.step.tokens.empty()) return {};
    int begin = *std::min_element(b.step.positions.begin(), b.step.positions.end());
    const int end = *std::max_element(b.step.positions.begin(), b.step.positions.end()) + 1;
    if (!b.shared.empty() || !b.step.prefix_copies.empty()) begin = 0;
    return {std::min(begin, shape.capacity()), std::min(end, shape.capacity())};
  }
  if (t == 0) return {0, std::min(b.pmax, shape.capacity())};
  // Token 1 also copied prompt rows into the followers' slots: they go home too.
  const int begin = t == 1 && !b.shared.empty() ? 0 : b.pmin + t - 1;
  return {std::min(begin, shape.capacity()), std::min(b.pmax + t, shape.capacity())};
}

Ticket OffloadEngine::Impl::load_weights_async(int jj, int part, int parts) {
  Held& h = w_held[size_t(jj)];
  const int j = jj / 2, half = jj % 2;
  if (plan.half_tier(j, half) == Tier::Gpu) return Ticket();
  const Home& home = weight_home[size_t(j)][size_t(half)];
  const size_t bytes = half_bytes(j, half);
  // Parts end on page boundaries (O_DIRECT reads), the last at the end of the half.
  const size_t end = part + 1 >= parts ? bytes : std::min(bytes, align_up(bytes / size_t(parts) * size_t(part + 1), kPage));
  size_t& issued = w_issued[size_t(jj)];
  std::vector<Ticket> deps, pinned_free;
  if (!h.valid) {  // the first part waits for the buffers' last users
    h.valid = true;
    issued = 0;
    h.gpu = w_gpu[half].acquire();
    deps = w_gpu[half].free_after(h.gpu);
    if (home.tier == Tier::Disk) {
      h.pin = w_pin[half].acquire();
      pinned_free = w_pin[half].free_after(h.pin);
    }
  }
  if (issued >= end) return Ticket();
  const char* src = home.ptr + issued;
  if (h.ready.valid()) deps.push_back(h.ready);
  if (home.tier == Tier::Disk) {
    char* pinned = w_pin[half].data(h.pin) + issued;
    deps.push_back(disk_io(false, home.disk_offset + issued, pinned, end - issued, "weights read",
                           std::move(pinned_free)));
    src = pinned;
  }
  h.ready = copy_flat(CopyKind::HostToDevice, w_gpu[half].data(h.gpu) + issued, src, end - issued,
                      half ? "weights (mlp)" : "weights (attention)", std::move(deps));
  issued = end;
  return h.ready;
}

void OffloadEngine::Impl::load_cache_async(int i, int j, int u) {
  Held& h = c_held[size_t(u)][size_t(j)];
  const bool mirror_only = mirrored(token(i, u), j);
  if (h.valid || !(cache_moves(token(i, u), j) || mirror_only)) return;
  const BatchState& b = unit(i, u);
  const Home& home = cache_home[size_t(b.batch)][size_t(j)];
  h.valid = true;
  h.token = i;
  if (!mirror_only) h.gpu = c_gpu.acquire();
  const SlotRange r = load_range(i, u, j);
  char* host = home.ptr;
  std::vector<Ticket> deps = c_stored[size_t(b.batch)][size_t(j)];  // its last writes
  if (home.tier == Tier::Disk) {
    h.pin = c_pin.acquire();
    host = c_pin.data(h.pin);
    if (!r.empty()) {  // else the store reads the pages first, after the slot's last users
      std::vector<Ticket> read_deps = c_pin.free_after(h.pin);
      read_deps.insert(read_deps.end(), deps.begin(), deps.end());
      deps = {disk_cache_io(false, home.disk_offset, host, r, b, std::move(read_deps))};
      h.read = true;
    }
  }
  if (mirror_only) {  // the disk read; none for a batch without sequences
    h.ready = deps.empty() ? Ticket() : deps.front();
    return;
  }
  const std::vector<Ticket>& gpu_free = c_gpu.free_after(h.gpu);
  deps.insert(deps.end(), gpu_free.begin(), gpu_free.end());
  if (r.empty()) h.ready = Ticket();  // nothing to copy: compute() waits for the slot itself
  else h.ready = copy_cache(CopyKind::HostToDevice, c_gpu.data(h.gpu), host, r, b, std::move(deps));
}

void OffloadEngine::Impl::store_cache(int i, int j, int u, const Ticket& computed) {
  Held h = c_held[size_t(u)][size_t(j)];
  if (!h.valid) return;
  c_held[size_t(u)][size_t(j)] = Held();
  const BatchState& b = unit(i, u);
  const Home& home = cache_home[size_t(b.batch)][size_t(j)];
  const SlotRange r = store_range(i, u);
  // The slots' users: the load that filled them (the only one when no sequence computed), the
  // step, and the store below.
  std::vector<Ticket> gpu_after{computed, h.ready}, pinned_after{h.ready};
  if (h.gpu < 0) {  // a pinned mirror the CPU wrote the new entries into: to disk
    if (!b.active.empty() && !r.empty()) {
      Ticket t = disk_cache_io(true, home.disk_offset, c_pin.data(h.pin), r, b, {computed});
      pending.push_back(t);
      c_stored[size_t(b.batch)][size_t(j)] = {t};
      pinned_after.push_back(t);
    }
    release_held(h, c_gpu, c_pin, gpu_after, pinned_after);
    return;
  }
  if (!b.active.empty() && !r.empty()) {
    std::vector<Ticket>& stored = c_stored[size_t(b.batch)][size_t(j)];
    char* host = home.tier == Tier::Disk ? c_pin.data(h.pin) : home.ptr;
    std::vector<Ticket> deps{computed};
    // A prefill group's pages on disk may share a page with its neighbour group's rows, which
    // this pinned slot never held: read them first, after the neighbours' writes and the slot's
    // last users (a served batch whose slots all start over holds nothing either).
    if (home.tier == Tier::Disk && !h.read) {
      std::vector<Ticket> read_deps = c_pin.free_after(h.pin);
      read_deps.insert(read_deps.end(), stored.begin(), stored.end());
      deps.push_back(disk_cache_io(false, home.disk_offset, host, r, b, std::move(read_deps)));
    }
    Ticket t = copy_cache(CopyKind::DeviceToHost, c_gpu.data(h.gpu), host, r, b, std::move(deps));
    gpu_after.push_back(t);
    if (home.tier == Tier::Disk) t = disk_cache_io(true, home.disk_offset, host, r, b, {t});
    pinned_after.push_back(t);
    pending.push_back(t);
    if (token(i, u) > 0) stored.clear();  // a decode load waited for all of them
    stored.push_back(t);
  }
  release_held(h, c_gpu, c_pin, gpu_after, pinned_after);
}

void OffloadEngine::Impl::load_act_async(int i, int jj, int u) {
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
  std::vector<Ticket> deps = a_gpu.free_after(h.gpu);
  deps.push_back(a_stored[size_t(u)]);
  if (home.tier == Tier::Disk) {
    h.pin = a_pin.acquire();
    host = a_pin.data(h.pin) + b.act_offset;
    std::vector<Ticket> read_deps = a_pin.free_after(h.pin);
    read_deps.push_back(a_stored[size_t(u)]);
    deps.back() = disk_io(false, home.disk_offset + b.act_offset, host, bytes, "activations read", std::move(read_deps));
  }
  h.ready = copy_flat(CopyKind::HostToDevice, a_gpu.data(h.gpu), host, bytes, "activations", std::move(deps));
}

void OffloadEngine::Impl::store_act(int i, int jj, int u, const Ticket& computed) {
  Held h = a_held[size_t(u)];
  if (!h.valid) return;
  a_held[size_t(u)] = Held();
  const BatchState& b = unit(i, u);
  const Home& home = act_home[size_t(b.batch)];
  std::vector<Ticket> gpu_after{computed, h.ready}, pinned_after{h.ready};
  if (jj < 2 * L - 1 && !b.active.empty()) {  // the last sub-layer's output is not needed again
    const size_t bytes = act_bytes(i, u);
    std::vector<Ticket> deps{computed};
    char* host = home.ptr;
    if (home.tier == Tier::Disk) {
      if (h.pin < 0) {  // a fresh pinned slot: after its last users
        h.pin = a_pin.acquire();
        const std::vector<Ticket>& free = a_pin.free_after(h.pin);
        deps.insert(deps.end(), free.begin(), free.end());
      }
      host = a_pin.data(h.pin);
    }
    host += b.act_offset;
    Ticket t = copy_flat(CopyKind::DeviceToHost, host, a_gpu.data(h.gpu), bytes, "activations", std::move(deps));
    gpu_after.push_back(t);
    if (home.tier == Tier::Disk)
      t = disk_io(true, home.disk_offset + b.act_offset, host, bytes, "activations write", {t});
    pinned_after.push_back(t);
    pending.push_back(t);
    a_stored[size_t(u)] = t;
    a_stored_layer[size_t(u)] = jj;
    a_stored_token[size_t(u)] = i;
  }
  release_held(h, a_gpu, a_pin, gpu_after, pinned_after);
}

}  // namespace strata
