// The batch job's input validation and its resumable output file.
#include "temp_files.h"
#include <catch2/catch.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <unistd.h>

#include "strata/core/error.h"
#include "strata/job/id_set.h"
#include "strata/job/output.h"
#include "strata/job/prompts.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {
fs::path temp_dir() { return test::temp_dir("jobio"); }
fs::path write_file(const std::string& name, const std::string& text) { return test::write_file(temp_dir() / name, text); }
using test::read_file;
}  // namespace

TEST_CASE("prompt lines are read with their sampling fields", "[job]") {
  SamplingParams defaults;
  defaults.max_new_tokens = 7;
  std::vector<std::string> warnings;
  const auto recs = read_prompts(write_file("ok.jsonl",
                                            "{\"id\": 1, \"prompt\": \"a\"}\n\n"
                                            "{\"id\": \"x\", \"prompt\": \"b\", \"max_new_tokens\": 3, \"temperature\": 0.5,"
                                            " \"top_p\": 0.9, \"top_k\": 4, \"seed\": 11, \"meta\": 1}\r\n"),
                                 defaults, [&](const std::string& w) { warnings.push_back(w); });
  REQUIRE(recs.size() == 2);
  CHECK(recs[0].line == 1);
  CHECK(recs[0].sampling.max_new_tokens == 7);
  CHECK(recs[0].id_key == "1");
  CHECK(recs[1].line == 3);
  CHECK(recs[1].id_key == "\"x\"");
  CHECK(recs[1].sampling.max_new_tokens == 3);
  CHECK(recs[1].sampling.temperature == 0.5f);
  CHECK(recs[1].sampling.top_p == 0.9f);
  CHECK(recs[1].sampling.top_k == 4);
  CHECK(recs[1].sampling.seed == 11);
  REQUIRE(warnings.size() == 1);
  CHECK_THAT(warnings[0], Catch::Contains("unknown field 'meta'"));
}

TEST_CASE("prompt lines carry min_p, the penalties and a logit bias", "[job][sampler]") {
  SamplingParams defaults;
  defaults.repetition_penalty = 1.2f;
  const auto recs = read_prompts(write_file("adjust.jsonl",
                                            "{\"id\": 1, \"prompt\": \"a\"}\n"
                                            "{\"id\": 2, \"prompt\": \"b\", \"min_p\": 0.05,"
                                            " \"repetition_penalty\": 1.1, \"frequency_penalty\": -0.5,"
                                            " \"presence_penalty\": 2, \"logit_bias\": {\"17\": -100, \"3\": 2.5},"
                                            " \"min_tokens\": 5, \"stop_token_ids\": [9, 4]}\n"),
                                 defaults);
  REQUIRE(recs.size() == 2);
  CHECK(recs[0].sampling.repetition_penalty == 1.2f);  // the job's default
  CHECK(recs[0].sampling.logit_bias.empty());
  const SamplingParams& s = recs[1].sampling;
  CHECK(s.min_p == 0.05f);
  CHECK(s.repetition_penalty == 1.1f);
  CHECK(s.frequency_penalty == -0.5f);
  CHECK(s.presence_penalty == 2.0f);
  std::vector<std::pair<int32_t, float>> bias = s.logit_bias;
  std::sort(bias.begin(), bias.end());
  CHECK(bias == std::vector<std::pair<int32_t, float>>{{3, 2.5f}, {17, -100.0f}});
  CHECK(s.min_tokens == 5);
  CHECK(s.stop_token_ids == std::vector<int32_t>{9, 4});

  // A default min_tokens (--min-tokens) yields to a line's own and to its shorter limit.
  defaults.min_tokens = 12;
  const auto held = read_prompts(write_file("held.jsonl",
                                            "{\"id\": 1, \"prompt\": \"a\", \"max_new_tokens\": 20}\n"
                                            "{\"id\": 2, \"prompt\": \"b\", \"max_new_tokens\": 8}\n"
                                            "{\"id\": 3, \"prompt\": \"c\", \"min_tokens\": 2}\n"),
                                 defaults);
  REQUIRE(held.size() == 3);
  CHECK(held[0].sampling.min_tokens == 12);
  CHECK(held[1].sampling.min_tokens == 8);
  CHECK(held[2].sampling.min_tokens == 2);

  const std::vector<std::pair<std::string, std::string>> bad = {
      {"\"min_p\": 1.5", "field 'min_p' must be in [0, 1], got 1.5"},
      {"\"repetition_penalty\": 0", "field 'repetition_penalty' must be > 0, got 0"},
      {"\"frequency_penalty\": 2.5", "field 'frequency_penalty' must be in [-2, 2], got 2.5"},
      {"\"presence_penalty\": \"1\"", "field 'presence_penalty' must be a number"},
      {"\"logit_bias\": [1]", "field 'logit_bias' must be an object of token ids and biases"},
      {"\"logit_bias\": {\"x\": 1}", "field 'logit_bias' keys must be token ids"},
      {"\"logit_bias\": {\"-1\": 1}", "field 'logit_bias' keys must be token ids"},
      {"\"logit_bias\": {\"5\": 101}", "field 'logit_bias'[\"5\"] must be in [-100, 100], got 101"},
      {"\"logit_bias\": {\"5\": null}", "field 'logit_bias'[\"5\"] must be a number"},
      {"\"min_tokens\": 9, \"max_new_tokens\": 8", "field 'min_tokens' must be in [0, 8] (the most tokens to generate)"},
      {"\"min_tokens\": 1.5", "field 'min_tokens' must be an integer"},
      {"\"stop_token_ids\": 5", "field 'stop_token_ids' must be an array of token ids"},
      {"\"stop_token_ids\": [5, -1]", "field 'stop_token_ids' must hold token ids, got -1"}};
  for (size_t i = 0; i < bad.size(); ++i) {
    INFO(bad[i].first);
    const fs::path p = write_file("adjust-bad.jsonl", "{\"id\": 1, \"prompt\": \"a\", " + bad[i].first + "}\n");
    CHECK_THROWS_WITH(read_prompts(p, {}), Catch::Contains("adjust-bad.jsonl:1: " + bad[i].second));
  }
}

TEST_CASE("both formats carry response_format, and unset it leaves the job's default", "[job][json]") {
  const auto recs = read_prompts(
      write_file("format.jsonl", "{\"id\": 1, \"prompt\": \"a\", \"response_format\": {\"type\": \"json_object\"}}\n"
                                 "{\"id\": 2, \"prompt\": \"b\", \"response_format\": {\"type\": \"text\"}}\n"
                                 "{\"id\": 3, \"prompt\": \"c\", \"response_format\": null}\n"),
      {});
  REQUIRE(recs.size() == 3);
  CHECK(recs[0].response_format == ResponseFormat::JsonObject);
  CHECK(recs[1].response_format == ResponseFormat::Text);
  CHECK_FALSE(recs[2].response_format.has_value());
  const auto oa = read_prompts(
      write_file("format-oa.jsonl",
                 "{\"custom_id\": \"a\", \"method\": \"POST\", \"url\": \"/v1/chat/completions\", \"body\": "
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": {\"type\": "
                 "\"json_object\"}}}\n"),
      {});
  REQUIRE(oa.size() == 1);
  CHECK_FALSE(oa[0].error);
  CHECK(oa[0].response_format == ResponseFormat::JsonObject);
  // A schema keeps its keys in the order written: its properties come in that order.
  const auto schema = read_prompts(
      write_file("format-schema.jsonl",
                 "{\"id\": 1, \"prompt\": \"a\", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": "
                 "{\"name\": \"p\", \"schema\": {\"type\": \"object\", \"properties\": {\"zeta\": {\"type\": "
                 "\"string\"}, \"alpha\": {\"type\": \"integer\"}}, \"required\": [\"zeta\", \"alpha\"]}}}}\n"),
      {});
  REQUIRE(schema.size() == 1);
  CHECK(schema[0].response_format == ResponseFormat::JsonSchema);
  CHECK(schema[0].json_schema == "{\"type\":\"object\",\"properties\":{\"zeta\":{\"type\":\"string\"},\"alpha\":{\"type\":"
                                 "\"integer\"}},\"required\":[\"zeta\",\"alpha\"]}");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"\"response_format\": \"json_object\"", "field 'response_format' must be an object with a string \"type\""},
      {"\"response_format\": {\"type\": \"json_schema\"}",
       "field 'response_format' of type \"json_schema\" needs \"json_schema\": {\"schema\": {...}}"},
      {"\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"schema\": {\"type\": \"object\", "
       "\"properties\": {\"a\": {\"type\": \"string\", \"maxLength\": 5}}}}}",
       "field 'response_format'.json_schema.schema: keyword 'maxLength' at #/properties/a is not supported"},
      {"\"response_format\": {\"type\": \"xml\"}",
       "field 'response_format' type must be \"text\", \"json_object\" or \"json_schema\""}};
  for (const auto& [field, message] : bad) {
    INFO(field);
    const fs::path p = write_file("format-bad.jsonl", "{\"id\": 1, \"prompt\": \"a\", " + field + "}\n");
    CHECK_THROWS_WITH(read_prompts(p, {}), Catch::Contains("format-bad.jsonl:1: " + message));
  }
}

TEST_CASE("both formats carry reasoning_effort and chat_template_kwargs, unset leaving the job's default",
          "[job][chat]") {
  const auto recs = read_prompts(
      write_file("kwargs.jsonl",
                 "{\"id\": 1, \"prompt\": \"a\", \"reasoning_effort\": \"low\"}\n"
                 "{\"id\": 2, \"prompt\": \"b\", \"chat_template_kwargs\": {\"enable_thinking\": false, "
                 "\"reasoning_effort\": \"high\"}}\n"
                 "{\"id\": 3, \"prompt\": \"c\", \"reasoning_effort\": null, \"chat_template_kwargs\": null}\n"),
      {});
  REQUIRE(recs.size() == 3);
  CHECK(recs[0].reasoning_effort == "low");
  CHECK_FALSE(recs[0].enable_thinking);
  CHECK(recs[1].reasoning_effort == "high");
  CHECK(recs[1].enable_thinking == std::optional<bool>(false));
  CHECK(recs[2].reasoning_effort.empty());
  CHECK_FALSE(recs[2].enable_thinking);
  CHECK(recs[1].template_kwargs.empty());
  const auto oa = read_prompts(
      write_file("kwargs-oa.jsonl",
                 "{\"custom_id\": \"a\", \"method\": \"POST\", \"url\": \"/v1/chat/completions\", \"body\": "
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"reasoning_effort\": \"medium\", "
                 "\"chat_template_kwargs\": {\"enable_thinking\": true}}}\n"),
      {});
  REQUIRE(oa.size() == 1);
  CHECK_FALSE(oa[0].error);
  CHECK(oa[0].reasoning_effort == "medium");
  CHECK(oa[0].enable_thinking == std::optional<bool>(true));
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"\"reasoning_effort\": \"minimal\"", "field 'reasoning_effort' must be \"low\", \"medium\" or \"high\""},
      {"\"reasoning_effort\": true", "field 'reasoning_effort' must be a string"},
      {"\"chat_template_kwargs\": []", "field 'chat_template_kwargs' must be an object"},
      {"\"chat_template_kwargs\": {\"enable_thinking\": 0}",
       "field 'chat_template_kwargs'.enable_thinking must be true or false"},
      {"\"chat_template_kwargs\": {\"tools\": []}",
       "field 'chat_template_kwargs'.tools is set by Strata, not by a request"}};
  for (const auto& [field, message] : bad) {
    INFO(field);
    const fs::path p = write_file("kwargs-bad.jsonl", "{\"id\": 1, \"prompt\": \"a\", " + field + "}\n");
    CHECK_THROWS_WITH(read_prompts(p, {}), Catch::Contains("kwargs-bad.jsonl:1: " + message));
  }
}

TEST_CASE("strata lines' messages carry OpenAI's tool calls on assistant messages", "[job][chat]") {
  const auto recs = read_prompts(
      write_file("tools.jsonl",
                 "{\"id\": 1, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", "
                 "\"content\": null, \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", "
                 "\"arguments\": \"{\\\"b\\\": 1, \\\"a\\\": 2}\"}}]}, {\"role\": \"tool\", \"content\": \"3\"}]}\n"),
      {});
  REQUIRE(recs.size() == 1);
  REQUIRE(recs[0].messages.size() == 3);
  CHECK(recs[0].messages[1].content.empty());
  REQUIRE(recs[0].messages[1].tool_calls.size() == 1);
  CHECK(recs[0].messages[1].tool_calls[0].name == "f");
  CHECK(recs[0].messages[1].tool_calls[0].arguments == "{\"b\": 1, \"a\": 2}");
  CHECK(recs[0].messages[2].tool_calls.empty());
  CHECK(recs[0].messages[1].tool_calls[0].id.empty());
  CHECK_FALSE(recs[0].messages[2].tool_call_id);
}

TEST_CASE("messages keep a call's id, a tool result's tool_call_id and name, and reasoning_content", "[job][chat]") {
  const auto recs = read_prompts(
      write_file("fields.jsonl",
                 R"({"id": 1, "messages": [{"role": "user", "content": "x"}, )"
                 R"({"role": "assistant", "content": "y", "reasoning_content": "r", "tool_calls": [{"id": "c9", )"
                 R"("type": "function", "function": {"name": "f", "arguments": "{}"}}]}, )"
                 R"({"role": "tool", "content": "3", "tool_call_id": "c9", "name": "f"}, )"
                 R"({"role": "assistant", "content": "z", "reasoning_content": null}]})"
                 "\n"),
      {});
  REQUIRE(recs.size() == 1);
  REQUIRE(recs[0].messages.size() == 4);
  CHECK(recs[0].messages[1].tool_calls[0].id == "c9");
  CHECK(recs[0].messages[1].reasoning_content == std::optional<std::string>("r"));
  CHECK(recs[0].messages[2].tool_call_id == std::optional<std::string>("c9"));
  CHECK(recs[0].messages[2].name == std::optional<std::string>("f"));
  CHECK_FALSE(recs[0].messages[3].reasoning_content);  // null: absent
  for (const auto& [field, message] : std::vector<std::pair<std::string, std::string>>{
           {R"("tool_call_id": 3)", "messages[0].tool_call_id must be a string"},
           {R"("name": ["f"])", "messages[0].name must be a string"},
           {R"("reasoning_content": {})", "messages[0].reasoning_content must be a string"}}) {
    INFO(field);
    const fs::path p =
        write_file("fields-bad.jsonl", R"({"id": 1, "messages": [{"role": "tool", "content": "x", )" + field + "}]}\n");
    CHECK_THROWS_WITH(read_prompts(p, {}), Catch::Contains("fields-bad.jsonl:1: " + message));
  }
  const fs::path p = write_file("fields-bad.jsonl", R"({"id": 1, "messages": [{"role": "assistant", "content": null, )"
                                                    R"("tool_calls": [{"id": 7, "function": {"name": "f", )"
                                                    R"("arguments": "{}"}}]}]})"
                                                    "\n");
  CHECK_THROWS_WITH(read_prompts(p, {}), Catch::Contains("messages[0].tool_calls[0].id must be a string"));
}

TEST_CASE("bad prompt lines fail with file, line and reason", "[job]") {
  struct Case {
    std::string text, message;
  };
  const std::vector<Case> cases = {
      {"{\"id\": 1, \"prompt\": \"a\"}\n{\"id\": 2, \"prompt\": \"b\"\n", "bad1.jsonl:2: invalid JSON"},
      {"[1, 2]\n", "bad2.jsonl:1: expected a JSON object"},
      {"{\"id\": 1}\n", "bad3.jsonl:1: missing field 'prompt' (or 'messages'; 'input' for an embedding, 'classify' for a classification)"},
      {"{\"id\": 1, \"prompt\": 5}\n", "bad4.jsonl:1: field 'prompt' must be a string"},
      {"{\"prompt\": \"a\"}\n", "bad5.jsonl:1: missing field 'id'"},
      {"{\"id\": 1, \"prompt\": \"a\"}\n{\"id\": 1, \"prompt\": \"b\"}\n", "bad6.jsonl:2: duplicate id 1"},
      {"{\"id\": 1, \"prompt\": \"a\", \"max_new_tokens\": \"9\"}\n", "bad7.jsonl:1: field 'max_new_tokens' must be an integer"},
      {"{\"id\": 1, \"prompt\": \"a\", \"max_new_tokens\": 0}\n", "bad8.jsonl:1: field 'max_new_tokens' must be in"},
      {"{\"id\": 1, \"prompt\": \"a\", \"top_p\": 0}\n", "bad9.jsonl:1: field 'top_p' must be in (0, 1]"},
      {"{\"id\": 1, \"prompt\": \"a\", \"temperature\": -1}\n", "bad10.jsonl:1: field 'temperature' must be in"},
      {"{\"id\": 1.5, \"prompt\": \"a\"}\n", "bad11.jsonl:1: field 'id' must be a string or an integer"},
      {"{\"id\": 1, \"prompt\": \"\"}\n", "bad12.jsonl:1: field 'prompt' is empty"},
      {"{\"id\": 1, \"prompt\": \"a\", \"seed\": -3}\n", "bad13.jsonl:1: field 'seed' must be a non-negative integer"},
      {"{\"id\": 1, \"messages\": [{\"role\": \"user\"}]}\n", "bad14.jsonl:1: messages[0].content must be a string"},
      {"{\"id\": 1, \"messages\": [{\"role\": \"user\", \"content\": \"a\", \"tool_calls\": [{\"function\": "
       "{\"name\": \"f\", \"arguments\": \"{}\"}}]}]}\n",
       "bad15.jsonl:1: messages[0].tool_calls is for assistant messages only"},
      {"{\"id\": 1, \"messages\": [{\"role\": \"assistant\", \"content\": null}]}\n",
       "bad16.jsonl:1: messages[0].content must be a string"},
      {"{\"id\": 1, \"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{\"function\": "
       "{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": }\"}}]}]}\n",
       "bad17.jsonl:1: messages[0].tool_calls[0].function.arguments: not JSON"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const fs::path p = write_file("bad" + std::to_string(i + 1) + ".jsonl", cases[i].text);
    INFO(cases[i].text);
    CHECK_THROWS_WITH(read_prompts(p, {}), Catch::Contains(cases[i].message));
  }
  CHECK_THROWS_WITH(read_prompts(temp_dir() / "missing.jsonl", {}), Catch::Contains("cannot open prompts file"));
}

TEST_CASE("output goes to OUT.partial and becomes OUT only when finished", "[job]") {
  const fs::path out = temp_dir() / "out1.jsonl";
  fs::remove(out);
  fs::remove(out.string() + ".partial");
  {
    OutputWriter w(out);
    CHECK(w.done_ids().empty());
    w.write({{"id", 1}, {"completion", "x"}});
    w.flush();
    CHECK(fs::exists(out.string() + ".partial"));
    CHECK_FALSE(fs::exists(out));
    w.finish();
  }
  CHECK(fs::exists(out));
  CHECK_FALSE(fs::exists(out.string() + ".partial"));
  CHECK(read_file(out) == "{\"completion\":\"x\",\"id\":1}\n");
}

TEST_CASE("a rerun resumes from the partial file and drops a torn last line", "[job]") {
  const fs::path out = temp_dir() / "out2.jsonl";
  fs::remove(out);
  write_file("out2.jsonl.partial", "{\"id\":1,\"completion\":\"a\"}\n{\"id\":\"b\",\"completion\":\"b\"}\n{\"id\":3,\"compl");
  OutputWriter w(out);
  CHECK(w.done_ids().size() == 2);
  CHECK(w.done_ids().contains("1"));
  CHECK(w.done_ids().contains("\"b\""));
  w.write({{"id", 3}});
  w.finish();
  CHECK(read_file(out) == "{\"id\":1,\"completion\":\"a\"}\n{\"id\":\"b\",\"completion\":\"b\"}\n{\"id\":3}\n");
}

namespace {
// The id key the resume read before SAX: a full parse, then the dump of "custom_id", else "id".
std::optional<std::string> dom_id_key(const std::string& line) {
  try {
    const auto j = nlohmann::json::parse(line);
    if (!j.is_object()) return std::nullopt;
    if (j.contains("custom_id")) return j["custom_id"].dump();
    if (j.contains("id")) return j["id"].dump();
    return std::nullopt;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}
}  // namespace

TEST_CASE("resume reads the id key a full parse would, byte for byte", "[job][resume]") {
  const std::vector<std::string> lines = {
      R"({"id":1,"completion":"a"})",
      R"({"completion":"a","id":-7,"tokens":[1,2]})",
      R"({"id":18446744073709551615})",
      R"({"id":-9223372036854775808})",
      R"({"id":1.5e3})",
      R"({"id":0.1})",
      R"({"id":"x"})",
      R"({"id":"q\"uo\\te\/slash\ttab\u0001ctl"})",
      R"({"id":"caf\u00e9 \ud83d\ude00"})",
      "{\"id\":\"caf\xc3\xa9 \xf0\x9f\x98\x80\"}",
      R"({"id":"batch_req_1","custom_id":"req-1","response":{"id":"inner"}})",
      R"({"custom_id":"req-\u00e9","id":"batch_req_1"})",
      R"({"response":{"custom_id":"no","id":"no"},"id":"top"})",
      R"({"id":{"b":[1,{"c":null}],"a":true}})",
      R"({"id":[1,[2,[3]],{}]})",
      R"({"id":null})",
      R"({"custom_id":false})",
      R"({"id":1,"id":2})",
      R"({"id":{"a":1},"id":{"b":2}})",
      R"({"id":{"a":1,"a":[2]}})",
      "  {\"id\" : \"sp\" }\r",
      R"({"other":3})",
      R"({"response":{"id":"inner"}})",
      R"({})",
      R"([{"id":1}])",
      R"("id")",
      R"(7)",
      R"({"id":1} x)",
      R"({"id":1,"completion":"a)",
      R"({"id":"\ud800"})",
      "{\"id\":\"\xff\"}",
      std::string("{\"id\":1,\"c\":\"") + std::string(5, '\0') + "\"}",
      "",
  };
  for (const std::string& line : lines) {
    INFO(line);
    CHECK(output_line_id_key(line) == dom_id_key(line));
  }
  // The same on mutants of those lines (a byte replaced, dropped or inserted, a piece repeated):
  // a deterministic differential fuzz of the SAX reading against the full parse.
  std::mt19937 rng(12345);
  const std::string alphabet = std::string("{}[]\",:\\ 0123456789.eE+-tfnul\x01\x7f\xc3\xa9\xff\n") + '\0';
  size_t mismatches = 0, kept = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string m = lines[rng() % lines.size()];
    for (int k = 1 + int(rng() % 3); k > 0; --k) {
      const size_t at = m.empty() ? 0 : rng() % m.size();
      const char c = alphabet[rng() % alphabet.size()];
      switch (rng() % 4) {
        case 0: if (!m.empty()) m[at] = c; break;
        case 1: if (!m.empty()) m.erase(at, 1); break;
        case 2: m.insert(m.begin() + std::ptrdiff_t(at), c); break;
        default: m.insert(at, m.substr(at, rng() % 12)); break;
      }
    }
    const auto key = output_line_id_key(m);
    kept += key.has_value();
    if (key != dom_id_key(m) && ++mismatches <= 5) FAIL_CHECK("differs from the full parse: " << m);
  }
  CHECK(mismatches == 0);
  CHECK(kept > 1000);  // the mutants are not all broken JSON
  CHECK(output_line_id_key(R"({"id":{"b":[1,{"c":null}],"a":true}})") == R"({"a":true,"b":[1,{"c":null}]})");
  CHECK(output_line_id_key(R"({"id":1,"id":2})") == "2");
  CHECK(output_line_id_key(R"({"id":1.5e3})") == "1500.0");
}

TEST_CASE("numeric, string, escaped and unicode ids resume under the key their prompt line gets", "[job][resume]") {
  const std::vector<nlohmann::json> ids = {0,   1, -3, int64_t(1) << 53, "x", "q\"uo\\te", "tab\tnl\nctl\x01",
                                           "caf\xc3\xa9", "\xf0\x9f\x98\x80", "/"};
  const fs::path out = temp_dir() / "keys.jsonl";
  fs::remove(out);
  fs::remove(out.string() + ".partial");
  {
    OutputWriter w(out);
    for (const auto& id : ids) w.write({{"completion", std::string(300, 'z') + "\xc3\xa9\""}, {"id", id}});
    w.flush();
  }  // a crash: OUT.partial stays
  std::string prompts;
  for (const auto& id : ids) prompts += nlohmann::json{{"id", id}, {"prompt", "p"}}.dump() + "\n";
  // The same ids as a person writes them: \u escapes, spaces.
  prompts += "{\"id\": \"caf\\u00e9\", \"prompt\": \"p\"}\n";
  prompts += "{\"id\": \"\\ud83d\\ude00\", \"prompt\": \"p\"}\n";
  PromptLineParser parser("keys.jsonl", {});
  OutputWriter w(out);
  CHECK(w.done_ids().size() == ids.size());
  int line = 0;
  std::istringstream in(prompts);
  for (std::string text; std::getline(in, text);) {
    const auto r = parser.parse(text, ++line);
    REQUIRE(r);
    INFO(r->id_key);
    CHECK(w.done_ids().contains(r->id_key));
  }
  CHECK_FALSE(w.done_ids().contains("\"cafe\""));
  CHECK_FALSE(w.done_ids().contains("2"));
  CHECK_FALSE(w.done_ids().contains("\"1\""));  // the string "1" is not the number 1
}

TEST_CASE("a resumed line whose id is an object counts as before, and one without an id ends the kept lines",
          "[job][resume]") {
  const fs::path out = temp_dir() / "odd_ids.jsonl";
  fs::remove(out);
  const std::string kept = "{\"id\":1}\n{\"id\":{\"k\":[1,2]},\"completion\":\"x\"}\n{\"id\":\"b\"}\n";
  write_file("odd_ids.jsonl.partial", kept + "{\"completion\":\"no id\"}\n{\"id\":\"c\"}\n");
  OutputWriter w(out);
  CHECK(w.done_ids().size() == 3);
  CHECK(w.done_ids().contains("1"));
  CHECK(w.done_ids().contains("{\"k\":[1,2]}"));
  CHECK(w.done_ids().contains("\"b\""));
  CHECK_FALSE(w.done_ids().contains("\"c\""));
  CHECK(read_file(out.string() + ".partial") == kept);
}

TEST_CASE("IdSet holds 128-bit hashes of id keys: contains, size, repeats once", "[job][resume]") {
  const IdSet none;
  CHECK(none.empty());
  CHECK(none.size() == 0);
  CHECK_FALSE(none.contains("1"));
  CHECK_FALSE(none.contains(""));

  const IdSet few({IdSet::hash("1"), IdSet::hash("\"a\""), IdSet::hash("1"), IdSet::hash("")});
  CHECK(few.size() == 3);
  CHECK(few.contains("1"));
  CHECK(few.contains("\"a\""));
  CHECK(few.contains(""));
  CHECK_FALSE(few.contains("\"1\""));
  CHECK_FALSE(few.contains("a"));

  // Past 64 ids a directory over the hashes' top bits narrows the search: every size around it.
  for (size_t n : {size_t(63), size_t(64), size_t(65), size_t(1000), size_t(100000)}) {
    std::vector<IdSet::Hash> hashes;
    for (size_t i = 0; i < n; ++i) hashes.push_back(IdSet::hash("\"req-" + std::to_string(i) + "\""));
    for (size_t i = 0; i < n; i += 3) hashes.push_back(IdSet::hash("\"req-" + std::to_string(i) + "\""));
    const IdSet set(std::move(hashes));
    INFO(n);
    CHECK(set.size() == n);
    size_t found = 0, strays = 0;
    for (size_t i = 0; i < n; ++i) found += set.contains("\"req-" + std::to_string(i) + "\"");
    for (size_t i = n; i < 2 * n; ++i) strays += set.contains("\"req-" + std::to_string(i) + "\"");
    CHECK(found == n);
    CHECK(strays == 0);
    CHECK(set.bytes() <= n * sizeof(IdSet::Hash) * 9 / 8 + n / 4 * sizeof(uint32_t) + 64);
  }

  // Hashes bunched at the ends of the range (all in the first or the last bucket).
  std::vector<IdSet::Hash> edge;
  for (uint64_t i = 0; i < 500; ++i) edge.push_back({0, i}), edge.push_back({~uint64_t(0), i});
  const IdSet ends(edge);
  CHECK(ends.size() == 1000);
  for (const auto& h : edge) CHECK(ends.contains(h));
  CHECK_FALSE(ends.contains(IdSet::Hash{0, 500}));
  CHECK_FALSE(ends.contains(IdSet::Hash{1, 0}));
  CHECK_FALSE(ends.contains(IdSet::Hash{~uint64_t(0) - 1, 0}));
}
