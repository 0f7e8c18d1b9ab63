// The tokenizer's private state, shared by tokenizer.cpp (encode/decode) and tokenizer_load.cpp.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "strata/model/tokenizer.h"
#include "tokenizer_regex.h"

namespace strata {

// An added token with the Hugging Face matching options (AddedToken in the public header keeps
// only what callers need).
struct AddedTokenRule {
  AddedToken token;
  bool lstrip = false;       // the match swallows whitespace on its left
  bool rstrip = false;       // ... and on its right
  bool single_word = false;  // only matches when not inside a word
  bool normalized = false;   // matched in HF's second pass (we support no normalizer, so same text)
};

// SentencePiece-style BPE (LLaMA-2, Mistral, TinyLlama): merges over characters, spaces written
// "\u2581", and characters outside the vocab as <0xXX> byte tokens (byte_fallback). Set by the
// loader from a Prepend + Replace normalizer or a Metaspace pre-tokenizer. At namespace scope:
// clang cannot default-construct a nested struct with member initializers in its enclosing class.
struct MetaspaceOptions {
  enum class Prepend : uint8_t { Never, First, Always, EveryPiece };
  Prepend prepend = Prepend::Never;  // EveryPiece: the normalizer's Prepend, after every added token
  bool split = false;                // pre-tokenizer split before each "\u2581"
  // Decoder: Replace + ByteFallback + Fuse + Strip (strip_leading spaces dropped at the start),
  // or the Metaspace decoder, which drops every "\u2581" of the first token and keeps <0xXX>.
  bool metaspace_decoder = false;
  int strip_leading = 0;
};

// Everything the tokenizer knows; Tokenizer::Impl is this under the name the public header uses
// (a namespace-scope struct so the loaders' free helper functions can take it).
struct TokenizerModel {
  // --- model: filled by a loader, then finish() derives the lookup tables ---
  std::vector<std::string> vocab;  // id -> token in GPT-2's byte-to-unicode form; "" for holes
  std::unordered_map<std::string, int> vocab_ids;
  struct Merge {
    int rank;
    int new_id;
  };
  std::unordered_map<uint64_t, Merge> merges;  // key: (left id << 32) | right id
  std::vector<AddedTokenRule> added;
  // Pre-tokenizer: Split steps (HF "Isolated") applied in order to every non-added piece, then
  // HF's ByteLevel step: optional " " prefix on each piece, then optionally the GPT-2 regex.
  std::vector<tok::SplitRegex> splits;
  bool add_prefix_space = false;
  std::unique_ptr<tok::SplitRegex> byte_level_split;  // ByteLevel(use_regex=true)
  bool ignore_merges = false;      // LLaMA-3: a whole word found in the vocab is one token
  int unk_id = -1;                 // model.unk_token; -1 drops bytes missing from the vocab (HF)
  bool fuse_unk = false;
  bool bytes_only = false;         // the bytes_only() stand-in: id = byte value
  std::string source;              // file name (or "parts") for error messages

  // SentencePiece-style BPE: set by the loader (MetaspaceOptions above); tokens stay as written.
  using Metaspace = MetaspaceOptions;
  std::optional<Metaspace> metaspace;
  bool byte_fallback = false;

  // --- derived by finish() ---
  std::array<int, 256> byte_ids{};              // id of each single-byte token, -1 if absent
  std::vector<std::string> id_bytes;            // id -> the raw bytes decode() emits
  std::vector<std::string> id_tokens;           // SentencePiece-style: id -> the token as written
  std::vector<uint8_t> id_special;              // id -> special added token
  std::unordered_map<std::string, int> added_ids;
  std::array<std::vector<int>, 256> added_by_first_byte;  // indices into `added`, longest first
  bool has_normalized_added = false;
  bool has_unnormalized_added = false;

  // Per-word BPE results; words repeat a lot in real text.
  mutable std::shared_mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

  // Registers merge "left right" (byte-to-unicode form); `where` locates it for errors.
  void add_merge(const std::string& left, const std::string& right, int rank, const std::string& where);
  void finish();

  void encode_piece(std::string_view text, std::vector<int32_t>& out) const;
  void bpe_word(std::string_view bytes, std::vector<int32_t>& out) const;
  // SentencePiece-style: `at_start` says the piece begins the input (Prepend::First).
  void encode_metaspace_piece(std::string_view text, bool at_start, std::vector<int32_t>& out) const;
  void bpe_chars(std::string_view word, std::vector<int32_t>& out) const;
  void merge(std::vector<int32_t>& symbols) const;  // applies the merges by rank, in place
  std::string decode_metaspace(const std::vector<int32_t>& ids) const;
};

struct Tokenizer::Impl : TokenizerModel {};

}  // namespace strata
