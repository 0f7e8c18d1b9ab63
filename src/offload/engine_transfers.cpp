// The offloading engine's transfers: weights, KV cache and hidden states between their homes
// (GPU, pinned CPU memory, disk) and the GPU's staging slots, as tickets on the copy and disk lanes.
#include <cstring>
#include <utility>

#include "engine_impl.h"

namespace strata {
namespace {

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

}  // namespace

void OffloadEngine::Impl::start_lanes() {
  disk_ops_left = opt.fault_after;
  const bool threaded = opt.policy.overlap;
  compute_track = trace.track("compute");
  h2d = std::make_unique<Lane>("cpu->gpu", threaded, trace);
  d2h = std::make_unique<Lane>("gpu->cpu", threaded, trace);
  disk_lane = std::make_unique<Lane>("disk", threaded, trace);
  if (disk) disk_at_start = disk->stats();
}

Ticket OffloadEngine::Impl::copy_cache(CopyKind kind, char* gpu_unit, char* host_unit, SlotRange r, const BatchState& b,
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

Ticket OffloadEngine::Impl::disk_cache_io(bool write, size_t disk_offset, char* pinned_unit, SlotRange r,
                                          const BatchState& b, std::vector<Ticket> deps) {
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

Ticket OffloadEngine::Impl::disk_io(bool write, size_t disk_offset, char* pinned, size_t bytes, const char* what,
                                    std::vector<Ticket> deps) {
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

Ticket OffloadEngine::Impl::copy_flat(CopyKind kind, char* dst, const char* src, size_t bytes, const char* what,
                                      std::vector<Ticket> deps) {
  Lane& lane = kind == CopyKind::HostToDevice ? *h2d : *d2h;
  std::atomic<uint64_t>& counter = kind == CopyKind::HostToDevice ? bytes_ctog : bytes_gtoc;
  return lane.submit(
      what, [=, this, &counter] {
        be.copy(kind, dst, src, bytes);
        counter += bytes;
      },
      std::move(deps));
}

SlotRange OffloadEngine::Impl::store_range(int i, int u) const {
  const BatchState& b = unit(i, u);
  const int t = token(i, u);
  if (t == 0) return {0, std::min(b.pmax, shape.capacity())};
  // Token 1 also copied prompt rows into the followers' slots: they go home too.
  const int begin = t == 1 && !b.shared.empty() ? 0 : b.pmin + t - 1;
  return {std::min(begin, shape.capacity()), std::min(b.pmax + t, shape.capacity())};
}

Ticket OffloadEngine::Impl::load_weights_async(int jj, int part, int parts) {
  Held& h = w_held[size_t(jj)];
  const int j = jj / 2, half = jj % 2;
  if (plan.weight_tier[size_t(j)] == Tier::Gpu) return Ticket();
  const Home& home = weight_home[size_t(j)];
  const size_t offset = half ? halves.mlp_offset : 0, bytes = half ? halves.mlp_bytes : halves.attn_bytes;
  // Parts end on page boundaries (O_DIRECT reads), the last at the end of the half.
  const size_t end = part + 1 >= parts ? bytes : std::min(bytes, align_up(bytes / size_t(parts) * size_t(part + 1), kPage));
  size_t& issued = w_issued[size_t(jj)];
  if (!h.valid) {
    h.valid = true;
    issued = 0;
    h.gpu = w_gpu[half].acquire();
    if (home.tier == Tier::Disk) h.pin = w_pin[half].acquire();
  }
  if (issued >= end) return Ticket();
  const char* src = home.ptr + offset + issued;
  std::vector<Ticket> deps;
  if (h.ready.valid()) deps.push_back(h.ready);
  if (home.tier == Tier::Disk) {
    char* pinned = w_pin[half].data(h.pin) + issued;
    deps.push_back(disk_io(false, home.disk_offset + offset + issued, pinned, end - issued, "weights read", {}));
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

void OffloadEngine::Impl::store_cache(int i, int j, int u, std::vector<Ticket>& tickets,
                                      std::vector<std::function<void()>>& after) {
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
  std::vector<Ticket> deps{a_stored[size_t(u)]};
  if (home.tier == Tier::Disk) {
    h.pin = a_pin.acquire();
    host = a_pin.data(h.pin) + b.act_offset;
    deps = {disk_io(false, home.disk_offset + b.act_offset, host, bytes, "activations read", std::move(deps))};
  }
  h.ready = copy_flat(CopyKind::HostToDevice, a_gpu.data(h.gpu), host, bytes, "activations", std::move(deps));
}

void OffloadEngine::Impl::store_act(int i, int jj, int u, std::vector<Ticket>& tickets,
                                    std::vector<std::function<void()>>& after) {
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

}  // namespace strata
