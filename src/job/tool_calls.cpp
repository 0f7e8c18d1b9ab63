#include "strata/job/tool_calls.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "strata/model/chat_json.h"
#include "strata/runtime/json_schema.h"

namespace strata {

namespace {

constexpr std::string_view kOpen = "<tool_call>", kClose = "</tool_call>";

// The call in one JSON text, as json.loads reads it and vLLM takes it apart: nullopt when the text
// is not a JSON object with a string "name" and `arguments` (else, where given, `or_else`).
std::optional<ToolCall> read_call(std::string_view text, const char* arguments = "arguments",
                                  const char* or_else = nullptr) {
  nlohmann::ordered_json call;
  try {
    call = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
  if (!call.is_object() || !call.contains("name") || !call["name"].is_string()) return std::nullopt;
  const char* key = call.contains(arguments) || !or_else ? arguments : or_else;
  if (!call.contains(key)) return std::nullopt;
  try {
    // ordered_json keeps the keys' order, and python_tojson prints numbers as Python does.
    return ToolCall{call["name"].get<std::string>(), python_tojson(call[key].dump())};
  } catch (const Error&) {  // nothing json.loads would have read differently reaches here
    return std::nullopt;
  }
}

// One past the '}' that closes the object opening at `begin`, brackets counted outside strings;
// npos when it never closes. For valid JSON, where JSONDecoder.raw_decode stops; for anything else
// the parse that follows fails, as raw_decode would.
size_t object_end(std::string_view s, size_t begin) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = begin; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if ((c == '}' || c == ']') && --depth == 0) {
      return i + 1;
    }
  }
  return std::string_view::npos;
}

}  // namespace

ToolCallAnswer read_hermes_tool_calls(std::string_view answer) {
  const size_t first = answer.find(kOpen);
  if (first == std::string_view::npos) return {{}, std::string(answer)};
  ToolCallAnswer out;
  // The regex <tool_call>(.*?)</tool_call>|<tool_call>(.*) over the answer, matches not overlapping.
  for (size_t at = first; at != std::string_view::npos; at = answer.find(kOpen, at)) {
    const size_t body = at + kOpen.size();
    const size_t close = answer.find(kClose, body);
    const std::string_view text =
        close == std::string_view::npos ? answer.substr(body) : answer.substr(body, close - body);
    std::optional<ToolCall> call = read_call(text);
    if (!call) return {{}, std::string(answer)};
    out.calls.push_back(std::move(*call));
    at = close == std::string_view::npos ? std::string_view::npos : close + kClose.size();
  }
  if (first > 0) out.content = std::string(answer.substr(0, first));
  return out;
}

ToolCallAnswer read_llama3_json_tool_calls(std::string_view answer) {
  const ToolCallAnswer text{{}, std::string(answer)};
  ToolCallAnswer out;
  size_t end = 0;  // one past the last object read; a '{' before or at it is skipped
  bool read = false;
  for (size_t at = answer.find('{'); at != std::string_view::npos; at = answer.find('{', at + 1)) {
    if (read && at <= end) continue;
    const size_t close = object_end(answer, at);
    if (close == std::string_view::npos) return text;
    std::optional<ToolCall> call = read_call(answer.substr(at, close - at), "arguments", "parameters");
    if (!call) return text;
    out.calls.push_back(std::move(*call));
    end = close, read = true;
  }
  if (out.calls.empty()) return text;
  return out;  // content null: vLLM drops the text around the calls
}

nlohmann::ordered_json required_tool_calls_schema(const nlohmann::ordered_json& tools, bool parallel) {
  using ordered_json = nlohmann::ordered_json;
  ordered_json alternatives = ordered_json::array(), hoisted = ordered_json::object();
  for (const ordered_json& tool : tools) {
    const ordered_json& f = tool["function"];
    ordered_json parameters = f.contains("parameters") && f["parameters"].is_object() && !f["parameters"].empty()
                                  ? f["parameters"]
                                  : ordered_json{{"type", "object"}, {"properties", ordered_json::object()}};
    for (const char* section : {"$defs", "definitions"}) {
      if (!parameters.contains(section)) continue;
      if (!parameters[section].is_object())
        throw JsonSchemaError("'" + std::string(section) + "' of the parameters of '" + f["name"].get<std::string>() +
                              "' must be an object");
      for (const auto& [name, schema] : parameters[section].items()) {
        ordered_json& slot = hoisted[section][name];
        if (!slot.is_null() && slot != schema)
          throw JsonSchemaError("tools define '" + std::string(section) + "/" + name +
                                "' differently, which tool_choice \"required\" cannot hold answers to");
        slot = schema;
      }
      parameters.erase(section);
    }
    alternatives.push_back({{"type", "object"},
                            {"properties", {{"name", {{"enum", ordered_json::array({f["name"]})}}}, {"parameters", std::move(parameters)}}},
                            {"required", ordered_json::array({"name", "parameters"})}});
  }
  ordered_json schema = {{"type", "array"},
                         {"minItems", 1},
                         {"items", alternatives.size() == 1 ? alternatives[0] : ordered_json{{"anyOf", alternatives}}}};
  if (!parallel) schema["maxItems"] = 1;
  for (const auto& [section, defs] : hoisted.items()) schema[section] = defs;
  return schema;
}

std::optional<std::vector<ToolCall>> read_required_tool_calls(std::string_view answer) {
  nlohmann::ordered_json calls;
  try {
    calls = nlohmann::ordered_json::parse(answer);
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
  if (!calls.is_array() || calls.empty()) return std::nullopt;
  std::vector<ToolCall> out;
  for (const auto& call : calls) {
    if (!call.is_object() || !call.contains("name") || !call["name"].is_string() || !call.contains("parameters"))
      return std::nullopt;
    try {
      out.push_back({call["name"].get<std::string>(), python_tojson(call["parameters"].dump())});
    } catch (const Error&) {
      return std::nullopt;
    }
  }
  return out;
}

ToolCallFormat tool_call_format(const ChatTemplate& chat) {
  switch (chat.format()) {
    case ChatFormat::Jinja:
      return chat.renders_tools() && chat.source().find("<tool_call>") != std::string::npos ? ToolCallFormat::Hermes
                                                                                            : ToolCallFormat::None;
    case ChatFormat::Qwen25:
    case ChatFormat::Qwen3:
      return ToolCallFormat::Hermes;
    case ChatFormat::Llama31:
      return ToolCallFormat::Llama3Json;
    default:
      return ToolCallFormat::None;
  }
}

ToolCallFormat tool_call_format(const ChatTemplate& chat, std::string_view parser) {
  if (parser == "hermes") return ToolCallFormat::Hermes;
  if (parser == "llama3_json") return ToolCallFormat::Llama3Json;
  if (parser == "none") return ToolCallFormat::None;
  STRATA_CHECK(parser == "auto", "unknown tool call parser " << parser);
  return tool_call_format(chat);
}

std::string tool_call_id(const PromptRecord& r, size_t choice, size_t k) {
  const std::string key = id_text(r.id) + "\n" + std::to_string(choice) + "\n" + std::to_string(k);
  char buf[32];
  std::snprintf(buf, sizeof buf, "call_%016llx%08llx", static_cast<unsigned long long>(fnv1a64(key)),
                static_cast<unsigned long long>(fnv1a64(key + "\n") & 0xffffffffu));
  return buf;
}

}  // namespace strata
