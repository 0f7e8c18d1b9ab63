// libFuzzer entry for the Jinja interpreter (strata::JinjaTemplate, the chat templates Strata
// executes). The input is split at its first "\n----\n": the template source before it, and after
// it a JSON object of variables (anything else there, or no separator: a fixed conversation with
// tools, as transformers passes them). A template that parses is rendered twice; traps where the
// two renders differ. strata::JinjaError (and its JinjaRaised) is the expected way to refuse;
// anything else escaping (another exception, a crash, a hang) is a bug.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "strata/model/jinja.h"

namespace {

const nlohmann::ordered_json& fixed_variables() {
  static const nlohmann::ordered_json v = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Weather in Paris? \u00e9\u2603"},
      {"role": "assistant", "content": "<think>\ncall it\n</think>\n\n", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "n": [1, 2.5, null]}}}]},
      {"role": "tool", "content": "22 C"},
      {"role": "assistant", "content": "It is 22 C.", "reasoning_content": "easy"}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "The weather.",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "enable_thinking": false,
    "big": 18446744073709551615, "neg": -9223372036854775808, "f": 1e-7})");
  return v;
}

std::optional<std::string> render(const strata::JinjaTemplate& t, const nlohmann::ordered_json& variables,
                                  const strata::JinjaGlobals& globals) {
  try {
    return t.render(variables, globals);
  } catch (const strata::JinjaError&) {
    return std::nullopt;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  constexpr std::string_view kSeparator = "\n----\n";
  const size_t cut = input.find(kSeparator);
  std::optional<strata::JinjaTemplate> t;
  try {
    t = strata::JinjaTemplate::parse(input.substr(0, cut));
  } catch (const strata::JinjaError&) {
    return 0;
  }
  nlohmann::ordered_json variables;
  if (cut != std::string_view::npos)
    variables = nlohmann::ordered_json::parse(input.substr(cut + kSeparator.size()), nullptr, /*allow_exceptions=*/false);
  if (!variables.is_object()) variables = fixed_variables();
  strata::JinjaGlobals globals;
  globals.strftime_now = [](const std::string& format) { return "26 Jul 2024 " + format; };
  const std::optional<std::string> first = render(*t, variables, globals), second = render(*t, variables, globals);
  if (first != second) __builtin_trap();
  return 0;
}
