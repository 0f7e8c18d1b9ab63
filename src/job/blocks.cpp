#include "strata/job/blocks.h"

#include <algorithm>
#include <numeric>

namespace strata {

std::vector<std::vector<size_t>> length_blocks(const std::vector<int>& lengths, size_t block) {
  block = std::max<size_t>(block, 1);
  std::vector<size_t> order(lengths.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return lengths[a] < lengths[b]; });
  std::vector<std::vector<size_t>> blocks;
  for (size_t i = 0; i < order.size(); i += block)
    blocks.emplace_back(order.begin() + std::ptrdiff_t(i), order.begin() + std::ptrdiff_t(std::min(order.size(), i + block)));
  return blocks;
}

void Padding::add_block(const std::vector<int>& lengths, const std::vector<size_t>& block) {
  int longest = 0;
  for (size_t i : block) {
    useful += lengths[i];
    longest = std::max(longest, lengths[i]);
  }
  computed += int64_t(block.size()) * longest;
}

Padding input_order_padding(const std::vector<int>& lengths, size_t block) {
  block = std::max<size_t>(block, 1);
  Padding p;
  std::vector<size_t> b;
  for (size_t i = 0; i < lengths.size(); i += block) {
    b.clear();
    for (size_t k = i; k < std::min(lengths.size(), i + block); ++k) b.push_back(k);
    p.add_block(lengths, b);
  }
  return p;
}

}  // namespace strata
