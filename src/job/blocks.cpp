#include "strata/job/blocks.h"

#include <algorithm>
#include <numeric>

namespace strata {

std::vector<std::vector<size_t>> length_blocks(const std::vector<int>& lengths, size_t block,
                                               const std::vector<int>& sequences) {
  block = std::max<size_t>(block, 1);
  std::vector<size_t> order(lengths.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return lengths[a] < lengths[b]; });
  std::vector<std::vector<size_t>> blocks;
  size_t in_block = 0;  // sequences of the last block
  for (size_t i : order) {
    const size_t seqs = sequences.empty() ? 1 : size_t(std::max(sequences[i], 1));
    if (blocks.empty() || in_block + seqs > block) {
      blocks.emplace_back();
      in_block = 0;
    }
    blocks.back().push_back(i);
    in_block += seqs;
  }
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
