// Chat templates: turns {role, content} messages into the prompt text a chat model was trained on.
// The families Strata knows are recognized by their shape and rendered in C++: ChatML
// (Qwen2-Instruct, SmolLM, Hermes), Qwen2.5, Qwen3, Llama 3, Llama 3.1 / 3.2, Llama 2 chat,
// Mistral Instruct v0.1 / v0.2, Zephyr (TinyLlama Chat), Phi-3.5, Gemma 2 and 3, and GPT-OSS's
// harmony format (tests/fixtures/chat/make_chat_cases.py); the answers of those families are read
// by their own rules (tool calls, reasoning). Any other template runs in Strata's Jinja
// interpreter (model/jinja.h) with the variables transformers passes. Either way the text is what
// transformers' apply_chat_template(tokenize=False) returns. docs/batch-format.md "Chat templates"
// lists what each family does.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/core/error.h"

namespace strata {

class JinjaTemplate;

// An assistant message's call of a tool: OpenAI's tool_calls[i].function.
struct ChatToolCall {
  std::string name;
  // JSON text, as OpenAI sends it. Templates print the value it holds (tojson of json.loads, as
  // vLLM hands the arguments to apply_chat_template), not the string.
  std::string arguments;
  std::string id = {};  // OpenAI's tool_calls[i].id ("" when absent): only interpreted templates read it
};

struct ChatMessage {
  std::string role;     // "system", "user", "assistant", "tool", ...
  std::string content;  // OpenAI's null content beside tool_calls is ""
  std::vector<ChatToolCall> tool_calls = {};  // rendered by Qwen2.5, Qwen3, Llama 3.1 / 3.2, GPT-OSS and interpreted templates
  // The message's other fields as OpenAI and vLLM carry them (unset when absent): a tool result's
  // tool_call_id and name (read by interpreted templates only), an assistant message's earlier
  // reasoning (Qwen3 and interpreted templates write it back in place of its <think> block).
  std::optional<std::string> tool_call_id = {}, name = {}, reasoning_content = {};
};

// Jinja: a template of no known family, run by the interpreter.
enum class ChatFormat {
  ChatML, Qwen25, Qwen3, Llama3, Llama31, Llama2, Mistral, Zephyr, Phi35, Gemma, Gemma3, Harmony, Jinja
};

// What a request passes to the template beside its messages (apply_chat_template's keyword
// arguments). Templates that do not read a field ignore it.
struct ChatOptions {
  // GPT-OSS's "Reasoning: ..." line ("low", "medium" or "high"; empty: the template's default,
  // medium). OpenAI's reasoning_effort.
  std::string reasoning_effort;
  // Qwen3's enable_thinking: false closes an empty <think> block in the generation prompt, so the
  // model answers without reasoning; unset or true: the template's default (it reasons).
  std::optional<bool> enable_thinking;
  // The tools the model may call (OpenAI's request `tools`), each one's JSON text; printed as the
  // template's tojson prints them. Only templates whose renders_tools() is true take them.
  std::vector<std::string> tools;
  // Other keyword arguments (a request's chat_template_kwargs), each a name and its JSON text: an
  // interpreted template reads them as variables; the families Strata renders ignore them.
  std::vector<std::pair<std::string, std::string>> variables = {};
};

// The template's bos_token and eos_token: tokenizer_config.json's strings, or the text of the
// model's BOS / EOS tokens (GGUF). Templates that write them render them as text; the tokenizer
// then reads them back as the special tokens.
struct ChatTokens {
  std::string bos, eos;
};

// A conversation the template refuses (its raise_exception), e.g. roles that do not alternate.
class ChatTemplateError : public Error {
public:
  using Error::Error;
};

class ChatTemplate {
public:
  // Recognizes a Jinja chat template (GGUF tokenizer.chat_template or tokenizer_config.json's
  // chat_template), else compiles it for the interpreter. Throws strata::Error "chat template: line
  // N: ..." for a template Jinja could not compile either.
  static ChatTemplate parse(std::string_view source, ChatTokens tokens = {});
  // The template run by the interpreter whatever its family (tests compare the two ways).
  static ChatTemplate interpreted(std::string_view source, ChatTokens tokens = {});
  static ChatTemplate chatml();  // plain ChatML without a default system message

  // What transformers' apply_chat_template(messages, tokenize=False, add_generation_prompt=...)
  // returns for the recognized template; throws ChatTemplateError where the template raises.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt = true,
                     const ChatOptions& options = {}) const;

  ChatFormat format() const { return format_; }
  // Whether render() writes ChatOptions::tools: Qwen2.5's and Qwen3's "# Tools" system turn (their
  // answers call tools in <tool_call> blocks), Llama 3.1's and 3.2's first user turn (their
  // answers are JSON calls); job/tool_calls.h reads both.
  // An interpreted template takes them when it reads `tools` at all.
  bool renders_tools() const;
  // An interpreted template's source (empty for the known families): what the job reads to guess
  // how its answers mark tool calls and reasoning.
  const std::string& source() const { return source_; }
  // ChatML and Qwen2.5: inserted as the first message when messages[0] is not a system message.
  const std::optional<std::string>& default_system() const { return default_system_; }
  // Llama 3.2's "Today Date" and GPT-OSS's "Current date", from strftime_now at parse time
  // ("%d %b %Y" and "%Y-%m-%d"); tests set it, in the family's format. An interpreted template
  // calls strftime_now as it renders; once set, every call returns this text, whatever the format.
  void set_today(std::string date) { today_ = std::move(date); }

private:
  std::string render_chatml(const std::vector<ChatMessage>& messages, bool gen) const;
  std::string render_qwen25(const std::vector<ChatMessage>& messages, bool gen, const ChatOptions& options) const;
  std::string render_qwen3(const std::vector<ChatMessage>& messages, bool gen, const ChatOptions& options) const;
  std::string render_llama3(const std::vector<ChatMessage>& messages, bool gen) const;
  std::string render_llama31(const std::vector<ChatMessage>& messages, bool gen, const ChatOptions& options) const;
  std::string render_llama2(const std::vector<ChatMessage>& messages) const;
  std::string render_mistral(const std::vector<ChatMessage>& messages) const;
  std::string render_zephyr(const std::vector<ChatMessage>& messages, bool gen) const;
  std::string render_phi35(const std::vector<ChatMessage>& messages, bool gen) const;
  std::string render_gemma(const std::vector<ChatMessage>& messages, bool gen) const;
  std::string render_harmony(const std::vector<ChatMessage>& messages, bool gen, const ChatOptions& options) const;
  std::string render_jinja(const std::vector<ChatMessage>& messages, bool gen, const ChatOptions& options) const;

  ChatFormat format_ = ChatFormat::ChatML;
  ChatTokens tokens_;
  std::optional<std::string> default_system_;
  bool bos_first_ = false;       // ChatML: the template writes bos_token before the messages
  std::string date_;             // Llama 3.1: the template's date_string default
  bool date_is_today_ = false;   // Llama 3.2: strftime_now, so today's date
  std::string today_;
  bool tools_example_braces_ = false;  // Qwen2.5 GGUF copies: the tools turn's example call in {{ }}
  std::shared_ptr<const JinjaTemplate> jinja_;  // ChatFormat::Jinja
  std::string source_;                          // ChatFormat::Jinja
};

}  // namespace strata
