// Qwen3's <think> block (job/reasoning.h).
#include <algorithm>
#include <cmath>
#include <limits>

#include "strata/job/reasoning.h"

namespace strata {

std::optional<ThinkTokens> ThinkTokens::of(const Tokenizer& tokenizer) {
  const std::optional<int> start = tokenizer.token_id("<think>"), end = tokenizer.token_id("</think>");
  if (!start || !end) return std::nullopt;
  return ThinkTokens{*start, *end};
}

std::optional<ThinkTokens> ThinkTokens::of(const ChatTemplate& chat, const Tokenizer& tokenizer) {
  if (chat.format() == ChatFormat::Qwen3) return of(tokenizer);
  if (chat.format() != ChatFormat::Jinja || chat.source().find("</think>") == std::string::npos) return std::nullopt;
  std::optional<ThinkTokens> t = of(tokenizer);
  if (!t) return t;
  try {
    const std::string prompt = chat.render({{"user", "Hi"}});
    const size_t open = prompt.rfind("<think>"), close = prompt.rfind("</think>");
    t->opened = open != std::string::npos && (close == std::string::npos || close < open);
  } catch (const ChatTemplateError&) {  // it wants another conversation: answers may still open one
  }
  return t;
}

namespace {

std::string strip_newlines(std::string s, bool left, bool right) {
  if (right) s.erase(s.find_last_not_of('\n') + 1);  // npos + 1 == 0: all newlines
  if (left) s.erase(0, std::min(s.find_first_not_of('\n'), s.size()));
  return s;
}

size_t find(std::span<const int32_t> tokens, int32_t id, size_t from = 0) {
  for (size_t i = from; i < tokens.size(); ++i)
    if (tokens[i] == id) return i;
  return tokens.size();
}

}  // namespace

namespace {

// Where the answer's <think> is: the first one, or where the prompt opened the block only a
// leading one (n: none).
size_t think_open(const ThinkTokens& t, std::span<const int32_t> generated) {
  if (!t.opened) return find(generated, t.start);
  return !generated.empty() && generated[0] == t.start ? 0 : generated.size();
}

}  // namespace

ReasonedAnswer split_think(const Tokenizer& tokenizer, const ThinkTokens& t, std::span<const int32_t> generated) {
  const size_t n = generated.size(), open = think_open(t, generated);
  const size_t close = find(generated, t.end, open == n ? 0 : open + 1);
  if (open == n && close == n && !t.opened) return {tokenizer.decode(generated, /*skip_special=*/true), {}};
  const size_t from = open == n ? 0 : open + 1;
  auto text = [&](size_t begin, size_t end) { return tokenizer.decode(generated.subspan(begin, end - begin), true); };
  ReasonedAnswer a;
  a.reasoning = strip_newlines(text(from, close), true, true);
  if (close < n) a.content = strip_newlines(text(close + 1, n), true, false);
  return a;
}

std::optional<size_t> think_answer_begin(const ThinkTokens& t, std::span<const int32_t> generated) {
  const size_t open = think_open(t, generated);
  const size_t close = find(generated, t.end, open == generated.size() ? 0 : open + 1);
  if (close < generated.size()) return close + 1;
  if (open < generated.size() || t.opened) return std::nullopt;
  return 0;
}

namespace {

class ThinkAnswerGrammar;

// Before the first token, after <think> (free until </think>), or in the answer (held to inner).
class ThinkAnswerCursor : public AnswerCursor {
public:
  ThinkAnswerCursor(std::shared_ptr<const ThinkAnswerGrammar> g, std::unique_ptr<AnswerCursor> inner, bool opened)
      : g_(std::move(g)), thinking_(opened), inner_(std::move(inner)) {}
  ThinkAnswerCursor(const ThinkAnswerCursor& o)
      : g_(o.g_), first_(o.first_), thinking_(o.thinking_), inner_(o.inner_->clone()) {}

  std::unique_ptr<AnswerCursor> clone() const override { return std::make_unique<ThinkAnswerCursor>(*this); }
  bool accepts(int32_t token) const override;
  void advance(int32_t token) override;
  bool complete() const override { return !thinking_ && inner_->complete(); }
  int64_t mask(float* logits, int64_t vocab) const override;

private:
  std::shared_ptr<const ThinkAnswerGrammar> g_;
  bool first_ = true, thinking_ = false;
  std::unique_ptr<AnswerCursor> inner_;  // at its start until the answer begins
};

class ThinkAnswerGrammar : public AnswerGrammar, public std::enable_shared_from_this<ThinkAnswerGrammar> {
public:
  ThinkAnswerGrammar(std::shared_ptr<const AnswerGrammar> inner, const ThinkTokens& t, int64_t vocab_size)
      : inner(std::move(inner)), t(t), vocab_size(vocab_size) {}
  std::unique_ptr<AnswerCursor> start() const override {
    return std::make_unique<ThinkAnswerCursor>(shared_from_this(), inner->start(), t.opened);
  }

  const std::shared_ptr<const AnswerGrammar> inner;
  const ThinkTokens t;
  const int64_t vocab_size;
};

bool ThinkAnswerCursor::accepts(int32_t token) const {
  if (thinking_) return token >= 0 && token < g_->vocab_size;
  return (first_ && token == g_->t.start) || inner_->accepts(token);
}

void ThinkAnswerCursor::advance(int32_t token) {
  const bool first = first_;
  first_ = false;
  if (thinking_) {
    if (token == g_->t.end) thinking_ = false;  // the answer, held to inner from its start, follows
  } else if (first && token == g_->t.start) {
    thinking_ = true;
  } else {
    inner_->advance(token);
  }
}

int64_t ThinkAnswerCursor::mask(float* logits, int64_t vocab) const {
  if (thinking_) {
    const int64_t known = std::min(vocab, g_->vocab_size);
    for (int64_t i = known; i < vocab; ++i) logits[i] = -std::numeric_limits<float>::infinity();
    return known;
  }
  const int32_t open = g_->t.start;
  const bool keep_open = first_ && open >= 0 && open < vocab;
  const float open_logit = keep_open ? logits[open] : 0.0f;
  int64_t allowed = inner_->mask(logits, vocab);
  if (keep_open && std::isfinite(open_logit) && !std::isfinite(logits[open])) {  // the grammar refuses <think>: it may still open
    logits[open] = open_logit;
    ++allowed;
  }
  return allowed;
}

}  // namespace

std::shared_ptr<const AnswerGrammar> think_answer_grammar(std::shared_ptr<const AnswerGrammar> inner,
                                                          const ThinkTokens& t, int64_t vocab_size) {
  return std::make_shared<const ThinkAnswerGrammar>(std::move(inner), t, vocab_size);
}

}  // namespace strata
