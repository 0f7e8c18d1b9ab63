// Chat template families against Jinja2's renderings of the same templates
// (tests/fixtures/chat/make_chat_cases.py), the refusals included.
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>

#include "strata/model/chat_template.h"
#include "strata/model/model_loader.h"
#include "strata/model/tokenizer.h"
#include "temp_files.h"
#include "test_paths.h"

using namespace strata;
using json = nlohmann::json;

namespace {

json chat_cases() {
  std::ifstream in(std::string(STRATA_FIXTURES_DIR) + "/chat/chat_cases.json");
  REQUIRE(in);
  return json::parse(in);
}

ChatTemplate parse_fixture(const json& t, const std::string& today) {
  ChatTemplate tpl = ChatTemplate::parse(t["source"].get<std::string>(),
                                         {t["bos_token"].get<std::string>(), t["eos_token"].get<std::string>()});
  tpl.set_today(today);
  return tpl;
}

std::vector<ChatMessage> messages_of(const json& c) {
  std::vector<ChatMessage> msgs;
  for (const json& m : c["messages"]) msgs.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  return msgs;
}

}  // namespace

TEST_CASE("chat templates render as Jinja2 renders them, refusals included", "[chat]") {
  const json ex = chat_cases();
  const std::string today = ex["today"].get<std::string>();
  int rendered = 0, refused = 0;
  for (const json& c : ex["cases"]) {
    const std::string name = c["template"].get<std::string>();
    const ChatTemplate tpl = parse_fixture(ex["templates"][name], today);
    const std::vector<ChatMessage> msgs = messages_of(c);
    const bool gen = c["add_generation_prompt"].get<bool>();
    INFO(name << ": " << c["messages"].dump() << (gen ? " + generation prompt" : ""));
    if (c.contains("error")) {
      CHECK_THROWS_MATCHES(tpl.render(msgs, gen), ChatTemplateError, Catch::Message(c["error"].get<std::string>()));
      ++refused;
    } else {
      CHECK(tpl.render(msgs, gen) == c["text"].get<std::string>());
      ++rendered;
    }
  }
  CHECK(rendered > 100);
  CHECK(refused >= 10);
}

TEST_CASE("chat templates are recognized by family", "[chat]") {
  const json ex = chat_cases();
  const std::pair<const char*, ChatFormat> families[] = {
      {"llama3", ChatFormat::Llama3}, {"llama3.1", ChatFormat::Llama31}, {"llama3.2", ChatFormat::Llama31},
      {"llama2", ChatFormat::Llama2}, {"mistral", ChatFormat::Mistral},  {"zephyr", ChatFormat::Zephyr},
      {"llama3-raw-newlines", ChatFormat::Llama3}, {"zephyr-raw-newlines", ChatFormat::Zephyr}};
  for (const auto& [name, format] : families) {
    INFO(name);
    CHECK(ChatTemplate::parse(ex["templates"][name]["source"].get<std::string>()).format() == format);
  }
  // Llama 3.2 reads today's date at parse time; 3.1 keeps its literal.
  const ChatTemplate t32 = ChatTemplate::parse(ex["templates"]["llama3.2"]["source"].get<std::string>());
  CHECK_THAT(t32.render({{"user", "x"}}), !Catch::Contains("26 Jul 2024"));
  const ChatTemplate t31 = ChatTemplate::parse(ex["templates"]["llama3.1"]["source"].get<std::string>());
  CHECK_THAT(t31.render({{"user", "x"}}), Catch::Contains("Today Date: 26 Jul 2024\n\n"));
}

TEST_CASE("chat templates that differ from a family in what they print are refused", "[chat]") {
  const json ex = chat_cases();
  auto source = [&](const char* name) { return ex["templates"][name]["source"].get<std::string>(); };
  auto edited = [](std::string s, const std::string& from, const std::string& to) {
    const size_t p = s.find(from);
    REQUIRE(p != std::string::npos);
    return s.replace(p, from.size(), to);
  };
  const std::string unsupported = "unsupported chat template";
  // A space inside a literal is part of the prompt: '[INST]' without its space is another format.
  CHECK_THROWS_WITH(ChatTemplate::parse(edited(source("mistral"), "'[INST] '", "'[INST]'")),
                    Catch::StartsWith(unsupported));
  CHECK_THROWS_WITH(ChatTemplate::parse(edited(source("llama2"), "<<SYS>>", "<<SYSTEM>>")),
                    Catch::StartsWith(unsupported));
  CHECK_THROWS_WITH(ChatTemplate::parse(edited(source("llama3"), "| trim", "")), Catch::StartsWith(unsupported));
  CHECK_THROWS_WITH(ChatTemplate::parse(edited(source("llama3.1"), "December 2023", "December 2024")),
                    Catch::StartsWith(unsupported));
  // Zephyr's newlines after each turn come from the source's line breaks.
  CHECK_THROWS_WITH(ChatTemplate::parse(edited(source("zephyr"), "eos_token }}\n{% elif message['role'] == 'system'",
                                               "eos_token }}{% elif message['role'] == 'system'")),
                    Catch::StartsWith(unsupported));
  // Text between tags is printed: a space there is part of the prompt, as in the literals.
  const std::string spaced_tags = edited(source("mistral"), "{% endif %}{% endfor %}", "{% endif %} {% endfor %}");
  CHECK_THROWS_WITH(ChatTemplate::parse(spaced_tags), Catch::StartsWith(unsupported));
  CHECK_THROWS_WITH(ChatTemplate::parse(edited(source("llama3"), "{{ content }}", "{{ content }}\n")),
                    Catch::StartsWith(unsupported));
  // ... but not the newline trim_blocks drops after a block tag, nor the indentation lstrip_blocks
  // drops before one, nor whitespace a '-' marker strips.
  const std::string indented = edited(source("llama3"), "{% endfor %}", "{% endfor %}\n    ");
  CHECK(ChatTemplate::parse(indented).format() == ChatFormat::Llama3);
  CHECK(ChatTemplate::parse(edited(source("llama3"), "{{ content }}", "{{ content -}}\n\n ")).format() ==
        ChatFormat::Llama3);
  // Whitespace outside literals and the trim markers do not matter.
  std::string spaced = edited(source("mistral"), "{% for message in messages %}", "{%- for  message in messages -%}\n");
  CHECK(ChatTemplate::parse(spaced).format() == ChatFormat::Mistral);
  CHECK_THROWS_WITH(ChatTemplate::parse("{{ messages[0]['content'] }}"), Catch::StartsWith(unsupported));
  CHECK_THROWS_WITH(ChatTemplate::parse(""), Catch::StartsWith(unsupported));
}

TEST_CASE("a rendered chat tokenizes as apply_chat_template's: the template's BOS and EOS are the special tokens",
          "[chat][tokenizer]") {
  const json ex = chat_cases();
  for (const json& c : ex["token_cases"]) {
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
