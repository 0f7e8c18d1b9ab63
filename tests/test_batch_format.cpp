// The OpenAI batch format: parsing (fields, malformed lines, requests answered with an error),
// the output lines' shape, resume over them, and --shard's hash.
#include "temp_files.h"
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "strata/core/error.h"
#include "strata/job/output.h"
#include "strata/job/prompts.h"

using namespace strata;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {
fs::path temp_dir() { return test::temp_dir("batchfmt"); }
fs::path write_file(const std::string& name, const std::string& text) { return test::write_file(temp_dir() / name, text); }
std::string chat_line(const std::string& id, const json& body_extra) {
  json body = {{"model", "m"}, {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
  body.update(body_extra);
  return json{{"custom_id", id}, {"method", "POST"}, {"url", "/v1/chat/completions"}, {"body", body}}.dump() + "\n";
}
std::string completion_line(const std::string& id, const json& body_extra) {
  json body = {{"prompt", "hello"}};
  body.update(body_extra);
  return json{{"custom_id", id}, {"method", "POST"}, {"url", "/v1/completions"}, {"body", body}}.dump() + "\n";
}
}  // namespace

TEST_CASE("OpenAI batch lines are read with their body fields", "[job]") {
  SamplingParams defaults;
  defaults.max_new_tokens = 9;
  std::vector<std::string> warnings;
  const std::string text =
      chat_line("c1", {{"max_completion_tokens", 5}, {"temperature", 0.7}, {"top_p", 0.5}, {"seed", 42},
                       {"user", "u1"}, {"frequency_penalty", 0.25}, {"n", 1}, {"logprobs", false}, {"stop", nullptr}}) +
      "\n" +
      completion_line("c2", {{"max_tokens", 3}, {"presence_penalty", 1}, {"logit_bias", {{"7", -1}}}, {"model", "x"},
                             {"stop", json::array()}, {"logprobs", 20}}) +
      json{{"custom_id", "c3"},
           {"method", "POST"},
           {"url", "/v1/chat/completions"},
           {"meta", 1},
           {"body",
            {{"messages", json::array({{{"role", "system"}, {"content", "be brief"}},
                                       {{"role", "user"},
                                        {"content", json::array({{{"type", "text"}, {"text", "a"}},
                                                                 {{"type", "text"}, {"text", "b"}}})}}})}}}}
          .dump() +
      "\n";
  const auto recs = read_prompts(write_file("oa_ok.jsonl", text), defaults,
                                 [&](const std::string& w) { warnings.push_back(w); });
  REQUIRE(recs.size() == 3);
  CHECK(recs[0].format == InputFormat::OpenAIBatch);
  CHECK(recs[0].endpoint == Endpoint::ChatCompletions);
  CHECK(recs[0].id == "c1");
  CHECK(recs[0].id_key == "\"c1\"");
  CHECK(recs[0].line == 1);
  CHECK(recs[0].model == "m");
  CHECK_FALSE(recs[0].error);
  REQUIRE(recs[0].messages.size() == 1);
  CHECK(recs[0].messages[0].content == "hi");
  CHECK(recs[0].sampling.max_new_tokens == 5);
  CHECK(recs[0].sampling.temperature == 0.7f);
  CHECK(recs[0].sampling.top_p == 0.5f);
  CHECK(recs[0].sampling.seed == 42);
  CHECK(recs[0].sampling.frequency_penalty == 0.25f);
  CHECK(recs[0].n == 1);
  CHECK(recs[0].logprobs == -1);  // logprobs false
  CHECK_FALSE(recs[0].stop);      // stop null: not given, the job's --stop applies
  CHECK(recs[1].line == 3);
  REQUIRE(recs[1].stop);          // stop []: given, none
  CHECK(recs[1].stop->empty());
  CHECK(recs[1].endpoint == Endpoint::Completions);
  CHECK(recs[1].prompt == "hello");
  CHECK(recs[1].model == "x");
  CHECK(recs[1].sampling.max_new_tokens == 3);
  CHECK(recs[1].sampling.presence_penalty == 1.0f);
  CHECK(recs[1].sampling.logit_bias == std::vector<std::pair<int32_t, float>>{{7, -1.0f}});
  CHECK(recs[1].logprobs == 20);  // vLLM's cap, past OpenAI's 5
  CHECK_FALSE(recs[1].error);
  CHECK(recs[2].sampling.max_new_tokens == 9);  // the command line's default
  REQUIRE(recs[2].messages.size() == 2);
  CHECK(recs[2].messages[1].content == "ab");
  // One warning per unknown field name, not per line.
  REQUIRE(warnings.size() == 2);
  CHECK_THAT(warnings[0], Catch::Contains("oa_ok.jsonl:1: ignoring unknown field 'body.user'"));
  CHECK_THAT(warnings[1], Catch::Contains("oa_ok.jsonl:4: ignoring unknown field 'meta'"));
}

TEST_CASE("a strata-format line with OpenAI's max_tokens is warned of the field's name here", "[job]") {
  SamplingParams defaults;
  defaults.max_new_tokens = 9;
  std::vector<std::string> warnings;
  const auto recs = read_prompts(write_file("max_tokens.jsonl", "{\"id\": 1, \"prompt\": \"p\", \"max_tokens\": 4}\n"
                                                                 "{\"id\": 2, \"prompt\": \"q\", \"max_new_tokens\": 4}\n"),
                                 defaults, [&](const std::string& w) { warnings.push_back(w); });
  REQUIRE(recs.size() == 2);
  CHECK(recs[0].sampling.max_new_tokens == 9);  // not taken: the job's default
  CHECK(recs[1].sampling.max_new_tokens == 4);
  REQUIRE(warnings.size() == 1);
  CHECK_THAT(warnings[0], Catch::Contains("max_tokens.jsonl:1: ignoring unknown field 'max_tokens' (the strata "
                                          "format's is 'max_new_tokens'"));
}

TEST_CASE("OpenAI chat messages carry assistant tool calls, their content then null or absent", "[job][chat]") {
  const json call = {{"id", "call_1"},
                     {"type", "function"},
                     {"function", {{"name", "get_weather"}, {"arguments", "{\"city\": \"Paris\", \"days\": 2}"}}}};
  const json messages = json::array({{{"role", "user"}, {"content", "Weather?"}},
                                     {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", {call}}},
                                     {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "22 C"}},
                                     {{"role", "assistant"}, {"tool_calls", {call, call}}},
                                     {{"role", "assistant"}, {"content", "Sunny."}, {"tool_calls", nullptr}}});
  auto with = [&](size_t i, const json& m) {
    json copy = messages;
    copy[i] = m;
    return copy;
  };
  auto call_with = [&](const json& function) {
    json c = call;
    c["function"] = function;
    return json{{"role", "assistant"}, {"content", nullptr}, {"tool_calls", {c}}};
  };
  struct Case {
    json messages;
    std::string code, message;
  };
  const std::vector<Case> bad = {
      {with(0, {{"role", "user"}, {"content", "x"}, {"tool_calls", {call}}}), "invalid_value",
       "body.messages[0].tool_calls is for assistant messages only"},
      {with(1, {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", json::array()}}), "invalid_type",
       "body.messages[1].tool_calls must be a non-empty array"},
      {with(1, {{"role", "assistant"}, {"content", nullptr}}), "invalid_type",
       "body.messages[1].content must be a string or an array of text parts"},
      {with(1, call_with({{"name", "f"}, {"arguments", {{"city", "Paris"}}}})), "invalid_type",
       "body.messages[1].tool_calls[0].function.arguments must be a string of JSON"},
      {with(1, call_with({{"name", "f"}, {"arguments", "{city: Paris}"}})), "invalid_value",
       "body.messages[1].tool_calls[0].function.arguments: not JSON"},
      {with(1, call_with({{"name", "f"}, {"arguments", "[123456789012345678901234567890]"}})), "invalid_value",
       "arguments: an integer beyond 64 bits"},
      {with(1, call_with({{"arguments", "{}"}})), "invalid_type",
       "body.messages[1].tool_calls[0].function.name must be a string"},
      {with(1, {{"role", "assistant"}, {"tool_calls", {{{"type", "code"}, {"function", call["function"]}}}}}),
       "invalid_value", "body.messages[1].tool_calls[0].type must be \"function\""},
      {with(1, {{"role", "assistant"}, {"tool_calls", {{{"type", "function"}}}}}), "invalid_type",
       "body.messages[1].tool_calls[0].function must be an object"},
  };
  std::string text = chat_line("ok", {{"messages", messages}});
  for (size_t i = 0; i < bad.size(); ++i) text += chat_line(std::to_string(i), {{"messages", bad[i].messages}});
  const auto recs = read_prompts(write_file("oa_tools.jsonl", text), {});
  REQUIRE(recs.size() == bad.size() + 1);
  REQUIRE_FALSE(recs[0].error);
  const std::vector<ChatMessage>& m = recs[0].messages;
  REQUIRE(m.size() == 5);
  CHECK(m[1].content.empty());
  REQUIRE(m[1].tool_calls.size() == 1);
  CHECK(m[1].tool_calls[0].name == "get_weather");
  CHECK(m[1].tool_calls[0].arguments == "{\"city\": \"Paris\", \"days\": 2}");  // as sent, key order kept
  CHECK(m[2].role == "tool");
  CHECK(m[2].content == "22 C");
  CHECK(m[3].tool_calls.size() == 2);
  CHECK(m[4].tool_calls.empty());
  CHECK(m[4].content == "Sunny.");
  for (size_t i = 0; i < bad.size(); ++i) {
    INFO(bad[i].messages.dump());
    REQUIRE(recs[i + 1].error);
    CHECK(recs[i + 1].error->code == bad[i].code);
    CHECK_THAT(recs[i + 1].error->message, Catch::Contains(bad[i].message));
  }
}

TEST_CASE("malformed OpenAI batch lines refuse the file with FILE:LINE and the field", "[job]") {
  struct Case {
    std::string text, message;
  };
  const std::string ok = completion_line("a", json::object());
  const std::vector<Case> cases = {
      {ok + "{\"custom_id\": \"b\", \"body\": {}\n", "oabad1.jsonl:2: invalid JSON"},
      {"{\"custom_id\": 5, \"url\": \"/v1/completions\", \"body\": {}}\n", "oabad2.jsonl:1: field 'custom_id' must be a string"},
      {"{\"body\": {}, \"url\": \"/v1/completions\"}\n", "oabad3.jsonl:1: missing field 'custom_id'"},
      {"{\"custom_id\": \"a\", \"url\": \"/v1/completions\", \"body\": \"x\"}\n", "oabad4.jsonl:1: field 'body' must be an object"},
      {"{\"custom_id\": \"a\", \"body\": {}}\n", "oabad5.jsonl:1: missing field 'url'"},
      {ok + ok, "oabad6.jsonl:2: duplicate custom_id \"a\""},
      {ok + "{\"id\": 1, \"prompt\": \"x\"}\n",
       "oabad7.jsonl:2: this line is in the strata format, but line 1 is in the OpenAI batch format"},
      {"{\"id\": 1, \"prompt\": \"x\"}\n\n" + ok,
       "oabad8.jsonl:3: this line is in the OpenAI batch format, but line 1 is in the strata format"},
      {"{\"custom_id\": \"\", \"url\": \"/v1/completions\", \"body\": {}}\n", "oabad9.jsonl:1: field 'custom_id' is empty"},
      {"{\"custom_id\": \"a\", \"url\": 3, \"body\": {}}\n", "oabad10.jsonl:1: field 'url' must be a string"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const fs::path p = write_file("oabad" + std::to_string(i + 1) + ".jsonl", cases[i].text);
    INFO(cases[i].text);
    CHECK_THROWS_WITH(read_prompts(p, {}), Catch::Contains(cases[i].message));
  }
}

TEST_CASE("well-formed OpenAI requests that cannot be served carry an error", "[job]") {
  struct Case {
    std::string line, code, message;
  };
  json url_line = json::parse(completion_line("u", json::object()));
  url_line["url"] = "/v1/moderations";
  json get_line = json::parse(completion_line("g", json::object()));
  get_line["method"] = "GET";
  const std::vector<Case> cases = {
      {completion_line("1", {{"max_tokens", 0}}), "invalid_value", "body.max_tokens must be in [1, 1000000] (0 with echo"},
      {chat_line("2", {{"max_completion_tokens", "5"}}), "invalid_type", "body.max_completion_tokens must be an integer"},
      {chat_line("3", {{"temperature", 2.5}}), "invalid_value", "body.temperature must be in [0, 2]"},
      {chat_line("4", {{"top_p", 0}}), "invalid_value", "body.top_p must be in (0, 1]"},
      {url_line.dump() + "\n", "unsupported_url", "url \"/v1/moderations\" is not supported"},
      {get_line.dump() + "\n", "unsupported_method", "method \"GET\" is not supported"},
      {chat_line("5", {{"n", 129}}), "invalid_value", "body.n must be in [1, 128], got 129"},
      {chat_line("6", {{"logprobs", 1}}), "invalid_type", "body.logprobs must be true or false for chat"},
      {chat_line("7", {{"top_logprobs", 3}}), "invalid_value", "body.top_logprobs needs body.logprobs set to true"},
      {completion_line("8", {{"logprobs", 21}}), "invalid_value", "body.logprobs must be in [0, 20] for completions, got 21"},
      {completion_line("9", {{"stop", {"a", "b", "c", "d", "e"}}}), "invalid_value", "body.stop holds 5 strings; at most 4"},
      {chat_line("10", {{"stop", {"a", ""}}}), "invalid_value", "body.stop holds an empty string"},
      {chat_line("5b", {{"logprobs", true}, {"top_logprobs", 21}}), "invalid_value", "body.top_logprobs must be in [0, 20], got 21"},
      {chat_line("5c", {{"logprobs", true}, {"top_logprobs", -1}}), "invalid_value", "body.top_logprobs must be in [0, 20]"},
      {completion_line("8b", {{"logprobs", -1}}), "invalid_value", "body.logprobs must be in [0, 20]"},
      {completion_line("8c", {{"top_logprobs", 2}}), "invalid_value", "body.top_logprobs is for /v1/chat/completions"},
      {chat_line("9b", {{"stop", 3}}), "invalid_type", "body.stop must be a string or an array of strings"},
      {chat_line("9c", {{"stop", {"a", 1}}}), "invalid_type", "body.stop must be a string or an array of strings"},
      {completion_line("9d", {{"stop", ""}}), "invalid_value", "body.stop holds an empty string"},
      {completion_line("11", {{"prompt", {"a", 5}}}), "invalid_type", "body.prompt[1] must be a string or token ids, got 5"},
      {completion_line("11b", {{"prompt", {"a", ""}}}), "invalid_value", "body.prompt[1] is empty"},
      {completion_line("11c", {{"prompt", {{1, -2}, {3}}}}), "invalid_value", "body.prompt[0] token id -2 is not a token id"},
      {completion_line("11d", {{"prompt", json::array()}}), "invalid_value", "body.prompt is empty"},
      {completion_line("11e", {{"prompt", {{1, 2}, json::array()}}}), "invalid_type", "body.prompt[1] must be a string or token ids, got []"},
      {completion_line("11f", {{"prompt", std::vector<std::string>(2049, "a")}}), "invalid_value",
       "body.prompt holds 2049 prompts; at most 2048 in one request"},
      {chat_line("12", {{"prompt", "x"}}), "invalid_value", "body.prompt is for /v1/completions"},
      {chat_line("r1", {{"reasoning_effort", "max"}}), "invalid_value",
       "body.reasoning_effort must be \"low\", \"medium\" or \"high\", got \"max\""},
      {chat_line("r2", {{"reasoning_effort", 1}}), "invalid_type", "body.reasoning_effort must be a string"},
      {chat_line("k1", {{"chat_template_kwargs", {1}}}), "invalid_type", "body.chat_template_kwargs must be an object"},
      {chat_line("k2", {{"chat_template_kwargs", {{"enable_thinking", "no"}}}}), "invalid_type",
       "body.chat_template_kwargs.enable_thinking must be true or false"},
      {chat_line("k3", {{"chat_template_kwargs", {{"reasoning_effort", "none"}}}}), "invalid_value",
       "body.chat_template_kwargs.reasoning_effort must be"},
      {chat_line("k4", {{"chat_template_kwargs", {{"tools", json::array()}}}}), "invalid_value",
       "body.chat_template_kwargs.tools is set by Strata, not by a request"},
      {chat_line("k5", {{"chat_template_kwargs", {{"add_generation_prompt", false}}}}), "invalid_value",
       "body.chat_template_kwargs.add_generation_prompt is set by Strata"},
      {chat_line("13", {{"messages", json::array()}}), "invalid_type", "body.messages must be a non-empty array"},
      {chat_line("14", {{"messages", {{{"role", "user"}}}}}), "missing_field", "body.messages[0].content is required"},
      {completion_line("15", {{"prompt", ""}}), "invalid_value", "body.prompt is empty"},
      {completion_line("16", {{"max_tokens", 4}, {"max_completion_tokens", 5}}), "invalid_value", "disagree"},
      {chat_line("17", {{"stream", true}}), "unsupported_parameter", "body.stream"},
      {chat_line("18", {{"n", 0}}), "invalid_value", "body.n must be in [1, 128], got 0"},
      {chat_line("19", {{"frequency_penalty", -2.5}}), "invalid_value", "body.frequency_penalty must be in [-2, 2]"},
      {chat_line("20", {{"presence_penalty", "0.5"}}), "invalid_type", "body.presence_penalty must be a number"},
      {completion_line("21", {{"logit_bias", {{"50256", 200}}}}), "invalid_value",
       "body.logit_bias[\"50256\"] must be in [-100, 100], got 200"},
      {chat_line("22", {{"logit_bias", {{"a", 1}}}}), "invalid_value", "body.logit_bias keys must be token ids"},
      {chat_line("23", {{"logit_bias", 5}}), "invalid_type", "body.logit_bias must be an object"},
      {chat_line("24", {{"min_p", -0.1}}), "invalid_value", "body.min_p must be in [0, 1]"},
      {chat_line("25", {{"repetition_penalty", -1}}), "invalid_value", "body.repetition_penalty must be > 0"},
      {chat_line("26", {{"max_tokens", 4}, {"min_tokens", 5}}), "invalid_value", "body.min_tokens must be in [0, 4]"},
      {chat_line("27", {{"stop_token_ids", {"a"}}}), "invalid_value", "body.stop_token_ids must hold token ids"},
      {chat_line("28", {{"response_format", {{"type", "json_schema"}, {"json_schema", json::object()}}}}),
       "invalid_value", "body.response_format of type \"json_schema\" needs \"json_schema\": {\"schema\": {...}}"},
      {chat_line("29", {{"response_format", "json_object"}}), "invalid_type",
       "body.response_format must be an object with a string \"type\""},
      {completion_line("30", {{"response_format", {{"type", "yaml"}}}}), "invalid_value",
       "body.response_format type must be \"text\", \"json_object\" or \"json_schema\", got \"yaml\""},
      {chat_line("31", {{"response_format",
                         {{"type", "json_schema"},
                          {"json_schema", {{"name", "x"}, {"schema", {{"type", "object"}, {"minProperties", 1}}}}}}}}),
       "unsupported_value", "body.response_format.json_schema.schema: keyword 'minProperties' at # is not supported"},
  };
  std::string text;
  for (const Case& c : cases) text += c.line;
  text += completion_line("fine", json::object());
  const auto recs = read_prompts(write_file("oa_serve.jsonl", text), {});
  REQUIRE(recs.size() == cases.size() + 1);
  for (size_t i = 0; i < cases.size(); ++i) {
    INFO(cases[i].line);
    REQUIRE(recs[i].error);
    CHECK(recs[i].error->code == cases[i].code);
    CHECK_THAT(recs[i].error->message, Catch::Contains(cases[i].message));
  }
  CHECK_FALSE(recs.back().error);
}

TEST_CASE("OpenAI batch output lines have the Batch API's shape", "[job]") {
  PromptRecord chat, text;
  chat.id = "req-1";
  chat.format = text.format = InputFormat::OpenAIBatch;
  chat.endpoint = Endpoint::ChatCompletions;
  text.id = "req-2";
  text.endpoint = Endpoint::Completions;
  Completion c;
  c.text = "Paris.";
  c.prompt_tokens = 7;
  c.completion_tokens = 3;
  c.finish_reason = "stop";
  c.model = "tiny";
  c.created = 1700000000;
  // Dumped and parsed back, as a reader of the file sees it.
  const json a = json::parse(openai_response_line(chat, c).dump());
  CHECK(a["id"].get<std::string>().rfind("batch_req_", 0) == 0);
  CHECK(a["custom_id"] == "req-1");
  CHECK(a["error"].is_null());
  CHECK(a["response"]["status_code"] == 200);
  CHECK(a["response"]["request_id"].get<std::string>().rfind("req_", 0) == 0);
  const json& body = a["response"]["body"];
  CHECK(body["object"] == "chat.completion");
  CHECK(body["id"].get<std::string>().rfind("chatcmpl-", 0) == 0);
  CHECK(body["model"] == "tiny");
  CHECK(body["created"] == 1700000000);
  REQUIRE(body["choices"].size() == 1);
  CHECK(body["choices"][0]["index"] == 0);
  CHECK(body["choices"][0]["message"] == json{{"role", "assistant"}, {"content", "Paris."}});
  CHECK(body["choices"][0]["finish_reason"] == "stop");
  CHECK(body["usage"] == json{{"prompt_tokens", 7}, {"completion_tokens", 3}, {"total_tokens", 10}});

  c.finish_reason = "length";
  const json b = json::parse(openai_response_line(text, c).dump());
  const json& tb = b["response"]["body"];
  CHECK(tb["object"] == "text_completion");
  CHECK(tb["id"].get<std::string>().rfind("cmpl-", 0) == 0);
  CHECK(tb["choices"][0]["text"] == "Paris.");
  CHECK_FALSE(tb["choices"][0].contains("message"));
  CHECK(tb["choices"][0]["finish_reason"] == "length");
  CHECK(a["id"] != b["id"]);
  CHECK(a["id"] == openai_response_line(chat, c)["id"]);  // stable across runs and shards

  const json e = json::parse(openai_error_line(text, {"unsupported_parameter", "body.n > 1 is not supported yet"}).dump());
  CHECK(e["custom_id"] == "req-2");
  CHECK(e["id"] == b["id"]);
  CHECK(e["response"].is_null());
  CHECK(e["error"] == json{{"code", "unsupported_parameter"}, {"message", "body.n > 1 is not supported yet"}});
}

TEST_CASE("a rerun resumes OpenAI output by custom_id, error lines included", "[job]") {
  const fs::path out = temp_dir() / "oa_out.jsonl";
  fs::remove(out);
  PromptRecord r;
  r.id = "x";
  r.endpoint = Endpoint::Completions;
  PromptRecord bad;
  bad.id = "y";
  const std::string l1 = openai_response_line(r, Completion{}).dump(), l2 = openai_error_line(bad, {"c", "m"}).dump();
  write_file("oa_out.jsonl.partial", l1 + "\n" + l2 + "\n{\"id\": \"batch_req_1\", \"custom_id\": \"z\", \"resp");
  OutputWriter w(out);
  CHECK(w.done_ids().size() == 2);
  CHECK(w.done_ids().contains("\"x\""));
  CHECK(w.done_ids().contains("\"y\""));
  w.finish();
}

TEST_CASE("OpenAI custom_ids with escapes and unicode resume under their request's key", "[job][resume]") {
  const fs::path out = temp_dir() / "oa_keys.jsonl";
  fs::remove(out);
  fs::remove(out.string() + ".partial");
  const std::vector<std::string> custom_ids = {"req-1", "q\"uo\\te", "tab\tnl\n", "caf\xc3\xa9", "\xf0\x9f\x98\x80",
                                               "batch_req_0000000000000000"};
  std::string text;
  for (const auto& id : custom_ids) text += completion_line(id, json::object());
  text += R"({"custom_id": "caf\u00e9 2", "url": "/v1/completions", "body": {"prompt": "hi"}})" "\n";
  const auto recs = read_prompts(write_file("oa_keys_in.jsonl", text), {});
  REQUIRE(recs.size() == custom_ids.size() + 1);
  {
    OutputWriter w(out);
    Completion c;
    c.text = std::string(200, 'w') + "\xc3\xa9";
    for (size_t i = 0; i < recs.size(); ++i)
      w.write(i % 2 ? openai_response_line(recs[i], c) : openai_error_line(recs[i], {"invalid_value", "m"}));
    w.flush();
  }  // a crash: OUT.partial stays
  OutputWriter w(out);
  CHECK(w.done_ids().size() == recs.size());
  for (const auto& r : recs) {
    INFO(r.id_key);
    CHECK(w.done_ids().contains(r.id_key));
  }
  CHECK_FALSE(w.done_ids().contains(openai_error_line(recs[0], {"c", "m"})["id"].dump()));  // the line's own id
}

TEST_CASE("shards: --shard hashes the id's string form with FNV-1a 64", "[job]") {
  CHECK(fnv1a64("") == 0xcbf29ce484222325ull);
  CHECK(fnv1a64("a") == 0xaf63dc4c8601ec8cull);
  CHECK(fnv1a64("foobar") == 0x85944171f73967e8ull);
  CHECK(id_text(json("req-1")) == "req-1");
  CHECK(id_text(json(17)) == "17");
  const Shard s = parse_shard("2/5");
  CHECK(s.index == 2);
  CHECK(s.count == 5);
  for (const char* bad : {"5/5", "1", "-1/2", "a/b", "1/0", "1/2x", "/2"})
    CHECK_THROWS_WITH(parse_shard(bad), Catch::Contains("--shard must be i/N"));
  // Every id lands in exactly one shard.
  PromptRecord r;
  for (int i = 0; i < 50; ++i) {
    r.id = "id-" + std::to_string(i);
    int hits = 0;
    for (uint64_t k = 0; k < 4; ++k) hits += in_shard(r, Shard{k, 4});
    CHECK(hits == 1);
  }
}

TEST_CASE("chat_template_kwargs: enable_thinking read, other arguments kept in order for the template", "[job]") {
  const std::string text =
      chat_line("k", {{"chat_template_kwargs", {{"enable_thinking", false}, {"thinking", true}, {"style", {1, "x"}}}}}) +
      "\n";
  const auto recs = read_prompts(write_file("oa_kwargs.jsonl", text), SamplingParams{}, [](const std::string&) {});
  REQUIRE(recs.size() == 1);
  CHECK_FALSE(recs[0].error);
  CHECK(recs[0].enable_thinking == std::optional<bool>(false));
  using Kwargs = std::vector<std::pair<std::string, std::string>>;
  // nlohmann's json (as the prompt reader parses lines) sorts keys: "style" before "thinking".
  CHECK(recs[0].template_kwargs == Kwargs{{"style", "[1,\"x\"]"}, {"thinking", "true"}});
}
