// Memory of the tiers as the engine uses it: one region reserved up front per tier (device
// memory, pinned host memory), carved by a bump allocator, and fixed pools of equal slots for the
// buffers that tensors pass through (weight double buffers, cache and activation staging).
// Reserving everything before the first step is what lets a policy that does not fit fail before
// any work, and keeps the peak on each tier exactly the reservation.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "strata/offload/lanes.h"

namespace strata {

class Region {
public:
  Region() = default;
  Region(std::string tier, char* base, size_t size) : tier_(std::move(tier)), base_(base), size_(size) {}
  // `bytes` at the next multiple of `align`; an internal error if the plan undercounted.
  char* take(size_t bytes, const char* what, size_t align = 4096);
  size_t used() const { return used_; }
  size_t size() const { return size_; }

private:
  std::string tier_;
  char* base_ = nullptr;
  size_t size_ = 0, used_ = 0;
};

// `count` buffers of `bytes` each; acquire() hands out a free one's index. A slot is released
// with the tickets of its last readers and writers (release_after): whoever writes it next waits
// for them (free_after), on the device or the host, so the host never waits for a slot to drain.
class SlotPool {
public:
  SlotPool() = default;
  SlotPool(std::string name, Region& region, int count, size_t bytes);
  int acquire();
  void release(int slot, std::vector<Ticket> release_after = {});
  // What a new writer of `slot` must wait for: the last users' tickets it was released with.
  const std::vector<Ticket>& free_after(int slot) const { return free_after_[size_t(slot)]; }
  char* data(int slot) const { return slots_[size_t(slot)]; }
  size_t bytes() const { return bytes_; }
  bool empty() const { return slots_.empty(); }
  const std::string& name() const { return name_; }

private:
  std::string name_;
  size_t bytes_ = 0;
  std::vector<char*> slots_;
  std::vector<bool> in_use_;
  std::vector<std::vector<Ticket>> free_after_;
};

}  // namespace strata
