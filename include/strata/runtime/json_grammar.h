// Structured output: an answer held to one JSON object or array, as OpenAI's response_format
// {"type": "json_object"} promises and vLLM's xgrammar backend enforces. A pushdown automaton over
// the answer's bytes says which tokens may come next; the sampler sets every other token's logit
// to -inf before it draws (docs/batch-format.md, "JSON answers").
//
// The grammar is xgrammar's builtin JSON grammar (Grammar.builtin_json_grammar(), the one vLLM
// uses for json_object): the text starts with '{' or '[' and ends at the bracket that closes it;
// whitespace is space, tab, newline and carriage return, between tokens of JSON only; strings
// hold UTF-8 as RFC 3629 writes it except that encoded surrogates (ED A0..BF) pass, as xgrammar
// lets them; numbers and escapes are RFC 8259's.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace strata {

// Containers nest at most this deep; a deeper '{' or '[' is refused.
inline constexpr int kMaxJsonDepth = 128;

// Where a JSON text stands after some bytes. Small and trivially copyable: the mask walks every
// token of the vocabulary from it, one copy per byte. Fields not in use hold zero, so that equal
// positions compare (and hash) equal.
struct JsonState {
  uint64_t objects[2] = {0, 0};  // bit d: the container at depth d is an object (else an array)
  uint8_t depth = 0;             // containers open
  uint8_t mode = 0;              // json_grammar.cpp's Mode
  uint8_t aux = 0;               // a literal's progress, hex digits left, UTF-8 bytes left
  uint8_t lo = 0, hi = 0;        // the range the next UTF-8 continuation byte must fall in
  bool key = false;              // the string being read is an object's key

  bool operator==(const JsonState&) const = default;
};

// Advances `s` by one byte of the text; false when the byte cannot come next (`s` is then
// unspecified).
bool json_step(JsonState& s, uint8_t byte);
// Whether the text so far is a whole JSON object or array (the answer ends there).
bool json_complete(const JsonState& s);

// A tokenizer's vocabulary laid out for masks: its tokens' bytes sorted, with how many leading
// bytes each shares with the one before, so that a walk from a state reads each distinct prefix
// once and skips every token that starts with a refused prefix. Shared by a job's sequences;
// thread-safe.
class JsonVocabulary {
public:
  // token_bytes[id]: the bytes token `id` stands for; "" for special tokens and unused ids, which
  // are never allowed (EOS included: the answer ends at the closing bracket instead).
  explicit JsonVocabulary(std::vector<std::string> token_bytes);

  int64_t size() const { return int64_t(bytes_.size()); }
  // Whether token `id` may follow state `s` (its every byte accepted).
  bool accepts(const JsonState& s, int32_t id) const;
  // The state after token `id`, which accepts() must allow.
  JsonState after(const JsonState& s, int32_t id) const;
  // The tokens that may follow `s`: bit id of the mask (size() bits, 64 to a word). Computed
  // once per distinct state and kept (a JSON answer returns to few states: inside a string at
  // the same depth, between members, ...) up to kCachedMasks of them.
  std::shared_ptr<const std::vector<uint64_t>> allowed(const JsonState& s) const;

  static constexpr size_t kCachedMasks = 1024;

private:
  std::vector<uint64_t> compute_mask(const JsonState& s) const;

  std::vector<std::string> bytes_;  // by id
  std::vector<int32_t> sorted_;     // ids with bytes, by their bytes
  std::vector<uint32_t> shared_;    // shared_[i]: leading bytes sorted_[i] shares with sorted_[i - 1]
  size_t longest_ = 0;

  struct StateHash {
    size_t operator()(const JsonState& s) const;
  };
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<JsonState, std::shared_ptr<const std::vector<uint64_t>>, StateHash> cache_;
};

// One answer's place in the grammar.
class JsonMatcher {
public:
  explicit JsonMatcher(std::shared_ptr<const JsonVocabulary> vocabulary) : vocabulary_(std::move(vocabulary)) {}

  bool accepts(int32_t token) const { return vocabulary_->accepts(state_, token); }
  void advance(int32_t token) { state_ = vocabulary_->after(state_, token); }
  bool complete() const { return json_complete(state_); }
  // Sets to -inf the logits of the tokens that cannot come next (ids past the vocabulary too);
  // returns how many may.
  int64_t mask(float* logits, int64_t vocab) const;

private:
  std::shared_ptr<const JsonVocabulary> vocabulary_;
  JsonState state_;
};

}  // namespace strata
