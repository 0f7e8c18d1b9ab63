// libFuzzer entry for GGUF's SentencePiece vocabulary (Tokenizer::from_sentencepiece, what a GGUF
// file's tokenizer.ggml.tokens / scores / token_type become). The first byte's low bit is
// add_space_prefix; then, up to "\n----\n", one token a line: its llama.cpp type as one digit, its
// score as one signed byte, then its text. What follows the separator is text to encode. A
// tokenizer that loads encodes a fixed text and that one, checks every id is in the vocabulary (a
// trap otherwise) and decodes them. strata::Error is the expected way to refuse a vocabulary;
// anything else (crash, sanitizer report, a foreign exception) is a bug.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "strata/core/error.h"
#include "strata/model/tokenizer.h"
#include "tokenizer_exercise.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string_view input(reinterpret_cast<const char*>(data), size);
  strata::SentencePieceVocab vocab;
  vocab.add_space_prefix = (data[0] & 1) != 0;
  input.remove_prefix(1);
  constexpr std::string_view kSeparator = "\n----\n";
  const size_t cut = input.find(kSeparator);
  std::string_view lines = input.substr(0, cut);
  const std::string_view text = cut == std::string_view::npos ? std::string_view() : input.substr(cut + kSeparator.size());
  while (!lines.empty()) {
    const size_t end = lines.find('\n');
    std::string_view line = lines.substr(0, end);
    lines = end == std::string_view::npos ? std::string_view() : lines.substr(end + 1);
    vocab.types.push_back(line.empty() ? 1 : line[0] - '0');
    vocab.scores.push_back(line.size() < 2 ? 0.0f : float(int8_t(line[1])));
    vocab.tokens.emplace_back(line.size() < 2 ? std::string_view() : line.substr(2));
  }
  try {
    const strata::Tokenizer tok = strata::Tokenizer::from_sentencepiece(vocab, "fuzz/sentencepiece");
    exercise_tokenizer(tok, text);
  } catch (const strata::Error&) {
  }
  return 0;
}
