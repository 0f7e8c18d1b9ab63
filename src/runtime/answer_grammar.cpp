#include "strata/runtime/answer_grammar.h"

#include <bit>
#include <cmath>

namespace strata {

SortedVocabulary::SortedVocabulary(std::vector<std::string> token_bytes) : bytes_(std::move(token_bytes)) {
  for (size_t id = 0; id < bytes_.size(); ++id)
    if (!bytes_[id].empty()) sorted_.push_back(int32_t(id));
  std::sort(sorted_.begin(), sorted_.end(),
            [&](int32_t a, int32_t b) { return bytes_[size_t(a)] < bytes_[size_t(b)]; });
  shared_.assign(sorted_.size(), 0);
  for (size_t i = 0; i < sorted_.size(); ++i) {
    const std::string& t = bytes_[size_t(sorted_[i])];
    longest_ = std::max(longest_, t.size());
    if (i == 0) continue;
    const std::string& prev = bytes_[size_t(sorted_[i - 1])];
    const auto diff = std::mismatch(t.begin(), t.end(), prev.begin(), prev.end());
    shared_[i] = uint32_t(diff.first - t.begin());
  }
}

int64_t apply_token_mask(const std::vector<uint64_t>& mask, int64_t known, float* logits, int64_t vocab) {
  known = std::min(known, vocab);
  int64_t kept = 0;
  // A word at a time: inside a string nearly every word allows all its 64 tokens, elsewhere
  // nearly every word allows none.
  for (int64_t base = 0; base < known; base += 64) {
    const int64_t n = std::min<int64_t>(64, known - base);
    const uint64_t word = mask[size_t(base / 64)] & (n == 64 ? ~uint64_t(0) : (uint64_t(1) << n) - 1);
    kept += std::popcount(word);
    if (n == 64 && word == ~uint64_t(0)) continue;
    if (word == 0) {
      std::fill(logits + base, logits + base + n, -INFINITY);
      continue;
    }
    for (int64_t i = 0; i < n; ++i)
      if (!((word >> i) & 1)) logits[base + i] = -INFINITY;
  }
  std::fill(logits + known, logits + std::max(known, vocab), -INFINITY);
  return kept;
}

}  // namespace strata
