// BPE tokenizer, loaded from a Hugging Face tokenizer.json or from vocab.json + merges.txt:
// byte-level (GPT-2, OPT, LLaMA-3, Qwen2 families) or SentencePiece-style (LLaMA-2, Mistral,
// TinyLlama: "\u2581" for spaces, BPE over characters, <0xXX> byte fallback). encode() gives
// exactly what Hugging Face's tokenizer.encode(text, add_special_tokens=False) gives: added/special
// tokens that appear in the text are matched first, the rest is split by the pre-tokenizer regex
// (PCRE2) and merged by rank. decode() is Hugging Face's decode, the SentencePiece decoders'
// dropped leading space included. GGUF's SentencePiece vocabulary ('llama': scores, no merges)
// encodes as llama.cpp does, merging by score (from_sentencepiece).
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace strata {

// Byte-level pre-tokenizers by name: GPT-2's regex; LLaMA-3's; Qwen2's (LLaMA-3's with one digit a
// piece); SmolLM's (each digit split off, then GPT-2's regex); gpt-4o's (o200k, GPT-OSS's: words
// cut at case changes).
enum class PreTokenizer : uint8_t { GPT2, Llama3, Qwen2, SmolLM, Gpt4o };

struct AddedToken {
  int id = 0;
  std::string content;
  bool special = false;
  bool rstrip = false;  // the match swallows the whitespace after it (HF's rstrip, llama.cpp's RSTRIP)
};

// A SentencePiece vocabulary as GGUF stores it (tokenizer.ggml.model "llama", as llama.cpp's
// converter writes LLaMA-2, Mistral and TinyLlama): no merges, a score per token instead.
struct SentencePieceVocab {
  std::vector<std::string> tokens;  // id order, spaces written "\u2581", bytes as "<0xXX>"
  std::vector<float> scores;        // empty: all 0
  std::vector<int> types;           // llama.cpp's token types (1 normal .. 6 byte); empty: all normal
  bool add_space_prefix = true;     // tokenizer.ggml.add_space_prefix
  std::vector<int> rstrip_ids;      // matched tokens that swallow the whitespace after them
};

class Tokenizer {
public:
  // From a directory holding tokenizer.json, or vocab.json + merges.txt (GPT-2 pattern).
  static Tokenizer from_dir(const std::filesystem::path& dir);
  static Tokenizer from_tokenizer_json(const std::filesystem::path& file);
  // The same from the file's text in memory (the fuzz target); `source` names it in errors.
  static Tokenizer from_tokenizer_json_text(const std::string& text, const std::string& source);
  static Tokenizer from_vocab_merges(const std::filesystem::path& vocab_json, const std::filesystem::path& merges_txt);
  // The same from the two files' text in memory (the fuzz target); the sources name them in errors.
  static Tokenizer from_vocab_merges_text(const std::string& vocab_json, const std::string& merges_txt,
                                          const std::string& vocab_source, const std::string& merges_source);
  // From parts already in memory (used by GGUF metadata): tokens in id order, merges "a b".
  // ignore_merges: a pre-tokenized word that is itself in the vocab becomes that one token
  // without merging (Hugging Face's BPE option; true in Meta's LLaMA-3 tokenizer.json).
  static Tokenizer from_parts(std::vector<std::string> tokens, const std::vector<std::string>& merges,
                              std::vector<AddedToken> added, PreTokenizer pre, bool ignore_merges = false);
  // From GGUF's SentencePiece vocabulary. encode() is llama.cpp's (parse_special on): control,
  // unknown and user-defined tokens matched in the text, a "\u2581" before each other piece,
  // then the pair whose merged token scores highest merged first (leftmost on ties), characters
  // outside the vocabulary as <0xXX>. decode() is what transformers' GGUF conversion decodes.
  // `source` names the file in errors.
  static Tokenizer from_sentencepiece(SentencePieceVocab vocab, const std::string& source);
  // A stand-in for models without a tokenizer (dummy weights): one token per byte, id = byte.
  static Tokenizer bytes_only();

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  std::vector<int32_t> encode(std::string_view text) const;
  // Concatenates the tokens' bytes, then decodes UTF-8; invalid or incomplete sequences become
  // U+FFFD as in Hugging Face. skip_special drops special added tokens.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // One token's bytes as they are, not UTF-8 checked (a token may hold part of a character);
  // empty for an unknown id.
  std::string token_bytes(int32_t id) const;

  int vocab_size() const;                              // largest id + 1
  std::optional<int> token_id(std::string_view token) const;  // exact token string lookup
  bool is_special(int id) const;

private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
