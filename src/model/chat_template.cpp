// ChatML recognition and rendering. The template is normalized (whitespace and Jinja trim markers
// dropped, message.role spelled message['role'], one quote style) and checked for the ChatML loop
// body and generation prompt; anything else is refused rather than rendered wrongly.
#include "strata/model/chat_template.h"

#include "strata/core/error.h"

namespace strata {

namespace {

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size())) s.replace(p, from.size(), to);
}

// Real newlines become the two-character escape so both spellings compare equal; then all
// whitespace goes (it only matters inside literals, where we compare fixed ChatML strings).
std::string normalize(std::string_view src) {
  std::string s;
  for (char c : src) {
    if (c == '\n') s += "\\n";
    else if (c == '"') s += '\'';
    else if (c != ' ' && c != '\t' && c != '\r') s += c;
  }
  replace_all(s, "{{-", "{{");
  replace_all(s, "-}}", "}}");
  replace_all(s, "{%-", "{%");
  replace_all(s, "-%}", "%}");
  replace_all(s, "message.role", "message['role']");
  replace_all(s, "message.content", "message['content']");
  return s;
}

std::string unescape_jinja(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      char n = s[++i];
      if (n == 'n') out += '\n';
      else if (n == 't') out += '\t';
      else out += n;  // \\ \' \"
    } else {
      out += s[i];
    }
  }
  return out;
}

// A default system message is a fully literal '<|im_start|>system\n...<|im_end|>\n' string in the
// template (as opposed to one built from messages[0]['content']).
std::optional<std::string> find_default_system(std::string_view src) {
  const std::string_view head = "<|im_start|>system";
  for (size_t p = src.find(head); p != std::string_view::npos; p = src.find(head, p + 1)) {
    if (p == 0 || (src[p - 1] != '\'' && src[p - 1] != '"')) continue;
    char quote = src[p - 1];
    size_t q = p + head.size();
    if (src.substr(q, 1) == "\n") q += 1;
    else if (src.substr(q, 2) == "\\n") q += 2;
    else continue;
    size_t end = src.find("<|im_end|>", q);
    if (end == std::string_view::npos) continue;
    std::string_view body = src.substr(q, end - q);
    if (body.find(quote) != std::string_view::npos) continue;  // literal closed: built from a variable
    return unescape_jinja(body);
  }
  return std::nullopt;
}

}  // namespace

ChatTemplate ChatTemplate::chatml() { return ChatTemplate(); }

ChatTemplate ChatTemplate::parse(std::string_view source) {
  std::string n = normalize(source);
  bool loop = n.find("{%formessageinmessages%}") != std::string::npos;
  bool body = n.find("'<|im_start|>'+message['role']+'\\n'+message['content']+'<|im_end|>'+'\\n'") != std::string::npos ||
              n.find("'<|im_start|>'+message['role']+'\\n'+message['content']+'<|im_end|>\\n'") != std::string::npos;
  size_t g = n.find("{%ifadd_generation_prompt%}");
  bool gen = g != std::string::npos && n.find("'<|im_start|>assistant\\n'", g) != std::string::npos;
  if (!loop || !body || !gen) STRATA_FAIL("unsupported chat template (only ChatML is supported)");
  ChatTemplate t;
  t.default_system_ = find_default_system(source);
  t.system_in_loop_ = n.find("{%ifloop.firstandmessages[0]['role']!='system'%}") != std::string::npos;
  return t;
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  std::string out;
  auto emit = [&out](std::string_view role, std::string_view content) {
    out += "<|im_start|>";
    out += role;
    out += '\n';
    out += content;
    out += "<|im_end|>\n";
  };
  if (default_system_ && (messages.empty() || messages[0].role != "system")) {
    // SmolLM2's template emits the default inside the loop (loop.first), so an empty conversation
    // gets none; Qwen-style templates emit it before the loop regardless.
    if (!messages.empty() || !system_in_loop_) emit("system", *default_system_);
  }
  for (const ChatMessage& m : messages) emit(m.role, m.content);
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace strata
