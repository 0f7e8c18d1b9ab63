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
#include <string>
#include <vector>

#include "strata/runtime/answer_grammar.h"

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

// Answers held to one JSON object or array (response_format json_object) over a tokenizer's
// vocabulary. Shared by a job's sequences; thread-safe. Made with make_shared (its cursors share it).
class JsonVocabulary : public AnswerGrammar, public std::enable_shared_from_this<JsonVocabulary> {
public:
  // token_bytes[id]: as SortedVocabulary's.
  explicit JsonVocabulary(std::vector<std::string> token_bytes)
      : tokens_(std::make_shared<const SortedVocabulary>(std::move(token_bytes))) {}

  int64_t size() const { return tokens_->size(); }
  // The layout, shared with the job's JSON schema grammars.
  const std::shared_ptr<const SortedVocabulary>& tokens() const { return tokens_; }
  // Whether token `id` may follow state `s` (its every byte accepted).
  bool accepts(const JsonState& s, int32_t id) const;
  // The state after token `id`, which accepts() must allow.
  JsonState after(const JsonState& s, int32_t id) const;
  // The tokens that may follow `s` (SortedVocabulary::allowed's mask), computed once per state.
  std::shared_ptr<const std::vector<uint64_t>> allowed(const JsonState& s) const;

  std::unique_ptr<AnswerCursor> start() const override;

private:
  struct StateHash {
    size_t operator()(const JsonState& s) const;
  };
  std::shared_ptr<const SortedVocabulary> tokens_;
  MaskCache<JsonState, StateHash> masks_;
};

// One answer's place in the JSON grammar.
class JsonMatcher : public AnswerCursor {
public:
  explicit JsonMatcher(std::shared_ptr<const JsonVocabulary> vocabulary) : vocabulary_(std::move(vocabulary)) {}

  std::unique_ptr<AnswerCursor> clone() const override { return std::make_unique<JsonMatcher>(*this); }
  bool accepts(int32_t token) const override { return vocabulary_->accepts(state_, token); }
  void advance(int32_t token) override { state_ = vocabulary_->after(state_, token); }
  bool complete() const override { return json_complete(state_); }
  int64_t mask(float* logits, int64_t vocab) const override;

private:
  std::shared_ptr<const JsonVocabulary> vocabulary_;
  JsonState state_;
};

}  // namespace strata
