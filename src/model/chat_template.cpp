// Chat template recognition. A template is normalized and compared with the fragments, or the
// whole reference templates, that make a family's output (chat_render.cpp renders those); anything
// else goes to the Jinja interpreter (chat_jinja.cpp). Literals compare exactly, since a space inside
// '[INST] ' is part of the prompt, and so does the text Jinja prints between tags.
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

// A Jinja string literal's text (as normalize_exact writes it) as Jinja reads it; nullopt for an
// escape other than \n \t \\ \' \" (Jinja reads Python's, \u.... and \x.. among them).
std::optional<std::string> unescape_literal(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\') {
      out += s[i];
      continue;
    }
    if (++i == s.size()) return std::nullopt;
    const char n = s[i];
    if (n == 'n') out += '\n';
    else if (n == 't') out += '\t';
    else if (n == '\\' || n == '\'' || n == '"') out += n;
    else return std::nullopt;
  }
  return out;
}

// Where a reference template has a default system message: a normalized reference holds this byte
// in place of the message's text, inside its literal.
constexpr char kHole = '\x01';

// A normalized template against a normalized reference with holes: the holes' text when the
// template is the reference with the same text in every hole, that text inside one literal (no
// unescaped quote) and in Jinja's escapes; "" for a reference without holes that is matched.
std::optional<std::string> match_reference(const std::string& n, const std::string& reference) {
  std::vector<std::string_view> parts;
  for (size_t begin = 0;;) {
    const size_t hole = reference.find(kHole, begin);
    parts.emplace_back(std::string_view(reference).substr(begin, hole - begin));
    if (hole == std::string::npos) break;
    begin = hole + 1;
  }
  if (parts.size() == 1) return n == reference ? std::optional<std::string>("") : std::nullopt;
  if (n.compare(0, parts[0].size(), parts[0]) != 0) return std::nullopt;
  size_t at = parts[0].size();
  std::optional<std::string_view> text;
  for (size_t k = 1; k < parts.size(); ++k) {
    const bool last = k + 1 == parts.size();
    const size_t next = last ? n.size() - std::min(n.size(), parts[k].size()) : n.find(parts[k], at);
    if (next == std::string::npos || next < at || n.compare(next, parts[k].size(), parts[k]) != 0) return std::nullopt;
    const std::string_view hole = std::string_view(n).substr(at, next - at);
    if (text && *text != hole) return std::nullopt;
    text = hole;
    at = next + parts[k].size();
  }
  for (size_t i = 0; i < text->size(); ++i) {
    if ((*text)[i] == '\\') ++i;
    else if ((*text)[i] == '\'') return std::nullopt;  // the hole's text left the literal
  }
  return unescape_literal(*text);
}

// Plain ChatML: one <|im_start|>role\ncontent<|im_end|>\n turn a message, as written by the
// templates of OpenHermes, Qwen2-Instruct and SmolLM2 (a default system message on the loop's
// first pass), Nous-Hermes-2 (a BOS first) and Dolphin (add_generation_prompt's default set).
// Any other construct (tools, tool roles, tool_calls, trimming) makes it another template.
const std::vector<std::string>& chatml_references() {
  static const std::vector<std::string> references = [] {
    const std::string_view prefixes[] = {
        "", "{{ bos_token }}",
        "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"};
    const std::string defaults[] = {
        "", std::string("{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\n") + kHole +
                "<|im_end|>\\n' }}{% endif %}"};
    const std::string_view turns[] = {
        "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}",
        "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"};
    std::vector<std::string> out;
    for (std::string_view prefix : prefixes)
      for (const std::string& system : defaults)
        for (std::string_view turn : turns)
          out.push_back(normalize_exact(std::string(prefix) + "{% for message in messages %}" + system +
                                        std::string(turn) +
                                        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                                        "{% endif %}"));
    return out;
  }();
  return references;
}

// Qwen2.5-Instruct's template (tokenizer_config.json of Qwen/Qwen2.5-7B-Instruct; laid out here
// to fit the page, which normalization does not see), with holes for its default system message.
// Copies in Qwen2.5 GGUF files double the braces of the example call in the tools branch.
constexpr std::string_view kQwen25ToolsExample =
    "\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": <args-json-object>}\\n";
constexpr std::string_view kQwen25ToolsExampleBraces =
    "\\n{{\\\"name\\\": <function-name>, \\\"arguments\\\": <args-json-object>}}\\n";

const std::vector<std::string>& qwen25_references() {
  static const std::vector<std::string> references = [] {
    const std::string hole(1, kHole);
    const std::string source =
        "{%- if tools %}\n"
        "    {{- '<|im_start|>system\\n' }}\n"
        "    {%- if messages[0]['role'] == 'system' %}\n"
        "        {{- messages[0]['content'] }}\n"
        "    {%- else %}\n"
        "        {{- '" + hole + "' }}\n"
        "    {%- endif %}\n"
        "    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
        "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
        "    {%- for tool in tools %}\n"
        "        {{- \"\\n\" }}\n"
        "        {{- tool | tojson }}\n"
        "    {%- endfor %}\n"
        "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\\n<tool_call>@EXAMPLE@</tool_call><|im_end|>\\n\" }}\n"
        "{%- else %}\n"
        "    {%- if messages[0]['role'] == 'system' %}\n"
        "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
        "    {%- else %}\n"
        "        {{- '<|im_start|>system\\n" + hole + "<|im_end|>\\n' }}\n"
        "    {%- endif %}\n"
        "{%- endif %}\n"
        "{%- for message in messages %}\n"
        "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first)\n"
        "           or (message.role == \"assistant\" and not message.tool_calls) %}\n"
        "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
        "    {%- elif message.role == \"assistant\" %}\n"
        "        {{- '<|im_start|>' + message.role }}\n"
        "        {%- if message.content %}\n"
        "            {{- '\\n' + message.content }}\n"
        "        {%- endif %}\n"
        "        {%- for tool_call in message.tool_calls %}\n"
        "            {%- if tool_call.function is defined %}\n"
        "                {%- set tool_call = tool_call.function %}\n"
        "            {%- endif %}\n"
        "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n"
        "            {{- tool_call.name }}\n"
        "            {{- '\", \"arguments\": ' }}\n"
        "            {{- tool_call.arguments | tojson }}\n"
        "            {{- '}\\n</tool_call>' }}\n"
        "        {%- endfor %}\n"
        "        {{- '<|im_end|>\\n' }}\n"
        "    {%- elif message.role == \"tool\" %}\n"
        "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n"
        "            {{- '<|im_start|>user' }}\n"
        "        {%- endif %}\n"
        "        {{- '\\n<tool_response>\\n' }}\n"
        "        {{- message.content }}\n"
        "        {{- '\\n</tool_response>' }}\n"
        "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
        "            {{- '<|im_end|>\\n' }}\n"
        "        {%- endif %}\n"
        "    {%- endif %}\n"
        "{%- endfor %}\n"
        "{%- if add_generation_prompt %}\n"
        "    {{- '<|im_start|>assistant\\n' }}\n"
        "{%- endif %}\n";
    const size_t example = source.find("@EXAMPLE@");
    std::string braces = source;
    return std::vector<std::string>{
        normalize_exact(std::string(source).replace(example, 9, kQwen25ToolsExample)),
        normalize_exact(braces.replace(example, 9, kQwen25ToolsExampleBraces))};
  }();
  return references;
}

// Qwen3's template (tokenizer_config.json of Qwen/Qwen3-0.6B, the whole Qwen3 release), laid out
// to fit the page. It has no default system message.
const std::vector<std::string>& qwen3_references() {
  static const std::vector<std::string> references = {normalize_exact(
      "{%- if tools %}\n"
      "    {{- '<|im_start|>system\\n' }}\n"
      "    {%- if messages[0].role == 'system' %}\n"
      "        {{- messages[0].content + '\\n\\n' }}\n"
      "    {%- endif %}\n"
      "    {{- \"# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
      "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
      "    {%- for tool in tools %}\n"
      "        {{- \"\\n\" }}\n"
      "        {{- tool | tojson }}\n"
      "    {%- endfor %}\n"
      "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
      "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, "
      "\\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
      "{%- else %}\n"
      "    {%- if messages[0].role == 'system' %}\n"
      "        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n"
      "    {%- endif %}\n"
      "{%- endif %}\n"
      "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n"
      "{%- for message in messages[::-1] %}\n"
      "    {%- set index = (messages|length - 1) - loop.index0 %}\n"
      "    {%- if ns.multi_step_tool and message.role == \"user\"\n"
      "           and not(message.content.startswith('<tool_response>')\n"
      "                   and message.content.endswith('</tool_response>')) %}\n"
      "        {%- set ns.multi_step_tool = false %}\n"
      "        {%- set ns.last_query_index = index %}\n"
      "    {%- endif %}\n"
      "{%- endfor %}\n"
      "{%- for message in messages %}\n"
      "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) %}\n"
      "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
      "    {%- elif message.role == \"assistant\" %}\n"
      "        {%- set content = message.content %}\n"
      "        {%- set reasoning_content = '' %}\n"
      "        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}\n"
      "            {%- set reasoning_content = message.reasoning_content %}\n"
      "        {%- else %}\n"
      "            {%- if '</think>' in message.content %}\n"
      "                {%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}\n"
      "                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\\n')"
      ".split('<think>')[-1].lstrip('\\n') %}\n"
      "            {%- endif %}\n"
      "        {%- endif %}\n"
      "        {%- if loop.index0 > ns.last_query_index %}\n"
      "            {%- if loop.last or (not loop.last and reasoning_content) %}\n"
      "                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n')\n"
      "                    + '\\n</think>\\n\\n' + content.lstrip('\\n') }}\n"
      "            {%- else %}\n"
      "                {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
      "            {%- endif %}\n"
      "        {%- else %}\n"
      "            {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
      "        {%- endif %}\n"
      "        {%- if message.tool_calls %}\n"
      "            {%- for tool_call in message.tool_calls %}\n"
      "                {%- if (loop.first and content) or (not loop.first) %}\n"
      "                    {{- '\\n' }}\n"
      "                {%- endif %}\n"
      "                {%- if tool_call.function %}\n"
      "                    {%- set tool_call = tool_call.function %}\n"
      "                {%- endif %}\n"
      "                {{- '<tool_call>\\n{\"name\": \"' }}\n"
      "                {{- tool_call.name }}\n"
      "                {{- '\", \"arguments\": ' }}\n"
      "                {%- if tool_call.arguments is string %}\n"
      "                    {{- tool_call.arguments }}\n"
      "                {%- else %}\n"
      "                    {{- tool_call.arguments | tojson }}\n"
      "                {%- endif %}\n"
      "                {{- '}\\n</tool_call>' }}\n"
      "            {%- endfor %}\n"
      "        {%- endif %}\n"
      "        {{- '<|im_end|>\\n' }}\n"
      "    {%- elif message.role == \"tool\" %}\n"
      "        {%- if loop.first or (messages[loop.index0 - 1].role != \"tool\") %}\n"
      "            {{- '<|im_start|>user' }}\n"
      "        {%- endif %}\n"
      "        {{- '\\n<tool_response>\\n' }}\n"
      "        {{- message.content }}\n"
      "        {{- '\\n</tool_response>' }}\n"
      "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
      "            {{- '<|im_end|>\\n' }}\n"
      "        {%- endif %}\n"
      "    {%- endif %}\n"
      "{%- endfor %}\n"
      "{%- if add_generation_prompt %}\n"
      "    {{- '<|im_start|>assistant\\n' }}\n"
      "    {%- if enable_thinking is defined and enable_thinking is false %}\n"
      "        {{- '<think>\\n\\n</think>\\n\\n' }}\n"
      "    {%- endif %}\n"
      "{%- endif %}")};
  return references;
}

// A template that is one of a family's references.
struct ReferenceMatch {
  std::optional<std::string> system;  // the text in its holes, when the reference has them
  size_t index = 0;                   // which reference matched
};

std::optional<ReferenceMatch> match_any(const std::string& n, const std::vector<std::string>& references) {
  for (size_t i = 0; i < references.size(); ++i)
    if (std::optional<std::string> text = match_reference(n, references[i])) {
      if (references[i].find(kHole) == std::string::npos) return ReferenceMatch{std::nullopt, i};
      return ReferenceMatch{std::move(text), i};
    }
  return std::nullopt;
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

// Phi-3.5-mini: <|role|> turns closed by <|end|>; a system message only when it has content.
bool is_phi35(const std::string& n) {
  return n ==
         "{%formessageinmessages%}{%ifmessage['role']=='system'andmessage['content']%}{{'<|system|>\\n'+"
         "message['content']+'<|end|>\\n'}}{%elifmessage['role']=='user'%}{{'<|user|>\\n'+message['content']+"
         "'<|end|>\\n'}}{%elifmessage['role']=='assistant'%}{{'<|assistant|>\\n'+message['content']+'<|end|>\\n'}}"
         "{%endif%}{%endfor%}{%ifadd_generation_prompt%}{{'<|assistant|>\\n'}}{%else%}{{eos_token}}{%endif%}";
}

// Gemma 1 and 2 (google/gemma-2-9b-it): no system role, "model" for the assistant.
bool is_gemma(const std::string& n) {
  static const std::string reference = normalize_exact(
      "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
      "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
      "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
      "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
      "{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
      "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}");
  return n == reference;
}

// Gemma 3 (google/gemma-3-*-it, laid out to fit the page): a system message's text and a blank
// line open the first turn.
bool is_gemma3(const std::string& n) {
  static const std::string reference = normalize_exact(
      "{{ bos_token }}\n"
      "{%- if messages[0]['role'] == 'system' -%}\n"
      "    {%- if messages[0]['content'] is string -%}\n"
      "        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
      "    {%- else -%}\n"
      "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n"
      "    {%- endif -%}\n"
      "    {%- set loop_messages = messages[1:] -%}\n"
      "{%- else -%}\n"
      "    {%- set first_user_prefix = \"\" -%}\n"
      "    {%- set loop_messages = messages -%}\n"
      "{%- endif -%}\n"
      "{%- for message in loop_messages -%}\n"
      "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
      "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
      "    {%- endif -%}\n"
      "    {%- if (message['role'] == 'assistant') -%}\n"
      "        {%- set role = \"model\" -%}\n"
      "    {%- else -%}\n"
      "        {%- set role = message['role'] -%}\n"
      "    {%- endif -%}\n"
      "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
      "    {%- if message['content'] is string -%}\n"
      "        {{ message['content'] | trim }}\n"
      "    {%- elif message['content'] is iterable -%}\n"
      "        {%- for item in message['content'] -%}\n"
      "            {%- if item['type'] == 'image' -%}\n"
      "                {{ '<start_of_image>' }}\n"
      "            {%- elif item['type'] == 'text' -%}\n"
      "                {{ item['text'] | trim }}\n"
      "            {%- endif -%}\n"
      "        {%- endfor -%}\n"
      "    {%- else -%}\n"
      "        {{ raise_exception(\"Invalid content type\") }}\n"
      "    {%- endif -%}\n"
      "    {{ '<end_of_turn>\\n' }}\n"
      "{%- endfor -%}\n"
      "{%- if add_generation_prompt -%}\n"
      "    {{'<start_of_turn>model\\n'}}\n"
      "{%- endif -%}\n");
  return n == reference;
}

// GPT-OSS (openai/gpt-oss-20b and -120b): the harmony format. The template's rendering path is
// matched whole, tool branches and refusals included; its tool-definition macros are not, since
// batch requests define no tools.
bool is_harmony(const std::string& n) {
  static const std::string system_head =
      "{%setmodel_identity='You are ChatGPT, a large language model trained by OpenAI.'%}"
      "{%endif%}{{model_identity+'\\n'}}{{'Knowledge cutoff: 2024-06\\n'}}"
      "{{'Current date: '+strftime_now('%Y-%m-%d')+'\\n\\n'}}{%ifreasoning_effortisnotdefined%}"
      "{%setreasoning_effort='medium'%}{%endif%}{{'Reasoning: '+reasoning_effort+'\\n\\n'}}";
  static const std::string system_tail_and_developer =
      "{{'# Valid channels: analysis, commentary, final. Channel must be included for every message.'}}"
      "{%iftools%}{{'\\nCalls to these tools must go to the commentary channel: \\'functions\\'.'}}"
      "{%endif%}{%endmacro%}{{'<|start|>system<|message|>'}}{{build_system_message()}}"
      "{{'<|end|>'}}{%ifmessages[0].role=='developer'ormessages[0].role=='system'%}"
      "{%setdeveloper_message=messages[0].content%}{%setloop_messages=messages[1:]%}"
      "{%else%}{%setdeveloper_message=''%}{%setloop_messages=messages%}"
      "{%endif%}{%ifdeveloper_messageortools%}{{'<|start|>developer<|message|>'}}"
      "{%ifdeveloper_message%}{{'# Instructions\\n\\n'}}{{developer_message}}"
      "{{'\\n\\n'}}{%endif%}{%iftools%}{{'# Tools\\n\\n'}}{{render_tool_namespace('functions',tools)}}"
      "{%endif%}{{'<|end|>'}}{%endif%}";
  static const std::string messages_and_generation =
      "{%setlast_tool_call=namespace(name=none)%}{%formessageinloop_messages%}"
      "{%ifmessage['role']=='assistant'%}{%if'content'inmessage%}{%if'<|channel|>analysis<|message|>'inmessage['content']or'<|channel|>final<|message|>'inmessage['content']%}"
      "{{raise_exception('You have passed a message containing <|channel|> tags in the content field. Instead of doing this, you should pass analysis messages (the string between \\'<|message|>\\' and \\'<|end|>\\') in the \\'thinking\\' field, and final messages (the string between \\'<|message|>\\' and \\'<|end|>\\') in the \\'content\\' field.')}}"
      "{%endif%}{%endif%}{%if'thinking'inmessage%}{%if'<|channel|>analysis<|message|>'inmessage.thinkingor'<|channel|>final<|message|>'inmessage.thinking%}"
      "{{raise_exception('You have passed a message containing <|channel|> tags in the thinking field. Instead of doing this, you should pass analysis messages (the string between \\'<|message|>\\' and \\'<|end|>\\') in the \\'thinking\\' field, and final messages (the string between \\'<|message|>\\' and \\'<|end|>\\') in the \\'content\\' field.')}}"
      "{%endif%}{%endif%}{%if'tool_calls'inmessage%}{%setfuture_final_message=namespace(found=false)%}"
      "{%forfuture_messageinloop_messages[loop.index:]%}{%iffuture_message['role']=='assistant'and'tool_calls'notinfuture_message%}"
      "{%setfuture_final_message.found=true%}{%endif%}{%endfor%}{%settool_call=message.tool_calls[0]%}"
      "{%iftool_call.function%}{%settool_call=tool_call.function%}{%endif%}"
      "{%ifmessage['content']andmessage.thinking%}{{raise_exception('Cannot pass both content and thinking in an assistant message with tool calls! Put the analysis message in one or the other, but not both.')}}"
      "{%elifmessage['content']andnotfuture_final_message.found%}{{'<|start|>assistant<|channel|>analysis<|message|>'+message['content']+'<|end|>'}}"
      "{%elifmessage.thinkingandnotfuture_final_message.found%}{{'<|start|>assistant<|channel|>analysis<|message|>'+message.thinking+'<|end|>'}}"
      "{%endif%}{{'<|start|>assistant to='}}{{'functions.'+tool_call.name+'<|channel|>commentary '}}"
      "{{(tool_call.content_typeiftool_call.content_typeisdefinedelse'json')+'<|message|>'}}"
      "{{tool_call.arguments|tojson}}{{'<|call|>'}}{%setlast_tool_call.name=tool_call.name%}"
      "{%elifloop.lastandnotadd_generation_prompt%}{%if'thinking'inmessage%}"
      "{{'<|start|>assistant<|channel|>analysis<|message|>'+message.thinking+'<|end|>'}}"
      "{%endif%}{{'<|start|>assistant<|channel|>final<|message|>'+message['content']+'<|return|>'}}"
      "{%else%}{{'<|start|>assistant<|channel|>final<|message|>'+message['content']+'<|end|>'}}"
      "{%setlast_tool_call.name=none%}{%endif%}{%elifmessage['role']=='tool'%}"
      "{%iflast_tool_call.nameisnone%}{{raise_exception('Message has tool role, but there was no previous assistant message with a tool call!')}}"
      "{%endif%}{{'<|start|>functions.'+last_tool_call.name}}{{' to=assistant<|channel|>commentary<|message|>'+message['content']|tojson+'<|end|>'}}"
      "{%elifmessage['role']=='user'%}{{'<|start|>user<|message|>'+message['content']+'<|end|>'}}"
      "{%endif%}{%endfor%}{%ifadd_generation_prompt%}{{'<|start|>assistant'}}{%endif%}";
  return has_all(n, {system_head, system_tail_and_developer}) && n.ends_with(messages_and_generation);
}

// The first literal assigned to date_string: Llama 3.1's default.
std::string date_default(const std::string& n) {
  const std::string_view head = "{%setdate_string='";
  const size_t p = n.find(head);
  if (p == std::string::npos) return {};
  const size_t q = p + head.size(), end = n.find('\'', q);
  return end == std::string::npos ? std::string() : n.substr(q, end - q);
}

// strftime_now(format): the local date, the C locale's English month names as Python's.
std::string today(const char* format) {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buf[32];
  std::strftime(buf, sizeof buf, format, &local);
  return buf;
}

}  // namespace

ChatTemplate ChatTemplate::chatml() { return ChatTemplate(); }

ChatTemplate ChatTemplate::parse(std::string_view source, ChatTokens tokens) {
  ChatTemplate t;
  t.tokens_ = std::move(tokens);
  const std::string n = normalize_exact(source);
  if (std::optional<ReferenceMatch> chatml = match_any(n, chatml_references())) {
    t.default_system_ = std::move(chatml->system);
    t.bos_first_ = n.rfind("{{bos_token}}", 0) == 0;
    return t;
  }
  if (std::optional<ReferenceMatch> qwen = match_any(n, qwen25_references())) {
    t.format_ = ChatFormat::Qwen25;
    t.default_system_ = std::move(qwen->system);
    t.tools_example_braces_ = qwen->index == 1;  // qwen25_references()' second
    return t;
  }
  if (match_any(n, qwen3_references())) {
    t.format_ = ChatFormat::Qwen3;
    return t;
  }
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
  else if (is_phi35(n))
    t.format_ = ChatFormat::Phi35;
  else if (is_gemma(n))
    t.format_ = ChatFormat::Gemma;
  else if (is_gemma3(n))
    t.format_ = ChatFormat::Gemma3;
  else if (is_harmony(n))
    t.format_ = ChatFormat::Harmony, t.today_ = today("%Y-%m-%d");
  else
    return interpreted(source, std::move(t.tokens_));
  if (t.format_ == ChatFormat::Llama31) {
    t.date_is_today_ =
        n.find("{%ifstrftime_nowisdefined%}{%setdate_string=strftime_now('%d %b %Y')%}") != std::string::npos;
    t.date_ = date_default(n);
    if (t.date_is_today_)
      t.today_ = today("%d %b %Y");
    else if (t.date_.empty())
      return interpreted(source, std::move(t.tokens_));  // Llama 3.1's shape without its date default
  }
  return t;
}

}  // namespace strata
