#include "strata/runtime/rule_grammar.h"

#include <algorithm>

#include "byte_rules.h"
#include "strata/core/error.h"

namespace strata {

RuleGrammar::RuleGrammar(std::shared_ptr<const ByteRules> rules, std::shared_ptr<const SortedVocabulary> tokens,
                         std::vector<int32_t> end_tokens)
    : rules_(std::move(rules)), tokens_(std::move(tokens)), end_tokens_(std::move(end_tokens)) {}

RuleState RuleGrammar::start_state() const { return {{{rules_->starts[rules_->root]}}}; }

bool RuleGrammar::step(RuleState& s, uint8_t b) const {
  // One stack at a node that only reads (inside a string, in a number's digits), as most bytes
  // find it: the byte moves its top, with no closure to take and nothing to allocate.
  if (s.stacks.size() == 1) {
    const RuleNode& n = rules_->nodes[s.stacks[0].back()];
    if (n.reads && !n.moves && !n.end) {
      int matches = 0;
      uint32_t target = 0;
      for (const RuleEdge& e : n.edges)
        if (e.lo <= b && b <= e.hi) ++matches, target = e.target;
      if (matches <= 1) {
        if (matches == 0) s.stacks.clear();
        else s.stacks[0].back() = target;
        return matches == 1;
      }
    }
  }
  std::vector<std::vector<uint32_t>> next;
  for (const std::vector<uint32_t>& stack : s.stacks)
    close_stack(*rules_, stack, [&](const std::vector<uint32_t>& at) {
      for (const RuleEdge& e : rules_->nodes[at.back()].edges)
        if (e.kind == RuleEdge::Bytes && e.lo <= b && b <= e.hi) {
          next.push_back(at);
          next.back().back() = e.target;
        }
    });
  std::sort(next.begin(), next.end());
  next.erase(std::unique(next.begin(), next.end()), next.end());
  s.stacks = std::move(next);
  return !s.stacks.empty();
}

bool RuleGrammar::whole(const RuleState& s) const {
  bool whole = false;
  for (const std::vector<uint32_t>& stack : s.stacks) whole |= close_stack(*rules_, stack, [](const auto&) {});
  return whole;
}

bool RuleGrammar::complete(const RuleState& s) const {
  // One closure per stack tells both whether the text is whole and whether a byte may follow.
  bool whole = false, reads = false;
  for (const std::vector<uint32_t>& stack : s.stacks)
    whole |= close_stack(*rules_, stack, [&](const auto&) { reads = true; });
  return whole && (end_tokens_.empty() || !reads);
}

bool RuleGrammar::is_end(int32_t token) const {
  return std::find(end_tokens_.begin(), end_tokens_.end(), token) != end_tokens_.end();
}

bool RuleGrammar::accepts(const RuleState& s, int32_t token) const {
  if (is_end(token)) return whole(s);
  RuleState t = s;
  return tokens_->read(t, token, [this](RuleState& u, uint8_t b) { return step(u, b); });
}

RuleState RuleGrammar::after(const RuleState& s, int32_t token) const {
  if (is_end(token)) {
    STRATA_CHECK(whole(s), "structured answer: the end token " << token << " before the text is whole");
    return s;
  }
  RuleState t = s;
  STRATA_CHECK(tokens_->read(t, token, [this](RuleState& u, uint8_t b) { return step(u, b); }),
               "structured answer: token " << token << " cannot come next");
  return t;
}

size_t RuleGrammar::StateHash::operator()(const RuleState& s) const {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const std::vector<uint32_t>& stack : s.stacks) {
    for (uint32_t v : stack) h = (h ^ v) * 0x100000001B3ull;
    h = (h ^ 0xFFFFFFFFull) * 0x100000001B3ull;
  }
  return size_t(h);
}

std::shared_ptr<const std::vector<uint64_t>> RuleGrammar::allowed(const RuleState& s) const {
  return masks_.get(s, [&] {
    std::vector<uint64_t> mask = tokens_->allowed(s, [this](RuleState& t, uint8_t b) { return step(t, b); });
    if (!end_tokens_.empty() && whole(s))
      for (int32_t id : end_tokens_)
        if (id >= 0 && id < size()) mask[size_t(id) / 64] |= uint64_t(1) << (id % 64);
    return mask;
  });
}

namespace {

class RuleCursor : public AnswerCursor {
public:
  explicit RuleCursor(std::shared_ptr<const RuleGrammar> grammar)
      : grammar_(std::move(grammar)), state_(grammar_->start_state()) {}
  std::unique_ptr<AnswerCursor> clone() const override { return std::make_unique<RuleCursor>(*this); }
  bool accepts(int32_t token) const override { return grammar_->accepts(state_, token); }
  void advance(int32_t token) override { state_ = grammar_->after(state_, token); }
  bool complete() const override { return grammar_->complete(state_); }
  int64_t mask(float* logits, int64_t vocab) const override {
    return apply_token_mask(*grammar_->allowed(state_), grammar_->size(), logits, vocab);
  }

private:
  std::shared_ptr<const RuleGrammar> grammar_;
  RuleState state_;
};

}  // namespace

std::unique_ptr<AnswerCursor> RuleGrammar::start() const { return std::make_unique<RuleCursor>(shared_from_this()); }

}  // namespace strata
