// Chat template recognition. A template is normalized and checked for the fragments that make a
// family's output; anything else is refused rather than rendered wrongly (chat_render.cpp renders).
// ChatML keeps its older, looser normalization (all whitespace dropped, literals included); the
// other families compare literals exactly, since a space inside '[INST] ' is part of the prompt.
#include "strata/model/chat_template.h"

#include <ctime>

namespace strata {

namespace {

// Into a new string: replacing in place moved the rest of s for each match (quadratic).
void replace_all(std::string& s, std::string_view from, std::string_view to) {
  std::string out;
  size_t done = 0;
  for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, done)) {
    out.append(s, done, p - done).append(to);
    done = p + from.size();
  }
  if (done == 0) return;
  s = std::move(out.append(s, done));
}

// Spellings that mean the same in Jinja, made one.
void unify_spellings(std::string& s) {
  replace_all(s, "{{-", "{{");
  replace_all(s, "-}}", "}}");
  replace_all(s, "{%-", "{%");
  replace_all(s, "-%}", "%}");
  replace_all(s, "message.role", "message['role']");
  replace_all(s, "message.content", "message['content']");
  replace_all(s, ".strip()", "|trim");
}

// ChatML's normalization: real newlines become the two-character escape so both spellings
// compare equal; then all whitespace goes, and one quote style.
std::string normalize_loose(std::string_view src) {
  std::string s;
  for (char c : src) {
    if (c == '\n')
      s += "\\n";
    else if (c == '"')
      s += '\'';
    else if (c != ' ' && c != '\t' && c != '\r')
      s += c;
  }
  unify_spellings(s);
  return s;
}

// A string literal starting at src[i] (a quote), appended to s in one spelling: quoted with ',
// a real newline written \n; returns the index of its closing quote.
size_t append_literal(std::string_view src, size_t i, std::string& s) {
  const char quote = src[i];
  s += '\'';
  for (++i; i < src.size() && src[i] != quote; ++i) {
    if (src[i] == '\\' && i + 1 < src.size()) s += src[i++];
    if (src[i] == '\n') s += "\\n";
    else if (src[i] == '\'' && quote == '"') s += "\\'";
    else s += src[i];
  }
  s += '\'';
  return i;
}

// The text between two tags as Jinja prints it with transformers' settings: trim_blocks drops the
// first newline after a block or comment tag, lstrip_blocks the spaces and tabs between a line's
// start and a block or comment tag, and a '-' marker all whitespace on its side.
std::string printed_text(std::string_view text, char before, bool strip_left, char after, bool strip_right,
                         bool no_lstrip, bool at_template_start) {
  auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  size_t begin = 0, end = text.size();
  if (strip_right) {
    while (end > 0 && is_space(text[end - 1])) --end;
  } else if ((after == '%' || after == '#') && !no_lstrip) {
    size_t k = end;
    while (k > 0 && (text[k - 1] == ' ' || text[k - 1] == '\t')) --k;
    if ((k == 0 && at_template_start) || (k > 0 && text[k - 1] == '\n')) end = k;  // the tag starts its line
  }
  if (strip_left)
    while (begin < end && is_space(text[begin])) ++begin;
  else if ((before == '%' || before == '#') && begin < end && text[begin] == '\n')
    ++begin;
  return std::string(text.substr(begin, end - begin));
}

// The other families': each tag with whitespace dropped outside its string literals (literals
// kept to the byte, a real newline in one spelled \n, both quote styles written as '), comments
// dropped, trim markers applied and removed, and the text Jinja prints between tags written as a
// literal output tag {{'...'}}, so that a template printing other whitespace does not match.
std::string normalize_exact(std::string_view src) {
  std::string s;
  char prev_kind = 0;       // '{', '%' or '#': the tag before the current text; 0 at the start
  bool prev_strip = false;  // that tag ended with a '-' marker
  size_t i = 0;
  while (true) {
    size_t open = src.find('{', i);
    while (open != std::string_view::npos && open + 1 < src.size() && src[open + 1] != '{' && src[open + 1] != '%' &&
           src[open + 1] != '#')
      open = src.find('{', open + 1);
    if (open != std::string_view::npos && open + 1 >= src.size()) open = std::string_view::npos;
    const size_t text_end = open == std::string_view::npos ? src.size() : open;
    const char kind = open == std::string_view::npos ? 0 : src[open + 1];
    const char marker = open != std::string_view::npos && open + 2 < src.size() ? src[open + 2] : 0;
    const std::string text = printed_text(src.substr(i, text_end - i), prev_kind, prev_strip, kind, marker == '-',
                                          marker == '+', i == 0);
    if (!text.empty()) {  // as a literal, escaped as a Jinja string would be
      s += "{{'";
      for (char c : text) {
        if (c == '\n') s += "\\n";
        else if (c == '\'' || c == '\\') s += '\\', s += c;
        else s += c;
      }
      s += "'}}";
    }
    if (open == std::string_view::npos) break;
    // The tag, up to its closing "}}", "%}" or "#}" (after an optional marker) outside literals.
    const std::string close = std::string(1, kind == '{' ? '}' : kind) + "}";
    std::string body;
    size_t j = open + 2 + (marker == '-' || marker == '+' ? 1 : 0);
    bool closed = false;
    for (; j < src.size(); ++j) {
      const char c = src[j];
      if (kind != '#' && (c == '\'' || c == '"')) {
        j = append_literal(src, j, body);
      } else if (src.substr(j, 2) == close || ((c == '-' || c == '+') && src.substr(j + 1, 2) == close)) {
        prev_strip = c == '-';
        j += src.substr(j, 2) == close ? 2 : 3;
        closed = true;
        break;
      } else if (kind != '#' && c != ' ' && c != '\t' && c != '\r' && c != '\n') {
        body += c;
      }
    }
    if (kind == '{') s += "{{" + body + (closed ? "}}" : "");
    else if (kind == '%') s += "{%" + body + (closed ? "%}" : "");
    prev_kind = kind;
    i = std::min(j, src.size());
    if (!closed) break;
  }
  unify_spellings(s);
  return s;
}

std::string unescape_jinja(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      char n = s[++i];
      if (n == 'n')
        out += '\n';
      else if (n == 't')
        out += '\t';
      else
        out += n;  // \\ \' \"
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
  size_t end = 0;  // the first <|im_end|> at or after q, kept while it is: many heads before one end were quadratic
  for (size_t p = src.find(head); p != std::string_view::npos; p = src.find(head, p + 1)) {
    if (p == 0 || (src[p - 1] != '\'' && src[p - 1] != '"')) continue;
    char quote = src[p - 1];
    size_t q = p + head.size();
    if (src.substr(q, 1) == "\n")
      q += 1;
    else if (src.substr(q, 2) == "\\n")
      q += 2;
    else
      continue;
    if (end < q) end = src.find("<|im_end|>", q);
    if (end == std::string_view::npos) return std::nullopt;  // none after this head, so none after later ones
    std::string_view body = src.substr(q, end - q);
    if (body.find(quote) != std::string_view::npos) continue;  // literal closed: built from a variable
    return unescape_jinja(body);
  }
  return std::nullopt;
}

bool is_chatml(const std::string& n) {
  const bool loop = n.find("{%formessageinmessages%}") != std::string::npos;
  const bool body =
      n.find("'<|im_start|>'+message['role']+'\\n'+message['content']+'<|im_end|>'+'\\n'") != std::string::npos ||
      n.find("'<|im_start|>'+message['role']+'\\n'+message['content']+'<|im_end|>\\n'") != std::string::npos;
  const size_t g = n.find("{%ifadd_generation_prompt%}");
  return loop && body && g != std::string::npos && n.find("'<|im_start|>assistant\\n'", g) != std::string::npos;
}

bool has_all(const std::string& n, std::initializer_list<std::string_view> fragments) {
  for (std::string_view f : fragments)
    if (n.find(f) == std::string::npos) return false;
  return true;
}

// Each family's fragments, in exact normalization.
constexpr std::string_view kLlama3Turn =
    "'<|start_header_id|>'+message['role']+'<|end_header_id|>\\n\\n'+message['content']|trim+'<|eot_id|>'";
constexpr std::string_view kLlama3Generation =
    "{%ifadd_generation_prompt%}{{'<|start_header_id|>assistant<|end_header_id|>\\n\\n'}}{%endif%}";
constexpr std::string_view kAlternate =
    "{%if(message['role']=='user')!=(loop.index0%2==0)%}{{raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...')}}{%endif%}";

bool is_llama3(const std::string& n) {
  return has_all(
      n, {"{%formessageinloop_messages%}", std::string("{%setcontent=").append(kLlama3Turn).append("%}"),
          "{%ifloop.index0==0%}{%setcontent=bos_token+content%}{%endif%}{{content}}{%endfor%}", kLlama3Generation});
}

bool is_llama31(const std::string& n) {
  return n.rfind("{{bos_token}}", 0) == 0 &&
         has_all(n,
                 {"{%ifmessages[0]['role']=='system'%}{%setsystem_message=messages[0]['content']|trim%}"
                  "{%setmessages=messages[1:]%}{%else%}{%setsystem_message=''%}{%endif%}",
                  "{{'<|start_header_id|>system<|end_header_id|>\\n\\n'}}",
                  "{{'Cutting Knowledge Date: December 2023\\n'}}{{'Today Date: '+date_string+'\\n\\n'}}",
                  "{{system_message}}{{'<|eot_id|>'}}",
                  std::string("{%formessageinmessages%}{%ifnot(message['role']=='ipython'ormessage['role']=='tool'"
                              "or'tool_calls'inmessage)%}{{")
                      .append(kLlama3Turn)
                      .append("}}"),
                  "{%elifmessage['role']=='tool'ormessage['role']=='ipython'%}"
                  "{{'<|start_header_id|>ipython<|end_header_id|>\\n\\n'}}{%ifmessage['content']ismappingor"
                  "message['content']isiterable%}{{message['content']|tojson}}{%else%}{{message['content']}}{%endif%}"
                  "{{'<|eot_id|>'}}{%endif%}{%endfor%}",
                  kLlama3Generation});
}

bool is_llama2(const std::string& n) {
  return has_all(n,
                 {"{%ifmessages[0]['role']=='system'%}{%setloop_messages=messages[1:]%}{%setsystem_message="
                  "messages[0]['content']%}{%else%}{%setloop_messages=messages%}{%setsystem_message=false%}{%endif%}",
                  std::string("{%formessageinloop_messages%}").append(kAlternate),
                  "{%ifloop.index0==0andsystem_message!=false%}{%setcontent='<<SYS>>\\n'+system_message+"
                  "'\\n<</SYS>>\\n\\n'+message['content']%}{%else%}{%setcontent=message['content']%}{%endif%}",
                  "{%ifmessage['role']=='user'%}{{bos_token+'[INST] '+content|trim+' [/INST]'}}"
                  "{%elifmessage['role']=='assistant'%}{{' '+content|trim+' '+eos_token}}{%endif%}{%endfor%}"});
}

bool is_mistral(const std::string& n) {
  return n == std::string("{{bos_token}}{%formessageinmessages%}")
                  .append(kAlternate)
                  .append(
                      "{%ifmessage['role']=='user'%}{{'[INST] '+message['content']+' [/INST]'}}"
                      "{%elifmessage['role']=='assistant'%}{{message['content']+eos_token}}"
                      "{%else%}{{raise_exception('Only user and assistant roles are supported!')}}{%endif%}"
                      "{%endfor%}");
}

// Zephyr writes each turn from an output tag followed by a newline that trim_blocks keeps (it
// drops only those after block tags): the {{'\n'}} after each.
bool is_zephyr(const std::string& n) {
  return n ==
         "{%formessageinmessages%}{%ifmessage['role']=='user'%}{{'<|user|>\\n'+message['content']+eos_token}}"
         "{{'\\n'}}{%elifmessage['role']=='system'%}{{'<|system|>\\n'+message['content']+eos_token}}{{'\\n'}}"
         "{%elifmessage['role']=='assistant'%}{{'<|assistant|>\\n'+message['content']+eos_token}}{{'\\n'}}"
         "{%endif%}{%ifloop.lastandadd_generation_prompt%}{{'<|assistant|>'}}{{'\\n'}}{%endif%}{%endfor%}";
}

// The first literal assigned to date_string: Llama 3.1's default.
std::string date_default(const std::string& n) {
  const std::string_view head = "{%setdate_string='";
  const size_t p = n.find(head);
  if (p == std::string::npos) return {};
  const size_t q = p + head.size(), end = n.find('\'', q);
  return end == std::string::npos ? std::string() : n.substr(q, end - q);
}

std::string today() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buf[32];
  std::strftime(buf, sizeof buf, "%d %b %Y", &local);  // the C locale's English month, as Python's
  return buf;
}

}  // namespace

ChatTemplate ChatTemplate::chatml() { return ChatTemplate(); }

ChatTemplate ChatTemplate::parse(std::string_view source, ChatTokens tokens) {
  ChatTemplate t;
  t.tokens_ = std::move(tokens);
  const std::string loose = normalize_loose(source);
  if (is_chatml(loose)) {
    t.default_system_ = find_default_system(source);
    t.system_in_loop_ = loose.find("{%ifloop.firstandmessages[0]['role']!='system'%}") != std::string::npos;
    return t;
  }
  const std::string n = normalize_exact(source);
  if (is_llama3(n))
    t.format_ = ChatFormat::Llama3;
  else if (is_llama31(n))
    t.format_ = ChatFormat::Llama31;
  else if (is_llama2(n))
    t.format_ = ChatFormat::Llama2;
  else if (is_mistral(n))
    t.format_ = ChatFormat::Mistral;
  else if (is_zephyr(n))
    t.format_ = ChatFormat::Zephyr;
  else
    STRATA_FAIL(
        "unsupported chat template (understood: ChatML, Llama 3, Llama 3.1/3.2, Llama 2, Mistral Instruct "
        "v0.1/v0.2, Zephyr)");
  if (t.format_ == ChatFormat::Llama31) {
    t.date_is_today_ =
        n.find("{%ifstrftime_nowisdefined%}{%setdate_string=strftime_now('%d %b %Y')%}") != std::string::npos;
    t.date_ = date_default(n);
    if (t.date_is_today_)
      t.today_ = today();
    else if (t.date_.empty())
      STRATA_FAIL("unsupported chat template (Llama 3.1 without a date_string default)");
  }
  return t;
}

}  // namespace strata
