// Tool calls (job/tool_calls.h): read from answers as vLLM's hermes parser reads them
// (tests/fixtures/chat/make_tool_call_cases.py), written as OpenAI's message.tool_calls, and the
// request fields tools and tool_choice read in both input formats.
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "strata/job/answers.h"
#include "strata/job/output.h"
#include "strata/job/prompts.h"
#include "strata/job/tool_calls.h"
#include "test_paths.h"

using namespace strata;
using json = nlohmann::json;

namespace {

const Tokenizer& llama3_style() {
  static const Tokenizer tok = Tokenizer::from_dir(std::string(STRATA_FIXTURES_DIR) + "/tokenizer/llama3-style");
  return tok;
}

const std::string kTools = R"([{"type": "function", "function": {"name": "get_weather", "parameters": {}}}])";

// One line through the parser of its format.
PromptRecord parse_line(const std::string& line) {
  PromptLineParser parser("in.jsonl", SamplingParams{});
  return *parser.parse(line, 1);
}

std::string openai_line(const std::string& body_fields) {
  return R"({"custom_id": "c", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": )"
         R"([{"role": "user", "content": "hi"}])" + body_fields + "}}";
}

// Each answer of `cases` (make_tool_call_cases.py) read by `read`; returns how many called tools.
template <class Read>
int check_cases(const json& cases, Read read) {
  int called = 0;
  for (const json& c : cases) {
    const std::string answer = c["answer"].get<std::string>();
    INFO(answer);
    const ToolCallAnswer got = read(answer);
    REQUIRE(got.calls.size() == c["calls"].size());
    CHECK(got.calls.empty() == !c["called"].get<bool>());
    for (size_t k = 0; k < got.calls.size(); ++k) {
      CHECK(got.calls[k].name == c["calls"][k]["name"].get<std::string>());
      CHECK(got.calls[k].arguments == c["calls"][k]["arguments"].get<std::string>());
    }
    if (c["content"].is_null()) CHECK_FALSE(got.content);
    else CHECK(got.content == c["content"].get<std::string>());
    called += c["called"].get<bool>();
  }
  return called;
}

const json& tool_call_cases() {
  static const json ex = [] {
    std::ifstream in(std::string(STRATA_FIXTURES_DIR) + "/chat/tool_call_cases.json");
    return json::parse(in);
  }();
  return ex;
}

}  // namespace

TEST_CASE("tool calls are read from answers as vLLM's hermes parser reads them", "[job][tools]") {
  CHECK(check_cases(tool_call_cases()["cases"], read_hermes_tool_calls) == 14);
}

TEST_CASE("Llama 3.1's JSON tool calls are read as vLLM's llama3_json parser reads them", "[job][tools]") {
  CHECK(check_cases(tool_call_cases()["llama3_json"], read_llama3_json_tool_calls) == 9);
}

TEST_CASE("a tool call's id is the same for the same request, choice and call, and differs otherwise", "[job][tools]") {
  PromptRecord a, b;
  a.id = "req-1";
  b.id = "req-2";
  std::set<std::string> ids;
  for (const PromptRecord* r : {&a, &b})
    for (size_t choice : {0, 1})
      for (size_t k : {0, 1}) {
        const std::string id = tool_call_id(*r, choice, k);
        CHECK(id == tool_call_id(*r, choice, k));
        CHECK(id.size() == 29);
        CHECK(id.rfind("call_", 0) == 0);
        CHECK(id.find_first_not_of("0123456789abcdef", 5) == std::string::npos);
        ids.insert(id);
      }
  CHECK(ids.size() == 8);
}

TEST_CASE("an answer that calls tools is written as OpenAI's tool_calls, in both formats", "[job][tools][batch]") {
  AnswerSettings s = answer_settings(llama3_style(), {}, "qwen", 1700000000, ResponseFormat::Text);
  s.tool_calls = ToolCallFormat::Hermes;
  GenResult g;
  g.tokens = llama3_style().encode(
      "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n"
      "</tool_call>");
  g.finish = FinishReason::Eos;
  PromptRecord chat = parse_line(openai_line(R"(, "tools": )" + kTools));
  REQUIRE_FALSE(chat.error);
  REQUIRE(chat.tools.size() == 1);
  const json line = answer_line(chat, 5, std::span(&g, 1), s);
  const json& choice = line["response"]["body"]["choices"][0];
  CHECK(choice["finish_reason"] == "tool_calls");
  CHECK(choice["message"]["content"] == "Checking.\n");
  REQUIRE(choice["message"]["tool_calls"].size() == 1);
  const json& call = choice["message"]["tool_calls"][0];
  CHECK(call["id"] == tool_call_id(chat, 0, 0));
  CHECK(call["type"] == "function");
  CHECK(call["function"]["name"] == "get_weather");
  CHECK(call["function"]["arguments"] == R"({"city": "Paris", "days": 2})");

  // The strata format: the same calls beside the text before them.
  PromptRecord strata = parse_line(R"({"id": 3, "messages": [{"role": "user", "content": "hi"}], "tools": )" + kTools + "}");
  const json plain = answer_line(strata, 5, std::span(&g, 1), s);
  CHECK(plain["completion"] == "Checking.\n");
  CHECK(plain["finish_reason"] == "tool_calls");
  CHECK(plain["tool_calls"][0]["function"] == call["function"]);
  CHECK(plain["tool_calls"][0]["id"] == tool_call_id(strata, 0, 0));

  // Nothing before the call: a null content. Two choices: their own ids.
  GenResult only = g;
  only.tokens = llama3_style().encode("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>");
  chat.n = 2;
  const GenResult both[] = {only, only};
  const json two = answer_line(chat, 5, both, s)["response"]["body"]["choices"];
  CHECK(two[0]["message"]["content"].is_null());
  CHECK(two[1]["message"]["tool_calls"][0]["id"] == tool_call_id(chat, 1, 0));
  CHECK(two[0]["message"]["tool_calls"][0]["id"] != two[1]["message"]["tool_calls"][0]["id"]);

  // tool_choice "none", a request without tools, or a template that writes no tools: the answer is text.
  const std::string text = llama3_style().decode(g.tokens, true);
  PromptRecord none = parse_line(openai_line(R"(, "tools": )" + kTools + R"(, "tool_choice": "none")"));
  PromptRecord no_tools = parse_line(openai_line(""));
  for (const PromptRecord* r : {&none, &no_tools}) {
    const json c = answer_line(*r, 5, std::span(&g, 1), s)["response"]["body"]["choices"][0];
    CHECK(c["message"]["content"] == text);
    CHECK_FALSE(c["message"].contains("tool_calls"));
    CHECK(c["finish_reason"] == "stop");
  }
  s.tool_calls = ToolCallFormat::None;
  CHECK(answer_line(chat, 5, both, s)["response"]["body"]["choices"][0]["message"]["content"] ==
        llama3_style().decode(only.tokens, true));

  // Llama 3.1's template: a JSON call, "parameters" read as the arguments, the content null.
  s.tool_calls = ToolCallFormat::Llama3Json;
  chat.n = 1;
  GenResult llama = g;
  llama.tokens = llama3_style().encode(R"({"name": "get_weather", "parameters": {"city": "Paris"}})");
  const json c = answer_line(chat, 5, std::span(&llama, 1), s)["response"]["body"]["choices"][0];
  CHECK(c["message"]["content"].is_null());
  CHECK(c["message"]["tool_calls"][0]["function"] == json{{"name", "get_weather"}, {"arguments", R"({"city": "Paris"})"}});
  CHECK(c["finish_reason"] == "tool_calls");
}

TEST_CASE("tools and tool_choice are read in both formats, each tool in its keys' order", "[job][tools]") {
  // The keys' order as written, not sorted: the template prints each tool as it came.
  const PromptRecord r = parse_line(openai_line(
      R"(, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"z": 1, "a": 2}}}], "tool_choice": "auto")"));
  REQUIRE_FALSE(r.error);
  CHECK(r.tools == std::vector<std::string>{R"({"type":"function","function":{"name":"f","parameters":{"z":1,"a":2}}})"});
  CHECK(r.read_tool_calls);
  CHECK_FALSE(parse_line(openai_line(R"(, "tools": )" + kTools + R"(, "tool_choice": "none")")).read_tool_calls);
  CHECK(parse_line(openai_line(R"(, "tools": [])")).tools.empty());
  CHECK(parse_line(openai_line(R"(, "tools": null)")).tools.empty());

  // OpenAI lines that cannot be served are error lines naming the field.
  const std::pair<std::string, std::string> refused[] = {
      {R"(, "tools": {})", "invalid_type"},
      {R"(, "tools": [{"type": "function", "function": {"description": "no name"}}])", "invalid_type"},
      {R"(, "tools": [{"type": "retrieval", "function": {"name": "f"}}])", "unsupported_value"},
      {R"(, "tools": )" + kTools + R"(, "tool_choice": "required", "response_format": {"type": "json_object"})",
       "invalid_value"},
      {R"(, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": )"
       R"({"x": {"type": "string", "pattern": "a+"}}}}}], "tool_choice": "required")",
       "unsupported_value"},
      {R"(, "tools": )" + kTools + R"(, "tool_choice": {"type": "function", "function": {"name": "other"}})",
       "invalid_value"},
      {R"(, "tools": )" + kTools + R"(, "tool_choice": {"function": {"name": "get_weather"}})", "invalid_value"},
      {R"(, "tools": )" + kTools + R"(, "tool_choice": {"type": "function", "function": {"name": "get_weather"}},)"
       R"( "response_format": {"type": "json_object"})",
       "invalid_value"},
      {R"(, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": )"
       R"({"x": {"type": "number", "minimum": 0}}}}}], "tool_choice": {"type": "function", "function": {"name": "f"}})",
       "unsupported_value"},
      {R"(, "tool_choice": {"type": "function", "function": {"name": "f"}})", "invalid_value"},
      {R"(, "tool_choice": "required")", "invalid_value"},
      {R"(, "tool_choice": "sometimes")", "invalid_value"},
      {R"(, "tool_choice": 1)", "invalid_type"}};
  for (const auto& [fields, code] : refused) {
    INFO(fields);
    const PromptRecord e = parse_line(openai_line(fields));
    REQUIRE(e.error);
    CHECK(e.error->code == code);
    CHECK_THAT(e.error->message, Catch::Contains("body.tool"));
  }
  // The strata format: a bad line stops the job, naming the field.
  CHECK_THROWS_WITH(parse_line(R"({"id": 1, "prompt": "p", "tools": )" + kTools + "}"),
                    Catch::Contains("in.jsonl:1") && Catch::Contains("'tools' are for chat messages"));
  CHECK_THROWS_WITH(parse_line(R"({"id": 1, "messages": [{"role": "user", "content": "x"}], "tools": [1]})"),
                    Catch::Contains("field 'tools'[0] must be an object"));
}

TEST_CASE("a named tool_choice holds the answer to the function's parameters and writes it as the call", "[job][tools]") {
  const std::string tools =
      R"([{"type": "function", "function": {"name": "other"}}, {"type": "function", "function": {"name": "get_weather", )"
      R"("parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, )"
      R"("required": ["city"]}}}])";
  const std::string named = R"(, "tool_choice": {"type": "function", "function": {"name": "get_weather"}})";
  PromptRecord r = parse_line(openai_line(R"(, "tools": )" + tools + named));
  REQUIRE_FALSE(r.error);
  CHECK(r.named_tool == "get_weather");
  CHECK(r.response_format == ResponseFormat::JsonSchema);
  // The parameters' schema in its keys' order: properties keep the order they were written in.
  CHECK(r.json_schema ==
        R"({"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]})");
  // A function without parameters: any JSON object.
  const PromptRecord bare = parse_line(openai_line(R"(, "tools": )" + tools +
                                                   R"(, "tool_choice": {"type": "function", "function": {"name": "other"}})"));
  CHECK(bare.response_format == ResponseFormat::JsonObject);
  CHECK(bare.named_tool == "other");

  AnswerSettings s = answer_settings(llama3_style(), {}, "qwen", 1700000000, ResponseFormat::Text);
  s.tool_calls = ToolCallFormat::Hermes;
  GenResult g;
  g.tokens = llama3_style().encode(R"({"city": "Oslo", "days":3})");
  g.finish = FinishReason::Eos;
  const json choice = answer_line(r, 5, std::span(&g, 1), s)["response"]["body"]["choices"][0];
  CHECK(choice["message"]["content"].is_null());
  CHECK(choice["message"]["tool_calls"] ==
        json::array({{{"id", tool_call_id(r, 0, 0)},
                      {"type", "function"},
                      {"function", {{"name", "get_weather"}, {"arguments", R"({"city": "Oslo", "days":3})"}}}}}));
  CHECK(choice["finish_reason"] == "stop");  // as OpenAI's forced call
  // The request that would be generated carries the schema's grammar.
  CHECK(make_gen_request(r, {1, 2}, s).grammar != nullptr);
}

TEST_CASE("tool_choice required holds the answer to an array of calls and writes them as the calls", "[job][tools]") {
  const std::string tools =
      R"([{"type": "function", "function": {"name": "other"}}, {"type": "function", "function": {"name": "get_weather", )"
      R"("parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])";
  const PromptRecord r = parse_line(openai_line(R"(, "tools": )" + tools + R"(, "tool_choice": "required")"));
  REQUIRE_FALSE(r.error);
  CHECK(r.tool_calls_required);
  CHECK(r.named_tool.empty());
  CHECK(r.response_format == ResponseFormat::JsonSchema);
  // One object per tool, its name a constant, its parameters an empty object where it has none.
  CHECK(nlohmann::ordered_json::parse(r.json_schema) == nlohmann::ordered_json::parse(R"({"type": "array", "minItems": 1,
      "items": {"anyOf": [
        {"type": "object", "properties": {"name": {"enum": ["other"]}, "parameters": {"type": "object", "properties": {}}},
         "required": ["name", "parameters"]},
        {"type": "object", "properties": {"name": {"enum": ["get_weather"]}, "parameters": {"type": "object",
         "properties": {"city": {"type": "string"}}, "required": ["city"]}}, "required": ["name", "parameters"]}]}})"));

  AnswerSettings s = answer_settings(llama3_style(), {}, "qwen", 1700000000, ResponseFormat::Text);
  s.tool_calls = ToolCallFormat::Hermes;
  auto choice_of = [&](const std::string& answer, FinishReason finish) {
    GenResult g;
    g.tokens = llama3_style().encode(answer);
    g.finish = finish;
    return answer_line(r, 5, std::span(&g, 1), s)["response"]["body"]["choices"][0];
  };
  // The arguments are each call's parameters as json.dumps(ensure_ascii=False) prints them.
  const json both = choice_of(R"([{"name":"get_weather","parameters":{"city":"Zürich"}}, {"name": "other", "parameters": {}}])",
                              FinishReason::Eos);
  CHECK(both["message"]["content"].is_null());
  CHECK(both["message"]["tool_calls"] ==
        json::array({{{"id", tool_call_id(r, 0, 0)},
                      {"type", "function"},
                      {"function", {{"name", "get_weather"}, {"arguments", R"({"city": "Zürich"})"}}}},
                     {{"id", tool_call_id(r, 0, 1)},
                      {"type", "function"},
                      {"function", {{"name", "other"}, {"arguments", "{}"}}}}}));
  CHECK(both["finish_reason"] == "stop");  // as the answer ended, as a named function's
  // Cut by the token limit: no calls, the text is the answer.
  const json cut = choice_of(R"([{"name": "get_weather", "parame)", FinishReason::Length);
  INFO(cut.dump());
  CHECK_FALSE(cut["message"].contains("tool_calls"));
  CHECK(cut["message"]["content"] == R"([{"name": "get_weather", "parame)");
  CHECK(cut["finish_reason"] == "length");
  CHECK(make_gen_request(r, {1, 2}, s).grammar != nullptr);
}

TEST_CASE("the schema of required tool calls hoists each tool's definitions, refusing two of one name", "[job][tools]") {
  using ordered = nlohmann::ordered_json;
  const ordered item_def = {{"type", "object"}, {"properties", {{"n", {{"type", "integer"}}}}}};
  auto tool = [](const std::string& name, const ordered& defs) {
    return ordered{{"type", "function"},
                   {"function",
                    {{"name", name},
                     {"parameters", {{"type", "object"},
                                     {"properties", {{"item", {{"$ref", "#/$defs/Item"}}}}},
                                     {"$defs", defs}}}}}};
  };
  const ordered schema = required_tool_calls_schema(ordered::array({tool("a", {{"Item", item_def}})}));
  CHECK(schema["$defs"] == ordered{{"Item", item_def}});
  CHECK_FALSE(schema["items"]["properties"]["parameters"].contains("$defs"));  // one tool: items is its object
  // Two tools that define Item alike share it; differently, the request is refused.
  CHECK(required_tool_calls_schema(ordered::array({tool("a", {{"Item", item_def}}), tool("b", {{"Item", item_def}})}))
            ["$defs"].size() == 1);
  CHECK_THROWS_WITH(
      required_tool_calls_schema(ordered::array({tool("a", {{"Item", item_def}}), tool("b", {{"Item", {{"type", "string"}}}})})),
      Catch::Contains("tools define '$defs/Item' differently"));
  const PromptRecord e = parse_line(openai_line(
      R"(, "tools": [{"type": "function", "function": {"name": "a", "parameters": {"type": "object", "$defs": {"I": {"type": "string"}}}}},)"
      R"( {"type": "function", "function": {"name": "b", "parameters": {"type": "object", "$defs": {"I": {"type": "integer"}}}}}],)"
      R"( "tool_choice": "required")"));
  REQUIRE(e.error);
  CHECK(e.error->code == "unsupported_value");
  CHECK_THAT(e.error->message, Catch::Contains("body.tools with tool_choice \"required\""));
  // Answers that are not an array of calls are read as none.
  CHECK_FALSE(read_required_tool_calls("[]"));
  CHECK_FALSE(read_required_tool_calls(R"({"name": "a", "parameters": {}})"));
  CHECK_FALSE(read_required_tool_calls(R"([{"name": "a"}])"));
  REQUIRE(read_required_tool_calls(R"([{"name": "a", "parameters": {"x": 1.0, "y": [true, null]}}])"));
  CHECK(read_required_tool_calls(R"([{"name": "a", "parameters": {"x": 1.0, "y": [true, null]}}])")->at(0).arguments ==
        R"({"x": 1.0, "y": [true, null]})");
}

TEST_CASE("parallel_tool_calls false keeps an answer's first call, and holds a required answer to one", "[job][tools]") {
  const std::string tools =
      R"([{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "g"}}])";
  CHECK(parse_line(openai_line(R"(, "tools": )" + tools)).parallel_tool_calls);  // OpenAI's default
  const PromptRecord one = parse_line(openai_line(R"(, "tools": )" + tools + R"(, "parallel_tool_calls": false)"));
  REQUIRE_FALSE(one.error);
  CHECK_FALSE(one.parallel_tool_calls);
  AnswerSettings s = answer_settings(llama3_style(), {}, "qwen", 1700000000, ResponseFormat::Text);
  s.tool_calls = ToolCallFormat::Hermes;
  GenResult g;
  g.tokens = llama3_style().encode("<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n"
                                   "<tool_call>\n{\"name\": \"g\", \"arguments\": {\"x\": 1}}\n</tool_call>");
  g.finish = FinishReason::Eos;
  const json first = answer_line(one, 5, std::span(&g, 1), s)["response"]["body"]["choices"][0];
  REQUIRE(first["message"]["tool_calls"].size() == 1);
  CHECK(first["message"]["tool_calls"][0]["function"]["name"] == "f");
  CHECK(first["finish_reason"] == "tool_calls");
  const PromptRecord both = parse_line(openai_line(R"(, "tools": )" + tools));
  CHECK(answer_line(both, 5, std::span(&g, 1), s)["response"]["body"]["choices"][0]["message"]["tool_calls"].size() == 2);
  // "required": the schema allows one call at most.
  const PromptRecord required =
      parse_line(openai_line(R"(, "tools": )" + tools + R"(, "tool_choice": "required", "parallel_tool_calls": false)"));
  REQUIRE_FALSE(required.error);
  CHECK(json::parse(required.json_schema)["maxItems"] == 1);
  CHECK_FALSE(json::parse(parse_line(openai_line(R"(, "tools": )" + tools + R"(, "tool_choice": "required")")).json_schema)
                  .contains("maxItems"));
  // Not a boolean: an error line naming the field.
  const PromptRecord bad = parse_line(openai_line(R"(, "tools": )" + tools + R"(, "parallel_tool_calls": "no")"));
  REQUIRE(bad.error);
  CHECK(bad.error->code == "invalid_type");
  CHECK_THAT(bad.error->message, Catch::Contains("body.parallel_tool_calls"));
}

TEST_CASE("the tool call format: the template's family, <tool_call> in an interpreted one, or --tool-call-parser",
          "[job][tools][jinja]") {
  std::ifstream in(std::string(STRATA_FIXTURES_DIR) + "/chat/chat_cases.json");
  const nlohmann::json ex = nlohmann::json::parse(in);
  auto chat = [&](const char* name) { return ChatTemplate::parse(ex["templates"][name]["source"].get<std::string>()); };
  CHECK(tool_call_format(chat("qwen3")) == ToolCallFormat::Hermes);
  CHECK(tool_call_format(chat("llama3.1")) == ToolCallFormat::Llama3Json);
  CHECK(tool_call_format(chat("mistral")) == ToolCallFormat::None);
  // Interpreted: Hermes where the template reads tools and writes <tool_call>, else text.
  CHECK(tool_call_format(chat("qwq-style")) == ToolCallFormat::Hermes);
  CHECK(tool_call_format(chat("mistral-tools-style")) == ToolCallFormat::None);  // [TOOL_CALLS]
  CHECK(tool_call_format(chat("phi4-style")) == ToolCallFormat::None);
  // Named, as vLLM's --tool-call-parser, whatever the template.
  CHECK(tool_call_format(chat("qwq-style"), "none") == ToolCallFormat::None);
  CHECK(tool_call_format(chat("mistral-tools-style"), "hermes") == ToolCallFormat::Hermes);
  CHECK(tool_call_format(chat("qwen3"), "llama3_json") == ToolCallFormat::Llama3Json);
  CHECK(tool_call_format(chat("llama3.1"), "auto") == ToolCallFormat::Llama3Json);
}
