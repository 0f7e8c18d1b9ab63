// The ids a resumed job has already answered, kept as 128-bit hashes of their keys
// (PromptRecord::id_key): 16 bytes an id, where a hash set of the key strings costs about 100.
#pragma once
#include <compare>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace strata {

class IdSet {
public:
  struct Hash {  // XXH3_128 of an id key
    uint64_t hi = 0, lo = 0;
    auto operator<=>(const Hash&) const = default;
  };
  static Hash hash(std::string_view id_key);

  IdSet() = default;
  explicit IdSet(std::vector<Hash> hashes);  // any order; repeats count once

  bool contains(std::string_view id_key) const { return !empty() && contains(hash(id_key)); }
  bool contains(const Hash& h) const;
  size_t size() const { return hashes_.size(); }
  bool empty() const { return hashes_.empty(); }
  size_t bytes() const { return hashes_.capacity() * sizeof(Hash) + dir_.capacity() * sizeof(uint32_t); }

private:
  // Sorted, unique. A 128-bit hash stands for its key: among 1e9 distinct ids the chance that any
  // two share a hash is about n^2 / 2^129 = 1.5e-21, far below that of a disk's silent bit error.
  std::vector<Hash> hashes_;
  // dir_[b] = the first index whose top `bits_` bits of hi are >= b: the hashes are uniform, so a
  // lookup searches about 16 entries (4 cache lines) instead of log2(n) scattered ones.
  std::vector<uint32_t> dir_;
  int bits_ = 0;
};

}  // namespace strata
