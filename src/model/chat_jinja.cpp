// Chat templates of no known family, run by the Jinja interpreter with what transformers'
// apply_chat_template passes them, the messages as vLLM hands them over: a null content as "", a
// tool call's arguments parsed from their JSON text into the object.
#include <nlohmann/json.hpp>

#include "strata/model/chat_json.h"
#include "strata/model/chat_template.h"
#include "strata/model/jinja.h"

namespace strata {

namespace {

using ordered_json = nlohmann::ordered_json;

// JSON text as the value json.loads makes of it; python_tojson checks it first for what the
// parser would let through silently (an integer beyond 64 bits, nesting too deep to print).
ordered_json loaded(const std::string& text, const std::string& what) {
  try {
    python_tojson(text);
  } catch (const ChatTemplateError& e) {
    throw ChatTemplateError(what + ": " + e.what());
  }
  return ordered_json::parse(text);
}

ordered_json message_json(const ChatMessage& m) {
  ordered_json out = {{"role", m.role}, {"content", m.content}};
  if (m.name) out["name"] = *m.name;
  if (m.tool_call_id) out["tool_call_id"] = *m.tool_call_id;
  if (m.reasoning_content) out["reasoning_content"] = *m.reasoning_content;
  if (m.tool_calls.empty()) return out;
  ordered_json calls = ordered_json::array();
  for (const ChatToolCall& call : m.tool_calls) {
    ordered_json c = ordered_json::object();
    if (!call.id.empty()) c["id"] = call.id;
    c["type"] = "function";
    c["function"] = {{"name", call.name},
                     {"arguments", loaded(call.arguments, "the arguments of tool call '" + call.name + "'")}};
    calls.push_back(std::move(c));
  }
  out["tool_calls"] = std::move(calls);
  return out;
}

}  // namespace

ChatTemplate ChatTemplate::interpreted(std::string_view source, ChatTokens tokens) {
  // It would render every conversation as nothing: a model without a chat template.
  if (source.find_first_not_of(" \t\r\n") == std::string_view::npos) STRATA_FAIL("the chat template is empty");
  ChatTemplate t;
  t.format_ = ChatFormat::Jinja;
  t.tokens_ = std::move(tokens);
  t.source_ = std::string(source);
  try {
    t.jinja_ = std::make_shared<const JinjaTemplate>(JinjaTemplate::parse(source));
  } catch (const JinjaError& e) {
    STRATA_FAIL("chat template: " << e.what());
  }
  return t;
}

bool ChatTemplate::renders_tools() const {
  if (format_ == ChatFormat::Jinja) return jinja_->mentions("tools");
  return format_ == ChatFormat::Qwen25 || format_ == ChatFormat::Qwen3 || format_ == ChatFormat::Llama31;
}

std::string ChatTemplate::render_jinja(const std::vector<ChatMessage>& messages, bool gen,
                                       const ChatOptions& options) const {
  ordered_json vars = {{"messages", ordered_json::array()},
                       {"add_generation_prompt", gen},
                       {"bos_token", tokens_.bos},
                       {"eos_token", tokens_.eos}};
  for (const ChatMessage& m : messages) vars["messages"].push_back(message_json(m));
  if (!options.tools.empty()) {
    ordered_json tools = ordered_json::array();
    for (size_t i = 0; i < options.tools.size(); ++i)
      tools.push_back(loaded(options.tools[i], "tools[" + std::to_string(i) + "]"));
    vars["tools"] = std::move(tools);
  }
  // Only what the request sets, so that a template's `is defined` checks see what it would see.
  if (options.enable_thinking) vars["enable_thinking"] = *options.enable_thinking;
  if (!options.reasoning_effort.empty()) vars["reasoning_effort"] = options.reasoning_effort;
  for (const auto& [name, value] : options.variables) vars[name] = loaded(value, "chat_template_kwargs." + name);
  JinjaGlobals globals;
  if (!today_.empty()) globals.strftime_now = [today = today_](const std::string&) { return today; };
  try {
    return jinja_->render(vars, globals);
  } catch (const JinjaRaised& e) {  // the template's own refusal, in its words
    throw ChatTemplateError(e.what());
  } catch (const JinjaError& e) {
    throw ChatTemplateError(std::string("chat template: ") + e.what());
  }
}

}  // namespace strata
