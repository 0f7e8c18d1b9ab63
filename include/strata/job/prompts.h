// The batch job's input, one JSON object per line, in one of two formats (docs/batch-format.md):
//   strata:       {"id": ..., "prompt" | "messages", optional "max_new_tokens", "temperature", ...}
//   OpenAI batch: {"custom_id", "method": "POST", "url": "/v1/chat/completions" | "/v1/completions",
//                  "body": {"model", "messages" | "prompt", "max_tokens", "temperature", ...}}
// and embeddings requests: strata {"id", "input", ...}; OpenAI's url "/v1/embeddings", body.input.
// A file holds one format, told by its first line. The whole file is validated before any work
// starts, so bad input fails fast with FILE:LINE. An OpenAI line that is well formed but cannot be
// served (a value out of range, a feature not implemented) is kept with its error, to be answered
// with an error line while the rest of the job proceeds.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/model/chat_template.h"
#include "strata/runtime/sampler.h"

namespace strata {

enum class InputFormat : uint8_t { Strata, OpenAIBatch };
// None: the strata format. Score and Rerank: vLLM's /v1/score and /v1/rerank, over embeddings or
// of a one-label classifier (a cross-encoder); Classify: vLLM's /v1/classify, of a sequence classifier.
enum class Endpoint : uint8_t { None, ChatCompletions, Completions, Embeddings, Score, Rerank, Classify };

// Why a well-formed request is not served: OpenAI-style code ("invalid_value", ...) and message.
struct ServeError {
  std::string code, message;
};

// What an answer is held to: free text, one JSON object or array (json_grammar.h), a document of a
// JSON schema (json_schema.h) (OpenAI's response_format, or vLLM's structured outputs), a text a
// regex matches or one of a list of strings (vLLM's structured outputs regex and choice,
// regex_rules.h).
enum class ResponseFormat : uint8_t { Text, JsonObject, JsonSchema, Regex, Choice };

// One text of an embeddings request, or token ids used as given (OpenAI's input of integers).
struct EmbeddingInput {
  std::string text;
  std::vector<int32_t> ids;  // non-empty: given as ids (text unused)
};

// What an embeddings request's vectors answer: themselves, or the cosine similarity of pairs of
// them (vLLM's score and rerank of an embedding model); or, for a sequence classifier, the classes
// of each input (vLLM's /v1/classify: the pooled state through the classifier's head).
enum class EmbeddingUse : uint8_t { Embed, Score, Rerank, Classify };

// An embeddings request (OpenAI's /v1/embeddings body, the strata format's "input" line), or a
// score or rerank request over embeddings (/v1/score: text_1 and text_2; /v1/rerank: query and
// documents; the strata format's lines with those fields).
struct EmbeddingRequest {
  EmbeddingUse use = EmbeddingUse::Embed;
  // Embed: the inputs. Score: text_1's `first` texts, then text_2's, scored 1 to N (first == 1)
  // or pairwise (first == the rest). Rerank: the query (first == 1), then the documents.
  std::vector<EmbeddingInput> inputs;  // 1 .. kMaxEmbeddingInputs
  size_t first = 0;
  int top_n = 0;                       // Rerank: the best this many documents; 0: all
  // input was an array of inputs (not one text, not one list of ids): the strata answer lists
  // "embeddings"
  bool listed = false;
  int dimensions = 0;                  // keep the first this many values; 0: all
  bool base64 = false;                 // encoding_format "base64": little-endian float32, base64
  std::optional<bool> normalize;       // vLLM's extension; unset: the job's (the model's pooling)
  // vLLM's truncate_prompt_tokens: a text keeps its last this many tokens, its special tokens
  // among them (ids given: their last this many); -1: the model's context; 0: not cut.
  int truncate = 0;
  // Classify: the input is the record's messages, rendered by the chat template (with its
  // generation prompt when asked: vLLM's add_generation_prompt, default false) and tokenized as
  // apply_chat_template does; inputs then holds one empty input.
  bool chat = false;
  bool add_generation_prompt = false;
  bool add_special_tokens = true;      // Classify: a text gets the tokenizer's BOS and appended ids
  // Classify, and Score/Rerank of a cross-encoder: vLLM's use_activation; false: the logits as they are.
  bool activation = true;
};

struct PromptRecord {
  nlohmann::json id;        // strata: "id" (string or integer); OpenAI: "custom_id" (string)
  std::string id_key;       // id.dump(): unique key for duplicate checks and resume
  int line = 0;             // 1-based line in the input file
  std::string prompt;       // empty when messages are given
  // Completions: the prompt given as token ids (OpenAI's prompt of integers), used as given, no
  // BOS added; `prompt` is then empty.
  std::vector<int32_t> prompt_ids;
  // Completions with several prompts (body.prompt a list of strings, or of token-id lists): each
  // one's text or ids, in order, `prompt` and `prompt_ids` then empty. The job answers each as a
  // request of its own (completion_parts) and writes one line: prompt i's choice j is choice
  // i * n + j, the usage summed, as OpenAI and vLLM answer.
  struct Part {
    std::string text;
    std::vector<int32_t> ids;
  };
  std::vector<Part> prompts;
  // One of those prompts, as completion_parts splits them: its index and how many there are.
  int part = 0, parts = 1;
  std::vector<ChatMessage> messages;
  SamplingParams sampling;
  InputFormat format = InputFormat::Strata;
  Endpoint endpoint = Endpoint::None;
  // Stop strings (at most kMaxStopStrings, non-empty); unset: the job's default (--stop).
  std::optional<std::vector<std::string>> stop;
  int n = 1;                         // choices, 1 .. kMaxChoices
  // -1: no logprobs; k >= 0: each generated token's log-probability and the k most probable
  // tokens (chat: logprobs true + top_logprobs k; completions: logprobs k; strata: logprobs k).
  int logprobs = -1;
  // vLLM's prompt_logprobs: -1 none; k >= 0: each prompt token's log-probability after the first,
  // with the k most probable tokens. Completions with echo default to their logprobs.
  int prompt_logprobs = -1;
  // Completions' echo: the answer's text (and logprobs) begin with the prompt's. With max_tokens
  // 0 (prompt_only) the answer is the prompt alone: one token is drawn and dropped, as vLLM does.
  bool echo = false;
  bool prompt_only = false;
  std::optional<ResponseFormat> response_format;  // unset: the job's default (--response-format)
  std::string json_schema;  // JsonSchema: the schema's text, its keys in the order written
  std::string pattern;      // Regex: the regex; Choice: the choices, a JSON array of strings
  // "low", "medium" or "high": GPT-OSS's reasoning (ChatOptions); empty: the job's default.
  std::string reasoning_effort;
  // chat_template_kwargs.enable_thinking (Qwen3; ChatOptions); unset: the job's default.
  std::optional<bool> enable_thinking;
  // chat_template_kwargs' other arguments, each a name and its JSON text (ChatOptions::variables):
  // an interpreted template reads them; a family Strata renders itself refuses them.
  std::vector<std::pair<std::string, std::string>> template_kwargs;
  // The tools the model may call (OpenAI's `tools`, chat only), each one's JSON text in its keys'
  // order (ChatOptions::tools); empty: none.
  std::vector<std::string> tools;
  // tool_choice "auto" (true, the default) reads an answer's tool calls (job/tool_calls.h);
  // "none" (false) shows the tools but reads the answer as text.
  bool read_tool_calls = true;
  // tool_choice naming a function: the answer is held to its parameters (response_format is set
  // to their schema) and written as one call of it.
  std::string named_tool;
  // tool_choice "required": the answer is held to a non-empty array of calls of the tools
  // (required_tool_calls_schema, job/tool_calls.h) and written as those calls.
  bool tool_calls_required = false;
  // parallel_tool_calls: false keeps an answer's first call only (vLLM's filter), and holds a
  // "required" answer to one call.
  bool parallel_tool_calls = true;
  std::optional<EmbeddingRequest> embedding;  // set: an embeddings request, which generates nothing
  std::string model;                 // OpenAI body.model, echoed in the response ("" if absent)
  std::optional<ServeError> error;   // OpenAI only: answer with this error instead of generating
};

inline constexpr int kMaxStopStrings = 4;          // as OpenAI
inline constexpr int kMaxChoices = 128;            // as OpenAI's chat n
inline constexpr int kMaxTopLogprobs = 20;         // chat top_logprobs (and the strata format), as OpenAI
inline constexpr int kMaxCompletionLogprobs = 20;  // completions logprobs: vLLM's default cap (OpenAI's is 5)
inline constexpr int kMaxEmbeddingInputs = 2048;   // inputs of one embeddings request, as OpenAI
inline constexpr int kMaxCompletionPrompts = 2048; // prompts of one completions request (as embeddings' inputs)

// Whether `effort` is a reasoning_effort Strata passes on: "low", "medium" or "high".
bool valid_reasoning_effort(const std::string& effort);

// Why a list of stop strings is refused (too many, an empty one), or "" when it is fine.
std::string stop_strings_error(const std::vector<std::string>& stop);
// Parses one line at a time, as read_prompts does: the first line's format holds for the file,
// unknown keys are warned about once each. It keeps no ids: duplicates are the caller's check.
class PromptLineParser {
public:
  PromptLineParser(std::string file, const SamplingParams& defaults,
                   std::function<void(const std::string&)> warn = {});
  // nullopt for a blank line; throws strata::Error "FILE:LINE: reason" for a malformed one.
  std::optional<PromptRecord> parse(std::string_view text, int line_no);
  std::optional<InputFormat> format() const { return format_; }
  // For a parser that starts mid-file: the format that `first_line` set.
  void expect_format(InputFormat format, int first_line) { format_ = format, first_line_ = first_line; }

private:
  std::string file_;
  SamplingParams defaults_;
  std::function<void(const std::string&)> warn_;
  std::optional<InputFormat> format_;  // the first line's
  int first_line_ = 0;
  std::set<std::string> warned_keys_;
};

// A completions request with several prompts as one request per prompt, each with its prompt in
// `prompt` or `prompt_ids`, `prompts` empty and `part`/`parts` set; any other request alone.
std::vector<PromptRecord> completion_parts(const PromptRecord& r);

// "duplicate id 7" or "duplicate custom_id \"a\"" (the message without FILE:LINE).
std::string duplicate_id_message(const PromptRecord& r);

// Reads and validates every line; throws strata::Error "FILE:LINE: reason" on the first malformed
// one, a duplicate id, or a line in the other format than the first line's. Blank lines are
// skipped. Unknown keys are reported once each (per name) through `warn`.
std::vector<PromptRecord> read_prompts(const std::filesystem::path& file, const SamplingParams& defaults,
                                       const std::function<void(const std::string&)>& warn = {});
// The same from a stream (tests, the fuzz target); `source` stands for FILE in the messages.
std::vector<PromptRecord> read_prompts(std::istream& in, const std::string& source, const SamplingParams& defaults,
                                       const std::function<void(const std::string&)>& warn = {});

// --shard i/N: a request belongs to shard fnv1a64(id_text(id)) % N.
struct Shard {
  uint64_t index = 0, count = 1;
};
Shard parse_shard(const std::string& text);  // "i/N", 0 <= i < N; throws strata::Error
uint64_t fnv1a64(std::string_view bytes);
// The id's UTF-8 string form: a string id as is (no quotes), an integer in decimal.
std::string id_text(const nlohmann::json& id);
inline bool in_shard(const PromptRecord& r, const Shard& s) { return fnv1a64(id_text(r.id)) % s.count == s.index; }

}  // namespace strata
