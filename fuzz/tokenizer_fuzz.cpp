// libFuzzer entry for tokenizer.json (Tokenizer::from_tokenizer_json_text). A tokenizer that loads
// then encodes a fixed text and the input's own first bytes, and decodes the ids, so the
// pre-tokenizer regexes, added tokens and merges built from the file are exercised too.
// strata::Error is the expected way to reject input; anything else (crash, sanitizer report,
// nlohmann::json::exception escaping, a PCRE2 failure that is not an Error) is a bug.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "strata/core/error.h"
#include "strata/model/tokenizer.h"
#include "tokenizer_exercise.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const strata::Tokenizer tok = strata::Tokenizer::from_tokenizer_json_text(text, "fuzz/tokenizer.json");
    exercise_tokenizer(tok, text);
  } catch (const strata::Error&) {
  }
  return 0;
}
