// GPT-OSS's answers in OpenAI's harmony format. After the prompt's "<|start|>assistant" the model
// writes messages: a header (<|channel|>NAME, perhaps " to=RECIPIENT" and <|constrain|>TYPE) up to
// <|message|>, the message's text, then <|end|> (another message follows from <|start|> and its
// role), <|return|> (the answer's end) or <|call|> (a tool call's end). The final channel holds
// what the user is answered; analysis holds the reasoning, commentary tool calls and preambles.
// Here: the answer split into its final text and its reasoning, where stop strings look, and a
// grammar (JSON answers) held to the final channel only. docs/batch-format.md, "GPT-OSS".
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "strata/model/tokenizer.h"
#include "strata/runtime/answer_grammar.h"

namespace strata {

struct HarmonyTokens {
  int32_t start = -1, end = -1, message = -1, channel = -1, constrain = -1, return_ = -1, call = -1;
  // The tokenizer's ids of <|start|>, <|end|>, <|message|>, <|channel|>, <|constrain|>, <|return|>
  // and <|call|>; nullopt when it lacks one.
  static std::optional<HarmonyTokens> of(const Tokenizer& tokenizer);
};

struct HarmonyAnswer {
  std::string content;    // the final channel's text (its messages joined)
  std::string reasoning;  // the other channels' texts, one message a line
};

// The answer in `generated` split by channel. Tokens outside any message (an answer that writes
// no header: neither <|channel|> nor <|message|>) are content, as if final; a header cut short
// by the token limit adds nothing.
HarmonyAnswer split_harmony(const Tokenizer& tokenizer, const HarmonyTokens& h, std::span<const int32_t> generated);

// Where stop strings look: the index of the first token of the final-channel text that the last
// of `generated` belongs to (the text since its <|message|>), or nullopt when the last token is
// not such text (a header, reasoning, a special token).
std::optional<size_t> final_text_begin(const Tokenizer& tokenizer, const HarmonyTokens& h,
                                       std::span<const int32_t> generated);

// `inner` (a JSON object or schema) held to the final channel's text: every token is allowed
// until a final-channel header's <|message|>, then the inner grammar's, the answer ending where
// its document does. `tokens` is the vocabulary's bytes (headers' channel names are read from them).
std::shared_ptr<const AnswerGrammar> harmony_final_grammar(std::shared_ptr<const AnswerGrammar> inner,
                                                           std::shared_ptr<const SortedVocabulary> tokens,
                                                           const HarmonyTokens& h, int64_t vocab_size);

}  // namespace strata
