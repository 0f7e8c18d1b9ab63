// What the tokenizer fuzz targets do with a tokenizer that loaded: encode a fixed text and part of
// the input, check every id is inside the vocabulary (a trap otherwise), and decode both ways.
#pragma once
#include <string_view>
#include <vector>

#include "strata/model/tokenizer.h"

inline void exercise_tokenizer(const strata::Tokenizer& tok, std::string_view input_text) {
  const std::string_view fixed = "Hello world! <|endoftext|> 12345 h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c  \n\tx's";
  for (std::string_view s : {fixed, input_text.substr(0, 64)}) {
    const std::vector<int32_t> ids = tok.encode(s);
    for (int32_t id : ids)
      if (id < 0 || id >= tok.vocab_size()) __builtin_trap();
    (void)tok.decode(ids, false);
    (void)tok.decode(ids, true);
  }
}
