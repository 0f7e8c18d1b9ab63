// Answers that reason before they answer, split into the answer and its reasoning, with where stop
// strings look and JSON grammars held to the answer alone: GPT-OSS's harmony channels and Qwen3's
// <think> block. docs/batch-format.md, "Reasoning answers".
//
// GPT-OSS's answers in OpenAI's harmony format. After the prompt's "<|start|>assistant" the model
// writes messages: a header (<|channel|>NAME, perhaps " to=RECIPIENT" and <|constrain|>TYPE) up to
// <|message|>, the message's text, then <|end|> (another message follows from <|start|> and its
// role), <|return|> (the answer's end) or <|call|> (a tool call's end). The final channel holds
// what the user is answered; analysis holds the reasoning, commentary tool calls and preambles.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "strata/model/chat_template.h"
#include "strata/model/tokenizer.h"
#include "strata/runtime/answer_grammar.h"

namespace strata {

// An answer split: what the user is answered, and the reasoning before it.
struct ReasonedAnswer {
  std::string content;
  std::string reasoning;
};

struct HarmonyTokens {
  int32_t start = -1, end = -1, message = -1, channel = -1, constrain = -1, return_ = -1, call = -1;
  // The tokenizer's ids of <|start|>, <|end|>, <|message|>, <|channel|>, <|constrain|>, <|return|>
  // and <|call|>; nullopt when it lacks one.
  static std::optional<HarmonyTokens> of(const Tokenizer& tokenizer);
};

// The answer in `generated` split by channel: content the final channel's text, reasoning the
// other channels' (each one message a line). Tokens outside any message (an answer that writes no
// header: neither <|channel|> nor <|message|>) are content, as if final; a header cut short by the
// token limit adds nothing.
ReasonedAnswer split_harmony(const Tokenizer& tokenizer, const HarmonyTokens& h, std::span<const int32_t> generated);

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

// Qwen3's answers: "<think>\nreasoning\n</think>\n\nanswer", its tags added tokens that are not
// special (their text stays in a decoded answer).
struct ThinkTokens {
  int32_t start = -1, end = -1;
  // The chat template's generation prompt ends inside an open <think> (QwQ, the DeepSeek-R1
  // distills, Qwen3-2507 Thinking): every answer starts in its reasoning, and a <think> it writes
  // first anyway is skipped.
  bool opened = false;
  // The tokenizer's <think> and </think>; nullopt when it lacks either.
  static std::optional<ThinkTokens> of(const Tokenizer& tokenizer);
  // How the chat template's answers reason: Qwen3's <think> block, or an interpreted template's
  // where it writes </think>, `opened` where its generation prompt (after one user message) leaves
  // a <think> open. nullopt for the other templates, or a tokenizer without both tags.
  static std::optional<ThinkTokens> of(const ChatTemplate& chat, const Tokenizer& tokenizer);
};

// content: the text after </think>, its leading newlines dropped; reasoning: the text between
// <think> (or the start) and </think>, newlines dropped at both ends (as Qwen3's template writes
// reasoning back). An answer cut inside its reasoning has an empty content; one without the tags
// (enable_thinking false) is all content, unless the prompt `opened` the block: then it is all
// reasoning. Text before <think> is dropped, as vLLM's parser does.
ReasonedAnswer split_think(const Tokenizer& tokenizer, const ThinkTokens& t, std::span<const int32_t> generated);

// Where stop strings look: the index after </think>; 0 for an answer without <think> (and a
// prompt that did not open one); nullopt while the reasoning runs.
std::optional<size_t> think_answer_begin(const ThinkTokens& t, std::span<const int32_t> generated);

// `inner` held to the answer after </think>: the answer either opens with <think> (free text
// until </think>) or is held to `inner` from its first token; where the prompt `opened` the block,
// it is free text until its first </think>.
std::shared_ptr<const AnswerGrammar> think_answer_grammar(std::shared_ptr<const AnswerGrammar> inner,
                                                          const ThinkTokens& t, int64_t vocab_size);

}  // namespace strata
