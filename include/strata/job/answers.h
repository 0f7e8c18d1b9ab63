// From a prompt record to generation requests, and from generation results to its output line:
// stop strings (matched while generating, cut from the text), n choices, logprobs. The formats
// are docs/batch-format.md's.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "strata/job/reasoning.h"
#include "strata/job/tool_calls.h"
#include "strata/job/prompts.h"
#include "strata/model/tokenizer.h"
#include "strata/runtime/json_grammar.h"
#include "strata/runtime/sequence.h"

namespace strata {

// The grammars of a job's JSON schemas, regexes and choices, one per distinct text (a job's lines
// usually share one), so that each state's mask is computed once for the job; thread-safe.
class SchemaGrammars {
public:
  explicit SchemaGrammars(std::shared_ptr<const SortedVocabulary> tokens) : tokens_(std::move(tokens)) {}
  // The grammar of PromptRecord::json_schema's text (checked when the record was read).
  std::shared_ptr<const AnswerGrammar> get(const std::string& schema);
  // The grammar of PromptRecord::pattern for a Regex or Choice record, whose answers may end with
  // one of `end_ids` (the model's EOS ids) wherever their text is whole (rule_grammar.h).
  std::shared_ptr<const AnswerGrammar> get_pattern(ResponseFormat kind, const std::string& pattern,
                                                   const std::vector<int32_t>& end_ids);

private:
  std::shared_ptr<const SortedVocabulary> tokens_;
  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<const AnswerGrammar>> grammars_;
};

struct AnswerSettings {
  const Tokenizer* tokenizer = nullptr;   // must outlive the requests made with these settings
  std::vector<std::string> default_stop;  // --stop: for records that give no "stop"
  std::string model_name;                 // OpenAI "model" when the body names none
  int64_t created = 0;                    // OpenAI "created" (Unix seconds)
  // --response-format / --json-schema / --regex / --choice: for records that give no format.
  ResponseFormat default_response_format = ResponseFormat::Text;
  std::string default_json_schema;
  std::string default_pattern;  // --regex / --choice (PromptRecord::pattern's form)
  // The tokenizer's vocabulary for JSON answers (json_vocabulary below), and the job's schemas'
  // grammars over it.
  std::shared_ptr<const JsonVocabulary> json_vocabulary;
  std::shared_ptr<SchemaGrammars> schema_grammars;
  // The model's EOS ids: an answer held to a regex or a choice may end with one where its text is
  // whole (a JSON document ends where it closes, without one).
  std::vector<int32_t> end_ids;
  // Set when the chat template is GPT-OSS's: chat records' answers are harmony (job/reasoning.h),
  // split into the final text and the reasoning, stop strings and JSON held to the final text.
  std::optional<HarmonyTokens> harmony;
  // Set when the chat template reasons in <think> blocks (ThinkTokens::of: Qwen3's, an interpreted
  // one that writes </think>): chat records' answers split at their </think>, unless the
  // record's prompt closed the think block (enable_thinking false, the record's or, where it gives
  // none, --no-thinking's): that answer is all content and a JSON grammar holds it from its first
  // token, as vLLM's reasoning parser and guided decoding do once the prompt ends the reasoning.
  std::optional<ThinkTokens> think;
  bool thinking_off = false;  // --no-thinking
  // How the answers of chat records with tools are read for calls (job/tool_calls.h): the chat
  // template's family's (Qwen2.5, Qwen3: <tool_call> blocks; Llama 3.1 / 3.2: JSON objects).
  ToolCallFormat tool_calls = ToolCallFormat::None;
};

// Settings whose JSON vocabulary and schema grammars are made from `tokenizer`.
AnswerSettings answer_settings(const Tokenizer& tokenizer, std::vector<std::string> default_stop,
                               std::string model_name, int64_t created, ResponseFormat default_response_format,
                               std::string default_json_schema = {});

// The tokenizer's tokens as JSON answers draw them: each token's bytes, special tokens none
// (never drawn inside a document; the answer ends at its closing bracket).
std::shared_ptr<const JsonVocabulary> json_vocabulary(const Tokenizer& tokenizer);

// The request generating `r` from its prompt tokens: sampling, n choices, logprobs, a stop check
// that ends a choice as soon as its text holds one of the stop strings, and the JSON grammar when
// the record (or the job's default) asks for json_object.
GenRequest make_gen_request(const PromptRecord& r, std::vector<int32_t> prompt, const AnswerSettings& s);

// The output line answering `r` (strata or OpenAI format, as it came) from its choices' results,
// in choice order. `prompt_ids`: the prompt as the model read it, which echo writes back.
nlohmann::json answer_line(const PromptRecord& r, int64_t prompt_tokens, std::span<const GenResult> choices,
                           const AnswerSettings& s, std::span<const int32_t> prompt_ids = {});

// ---- parts, exposed for tests ----

// A stop check over generated tokens: true once their text (special tokens left out) holds one of
// `stops`, wherever it starts, including across token boundaries. Stateless: it looks at the
// bytes of the last token and of as many earlier tokens as a match ending in it could reach.
// Empty when `stops` is.
StopCheck make_stop_check(const Tokenizer& tokenizer, std::vector<std::string> stops);
// The same over a harmony answer's final-channel text only, or a Qwen3 answer's text after its
// </think> (job/reasoning.h).
StopCheck make_harmony_stop_check(const Tokenizer& tokenizer, const HarmonyTokens& h, std::vector<std::string> stops);
StopCheck make_think_stop_check(const Tokenizer& tokenizer, const ThinkTokens& t, std::vector<std::string> stops);

// Where the first of the stop strings begins in `text` (the earliest match of any), or npos.
// Only matches that end past byte `ends_after` count: min_tokens' boundary (the text of an
// answer's first min_tokens - 1 tokens), before which vLLM looks for no stop string.
size_t first_stop(std::string_view text, const std::vector<std::string>& stops, size_t ends_after = 0);

// A token as OpenAI shows it: its bytes when they are valid UTF-8, else "bytes:\xNN..." (the
// legacy API's form for a piece of a character).
std::string token_text(const Tokenizer& tokenizer, int32_t id);

}  // namespace strata
