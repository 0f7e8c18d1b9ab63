// libFuzzer entry for the regex compiler of structured outputs (strata::compile_regex, a request's
// `regex`). The input is split at its first "\n----\n": the pattern before it, and after it bytes
// to feed the compiled rules (none without the separator). A pattern that compiles is held over a
// byte vocabulary: the bytes are stepped through one at a time, each step's mask computed and
// checked against accepts() for a few tokens. strata::RegexError is the expected way to refuse;
// anything else escaping (another exception, a crash, a hang) is a bug.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "strata/runtime/regex_rules.h"

namespace {

const std::shared_ptr<const strata::SortedVocabulary>& byte_vocabulary() {
  static const auto v = [] {
    std::vector<std::string> tokens(258);
    for (int b = 0; b < 256; ++b) tokens[size_t(b)] = std::string(1, char(b));
    tokens[256] = "ab";  // a token of two bytes, and one (257) left empty: the end token
    return std::make_shared<const strata::SortedVocabulary>(std::move(tokens));
  }();
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  constexpr std::string_view kSeparator = "\n----\n";
  const size_t cut = input.find(kSeparator);
  const std::string_view pattern = input.substr(0, cut);
  const std::string_view text = cut == std::string_view::npos ? std::string_view() : input.substr(cut + kSeparator.size());
  std::shared_ptr<const strata::ByteRules> rules;
  try {
    rules = strata::compile_regex(pattern);
  } catch (const strata::RegexError&) {
    return 0;
  }
  const auto grammar = std::make_shared<strata::RuleGrammar>(rules, byte_vocabulary(), std::vector<int32_t>{257});
  strata::RuleState state = grammar->start_state();
  for (size_t i = 0; i < text.size() && i < 64; ++i) {
    const std::vector<uint64_t>& mask = *grammar->allowed(state);
    for (int32_t id : {0, int32_t(uint8_t(text[i])), 256, 257})
      if (grammar->accepts(state, id) != bool((mask[size_t(id) / 64] >> (id % 64)) & 1)) __builtin_trap();
    if (grammar->complete(state) && !grammar->whole(state)) __builtin_trap();
    if (!grammar->step(state, uint8_t(text[i]))) break;
  }
  return 0;
}
