#include "strata/job/prompts.h"

#include <cfloat>
#include <charconv>
#include <cmath>
#include <fstream>
#include <functional>
#include <istream>
#include <optional>
#include <set>
#include <unordered_set>

#include "strata/core/error.h"
#include "strata/job/embeddings.h"
#include "strata/job/tool_calls.h"
#include "strata/model/chat_json.h"
#include "strata/runtime/json_schema.h"
#include "structured_outputs.h"

namespace strata {
using json = nlohmann::json;

bool valid_reasoning_effort(const std::string& effort) {
  return effort == "low" || effort == "medium" || effort == "high";
}

namespace {

// OpenAI's names of a strata-format field, which a line in the strata format would otherwise lose
// to the job's default silently but for a generic warning.
std::string strata_name_hint(const std::string& key) {
  if (key == "max_tokens" || key == "max_completion_tokens")
    return " (the strata format's is 'max_new_tokens'; '" + key + "' belongs to an OpenAI batch line's body)";
  return "";
}

const std::set<std::string> kKnownKeys = {
    "id", "prompt", "messages", "max_new_tokens", "temperature", "top_p", "top_k", "seed", "ignore_eos", "stop", "n",
    "logprobs", "prompt_logprobs", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty", "logit_bias", "min_tokens",
    "stop_token_ids", "response_format", "reasoning_effort", "chat_template_kwargs", "tools", "tool_choice",
    "parallel_tool_calls", "structured_outputs", "guided_choice", "guided_regex", "guided_json", "guided_grammar",
    "guided_decoding_backend", "guided_whitespace_pattern"};

struct LineContext {
  std::string where;  // "file:line"
  [[noreturn]] void fail(const std::string& why) const { throw Error(where + ": " + why); }
};

int64_t get_int(const json& obj, const char* key, const LineContext& ctx) {
  const json& v = obj[key];
  if (!v.is_number_integer()) ctx.fail(std::string("field '") + key + "' must be an integer, got " + v.dump());
  return v.get<int64_t>();
}

double get_number(const json& obj, const char* key, const LineContext& ctx) {
  const json& v = obj[key];
  if (!v.is_number()) ctx.fail(std::string("field '") + key + "' must be a number, got " + v.dump());
  return v.get<double>();
}

// Why a field's value is refused: the OpenAI format's error code and the message.
struct FieldError {
  std::string code, message;
};

// min_p, the penalties, logit_bias, min_tokens and stop_token_ids, read alike in both formats
// (null: not given), after the format's own fields (min_tokens is checked against the answer's
// length). `name` spells a field as its format does ("field 'min_p'", "body.min_p").
std::optional<FieldError> read_sampling_extensions(const json& obj,
                                                   const std::function<std::string(const char*)>& name,
                                                   SamplingParams& s) {
  struct Range {
    const char* key;
    float* value;
    double lo, hi;  // hi HUGE_VAL: any x > lo that fits a float
    const char* allowed;
  };
  const Range ranges[] = {{"min_p", &s.min_p, 0, 1, "in [0, 1]"},
                          {"repetition_penalty", &s.repetition_penalty, 0, HUGE_VAL, "> 0"},
                          {"frequency_penalty", &s.frequency_penalty, -2, 2, "in [-2, 2]"},
                          {"presence_penalty", &s.presence_penalty, -2, 2, "in [-2, 2]"}};
  for (const Range& r : ranges) {
    if (!obj.contains(r.key) || obj[r.key].is_null()) continue;
    const json& v = obj[r.key];
    if (!v.is_number()) return FieldError{"invalid_type", name(r.key) + " must be a number, got " + v.dump()};
    const double x = v.get<double>();
    const bool ok = r.hi == HUGE_VAL ? x > r.lo && x <= FLT_MAX : x >= r.lo && x <= r.hi;
    if (!ok) return FieldError{"invalid_value", name(r.key) + " must be " + r.allowed + ", got " + v.dump()};
    *r.value = float(x);
  }
  // The job's default (--min-tokens) never outlasts a line's own limit.
  s.min_tokens = std::min(s.min_tokens, s.max_new_tokens);
  if (obj.contains("min_tokens") && !obj["min_tokens"].is_null()) {
    const json& v = obj["min_tokens"];
    if (!v.is_number_integer())
      return FieldError{"invalid_type", name("min_tokens") + " must be an integer, got " + v.dump()};
    if (v.get<int64_t>() < 0 || v.get<int64_t>() > s.max_new_tokens)
      return FieldError{"invalid_value", name("min_tokens") + " must be in [0, " + std::to_string(s.max_new_tokens) +
                                             "] (the most tokens to generate), got " + v.dump()};
    s.min_tokens = v.get<int>();
  }
  if (obj.contains("stop_token_ids") && !obj["stop_token_ids"].is_null()) {
    const json& v = obj["stop_token_ids"];
    if (!v.is_array())
      return FieldError{"invalid_type", name("stop_token_ids") + " must be an array of token ids, got " + v.dump()};
    s.stop_token_ids.clear();
    for (const json& id : v) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
        return FieldError{"invalid_value", name("stop_token_ids") + " must hold token ids, got " + id.dump()};
      s.stop_token_ids.push_back(id.get<int32_t>());
    }
  }
  if (!obj.contains("logit_bias") || obj["logit_bias"].is_null()) return std::nullopt;
  const json& bias = obj["logit_bias"];
  if (!bias.is_object())
    return FieldError{"invalid_type",
                      name("logit_bias") + " must be an object of token ids and biases, got " + bias.dump()};
  s.logit_bias.clear();
  for (const auto& [key, value] : bias.items()) {
    int32_t id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (key.empty() || ec != std::errc() || end != key.data() + key.size() || id < 0)
      return FieldError{"invalid_value",
                        name("logit_bias") + " keys must be token ids (\"0\", \"42\", ...), got \"" + key + "\""};
    if (!value.is_number())
      return FieldError{"invalid_type",
                        name("logit_bias") + "[\"" + key + "\"] must be a number, got " + value.dump()};
    if (!(value.get<double>() >= -100 && value.get<double>() <= 100))
      return FieldError{"invalid_value",
                        name("logit_bias") + "[\"" + key + "\"] must be in [-100, 100], got " + value.dump()};
    s.logit_bias.emplace_back(id, value.get<float>());
  }
  return std::nullopt;
}

void read_sampling(const json& obj, const LineContext& ctx, SamplingParams& s) {
  if (obj.contains("max_new_tokens")) {
    const int64_t n = get_int(obj, "max_new_tokens", ctx);
    if (n < 1 || n > 1000000) ctx.fail("field 'max_new_tokens' must be in [1, 1000000], got " + std::to_string(n));
    s.max_new_tokens = int(n);
  }
  if (obj.contains("temperature")) {
    const double t = get_number(obj, "temperature", ctx);
    if (!(t >= 0 && t <= 100)) ctx.fail("field 'temperature' must be in [0, 100], got " + std::to_string(t));
    s.temperature = float(t);
  }
  if (obj.contains("top_p")) {
    const double p = get_number(obj, "top_p", ctx);
    if (!(p > 0 && p <= 1)) ctx.fail("field 'top_p' must be in (0, 1], got " + std::to_string(p));
    s.top_p = float(p);
  }
  if (obj.contains("top_k")) {
    const int64_t k = get_int(obj, "top_k", ctx);
    if (k < 0) ctx.fail("field 'top_k' must be >= 0, got " + std::to_string(k));
    s.top_k = int(std::min<int64_t>(k, 1 << 30));
  }
  if (obj.contains("seed")) {
    const json& v = obj["seed"];
    if (!v.is_number_integer() || (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0))
      ctx.fail("field 'seed' must be a non-negative integer, got " + v.dump());
    s.seed = v.get<uint64_t>();
  }
  if (obj.contains("ignore_eos")) {
    if (!obj["ignore_eos"].is_boolean()) ctx.fail("field 'ignore_eos' must be true or false");
    s.ignore_eos = obj["ignore_eos"].get<bool>();
  }
  auto field = [](const char* key) { return std::string("field '") + key + "'"; };
  if (const auto e = read_sampling_extensions(obj, field, s)) ctx.fail(e->message);
}

// "stop": a string or an array of strings. Returns the strings, or why not.
std::optional<std::vector<std::string>> parse_stop(const json& v, std::string& why) {
  std::vector<std::string> out;
  if (v.is_string()) {
    out.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    for (const json& e : v) {
      if (!e.is_string()) {
        why = "must be a string or an array of strings, got an element " + e.dump();
        return std::nullopt;
      }
      out.push_back(e.get<std::string>());
    }
  } else {
    why = "must be a string or an array of strings, got " + v.dump();
    return std::nullopt;
  }
  why = stop_strings_error(out);
  if (!why.empty()) return std::nullopt;
  return out;
}

// response_format, OpenAI's object in both formats: {"type": "text"} or {"type": "json_object"}
// (null: not given). json_schema is refused by name: a schema we did not enforce would pass for one
// we did.
std::optional<FieldError> read_response_format(const json& obj, const std::function<std::string(const char*)>& name,
                                               PromptRecord& r) {
  if (!obj.contains("response_format") || obj["response_format"].is_null()) return std::nullopt;
  const json& v = obj["response_format"];
  if (!v.is_object() || !v.contains("type") || !v["type"].is_string())
    return FieldError{"invalid_type", name("response_format") +
                                          " must be an object with a string \"type\" (\"text\" or \"json_object\"), got " +
                                          v.dump()};
  const std::string type = v["type"].get<std::string>();
  if (type == "text") r.response_format = ResponseFormat::Text;
  else if (type == "json_object") r.response_format = ResponseFormat::JsonObject;
  else if (type == "json_schema") {
    if (!v.contains("json_schema") || !v["json_schema"].is_object() || !v["json_schema"].contains("schema") ||
        !v["json_schema"]["schema"].is_object())
      return FieldError{"invalid_value", name("response_format") +
                                             " of type \"json_schema\" needs \"json_schema\": {\"schema\": {...}}"};
    r.response_format = ResponseFormat::JsonSchema;  // the schema is read in key order by read_json_schema
  } else {
    return FieldError{"invalid_value", name("response_format") +
                                           " type must be \"text\", \"json_object\" or \"json_schema\", got " +
                                           v["type"].dump()};
  }
  return std::nullopt;
}

// reasoning_effort (OpenAI's, in both formats): "low", "medium" or "high" (null: not given), what
// GPT-OSS's template writes in its system message; other templates do not read it.
std::optional<FieldError> read_reasoning_effort(const json& obj, const std::function<std::string(const char*)>& name,
                                                PromptRecord& r) {
  if (!obj.contains("reasoning_effort") || obj["reasoning_effort"].is_null()) return std::nullopt;
  const json& v = obj["reasoning_effort"];
  if (!v.is_string())
    return FieldError{"invalid_type", name("reasoning_effort") + " must be a string, got " + v.dump()};
  if (!valid_reasoning_effort(v.get<std::string>()))
    return FieldError{"invalid_value",
                      name("reasoning_effort") + " must be \"low\", \"medium\" or \"high\", got " + v.dump()};
  r.reasoning_effort = v.get<std::string>();
  return std::nullopt;
}

// chat_template_kwargs (vLLM's, in both formats): what a request passes to the chat template beside
// its messages. enable_thinking (Qwen3) and reasoning_effort (GPT-OSS, as the top-level field) are
// read here; any other is kept for an interpreted template (the job refuses it by name for the
// families Strata renders itself), but for the variables the job sets.
std::optional<FieldError> read_chat_template_kwargs(const json& obj,
                                                    const std::function<std::string(const char*)>& name,
                                                    PromptRecord& r) {
  if (!obj.contains("chat_template_kwargs") || obj["chat_template_kwargs"].is_null()) return std::nullopt;
  const json& v = obj["chat_template_kwargs"];
  const std::string field = name("chat_template_kwargs");
  if (!v.is_object()) return FieldError{"invalid_type", field + " must be an object, got " + v.dump()};
  for (const auto& [key, value] : v.items()) {
    if (key == "enable_thinking") {
      if (!value.is_boolean())
        return FieldError{"invalid_type", field + ".enable_thinking must be true or false, got " + value.dump()};
      r.enable_thinking = value.get<bool>();
    } else if (key == "reasoning_effort") {
      if (const auto e = read_reasoning_effort(v, [&](const char* k) { return field + "." + k; }, r)) return e;
    } else if (key == "messages" || key == "add_generation_prompt" || key == "bos_token" || key == "eos_token" ||
               key == "tools") {
      return FieldError{"invalid_value", field + "." + key + " is set by Strata, not by a request"};
    } else {
      r.template_kwargs.emplace_back(key, value.dump());
    }
  }
  return std::nullopt;
}

// A json_schema record's schema (response_format's, structured_outputs.json or guided_json), read
// again from the line's text with its keys in the order written (objects' properties keep it;
// nlohmann's json sorts them) and compiled, so that a schema Strata cannot hold answers to is
// refused before any output.
std::optional<FieldError> read_json_schema(std::string_view text, bool openai, PromptRecord& r) {
  const nlohmann::ordered_json line = nlohmann::ordered_json::parse(text);
  const SchemaSource source = structured_json_schema(openai ? line["body"] : line);
  try {
    compile_json_schema(source.schema);
  } catch (const JsonSchemaError& e) {
    return FieldError{"unsupported_value",
                      (openai ? "body." + source.field : "field '" + source.field + "'") + source.within + ": " +
                          e.what()};
  }
  r.json_schema = source.schema.dump();
  return std::nullopt;
}

using FieldName = std::function<std::string(const std::string&)>;

// tool_choice: "auto" (the default) reads answers for tool calls, "none" shows the tools but reads
// answers as text, {"type": "function", "function": {"name": N}} sets `named` to N and "required"
// sets r.tool_calls_required.
std::optional<FieldError> read_tool_choice(const json& obj, bool has_tools, const FieldName& field, PromptRecord& r,
                                           std::string& named) {
  if (!obj.contains("tool_choice") || obj["tool_choice"].is_null()) return std::nullopt;
  const json& c = obj["tool_choice"];
  const std::string choice = c.is_string() ? c.get<std::string>() : "";
  if (!c.is_string() && !c.is_object())
    return FieldError{"invalid_type", field("tool_choice") + " must be a string or an object, got " + c.dump()};
  if (c.is_string() && choice != "none" && choice != "auto" && choice != "required")
    return FieldError{"invalid_value",
                      field("tool_choice") + " must be \"none\", \"auto\", \"required\" or a function, got " + c.dump()};
  if (c.is_object()) {
    if (c.value("type", "") != "function" || !c.contains("function") || !c["function"].is_object() ||
        !c["function"].contains("name") || !c["function"]["name"].is_string())
      return FieldError{"invalid_value", field("tool_choice") +
                                             " must be {\"type\": \"function\", \"function\": {\"name\": ...}}, got " +
                                             c.dump()};
    named = c["function"]["name"].get<std::string>();
  }
  if (!has_tools && (c.is_object() || choice == "required"))
    return FieldError{"invalid_value", field("tool_choice") + " " + c.dump() + " needs tools"};
  r.tool_calls_required = choice == "required";
  r.read_tool_calls = choice != "none";
  return std::nullopt;
}

// tool_choice sets the answer's format: give no other beside it.
std::optional<FieldError> refuse_response_format(const PromptRecord& r, const FieldName& field) {
  if (r.response_format && *r.response_format != ResponseFormat::Text)
    return FieldError{"invalid_value", field("tool_choice") + " " +
                                           (r.tool_calls_required ? "\"required\" holds the answer to calls"
                                                                  : "names a function, whose parameters are") +
                                           " the answer's format: give no response_format or structured outputs "
                                           "beside it"};
  return std::nullopt;
}

// Tool i's parameters, a schema that answers are held to: unsupported_value naming the keyword
// Strata does not enforce.
std::optional<FieldError> check_parameters(const nlohmann::ordered_json& tools, size_t i, const FieldName& field) {
  try {
    compile_json_schema(tools[i]["function"]["parameters"]);
  } catch (const JsonSchemaError& e) {
    return FieldError{"unsupported_value", field("tools") + "[" + std::to_string(i) + "].function.parameters: " + e.what()};
  }
  return std::nullopt;
}

// A named function's answer is a document of its parameters (any JSON object when it has none),
// as vLLM's guided decoding holds it: the record's response format becomes that schema.
std::optional<FieldError> hold_to_named_tool(const nlohmann::ordered_json& tools, const std::string& named,
                                             const FieldName& field, PromptRecord& r) {
  if (const auto e = refuse_response_format(r, field)) return e;
  for (size_t i = 0; i < tools.size(); ++i) {
    const nlohmann::ordered_json& f = tools[i]["function"];
    if (f["name"] != named) continue;
    r.named_tool = named;
    if (!f.contains("parameters") || f["parameters"].is_null()) {
      r.response_format = ResponseFormat::JsonObject;
      return std::nullopt;
    }
    if (const auto e = check_parameters(tools, i, field)) return e;
    r.response_format = ResponseFormat::JsonSchema;
    r.json_schema = f["parameters"].dump();
    return std::nullopt;
  }
  return FieldError{"invalid_value", field("tool_choice") + " names '" + named + "', which is not in " + field("tools")};
}

// "required": the answer is a non-empty array of calls of the tools (required_tool_calls_schema).
std::optional<FieldError> hold_to_tool_calls(const nlohmann::ordered_json& tools, const FieldName& field,
                                             PromptRecord& r) {
  if (const auto e = refuse_response_format(r, field)) return e;
  for (size_t i = 0; i < tools.size(); ++i) {
    const nlohmann::ordered_json& f = tools[i]["function"];
    if (f.contains("parameters") && f["parameters"].is_object() && !f["parameters"].empty())
      if (const auto e = check_parameters(tools, i, field)) return e;
  }
  try {
    const nlohmann::ordered_json schema = required_tool_calls_schema(tools, r.parallel_tool_calls);
    compile_json_schema(schema);
    r.json_schema = schema.dump();
  } catch (const JsonSchemaError& e) {
    return FieldError{"unsupported_value", field("tools") + " with tool_choice \"required\": " + e.what()};
  }
  r.response_format = ResponseFormat::JsonSchema;
  return std::nullopt;
}

// tools and tool_choice (OpenAI's, in both formats; chat only). The tools are read again from the
// line's text so that each keeps its keys' order (the template prints them in it).
std::optional<FieldError> read_tools(std::string_view text, bool openai, const json& obj, PromptRecord& r) {
  const FieldName field = [openai](const std::string& key) { return openai ? "body." + key : "field '" + key + "'"; };
  const bool has_tools = obj.contains("tools") && !obj["tools"].is_null();
  if (obj.contains("parallel_tool_calls") && !obj["parallel_tool_calls"].is_null()) {
    if (!obj["parallel_tool_calls"].is_boolean())
      return FieldError{"invalid_type", field("parallel_tool_calls") + " must be a boolean, got " +
                                            obj["parallel_tool_calls"].dump()};
    r.parallel_tool_calls = obj["parallel_tool_calls"].get<bool>();
  }
  std::string named;
  if (const auto e = read_tool_choice(obj, has_tools, field, r, named)) return e;
  if (!has_tools) return std::nullopt;
  if (r.messages.empty()) return FieldError{"invalid_value", field("tools") + " are for chat messages"};
  const nlohmann::ordered_json line = nlohmann::ordered_json::parse(text);
  const nlohmann::ordered_json& tools = (openai ? line["body"] : line)["tools"];
  try {
    r.tools = read_chat_tools(tools, field("tools"));
  } catch (const ChatMessageError& e) {
    return FieldError{e.code, e.what()};
  }
  if (r.tool_calls_required) return hold_to_tool_calls(tools, field, r);
  return named.empty() ? std::nullopt : hold_to_named_tool(tools, named, field, r);
}

// The strata format's extensions beyond sampling: stop strings, choices, logprobs, the response
// format.
void read_strata_extras(const json& obj, const LineContext& ctx, PromptRecord& r) {
  auto field = [](const char* key) { return std::string("field '") + key + "'"; };
  if (const auto e = read_response_format(obj, field, r)) ctx.fail(e->message);
  if (const auto e = read_structured_outputs(obj, field, r)) ctx.fail(e->message);
  if (const auto e = read_reasoning_effort(obj, field, r)) ctx.fail(e->message);
  if (const auto e = read_chat_template_kwargs(obj, field, r)) ctx.fail(e->message);
  if (obj.contains("stop") && !obj["stop"].is_null()) {  // null: not given
    std::string why;
    r.stop = parse_stop(obj["stop"], why);
    if (!r.stop) ctx.fail("field 'stop' " + why);
  }
  if (obj.contains("n")) {
    const int64_t n = get_int(obj, "n", ctx);
    if (n < 1 || n > kMaxChoices)
      ctx.fail("field 'n' must be in [1, " + std::to_string(kMaxChoices) + "], got " + std::to_string(n));
    r.n = int(n);
  }
  if (obj.contains("logprobs")) {
    const int64_t k = get_int(obj, "logprobs", ctx);
    if (k < 0 || k > kMaxTopLogprobs)
      ctx.fail("field 'logprobs' must be in [0, " + std::to_string(kMaxTopLogprobs) + "], got " + std::to_string(k));
    r.logprobs = int(k);
  }
  if (obj.contains("prompt_logprobs") && !obj["prompt_logprobs"].is_null()) {
    const int64_t k = get_int(obj, "prompt_logprobs", ctx);
    if (k < 0 || k > kMaxTopLogprobs)
      ctx.fail("field 'prompt_logprobs' must be in [0, " + std::to_string(kMaxTopLogprobs) + "], got " + std::to_string(k));
    r.prompt_logprobs = int(k);
  }
}

std::vector<ChatMessage> read_messages(const json& v, const LineContext& ctx) {
  try {
    return read_chat_messages(v, "messages", /*text_parts=*/false);
  } catch (const ChatMessageError& e) {
    ctx.fail(e.what());
  }
}

// ---- The OpenAI batch format ----------------------------------------------------------------

const std::set<std::string> kOpenAITopKeys = {"custom_id", "method", "url", "body"};
// Body fields we read; top_k, min_p, repetition_penalty, min_tokens, stop_token_ids and ignore_eos
// are extensions (vLLM takes them too). response_format: "text" and "json_object".
const std::set<std::string> kOpenAIBodyKeys = {
    "model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop", "n",
    "logprobs", "top_logprobs", "prompt_logprobs", "echo", "stream", "frequency_penalty", "presence_penalty", "logit_bias", "top_k", "min_p",
    "repetition_penalty", "ignore_eos", "min_tokens", "stop_token_ids", "response_format",
    "reasoning_effort", "chat_template_kwargs", "tools", "tool_choice", "parallel_tool_calls", "structured_outputs",
    "guided_choice", "guided_regex", "guided_json", "guided_grammar", "guided_decoding_backend",
    "guided_whitespace_pattern"};

[[noreturn]] void refuse(const std::string& code, const std::string& message) { throw ServeError{code, message}; }

bool given(const json& body, const char* key) { return body.contains(key) && !body[key].is_null(); }

int64_t body_int(const json& body, const char* key) {
  const json& v = body[key];
  if (!v.is_number_integer()) refuse("invalid_type", std::string("body.") + key + " must be an integer, got " + v.dump());
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX))
    refuse("invalid_value", std::string("body.") + key + " is out of range: " + v.dump());
  return v.get<int64_t>();
}

double body_number(const json& body, const char* key) {
  const json& v = body[key];
  if (!v.is_number()) refuse("invalid_type", std::string("body.") + key + " must be a number, got " + v.dump());
  return v.get<double>();
}

void read_openai_body(const json& body, PromptRecord& r) {
  if (given(body, "model")) {
    if (!body["model"].is_string()) refuse("invalid_type", "body.model must be a string, got " + body["model"].dump());
    r.model = body["model"].get<std::string>();
  }
  if (r.endpoint == Endpoint::ChatCompletions) {
    if (body.contains("prompt")) refuse("invalid_value", "body.prompt is for /v1/completions; chat takes body.messages");
    if (!body.contains("messages")) refuse("missing_field", "body.messages is required for /v1/chat/completions");
    try {
      r.messages = read_chat_messages(body["messages"], "body.messages", /*text_parts=*/true);
    } catch (const ChatMessageError& e) {
      refuse(e.code, e.what());
    }
  } else {
    if (body.contains("messages")) refuse("invalid_value", "body.messages is for /v1/chat/completions; completions take body.prompt");
    if (!body.contains("prompt")) refuse("missing_field", "body.prompt is required for /v1/completions");
    json p = body["prompt"];
    auto is_ids = [](const json& v) {
      return v.is_array() && !v.empty() && std::all_of(v.begin(), v.end(), [](const json& t) { return t.is_number_integer(); });
    };
    // One prompt: a string or token ids (OpenAI's four forms: a string, a list of strings, a list of
    // ids, a list of id lists), in `text` or `ids`; `where` names it in errors.
    auto one_prompt = [&](const json& v, const std::string& where, PromptRecord::Part& out) {
      if (is_ids(v)) {
        for (const json& t : v) {
          if (t.is_number_unsigned() ? t.get<uint64_t>() > uint64_t(INT32_MAX) : t.get<int64_t>() < 0)
            refuse("invalid_value", where + " token id " + t.dump() + " is not a token id");
          out.ids.push_back(int32_t(t.get<int64_t>()));
        }
        return;
      }
      if (!v.is_string()) refuse("invalid_type", where + " must be a string or token ids, got " + v.dump());
      out.text = v.get<std::string>();
      if (out.text.empty()) refuse("invalid_value", where + " is empty");
    };
    if (p.is_array() && p.empty()) refuse("invalid_value", "body.prompt is empty");
    if (p.is_array() && !is_ids(p)) {  // a list of prompts
      if (p.size() > size_t(kMaxCompletionPrompts))
        refuse("invalid_value", "body.prompt holds " + std::to_string(p.size()) + " prompts; at most " +
                                    std::to_string(kMaxCompletionPrompts) + " in one request");
      for (size_t i = 0; i < p.size(); ++i) {
        r.prompts.push_back({});
        one_prompt(p[i], "body.prompt[" + std::to_string(i) + "]", r.prompts.back());
      }
      if (r.prompts.size() == 1) {  // one prompt in a list: as if given alone
        r.prompt = std::move(r.prompts[0].text);
        r.prompt_ids = std::move(r.prompts[0].ids);
        r.prompts.clear();
      }
    } else {
      PromptRecord::Part one;
      one_prompt(p, "body.prompt", one);
      r.prompt = std::move(one.text);
      r.prompt_ids = std::move(one.ids);
    }
  }
  const bool chat = r.endpoint == Endpoint::ChatCompletions;
  if (given(body, "echo")) {
    if (!body["echo"].is_boolean()) refuse("invalid_type", "body.echo must be true or false");
    r.echo = body["echo"].get<bool>();
    if (r.echo && chat)
      refuse("unsupported_value", "body.echo is for /v1/completions (chat's echo of the last message is not supported)");
  }

  SamplingParams& s = r.sampling;
  if (given(body, "max_tokens") && given(body, "max_completion_tokens") &&
      body["max_tokens"] != body["max_completion_tokens"])
    refuse("invalid_value", "body.max_tokens and body.max_completion_tokens disagree; give one");
  for (const char* key : {"max_completion_tokens", "max_tokens"})
    if (given(body, key)) {
      const int64_t n = body_int(body, key);
      if ((n < 1 && !(n == 0 && r.echo)) || n > 1000000)
        refuse("invalid_value", std::string("body.") + key + " must be in [1, 1000000] (0 with echo: the prompt alone), got " +
                                    std::to_string(n));
      r.prompt_only = n == 0;
      s.max_new_tokens = std::max(int(n), 1);  // the prompt alone still draws one token, dropped
      break;
    }
  if (given(body, "temperature")) {
    const double t = body_number(body, "temperature");
    if (!(t >= 0 && t <= 2)) refuse("invalid_value", "body.temperature must be in [0, 2], got " + body["temperature"].dump());
    s.temperature = float(t);
  }
  if (given(body, "top_p")) {
    const double p = body_number(body, "top_p");
    if (!(p > 0 && p <= 1)) refuse("invalid_value", "body.top_p must be in (0, 1], got " + body["top_p"].dump());
    s.top_p = float(p);
  }
  if (given(body, "top_k")) {
    const int64_t k = body_int(body, "top_k");
    if (k < -1) refuse("invalid_value", "body.top_k must be >= 0 (or -1: off), got " + std::to_string(k));
    s.top_k = k <= 0 ? 0 : int(std::min<int64_t>(k, 1 << 30));
  }
  if (given(body, "seed")) s.seed = uint64_t(body_int(body, "seed"));  // negative seeds wrap: any int64 is a seed
  if (given(body, "ignore_eos")) {
    if (!body["ignore_eos"].is_boolean()) refuse("invalid_type", "body.ignore_eos must be true or false");
    s.ignore_eos = body["ignore_eos"].get<bool>();
  }
  auto field = [](const char* key) { return std::string("body.") + key; };
  if (const auto e = read_sampling_extensions(body, field, s)) refuse(e->code, e->message);
  if (const auto e = read_response_format(body, field, r)) refuse(e->code, e->message);
  if (const auto e = read_structured_outputs(body, field, r)) refuse(e->code, e->message);
  if (const auto e = read_reasoning_effort(body, field, r)) refuse(e->code, e->message);
  if (const auto e = read_chat_template_kwargs(body, field, r)) refuse(e->code, e->message);
  if (given(body, "n")) {
    const int64_t n = body_int(body, "n");
    if (n < 1 || n > kMaxChoices)
      refuse("invalid_value", "body.n must be in [1, " + std::to_string(kMaxChoices) + "], got " + std::to_string(n));
    r.n = int(n);
  }
  if (given(body, "stop")) {  // null: not given (the job's --stop applies); []: none
    std::string why;
    r.stop = parse_stop(body["stop"], why);
    if (!r.stop) refuse(why.rfind("must be", 0) == 0 ? "invalid_type" : "invalid_value", "body.stop " + why);
  }
  if (given(body, "logprobs")) {
    const json& v = body["logprobs"];
    if (chat) {
      if (!v.is_boolean()) refuse("invalid_type", "body.logprobs must be true or false for chat completions");
      if (v.get<bool>()) r.logprobs = 0;
    } else {
      const int64_t k = body_int(body, "logprobs");
      if (k < 0 || k > kMaxCompletionLogprobs)
        refuse("invalid_value", "body.logprobs must be in [0, " + std::to_string(kMaxCompletionLogprobs) +
                                    "] for completions, got " + std::to_string(k));
      r.logprobs = int(k);
    }
  }
  if (given(body, "top_logprobs")) {
    if (!chat) refuse("invalid_value", "body.top_logprobs is for /v1/chat/completions; completions take body.logprobs");
    const int64_t k = body_int(body, "top_logprobs");
    if (k < 0 || k > kMaxTopLogprobs)
      refuse("invalid_value", "body.top_logprobs must be in [0, " + std::to_string(kMaxTopLogprobs) + "], got " +
                                  std::to_string(k));
    if (r.logprobs < 0) refuse("invalid_value", "body.top_logprobs needs body.logprobs set to true");
    r.logprobs = int(k);
  }
  if (given(body, "prompt_logprobs")) {
    const int64_t k = body_int(body, "prompt_logprobs");
    if (k < 0 || k > kMaxTopLogprobs)
      refuse("invalid_value", "body.prompt_logprobs must be in [0, " + std::to_string(kMaxTopLogprobs) + "], got " +
                                  std::to_string(k));
    r.prompt_logprobs = int(k);
  } else if (r.echo && r.logprobs >= 0) {
    r.prompt_logprobs = r.logprobs;  // vLLM's: the echoed prompt's tokens carry logprobs too
  }
  if (given(body, "stream")) {
    if (!body["stream"].is_boolean()) refuse("invalid_type", "body.stream must be true or false");
    if (body["stream"].get<bool>()) refuse("unsupported_parameter", "body.stream is not supported in a batch");
  }
}

Endpoint pooled_endpoint(EmbeddingUse use) {
  switch (use) {
    case EmbeddingUse::Embed: return Endpoint::Embeddings;
    case EmbeddingUse::Score: return Endpoint::Score;
    case EmbeddingUse::Rerank: return Endpoint::Rerank;
    case EmbeddingUse::Classify: return Endpoint::Classify;
  }
  return Endpoint::Embeddings;
}

// The pooled request a url asks for (embeddings, scores, reranking, classification); nullopt for
// any other url.
std::optional<EmbeddingUse> pooled_use(const std::string& url) {
  if (url == "/v1/embeddings") return EmbeddingUse::Embed;
  if (url == "/v1/score") return EmbeddingUse::Score;
  if (url == "/v1/rerank") return EmbeddingUse::Rerank;
  if (url == "/v1/classify") return EmbeddingUse::Classify;
  return std::nullopt;
}

void read_openai_embeddings(const json& body, PromptRecord& r, EmbeddingUse use) {
  if (given(body, "model")) {
    if (!body["model"].is_string()) refuse("invalid_type", "body.model must be a string, got " + body["model"].dump());
    r.model = body["model"].get<std::string>();
  }
  auto field = [](const char* key) { return std::string("body.") + key; };
  if (auto e = read_embedding_request(body, field, r, use)) throw std::move(*e);
}

// Malformed lines (no string custom_id, no object body, no string url) refuse the file; a
// well-formed request that cannot be served keeps its error in r.error.
void read_openai_line(const json& obj, const LineContext& ctx, PromptRecord& r, std::set<std::string>& warned,
                      const std::function<void(const std::string&)>& warn) {
  if (!obj.contains("custom_id")) ctx.fail("missing field 'custom_id'");
  if (!obj["custom_id"].is_string()) ctx.fail("field 'custom_id' must be a string, got " + obj["custom_id"].dump());
  if (obj["custom_id"].get_ref<const std::string&>().empty()) ctx.fail("field 'custom_id' is empty");
  r.id = obj["custom_id"];
  r.id_key = r.id.dump();
  if (!obj.contains("body")) ctx.fail("missing field 'body'");
  if (!obj["body"].is_object()) ctx.fail("field 'body' must be an object, got " + std::string(obj["body"].type_name()));
  if (!obj.contains("url")) ctx.fail("missing field 'url'");
  if (!obj["url"].is_string()) ctx.fail("field 'url' must be a string, got " + obj["url"].dump());
  if (obj.contains("method") && !obj["method"].is_string())
    ctx.fail("field 'method' must be a string, got " + obj["method"].dump());
  for (const auto& [key, value] : obj.items())
    if (!kOpenAITopKeys.count(key) && warned.insert(key).second && warn)
      warn(ctx.where + ": ignoring unknown field '" + key + "'");
  const json& body = obj["body"];
  const std::string url = obj["url"].get<std::string>();
  // Embeddings and the scores over them (vLLM's): their fields, not a completion's.
  const std::optional<EmbeddingUse> pooled = pooled_use(url);
  for (const auto& [key, value] : body.items()) {
    const bool known = pooled ? key == "model" || embedding_fields(*pooled).count(key) : kOpenAIBodyKeys.count(key) > 0;
    if (!known && warned.insert(url + " body." + key).second && warn)
      warn(ctx.where + ": ignoring unknown field 'body." + key + "'" + (pooled ? " (for " + url + ")" : ""));
  }
  try {
    if (url == "/v1/chat/completions") r.endpoint = Endpoint::ChatCompletions;
    else if (url == "/v1/completions") r.endpoint = Endpoint::Completions;
    else if (pooled)
      r.endpoint = pooled_endpoint(*pooled);
    else
      refuse("unsupported_url", "url " + obj["url"].dump() +
                                    " is not supported; use /v1/chat/completions, /v1/completions, /v1/embeddings, "
                                    "/v1/score, /v1/rerank or /v1/classify");
    if (obj.contains("method") && obj["method"] != "POST")
      refuse("unsupported_method", "method " + obj["method"].dump() + " is not supported; use \"POST\"");
    if (pooled) read_openai_embeddings(body, r, *pooled);
    else read_openai_body(body, r);
  } catch (ServeError& e) {
    r.prompt.clear();
    r.messages.clear();
    r.embedding.reset();
    r.error = std::move(e);
  }
}

InputFormat line_format(const json& obj) {
  return obj.contains("custom_id") || obj.contains("body") ? InputFormat::OpenAIBatch : InputFormat::Strata;
}

const char* format_name(InputFormat f) { return f == InputFormat::OpenAIBatch ? "the OpenAI batch format" : "the strata format"; }

}  // namespace

PromptLineParser::PromptLineParser(std::string file, const SamplingParams& defaults,
                                   std::function<void(const std::string&)> warn)
    : file_(std::move(file)), defaults_(defaults), warn_(std::move(warn)) {}

std::optional<PromptRecord> PromptLineParser::parse(std::string_view text, int line_no) {
  if (!text.empty() && text.back() == '\r') text.remove_suffix(1);
  if (text.find_first_not_of(" \t") == std::string_view::npos) return std::nullopt;
  LineContext ctx{file_ + ":" + std::to_string(line_no)};
  json obj;
  try {
    obj = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number like 1e400
    ctx.fail(std::string("invalid JSON: ") + e.what());
  }
  if (!obj.is_object()) ctx.fail("expected a JSON object, got " + std::string(obj.type_name()));
  PromptRecord r;
  r.line = line_no;
  r.format = line_format(obj);
  if (!format_) {
    format_ = r.format;
    first_line_ = line_no;
  } else if (*format_ != r.format) {
    ctx.fail(std::string("this line is in ") + format_name(r.format) + ", but line " + std::to_string(first_line_) +
             " is in " + format_name(*format_) + "; a file must not mix formats");
  }
  r.sampling = defaults_;
  if (r.format == InputFormat::OpenAIBatch) {
    read_openai_line(obj, ctx, r, warned_keys_, warn_);
    if (!r.error && r.response_format == ResponseFormat::JsonSchema)
      if (const auto e = read_json_schema(text, /*openai=*/true, r)) r.error = ServeError{e->code, e->message};
    if (!r.error && obj.contains("body") && obj["body"].is_object())
      if (const auto e = read_tools(text, /*openai=*/true, obj["body"], r)) r.error = ServeError{e->code, e->message};
    return r;
  }
  if (!obj.contains("id")) ctx.fail("missing field 'id' (or 'custom_id', for the OpenAI batch format)");
  if (!obj["id"].is_string() && !obj["id"].is_number_integer())
    ctx.fail("field 'id' must be a string or an integer, got " + obj["id"].dump());
  r.id = obj["id"];
  r.id_key = r.id.dump();
  const bool has_prompt = obj.contains("prompt"), has_messages = obj.contains("messages");
  if (has_prompt && has_messages) ctx.fail("give either 'prompt' or 'messages', not both");
  // An embeddings request ("input"), a score ("text_1") or rerank ("query") over embeddings, or a
  // classification ("classify").
  const std::optional<EmbeddingUse> pooled = obj.contains("input")      ? std::optional(EmbeddingUse::Embed)
                                             : obj.contains("text_1")   ? std::optional(EmbeddingUse::Score)
                                             : obj.contains("query")    ? std::optional(EmbeddingUse::Rerank)
                                             : obj.contains("classify") ? std::optional(EmbeddingUse::Classify)
                                                                        : std::nullopt;
  if (pooled) {
    const char* what = *pooled == EmbeddingUse::Embed    ? "'input' (an embedding)"
                       : *pooled == EmbeddingUse::Score  ? "'text_1' (a score)"
                       : *pooled == EmbeddingUse::Rerank ? "'query' (a rerank)"
                                                         : "'classify' (a classification)";
    const std::set<std::string>& fields = embedding_fields(*pooled, InputFormat::Strata);
    if (has_prompt || (has_messages && !fields.count("messages")))
      ctx.fail(std::string("give ") + what + " or 'prompt' / 'messages' (an answer), not both");
    for (const char* other : {"input", "text_1", "query", "classify"})
      if (obj.contains(other) && fields.count(other) == 0)
        ctx.fail(std::string("give ") + what + " or '" + other + "', not both");
    auto field = [](const char* key) { return std::string("field '") + key + "'"; };
    if (const auto e = read_embedding_request(obj, field, r, *pooled)) ctx.fail(e->message);
    r.endpoint = pooled_endpoint(*pooled);
    for (const auto& [key, value] : obj.items())
      if (key != "id" && !fields.count(key) && warned_keys_.insert("pooled " + key).second && warn_)
        warn_(ctx.where + ": ignoring unknown field '" + key + "' (for " + what + ")");
    return r;
  }
  if (has_prompt) {
    if (!obj["prompt"].is_string()) ctx.fail("field 'prompt' must be a string, got " + obj["prompt"].dump());
    r.prompt = obj["prompt"].get<std::string>();
    if (r.prompt.empty()) ctx.fail("field 'prompt' is empty");
  } else if (has_messages) {
    r.messages = read_messages(obj["messages"], ctx);
  } else {
    ctx.fail("missing field 'prompt' (or 'messages'; 'input' for an embedding, 'classify' for a classification)");
  }
  read_sampling(obj, ctx, r.sampling);
  read_strata_extras(obj, ctx, r);
  if (r.response_format == ResponseFormat::JsonSchema)
    if (const auto e = read_json_schema(text, /*openai=*/false, r)) ctx.fail(e->message);
  if (const auto e = read_tools(text, /*openai=*/false, obj, r)) ctx.fail(e->message);
  for (const auto& [key, value] : obj.items())
    if (!kKnownKeys.count(key) && warned_keys_.insert(key).second && warn_)
      warn_(ctx.where + ": ignoring unknown field '" + key + "'" + strata_name_hint(key));
  return r;
}

std::vector<PromptRecord> completion_parts(const PromptRecord& r) {
  if (r.prompts.empty()) return {r};
  std::vector<PromptRecord> out;
  PromptRecord one = r;
  one.prompts.clear();
  one.parts = int(r.prompts.size());
  for (size_t i = 0; i < r.prompts.size(); ++i) {
    one.part = int(i);
    one.prompt = r.prompts[i].text;
    one.prompt_ids = r.prompts[i].ids;
    out.push_back(one);
  }
  return out;
}

std::string duplicate_id_message(const PromptRecord& r) {
  return (r.format == InputFormat::OpenAIBatch ? "duplicate custom_id " : "duplicate id ") + r.id_key;
}

std::vector<PromptRecord> read_prompts(const std::filesystem::path& file, const SamplingParams& defaults,
                                       const std::function<void(const std::string&)>& warn) {
  std::ifstream in(file);
  if (!in) STRATA_FAIL("cannot open prompts file " << file.string());
  return read_prompts(in, file.string(), defaults, warn);
}

std::vector<PromptRecord> read_prompts(std::istream& in, const std::string& source, const SamplingParams& defaults,
                                       const std::function<void(const std::string&)>& warn) {
  std::vector<PromptRecord> records;
  std::unordered_set<std::string> seen_ids;
  PromptLineParser parser(source, defaults, warn);
  std::string text;
  int line_no = 0;
  while (std::getline(in, text)) {
    std::optional<PromptRecord> r = parser.parse(text, ++line_no);
    if (!r) continue;
    if (!seen_ids.insert(r->id_key).second)
      throw Error(source + ":" + std::to_string(line_no) + ": " + duplicate_id_message(*r));
    records.push_back(std::move(*r));
  }
  if (in.bad()) STRATA_FAIL("error reading " << source);
  return records;
}

std::string stop_strings_error(const std::vector<std::string>& stop) {
  if (stop.size() > size_t(kMaxStopStrings))
    return "holds " + std::to_string(stop.size()) + " strings; at most " + std::to_string(kMaxStopStrings) + " are allowed";
  for (const std::string& s : stop)
    if (s.empty()) return "holds an empty string";
  return "";
}

uint64_t fnv1a64(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string id_text(const json& id) { return id.is_string() ? id.get<std::string>() : id.dump(); }

Shard parse_shard(const std::string& text) {
  const size_t slash = text.find('/');
  Shard s;
  auto number = [&](std::string_view part, uint64_t& v) {
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
    return ec == std::errc() && end == part.data() + part.size() && !part.empty();
  };
  const std::string_view all(text);
  if (slash == std::string::npos || !number(all.substr(0, slash), s.index) || !number(all.substr(slash + 1), s.count) ||
      s.count < 1 || s.index >= s.count)
    STRATA_FAIL("--shard must be i/N with 0 <= i < N, got '" << text << "'");
  return s;
}

}  // namespace strata
