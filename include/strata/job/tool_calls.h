// An answer's tool calls, read as vLLM's tool parsers read them, so that a batch request with
// `tools` is answered with OpenAI's message.tool_calls. Qwen2.5 and Qwen3 (vLLM's "hermes" parser)
// write each call as <tool_call>{"name": ..., "arguments": {...}}</tool_call> after any text;
// Llama 3.1 and 3.2 ("llama3_json") as a JSON object {"name": ..., "parameters": {...}}.
// docs/batch-format.md, "Tool calls from answers".
#pragma once
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "strata/job/prompts.h"
#include "strata/model/chat_template.h"

namespace strata {

struct ToolCall {
  std::string name;
  std::string arguments;  // JSON text, as json.dumps(ensure_ascii=False) prints the call's arguments
};

struct ToolCallAnswer {
  std::vector<ToolCall> calls;  // empty: the answer called nothing, or a call could not be read
  // The text before the first <tool_call>; nullopt when that is empty (OpenAI's null content). With
  // no calls read, the whole answer.
  std::optional<std::string> content;
};

// vLLM's hermes parser: each <tool_call>...</tool_call> block (the last one may be cut short by
// the token limit and run to the end) holds one JSON object with a string "name" and any JSON
// "arguments"; if any block is not such an object, no call is read and the answer is all text.
ToolCallAnswer read_hermes_tool_calls(std::string_view answer);

// vLLM's llama3_json parser: every "{" that does not lie in (or right at the end of) an object
// already read starts a JSON object with a string "name" and "arguments" (else "parameters"); if
// any such object is not a call (or not JSON), no call is read and the answer is all text. With
// calls, the content is null: the text around them is dropped, as there.
ToolCallAnswer read_llama3_json_tool_calls(std::string_view answer);

// tool_choice "required", as vLLM holds such answers: the schema of a non-empty JSON array of
// calls, each {"name": one of `tools`' names, "parameters": that tool's parameters schema (an
// empty object where it has none)}. `tools` as the request wrote them (OpenAI's function tools);
// each one's $defs and definitions move to the schema's root, where its references point. Throws
// JsonSchemaError (runtime/json_schema.h) when two tools define one name differently. Not
// `parallel` (parallel_tool_calls false): one call at most (maxItems 1), the one vLLM would keep.
nlohmann::ordered_json required_tool_calls_schema(const nlohmann::ordered_json& tools, bool parallel = true);

// The calls of an answer held to that schema, each one's arguments its "parameters" printed as
// json.dumps(ensure_ascii=False) prints them; nullopt when the answer is not such an array (the
// token limit cut it).
std::optional<std::vector<ToolCall>> read_required_tool_calls(std::string_view answer);

// Which of the two an answer is read with: the chat template's family's.
enum class ToolCallFormat : uint8_t { None, Hermes, Llama3Json };
// The format answers of a chat template call tools in: its family's (None exactly for the
// families whose templates Strata writes no tools into, ChatTemplate::renders_tools); for an
// interpreted template Hermes when it writes <tool_call> tags (as Qwen's, Hermes' and QwQ's do),
// else None (the answer is read as text).
ToolCallFormat tool_call_format(const ChatTemplate& chat);
// --tool-call-parser's choice: "auto" is the template's (above), else vLLM's parser names "hermes",
// "llama3_json", or "none".
ToolCallFormat tool_call_format(const ChatTemplate& chat, std::string_view parser);

// The id of a request's choice's k-th call, "call_" and 24 hex digits: the same on every run and
// shard (vLLM draws random ones; a resumed job must not change what it already wrote).
std::string tool_call_id(const PromptRecord& r, size_t choice, size_t k);

}  // namespace strata
