#include "strata/offload/tiers.h"

#include "strata/core/error.h"

namespace strata {

char* Region::take(size_t bytes, const char* what, size_t align) {
  const size_t start = (used_ + align - 1) / align * align;
  STRATA_CHECK(start + bytes <= size_,
               "internal: the " << tier_ << " region of " << size_ << " bytes cannot hold " << what << " (" << bytes
                                << " bytes at " << start << "); the placement plan undercounted");
  used_ = start + bytes;
  return base_ + start;
}

SlotPool::SlotPool(std::string name, Region& region, int count, size_t bytes) : name_(std::move(name)), bytes_(bytes) {
  for (int i = 0; i < count; ++i) {
    slots_.push_back(region.take(bytes, name_.c_str()));
    in_use_.push_back(false);
  }
  free_after_.resize(slots_.size());
}

int SlotPool::acquire() {
  for (size_t i = 0; i < slots_.size(); ++i)
    if (!in_use_[i]) {
      in_use_[i] = true;
      return int(i);
    }
  STRATA_FAIL("internal: no free " << name_ << " slot (all " << slots_.size() << " in use)");
}

void SlotPool::release(int slot, std::vector<Ticket> release_after) {
  STRATA_CHECK(slot >= 0 && size_t(slot) < slots_.size() && in_use_[size_t(slot)],
               "internal: releasing " << name_ << " slot " << slot << " that is not in use");
  in_use_[size_t(slot)] = false;
  free_after_[size_t(slot)] = std::move(release_after);
}

}  // namespace strata
