#include "strata/job/tool_calls.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "strata/model/chat_json.h"

namespace strata {

namespace {

constexpr std::string_view kOpen = "<tool_call>", kClose = "</tool_call>";

// The call in one block's text, as json.loads reads it then vLLM takes it apart: nullopt when the
// text is not a JSON object with a string "name" and an "arguments".
std::optional<ToolCall> read_call(std::string_view text) {
  nlohmann::ordered_json call;
  try {
    call = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
  if (!call.is_object() || !call.contains("name") || !call["name"].is_string() || !call.contains("arguments"))
    return std::nullopt;
  try {
    // ordered_json keeps the keys' order, and python_tojson prints numbers as Python does.
    return ToolCall{call["name"].get<std::string>(), python_tojson(call["arguments"].dump())};
  } catch (const Error&) {  // nothing json.loads would have read differently reaches here
    return std::nullopt;
  }
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

std::string tool_call_id(const PromptRecord& r, size_t choice, size_t k) {
  const std::string key = id_text(r.id) + "\n" + std::to_string(choice) + "\n" + std::to_string(k);
  char buf[32];
  std::snprintf(buf, sizeof buf, "call_%016llx%08llx", static_cast<unsigned long long>(fnv1a64(key)),
                static_cast<unsigned long long>(fnv1a64(key + "\n") & 0xffffffffu));
  return buf;
}

}  // namespace strata
