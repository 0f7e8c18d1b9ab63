// Answers held to rules over bytes, a recursive transition network (src/runtime/byte_rules.h),
// which json_schema.h compiles from a JSON schema and regex_rules.h from a regex or a list of
// choices, as xgrammar compiles them. A state is the set of stacks of rule positions the text so
// far can be at; a mask walks the vocabulary from a state as json_grammar.h's does.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "strata/runtime/answer_grammar.h"

namespace strata {

struct ByteRules;

// Where a text stands in the rules: each stack holds rule return positions, then the node the
// text has reached. Sorted and without duplicates, so that equal positions compare equal.
struct RuleState {
  std::vector<std::vector<uint32_t>> stacks;
  bool operator==(const RuleState&) const = default;
};

// Rules over a tokenizer's vocabulary. Made with make_shared (its cursors share it).
//
// How an answer ends: with no `end_tokens` (a JSON document) it ends where the text is whole, the
// root's rule returned; no end token is ever drawn. With end tokens (the model's EOS ids: a regex,
// a choice, where a whole text may go on, as "7" under \d+), they are allowed wherever the text is
// whole, as xgrammar allows its stop tokens, and the answer ends by itself only where the text is
// whole and nothing can follow.
class RuleGrammar : public AnswerGrammar, public std::enable_shared_from_this<RuleGrammar> {
public:
  RuleGrammar(std::shared_ptr<const ByteRules> rules, std::shared_ptr<const SortedVocabulary> tokens,
              std::vector<int32_t> end_tokens = {});

  RuleState start_state() const;
  // Advances by one byte; false when it cannot come next.
  bool step(RuleState& s, uint8_t byte) const;
  // Whether the text is whole (the root's rule has returned).
  bool whole(const RuleState& s) const;
  // Whether the answer ends here by itself: whole, and (with end tokens) nothing can follow.
  bool complete(const RuleState& s) const;
  bool accepts(const RuleState& s, int32_t token) const;
  // The state after `token` (an end token leaves it as it is: the answer ends on it).
  RuleState after(const RuleState& s, int32_t token) const;
  std::shared_ptr<const std::vector<uint64_t>> allowed(const RuleState& s) const;
  int64_t size() const { return tokens_->size(); }

  std::unique_ptr<AnswerCursor> start() const override;

private:
  struct StateHash {
    size_t operator()(const RuleState& s) const;
  };
  bool is_end(int32_t token) const;
  std::shared_ptr<const ByteRules> rules_;
  std::shared_ptr<const SortedVocabulary> tokens_;
  std::vector<int32_t> end_tokens_;
  MaskCache<RuleState, StateHash> masks_;
};

}  // namespace strata
