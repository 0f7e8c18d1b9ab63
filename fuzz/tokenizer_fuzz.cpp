// libFuzzer entry for tokenizer.json (Tokenizer::from_tokenizer_json_text). A tokenizer that loads
// then encodes a fixed text and the input's own first bytes, and decodes the ids, so the
// pre-tokenizer regexes, added tokens and merges built from the file are exercised too.
// strata::Error is the expected way to reject input; anything else (crash, sanitizer report,
// nlohmann::json::exception escaping, a PCRE2 failure that is not an Error) is a bug.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "strata/core/error.h"
#include "strata/model/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const strata::Tokenizer tok = strata::Tokenizer::from_tokenizer_json_text(text, "fuzz/tokenizer.json");
    for (std::string_view s : {std::string_view("Hello world! <|endoftext|> 12345 h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c  \n\tx's"),
                               std::string_view(text).substr(0, std::min<size_t>(size, 64))}) {
      const std::vector<int32_t> ids = tok.encode(s);
      for (int32_t id : ids)
        if (id < 0 || id >= tok.vocab_size()) __builtin_trap();
      (void)tok.decode(ids, false);
      (void)tok.decode(ids, true);
    }
  } catch (const strata::Error&) {
  }
  return 0;
}
