// OpenAI's tool_calls read from a message, and JSON printed as Python's json.dumps prints it (the
// tojson filter of transformers' chat templates), for the arguments of a tool call.
#include "strata/model/chat_json.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>

namespace strata {

namespace {

using ordered_json = nlohmann::ordered_json;

constexpr int kMaxDepth = 512;  // nesting printed recursively; deeper arguments are refused

// One pass over the text before it is parsed into values: the parser's error, an integer too big
// for 64 bits (nlohmann reads it as a double, with no other trace), nesting too deep to print.
struct JsonCheck : nlohmann::json_sax<ordered_json> {
  std::string error;
  int depth = 0;
  bool fail(std::string why) { return error = std::move(why), false; }
  bool open() { return ++depth <= kMaxDepth || fail("nested deeper than " + std::to_string(kMaxDepth)); }
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t& text) override {
    return text.find_first_of(".eE") != string_t::npos || fail("an integer beyond 64 bits: " + text);
  }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return open(); }
  bool key(string_t&) override { return true; }
  bool end_object() override { return --depth, true; }
  bool start_array(std::size_t) override { return open(); }
  bool end_array() override { return --depth, true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    return fail(std::string("not JSON: ") + e.what());
  }
};

// json.dumps: ", " and ": " between items; with an indent (>= 0), each item on its own line, that
// many spaces deeper a level, "," between items (no trailing space) and empty containers as [] {}.
void print(const ordered_json& v, int indent, int level, std::string& out) {
  auto open = [&](char bracket, size_t size) {
    out += bracket;
    if (indent >= 0 && size > 0) out += '\n' + std::string(size_t(indent * (level + 1)), ' ');
  };
  auto separator = [&] {
    return indent < 0 ? std::string(", ") : ",\n" + std::string(size_t(indent * (level + 1)), ' ');
  };
  auto close = [&](char bracket, size_t size) {
    if (indent >= 0 && size > 0) out += '\n' + std::string(size_t(indent * level), ' ');
    out += bracket;
  };
  switch (v.type()) {
    case ordered_json::value_t::number_integer:
      out += std::to_string(v.get<int64_t>());
      break;
    case ordered_json::value_t::number_unsigned:
      out += std::to_string(v.get<uint64_t>());
      break;
    case ordered_json::value_t::number_float:
      out += python_float(v.get<double>());
      break;
    case ordered_json::value_t::array: {
      open('[', v.size());
      std::string sep;
      for (const ordered_json& x : v) out += sep, print(x, indent, level + 1, out), sep = separator();
      close(']', v.size());
      break;
    }
    case ordered_json::value_t::object: {
      open('{', v.size());
      std::string sep;
      for (const auto& [key, x] : v.items()) {
        out += sep + ordered_json(key).dump(-1, ' ', false) + ": ";
        print(x, indent, level + 1, out);
        sep = separator();
      }
      close('}', v.size());
      break;
    }
    default:  // null, true, false, strings: Python escapes what nlohmann escapes, the same way
      out += v.dump(-1, ' ', false);
  }
}

}  // namespace

std::string python_float(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string_view s(buf, size_t(r.ptr - buf));  // "-1.25e+16"
  std::string out;
  if (s.front() == '-') out += '-', s.remove_prefix(1);
  const size_t e = s.find('e');
  std::string digits;
  for (char c : s.substr(0, e))
    if (c != '.') digits += c;
  const int exponent = std::atoi(std::string(s.substr(e + 1)).c_str());
  const int point = exponent + 1;  // digits before the decimal point
  const int n = int(digits.size());
  if (point > -4 && point <= 16) {
    if (point <= 0)
      out.append("0.").append(size_t(-point), '0').append(digits);
    else if (point >= n)
      out.append(digits).append(size_t(point - n), '0').append(".0");
    else
      out.append(digits, 0, size_t(point)).append(".").append(digits, size_t(point));
  } else {
    out.append(digits, 0, 1);
    if (n > 1) out.append(".").append(digits, 1);
    const std::string magnitude = std::to_string(std::abs(exponent));
    out.append(exponent < 0 ? "e-" : "e+").append(magnitude.size() < 2 ? "0" : "").append(magnitude);
  }
  return out;
}

std::string python_tojson(std::string_view json_text, int indent) {
  JsonCheck check;
  if (!ordered_json::sax_parse(json_text, &check)) throw ChatTemplateError(check.error);
  // Parsed into an ordered object, a repeated key keeps its first place and takes its last value,
  // as in the dict json.loads builds.
  std::string out;
  print(ordered_json::parse(json_text), indent, 0, out);
  return out;
}

namespace {

// What OpenAI's {"type": "function", "function": {"name": ...}} entries (a request's tools, a
// message's tool calls) all need; `type_code` is the error code of another type.
template <class Json>
void check_function_entry(const Json& e, const std::string& at, const char* type_code, const char* function_needs) {
  if (!e.is_object()) throw ChatMessageError("invalid_type", at + " must be an object");
  if (e.contains("type") && e["type"] != "function")
    throw ChatMessageError(type_code, at + ".type must be \"function\"");
  if (!e.contains("function") || !e["function"].is_object())
    throw ChatMessageError("invalid_type", at + ".function must be an object with " + function_needs);
  if (!e["function"].contains("name") || !e["function"]["name"].is_string())
    throw ChatMessageError("invalid_type", at + ".function.name must be a string");
}

}  // namespace

std::vector<ChatToolCall> read_tool_calls(const nlohmann::json& message, const std::string& at) {
  std::vector<ChatToolCall> calls;
  if (!message.contains("tool_calls") || message["tool_calls"].is_null()) return calls;
  const nlohmann::json& v = message["tool_calls"];
  const std::string where = at + ".tool_calls";
  if (!v.is_array() || v.empty()) throw ChatMessageError("invalid_type", where + " must be a non-empty array");
  if (message.value("role", "") != "assistant")
    throw ChatMessageError("invalid_value", where + " is for assistant messages only");
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string at_call = where + "[" + std::to_string(i) + "]";
    check_function_entry(v[i], at_call, "invalid_value", "'name' and 'arguments'");
    const nlohmann::json& f = v[i]["function"];
    // A string, as OpenAI sends it: an object here would already have lost its key order.
    if (!f.contains("arguments") || !f["arguments"].is_string())
      throw ChatMessageError("invalid_type", at_call + ".function.arguments must be a string of JSON");
    if (v[i].contains("id") && !v[i]["id"].is_null() && !v[i]["id"].is_string())
      throw ChatMessageError("invalid_type", at_call + ".id must be a string");
    ChatToolCall call{f["name"].get<std::string>(), f["arguments"].get<std::string>(),
                      v[i].contains("id") && v[i]["id"].is_string() ? v[i]["id"].get<std::string>() : ""};
    try {
      python_tojson(call.arguments);
    } catch (const ChatTemplateError& e) {
      throw ChatMessageError("invalid_value", at_call + ".function.arguments: " + e.what());
    }
    calls.push_back(std::move(call));
  }
  return calls;
}

namespace {

// A message's content: a string, or (text_parts) an array of {"type": "text", "text"} parts joined.
std::string message_content(const nlohmann::json& c, const std::string& at, bool text_parts) {
  if (c.is_string()) return c.get<std::string>();
  if (!text_parts) throw ChatMessageError("invalid_type", at + ".content must be a string");
  if (!c.is_array()) throw ChatMessageError("invalid_type", at + ".content must be a string or an array of text parts");
  std::string text;
  for (const nlohmann::json& part : c) {
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      throw ChatMessageError("invalid_type", at + ".content parts must be objects with a 'type'");
    if (part["type"] != "text")
      throw ChatMessageError("unsupported_value",
                             at + ".content part of type " + part["type"].dump() + " is not supported (text only)");
    if (!part.contains("text") || !part["text"].is_string())
      throw ChatMessageError("invalid_type", at + ".content text part needs 'text'");
    text += part["text"].get<std::string>();
  }
  return text;
}

}  // namespace

std::vector<ChatMessage> read_chat_messages(const nlohmann::json& v, const std::string& field, bool text_parts) {
  if (!v.is_array() || v.empty())
    throw ChatMessageError("invalid_type", field + " must be a non-empty array of {\"role\", \"content\"}");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < v.size(); ++i) {
    const nlohmann::json& m = v[i];
    const std::string at = field + "[" + std::to_string(i) + "]";
    if (!m.is_object()) throw ChatMessageError("invalid_type", at + " must be an object");
    if (!m.contains("role") || !m["role"].is_string()) throw ChatMessageError("invalid_type", at + ".role must be a string");
    std::vector<ChatToolCall> calls = read_tool_calls(m, at);
    // As OpenAI's: an assistant message with tool calls may have a null content, or none.
    const bool no_content = !calls.empty() && (!m.contains("content") || m["content"].is_null());
    std::string content;
    if (!no_content) {
      if (!m.contains("content"))
        throw text_parts ? ChatMessageError("missing_field", at + ".content is required")
                         : ChatMessageError("invalid_type", at + ".content must be a string");
      content = message_content(m["content"], at, text_parts);
    }
    ChatMessage message{m["role"].get<std::string>(), std::move(content), std::move(calls)};
    for (auto [key, field] : {std::pair{"tool_call_id", &message.tool_call_id}, std::pair{"name", &message.name},
                              std::pair{"reasoning_content", &message.reasoning_content}}) {
      if (!m.contains(key) || m[key].is_null()) continue;
      if (!m[key].is_string()) throw ChatMessageError("invalid_type", at + "." + key + " must be a string");
      *field = m[key].get<std::string>();
    }
    out.push_back(std::move(message));
  }
  return out;
}

std::vector<std::string> read_chat_tools(const nlohmann::ordered_json& tools, const std::string& field) {
  if (!tools.is_array()) throw ChatMessageError("invalid_type", field + " must be an array of tools");
  std::vector<std::string> out;
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string at = field + "[" + std::to_string(i) + "]";
    const nlohmann::ordered_json& t = tools[i];
    check_function_entry(t, at, "unsupported_value", "a 'name'");
    std::string text;
    try {
      text = t.dump();
    } catch (const nlohmann::json::exception&) {  // type_error 316: not UTF-8
      throw ChatMessageError("invalid_value", at + " holds text that is not valid UTF-8");
    }
    out.push_back(std::move(text));
  }
  return out;
}

}  // namespace strata
