#include "strata/job/reasoning.h"

#include <algorithm>
#include <limits>
#include <vector>

namespace strata {

std::optional<HarmonyTokens> HarmonyTokens::of(const Tokenizer& tokenizer) {
  HarmonyTokens h;
  for (auto [field, text] : {std::pair{&h.start, "<|start|>"}, {&h.end, "<|end|>"}, {&h.message, "<|message|>"},
                             {&h.channel, "<|channel|>"}, {&h.constrain, "<|constrain|>"},
                             {&h.return_, "<|return|>"}, {&h.call, "<|call|>"}}) {
    const std::optional<int> id = tokenizer.token_id(text);
    if (!id) return std::nullopt;
    *field = *id;
  }
  return h;
}

namespace {

// A header's channel: the text after <|channel|> up to a space ("commentary json", "commentary
// to=functions.f") or the next special token.
class ChannelName {
public:
  void begin() { name_.clear(), reading_ = true; }
  void stop() { reading_ = false; }
  void reset() { name_.clear(), reading_ = false; }  // a new message's header
  void add(const std::string& bytes) {
    if (!reading_) return;
    const size_t space = bytes.find(' ');
    name_.append(bytes, 0, space);
    if (space != std::string::npos) reading_ = false;
  }
  bool final() const { return name_ == "final"; }

private:
  std::string name_;
  bool reading_ = false;
};

bool ends_message(const HarmonyTokens& h, int32_t t) { return t == h.end || t == h.return_ || t == h.call; }

bool has_structure(const HarmonyTokens& h, std::span<const int32_t> generated) {
  for (int32_t t : generated)
    if (t == h.channel || t == h.message) return true;
  return false;
}

}  // namespace

ReasonedAnswer split_harmony(const Tokenizer& tokenizer, const HarmonyTokens& h, std::span<const int32_t> generated) {
  ReasonedAnswer a;
  if (!has_structure(h, generated)) {
    a.content = tokenizer.decode(generated, /*skip_special=*/true);
    return a;
  }
  auto append = [](std::string& to, const std::string& text) {
    if (!to.empty()) to += '\n';
    to += text;
  };
  ChannelName channel;
  bool in_text = false;
  std::vector<int32_t> text;  // the current message's tokens
  auto close = [&] {
    if (in_text) append(channel.final() ? a.content : a.reasoning, tokenizer.decode(text, /*skip_special=*/true));
    in_text = false;
    text.clear();
  };
  for (int32_t t : generated) {
    if (in_text && !tokenizer.is_special(t)) {
      text.push_back(t);
    } else if (t == h.message) {
      close();  // a header inside a message's text: a malformed answer, the text kept so far
      in_text = true;
    } else if (t == h.channel) {
      close();
      channel.begin();
    } else if (t == h.start) {
      close();
      channel.reset();
    } else if (t == h.constrain || ends_message(h, t)) {
      close();
      channel.stop();
    } else if (!tokenizer.is_special(t)) {
      channel.add(tokenizer.token_bytes(t));  // header text: the role, the channel, a recipient
    }
  }
  close();
  return a;
}

std::optional<size_t> final_text_begin(const Tokenizer& tokenizer, const HarmonyTokens& h,
                                       std::span<const int32_t> generated) {
  if (generated.empty() || tokenizer.is_special(generated.back())) return std::nullopt;
  if (!has_structure(h, generated)) return 0;
  size_t k = generated.size();
  while (k > 0 && !tokenizer.is_special(generated[k - 1])) --k;
  if (k == 0 || generated[k - 1] != h.message) return std::nullopt;
  // The header before that <|message|>: back to the message boundary before it.
  size_t head = k - 1;
  while (head > 0 && generated[head - 1] != h.start && !ends_message(h, generated[head - 1])) --head;
  ChannelName channel;
  for (size_t i = head; i + 1 < k; ++i) {
    const int32_t t = generated[i];
    if (t == h.channel) channel.begin();
    else if (tokenizer.is_special(t)) channel.stop();
    else channel.add(tokenizer.token_bytes(t));
  }
  return channel.final() ? std::optional<size_t>(k) : std::nullopt;
}

namespace {

class HarmonyFinalGrammar;

class HarmonyFinalCursor : public AnswerCursor {
public:
  explicit HarmonyFinalCursor(std::shared_ptr<const HarmonyFinalGrammar> g) : g_(std::move(g)) {}
  HarmonyFinalCursor(const HarmonyFinalCursor& o)
      : g_(o.g_), channel_(o.channel_), in_header_(o.in_header_), inner_(o.inner_ ? o.inner_->clone() : nullptr) {}

  std::unique_ptr<AnswerCursor> clone() const override { return std::make_unique<HarmonyFinalCursor>(*this); }
  bool accepts(int32_t token) const override;
  void advance(int32_t token) override;
  bool complete() const override { return inner_ && inner_->complete(); }
  int64_t mask(float* logits, int64_t vocab) const override;

private:
  std::shared_ptr<const HarmonyFinalGrammar> g_;
  ChannelName channel_;
  bool in_header_ = true;  // the prompt ends with "<|start|>assistant": a header comes first
  std::unique_ptr<AnswerCursor> inner_;  // from the final channel's <|message|> on
};

class HarmonyFinalGrammar : public AnswerGrammar, public std::enable_shared_from_this<HarmonyFinalGrammar> {
public:
  HarmonyFinalGrammar(std::shared_ptr<const AnswerGrammar> inner, std::shared_ptr<const SortedVocabulary> tokens,
                      const HarmonyTokens& h, int64_t vocab_size)
      : inner(std::move(inner)), tokens(std::move(tokens)), h(h), vocab_size(vocab_size) {}
  std::unique_ptr<AnswerCursor> start() const override {
    return std::make_unique<HarmonyFinalCursor>(shared_from_this());
  }

  const std::shared_ptr<const AnswerGrammar> inner;
  const std::shared_ptr<const SortedVocabulary> tokens;
  const HarmonyTokens h;
  const int64_t vocab_size;
};

bool HarmonyFinalCursor::accepts(int32_t token) const {
  if (inner_) return inner_->accepts(token);
  return token >= 0 && token < g_->vocab_size;
}

void HarmonyFinalCursor::advance(int32_t token) {
  if (inner_) return inner_->advance(token);
  const HarmonyTokens& h = g_->h;
  if (token == h.channel) {
    in_header_ = true;
    channel_.begin();
  } else if (token == h.message) {
    if (in_header_ && channel_.final()) inner_ = g_->inner->start();
    in_header_ = false;
    channel_.stop();
  } else if (token == h.start) {
    in_header_ = true;
    channel_.reset();
  } else if (token == h.constrain || ends_message(h, token)) {
    channel_.stop();
  } else if (in_header_ && g_->tokens->known(token)) {
    channel_.add(g_->tokens->bytes(token));
  }
}

int64_t HarmonyFinalCursor::mask(float* logits, int64_t vocab) const {
  if (inner_) return inner_->mask(logits, vocab);
  const int64_t known = std::min(vocab, g_->vocab_size);
  for (int64_t i = known; i < vocab; ++i) logits[i] = -std::numeric_limits<float>::infinity();
  return known;
}

}  // namespace

std::shared_ptr<const AnswerGrammar> harmony_final_grammar(std::shared_ptr<const AnswerGrammar> inner,
                                                           std::shared_ptr<const SortedVocabulary> tokens,
                                                           const HarmonyTokens& h, int64_t vocab_size) {
  return std::make_shared<const HarmonyFinalGrammar>(std::move(inner), std::move(tokens), h, vocab_size);
}

}  // namespace strata
