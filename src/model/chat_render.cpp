// Chat template rendering, one function a family, each following its Jinja template step by step
// (the template's text is in tests/fixtures/chat/make_chat_cases.py), so that the output and the
// conversations it refuses are transformers' to the byte.
#include <nlohmann/json.hpp>
#include <optional>

#include "strata/model/chat_json.h"
#include "strata/model/chat_template.h"

namespace strata {

namespace {

// Python's str.strip() (Jinja's trim): the code points str.isspace() accepts, at both ends.
// Every byte of a multi-byte space is checked, so a truncated or invalid sequence (bytes Python
// could not have decoded) is never a space, nor reaches past the end.
bool python_space_at(std::string_view s, size_t i, size_t& len) {
  const auto b = [&](size_t k) { return k < s.size() ? static_cast<unsigned char>(s[k]) : 0u; };
  const unsigned c = b(i);
  len = 1;
  if (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f)) return true;
  if (c == 0xc2 && (b(i + 1) == 0x85 || b(i + 1) == 0xa0)) return len = 2, true;
  if (c == 0xe1 && b(i + 1) == 0x9a && b(i + 2) == 0x80) return len = 3, true;  // U+1680
  if (c == 0xe3 && b(i + 1) == 0x80 && b(i + 2) == 0x80) return len = 3, true;  // U+3000
  if (c == 0xe2) {
    const unsigned c1 = b(i + 1), c2 = b(i + 2);
    len = 3;
    if (c1 == 0x80 && ((c2 >= 0x80 && c2 <= 0x8a) || c2 == 0xa8 || c2 == 0xa9 || c2 == 0xaf))
      return true;                              // U+2000..200A, 2028/9, 202F
    if (c1 == 0x81 && c2 == 0x9f) return true;  // U+205F
  }
  return false;
}

std::string trim(std::string_view s) {
  size_t begin = 0, len = 0;
  while (begin < s.size() && python_space_at(s, begin, len)) begin += len;
  // From the end: find the last code point that is not a space by walking forward.
  size_t end = begin;
  for (size_t i = begin; i < s.size();) {
    if (python_space_at(s, i, len)) {
      i += len;
    } else {
      size_t next = i + 1;
      while (next < s.size() && (static_cast<unsigned char>(s[next]) & 0xc0) == 0x80) ++next;
      end = i = next;
    }
  }
  return std::string(s.substr(begin, end - begin));
}

[[noreturn]] void raise(const std::string& message) { throw ChatTemplateError(message); }

std::string llama3_turn(const ChatMessage& m) {
  return "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + trim(m.content) + "<|eot_id|>";
}

constexpr std::string_view kLlama3Generation = "<|start_header_id|>assistant<|end_header_id|>\n\n";

// A tool call's arguments as the template's tojson prints them.
std::string arguments_json(const ChatToolCall& call) {
  try {
    return python_tojson(call.arguments);
  } catch (const ChatTemplateError& e) {
    raise("the arguments of tool call '" + call.name + "': " + e.what());
  }
}

// A string as the template's tojson prints it (json.dumps(ensure_ascii=False)).
std::string json_string(const std::string& s, const char* what) {
  try {
    return nlohmann::json(s).dump(-1, ' ', /*ensure_ascii=*/false);
  } catch (const nlohmann::json::exception&) {  // type_error 316: not UTF-8, so no Python string
    raise(std::string(what) + " is not valid UTF-8");
  }
}

// Python's str.lstrip('\n') / rstrip('\n'), and s.split(sep)[0] / [-1].
std::string_view lstrip_newlines(std::string_view s) { return s.substr(std::min(s.find_first_not_of('\n'), s.size())); }
std::string_view rstrip_newlines(std::string_view s) {
  const size_t last = s.find_last_not_of('\n');
  return s.substr(0, last == std::string_view::npos ? 0 : last + 1);
}
std::string_view before_first(std::string_view s, std::string_view sep) { return s.substr(0, s.find(sep)); }
std::string_view after_last(std::string_view s, std::string_view sep) {
  const size_t p = s.rfind(sep);
  return p == std::string_view::npos ? s : s.substr(p + sep.size());
}

// A tool definition as the template's tojson (or tojson(indent=N)) prints it.
std::string tool_json(const std::string& tool, int indent = -1) {
  try {
    return python_tojson(tool, indent);
  } catch (const ChatTemplateError& e) {
    raise(std::string("a tool: ") + e.what());
  }
}

// Qwen's "# Tools" system text after the system message: each tool's JSON between <tools> tags,
// then how to call one (the example call's braces doubled in Qwen2.5's GGUF copies).
std::string qwen_tools_text(const std::vector<std::string>& tools, bool example_braces) {
  std::string out =
      "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
      "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
  for (const std::string& tool : tools) {
    out += "\n" + tool_json(tool);
  }
  const char* example = example_braces ? "{{\"name\": <function-name>, \"arguments\": <args-json-object>}}"
                                       : "{\"name\": <function-name>, \"arguments\": <args-json-object>}";
  out += std::string(
             "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
             "<tool_call></tool_call> XML tags:\n<tool_call>\n") +
         example + "\n</tool_call><|im_end|>\n";
  return out;
}

// Qwen's tool results: consecutive tool messages share one user turn, each in <tool_response>.
void append_tool_response(const std::vector<ChatMessage>& messages, size_t i, std::string& out) {
  if (i == 0 || messages[i - 1].role != "tool") out += "<|im_start|>user";
  out += "\n<tool_response>\n" + messages[i].content + "\n</tool_response>";
  if (i + 1 == messages.size() || messages[i + 1].role != "tool") out += "<|im_end|>\n";
}

}  // namespace

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                 const ChatOptions& options) const {
  // The other families' templates never look at tool_calls: rendering the content alone would drop
  // the calls without a word.
  if (format_ != ChatFormat::Qwen25 && format_ != ChatFormat::Qwen3 && format_ != ChatFormat::Llama31 &&
      format_ != ChatFormat::Harmony && format_ != ChatFormat::Jinja)
    for (const ChatMessage& m : messages)
      if (!m.tool_calls.empty()) raise("this chat template does not render tool calls");
  if (!options.tools.empty() && !renders_tools())
    raise("this chat template does not write tool definitions (it never reads `tools`)");
  switch (format_) {
    case ChatFormat::ChatML:
      return render_chatml(messages, add_generation_prompt);
    case ChatFormat::Qwen25:
      return render_qwen25(messages, add_generation_prompt, options);
    case ChatFormat::Qwen3:
      return render_qwen3(messages, add_generation_prompt, options);
    case ChatFormat::Llama3:
      return render_llama3(messages, add_generation_prompt);
    case ChatFormat::Llama31:
      return render_llama31(messages, add_generation_prompt, options);
    case ChatFormat::Llama2:
      return render_llama2(messages);
    case ChatFormat::Mistral:
      return render_mistral(messages);
    case ChatFormat::Zephyr:
      return render_zephyr(messages, add_generation_prompt);
    case ChatFormat::Phi35:
      return render_phi35(messages, add_generation_prompt);
    case ChatFormat::Gemma:
    case ChatFormat::Gemma3:
      return render_gemma(messages, add_generation_prompt);
    case ChatFormat::Harmony:
      return render_harmony(messages, add_generation_prompt, options);
    case ChatFormat::Jinja:
      return render_jinja(messages, add_generation_prompt, options);
  }
  return {};
}

std::string ChatTemplate::render_chatml(const std::vector<ChatMessage>& messages, bool gen) const {
  std::string out = bos_first_ ? tokens_.bos : "";
  auto emit = [&out](std::string_view role, std::string_view content) {
    out.append("<|im_start|>").append(role).append("\n").append(content).append("<|im_end|>\n");
  };
  // Written on the loop's first pass (loop.first), so an empty conversation gets none.
  if (default_system_ && !messages.empty() && messages[0].role != "system") emit("system", *default_system_);
  for (const ChatMessage& m : messages) emit(m.role, m.content);
  if (gen) out += "<|im_start|>assistant\n";
  return out;
}

// The system turn always first (messages[0]'s or the default, then the tools when there are
// any); tool results as user turns of <tool_response> blocks, consecutive ones sharing a turn; an
// assistant's tool calls as <tool_call> blocks of {"name", "arguments"} JSON after its content.
// Other roles are skipped, as is a system message that is not first (it is not: the template's
// loop writes it).
std::string ChatTemplate::render_qwen25(const std::vector<ChatMessage>& messages, bool gen,
                                        const ChatOptions& options) const {
  if (messages.empty()) raise("no messages (the template reads messages[0])");
  std::string out = "<|im_start|>system\n";
  out += messages[0].role == "system" ? messages[0].content : default_system_.value_or("");
  if (options.tools.empty()) out += "<|im_end|>\n";
  else out += "\n\n" + qwen_tools_text(options.tools, tools_example_braces_);
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user" || (m.role == "system" && i > 0) || (m.role == "assistant" && m.tool_calls.empty())) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    } else if (m.role == "assistant") {
      out += "<|im_start|>assistant";
      if (!m.content.empty()) out += "\n" + m.content;
      for (const ChatToolCall& call : m.tool_calls)
        out += "\n<tool_call>\n{\"name\": \"" + call.name + "\", \"arguments\": " + arguments_json(call) +
               "}\n</tool_call>";
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      append_tool_response(messages, i, out);
    }
  }
  if (gen) out += "<|im_start|>assistant\n";
  return out;
}

// Qwen2.5's turns without a default system message, and with reasoning: an assistant message's
// "<think>...</think>" is cut from its content, and written back (as <think>\n...\n</think>\n\n)
// only for messages after the last user query (the last user message that is not a wrapped
// <tool_response>): the last message, or one that had reasoning. Tool calls follow the content,
// one newline apart; arguments that hold a JSON string are written as the string itself.
std::string ChatTemplate::render_qwen3(const std::vector<ChatMessage>& messages, bool gen,
                                       const ChatOptions& options) const {
  if (messages.empty()) raise("no messages (the template reads messages[0])");
  std::string out;
  if (!options.tools.empty())
    out += "<|im_start|>system\n" + (messages[0].role == "system" ? messages[0].content + "\n\n" : "") +
           qwen_tools_text(options.tools, false);
  else if (messages[0].role == "system")
    out += "<|im_start|>system\n" + messages[0].content + "<|im_end|>\n";
  size_t last_query = messages.size() - 1;
  for (size_t i = messages.size(); i-- > 0;) {
    const std::string_view c = messages[i].content;
    const bool wrapped = c.substr(0, 15) == "<tool_response>" && c.size() >= 16 &&
                         c.substr(c.size() - 16) == "</tool_response>";
    if (messages[i].role == "user" && !wrapped) {
      last_query = i;
      break;
    }
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user" || (m.role == "system" && i > 0)) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    } else if (m.role == "assistant") {
      std::string_view content = m.content, reasoning;
      if (m.reasoning_content) {  // given apart: the content is written whole
        reasoning = *m.reasoning_content;
      } else if (m.content.find("</think>") != std::string::npos) {
        content = lstrip_newlines(after_last(m.content, "</think>"));
        reasoning = lstrip_newlines(after_last(rstrip_newlines(before_first(m.content, "</think>")), "<think>"));
      }
      out += "<|im_start|>assistant\n";
      if (i > last_query && (i + 1 == messages.size() || !reasoning.empty()))
        out.append("<think>\n")
            .append(rstrip_newlines(lstrip_newlines(reasoning)))
            .append("\n</think>\n\n")
            .append(lstrip_newlines(content));
      else
        out += content;
      for (size_t k = 0; k < m.tool_calls.size(); ++k) {
        if (k > 0 || !content.empty()) out += "\n";
        std::string arguments = arguments_json(m.tool_calls[k]);
        if (arguments[0] == '"') arguments = nlohmann::json::parse(arguments).get<std::string>();
        out += "<tool_call>\n{\"name\": \"" + m.tool_calls[k].name + "\", \"arguments\": " + arguments +
               "}\n</tool_call>";
      }
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      append_tool_response(messages, i, out);
    }
  }
  if (gen) out += "<|im_start|>assistant\n";
  if (gen && options.enable_thinking == false) out += "<think>\n\n</think>\n\n";
  return out;
}

// Every role alike, content trimmed, BOS before the first turn only.
std::string ChatTemplate::render_llama3(const std::vector<ChatMessage>& messages, bool gen) const {
  std::string out = messages.empty() ? "" : tokens_.bos;
  for (const ChatMessage& m : messages) out += llama3_turn(m);
  if (gen) out += kLlama3Generation;
  return out;
}

// A system turn always comes first, with the knowledge cutoff and the date; tool results are
// "ipython" turns holding the content as a JSON string (the template's tojson of a string); a
// message with tool calls (one, else the template raises) is an assistant turn holding
// {"name", "parameters"} JSON, whatever its role and content.
std::string ChatTemplate::render_llama31(const std::vector<ChatMessage>& messages, bool gen,
                                        const ChatOptions& options) const {
  size_t first = 0;
  std::string system;
  if (!messages.empty() && messages[0].role == "system") system = trim(messages[0].content), first = 1;
  const bool tools = !options.tools.empty();
  std::string out = tokens_.bos + "<|start_header_id|>system<|end_header_id|>\n\n" +
                    (tools ? "Environment: ipython\n" : "") + "Cutting Knowledge Date: December 2023\n";
  out += "Today Date: " + (date_is_today_ ? today_ : date_) + "\n\n" + system + "<|eot_id|>";
  // The tools go into the first message after the system's (tools_in_user_message's default),
  // written as a user turn whatever its role.
  if (tools) {
    if (first == messages.size()) raise("Cannot put tools in the first user message when there's no first user message!");
    if (!messages[first].tool_calls.empty())  // the template would write its content alone
      raise("the first message after the system message carries the tools, and cannot carry tool calls");
    out +=
        "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON for a "
        "function call with its proper arguments that best answers the given prompt.\n\nRespond in the format "
        "{\"name\": function name, \"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n";
    for (const std::string& tool : options.tools) {
      out += tool_json(tool, 4) + "\n\n";
    }
    out += trim(messages[first].content) + "<|eot_id|>";
    ++first;
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role != "tool" && m.role != "ipython" && m.tool_calls.empty()) {
      out += llama3_turn(m);
    } else if (!m.tool_calls.empty()) {
      if (m.tool_calls.size() != 1) raise("This model only supports single tool-calls at once!");
      const ChatToolCall& call = m.tool_calls[0];
      out += "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"" + call.name + "\", \"parameters\": " +
             arguments_json(call) + "}<|eot_id|>";
    } else {
      out += "<|start_header_id|>ipython<|end_header_id|>\n\n" + json_string(m.content, "a tool message's content") +
             "<|eot_id|>";
    }
  }
  if (gen) out += kLlama3Generation;
  return out;
}

// GPT-OSS's harmony format: a system message of the model's identity, the date and the reasoning
// effort; the first system or developer message as the developer's instructions; each answer in
// the final channel (earlier reasoning dropped); a tool call in the commentary channel to
// functions.NAME, its analysis kept only while no later answer exists; a tool result from
// functions.NAME, the last call's. Roles the template skips without a word are refused here, and
// so are two calls in one message (the template renders the first alone).
std::string ChatTemplate::render_harmony(const std::vector<ChatMessage>& messages, bool gen,
                                         const ChatOptions& options) const {
  if (messages.empty()) raise("no messages (the template reads messages[0])");
  const std::string& effort = options.reasoning_effort.empty() ? std::string("medium") : options.reasoning_effort;
  std::string out =
      "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: "
      "2024-06\nCurrent date: " +
      today_ + "\n\nReasoning: " + effort +
      "\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>";
  size_t first = 0;
  if (messages[0].role == "developer" || messages[0].role == "system") {
    if (!messages[0].content.empty())
      out += "<|start|>developer<|message|># Instructions\n\n" + messages[0].content + "\n\n<|end|>";
    first = 1;
  }
  auto answer_follows = [&](size_t i) {
    for (size_t j = i + 1; j < messages.size(); ++j)
      if (messages[j].role == "assistant" && messages[j].tool_calls.empty()) return true;
    return false;
  };
  std::optional<std::string> last_call;
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "assistant") {
      if (m.content.find("<|channel|>analysis<|message|>") != std::string::npos ||
          m.content.find("<|channel|>final<|message|>") != std::string::npos)
        raise(
            "You have passed a message containing <|channel|> tags in the content field. Instead of doing this, you "
            "should pass analysis messages (the string between '<|message|>' and '<|end|>') in the 'thinking' field, "
            "and final messages (the string between '<|message|>' and '<|end|>') in the 'content' field.");
      if (!m.tool_calls.empty()) {
        if (m.tool_calls.size() > 1) raise("the GPT-OSS template renders one tool call per message");
        const ChatToolCall& call = m.tool_calls[0];
        if (!m.content.empty() && !answer_follows(i))
          out += "<|start|>assistant<|channel|>analysis<|message|>" + m.content + "<|end|>";
        out += "<|start|>assistant to=functions." + call.name + "<|channel|>commentary json<|message|>" +
               arguments_json(call) + "<|call|>";
        last_call = call.name;
      } else {
        const bool last = i + 1 == messages.size() && !gen;
        out += "<|start|>assistant<|channel|>final<|message|>" + m.content + (last ? "<|return|>" : "<|end|>");
        if (!last) last_call.reset();
      }
    } else if (m.role == "tool") {
      if (!last_call) raise("Message has tool role, but there was no previous assistant message with a tool call!");
      out += "<|start|>functions." + *last_call + " to=assistant<|channel|>commentary<|message|>" +
             json_string(m.content, "a tool message's content") + "<|end|>";
    } else if (m.role == "user") {
      out += "<|start|>user<|message|>" + m.content + "<|end|>";
    } else {
      raise("the GPT-OSS template drops a '" + m.role + "' message after the first");
    }
  }
  if (gen) out += "<|start|>assistant";
  return out;
}

// [INST] turns each opened by BOS, the system message folded into the first; roles alternate.
std::string ChatTemplate::render_llama2(const std::vector<ChatMessage>& messages) const {
  const bool has_system = !messages.empty() && messages[0].role == "system";
  const size_t first = has_system ? 1 : 0;
  std::string out;
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if ((m.role == "user") != ((i - first) % 2 == 0))
      raise("Conversation roles must alternate user/assistant/user/assistant/...");
    std::string content;
    if (i == first && has_system) content.append("<<SYS>>\n").append(messages[0].content).append("\n<</SYS>>\n\n");
    content += m.content;
    // Appended piece by piece: `" " + std::string&&` trips GCC 12's -Wrestrict (a false alarm).
    if (m.role == "user")
      out.append(tokens_.bos).append("[INST] ").append(trim(content)).append(" [/INST]");
    else if (m.role == "assistant")
      out.append(" ").append(trim(content)).append(" ").append(tokens_.eos);
  }
  return out;
}

// Like Llama 2 without system messages (refused) or trimming, and one BOS at the start.
std::string ChatTemplate::render_mistral(const std::vector<ChatMessage>& messages) const {
  std::string out = tokens_.bos;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if ((m.role == "user") != (i % 2 == 0))
      raise("Conversation roles must alternate user/assistant/user/assistant/...");
    if (m.role == "user")
      out += "[INST] " + m.content + " [/INST]";
    else if (m.role == "assistant")
      out += m.content + tokens_.eos;
    else
      raise("Only user and assistant roles are supported!");
  }
  return out;
}

// <|role|> turns closed by EOS and a newline; other roles are skipped, and the generation prompt
// comes inside the loop, after the last message.
std::string ChatTemplate::render_zephyr(const std::vector<ChatMessage>& messages, bool gen) const {
  std::string out;
  for (const ChatMessage& m : messages)
    if (m.role == "user" || m.role == "system" || m.role == "assistant")
      out += "<|" + m.role + "|>\n" + m.content + tokens_.eos + "\n";
  if (gen && !messages.empty()) out += "<|assistant|>\n";
  return out;
}

// <|role|>\n turns closed by <|end|>\n; an empty system message and other roles are skipped; without
// the generation prompt the text ends with EOS.
std::string ChatTemplate::render_phi35(const std::vector<ChatMessage>& messages, bool gen) const {
  std::string out;
  for (const ChatMessage& m : messages)
    if ((m.role == "system" && !m.content.empty()) || m.role == "user" || m.role == "assistant")
      out += "<|" + m.role + "|>\n" + m.content + "<|end|>\n";
  return out + (gen ? "<|assistant|>\n" : tokens_.eos);
}

// Gemma: <start_of_turn>role (the assistant's is "model"), the trimmed content, <end_of_turn>;
// roles alternate from a user's. Gemma 2 refuses a system message; Gemma 3 writes its text (as
// given) and a blank line at the start of the first turn.
std::string ChatTemplate::render_gemma(const std::vector<ChatMessage>& messages, bool gen) const {
  if (messages.empty()) raise("no messages (the template reads messages[0])");
  const bool system = messages[0].role == "system";
  if (system && format_ == ChatFormat::Gemma) raise("System role not supported");
  std::string out = tokens_.bos;
  const std::string prefix = system ? messages[0].content + "\n\n" : "";
  for (size_t i = system ? 1 : 0, k = 0; i < messages.size(); ++i, ++k) {
    const ChatMessage& m = messages[i];
    if ((m.role == "user") != (k % 2 == 0))
      raise("Conversation roles must alternate user/assistant/user/assistant/...");
    out += "<start_of_turn>" + (m.role == "assistant" ? std::string("model") : m.role) + "\n";
    if (k == 0) out += prefix;
    out += trim(m.content) + "<end_of_turn>\n";
  }
  if (gen) out += "<start_of_turn>model\n";
  return out;
}

}  // namespace strata
