// `strata run` and `strata tokenize` as a user runs them: the real binary, real files.
#include "required_files.h"
#include "test_paths.h"
#include "temp_files.h"
#include <catch2/catch.hpp>
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "cli_support.h"
#include <sys/wait.h>
#include <unistd.h>

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

using Result = strata::test::CliResult;
using strata::test::run_shell;
using strata::test::run_strata;

fs::path temp_dir() { return strata::test::temp_dir("cli"); }

const std::string kModels = std::string(STRATA_FIXTURES_DIR) + "/models";

}  // namespace

TEST_CASE("strata run writes Hugging Face's greedy completions for a JSONL file", "[cli]") {
  std::ifstream fin(kModels + "/tiny-llama-cli.json");
  const json fx = json::parse(fin);
  const fs::path prompts = temp_dir() / "prompts.jsonl", out = temp_dir() / "out.jsonl";
  {
    std::ofstream f(prompts);
    for (const json& c : fx["cases"]) f << json{{"id", c["id"]}, {"prompt", c["prompt"]}}.dump() << "\n";
  }
  fs::remove(out);
  const Result r = run_strata("run --model " + kModels + "/tiny-llama --prompts " + prompts.string() + " --out " +
                              out.string() + " --device cpu --batch-size 2 --max-new-tokens 16");
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("prompts: 3"));
  CHECK_THAT(r.output, Catch::Contains("tok/s"));
  // Answers come in completion order (length-aware blocks): match them to the cases by id.
  std::map<std::string, json> cases;
  for (const json& c : fx["cases"]) cases[c["id"].dump()] = c;
  std::ifstream in(out);
  std::string line;
  size_t i = 0;
  while (std::getline(in, line)) {
    const json got = json::parse(line);
    REQUIRE(cases.count(got["id"].dump()) == 1);
    const json want = cases[got["id"].dump()];
    ++i;
    CHECK(got["tokens"] == want["greedy"]);
    CHECK(got["completion"] == want["completion"]);
    CHECK(got["prompt_tokens"] == want["prompt_ids"].size());
    CHECK(got["completion_tokens"] == want["greedy"].size());
    const bool eos = want["greedy"].back() == fx["eos"];
    CHECK(got["finish_reason"] == (eos ? "eos" : "length"));
  }
  CHECK(i == fx["cases"].size());
  CHECK_FALSE(fs::exists(out.string() + ".partial"));
}

TEST_CASE("strata run takes the model's recommended sampling settings where no flag or line gives one", "[cli]") {
  std::ifstream fin(kModels + "/tiny-llama-cli.json");
  const json fx = json::parse(fin);
  const fs::path model = temp_dir() / "recommending-llama";
  fs::remove_all(model);
  fs::copy(kModels + "/tiny-llama", model);
  std::ofstream(model / "generation_config.json")
      << R"({"do_sample": true, "temperature": 0.8, "top_k": 20, "max_new_tokens": 6, "eos_token_id": 2})";
  // Line "sampled" gives no sampling field; line "greedy" asks for temperature 0.
  const json& c = fx["cases"][0];
  const fs::path prompts = temp_dir() / "recommended.jsonl";
  std::ofstream(prompts) << json{{"id", "sampled"}, {"prompt", c["prompt"]}}.dump() << "\n"
                         << json{{"id", "greedy"}, {"prompt", c["prompt"]}, {"temperature", 0}}.dump() << "\n";
  auto run = [&](const std::string& name, const std::string& flags) {
    const fs::path out = temp_dir() / (name + ".jsonl");
    fs::remove(out);
    const Result r = run_strata("run --model " + model.string() + " --prompts " + prompts.string() + " --out " +
                                out.string() + " --device cpu --ordered " + flags);
    INFO(r.output);
    REQUIRE(r.code == 0);
    std::map<std::string, json> tokens;
    std::ifstream in(out);
    for (std::string line; std::getline(in, line);) {
      const json j = json::parse(line);
      tokens[j["id"].get<std::string>()] = j["tokens"];
    }
    return std::make_pair(r.output, tokens);
  };
  // transformers' greedy answer, cut at the recommended 6 tokens.
  const std::vector<int> greedy_16 = c["greedy"].get<std::vector<int>>();
  const json greedy(std::vector<int>(greedy_16.begin(), greedy_16.begin() + std::min<size_t>(6, greedy_16.size())));

  const auto [log, taken] = run("taken", "");
  CHECK_THAT(log, Catch::Contains("sampling defaults from " + (model / "generation_config.json").string() +
                                  ": temperature 0.8, top_k 20, max_new_tokens 6"));
  CHECK(taken.at("greedy") == greedy);  // the line's temperature wins, the length is the model's
  CHECK(taken.at("sampled").size() == 6);
  REQUIRE(taken.at("sampled") != greedy);  // the recommended temperature changed the answer
  // The same settings given as flags, the model's ignored: the same answers.
  const auto [log_none, flags] = run("flags", "--generation-config none --temperature 0.8 --top-k 20 --max-new-tokens 6");
  CHECK_THAT(log_none, !Catch::Contains("sampling defaults from"));
  CHECK(flags == taken);
  // A flag given replaces the model's setting; the others are still taken.
  const auto [log_flag, greedy_flag] = run("flag", "--temperature 0");
  CHECK_THAT(log_flag, Catch::Contains("top_k 20, max_new_tokens 6") && !Catch::Contains("temperature 0.8"));
  CHECK(greedy_flag.at("sampled") == greedy);
  const Result bad = run_strata("run --model " + model.string() + " --prompts " + prompts.string() + " --out " +
                                (temp_dir() / "bad.jsonl").string() + " --device cpu --generation-config vllm");
  CHECK(bad.code != 0);
  CHECK_THAT(bad.output, Catch::Contains("--generation-config") && Catch::Contains("auto,none"));
}

TEST_CASE("strata run on a LLaMA-2-shaped model directory: BOS, chat template, byte fallback as transformers", "[cli]") {
  // tiny-llama2: the SentencePiece-style tokenizer.json with LLaMA-2's post-processor and chat
  // template (tests/fixtures/models/make_llama2_fixture.py). Text prompts get <s> from
  // tokenizer_config's add_bos_token; chat requests get the template's own <s>; completions are
  // decoded as tokenizer.decode(skip_special_tokens=True), byte-fallback U+FFFD included.
  std::ifstream fin(kModels + "/tiny-llama2-cli.json");
  const json fx = json::parse(fin);
  const fs::path prompts = temp_dir() / "llama2.jsonl", out = temp_dir() / "llama2_out.jsonl";
  {
    std::ofstream f(prompts);
    for (const json& c : fx["cases"]) {
      json line{{"id", c["id"]}, {"max_new_tokens", fx["max_new_tokens"]}};
      if (c.contains("messages")) line["messages"] = c["messages"];
      else line["prompt"] = c["prompt"];
      f << line.dump() << "\n";
    }
  }
  fs::remove(out);
  const Result r = run_strata("run --model " + kModels + "/tiny-llama2 --prompts " + prompts.string() + " --out " +
                              out.string() + " --device cpu");
  INFO(r.output);
  REQUIRE(r.code == 0);
  std::map<std::string, json> cases;
  for (const json& c : fx["cases"]) cases[c["id"].get<std::string>()] = c;
  std::ifstream in(out);
  std::string line;
  size_t n = 0;
  while (std::getline(in, line)) {
    const json got = json::parse(line);
    REQUIRE(cases.count(got["id"].get<std::string>()) == 1);
    const json& want = cases[got["id"].get<std::string>()];
    INFO(want["id"]);
    CHECK(got["prompt_tokens"] == want["prompt_ids"].size());
    CHECK(got["tokens"] == want["greedy"]);
    CHECK(got["completion"] == want["completion"]);
    ++n;
  }
  CHECK(n == fx["cases"].size());
  // The prompt ids themselves, through `strata tokenize` (which adds no BOS, as encode()).
  const json& first = fx["cases"][0];
  const Result t = run_strata("tokenize --model " + kModels + "/tiny-llama2 --text '" +
                              first["prompt"].get<std::string>() + "'");
  json want_ids = first["prompt_ids"];
  want_ids.erase(want_ids.begin());
  CHECK(json::parse(t.output) == want_ids);
}

TEST_CASE("strata run rejects bad input before writing anything", "[cli]") {
  const fs::path prompts = temp_dir() / "bad.jsonl", out = temp_dir() / "bad_out.jsonl";
  std::ofstream(prompts) << "{\"id\": 1, \"prompt\": \"fine\"}\n{\"id\": 2, \"prompt\": [\"not a string\"]}\n";
  fs::remove(out);
  Result r = run_strata("run --model " + kModels + "/tiny-opt --prompts " + prompts.string() + " --out " + out.string() +
                        " --device cpu");
  CHECK(r.code != 0);
  CHECK_THAT(r.output, Catch::Contains("bad.jsonl:2: field 'prompt' must be a string"));
  CHECK_FALSE(fs::exists(out));
  CHECK_FALSE(fs::exists(out.string() + ".partial"));

  r = run_strata("run --model /nonexistent/model --prompts " + prompts.string() + " --out " + out.string());
  CHECK(r.code != 0);
  CHECK_THAT(r.output, Catch::Contains("model '/nonexistent/model' not found"));

  r = run_strata("run --model dummy:opt-9b --prompts " + prompts.string() + " --out " + out.string());
  CHECK(r.code != 0);
  CHECK_THAT(r.output, Catch::Contains("unknown preset 'opt-9b'"));

  // A logit bias on a token the model does not have, and penalties out of range on the command line.
  std::ofstream(prompts) << "{\"id\": 1, \"prompt\": \"fine\"}\n{\"id\": 2, \"prompt\": \"x\", \"logit_bias\": "
                            "{\"4000\": 1}}\n";
  r = run_strata("run --model " + kModels + "/tiny-opt --prompts " + prompts.string() + " --out " + out.string() +
                 " --device cpu");
  CHECK(r.code != 0);
  CHECK_THAT(r.output, Catch::Contains("bad.jsonl:2: logit_bias token 4000 is outside the model's vocabulary of 1000"));
  CHECK_FALSE(fs::exists(out));
  CHECK_FALSE(fs::exists(out.string() + ".partial"));
  for (const char* flag :
       {"--repetition-penalty 0", "--frequency-penalty 3", "--presence-penalty -2.5", "--min-p 2", "--min-tokens -1"}) {
    r = run_strata("run --model " + kModels + "/tiny-opt --prompts " + prompts.string() + " --out " + out.string() +
                   " --device cpu " + flag);
    INFO(flag << ": " << r.output);
    CHECK(r.code != 0);
    CHECK_THAT(r.output, Catch::Contains(std::string(flag).substr(0, std::string(flag).find(' '))));
  }
}

TEST_CASE("strata run --response-format json_object holds answers to one JSON document", "[cli][json]") {
  const fs::path prompts = temp_dir() / "json.jsonl";
  std::ofstream(prompts) << "{\"id\": 1, \"prompt\": \"Reply in JSON.\", \"max_new_tokens\": 40}\n"
                            "{\"id\": 2, \"prompt\": \"Free text.\", \"max_new_tokens\": 12, "
                            "\"response_format\": {\"type\": \"text\"}}\n"
                            "{\"id\": 3, \"prompt\": \"Hello\", \"max_new_tokens\": 40, \"temperature\": 0.8, \"seed\": 5}\n";
  auto answers = [&](const std::string& flags) {
    const fs::path out = temp_dir() / "json_out.jsonl";
    fs::remove(out);
    const Result r = run_strata("run --model " + kModels + "/tiny-llama --prompts " + prompts.string() + " --out " +
                                out.string() + " --device cpu --ordered" + flags);
    INFO(r.output);
    REQUIRE(r.code == 0);
    std::vector<json> lines;
    std::ifstream in(out);
    for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));
    REQUIRE(lines.size() == 3);
    return lines;
  };
  const std::vector<json> held = answers(" --response-format json_object"), free = answers("");
  CHECK(held[1] == free[1]);  // the line that asks for text
  for (int i : {0, 2}) {
    INFO(held[size_t(i)].dump());
    const std::string text = held[size_t(i)]["completion"];
    REQUIRE_FALSE(text.empty());
    CHECK((text[0] == '{' || text[0] == '['));
    CHECK(held[size_t(i)]["tokens"] != free[size_t(i)]["tokens"]);
    if (held[size_t(i)]["finish_reason"] == "stop") CHECK(json::accept(text));
    else CHECK(held[size_t(i)]["completion_tokens"] == 40);
  }
  const Result bad = run_strata("run --model " + kModels + "/tiny-llama --prompts " + prompts.string() + " --out " +
                                (temp_dir() / "json_bad.jsonl").string() + " --device cpu --response-format xml");
  CHECK(bad.code != 0);
  CHECK_THAT(bad.output, Catch::Contains("--response-format"));
}

TEST_CASE("strata run --json-schema holds the lines without a response_format to the schema", "[cli][json]") {
  const fs::path prompts = temp_dir() / "schema.jsonl", schema = temp_dir() / "schema.json",
                 out = temp_dir() / "schema_out.jsonl";
  std::ofstream(prompts) << "{\"id\": 1, \"prompt\": \"Who?\", \"max_new_tokens\": 24}\n"
                            "{\"id\": 2, \"prompt\": \"Free text.\", \"max_new_tokens\": 12, "
                            "\"response_format\": {\"type\": \"text\"}}\n";
  // "zeta" first, though it sorts last: the answer must open with it.
  std::ofstream(schema) << R"({"type": "object",
                               "properties": {"zeta": {"type": "string"}, "alpha": {"type": "integer"}},
                               "required": ["zeta", "alpha"]})";
  fs::remove(out);
  Result r = run_strata("run --model " + kModels + "/tiny-llama --prompts " + prompts.string() + " --out " +
                        out.string() + " --device cpu --ordered --json-schema " + schema.string());
  INFO(r.output);
  REQUIRE(r.code == 0);
  std::ifstream in(out);
  std::string line;
  REQUIRE(std::getline(in, line));
  const std::string text = json::parse(line)["completion"];
  const size_t key = text.find_first_not_of(" \n\r\t", 1);
  REQUIRE(key != std::string::npos);
  CHECK(text[0] == '{');
  CHECK(text.compare(key, 6, "\"zeta\"") == 0);
  REQUIRE(std::getline(in, line));
  CHECK(json::parse(line)["completion"].get<std::string>().rfind("{", 0) != 0);  // text, unheld

  std::ofstream(schema) << R"({"type": "object", "properties": {"a": {"type": "string", "format": "date"}}})";
  r = run_strata("run --model " + kModels + "/tiny-llama --prompts " + prompts.string() + " --out " + out.string() +
                 " --device cpu --json-schema " + schema.string());
  CHECK(r.code != 0);
  CHECK_THAT(r.output, Catch::Contains(schema.string() + ": keyword 'format' at #/properties/a is not supported"));
  r = run_strata("run --model " + kModels + "/tiny-llama --prompts " + prompts.string() + " --out " + out.string() +
                 " --device cpu --json-schema " + schema.string() + " --response-format json_object");
  CHECK(r.code != 0);
  CHECK_THAT(r.output, Catch::Contains("give --json-schema or --response-format json_object, not both"));
}

TEST_CASE("strata run answers a batch file whose every request is refused with its error lines", "[cli][job]") {
  // A schema with a keyword Strata does not enforce is well-formed but unserved: the job has
  // nothing to generate and still finishes its output.
  const fs::path prompts = temp_dir() / "refused.jsonl", out = temp_dir() / "refused_out.jsonl";
  std::ofstream(prompts) << "{\"custom_id\": \"a\", \"method\": \"POST\", \"url\": \"/v1/chat/completions\", "
                            "\"body\": {\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
                            "\"response_format\": "
                            "{\"type\": \"json_schema\", \"json_schema\": {\"schema\": {\"type\": \"object\", "
                            "\"properties\": {\"a\": {\"type\": \"string\", \"pattern\": \"x\"}}}}}}}\n";
  fs::remove(out);
  for (const char* flags : {"", " --no-refill"}) {
    const Result r = run_strata("run --model " + kModels + "/tiny-llama --prompts " + prompts.string() + " --out " +
                                out.string() + " --device cpu" + flags);
    INFO(flags << ": " << r.output);
    REQUIRE(r.code == 0);
    std::ifstream in(out);
    std::string line;
    REQUIRE(std::getline(in, line));
    CHECK(json::parse(line)["error"]["code"] == "unsupported_value");
    CHECK_FALSE(std::getline(in, line));
    fs::remove(out);
  }
}

TEST_CASE("strata run with a truncated weights file fails naming the file", "[cli]") {
  const fs::path dir = temp_dir() / "truncated-model";
  fs::create_directories(dir);
  for (const char* f : {"config.json", "tokenizer.json"}) fs::copy_file(kModels + "/tiny-opt/" + f, dir / f, fs::copy_options::overwrite_existing);
  fs::copy_file(kModels + "/tiny-opt/model.safetensors", dir / "model.safetensors", fs::copy_options::overwrite_existing);
  fs::resize_file(dir / "model.safetensors", fs::file_size(dir / "model.safetensors") / 2);
  const fs::path prompts = temp_dir() / "one.jsonl", out = temp_dir() / "trunc_out.jsonl";
  std::ofstream(prompts) << "{\"id\": 1, \"prompt\": \"hi\"}\n";
  const Result r = run_strata("run --model " + dir.string() + " --prompts " + prompts.string() + " --out " + out.string() +
                              " --device cpu");
  CHECK(r.code != 0);
  CHECK_THAT(r.output, Catch::Contains("model.safetensors"));
  CHECK_FALSE(fs::exists(out));
  CHECK_FALSE(fs::exists(out.string() + ".partial"));
}

TEST_CASE("strata run on a dummy preset needs no files", "[cli]") {
  const fs::path prompts = temp_dir() / "dummy.jsonl", out = temp_dir() / "dummy_out.jsonl";
  std::ofstream(prompts) << "{\"id\": \"a\", \"prompt\": \"hello\", \"max_new_tokens\": 3, \"ignore_eos\": true}\n";
  const Result r = run_strata("run --model dummy:opt-125m --prompts " + prompts.string() + " --out " + out.string() +
                              " --device cpu");
  INFO(r.output);
  REQUIRE(r.code == 0);
  std::ifstream in(out);
  std::string line;
  REQUIRE(std::getline(in, line));
  CHECK(json::parse(line)["completion_tokens"] == 3);
}

TEST_CASE("strata tokenize prints Hugging Face's ids and decodes them back", "[cli]") {
  const std::string dir = std::string(STRATA_FIXTURES_DIR) + "/tokenizer/gpt2";
  // GPT-2 ids from Hugging Face tokenizers for "Hello world!".
  Result r = run_strata("tokenize --model " + dir + " --text 'Hello world!'");
  CHECK(r.code == 0);
  CHECK(r.output == "[15496,995,0]\n");
  r = run_strata("tokenize --model " + dir + " --decode '[15496,995,0]'");
  CHECK(r.code == 0);
  CHECK(r.output == "Hello world!\n");
  r = run_strata("tokenize --model " + dir + " --decode '[1, \"x\"]'");
  CHECK(r.code != 0);
}

TEST_CASE("chat messages need a chat template, with SmolLM2 they render as ChatML", "[cli]") {
  const fs::path prompts = temp_dir() / "chat.jsonl", out = temp_dir() / "chat_out.jsonl";
  std::ofstream(prompts) << "{\"id\": 1, \"messages\": [{\"role\": \"user\", \"content\": \"What is the capital of "
                            "France?\"}], \"max_new_tokens\": 12}\n";
  Result r = run_strata("run --model " + kModels + "/tiny-llama --prompts " + prompts.string() + " --out " +
                        out.string() + " --device cpu");
  CHECK(r.code != 0);
  CHECK_THAT(r.output, Catch::Contains("chat.jsonl:1: 'messages' given, but the model has no chat template"));

  const fs::path model = strata::test::require_smollm2_gguf();
  r = run_strata("run --prompts " + prompts.string() + " --out " + out.string() + " --device cpu --no-progress");
  INFO(r.output);
  REQUIRE(r.code == 0);
  std::ifstream in(out);
  std::string line;
  REQUIRE(std::getline(in, line));
  const json got = json::parse(line);
  // The rendered prompt: SmolLM2's default system message, then the user turn (37 tokens by HF's
  // tokenizer on transformers' apply_chat_template output; tests/fixtures/gguf/smollm2_hf.json).
  CHECK(got["prompt_tokens"] == 37);
  CHECK_THAT(got["completion"].get<std::string>(), Catch::Contains("Paris"));
}

TEST_CASE("strata tokenize --messages prints apply_chat_template's ids and text", "[cli][chat]") {
  std::ifstream cases_in(std::string(STRATA_FIXTURES_DIR) + "/chat/chat_cases.json");
  const json ex = json::parse(cases_in);
  const json& tpl = ex["templates"]["llama2"];
  // A bare tokenizer directory (no config.json) and a model directory, each with the template in
  // tokenizer_config.json: the first takes bos_token / eos_token from it. A third, bare, holds
  // LLaMA-2's SentencePiece-style tokenizer shape.
  const fs::path bare = temp_dir() / "tok-llama2", model = temp_dir() / "model-llama2",
                 sentencepiece = temp_dir() / "tok-sp-llama2";
  for (const fs::path& dir : {bare, model, sentencepiece}) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    for (const char* f : {"tokenizer.json", "config.json", "model-00001-of-00004.safetensors",
                          "model-00002-of-00004.safetensors", "model-00003-of-00004.safetensors",
                          "model-00004-of-00004.safetensors", "model.safetensors.index.json"})
      if (dir == model || (dir == bare && std::string(f) == "tokenizer.json"))
        fs::copy(kModels + "/tiny-llama/" + f, dir / f);
    if (dir == sentencepiece)
      fs::copy(std::string(STRATA_FIXTURES_DIR) + "/tokenizer/sp-normalizer/tokenizer.json", dir / "tokenizer.json");
    json config = {{"chat_template", tpl["source"]}, {"add_bos_token", true}};
    if (dir != model) config.update({{"bos_token", tpl["bos_token"]}, {"eos_token", {{"content", tpl["eos_token"]}}}});
    std::ofstream(dir / "tokenizer_config.json") << config.dump();
  }
  auto quoted = [](const json& j) {  // for the shell: '...' with each ' written '\''
    std::string q = "'";
    for (char ch : j.dump()) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    return q + "'";
  };
  int checked = 0;
  for (const json& c : ex["token_cases"]) {
    if (c["template"] != "llama2") continue;
    const std::vector<fs::path> dirs = c["model"] == "tiny-llama" ? std::vector{bare, model} : std::vector{sentencepiece};
    if (c["model"] != "tiny-llama" && c["model"] != "sp-normalizer") continue;
    for (const fs::path& dir : dirs) {
      INFO(dir << " " << c["messages"].dump());
      const Result r = run_strata("tokenize --model " + dir.string() + " --messages " + quoted(c["messages"]));
      CHECK(r.code == 0);
      CHECK(r.output == c["ids"].dump() + "\n");
      ++checked;
    }
  }
  CHECK(checked == 9);
  for (const json& c : ex["cases"]) {
    if (c["template"] != "llama2" || !c.contains("text") || c["add_generation_prompt"]) continue;
    const Result r = run_strata("tokenize --model " + model.string() + " --render --no-generation-prompt --messages " +
                                quoted(c["messages"]));
    CHECK(r.code == 0);
    CHECK(r.output == c["text"].get<std::string>());
  }
  Result r = run_strata("tokenize --model " + model.string() + " --messages '[{\"role\": \"user\", \"content\": " +
                        "\"a\"}, {\"role\": \"user\", \"content\": \"b\"}]'");
  CHECK(r.code != 0);
  CHECK_THAT(r.output, Catch::Contains("Conversation roles must alternate"));
  r = run_strata("tokenize --model " + model.string() + " --messages '[{\"role\": 1}]'");
  CHECK(r.code != 0);
  CHECK_THAT(r.output, Catch::Contains("--messages[0].role must be a string"));
  // The same reader as a batch job's "messages": a content that is not a string is refused alike.
  r = run_strata("tokenize --model " + model.string() + " --messages '[{\"role\": \"user\", \"content\": 5}]'");
  CHECK(r.code != 0);
  CHECK_THAT(r.output, Catch::Contains("--messages[0].content must be a string"));
  r = run_strata("tokenize --model " + model.string() + " --messages '[]'");
  CHECK_THAT(r.output, Catch::Contains("--messages must be a non-empty array"));
  // Checked before the model is opened: a path that is no model still gets the messages' error.
  r = run_strata("tokenize --model /nonexistent/model --messages '[{\"role\": \"user\"}]'");
  CHECK(r.code != 0);
  CHECK_THAT(r.output, Catch::Contains("--messages[0].content must be a string"));
  r = run_strata("tokenize --model " + kModels + "/tiny-llama --messages '[{\"role\": \"user\", \"content\": \"a\"}]'");
  CHECK(r.code != 0);
  CHECK_THAT(r.output, Catch::Contains("no chat template"));
}

TEST_CASE("strata tokenize --messages renders Qwen2.5's tools, tool calls and results as Jinja2 does", "[cli][chat]") {
  std::ifstream cases_in(std::string(STRATA_FIXTURES_DIR) + "/chat/chat_cases.json");
  const nlohmann::ordered_json ex = nlohmann::ordered_json::parse(cases_in);  // tools keep their keys' order
  using ojson = nlohmann::ordered_json;
  const ojson& tpl = ex["templates"]["qwen2.5"];
  // A tokenizer with <|im_start|> and <|im_end|> as special tokens, and Qwen2.5's template.
  const fs::path dir = temp_dir() / "tok-qwen2.5";
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy(std::string(STRATA_FIXTURES_DIR) + "/tokenizer/llama3-style/tokenizer.json", dir / "tokenizer.json");
  std::ofstream(dir / "tokenizer_config.json") << json{{"chat_template", tpl["source"].get<std::string>()},
                                                       {"bos_token", nullptr},
                                                       {"eos_token", tpl["eos_token"].get<std::string>()}}
                                                      .dump();
  auto quoted = [](const ojson& j) {  // for the shell: '...' with each ' written '\''
    std::string q = "'";
    for (char ch : j.dump()) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    return q + "'";
  };
  // Requests carry a tool call's arguments as OpenAI does, a string of JSON: the fixture's
  // conversations with object arguments (transformers' spelling) are left to test_chat_template.
  auto openai_arguments = [](const ojson& messages) {
    for (const ojson& m : messages)
      for (const ojson& call : m.value("tool_calls", ojson::array()))
        if (!call["function"]["arguments"].is_string()) return false;
    return true;
  };
  int rendered = 0, tokenized = 0, with_tools = 0;
  for (const ojson& c : ex["cases"]) {
    if (c["template"] != "qwen2.5" || !c.contains("text") || !openai_arguments(c["messages"])) continue;
    INFO(c["messages"].dump() << (c.contains("tools") ? " tools " + c["tools"].dump() : ""));
    const Result r = run_strata("tokenize --model " + dir.string() + " --render " +
                                (c["add_generation_prompt"] ? "" : "--no-generation-prompt ") + "--messages " +
                                quoted(c["messages"]) + (c.contains("tools") ? " --tools " + quoted(c["tools"]) : ""));
    CHECK(r.code == 0);
    CHECK(r.output == c["text"].get<std::string>());
    ++rendered;
    with_tools += c.contains("tools");
  }
  for (const ojson& c : ex["token_cases"]) {
    if (c["template"] != "qwen2.5" || !openai_arguments(c["messages"])) continue;
    INFO(c["messages"].dump());
    const Result r = run_strata("tokenize --model " + dir.string() + " --messages " + quoted(c["messages"]));
    CHECK(r.code == 0);
    CHECK(r.output == c["ids"].dump() + "\n");
    ++tokenized;
  }
  CHECK(rendered >= 30);
  CHECK(with_tools >= 8);
  CHECK(tokenized == 4);
  Result r = run_strata("tokenize --model " + dir.string() + " --messages '[{\"role\": \"user\", \"content\": " +
                        "\"a\"}]' --tools '[{\"type\": \"function\", \"function\": {}}]'");
  CHECK(r.code != 0);
  CHECK_THAT(r.output, Catch::Contains("--tools[0].function.name must be a string"));
  r = run_strata("tokenize --model " + dir.string() + " --messages '[{\"role\": \"user\", \"content\": " +
                              "\"a\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": \"{}\"}}]}]'");
  CHECK(r.code != 0);
  CHECK_THAT(r.output, Catch::Contains("--messages[0].tool_calls is for assistant messages only"));
}

TEST_CASE("strata tokenize --messages renders GPT-OSS's harmony template at a reasoning effort", "[cli][chat][harmony]") {
  std::ifstream cases_in(std::string(STRATA_FIXTURES_DIR) + "/chat/harmony_cases.json");
  const json ex = json::parse(cases_in);
  const fs::path dir = temp_dir() / "tok-harmony";
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy(std::string(STRATA_FIXTURES_DIR) + "/tokenizer/o200k-style/tokenizer.json", dir / "tokenizer.json");
  std::ofstream(dir / "chat_template.jinja") << ex["source"].get<std::string>();
  char today[16];
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::strftime(today, sizeof today, "%Y-%m-%d", &local);
  int checked = 0;
  for (const json& c : ex["cases"]) {
    if (!c.contains("reasoning_effort") || !c["add_generation_prompt"].get<bool>()) continue;
    const std::string effort = c["reasoning_effort"].get<std::string>();
    std::string want = c["text"].get<std::string>();
    const std::string fixture_date = "Current date: " + ex["today"].get<std::string>();
    want.replace(want.find(fixture_date), fixture_date.size(), std::string("Current date: ") + today);
    const Result r = run_strata("tokenize --model " + dir.string() + " --render --reasoning-effort " + effort +
                                " --messages '" + c["messages"].dump() + "'");
    INFO(effort << ": " << r.output);
    CHECK(r.code == 0);
    CHECK(r.output == want);
    ++checked;
  }
  CHECK(checked == 2);
  const Result r = run_strata("tokenize --model " + dir.string() + " --text hi --reasoning-effort low");
  CHECK(r.code != 0);
  CHECK_THAT(r.output, Catch::Contains("go with --messages"));
}

TEST_CASE("a model larger than the backend's memory is refused before loading", "[cli]") {
  // opt-175b in fp32 needs about 700 GB: no CI machine has that, so this must fail cleanly.
  const fs::path prompts = temp_dir() / "big.jsonl", out = temp_dir() / "big_out.jsonl";
  std::ofstream(prompts) << "{\"id\": 1, \"prompt\": \"hi\"}\n";
  const Result r = run_strata("run --model dummy:opt-175b --prompts " + prompts.string() + " --out " + out.string() +
                              " --device cpu");
  CHECK(r.code == 1);
  CHECK_THAT(r.output, Catch::Contains("the weights need") && Catch::Contains("GB are available"));
  CHECK_FALSE(fs::exists(out));
  CHECK_FALSE(fs::exists(out.string() + ".partial"));
}

TEST_CASE("a rerun after an interrupted job resumes and answers only the rest", "[cli]") {
  const fs::path prompts = temp_dir() / "resume.jsonl", out = temp_dir() / "resume_out.jsonl";
  std::ofstream(prompts) << "{\"id\": \"a\", \"prompt\": \"one\", \"max_new_tokens\": 2}\n"
                            "{\"id\": \"b\", \"prompt\": \"two\", \"max_new_tokens\": 2, \"ignore_eos\": true}\n";
  fs::remove(out);
  // What an interrupted run leaves: one finished line and a torn one.
  std::ofstream(out.string() + ".partial") << "{\"id\":\"a\",\"completion\":\"kept\"}\n{\"id\":\"b\",\"compl";
  const Result r = run_strata("run --model " + kModels + "/tiny-opt --prompts " + prompts.string() + " --out " +
                              out.string() + " --device cpu --no-progress");
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("1 of 2 prompts already done"));
  std::ifstream in(out);
  std::string first, second, extra;
  REQUIRE(std::getline(in, first));
  REQUIRE(std::getline(in, second));
  CHECK_FALSE(std::getline(in, extra));
  CHECK(json::parse(first)["completion"] == "kept");
  CHECK(json::parse(second)["id"] == "b");
  CHECK(json::parse(second)["completion_tokens"] == 2);
}

namespace {
// The lines of an output file, sorted by id: answers come in completion order.
std::vector<json> read_lines(const fs::path& file) {
  std::vector<json> out;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) out.push_back(json::parse(line));
  std::stable_sort(out.begin(), out.end(), [](const json& a, const json& b) { return a["id"] < b["id"]; });
  return out;
}
}  // namespace

TEST_CASE("strata run --policy with experts apart and computed on the CPU gives the resident tokens and reports them",
          "[cli][offload][moe]") {
  const fs::path prompts = temp_dir() / "moe.jsonl", policy = temp_dir() / "experts-apart.yaml";
  {
    std::ofstream p(prompts);
    for (int i = 0; i < 5; ++i)
      p << "{\"id\": \"m" << i << "\", \"prompt\": \"hello number " << i << "\", \"max_new_tokens\": 4, \"ignore_eos\": true}\n";
  }
  std::ofstream(policy) << "gpu_batch_size: 2\nnum_gpu_batches: 2\nweights: {gpu: 100, cpu: 0, disk: 0}\n"
                           "expert_weights: {gpu: 0, cpu: 100, disk: 0}\ncpu_experts: decode\n"
                           "kv_cache: {gpu: 100, cpu: 0, disk: 0}\nactivations: {gpu: 100, cpu: 0, disk: 0}\n";
  const std::string base = "run --model " + kModels + "/tiny-mixtral --prompts " + prompts.string() +
                           " --device cpu --no-progress --offload-dir " + (temp_dir() / "offload-moe").string();
  const fs::path ref = temp_dir() / "moe_ref.jsonl", out = temp_dir() / "moe_out.jsonl";
  fs::remove(ref);
  fs::remove(out);
  Result r = run_strata(base + " --out " + ref.string());
  REQUIRE(r.code == 0);
  r = run_strata(base + " --out " + out.string() + " --policy " + policy.string() + " --report --verbose");
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("experts    :") && Catch::Contains("[policy 0/100/0, by MLP half]") &&
                           Catch::Contains("cpu experts: ") && Catch::Contains("of MLP halves on the CPU lane"));
  const std::vector<json> want = read_lines(ref), got = read_lines(out);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i]["tokens"] == want[i]["tokens"]);
}

TEST_CASE("strata run --policy offloads, reports, and keeps finished blocks when the disk fails", "[cli][offload]") {
  const fs::path prompts = temp_dir() / "offload.jsonl", policy = temp_dir() / "disk-weights.yaml";
  {
    std::ofstream p(prompts);
    for (int i = 0; i < 6; ++i)
      p << "{\"id\": \"p" << i << "\", \"prompt\": \"hello number " << i << "\", \"max_new_tokens\": 3, \"ignore_eos\": true}\n";
  }
  std::ofstream(policy) << "gpu_batch_size: 2\nnum_gpu_batches: 1\nweights: {gpu: 0, cpu: 0, disk: 100}\n"
                           "kv_cache: {gpu: 0, cpu: 100, disk: 0}\nactivations: {gpu: 100, cpu: 0, disk: 0}\n";
  const std::string base = "run --model " + kModels + "/tiny-llama --prompts " + prompts.string() +
                           " --device cpu --no-progress --offload-dir " + (temp_dir() / "offload").string();
  const fs::path ref = temp_dir() / "offload_ref.jsonl", out = temp_dir() / "offload_out.jsonl";
  fs::remove(ref);
  fs::remove(out);
  fs::remove(out.string() + ".partial");
  Result r = run_strata(base + " --out " + ref.string());
  REQUIRE(r.code == 0);

  // The third disk read of the second block fails (each block reads 2 layers x 2 halves x 3 tokens).
  r = run_shell("env STRATA_DISK_FAULT=read:15 " + std::string(STRATA_BINARY) + " " + base + " --out " + out.string() +
                 " --policy " + policy.string());
  INFO(r.output);
  CHECK(r.code == 1);
  CHECK_THAT(r.output, Catch::Contains("disk store") && Catch::Contains("Input/output error"));
  CHECK_FALSE(fs::exists(out));
  CHECK(read_lines(out.string() + ".partial").size() == 2);  // the first block is kept

  // The rerun resumes from the partial file and gives the resident run's tokens.
  r = run_strata(base + " --out " + out.string() + " --policy " + policy.string() + " --report --verbose");
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("resuming") && Catch::Contains("placement:") &&
                           Catch::Contains("disk->cpu:") && Catch::Contains("overlap") && Catch::Contains("peak memory") &&
                           Catch::Contains("host waits: ") && Catch::Contains(" per decode step ("));
  const std::vector<json> want = read_lines(ref), got = read_lines(out);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CHECK(got[i]["id"] == want[i]["id"]);
    CHECK(got[i]["tokens"] == want[i]["tokens"]);
  }

  // A budget nothing fits: a clear error before any output exists.
  fs::remove(out);
  r = run_strata(base + " --out " + out.string() + " --policy " + policy.string() + " --gpu-mem 1KiB");
  CHECK(r.code == 1);
  CHECK_THAT(r.output, Catch::Contains("gpu tier needs") && Catch::Contains("--gpu-mem"));
  CHECK_FALSE(fs::exists(out.string() + ".partial"));
  r = run_strata(base + " --out " + out.string() + " --policy " + policy.string() + " --gpu-mem 12X");
  CHECK(r.code == 1);
  CHECK_THAT(r.output, Catch::Contains("--gpu-mem"));
}

TEST_CASE("strata run --policy refills its slots and gives the tokens --no-refill gives in blocks", "[cli][offload][refill]") {
  // Eleven requests of 1 to 9 answer tokens through a block of 2 x 2, a request with 2 choices,
  // prompts sharing a beginning.
  const fs::path prompts = temp_dir() / "refill.jsonl", policy = temp_dir() / "refill.yaml";
  {
    std::ofstream p(prompts);
    for (int i = 0; i < 11; ++i)
      p << "{\"id\": \"r" << i << "\", \"prompt\": \"Answer briefly and well, please: item " << i
        << "\", \"max_new_tokens\": " << 1 + (i * 5) % 9 << ", \"ignore_eos\": true" << (i == 4 ? ", \"n\": 2" : "")
        << "}\n";
  }
  std::ofstream(policy) << "gpu_batch_size: 2\nnum_gpu_batches: 2\nweights: {gpu: 0, cpu: 100, disk: 0}\n"
                           "kv_cache: {gpu: 0, cpu: 100, disk: 0}\nactivations: {gpu: 100, cpu: 0, disk: 0}\n"
                           "cpu_attention: true\n";
  const std::string base = "run --model " + kModels + "/tiny-llama --prompts " + prompts.string() +
                           " --device cpu --no-progress --policy " + policy.string();
  const fs::path blocks = temp_dir() / "refill_blocks.jsonl", served = temp_dir() / "refill_served.jsonl";
  fs::remove(blocks);
  fs::remove(served);
  Result r = run_strata(base + " --out " + blocks.string() + " --no-refill");
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("padding efficiency"));
  r = run_strata(base + " --out " + served.string());
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("continuous batching: 4 slots, occupancy"));
  const std::vector<json> want = read_lines(blocks), got = read_lines(served);
  REQUIRE(got.size() == 11);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO(got[i].dump());
    CHECK(got[i]["id"] == want[i]["id"]);
    // The request of 2 choices answers with a list of them.
    const char* tokens = got[i].contains("choices") ? "choices" : "tokens";
    CHECK(got[i].contains(tokens));
    CHECK(got[i].value(tokens, json()) == want[i].value(tokens, json()));
  }

  // A request of more choices than a GPU batch holds: the job says so and runs blocks.
  std::ofstream(prompts, std::ios::app) << "{\"id\": \"wide\", \"prompt\": \"x\", \"max_new_tokens\": 2, \"n\": 3}\n";
  fs::remove(served);
  r = run_strata(base + " --out " + served.string());
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("n = 3 choices exceed the GPU batch of 2: the job runs blocks") &&
                           Catch::Contains("padding efficiency"));
  CHECK(read_lines(served).size() == 12);
}

TEST_CASE("a FlexGen-shaped policy runs in a small GPU budget and gives the resident tokens", "[cli][offload][slow]") {
  // Two GPU batches of 32 prompts of ~250 tokens (dummy models take one token per byte), weights,
  // cache and activations on the CPU tier, CPU attention: the shape of FlexGen's OPT-30B run, at
  // 125M and half its prompt. Whole-batch prefill would need 32 x 259 tokens of working buffers
  // (~0.5 GB in fp32) on the "GPU"; prefill steps of 1024 tokens keep it under 400 MB.
  const fs::path prompts = temp_dir() / "flexgen-shape.jsonl", policy = temp_dir() / "flexgen-shape.yaml";
  {
    std::ofstream p(prompts);
    const std::string text = "The quick brown fox jumps over the lazy dog while the band plays on. ";
    for (int i = 0; i < 64; ++i) {
      std::string prompt = std::to_string(i) + ": ";
      while (prompt.size() < size_t(240 + i % 20)) prompt += text;
      prompt.resize(size_t(240 + i % 20));
      p << "{\"id\": " << i << ", \"prompt\": \"" << prompt << "\", \"max_new_tokens\": 3, \"ignore_eos\": true}\n";
    }
  }
  std::ofstream(policy) << "gpu_batch_size: 32\nnum_gpu_batches: 2\nweights: {gpu: 0, cpu: 100, disk: 0}\n"
                           "kv_cache: {gpu: 0, cpu: 100, disk: 0}\nactivations: {gpu: 0, cpu: 100, disk: 0}\n"
                           "cpu_attention: true\n";
  const std::string base = "run --model dummy:opt-125m --prompts " + prompts.string() + " --device cpu --no-progress";
  const fs::path ref = temp_dir() / "flexgen-shape-ref.jsonl", out = temp_dir() / "flexgen-shape-out.jsonl";
  fs::remove(ref);
  fs::remove(out);
  Result r = run_strata(base + " --out " + ref.string() + " --batch-size 64");
  INFO(r.output);
  REQUIRE(r.code == 0);
  r = run_strata(base + " --out " + out.string() + " --policy " + policy.string() + " --gpu-mem 400MB --verbose");
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("prefill steps of <= 1024 tokens"));
  const std::vector<json> want = read_lines(ref), got = read_lines(out);
  REQUIRE(got.size() == 64);
  REQUIRE(want.size() == 64);
  for (size_t i = 0; i < got.size(); ++i) {
    CHECK(got[i]["prompt_tokens"] == want[i]["prompt_tokens"]);
    CHECK(got[i]["tokens"] == want[i]["tokens"]);
  }
  // The old whole-batch prefill's working set does not fit that budget; a prefill step larger
  // than the budget allows is refused naming it.
  fs::remove(out);
  r = run_strata(base + " --out " + out.string() + " --policy " + policy.string() +
                 " --gpu-mem 400MB --prefill-tokens 16000");
  CHECK(r.code == 1);
  CHECK_THAT(r.output, Catch::Contains("gpu tier needs") && Catch::Contains("--gpu-mem") &&
                           Catch::Contains("prefill steps of 8288 tokens (--prefill-tokens)"));
  CHECK_FALSE(fs::exists(out.string() + ".partial"));
  r = run_strata(base + " --out " + out.string() + " --policy " + policy.string() + " --prefill-tokens 0");
  CHECK(r.code != 0);
  CHECK_THAT(r.output, Catch::Contains("--prefill-tokens"));
}

TEST_CASE("strata run --policy auto searches a policy for the cached profile and prints it", "[cli][offload]") {
  const fs::path cache = temp_dir() / "auto-cache";
  fs::remove_all(cache);
  const std::string env = "env STRATA_CACHE=" + cache.string() + " " + std::string(STRATA_BINARY) + " ";
  Result r = run_shell(env + "profile --quick --device cpu");
  INFO(r.output);
  REQUIRE(r.code == 0);
  REQUIRE(fs::exists(cache / "hardware.yaml"));
  // The summary names the CPU linear's curves over the weights and over their 4-bit codes.
  CHECK_THAT(r.output, Catch::Contains("cpu linear ") && Catch::Contains("cpu linear q4 ") &&
                           Catch::Contains("cpu q4 weights"));

  const fs::path prompts = temp_dir() / "auto.jsonl", ref = temp_dir() / "auto_ref.jsonl", out = temp_dir() / "auto_out.jsonl";
  {
    std::ofstream p(prompts);
    for (int i = 0; i < 3; ++i) p << "{\"id\": " << i << ", \"prompt\": \"story " << i << "\", \"max_new_tokens\": 4}\n";
  }
  for (const fs::path& f : {ref, out}) fs::remove(f);
  const std::string base = "run --model " + kModels + "/tiny-opt --prompts " + prompts.string() + " --device cpu --no-progress";
  REQUIRE(run_strata(base + " --out " + ref.string()).code == 0);
  r = run_shell(env + base + " --out " + out.string() + " --policy auto");
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("policy auto") && Catch::Contains("gpu_batch_size:") &&
                           Catch::Contains("predicted"));
  const std::vector<json> want = read_lines(ref), got = read_lines(out);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i]["tokens"] == want[i]["tokens"]);

  // --compress lets the search try 4-bit weights and KV cache; with a policy file it is refused.
  fs::remove(out);
  r = run_shell(env + base + " --out " + out.string() + " --policy auto --compress");
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("compression allowed") && Catch::Contains("gpu_batch_size:"));
  CHECK(read_lines(out).size() == want.size());
  fs::remove(out);
  const fs::path policy = temp_dir() / "auto_all_gpu.yaml";
  std::ofstream(policy) << "gpu_batch_size: 4\nnum_gpu_batches: 1\nweights: {gpu: 100, cpu: 0, disk: 0}\n"
                           "kv_cache: {gpu: 100, cpu: 0, disk: 0}\nactivations: {gpu: 100, cpu: 0, disk: 0}\n";
  r = run_strata(base + " --out " + out.string() + " --policy " + policy.string() + " --compress");
  CHECK(r.code != 0);
  CHECK_THAT(r.output, Catch::Contains("--compress is for --policy auto"));
  CHECK_FALSE(fs::exists(out));
}

TEST_CASE("strata run on MXFP4 experts says which policy keeps them, and that policy keeps them", "[cli][gpt_oss]") {
  const fs::path prompts = temp_dir() / "mxfp4_prompts.jsonl", policy = temp_dir() / "mxfp4_8_32.yaml";
  std::ofstream(prompts) << "{\"id\": 1, \"prompt\": \"hello\", \"max_new_tokens\": 3}\n";
  std::ofstream(policy) << "gpu_batch_size: 1\nnum_gpu_batches: 1\nweights: {gpu: 0, cpu: 100, disk: 0}\n"
                           "kv_cache: {gpu: 100, cpu: 0, disk: 0}\nactivations: {gpu: 100, cpu: 0, disk: 0}\n"
                           "compress_weights: {bits: 8, group_size: 32}\n";
  const fs::path out = temp_dir() / "mxfp4_out.jsonl";
  fs::remove(out);
  const Result r = run_strata("run --model " + kModels + "/tiny-gpt-oss-mxfp4 --prompts " + prompts.string() +
                              " --out " + out.string() + " --device cpu --no-progress --report --verbose --policy " +
                              policy.string() + " --offload-dir " + (temp_dir() / "offload-mxfp4").string());
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("weights: MXFP4 experts; a policy with compress_weights {bits: 8, "
                                       "group_size: 32} keeps their values exactly"));
  // 3 layers x 6 experts x gate, up, down keep the file's values; q, k, v, o are quantized.
  CHECK_THAT(r.output, Catch::Contains("54 matrices keep the file's codes, 12 quantized at load"));
  // A float checkpoint has nothing to say.
  const Result plain = run_strata("run --model " + kModels + "/tiny-gpt-oss --prompts " + prompts.string() + " --out " +
                                  (temp_dir() / "gpt_oss_out.jsonl").string() + " --device cpu --no-progress");
  REQUIRE(plain.code == 0);
  CHECK_THAT(plain.output, !Catch::Contains("MXFP4"));
}
