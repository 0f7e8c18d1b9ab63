// libFuzzer entry for chat templates: ChatTemplate::parse (the Jinja source from GGUF
// tokenizer.chat_template or tokenizer_config.json) and render. The input is split at its first
// "\n----\n": the template before it, a conversation after it, one message a line as
// "role\tcontent" (a line without a tab is a user message; a line "tools\tJSON" is a tool
// definition instead, ChatOptions::tools). A template renders the conversation with and without
// the generation prompt (an interpreted one, ChatFormat::Jinja, is checked for crashes only). For a
// recognized one, traps: the two renders disagree on
// refusing, the prompt-less one is not a prefix of the other (every family appends the generation
// prompt last; Phi-3.5 writes EOS in its place, which is left out of the comparison; GPT-OSS ends
// a last assistant message with <|return|> rather than <|end|>), or a user
// message's content is missing from the output. strata::Error (and its
// ChatTemplateError) is the expected way to refuse; anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "strata/core/error.h"
#include "strata/model/chat_template.h"

namespace {

std::vector<strata::ChatMessage> conversation(std::string_view s, strata::ChatOptions& options) {
  std::vector<strata::ChatMessage> messages;
  while (!s.empty()) {
    const size_t eol = s.find('\n');
    const std::string_view line = s.substr(0, eol);
    s = eol == std::string_view::npos ? std::string_view() : s.substr(eol + 1);
    const size_t tab = line.find('\t');
    if (tab == std::string_view::npos)
      messages.push_back({"user", std::string(line)});
    else if (line.substr(0, tab) == "tools")
      options.tools.emplace_back(line.substr(tab + 1));
    else
      messages.push_back({std::string(line.substr(0, tab)), std::string(line.substr(tab + 1))});
  }
  return messages;
}

bool ascii_python_space(char c) { return c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f); }

// What a user message's content must appear as in the output. Llama 3, 3.1 and 2 and Gemma write
// it through Python's str.strip(): with the ASCII spaces stripped, a core that begins and ends with
// an ASCII byte is exactly what strip() keeps, whatever lies between. Otherwise (a non-ASCII end
// may be a Unicode space) nothing is checked.
std::optional<std::string> expected_content(strata::ChatFormat format, const std::string& content) {
  using F = strata::ChatFormat;
  if (format != F::Llama3 && format != F::Llama31 && format != F::Llama2 && format != F::Gemma &&
      format != F::Gemma3)
    return content;
  size_t begin = 0, end = content.size();
  while (begin < end && ascii_python_space(content[begin])) ++begin;
  while (end > begin && ascii_python_space(content[end - 1])) --end;
  if (begin == end || static_cast<unsigned char>(content[begin]) >= 0x80 ||
      static_cast<unsigned char>(content[end - 1]) >= 0x80)
    return std::nullopt;
  return content.substr(begin, end - begin);
}

std::optional<std::string> render(const strata::ChatTemplate& t, const std::vector<strata::ChatMessage>& messages,
                                  bool gen, const strata::ChatOptions& options) {
  try {
    return t.render(messages, gen, options);
  } catch (const strata::Error&) {
    return std::nullopt;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  constexpr std::string_view kSeparator = "\n----\n";
  const size_t cut = input.find(kSeparator);
  const std::string_view source = input.substr(0, cut);
  strata::ChatOptions options;
  const std::vector<strata::ChatMessage> messages = conversation(
      cut == std::string_view::npos ? std::string_view() : input.substr(cut + kSeparator.size()), options);
  std::optional<strata::ChatTemplate> t;
  try {
    t = strata::ChatTemplate::parse(source, {"<s>", "</s>"});
  } catch (const strata::Error&) {
    return 0;
  }
  t->set_today("26 Jul 2024");
  const std::optional<std::string> with = render(*t, messages, true, options),
                                   without = render(*t, messages, false, options);
  // An interpreted template may print anything, or refuse one way only: it must only not crash.
  if (t->format() == strata::ChatFormat::Jinja) return 0;
  if (with.has_value() != without.has_value()) __builtin_trap();
  if (!with) return 0;
  std::string_view prefix = *without;
  if (t->format() == strata::ChatFormat::Phi35) {  // without the generation prompt it ends with EOS
    if (!prefix.ends_with("</s>")) __builtin_trap();
    prefix.remove_suffix(4);
  }
  if (t->format() == strata::ChatFormat::Harmony && prefix.ends_with("<|return|>")) {
    if (!messages.empty() && messages.back().role != "assistant") __builtin_trap();
    prefix.remove_suffix(std::string_view("<|return|>").size());
  }
  if (with->compare(0, prefix.size(), prefix) != 0) __builtin_trap();
  for (const strata::ChatMessage& m : messages) {
    if (m.role != "user") continue;
    const std::optional<std::string> expected = expected_content(t->format(), m.content);
    if (expected && without->find(*expected) == std::string::npos) __builtin_trap();
  }
  return 0;
}
