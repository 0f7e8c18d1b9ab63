// Chat messages and JSON: OpenAI's tool_calls read from a message object, and JSON printed as a
// chat template's tojson filter prints it (transformers': Python's json.dumps).
#pragma once
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "strata/core/error.h"
#include "strata/model/chat_template.h"

namespace strata {

// A message the request cannot hold: `code` is OpenAI's ("invalid_type", "invalid_value").
class ChatMessageError : public Error {
public:
  ChatMessageError(std::string code, const std::string& message) : Error(message), code(std::move(code)) {}
  std::string code;
};

// The tool calls of one message object (none when it has no "tool_calls"), in OpenAI's format:
// [{"type": "function", "function": {"name": string, "arguments": string of JSON}}, ...], on an
// assistant message only. `at` names the message in errors ("body.messages[2]").
std::vector<ChatToolCall> read_tool_calls(const nlohmann::json& message, const std::string& at);

// The messages of a request: a non-empty JSON array of {"role": string, "content": ...} with
// OpenAI's tool_calls on assistant messages (whose content may then be null or absent). Content
// is a string, or with `text_parts` (OpenAI's body) also an array of {"type": "text", "text"} parts
// joined. `field` names the array in errors ("body.messages", "messages", "--messages"). The
// batch job's formats and `strata tokenize --messages` all read messages here.
std::vector<ChatMessage> read_chat_messages(const nlohmann::json& messages, const std::string& field, bool text_parts);

// A request's tools (OpenAI's `tools`: [{"type": "function", "function": {"name", "description",
// "parameters"}}, ...]), each tool's JSON text in its keys' order (ChatOptions::tools). `field`
// names the array in errors ("body.tools").
std::vector<std::string> read_chat_tools(const nlohmann::ordered_json& tools, const std::string& field);

// JSON text printed as transformers' tojson prints the value json.loads makes of it:
// json.dumps(ensure_ascii=False), so ", " and ": " between items, keys in their order (a repeated
// key keeps its first place and its last value), non-ASCII as it is, floats as Python's repr
// (1e+16, 1e-05, 1000000000000000.0). Throws ChatTemplateError for text that is not JSON or that
// holds an integer beyond 64 bits (Python keeps it exact, a double would not). `indent` >= 0 is
// tojson(indent=N): each item on its own line, N spaces a level, "," between items.
std::string python_tojson(std::string_view json_text, int indent = -1);

// Python's repr of a float (what str() and json.dumps print): the shortest digits that read back,
// written fixed while the decimal point falls within 16 digits of them, else as d.ddde+XX; nan,
// inf and -inf as Python writes them.
std::string python_float(double x);

}  // namespace strata
