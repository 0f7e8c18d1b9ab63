// `strata run` on OpenAI Batch API files and with --shard, as a user runs it: the real binary.
#include "required_files.h"
#include "test_paths.h"
#include "temp_files.h"
#include <catch2/catch.hpp>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "cli_support.h"
#include "strata/model/tokenizer.h"

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

using strata::test::CliResult;
using strata::test::run_strata;

fs::path temp_dir() { return strata::test::temp_dir("batchcli"); }

const std::string kModels = std::string(STRATA_FIXTURES_DIR) + "/models";

std::vector<json> read_lines(const fs::path& file) {
  std::vector<json> out;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) out.push_back(json::parse(line));
  return out;
}

json completion_request(const json& id, const std::string& prompt, const json& extra = json::object()) {
  json body = {{"model", "tiny-llama"}, {"prompt", prompt}};
  body.update(extra);
  return {{"custom_id", id}, {"method", "POST"}, {"url", "/v1/completions"}, {"body", body}};
}

std::map<std::string, json> by_custom_id(const std::vector<json>& lines) {
  std::map<std::string, json> m;
  for (const json& l : lines) {
    const std::string id = l["custom_id"].get<std::string>();
    CHECK(m.count(id) == 0);  // nothing doubled
    m[id] = l;
  }
  return m;
}

}  // namespace

TEST_CASE("strata run answers an OpenAI batch file with Hugging Face's greedy completions", "[cli]") {
  std::ifstream fin(kModels + "/tiny-llama-cli.json");
  const json fx = json::parse(fin);
  const fs::path in = temp_dir() / "batch.jsonl", out = temp_dir() / "batch_out.jsonl";
  {
    std::ofstream f(in);
    for (const json& c : fx["cases"])
      f << completion_request("case-" + c["id"].dump(), c["prompt"], {{"max_tokens", 16}, {"temperature", 0}}).dump()
        << "\n";
    // Well formed, but not served: answered with an error line while the rest proceeds.
    f << completion_request("too-many-choices", "x", {{"n", 129}}).dump() << "\n";
    f << json{{"custom_id", "chat"}, {"url", "/v1/chat/completions"}, {"method", "POST"},
              {"body", {{"messages", {{{"role", "user"}, {"content", "hi"}}}}}}}.dump() << "\n";
    f << completion_request("long", std::string(400, 'a') + " " + std::string(400, 'b'), {{"unknown_knob", 1}}).dump()
      << "\n";
    f << completion_request("bias", "x", {{"logit_bias", {{"1000", 5}}}}).dump() << "\n";  // tiny-llama has 1000 ids
    f << completion_request("stop-id", "x", {{"stop_token_ids", {3, 1001}}}).dump() << "\n";
    f << completion_request("embed", "x").dump() << "\n";
  }
  {  // an unsupported url on the last line
    std::vector<std::string> lines;
    std::ifstream f(in);
    for (std::string l; std::getline(f, l);) lines.push_back(l);
    json last = json::parse(lines.back());
    last["url"] = "/v1/moderations";
    lines.back() = last.dump();
    std::ofstream o(in);
    for (const auto& l : lines) o << l << "\n";
  }
  fs::remove(out);
  const CliResult r = run_strata("run --model " + kModels + "/tiny-llama -i " + in.string() + " -o " + out.string() +
                                 " --device cpu --batch-size 2 --no-progress");
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("ignoring unknown field 'body.unknown_knob'"));
  CHECK_THAT(r.output, Catch::Contains("6 requests cannot be served"));
  const auto got = by_custom_id(read_lines(out));
  REQUIRE(got.size() == fx["cases"].size() + 6);
  for (const json& c : fx["cases"]) {
    const json& line = got.at("case-" + c["id"].dump());
    CHECK(line["error"].is_null());
    CHECK(line["id"].get<std::string>().rfind("batch_req_", 0) == 0);
    const json& resp = line["response"];
    CHECK(resp["status_code"] == 200);
    const json& body = resp["body"];
    CHECK(body["object"] == "text_completion");
    CHECK(body["model"] == "tiny-llama");
    CHECK(body["choices"][0]["text"] == c["completion"]);
    const bool eos = c["greedy"].back() == fx["eos"];
    CHECK(body["choices"][0]["finish_reason"] == (eos ? "stop" : "length"));
    CHECK(body["usage"]["prompt_tokens"] == c["prompt_ids"].size());
    CHECK(body["usage"]["completion_tokens"] == c["greedy"].size());
    CHECK(body["usage"]["total_tokens"] == c["prompt_ids"].size() + c["greedy"].size());
  }
  auto error_of = [&](const std::string& id) {
    const json& l = got.at(id);
    CHECK(l["response"].is_null());
    return l["error"];
  };
  CHECK(error_of("too-many-choices")["code"] == "invalid_value");
  CHECK(error_of("chat")["code"] == "unsupported_model");
  CHECK_THAT(error_of("chat")["message"].get<std::string>(), Catch::Contains("no chat template"));
  CHECK(error_of("long")["code"] == "context_length_exceeded");
  CHECK(error_of("embed")["code"] == "unsupported_url");
  CHECK(error_of("bias")["code"] == "invalid_value");
  CHECK_THAT(error_of("bias")["message"].get<std::string>(),
             Catch::Contains("logit_bias token 1000 is outside the model's vocabulary of 1000"));
  CHECK_THAT(error_of("stop-id")["message"].get<std::string>(),
             Catch::Contains("stop_token_ids token 1001 is outside the model's vocabulary of 1000"));

  // With --errors, the error lines go to their own file.
  const fs::path out2 = temp_dir() / "batch_out2.jsonl", errs = temp_dir() / "batch_errors.jsonl";
  fs::remove(out2);
  fs::remove(errs);
  const CliResult r2 = run_strata("run --model " + kModels + "/tiny-llama --prompts " + in.string() + " --out " +
                                  out2.string() + " --errors " + errs.string() + " --device cpu --no-progress");
  INFO(r2.output);
  REQUIRE(r2.code == 0);
  CHECK(read_lines(out2).size() == fx["cases"].size());
  const auto e = by_custom_id(read_lines(errs));
  CHECK(e.size() == 6);
  CHECK(e.count("long") == 1);
  CHECK_FALSE(fs::exists(errs.string() + ".partial"));
}

TEST_CASE("an OpenAI batch file that mixes formats or repeats a custom_id is refused before work", "[cli]") {
  const fs::path in = temp_dir() / "mixed.jsonl", out = temp_dir() / "mixed_out.jsonl";
  std::ofstream(in) << completion_request("a", "one").dump() << "\n{\"id\": 2, \"prompt\": \"two\"}\n";
  fs::remove(out);
  CliResult r = run_strata("run --model " + kModels + "/tiny-opt -i " + in.string() + " -o " + out.string() +
                           " --device cpu");
  CHECK(r.code == 1);
  CHECK_THAT(r.output, Catch::Contains("mixed.jsonl:2: this line is in the strata format"));
  CHECK_FALSE(fs::exists(out.string() + ".partial"));
  std::ofstream(in) << completion_request("a", "one").dump() << "\n" << completion_request("a", "two").dump() << "\n";
  r = run_strata("run --model " + kModels + "/tiny-opt -i " + in.string() + " -o " + out.string() + " --device cpu");
  CHECK(r.code == 1);
  CHECK_THAT(r.output, Catch::Contains("mixed.jsonl:2: duplicate custom_id \"a\""));
  CHECK_FALSE(fs::exists(out.string() + ".partial"));
}

TEST_CASE("an interrupted OpenAI batch job resumes by custom_id, error lines included", "[cli]") {
  const fs::path in = temp_dir() / "oa_resume.jsonl", out = temp_dir() / "oa_resume_out.jsonl";
  std::ofstream(in) << completion_request("a", "one", {{"max_tokens", 2}}).dump() << "\n"
                    << completion_request("b", "two", {{"n", 3}}).dump() << "\n"
                    << completion_request("c", "three", {{"max_tokens", 2}, {"ignore_eos", true}}).dump() << "\n";
  fs::remove(out);
  // An interrupted run left "a" answered, "b"'s error line, and a torn line for "c".
  std::ofstream(out.string() + ".partial")
      << "{\"id\":\"batch_req_1\",\"custom_id\":\"a\",\"response\":{\"status_code\":200,\"body\":{\"kept\":true}},"
         "\"error\":null}\n"
      << "{\"id\":\"batch_req_2\",\"custom_id\":\"b\",\"response\":null,\"error\":{\"code\":\"x\",\"message\":\"y\"}}\n"
      << "{\"id\":\"batch_req_3\",\"custom_id\":\"c\",\"resp";
  const CliResult r = run_strata("run --model " + kModels + "/tiny-opt -i " + in.string() + " -o " + out.string() +
                                 " --device cpu --no-progress");
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("2 of 3 prompts already done"));
  const std::vector<json> lines = read_lines(out);
  REQUIRE(lines.size() == 3);
  CHECK(lines[0]["response"]["body"]["kept"] == true);
  CHECK(lines[1]["custom_id"] == "b");
  CHECK(lines[2]["custom_id"] == "c");
  CHECK(lines[2]["response"]["body"]["usage"]["completion_tokens"] == 2);
  CHECK(lines[2]["response"]["body"]["choices"][0]["finish_reason"] == "length");
}

TEST_CASE("the shards of a job together answer each request exactly once, as the whole job does", "[cli]") {
  const fs::path in = temp_dir() / "shards.jsonl", whole = temp_dir() / "shards_whole.jsonl";
  {
    std::ofstream f(in);
    for (int i = 0; i < 12; ++i)
      f << completion_request("req-" + std::to_string(i), "story " + std::to_string(i),
                              {{"max_tokens", 2}, {"ignore_eos", true}})
               .dump()
        << "\n";
    f << completion_request("bad", "x", {{"n", 0}}).dump() << "\n";
  }
  const std::string base = "run --model " + kModels + "/tiny-opt -i " + in.string() + " --device cpu --no-progress";
  fs::remove(whole);
  CliResult r = run_strata(base + " -o " + whole.string());
  INFO(r.output);
  REQUIRE(r.code == 0);
  const auto want = by_custom_id(read_lines(whole));
  REQUIRE(want.size() == 13);

  std::map<std::string, json> got;
  size_t total = 0;
  for (int k = 0; k < 3; ++k) {
    const fs::path part = temp_dir() / ("shards_" + std::to_string(k) + ".jsonl");
    fs::remove(part);
    r = run_strata(base + " -o " + part.string() + " --shard " + std::to_string(k) + "/3");
    INFO(r.output);
    REQUIRE(r.code == 0);
    CHECK_THAT(r.output, Catch::Contains("shard " + std::to_string(k) + "/3: "));
    const auto lines = read_lines(part);
    total += lines.size();
    for (const json& l : lines) got[l["custom_id"].get<std::string>()] = l;
  }
  CHECK(total == want.size());  // nothing doubled
  REQUIRE(got.size() == want.size());
  for (const auto& [id, w] : want) {
    INFO(id);
    const json& g = got.at(id);
    CHECK(g["id"] == w["id"]);
    CHECK(g["error"] == w["error"]);
    if (w["response"].is_null()) continue;
    CHECK(g["response"]["body"]["choices"] == w["response"]["body"]["choices"]);
    CHECK(g["response"]["body"]["usage"] == w["response"]["body"]["usage"]);
  }
  r = run_strata(base + " -o " + (temp_dir() / "x.jsonl").string() + " --shard 3/3");
  CHECK(r.code != 0);
  CHECK_THAT(r.output, Catch::Contains("--shard must be i/N"));
}

TEST_CASE("an OpenAI chat request renders with SmolLM2's template", "[cli]") {
  const fs::path model = strata::test::require_smollm2_gguf();
  const fs::path in = temp_dir() / "oa_chat.jsonl", out = temp_dir() / "oa_chat_out.jsonl";
  std::ofstream(in) << json{{"custom_id", "q1"},
                            {"method", "POST"},
                            {"url", "/v1/chat/completions"},
                            {"body",
                             {{"model", "smollm2"},
                              {"messages", {{{"role", "user"}, {"content", "What is the capital of France?"}}}},
                              {"max_completion_tokens", 12}}}}
                           .dump()
                    << "\n";
  fs::remove(out);
  const CliResult r = run_strata("run --model " + model.string() + " -i " + in.string() + " -o " + out.string() +
                                 " --device cpu --no-progress");
  INFO(r.output);
  REQUIRE(r.code == 0);
  const std::vector<json> lines = read_lines(out);
  REQUIRE(lines.size() == 1);
  const json& body = lines[0]["response"]["body"];
  CHECK(body["object"] == "chat.completion");
  CHECK(body["choices"][0]["message"]["role"] == "assistant");
  CHECK_THAT(body["choices"][0]["message"]["content"].get<std::string>(), Catch::Contains("Paris"));
  CHECK(body["usage"]["prompt_tokens"] == 37);  // as the strata-format chat test
}

TEST_CASE("OpenAI chat requests render with a Llama 2 or Llama 3 template, as apply_chat_template tokenizes", "[cli]") {
  std::ifstream cases_in(std::string(STRATA_FIXTURES_DIR) + "/chat/chat_cases.json");
  const json ex = json::parse(cases_in);
  for (const auto& [model, name] : {std::pair{"tiny-llama", "llama2"}, std::pair{"tiny-llama3", "llama3"}}) {
    INFO(model << " with the " << name << " template");
    // The tiny model with a tokenizer_config.json holding the template; add_bos_token is set, so
    // a doubled BOS would show in the token count.
    const fs::path dir = temp_dir() / (std::string(model) + "-chat");
    fs::remove_all(dir);
    fs::copy(kModels + "/" + model, dir, fs::copy_options::recursive);
    const json& tpl = ex["templates"][name];
    std::ofstream(dir / "tokenizer_config.json")
        << json{{"chat_template", tpl["source"]}, {"bos_token", tpl["bos_token"]}, {"eos_token", tpl["eos_token"]},
                {"add_bos_token", true}}
               .dump();
    const fs::path in = temp_dir() / "oa_tpl.jsonl", out = temp_dir() / "oa_tpl_out.jsonl";
    std::ofstream requests(in);
    std::vector<std::pair<std::string, size_t>> expected;  // custom_id, prompt tokens
    for (const json& c : ex["token_cases"]) {
      if (c["model"] != model || c["template"] != name) continue;
      const std::string id = "ok" + std::to_string(expected.size());
      expected.emplace_back(id, c["ids"].size());
      requests << json{{"custom_id", id}, {"method", "POST"}, {"url", "/v1/chat/completions"},
                       {"body", {{"messages", c["messages"]}, {"max_completion_tokens", 2}}}}
                      .dump()
               << "\n";
    }
    REQUIRE(expected.size() == 3);
    const json twice_user = {{{"role", "user"}, {"content", "a"}}, {{"role", "user"}, {"content", "b"}}};
    requests << json{{"custom_id", "twice"}, {"method", "POST"}, {"url", "/v1/chat/completions"},
                     {"body", {{"messages", twice_user}, {"max_completion_tokens", 2}}}}
                    .dump()
             << "\n";
    requests.close();
    fs::remove(out);
    const CliResult r = run_strata("run --model " + dir.string() + " -i " + in.string() + " -o " + out.string() +
                                   " --device cpu --no-progress");
    INFO(r.output);
    REQUIRE(r.code == 0);
    const std::map<std::string, json> got = by_custom_id(read_lines(out));
    for (const auto& [id, tokens] : expected) {
      INFO(id);
      REQUIRE(got.count(id));
      if (tokens < 128) {
        CHECK(got.at(id)["response"]["body"]["usage"]["prompt_tokens"] == tokens);
      } else {  // past the tiny models' context of 128: the error names the count
        CHECK(got.at(id)["error"]["code"] == "context_length_exceeded");
        CHECK_THAT(got.at(id)["error"]["message"].get<std::string>(),
                   Catch::Contains("prompt of " + std::to_string(tokens) + " tokens"));
      }
    }
    REQUIRE(got.count("twice"));
    if (std::string(name) == "llama2") {  // Llama 2's template raises on roles that do not alternate
      CHECK(got.at("twice")["error"]["code"] == "invalid_value");
      CHECK_THAT(got.at("twice")["error"]["message"].get<std::string>(),
                 Catch::Contains("chat template refuses these messages: Conversation roles must alternate"));
    } else {
      CHECK(got.at("twice")["error"].is_null());
    }
  }
}

// A copy of a tiny model with `template_source` as its chat_template.jinja and `tokens` added to its
// tokenizer from id 990 (ids its embedding has but its vocabulary does not use), special or not.
static fs::path model_with_chat(const std::string& model, const std::string& template_source,
                                std::initializer_list<const char*> tokens, bool special) {
  const fs::path dir = temp_dir() / (model + "-chat-tokens");
  fs::remove_all(dir);
  fs::copy(kModels + "/" + model, dir, fs::copy_options::recursive);
  json tok;
  {
    std::ifstream in(dir / "tokenizer.json");
    tok = json::parse(in);
  }
  int id = 990;
  for (const char* t : tokens)
    tok["added_tokens"].push_back({{"id", id++}, {"content", t}, {"single_word", false}, {"lstrip", false},
                                   {"rstrip", false}, {"normalized", false}, {"special", special}});
  std::ofstream(dir / "tokenizer.json") << tok.dump();
  std::ofstream(dir / "chat_template.jinja") << template_source;
  return dir;
}

// An OpenAI batch line of a chat request: the messages, three tokens, and `extra` body fields.
static std::string chat_request(const std::string& custom_id, const nlohmann::ordered_json& messages,
                                const nlohmann::ordered_json& extra) {
  nlohmann::ordered_json body = {{"messages", messages}, {"max_completion_tokens", 3}};
  body.update(extra);
  return nlohmann::ordered_json{
             {"custom_id", custom_id}, {"method", "POST"}, {"url", "/v1/chat/completions"}, {"body", body}}
             .dump() +
         "\n";
}

// The model copy's context set to `positions`.
static void set_context(const fs::path& dir, int positions) {
  json config;
  std::ifstream(dir / "config.json") >> config;
  config["max_position_embeddings"] = positions;
  std::ofstream(dir / "config.json") << config.dump();
}

// A harmony fixture text (Jinja2's, rendered on `fixture_today`) with the date the job's
// strftime_now gives instead.
static std::string dated_today(std::string text, const std::string& fixture_today) {
  char today[16];
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::strftime(today, sizeof today, "%Y-%m-%d", &local);
  const std::string fixture_date = "Current date: " + fixture_today;
  const size_t at = text.find(fixture_date);
  REQUIRE(at != std::string::npos);
  return text.replace(at, fixture_date.size(), std::string("Current date: ") + today);
}

TEST_CASE("GPT-OSS chat requests: harmony prompts at the asked reasoning effort, answers with their reasoning",
          "[cli][harmony]") {
  std::ifstream cases_in(std::string(STRATA_FIXTURES_DIR) + "/chat/harmony_cases.json");
  const json ex = json::parse(cases_in);
  // GPT-OSS's template (harmony_cases.json's source) and the harmony special tokens.
  const fs::path dir = model_with_chat("tiny-gpt-oss", ex["source"].get<std::string>(),
                                       {"<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|call|>"},
                                       /*special=*/true);
  const strata::Tokenizer tok = strata::Tokenizer::from_dir(dir);
  auto prompt_tokens = [&](const json& messages, const std::string& effort) -> size_t {
    for (const json& c : ex["cases"])
      if (c["messages"] == messages && c["add_generation_prompt"] == true && c.value("reasoning_effort", "") == effort)
        return tok.encode(dated_today(c["text"].get<std::string>(), ex["today"].get<std::string>())).size();
    FAIL("no case for " << messages.dump() << " at effort '" << effort << "'");
    return 0;
  };
  const json messages = {{{"role", "system"}, {"content", "You are terse."}}, {{"role", "user"}, {"content", "Name a prime."}}};
  auto request = [&](const std::string& id, const json& extra) {
    json body = {{"messages", messages}, {"max_completion_tokens", 6}};
    body.update(extra);
    return json{{"custom_id", id}, {"method", "POST"}, {"url", "/v1/chat/completions"}, {"body", body}}.dump() + "\n";
  };
  const fs::path in = temp_dir() / "harmony.jsonl", out = temp_dir() / "harmony_out.jsonl";
  std::ofstream(in) << request("default", json::object()) << request("high", {{"reasoning_effort", "high"}})
                    << request("extreme", {{"reasoning_effort", "extreme"}});
  for (const std::string flag : {"", " --reasoning-effort low"}) {
    INFO("flag:" << flag);
    fs::remove(out);
    const CliResult r = run_strata("run --model " + dir.string() + " -i " + in.string() + " -o " + out.string() +
                                   " --device cpu --no-progress" + flag);
    INFO(r.output);
    REQUIRE(r.code == 0);
    const std::map<std::string, json> got = by_custom_id(read_lines(out));
    REQUIRE(got.size() == 3);
    const json& body = got.at("default")["response"]["body"];
    CHECK(body["usage"]["prompt_tokens"] == prompt_tokens(messages, flag.empty() ? "" : "low"));
    CHECK(got.at("high")["response"]["body"]["usage"]["prompt_tokens"] == prompt_tokens(messages, "high"));
    const json& message = body["choices"][0]["message"];
    CHECK(message["content"].is_string());
    CHECK(message["reasoning_content"].is_string());
    CHECK(got.at("extreme")["error"]["code"] == "invalid_value");
    CHECK_THAT(got.at("extreme")["error"]["message"].get<std::string>(), Catch::Contains("reasoning_effort"));
  }
  // The strata format: "reasoning" beside "completion"; a bad effort fails the file at its line.
  const fs::path strata_in = temp_dir() / "harmony_strata.jsonl";
  std::ofstream(strata_in) << json{{"id", 1}, {"messages", messages}, {"max_new_tokens", 4}}.dump() << "\n";
  fs::remove(out);
  CliResult r = run_strata("run --model " + dir.string() + " -i " + strata_in.string() + " -o " + out.string() +
                           " --device cpu --no-progress");
  INFO(r.output);
  REQUIRE(r.code == 0);
  const std::vector<json> lines = read_lines(out);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0]["reasoning"].is_string());
  CHECK(lines[0]["prompt_tokens"] == prompt_tokens(messages, ""));
  std::ofstream(strata_in) << json{{"id", 1}, {"messages", messages}, {"reasoning_effort", "max"}}.dump() << "\n";
  r = run_strata("run --model " + dir.string() + " -i " + strata_in.string() + " -o " + out.string() +
                 " --device cpu --no-progress");
  CHECK(r.code != 0);
  CHECK_THAT(r.output, Catch::Contains(strata_in.string() + ":1") && Catch::Contains("reasoning_effort"));
  r = run_strata("run --model " + dir.string() + " -i " + strata_in.string() + " -o " + out.string() +
                 " --device cpu --no-progress --reasoning-effort max");
  CHECK(r.code != 0);
  CHECK_THAT(r.output, Catch::Contains("--reasoning-effort"));
}

TEST_CASE("Qwen3 chat requests: enable_thinking through chat_template_kwargs or --no-thinking, reasoning split off",
          "[cli][reasoning]") {
  std::ifstream cases_in(std::string(STRATA_FIXTURES_DIR) + "/chat/chat_cases.json");
  const json ex = json::parse(cases_in);
  // Qwen3's template, and <think>, </think> added to the tokenizer (not special, as in Qwen3's).
  const fs::path dir = model_with_chat("tiny-qwen3", ex["templates"]["qwen3"]["source"].get<std::string>(),
                                       {"<think>", "</think>"}, /*special=*/false);
  const strata::Tokenizer tok = strata::Tokenizer::from_dir(dir);
  const json messages = {{{"role", "user"}, {"content", "What is the capital of France?"}}};
  auto prompt_tokens = [&](std::optional<bool> thinking) -> size_t {
    for (const json& c : ex["cases"])
      if (c["template"] == "qwen3" && c["messages"] == messages && c["add_generation_prompt"] == true &&
          (thinking ? c.contains("enable_thinking") && c["enable_thinking"] == *thinking : !c.contains("enable_thinking")))
        return tok.encode(c["text"].get<std::string>()).size();
    FAIL("no qwen3 case");
    return 0;
  };
  REQUIRE(prompt_tokens(false) > prompt_tokens(std::nullopt));
  REQUIRE(prompt_tokens(true) == prompt_tokens(std::nullopt));
  auto request = [&](const std::string& custom_id, const json& extra) {
    json body = {{"messages", messages}, {"max_completion_tokens", 4}};
    body.update(extra);
    return json{{"custom_id", custom_id}, {"method", "POST"}, {"url", "/v1/chat/completions"}, {"body", body}}.dump() +
           "\n";
  };
  const fs::path in = temp_dir() / "think.jsonl", out = temp_dir() / "think_out.jsonl";
  std::ofstream(in) << request("default", json::object())
                    << request("off", {{"chat_template_kwargs", {{"enable_thinking", false}}}})
                    << request("on", {{"chat_template_kwargs", {{"enable_thinking", true}}}})
                    << request("unknown", {{"chat_template_kwargs", {{"add_vision_id", true}}}});
  for (const bool no_thinking : {false, true}) {
    fs::remove(out);
    const CliResult r = run_strata("run --model " + dir.string() + " -i " + in.string() + " -o " + out.string() +
                                   " --device cpu --no-progress" + (no_thinking ? " --no-thinking" : ""));
    INFO(r.output);
    REQUIRE(r.code == 0);
    const std::map<std::string, json> got = by_custom_id(read_lines(out));
    auto prompt = [&](const std::string& custom_id) { return got.at(custom_id)["response"]["body"]["usage"]["prompt_tokens"]; };
    CHECK(prompt("default") == prompt_tokens(no_thinking ? std::optional<bool>(false) : std::nullopt));
    CHECK(prompt("off") == prompt_tokens(false));
    CHECK(prompt("on") == prompt_tokens(true));
    // Thinking off (the request's or --no-thinking's): the answer is all content, no reasoning read.
    auto reasons = [&](const std::string& custom_id) {
      return got.at(custom_id)["response"]["body"]["choices"][0]["message"].contains("reasoning_content");
    };
    CHECK(reasons("default") == !no_thinking);
    CHECK(reasons("on"));
    CHECK_FALSE(reasons("off"));
    CHECK(got.at("unknown")["error"]["code"] == "unsupported_value");
    CHECK_THAT(got.at("unknown")["error"]["message"].get<std::string>(),
               Catch::Contains("chat_template_kwargs.add_vision_id"));
  }
}

TEST_CASE("chat requests with tools: Qwen3's prompt lists them as Jinja2 writes it, other templates refuse them",
          "[cli][tools]") {
  std::ifstream cases_in(std::string(STRATA_FIXTURES_DIR) + "/chat/chat_cases.json");
  const nlohmann::ordered_json ex = nlohmann::ordered_json::parse(cases_in);  // tools in their keys' order
  const fs::path qwen3 = model_with_chat("tiny-qwen3", ex["templates"]["qwen3"]["source"].get<std::string>(),
                                         {"<think>", "</think>", "<tool_call>", "</tool_call>"}, /*special=*/false);
  const fs::path chatml = model_with_chat("tiny-llama3", ex["templates"]["chatml"]["source"].get<std::string>(), {},
                                          /*special=*/false);
  set_context(qwen3, 1024);  // to hold the tools' system turn (the tiny model's 128 positions do not)
  const nlohmann::ordered_json messages = {{{"role", "user"}, {"content", "What is the capital of France?"}}};
  const nlohmann::ordered_json* expected = nullptr;  // Jinja2's rendering with the first tool list
  for (const auto& c : ex["cases"])
    if (c["template"] == "qwen3" && c["messages"] == messages && c["add_generation_prompt"] == true &&
        c.contains("tools") && c["tools"][0]["function"]["name"] == "get_weather")
      expected = &c;
  REQUIRE(expected);
  const nlohmann::ordered_json& tools = (*expected)["tools"];
  auto request = [&](const std::string& custom_id, const nlohmann::ordered_json& extra) {
    return chat_request(custom_id, messages, extra);
  };
  const fs::path in = temp_dir() / "tools.jsonl";
  std::ofstream(in) << request("auto", {{"tools", tools}}) << request("none", {{"tools", tools}, {"tool_choice", "none"}})
                    << request("required", {{"tools", tools},
                                            {"tool_choice", "required"},
                                            {"chat_template_kwargs", {{"enable_thinking", false}}},
                                            {"max_completion_tokens", 64}})
                    << request("plain", nlohmann::ordered_json::object())
                    << request("named", {{"tools", tools},
                                         {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}},
                                         {"chat_template_kwargs", {{"enable_thinking", false}}},
                                         {"max_completion_tokens", 48}});
  auto run = [&](const fs::path& model) {
    const fs::path out = temp_dir() / (model.filename().string() + "-tools.jsonl");
    fs::remove(out);
    const CliResult r = run_strata("run --model " + model.string() + " -i " + in.string() + " -o " + out.string() +
                                   " --device cpu --no-progress");
    INFO(r.output);
    REQUIRE(r.code == 0);
    CHECK_THAT(r.output, !Catch::Contains("ignoring unknown field"));
    return by_custom_id(read_lines(out));
  };
  const strata::Tokenizer tok = strata::Tokenizer::from_dir(qwen3);
  const size_t with_tools = tok.encode((*expected)["text"].get<std::string>()).size();
  auto got = run(qwen3);
  auto usage = [&](const char* id) { return got.at(id)["response"]["body"]["usage"]["prompt_tokens"].get<size_t>(); };
  CHECK(usage("auto") == with_tools);
  CHECK(usage("none") == with_tools);  // "none" shows the tools, as vLLM does
  CHECK(usage("plain") < with_tools);
  // "required": the answer, held to a non-empty array of calls, is those calls; cut by the limit,
  // what there is opens that array.
  const json& required = got.at("required")["response"]["body"]["choices"][0];
  INFO(required.dump());
  if (required["finish_reason"] == "stop") {
    REQUIRE(required["message"]["tool_calls"].size() >= 1);
    CHECK(required["message"]["content"].is_null());
    for (const json& call : required["message"]["tool_calls"]) {
      const std::string name = call["function"]["name"];
      CHECK(std::any_of(tools.begin(), tools.end(), [&](const auto& t) { return t["function"]["name"] == name; }));
      CHECK(json::parse(call["function"]["arguments"].get<std::string>()).is_object());
    }
  } else {
    CHECK(required["finish_reason"] == "length");
    CHECK_FALSE(required["message"].contains("tool_calls"));
    std::string text = required["message"]["content"];
    std::erase_if(text, [](char ch) { return ch == ' ' || ch == '\n' || ch == '\t' || ch == '\r'; });
    const std::string opening = "[{\"name\":\"";
    CHECK(text.substr(0, std::min(text.size(), opening.size())) == opening.substr(0, std::min(text.size(), opening.size())));
  }
  // A named function: the answer, held to its parameters' schema, is the call's arguments.
  const json& named = got.at("named")["response"]["body"]["choices"][0];
  INFO(named.dump());
  REQUIRE(named["message"]["tool_calls"].size() == 1);
  CHECK(named["message"]["tool_calls"][0]["function"]["name"] == "get_weather");
  CHECK(named["message"]["content"].is_null());
  std::string arguments = named["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>();
  if (named["finish_reason"] == "stop") {
    const json args = json::parse(arguments);
    CHECK(args["city"].is_string());  // required by the schema
  } else {
    // Cut by the limit: what there is agrees with the schema's first property (JSON's whitespace aside).
    std::erase_if(arguments, [](char ch) { return ch == ' ' || ch == '\n' || ch == '\t' || ch == '\r'; });
    const std::string first = "{\"city\":\"";
    const size_t n = std::min(arguments.size(), first.size());
    CHECK(arguments.substr(0, n) == first.substr(0, n));
  }
  // A template Strata writes no tools into: the request is refused, not answered without its tools.
  got = run(chatml);
  CHECK(got.at("auto")["error"]["code"] == "unsupported_value");
  CHECK_THAT(got.at("auto")["error"]["message"].get<std::string>(),
             Catch::Contains("body.tools") && Catch::Contains("does not write tool definitions"));
  CHECK(got.at("plain")["error"].is_null());
}

TEST_CASE("chat requests with a template of no known family: rendered as Jinja2 renders it, reasoning and tools read",
          "[cli][jinja]") {
  std::ifstream cases_in(std::string(STRATA_FIXTURES_DIR) + "/chat/chat_cases.json");
  const nlohmann::ordered_json ex = nlohmann::ordered_json::parse(cases_in);
  // QwQ's style: the generation prompt opens <think>, tools are written and called in <tool_call>.
  const fs::path dir = model_with_chat("tiny-qwen3", ex["templates"]["qwq-style"]["source"].get<std::string>(),
                                       {"<think>", "</think>", "<tool_call>", "</tool_call>"}, /*special=*/false);
  set_context(dir, 1024);  // to hold the tools' system turn
  const nlohmann::ordered_json messages = {{{"role", "user"}, {"content", "What is the capital of France?"}}};
  auto expected = [&](bool with_tools) -> const nlohmann::ordered_json& {
    for (const auto& c : ex["cases"])
      if (c["template"] == "qwq-style" && c["messages"] == messages && c["add_generation_prompt"] == true &&
          c.contains("tools") == with_tools && (!with_tools || c["tools"][0]["function"]["name"] == "get_weather"))
        return c;
    FAIL("no qwq-style case");
    return ex;
  };
  const nlohmann::ordered_json& tools = expected(true)["tools"];
  auto request = [&](const std::string& custom_id, const nlohmann::ordered_json& extra) {
    return chat_request(custom_id, messages, extra);
  };
  const fs::path in = temp_dir() / "interpreted.jsonl", out = temp_dir() / "interpreted_out.jsonl";
  // </think> (id 991, model_with_chat) barred from "plain", so that its answer stays in the reasoning.
  // A keyword argument the template does not read changes nothing (vLLM passes it on too).
  std::ofstream(in) << request("plain", {{"logit_bias", {{"991", -100}}}, {"chat_template_kwargs", {{"thinking", true}}}})
                    << request("tools", {{"tools", tools}});
  fs::remove(out);
  const CliResult r = run_strata("run --model " + dir.string() + " -i " + in.string() + " -o " + out.string() +
                                 " --device cpu --no-progress");
  INFO(r.output);
  REQUIRE(r.code == 0);
  const auto got = by_custom_id(read_lines(out));
  const strata::Tokenizer tok = strata::Tokenizer::from_dir(dir);
  auto body = [&](const char* id) { return got.at(id)["response"]["body"]; };
  CHECK(body("plain")["usage"]["prompt_tokens"] == tok.encode(expected(false)["text"].get<std::string>()).size());
  CHECK(body("tools")["usage"]["prompt_tokens"] == tok.encode(expected(true)["text"].get<std::string>()).size());
  // The prompt opened the reasoning: three tokens that do not close it are all reasoning.
  REQUIRE(tok.token_id("</think>") == 991);
  const json message = body("plain")["choices"][0]["message"];
  INFO(message.dump());
  CHECK_FALSE(message["reasoning_content"].get<std::string>().empty());
  CHECK((message["content"].is_null() || message["content"] == ""));
}

TEST_CASE("a template file given by --chat-template renders messages instead of the model's", "[cli][jinja]") {
  std::ifstream cases_in(std::string(STRATA_FIXTURES_DIR) + "/chat/chat_cases.json");
  const nlohmann::ordered_json ex = nlohmann::ordered_json::parse(cases_in);
  const nlohmann::ordered_json messages = {{{"role", "system"}, {"content", "You are terse."}},
                                           {{"role", "user"}, {"content", "Name a prime."}}};
  std::string expected;  // Jinja2's text of Phi-4's style (bos and eos tokens unused)
  for (const auto& c : ex["cases"])
    if (c["template"] == "phi4-style" && c["messages"] == messages && c["add_generation_prompt"] == true)
      expected = c["text"].get<std::string>();
  REQUIRE_FALSE(expected.empty());
  const fs::path tpl = temp_dir() / "phi4.jinja";
  std::ofstream(tpl) << ex["templates"]["phi4-style"]["source"].get<std::string>();
  const std::string model = kModels + "/tiny-qwen3";
  // strata tokenize renders with it ...
  CliResult r = run_strata("tokenize --model " + model + " --render --chat-template " + tpl.string() +
                           " --messages '" + json(messages).dump() + "'");
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK(r.output == expected);
  // ... and so does a job: the prompt is that text's tokens.
  const fs::path in = temp_dir() / "chat_template_flag.jsonl", out = temp_dir() / "chat_template_flag_out.jsonl";
  std::ofstream(in) << json{{"id", 1}, {"messages", messages}, {"max_new_tokens", 2}}.dump() << "\n";
  fs::remove(out);
  r = run_strata("run --model " + model + " -i " + in.string() + " -o " + out.string() +
                 " --device cpu --no-progress --chat-template " + tpl.string());
  INFO(r.output);
  REQUIRE(r.code == 0);
  const std::vector<json> lines = read_lines(out);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0]["prompt_tokens"] == strata::Tokenizer::from_dir(model).encode(expected).size());
  // A file that holds no template, or a template Jinja cannot compile, fails the job naming it.
  const fs::path empty = temp_dir() / "empty.jinja";
  std::ofstream(empty) << "\n  \n";
  r = run_strata("run --model " + model + " -i " + in.string() + " -o " + out.string() +
                 " --device cpu --no-progress --chat-template " + empty.string());
  CHECK(r.code != 0);
  CHECK_THAT(r.output, Catch::Contains(empty.string() + ": the chat template is empty"));
  const fs::path broken = temp_dir() / "broken.jinja";
  std::ofstream(broken) << "{% for m in messages %}\n{{ m.content }}";
  r = run_strata("run --model " + model + " -i " + in.string() + " -o " + out.string() +
                 " --device cpu --no-progress --chat-template " + broken.string());
  CHECK(r.code != 0);
  CHECK_THAT(r.output, Catch::Contains("chat template: line 2"));
}

TEST_CASE("an edited GPT-OSS template is interpreted and its answers still read as harmony channels",
          "[cli][harmony][jinja]") {
  std::ifstream cases_in(std::string(STRATA_FIXTURES_DIR) + "/chat/harmony_cases.json");
  const json ex = json::parse(cases_in);
  std::string source = ex["source"].get<std::string>();
  const std::string cutoff = "Knowledge cutoff: 2024-06", edited_cutoff = "Knowledge cutoff: 2025-01";
  REQUIRE(source.find(cutoff) != std::string::npos);
  source.replace(source.find(cutoff), cutoff.size(), edited_cutoff);
  REQUIRE(strata::ChatTemplate::parse(source).format() == strata::ChatFormat::Jinja);
  const fs::path dir = model_with_chat("tiny-gpt-oss", source,
                                       {"<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|call|>"},
                                       /*special=*/true);
  const json messages = {{{"role", "system"}, {"content", "You are terse."}}, {{"role", "user"}, {"content", "Name a prime."}}};
  // Jinja2's text for the original template, with the edited line and today's date.
  std::string expected;
  for (const json& c : ex["cases"])
    if (c["messages"] == messages && c["add_generation_prompt"] == true && !c.contains("reasoning_effort"))
      expected = c["text"].get<std::string>();
  REQUIRE_FALSE(expected.empty());
  expected.replace(expected.find(cutoff), cutoff.size(), edited_cutoff);
  expected = dated_today(expected, ex["today"].get<std::string>());

  const fs::path in = temp_dir() / "harmony_edited.jsonl", out = temp_dir() / "harmony_edited_out.jsonl";
  std::ofstream(in) << chat_request("a", messages, {{"max_completion_tokens", 6}});
  fs::remove(out);
  const CliResult r = run_strata("run --model " + dir.string() + " -i " + in.string() + " -o " + out.string() +
                                 " --device cpu --no-progress --tool-call-parser none");
  INFO(r.output);
  REQUIRE(r.code == 0);
  const std::vector<json> lines = read_lines(out);
  REQUIRE(lines.size() == 1);
  const json& body = lines[0]["response"]["body"];
  CHECK(body["usage"]["prompt_tokens"] == strata::Tokenizer::from_dir(dir).encode(expected).size());
  CHECK(body["choices"][0]["message"]["reasoning_content"].is_string());  // split by channel
  // vLLM's parser names only.
  const CliResult bad = run_strata("run --model " + dir.string() + " -i " + in.string() + " -o " + out.string() +
                                   " --device cpu --no-progress --tool-call-parser mistral");
  CHECK(bad.code != 0);
  CHECK_THAT(bad.output, Catch::Contains("--tool-call-parser"));
}
