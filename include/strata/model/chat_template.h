// Chat templates: turns {role, content} messages into the prompt text a chat model was trained on.
// Only ChatML (<|im_start|>role\ncontent<|im_end|>\n) is understood; the Jinja source is recognized
// by its shape, not executed, and a default system message written into it is kept.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace strata {

struct ChatMessage {
  std::string role;     // "system", "user", "assistant", ...
  std::string content;
};

class ChatTemplate {
public:
  // Recognizes a Jinja chat template (e.g. GGUF tokenizer.chat_template or tokenizer_config.json's
  // chat_template). Throws strata::Error "unsupported chat template (only ChatML is supported)".
  static ChatTemplate parse(std::string_view source);
  static ChatTemplate chatml();  // plain ChatML without a default system message

  // What transformers' apply_chat_template(messages, tokenize=False, add_generation_prompt=...)
  // returns for the recognized template.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt = true) const;
  // Inserted as the first message when messages[0] is not a system message.
  const std::optional<std::string>& default_system() const { return default_system_; }

private:
  std::optional<std::string> default_system_;
  bool system_in_loop_ = false;  // emitted on the first loop iteration, so not for zero messages
};

}  // namespace strata
