#include "structured_outputs.h"

#include <mutex>
#include <unordered_set>

#include "strata/runtime/regex_rules.h"

namespace strata {

using json = nlohmann::json;

namespace {

bool given(const json& obj, const char* key) { return obj.contains(key) && !obj[key].is_null(); }

ServeError error(const char* code, std::string message) { return ServeError{code, std::move(message)}; }

// A regex compiles (refusals name the offset); patterns that did are kept, so that a file of a
// million lines sharing one compiles it once.
std::optional<std::string> regex_refusal(const std::string& pattern) {
  static std::mutex mutex;
  static std::unordered_set<std::string> compiled;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (compiled.count(pattern)) return std::nullopt;
  }
  try {
    compile_regex(pattern);
  } catch (const RegexError& e) {
    return std::string(e.what());
  }
  std::lock_guard<std::mutex> lock(mutex);
  if (compiled.size() >= 1024) compiled.clear();
  compiled.insert(pattern);
  return std::nullopt;
}

std::optional<ServeError> read_choice(const json& v, const std::string& name, PromptRecord& r) {
  if (!v.is_array() || v.empty())
    return error("invalid_type", name + " must be a non-empty array of strings, got " + v.dump());
  for (const json& c : v)
    if (!c.is_string()) return error("invalid_type", name + " must hold strings, got " + c.dump());
  r.response_format = ResponseFormat::Choice;
  r.pattern = v.dump();
  return std::nullopt;
}

std::optional<ServeError> read_regex(const json& v, const std::string& name, PromptRecord& r) {
  if (!v.is_string()) return error("invalid_type", name + " must be a string, got " + v.dump());
  if (const auto why = regex_refusal(v.get<std::string>())) return error("unsupported_value", name + ": " + *why);
  r.response_format = ResponseFormat::Regex;
  r.pattern = v.get<std::string>();
  return std::nullopt;
}

std::optional<ServeError> read_json(const json& v, const std::string& name, PromptRecord& r) {
  if (!v.is_object() && !v.is_string())
    return error("invalid_type", name + " must be a JSON schema (an object, or its text), got " + v.dump());
  if (v.is_string() && !json::accept(v.get<std::string>()))
    return error("invalid_value", name + " is a string but not a JSON schema's text");
  r.response_format = ResponseFormat::JsonSchema;  // the schema is read in key order by structured_json_schema
  return std::nullopt;
}

// vLLM's StructuredOutputsParams: one constraint of choice, regex, json, json_object; its other
// constraints and options are refused by name.
std::optional<ServeError> read_params(const json& v, const std::string& name, PromptRecord& r) {
  if (!v.is_object()) return error("invalid_type", name + " must be an object, got " + v.dump());
  int constraints = 0;
  for (const auto& [key, value] : v.items()) {
    if (value.is_null()) continue;
    const std::string at = name + "." + key;
    if (key == "choice" || key == "regex" || key == "json" || key == "json_object") {
      if (++constraints > 1)
        return error("invalid_value", name + " must give one of choice, regex, json and json_object, not several");
      if (key == "choice") {
        if (auto e = read_choice(value, at, r)) return e;
      } else if (key == "regex") {
        if (auto e = read_regex(value, at, r)) return e;
      } else if (key == "json") {
        if (auto e = read_json(value, at, r)) return e;
      } else {
        if (!value.is_boolean()) return error("invalid_type", at + " must be true or false, got " + value.dump());
        if (!value.get<bool>()) --constraints;
        else r.response_format = ResponseFormat::JsonObject;
      }
    } else if (key == "grammar" || key == "structural_tag" || key == "whitespace_pattern") {
      return error("unsupported_value", at + " is not supported (choice, regex, json and json_object are)");
    } else if (key == "disable_any_whitespace" || key == "disable_additional_properties") {
      if (!value.is_boolean()) return error("invalid_type", at + " must be true or false, got " + value.dump());
      if (value.get<bool>()) return error("unsupported_value", at + " true is not supported");
    } else if (key == "disable_fallback") {
      if (!value.is_boolean()) return error("invalid_type", at + " must be true or false, got " + value.dump());
    } else {
      return error("invalid_value", name + " has an unknown field '" + key + "'");
    }
  }
  if (constraints == 0) return error("invalid_value", name + " gives no constraint (choice, regex, json or json_object)");
  return std::nullopt;
}

}  // namespace

std::optional<ServeError> read_structured_outputs(const json& obj, const std::function<std::string(const char*)>& field,
                                                  PromptRecord& r) {
  const char* sources[] = {"structured_outputs", "guided_choice", "guided_regex", "guided_json", "guided_grammar"};
  const char* source = nullptr;
  for (const char* key : sources) {
    if (!given(obj, key)) continue;
    if (source)
      return error("invalid_value", "give one of " + field(source) + " and " + field(key) + ", not both");
    source = key;
  }
  if (given(obj, "guided_whitespace_pattern"))
    return error("unsupported_value", field("guided_whitespace_pattern") + " is not supported");
  if (given(obj, "guided_decoding_backend") && !obj["guided_decoding_backend"].is_string())
    return error("invalid_type", field("guided_decoding_backend") + " must be a string");
  if (!source) return std::nullopt;
  if (r.response_format && *r.response_format != ResponseFormat::Text)
    return error("invalid_value", "give either " + field("response_format") + " or " + field(source) + ", not both");
  const std::string name = field(source);
  const json& v = obj[source];
  const std::string key = source;
  if (key == "structured_outputs") return read_params(v, name, r);
  if (key == "guided_choice") return read_choice(v, name, r);
  if (key == "guided_regex") return read_regex(v, name, r);
  if (key == "guided_json") return read_json(v, name, r);
  return error("unsupported_value", name + " is not supported (guided_choice, guided_regex and guided_json are)");
}

SchemaSource structured_json_schema(const nlohmann::ordered_json& obj) {
  auto given_ordered = [&](const char* key) { return obj.contains(key) && !obj[key].is_null(); };
  auto schema_of = [](const nlohmann::ordered_json& v) {
    return v.is_string() ? nlohmann::ordered_json::parse(v.get<std::string>()) : v;
  };
  if (given_ordered("structured_outputs")) return {schema_of(obj["structured_outputs"]["json"]), "structured_outputs", ".json"};
  if (given_ordered("guided_json")) return {schema_of(obj["guided_json"]), "guided_json", ""};
  return {obj["response_format"]["json_schema"]["schema"], "response_format", ".json_schema.schema"};
}

}  // namespace strata
