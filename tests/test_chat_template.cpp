// Chat template families against Jinja2's renderings of the same templates
// (tests/fixtures/chat/make_chat_cases.py), the refusals included.
#include <algorithm>
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>

#include "strata/model/chat_json.h"
#include "strata/model/chat_template.h"
#include "strata/model/model_loader.h"
#include "strata/model/tokenizer.h"
#include "temp_files.h"
#include "test_paths.h"

using namespace strata;
using json = nlohmann::json;

namespace {

// Ordered: a tool call's arguments keep their keys' order, as Python's dicts do.
nlohmann::ordered_json chat_cases() {
  std::ifstream in(std::string(STRATA_FIXTURES_DIR) + "/chat/chat_cases.json");
  REQUIRE(in);
  return nlohmann::ordered_json::parse(in);
}

ChatTemplate parse_fixture(const nlohmann::ordered_json& t, const std::string& today) {
  ChatTemplate tpl = ChatTemplate::parse(t["source"].get<std::string>(),
                                         {t["bos_token"].get<std::string>(), t["eos_token"].get<std::string>()});
  tpl.set_today(today);
  return tpl;
}

// The fixture's messages: OpenAI's (content null beside tool calls, arguments a string of JSON)
// or transformers' (arguments an object, written here as its JSON text).
std::vector<ChatMessage> messages_of(const nlohmann::ordered_json& c) {
  std::vector<ChatMessage> msgs;
  for (const auto& m : c["messages"]) {
    ChatMessage msg{m["role"].get<std::string>(), m["content"].is_null() ? "" : m["content"].get<std::string>()};
    if (m.contains("tool_calls"))
      for (const auto& call : m["tool_calls"]) {
        const auto& args = call["function"]["arguments"];
        msg.tool_calls.push_back({call["function"]["name"].get<std::string>(),
                                  args.is_string() ? args.get<std::string>() : args.dump(), call.value("id", "")});
      }
    if (m.contains("tool_call_id")) msg.tool_call_id = m["tool_call_id"].get<std::string>();
    if (m.contains("name")) msg.name = m["name"].get<std::string>();
    if (m.contains("reasoning_content")) msg.reasoning_content = m["reasoning_content"].get<std::string>();
    msgs.push_back(std::move(msg));
  }
  return msgs;
}

// `s` with its first `from` replaced by `to` (which must be there).
std::string edited(std::string s, const std::string& from, const std::string& to) {
  const size_t p = s.find(from);
  REQUIRE(p != std::string::npos);
  return s.replace(p, from.size(), to);
}

// One fixture case: Jinja2's text, or its refusal (`error`; `undefined`: Jinja's own words), or
// Strata's deliberate one (`strata_refuses`). Counts it as rendered or refused.
void check_case(const ChatTemplate& tpl, const nlohmann::ordered_json& c, const ChatOptions& options, int& rendered,
                int& refused) {
  const std::vector<ChatMessage> msgs = messages_of(c);
  const bool gen = c["add_generation_prompt"].get<bool>();
  if (c.contains("undefined")) {
    CHECK_THROWS_AS(tpl.render(msgs, gen, options), ChatTemplateError);
  } else if (c.contains("error") || c.contains("strata_refuses")) {
    const std::string message = c.contains("error") ? c["error"].get<std::string>() : c["strata_refuses"].get<std::string>();
    CHECK_THROWS_MATCHES(tpl.render(msgs, gen, options), ChatTemplateError, Catch::Message(message));
  } else {
    CHECK(tpl.render(msgs, gen, options) == c["text"].get<std::string>());
    ++rendered;
    return;
  }
  ++refused;
}

}  // namespace

TEST_CASE("chat templates render as Jinja2 renders them, refusals included", "[chat]") {
  const auto ex = chat_cases();
  const std::string today = ex["today"].get<std::string>();
  int rendered = 0, refused = 0, thinking = 0, with_tools = 0;
  for (const auto& c : ex["cases"]) {
    const std::string name = c["template"].get<std::string>();
    const ChatTemplate tpl = parse_fixture(ex["templates"][name], today);
    ChatOptions options;
    if (c.contains("enable_thinking")) options.enable_thinking = c["enable_thinking"].get<bool>(), ++thinking;
    if (c.contains("tools")) {
      for (const auto& tool : c["tools"]) options.tools.push_back(tool.dump());  // in the keys' order
      ++with_tools;
    }
    INFO(name << ": " << c["messages"].dump() << (c["add_generation_prompt"].get<bool>() ? " + generation prompt" : "")
              << (options.enable_thinking ? (*options.enable_thinking ? " thinking" : " not thinking") : "")
              << (c.contains("tools") ? " tools " + c["tools"].dump() : ""));
    check_case(tpl, c, options, rendered, refused);
  }
  CHECK(rendered > 400);
  CHECK(thinking == 16);
  CHECK(with_tools == 128);
  CHECK(refused >= 20);
}

TEST_CASE("chat templates are recognized by family", "[chat]") {
  const auto ex = chat_cases();
  const std::pair<const char*, ChatFormat> families[] = {
      {"llama3", ChatFormat::Llama3},       {"llama3.1", ChatFormat::Llama31},
      {"llama3.2", ChatFormat::Llama31},    {"llama2", ChatFormat::Llama2},
      {"mistral", ChatFormat::Mistral},     {"zephyr", ChatFormat::Zephyr},
      {"llama3-raw-newlines", ChatFormat::Llama3}, {"zephyr-raw-newlines", ChatFormat::Zephyr},
      {"chatml", ChatFormat::ChatML},       {"chatml-bos", ChatFormat::ChatML},
      {"chatml-generation-default", ChatFormat::ChatML}, {"chatml-one-end", ChatFormat::ChatML},
      {"qwen2", ChatFormat::ChatML},        {"smollm2", ChatFormat::ChatML},
      {"qwen2.5", ChatFormat::Qwen25},      {"qwen2.5-gguf", ChatFormat::Qwen25},
      {"qwen2.5-base", ChatFormat::Qwen25}, {"qwen3", ChatFormat::Qwen3},
      {"phi3.5", ChatFormat::Phi35},        {"gemma", ChatFormat::Gemma},
      {"gemma3", ChatFormat::Gemma3},       {"gemma3-escaped-newlines", ChatFormat::Gemma3}};
  for (const auto& [name, format] : families) {
    INFO(name);
    CHECK(ChatTemplate::parse(ex["templates"][name]["source"].get<std::string>()).format() == format);
  }
  // Templates of no known family run in the interpreter (and render as Jinja2 does, above).
  REQUIRE(ex["interpreted"].size() == 6);
  for (const auto& name : ex["interpreted"]) {
    INFO(name);
    CHECK(ChatTemplate::parse(ex["templates"][name.get<std::string>()]["source"].get<std::string>()).format() ==
          ChatFormat::Jinja);
  }
  // The default system message is the template's literal, read with Jinja's escapes.
  auto default_system = [&](const char* name) {
    return ChatTemplate::parse(ex["templates"][name]["source"].get<std::string>()).default_system();
  };
  CHECK(default_system("qwen2.5") == "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  CHECK(default_system("qwen2.5-base") == "You are a helpful assistant.");
  CHECK(default_system("qwen2") == "You are a helpful assistant.");
  CHECK(default_system("smollm2") == "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  CHECK_FALSE(default_system("chatml"));
  CHECK_FALSE(default_system("qwen3"));
  // Jinja reads \\ \' \" \t \n in a literal; a template with others (\u00e9, \x41) is interpreted.
  const std::string qwen2 = ex["templates"]["qwen2"]["source"].get<std::string>();
  const size_t at = qwen2.find("You are");
  CHECK(ChatTemplate::parse(std::string(qwen2).replace(at, 7, R"(You\'re\\\t\")")).default_system() ==
        "You're\\\t\" a helpful assistant.");
  CHECK(ChatTemplate::parse(std::string(qwen2).replace(at, 7, R"(\u00e9)")).format() == ChatFormat::Jinja);
  // Llama 3.2 reads today's date at parse time; 3.1 keeps its literal.
  const ChatTemplate t32 = ChatTemplate::parse(ex["templates"]["llama3.2"]["source"].get<std::string>());
  CHECK_THAT(t32.render({{"user", "x"}}), !Catch::Contains("26 Jul 2024"));
  const ChatTemplate t31 = ChatTemplate::parse(ex["templates"]["llama3.1"]["source"].get<std::string>());
  CHECK_THAT(t31.render({{"user", "x"}}), Catch::Contains("Today Date: 26 Jul 2024\n\n"));
}

TEST_CASE("chat templates that differ from a family in what they print are left to the interpreter", "[chat]") {
  const auto ex = chat_cases();
  auto source = [&](const char* name) { return ex["templates"][name]["source"].get<std::string>(); };
  // A space inside a literal is part of the prompt: '[INST]' without its space is another format.
  CHECK(ChatTemplate::parse(edited(source("mistral"), "'[INST] '", "'[INST]'")).format() == ChatFormat::Jinja);
  CHECK(ChatTemplate::parse(edited(source("llama2"), "<<SYS>>", "<<SYSTEM>>")).format() == ChatFormat::Jinja);
  CHECK(ChatTemplate::parse(edited(source("llama3"), "| trim", "")).format() == ChatFormat::Jinja);
  CHECK(ChatTemplate::parse(edited(source("llama3.1"), "December 2023", "December 2024")).format() == ChatFormat::Jinja);
  // Zephyr's newlines after each turn come from the source's line breaks.
  CHECK(ChatTemplate::parse(edited(source("zephyr"), "eos_token }}\n{% elif message['role'] == 'system'",
                                               "eos_token }}{% elif message['role'] == 'system'")).format() == ChatFormat::Jinja);
  // Text between tags is printed: a space there is part of the prompt, as in the literals.
  const std::string spaced_tags = edited(source("mistral"), "{% endif %}{% endfor %}", "{% endif %} {% endfor %}");
  CHECK(ChatTemplate::parse(spaced_tags).format() == ChatFormat::Jinja);
  CHECK(ChatTemplate::parse(edited(source("llama3"), "{{ content }}", "{{ content }}\n")).format() == ChatFormat::Jinja);
  // ... but not the newline trim_blocks drops after a block tag, nor the indentation lstrip_blocks
  // drops before one, nor whitespace a '-' marker strips.
  const std::string indented = edited(source("llama3"), "{% endfor %}", "{% endfor %}\n    ");
  CHECK(ChatTemplate::parse(indented).format() == ChatFormat::Llama3);
  CHECK(ChatTemplate::parse(edited(source("llama3"), "{{ content }}", "{{ content -}}\n\n ")).format() ==
        ChatFormat::Llama3);
  // Whitespace outside literals and the trim markers do not matter.
  std::string spaced = edited(source("mistral"), "{% for message in messages %}", "{%- for  message in messages -%}\n");
  CHECK(ChatTemplate::parse(spaced).format() == ChatFormat::Mistral);
  CHECK(ChatTemplate::parse("{{ messages[0]['content'] }}").format() == ChatFormat::Jinja);
  CHECK_THROWS_WITH(ChatTemplate::parse(" \n"), "the chat template is empty");
}

TEST_CASE("ChatML and Qwen2.5 are recognized whole: a template with more or other constructs is interpreted",
          "[chat]") {
  const auto ex = chat_cases();
  auto source = [&](const char* name) { return ex["templates"][name]["source"].get<std::string>(); };
  auto refused = [](const std::string& t) {
    INFO(t);
    CHECK(ChatTemplate::parse(t).format() == ChatFormat::Jinja);
  };
  const std::string chatml = source("chatml"), turn = "{{'<|im_start|>' + message['role']";
  // Plain ChatML with what it does not render: a tools branch, a tool role, tool calls, trimming.
  refused("{% if tools %}{{ '<|im_start|>system\n' + tools | tojson + '<|im_end|>\n' }}{% endif %}" + chatml);
  refused(edited(edited(chatml, turn,
                        "{% if message['role'] == 'tool' %}{{ '<|im_start|>user\n<tool_response>\n' + "
                        "message['content'] + '\n</tool_response><|im_end|>\n' }}{% else %}" + turn),
                 "{% endfor %}", "{% endif %}{% endfor %}"));
  refused(edited(edited(chatml, turn, "{% if message['role'] != 'tool' %}" + turn), "{% endfor %}",
                 "{% endif %}{% endfor %}"));
  refused(edited(chatml, "{% endfor %}",
                 "{% for tool_call in message.tool_calls %}{{ tool_call.function | tojson }}{% endfor %}{% endfor %}"));
  refused(edited(chatml, "message['content']", "message['content'] | trim"));
  refused(edited(chatml, "{{ '<|im_start|>assistant\\n' }}", "{{ '<|im_start|>assistant\\n<think>\\n' }}"));
  // Text between tags is printed: a newline after each turn is another prompt.
  refused(edited(chatml, "}}{% endfor %}", "}}\n{% endfor %}"));
  refused(edited(source("smollm2"), "loop.first and ", ""));  // a default before every message
  // Qwen2.5: its tools branch (not rendered, but part of what the template is), its tool
  // responses and calls, and the same default system message in both branches.
  const std::string qwen = source("qwen2.5");
  refused(edited(qwen, "You may call one or more functions", "You may call functions"));
  refused(edited(qwen, "'\\n<tool_response>\\n'", "'\\n<tool_result>\\n'"));
  refused(edited(qwen, "(message.role == \"system\" and not loop.first) or ", ""));
  refused(edited(qwen, "{{- tool_call.arguments | tojson }}", "{{- tool_call.arguments }}"));
  refused(edited(qwen, "'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.'", "'Hi.'"));
  refused(edited(qwen, "{%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}", "{%- if true %}"));
  refused(qwen + "{{ eos_token }}");
  // Qwen3: its reasoning and its multi-step tool handling are part of what it prints.
  const std::string qwen3 = source("qwen3");
  refused(edited(qwen3, "{%- if loop.index0 > ns.last_query_index %}", "{%- if true %}"));
  refused(edited(qwen3, "reasoning_content.strip('\\n')", "reasoning_content"));
  refused(edited(qwen3, "{{- '<think>\\n\\n</think>\\n\\n' }}", "{{- '<think></think>' }}"));
  refused(edited(qwen3, "{%- if tool_call.arguments is string %}", "{%- if false %}"));
  // ... but layout is not what it prints.
  CHECK(ChatTemplate::parse(edited(qwen, "{%- for message in messages %}\n", "{% for message in messages -%}\n  "))
            .format() == ChatFormat::Qwen25);
}

TEST_CASE("tool calls: rendered by Qwen2.5 and Llama 3.1, refused by the families that would drop them", "[chat]") {
  const auto ex = chat_cases();
  auto parse = [&](const char* name) { return parse_fixture(ex["templates"][name], ex["today"]); };
  const std::vector<ChatMessage> call = {{"user", "x"}, {"assistant", "", {{"f", R"({"a": 1})"}}}};
  for (const char* name : {"chatml", "smollm2", "llama3", "llama2", "mistral", "zephyr"}) {
    INFO(name);
    CHECK_THROWS_MATCHES(parse(name).render(call), ChatTemplateError,
                         Catch::Message("this chat template does not render tool calls"));
  }
  CHECK_THAT(parse("qwen2.5").render(call), Catch::Contains("{\"name\": \"f\", \"arguments\": {\"a\": 1}}"));
  CHECK_THAT(parse("qwen3").render(call), Catch::Contains("{\"name\": \"f\", \"arguments\": {\"a\": 1}}"));
  CHECK_THAT(parse("llama3.1").render(call), Catch::Contains("{\"name\": \"f\", \"parameters\": {\"a\": 1}}"));
  // Arguments that json.loads would not read as Python's json.dumps prints them are refused.
  for (const char* bad : {"{\"a\": }", "NaN", "[1, 2", "18446744073709551616", "{\"a\": -9223372036854775809}"}) {
    INFO(bad);
    CHECK_THROWS_AS(parse("qwen2.5").render({{"assistant", "", {{"f", bad}}}}), ChatTemplateError);
    CHECK_THROWS_AS(parse("llama3.1").render({{"assistant", "", {{"f", bad}}}}), ChatTemplateError);
  }
  CHECK_THROWS_WITH(parse("qwen2.5").render({{"assistant", "", {{"f", std::string(100000, '[')}}}}),
                    Catch::Contains("nested deeper than 512"));
  // Tool definitions: the families Strata does not write them for refuse them, rather than
  // rendering a prompt that never names the tools (Llama 3.1's template would write them).
  ChatOptions tools;
  tools.tools = {R"({"type": "function", "function": {"name": "f"}})"};
  for (const char* name : {"chatml", "llama3", "llama2", "mistral", "phi3.5", "gemma3"}) {
    INFO(name);
    CHECK_THROWS_MATCHES(parse(name).render({{"user", "x"}}, true, tools), ChatTemplateError,
                         Catch::Message("this chat template does not write tool definitions (it never reads `tools`)"));
    CHECK_FALSE(parse(name).renders_tools());
  }
  // Llama 3.1 writes the tools into the first message after the system's, dropping that message's
  // tool calls without a word: refused here.
  const std::vector<ChatMessage> call_first = {{"system", "s"}, {"assistant", "", {{"f", "{}"}}}, {"user", "x"}};
  CHECK_THROWS_WITH(parse("llama3.1").render(call_first, true, tools), Catch::Contains("cannot carry tool calls"));
  CHECK_NOTHROW(parse("llama3.1").render(call_first));  // without tools, the calls are written
  tools.tools = {"{\"name\": NaN}"};
  CHECK_THROWS_WITH(parse("qwen3").render({{"user", "x"}}, true, tools), Catch::StartsWith("a tool: "));
}

TEST_CASE("python_tojson prints JSON as Python's json.dumps(json.loads(text), ensure_ascii=False)", "[chat]") {
  // Expected strings from Python 3.11.
  CHECK(python_tojson("[1e16, 1e15, 0.1, -0.0, 5e-324, 1.7976931348623157e308, 123456789.123456789, 1e-4, 1e-5]") ==
        "[1e+16, 1000000000000000.0, 0.1, -0.0, 5e-324, 1.7976931348623157e+308, 123456789.12345679, 0.0001, 1e-05]");
  CHECK(python_tojson(R"({"b": 1, "a": {"c": [], "b": "\u00e9\n"}, "b": 3})") ==
        "{\"b\": 3, \"a\": {\"c\": [], \"b\": \"\xc3\xa9\\n\"}}");
  CHECK(python_tojson("  \"x\"  ") == "\"x\"");
  CHECK(python_tojson("-0") == "0");
  CHECK_THROWS_WITH(python_tojson("123456789012345678901"), "an integer beyond 64 bits: 123456789012345678901");
  CHECK_THROWS_WITH(python_tojson("{x"), Catch::StartsWith("not JSON: "));
  CHECK_THROWS_AS(python_tojson("1E400"), ChatTemplateError);  // Python: Infinity, which is not JSON
  // tojson(indent=N), as json.dumps(..., indent=N) prints (Python 3.11).
  CHECK(python_tojson(R"({"a": [], "b": {}, "c": [1, {"d": null, "e": 1e16}], "\u00e9": "x"})", 2) ==
        "{\n  \"a\": [],\n  \"b\": {},\n  \"c\": [\n    1,\n    {\n      \"d\": null,\n      \"e\": 1e+16\n"
        "    }\n  ],\n  \"\xc3\xa9\": \"x\"\n}");
  CHECK(python_tojson("[[]]", 0) == "[\n[]\n]");
  CHECK(python_tojson("\"s\"", 4) == "\"s\"");
}

TEST_CASE("a rendered chat tokenizes as apply_chat_template's: the template's BOS and EOS are the special tokens",
          "[chat][tokenizer]") {
  const auto ex = chat_cases();
  for (const auto& c : ex["token_cases"]) {
    const std::string model = c["model"].get<std::string>(), name = c["template"].get<std::string>();
    INFO(model << " " << name << ": " << c["messages"].dump());
    const std::string dir = std::string(STRATA_FIXTURES_DIR) + "/" + c["tokenizer"].get<std::string>();
    const Tokenizer tok = Tokenizer::from_dir(dir);
    const std::string text = parse_fixture(ex["templates"][name], ex["today"]).render(messages_of(c));
    CHECK(tok.encode(text) == c["ids"].get<std::vector<int32_t>>());
  }
}

TEST_CASE("a model directory's chat template: chat_template.jinja, else tokenizer_config.json's default", "[chat]") {
  namespace fs = std::filesystem;
  const fs::path dir = test::temp_dir("chat") / "config";
  fs::remove_all(dir);
  fs::create_directories(dir);
  // Named templates (transformers' list form): the one named "default" is used.
  const json named = json::array({{{"name", "tool_use"}, {"template", "T"}}, {{"name", "default"}, {"template", "D"}}});
  const json added_token = {{"content", "<s>"}, {"lstrip", false}};
  test::write_file(dir / "tokenizer_config.json",
                   json{{"chat_template", named}, {"bos_token", added_token}, {"eos_token", "</s>"}}.dump());
  HfChat chat = hf_chat(dir);
  CHECK(chat.chat_template == "D");
  CHECK(chat.tokens.bos == "<s>");
  CHECK(chat.tokens.eos == "</s>");
  // transformers 4.50 and later write the template to its own file, which comes first.
  test::write_file(dir / "chat_template.jinja", "{{ bos_token }}J\n");
  CHECK(hf_chat(dir).chat_template == "{{ bos_token }}J\n");
  fs::remove(dir / "tokenizer_config.json");
  chat = hf_chat(dir);
  CHECK(chat.chat_template == "{{ bos_token }}J\n");
  CHECK(chat.tokens.bos.empty());
}

namespace {

nlohmann::ordered_json harmony_cases() {
  std::ifstream in(std::string(STRATA_FIXTURES_DIR) + "/chat/harmony_cases.json");
  REQUIRE(in);
  return nlohmann::ordered_json::parse(in);
}

ChatTemplate harmony_template(const nlohmann::ordered_json& ex) {
  ChatTemplate tpl = ChatTemplate::parse(ex["source"].get<std::string>());
  REQUIRE(tpl.format() == ChatFormat::Harmony);
  tpl.set_today(ex["today"].get<std::string>());
  return tpl;
}

}  // namespace

// Expected texts: Jinja2 rendering GPT-OSS's published template (make_harmony_cases.py).
TEST_CASE("GPT-OSS's harmony template renders as Jinja2 renders it, refusals included", "[chat][harmony]") {
  const auto ex = harmony_cases();
  const ChatTemplate tpl = harmony_template(ex);
  int rendered = 0, refused = 0, efforts = 0;
  for (const auto& c : ex["cases"]) {
    ChatOptions options;
    if (c.contains("reasoning_effort")) options.reasoning_effort = c["reasoning_effort"].get<std::string>(), ++efforts;
    INFO(c["messages"].dump() << (c["add_generation_prompt"].get<bool>() ? " + generation prompt" : "") << " effort '"
                              << options.reasoning_effort << "'");
    check_case(tpl, c, options, rendered, refused);
  }
  CHECK(rendered >= 35);
  CHECK(refused >= 15);
  CHECK(efforts == 4);
}

TEST_CASE("GPT-OSS's template is recognized whole and a changed rendering path is interpreted", "[chat][harmony]") {
  const auto ex = harmony_cases();
  const std::string source = ex["source"].get<std::string>();
  CHECK(ChatTemplate::parse(source).format() == ChatFormat::Harmony);
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"Knowledge cutoff: 2024-06", "Knowledge cutoff: 2025-01"},
           {"\"# Instructions\\n\\n\"", "\"# Instructions\\n\""},
           {"+ \"<|return|>\"", "+ \"<|end|>\""},
           {"<|start|>assistant\n{%- endif -%}", "<|start|>assistant<|channel|>final<|message|>\n{%- endif -%}"},
           {"{%- set reasoning_effort = \"medium\" %}", "{%- set reasoning_effort = \"high\" %}"}}) {
    INFO(from);
    CHECK(ChatTemplate::parse(edited(source, from, to)).format() == ChatFormat::Jinja);
  }
}

TEST_CASE("a harmony rendering tokenizes with the harmony special tokens", "[chat][harmony]") {
  const auto ex = harmony_cases();
  const ChatTemplate tpl = harmony_template(ex);
  const Tokenizer tok = Tokenizer::from_dir(std::string(STRATA_FIXTURES_DIR) + "/tokenizer/o200k-style");
  for (const auto& c : ex["token_cases"]) {
    INFO(c["messages"].dump());
    CHECK(tok.encode(tpl.render(messages_of(c))) == c["ids"].get<std::vector<int32_t>>());
  }
}

TEST_CASE("every fixture template run by the interpreter renders as Jinja2 does, refusals included", "[chat][jinja]") {
  // The same expected texts as the families' renderers are held to; where Strata's renderer refuses
  // what Jinja renders (strata_refuses), the fixture has no text to compare.
  int rendered = 0, refused = 0;
  auto run = [&](const ChatTemplate& tpl, const nlohmann::ordered_json& c, const ChatOptions& options) {
    if (c.contains("strata_refuses")) return;
    check_case(tpl, c, options, rendered, refused);
  };
  const auto ex = chat_cases();
  for (const auto& c : ex["cases"]) {
    const auto& t = ex["templates"][c["template"].get<std::string>()];
    ChatTemplate tpl = ChatTemplate::interpreted(t["source"].get<std::string>(), {t["bos_token"].get<std::string>(),
                                                                                  t["eos_token"].get<std::string>()});
    tpl.set_today(ex["today"].get<std::string>());
    ChatOptions options;
    if (c.contains("enable_thinking")) options.enable_thinking = c["enable_thinking"].get<bool>();
    if (c.contains("tools"))
      for (const auto& tool : c["tools"]) options.tools.push_back(tool.dump());
    INFO(c["template"].get<std::string>() << ": " << c["messages"].dump()
                                          << (c["add_generation_prompt"].get<bool>() ? " + generation prompt" : "")
                                          << (c.contains("tools") ? " tools " + c["tools"].dump() : ""));
    run(tpl, c, options);
  }
  const auto harmony = harmony_cases();
  ChatTemplate tpl = ChatTemplate::interpreted(harmony["source"].get<std::string>());
  tpl.set_today(harmony["today"].get<std::string>());
  for (const auto& c : harmony["cases"]) {
    ChatOptions options;
    if (c.contains("reasoning_effort")) options.reasoning_effort = c["reasoning_effort"].get<std::string>();
    INFO("harmony: " << c["messages"].dump() << " effort '" << options.reasoning_effort << "'");
    run(tpl, c, options);
  }
  CHECK(rendered > 450);
  CHECK(refused >= 30);
}

TEST_CASE("an interpreted template: its variables, its refusals and its errors", "[chat][jinja]") {
  const ChatTemplate t = ChatTemplate::parse(
      "{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m.content }}"
      "{% for c in m.tool_calls %}({{ c.function.name }} {{ c.function.arguments | tojson }}){% endfor %}]{% endfor %}"
      "{% if tools %}{{ tools | map(attribute='function') | map(attribute='name') | join(',') }}{% endif %}"
      "{% if enable_thinking is defined %}think={{ enable_thinking }}{% endif %}"
      "{% if reasoning_effort is defined %}effort={{ reasoning_effort }}{% endif %}"
      "{% if thinking is defined %}{{ thinking }}{{ style[1] }}{% endif %}"
      "{% if messages[0].role == 'tool' %}{{ raise_exception('no tool results first') }}{% endif %}"
      "{% if add_generation_prompt %}>{{ strftime_now('%Y') }}{% endif %}{{ eos_token }}",
      {"<s>", "</s>"});
  REQUIRE(t.format() == ChatFormat::Jinja);
  CHECK(t.renders_tools());
  ChatTemplate fixed = t;
  fixed.set_today("TODAY");
  ChatOptions options;
  options.tools = {R"({"type": "function", "function": {"name": "f"}})",
                   R"({"type": "function", "function": {"name": "g"}})"};
  options.enable_thinking = false;
  options.reasoning_effort = "low";
  options.variables = {{"thinking", "true"}, {"style", R"([1, "x"])"}};  // chat_template_kwargs
  CHECK(fixed.render({{"user", "x"}, {"assistant", "", {{"f", R"({"b": 1, "a": [1.5, "é"]})"}}}}, true, options) ==
        "<s>[user:x][assistant:(f {\"b\": 1, \"a\": [1.5, \"é\"]})]f,gthink=Falseeffort=lowTruex>TODAY</s>");
  CHECK(fixed.render({{"user", "x"}}, false) == "<s>[user:x]</s>");
  // Unset, strftime_now is the local time's.
  const std::string year = t.render({{"user", "x"}}).substr(12, 4);
  CHECK(std::all_of(year.begin(), year.end(), [](char c) { return c >= '0' && c <= '9'; }));
  CHECK_THROWS_MATCHES(t.render({{"tool", "r"}}), ChatTemplateError, Catch::Message("no tool results first"));
  CHECK_THROWS_WITH(t.render({{"assistant", "", {{"f", "{not json"}}}}),
                    Catch::StartsWith("the arguments of tool call 'f': not JSON"));
  // A template that does not read `tools` refuses them rather than dropping them without a word.
  const ChatTemplate plain = ChatTemplate::parse("{% for m in messages %}{{ m.content }}{% endfor %}");
  CHECK_FALSE(plain.renders_tools());
  CHECK_THROWS_WITH(plain.render({{"user", "x"}}, true, options),
                    "this chat template does not write tool definitions (it never reads `tools`)");
  // Jinja's own errors name the line; a template Jinja cannot compile fails at parse.
  CHECK_THROWS_WITH(ChatTemplate::parse("{% for m in messages %}\n{{ m.content }"),
                    Catch::StartsWith("chat template: line 2"));
  CHECK_THROWS_WITH(ChatTemplate::parse("{{ messages[0].content.x.y }}").render({{"user", "x"}}),
                    Catch::StartsWith("chat template: line 1"));
}
