// Comparing a grammar's token masks with xgrammar's (tests/fixtures/json/: base64 bitmasks, bit
// id % 8 of byte id / 8), for the JSON and the regex/choice answer tests.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "strata/model/tokenizer.h"
#include "test_paths.h"

namespace strata::test {

inline std::string base64_decode(const std::string& text) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
  };
  std::string out;
  int bits = 0, acc = 0;
  for (char c : text) {
    const int v = value(c);
    if (v < 0) continue;  // '=' padding
    acc = (acc << 6) | v, bits += 6;
    if (bits >= 8) out.push_back(char((acc >> (bits -= 8)) & 0xFF));
  }
  return out;
}

// A tokenizer of the fixtures: a tokenizer.json, or a model directory.
inline Tokenizer fixture_tokenizer(const std::string& relative) {
  const std::string path = std::string(STRATA_FIXTURES_DIR) + "/" + relative;
  return relative.ends_with(".json") ? Tokenizer::from_tokenizer_json(path) : Tokenizer::from_dir(path);
}

inline bool mask_bit(const std::vector<uint64_t>& mask, int64_t id) { return (mask[size_t(id) / 64] >> (id % 64)) & 1; }

// The tokens where our mask (`mine`, over `known` ids) and xgrammar's (`want`, its bitmask's bytes
// over `vocab` ids) disagree, the first few named; and those where the token-by-token check
// `accepts` disagrees with the walk over the sorted vocabulary.
template <class Accepts>
int mask_differences(const std::string& want, int64_t vocab, const std::vector<uint64_t>& mine, int64_t known,
                     Accepts accepts, const Tokenizer& tokenizer) {
  REQUIRE(int64_t(want.size()) == (vocab + 7) / 8);
  REQUIRE(known <= vocab);
  int wrong = 0;
  for (int64_t id = 0; id < vocab; ++id) {
    const bool expected = (uint8_t(want[size_t(id / 8)]) >> (id % 8)) & 1;
    const bool ours = id < known && mask_bit(mine, id);
    if (id < known && accepts(int32_t(id)) != ours) ++wrong;
    if (expected == ours) continue;
    if (++wrong <= 5)
      UNSCOPED_INFO("token " << id << " \"" << tokenizer.token_bytes(int32_t(id)) << "\": xgrammar "
                             << (expected ? "allows" : "refuses") << " it");
  }
  return wrong;
}

}  // namespace strata::test
