// libFuzzer entry for GPT-2's tokenizer files, vocab.json + merges.txt
// (Tokenizer::from_vocab_merges_text, what from_vocab_merges runs on the two files' text). The
// input is split at its first "\n----\n": vocab.json before it, merges.txt after it (none: all of it
// is vocab.json and merges.txt is empty). A tokenizer that loads then encodes a fixed text and the
// merges' first bytes, and decodes the ids; an id outside the vocabulary traps. strata::Error is
// the expected way to reject input; anything else (crash, sanitizer report, a foreign exception)
// is a bug.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "strata/core/error.h"
#include "strata/model/tokenizer.h"
#include "tokenizer_exercise.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  constexpr std::string_view kSeparator = "\n----\n";
  const size_t cut = input.find(kSeparator);
  const std::string vocab(input.substr(0, cut));
  const std::string merges(cut == std::string_view::npos ? std::string_view() : input.substr(cut + kSeparator.size()));
  try {
    const strata::Tokenizer tok =
        strata::Tokenizer::from_vocab_merges_text(vocab, merges, "fuzz/vocab.json", "fuzz/merges.txt");
    exercise_tokenizer(tok, merges);
  } catch (const strata::Error&) {
  }
  return 0;
}
