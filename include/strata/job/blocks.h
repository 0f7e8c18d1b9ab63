// Length-aware blocks (docs/batch-format.md "Length-aware blocks"): the prompts of a window,
// sorted by length and cut into blocks, so that a block pads little. FlexGen cuts blocks in
// input order and pads every prompt to the block's longest.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace strata {

// Indices into `lengths`, sorted by length (ties keep input order) and cut into blocks of at most
// `block` indices; shortest blocks first, so the first answers come soon. With `sequences` (the
// engine sequences of each index: a request's n choices), a block holds at most `block` sequences
// instead, and a request's choices never split (one larger than `block` gets a block of its own).
std::vector<std::vector<size_t>> length_blocks(const std::vector<int>& lengths, size_t block,
                                               const std::vector<int>& sequences = {});

// Padding efficiency: useful prompt tokens / tokens of the padded block (rows x longest prompt).
struct Padding {
  int64_t useful = 0, computed = 0;
  void add_block(const std::vector<int>& lengths, const std::vector<size_t>& block);
  void add(const Padding& p) { useful += p.useful, computed += p.computed; }
  double efficiency() const { return computed > 0 ? double(useful) / double(computed) : 1.0; }
};

// The padding of the same prompts cut into blocks in input order, for comparison.
Padding input_order_padding(const std::vector<int>& lengths, size_t block);

}  // namespace strata
