#include "strata/job/id_set.h"

#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <limits>

namespace strata {

IdSet::Hash IdSet::hash(std::string_view id_key) {
  const XXH128_hash_t h = XXH3_128bits(id_key.data(), id_key.size());
  return {h.high64, h.low64};
}

IdSet::IdSet(std::vector<Hash> hashes) : hashes_(std::move(hashes)) {
  std::sort(hashes_.begin(), hashes_.end());
  hashes_.erase(std::unique(hashes_.begin(), hashes_.end()), hashes_.end());
  // Growth by doubling may have left up to half the vector unused: give it back.
  if (hashes_.capacity() - hashes_.size() > hashes_.size() / 8) hashes_.shrink_to_fit();
  const size_t n = hashes_.size();
  if (n < 64 || n > std::numeric_limits<uint32_t>::max()) return;  // a plain binary search
  bits_ = std::bit_width(n / 16) - 1;  // about 16 hashes a bucket, 0.25 bytes an id
  dir_.resize((size_t(1) << bits_) + 1);
  size_t i = 0;
  for (size_t b = 0; b < dir_.size(); ++b) {
    while (i < n && (hashes_[i].hi >> (64 - bits_)) < b) ++i;
    dir_[b] = uint32_t(i);
  }
}

bool IdSet::contains(const Hash& h) const {
  auto first = hashes_.begin(), last = hashes_.end();
  if (bits_ > 0) {
    const size_t b = size_t(h.hi >> (64 - bits_));
    first = hashes_.begin() + dir_[b];
    last = hashes_.begin() + dir_[b + 1];
  }
  const auto it = std::lower_bound(first, last, h);
  return it != last && *it == h;
}

}  // namespace strata
