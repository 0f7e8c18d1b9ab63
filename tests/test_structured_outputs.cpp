// vLLM's structured outputs in requests (src/job/structured_outputs.h): structured_outputs and the
// older guided_* fields in both input formats, the refusals, and `strata run` holding answers to a
// choice and a regex (greedy tokens: tests/fixtures/json/make_pattern_fixtures.py, from
// transformers with xgrammar's logits processor).
#include "test_paths.h"

#include <catch2/catch.hpp>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "cli_support.h"
#include "strata/core/error.h"
#include "strata/job/prompts.h"
#include "temp_files.h"

using namespace strata;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

fs::path write(const std::string& name, const std::string& text) {
  return test::write_file(test::temp_dir("structured") / name, text);
}

std::string chat_line(const std::string& id, const json& body_extra) {
  json body = {{"model", "m"}, {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
  body.update(body_extra);
  return json{{"custom_id", id}, {"method", "POST"}, {"url", "/v1/chat/completions"}, {"body", body}}.dump() + "\n";
}

std::string strata_error(const json& line) {
  try {
    read_prompts(write("bad.jsonl", line.dump() + "\n"), {});
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("structured outputs: choice, regex and JSON in both formats, vLLM's fields old and new", "[job][regex]") {
  // Written by hand: the schema's keys in an order nlohmann's json would sort.
  const std::string schema = R"({"type":"object","properties":{"b":{"type":"string"},"a":{"type":"integer"}}})";
  const std::string text =
      json{{"id", 1}, {"prompt", "p"}, {"structured_outputs", {{"choice", {"yes", "no"}}}}}.dump() + "\n" +
      json{{"id", 2}, {"prompt", "p"}, {"guided_regex", "\\d+"}, {"guided_decoding_backend", "xgrammar"}}.dump() + "\n" +
      R"({"id": 3, "prompt": "p", "structured_outputs": {"json": )" + schema + R"(, "disable_fallback": true}})" +
      "\n" + json{{"id", 4}, {"prompt", "p"}, {"guided_json", schema}}.dump() + "\n" +
      json{{"id", 5}, {"prompt", "p"}, {"structured_outputs", {{"json_object", true}, {"regex", nullptr}}}}.dump() +
      "\n" + json{{"id", 6}, {"prompt", "p"}, {"guided_choice", {"é", "b"}}}.dump() + "\n";
  std::vector<std::string> warnings;
  const auto recs = read_prompts(write("strata.jsonl", text), {}, [&](const std::string& w) { warnings.push_back(w); });
  REQUIRE(recs.size() == 6);
  CHECK(warnings.empty());
  CHECK(recs[0].response_format == ResponseFormat::Choice);
  CHECK(recs[0].pattern == R"(["yes","no"])");
  CHECK(recs[1].response_format == ResponseFormat::Regex);
  CHECK(recs[1].pattern == "\\d+");
  // The schema keeps its keys in the order written ("b" before "a"), from either field.
  CHECK(recs[2].response_format == ResponseFormat::JsonSchema);
  CHECK(recs[2].json_schema == schema);
  CHECK(recs[3].json_schema == recs[2].json_schema);
  CHECK(recs[4].response_format == ResponseFormat::JsonObject);
  CHECK(recs[5].pattern == "[\"\xc3\xa9\",\"b\"]");

  const auto openai = read_prompts(
      write("openai.jsonl", chat_line("a", {{"structured_outputs", {{"regex", "[a-z]+"}}}}) +
                                chat_line("b", {{"guided_choice", {"x"}}})),
      {});
  REQUIRE(openai.size() == 2);
  CHECK(openai[0].response_format == ResponseFormat::Regex);
  CHECK(openai[1].response_format == ResponseFormat::Choice);
  CHECK_FALSE(openai[0].error);
}

TEST_CASE("structured outputs Strata cannot hold answers to are refused naming the field", "[job][regex]") {
  struct Case {
    json body;
    std::string code, message;
  };
  const std::vector<Case> cases = {
      {{{"structured_outputs", {{"regex", "(?=a)"}}}}, "unsupported_value",
       "body.structured_outputs.regex: regex at offset 1: group modifiers"},
      {{{"guided_regex", 5}}, "invalid_type", "body.guided_regex must be a string"},
      {{{"guided_choice", json::array()}}, "invalid_type", "body.guided_choice must be a non-empty array of strings"},
      {{{"guided_choice", {"a", 1}}}, "invalid_type", "body.guided_choice must hold strings, got 1"},
      {{{"structured_outputs", {{"choice", {"a"}}, {"regex", "a"}}}}, "invalid_value",
       "must give one of choice, regex, json and json_object, not several"},
      {{{"structured_outputs", json::object()}}, "invalid_value", "body.structured_outputs gives no constraint"},
      {{{"structured_outputs", {{"grammar", "root ::= \"a\""}}}}, "unsupported_value",
       "body.structured_outputs.grammar is not supported"},
      {{{"structured_outputs", {{"regex", "a"}, {"disable_any_whitespace", true}}}}, "unsupported_value",
       "disable_any_whitespace true is not supported"},
      {{{"structured_outputs", {{"regex", "a"}, {"color", "red"}}}}, "invalid_value",
       "body.structured_outputs has an unknown field 'color'"},
      {{{"structured_outputs", {{"regex", "a"}}}, {"guided_choice", {"a"}}}, "invalid_value",
       "give one of body.structured_outputs and body.guided_choice, not both"},
      {{{"response_format", {{"type", "json_object"}}}, {"guided_regex", "a"}}, "invalid_value",
       "give either body.response_format or body.guided_regex, not both"},
      {{{"guided_grammar", "root ::= \"a\""}}, "unsupported_value", "body.guided_grammar is not supported"},
      {{{"guided_whitespace_pattern", " "}, {"guided_regex", "a"}}, "unsupported_value",
       "body.guided_whitespace_pattern is not supported"},
      {{{"structured_outputs", {{"json", {{"type", "object"}, {"minProperties", 1}}}}}}, "unsupported_value",
       "body.structured_outputs.json: keyword 'minProperties' at # is not supported"},
      {{{"guided_json", "{not json"}}, "invalid_value", "body.guided_json is a string but not a JSON schema's text"},
  };
  std::string text;
  for (size_t i = 0; i < cases.size(); ++i) text += chat_line(std::to_string(i), cases[i].body);
  const auto recs = read_prompts(write("refused.jsonl", text), {});
  REQUIRE(recs.size() == cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    INFO(cases[i].body.dump());
    REQUIRE(recs[i].error);
    CHECK(recs[i].error->code == cases[i].code);
    CHECK_THAT(recs[i].error->message, Catch::Contains(cases[i].message));
  }
  // The strata format stops the job at the line instead.
  CHECK_THAT(strata_error({{"id", 1}, {"prompt", "p"}, {"guided_regex", "a{3,2}"}}),
             Catch::Contains("bad.jsonl:1: field 'guided_regex': regex at offset"));
  CHECK_THAT(strata_error({{"id", 1}, {"prompt", "p"}, {"structured_outputs", {{"choice", "yes"}}}}),
             Catch::Contains("field 'structured_outputs'.choice must be a non-empty array"));
  // A tool named by tool_choice sets the format: a structured output beside it is refused.
  const json tools = json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}});
  const auto named = read_prompts(
      write("named.jsonl", chat_line("t", {{"tools", tools},
                                           {"tool_choice", {{"type", "function"}, {"function", {{"name", "f"}}}}},
                                           {"guided_regex", "a"}})),
      {});
  REQUIRE(named[0].error);
  CHECK_THAT(named[0].error->message, Catch::Contains("give no response_format or structured outputs beside it"));
}

TEST_CASE("strata run holds answers to a choice and a regex as vLLM does, in both formats", "[cli][regex]") {
  std::ifstream in(std::string(STRATA_FIXTURES_DIR) + "/json/pattern_masks.json");
  const json fx = json::parse(in);
  const fs::path dir = test::temp_dir("structured_cli");
  std::string strata_lines, openai_lines;
  std::map<std::string, json> cases;
  int i = 0;
  for (const json& c : fx["greedy"]) {
    const std::string id = std::to_string(i++);
    cases[id] = c;
    const json constraint = c["kind"] == "regex" ? json{{"regex", c["pattern"]}} : json{{"choice", c["pattern"]}};
    strata_lines += json{{"id", id}, {"prompt", c["text"]}, {"max_new_tokens", c["max_new_tokens"]},
                         {"structured_outputs", constraint}}.dump() + "\n";
    openai_lines += json{{"custom_id", id}, {"method", "POST"}, {"url", "/v1/completions"},
                         {"body", {{"prompt", c["text"]}, {"max_tokens", c["max_new_tokens"]}, {"temperature", 0},
                                   {c["kind"] == "regex" ? "guided_regex" : "guided_choice", c["pattern"]}}}}
                        .dump() + "\n";
  }
  const std::string model = std::string(STRATA_FIXTURES_DIR) + "/models/tiny-llama";
  for (const bool openai : {false, true}) {
    const fs::path prompts = test::write_file(dir / (openai ? "openai.jsonl" : "strata.jsonl"),
                                              openai ? openai_lines : strata_lines);
    const fs::path out = dir / (openai ? "openai_out.jsonl" : "strata_out.jsonl");
    const test::CliResult r = test::run_strata("run --model " + model + " --prompts " + prompts.string() + " --out " +
                                               out.string() + " --device cpu --no-progress");
    INFO(r.output);
    REQUIRE(r.code == 0);
    std::ifstream got_in(out);
    std::string line;
    int answered = 0;
    while (std::getline(got_in, line)) {
      const json got = json::parse(line);
      const json& c = cases.at(openai ? got["custom_id"].get<std::string>() : got["id"].get<std::string>());
      INFO(line);
      ++answered;
      const bool eos = c["ends_with_eos"].get<bool>();
      if (openai) {
        const json& choice = got["response"]["body"]["choices"][0];
        CHECK(choice["text"] == c["completion"]);
        CHECK(choice["finish_reason"] == (c["closed"].get<bool>() || eos ? "stop" : "length"));
      } else {
        CHECK(got["tokens"] == c["greedy"]);
        CHECK(got["completion"] == c["completion"]);
        CHECK(got["finish_reason"] == (c["closed"].get<bool>() ? "stop" : eos ? "eos" : "length"));
      }
    }
    CHECK(answered == int(cases.size()));
  }
}

TEST_CASE("strata run --choice and --regex hold the lines that give no format of their own", "[cli][regex]") {
  std::ifstream in(std::string(STRATA_FIXTURES_DIR) + "/json/pattern_masks.json");
  const json fx = json::parse(in);
  const json* choice_case = nullptr;
  for (const json& c : fx["greedy"])
    if (c["kind"] == "choice" && c["text"] == "The quick brown fox") choice_case = &c;
  REQUIRE(choice_case);
  const fs::path dir = test::temp_dir("structured_flags");
  const fs::path prompts = test::write_file(
      dir / "in.jsonl", json{{"id", 1}, {"prompt", (*choice_case)["text"]}}.dump() + "\n" +
                            json{{"id", 2}, {"prompt", "Hello"}, {"guided_regex", "[0-9]"}}.dump() + "\n");
  const std::string model = std::string(STRATA_FIXTURES_DIR) + "/models/tiny-llama";
  std::string flags;
  for (const json& s : (*choice_case)["pattern"]) flags += " --choice " + s.get<std::string>();
  const fs::path out = dir / "out.jsonl";
  const test::CliResult r = test::run_strata("run --model " + model + " --prompts " + prompts.string() + " --out " +
                                             out.string() + " --device cpu --ordered --no-progress" + flags);
  INFO(r.output);
  REQUIRE(r.code == 0);
  std::ifstream got_in(out);
  std::string line;
  REQUIRE(std::getline(got_in, line));
  const json first = json::parse(line);
  CHECK(first["tokens"] == (*choice_case)["greedy"]);
  CHECK(first["finish_reason"] == "stop");
  REQUIRE(std::getline(got_in, line));
  const json second = json::parse(line);  // its own regex: one digit, then nothing can follow
  CHECK(second["completion"].get<std::string>().size() == 1);
  CHECK(std::isdigit(static_cast<unsigned char>(second["completion"].get<std::string>()[0])));
  CHECK(second["finish_reason"] == "stop");

  const test::CliResult bad = test::run_strata("run --model " + model + " --prompts " + prompts.string() + " --out " +
                                               (dir / "bad.jsonl").string() + " --device cpu --regex 'a{3,2}'");
  CHECK(bad.code != 0);
  CHECK_THAT(bad.output, Catch::Contains("--regex: regex at offset 6: a bound {m,n} with n < m"));
  const test::CliResult both = test::run_strata("run --model " + model + " --prompts " + prompts.string() + " --out " +
                                                (dir / "bad.jsonl").string() + " --device cpu --regex a --choice b");
  CHECK(both.code != 0);
  CHECK_THAT(both.output, Catch::Contains("give one of --response-format, --json-schema, --regex and --choice"));
  CHECK_FALSE(fs::exists(dir / "bad.jsonl"));
}
