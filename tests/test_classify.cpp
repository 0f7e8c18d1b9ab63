// Sequence classifiers (model/classifier.h, job/classify.h): the logits transformers computes for
// the tiny *ForSequenceClassification models (tests/fixtures/classify/make_classify_fixtures.py)
// through `strata run` in both formats, texts and conversations, the head's config, and the
// refusals.
#include "test_paths.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_support.h"
#include "edited_model.h"
#include "error_text.h"
#include "pooled_job.h"
#include "strata/backend/backend.h"
#include "strata/core/error.h"
#include "strata/job/batch_job.h"
#include "strata/job/perplexity.h"
#include "strata/job/prompts.h"
#include "strata/model/classifier.h"
#include "strata/model/model_loader.h"
#include "strata/runtime/embedder.h"
#include "strata/runtime/model_weights.h"
#include "temp_files.h"

using namespace strata;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const char* const kModels[] = {"tiny-qwen3-classifier", "tiny-llama-reward", "tiny-qwen3-multilabel"};

fs::path model_dir(const std::string& name) { return fs::path(STRATA_FIXTURES_DIR) / "classify" / name; }

json expected(const std::string& name) {
  std::ifstream in(model_dir(name) / "expected.json");
  REQUIRE(in.good());
  return json::parse(in);
}

// fp32 against fp32: summation order only.
void check_close(const json& got, const json& want) {
  REQUIRE(got.size() == want.size());
  float worst = 0, scale = 0;
  for (size_t j = 0; j < got.size(); ++j) {
    scale = std::max(scale, std::fabs(want[j].get<float>()));
    worst = std::max(worst, std::fabs(got[j].get<float>() - want[j].get<float>()));
  }
  INFO("got " << got.dump() << ", want " << want.dump() << ": worst |difference| " << worst);
  CHECK(worst <= 2e-5f + 1e-5f * scale);
}

fs::path write(const std::string& name, const std::string& text) {
  return test::write_file(test::temp_dir("classify") / name, text);
}

using test::lines_by_id;

std::string classify_line(const std::string& id, const json& body) { return test::batch_request(id, "/v1/classify", body); }

JobOptions job(const std::string& model, const fs::path& in, const fs::path& out) { return test::pooled_job(model, in, out); }

std::map<std::string, json> run_job(const std::string& name, const std::string& text, JobSummary* summary = nullptr,
                                    std::string* log_text = nullptr) {
  const fs::path out = test::temp_dir("classify") / (name + "_out.jsonl");
  std::ostringstream log;
  const JobSummary s = run_batch_job(job(model_dir(name).string(), write(name + "_in.jsonl", text), out), log);
  if (summary) *summary = s;
  if (log_text) *log_text = log.str();
  return lines_by_id(out);
}

size_t argmax(const json& v) {
  size_t best = 0;
  for (size_t i = 1; i < v.size(); ++i)
    if (v[i].get<double>() > v[best].get<double>()) best = i;
  return best;
}

// A copy of a classifier fixture with its config.json edited.
fs::path with_config(const std::string& name, const std::function<void(json&)>& edit) {
  return test::edited_model(name, edit, "classify", "classify");
}

}  // namespace

TEST_CASE("classify: *ForSequenceClassification loads a score head in place of the LM head", "[classify][model]") {
  const ModelBundle q = open_model(model_dir("tiny-qwen3-classifier").string());
  CHECK(q.config.num_labels == 3);
  CHECK_FALSE(q.config.lm_head);
  CHECK_FALSE(q.config.tied_embeddings);  // config.json says tie_word_embeddings true: the head is score
  REQUIRE(q.classifier);
  CHECK(q.classifier->labels == std::vector<std::string>{"negative", "neutral", "positive"});
  CHECK(q.classifier->activation == ClassifierActivation::Softmax);
  CHECK(q.classifier->pad_id == 0);
  CHECK(q.classifier->weight.size() == 3 * 64);
  const ModelBundle r = open_model(model_dir("tiny-llama-reward").string());
  REQUIRE(r.classifier);
  CHECK(r.classifier->labels == std::vector<std::string>{"LABEL_0"});  // transformers' name for an unnamed label
  CHECK(r.classifier->activation == ClassifierActivation::Sigmoid);   // one label: a score
  CHECK(open_model(model_dir("tiny-qwen3-multilabel").string()).classifier->activation == ClassifierActivation::Sigmoid);
  CHECK(open_model(with_config("tiny-qwen3-classifier", [](json& c) {
          c["problem_type"] = "regression";
        }).string()).classifier->activation == ClassifierActivation::None);
  // A generative model has none.
  CHECK_FALSE(open_model((fs::path(STRATA_FIXTURES_DIR) / "models" / "tiny-qwen3").string()).classifier);

  // What cannot be loaded as a classifier names the file and the field.
  const fs::path labels = with_config("tiny-qwen3-classifier", [](json& c) {
    c["id2label"]["3"] = "other";
  });
  CHECK(test::error_of([&] { open_model(labels.string()); }) ==
        labels.string() + ": tensor 'score.weight' has shape [3, 64], expected [4, 64] (num_labels x hidden_size)");
  const fs::path problem = with_config("tiny-qwen3-classifier", [](json& c) { c["problem_type"] = "ranking"; });
  CHECK(test::error_of([&] { open_model(problem.string()); }) ==
        (problem / "config.json").string() + ": problem_type 'ranking' is not one of regression, "
                                             "single_label_classification, multi_label_classification");
  const fs::path key = with_config("tiny-qwen3-classifier", [](json& c) { c["id2label"] = {{"x", "a"}}; });
  CHECK(test::error_of([&] { open_model(key.string()); }) ==
        (key / "config.json").string() + ": id2label key 'x' is not a class index in [0, 1)");
  const fs::path token = with_config("tiny-qwen3-classifier", [](json& c) {
    c["architectures"] = {"Qwen3ForTokenClassification"};
  });
  CHECK(test::error_of([&] { open_model(token.string()); }) ==
        (token / "config.json").string() + ": architectures Qwen3ForTokenClassification: a ForTokenClassification "
                                           "head is not supported (causal LMs, embedding models and "
                                           "ForSequenceClassification are)");
  // An embedding model's files under a classifier's config: no score.weight.
  const fs::path headless = test::temp_dir("classify") / "headless";
  fs::remove_all(headless);
  fs::create_directories(headless);
  const fs::path embedding = fs::path(STRATA_FIXTURES_DIR) / "embeddings" / "tiny-qwen3-embedding";
  for (const char* f : {"model.safetensors", "tokenizer.json", "tokenizer_config.json"})
    fs::copy(embedding / f, headless / f);
  json cfg = json::parse(std::ifstream(embedding / "config.json"));
  cfg["architectures"] = {"Qwen3ForSequenceClassification"};
  std::ofstream(headless / "config.json") << cfg.dump();
  CHECK(test::error_of([&] { open_model(headless.string()); }) ==
        headless.string() + ": missing tensor 'score.weight' (the head of a 2-label "
                                                    "classifier, as " + (headless / "config.json").string() + " says)");
}

TEST_CASE("classify: a text's logits and probabilities are transformers'", "[classify][hf][job]") {
  for (const char* name : kModels) {
    SECTION(name) {
      const json exp = expected(name);
      std::string text;
      for (size_t i = 0; i < exp["texts"].size(); ++i)
        text += json{{"id", "t" + std::to_string(i)}, {"classify", exp["texts"][i]}}.dump() + "\n" +
                json{{"id", "ids" + std::to_string(i)}, {"classify", exp["ids"][i]}}.dump() + "\n";
      text += json{{"id", "all"}, {"classify", exp["texts"]}}.dump() + "\n";
      JobSummary s;
      std::string log;
      const auto lines = run_job(name, text, &s, &log);
      INFO(log);
      CHECK_THAT(log, Catch::Contains("classification: " + std::to_string(exp["labels"].size()) + " label"));
      CHECK_THAT(log, Catch::Contains("classified: "));
      int64_t tokens = 0;
      for (size_t i = 0; i < exp["texts"].size(); ++i) {
        INFO("text " << i);
        const json& line = lines.at("\"t" + std::to_string(i) + "\"");
        // The tokens Hugging Face's tokenizer makes with its special tokens (Llama's BOS).
        CHECK(line["prompt_tokens"] == exp["ids"][i].size());
        tokens += int64_t(exp["ids"][i].size());
        check_close(line["logits"], exp["logits"][i]);
        check_close(line["probs"], exp["probs"][i]);
        CHECK(line["label"] == exp["labels"][argmax(exp["logits"][i])]);
        const json& ids = lines.at("\"ids" + std::to_string(i) + "\"");  // as given: no tokens added
        check_close(ids["logits"], line["logits"]);
        const json& all = lines.at("\"all\"")["classifications"][i];
        check_close(all["logits"], line["logits"]);
        CHECK(all["label"] == line["label"]);
      }
      CHECK(lines.at("\"all\"")["prompt_tokens"] == tokens);
      CHECK(s.embedded_inputs == 3 * int64_t(exp["texts"].size()));
    }
  }
}

TEST_CASE("classify: a conversation is scored as apply_chat_template tokenizes it", "[classify][hf][job]") {
  for (const char* name : {"tiny-qwen3-classifier", "tiny-llama-reward"}) {
    SECTION(name) {
      const json exp = expected(name);
      std::string text;
      for (size_t i = 0; i < exp["conversations"].size(); ++i) {
        const std::string k = std::to_string(i);
        text += classify_line("c" + k, {{"messages", exp["conversations"][i]}, {"use_activation", false}});
        text += classify_line("g" + k, {{"messages", exp["conversations"][i]}, {"add_generation_prompt", true},
                                        {"use_activation", false}});
      }
      const auto lines = run_job(name, text);
      for (size_t i = 0; i < exp["conversations"].size(); ++i) {
        INFO("conversation " << i);
        for (const auto& [prefix, key] : {std::pair{"c", "chat"}, std::pair{"g", "chat_generation_prompt"}}) {
          const json& body = lines.at(prefix + std::to_string(i))["response"]["body"];
          CHECK(body["usage"]["prompt_tokens"] == exp[std::string(key) + "_ids"][i].size());
          check_close(body["data"][0]["probs"], exp[std::string(key) + "_logits"][i]);  // use_activation false
        }
      }
      // The strata format: "classify": true beside the messages.
      const json strata = json{{"id", 7}, {"classify", true}, {"messages", exp["conversations"][0]}};
      const json line = run_job(name, strata.dump() + "\n").at("7");
      check_close(line["logits"], exp["chat_logits"][0]);
      CHECK(line["prompt_tokens"] == exp["chat_ids"][0].size());
    }
  }
}

TEST_CASE("classify: pads after the last token are not scored, truncate_prompt_tokens keeps the last tokens",
          "[classify][hf][job]") {
  for (const char* name : {"tiny-qwen3-classifier", "tiny-llama-reward"}) {
    SECTION(name) {
      const json exp = expected(name);
      const int k = exp["truncate_prompt_tokens"].get<int>();
      std::string text = json{{"id", "padded"}, {"classify", exp["padded_ids"]}}.dump() + "\n";
      for (size_t i = 0; i < exp["texts"].size(); ++i)
        text += json{{"id", "cut" + std::to_string(i)}, {"classify", exp["texts"][i]}, {"truncate_prompt_tokens", k}}
                    .dump() + "\n";
      const auto lines = run_job(name, text);
      // transformers pools the last token that is not pad_token_id; the pads count as prompt tokens.
      check_close(lines.at("\"padded\"")["logits"], exp["padded_logits"]);
      CHECK(lines.at("\"padded\"")["prompt_tokens"] == exp["padded_ids"].size());
      for (size_t i = 0; i < exp["texts"].size(); ++i) {
        INFO("text " << i);
        const json& line = lines.at("\"cut" + std::to_string(i) + "\"");
        CHECK(line["prompt_tokens"] == exp["truncated_ids"][i].size());
        check_close(line["logits"], exp["truncated_logits"][i]);
      }
    }
  }
}

TEST_CASE("classify: OpenAI answers are vLLM's classification bodies", "[classify][job]") {
  const std::string name = "tiny-qwen3-classifier";
  const json exp = expected(name);
  const std::string text =
      classify_line("one", {{"model", "sentiment"}, {"input", exp["texts"][0]}}) +
      classify_line("two", {{"input", {exp["texts"][1], exp["texts"][2]}}}) +
      classify_line("raw", {{"input", exp["texts"][0]}, {"use_activation", false}}) +
      classify_line("old", {{"input", exp["texts"][0]}, {"softmax", false}}) +
      classify_line("nospecial", {{"input", exp["ids"][0]}, {"add_special_tokens", false}});
  const auto lines = run_job(name, text);
  const json& one = lines.at("one");
  CHECK(one["error"].is_null());
  CHECK(one["response"]["status_code"] == 200);
  const json& body = one["response"]["body"];
  CHECK(body["id"].get<std::string>().rfind("classify-", 0) == 0);
  CHECK(body["object"] == "list");
  CHECK(body["model"] == "sentiment");
  CHECK(body["created"].is_number_integer());
  REQUIRE(body["data"].size() == 1);
  CHECK(body["data"][0]["index"] == 0);
  CHECK(body["data"][0]["num_classes"] == 3);
  CHECK(body["data"][0]["label"] == exp["labels"][argmax(exp["logits"][0])]);
  check_close(body["data"][0]["probs"], exp["probs"][0]);
  CHECK(body["usage"] == json{{"prompt_tokens", exp["ids"][0].size()}, {"total_tokens", exp["ids"][0].size()},
                              {"completion_tokens", 0}});
  const json& two = lines.at("two")["response"]["body"];
  REQUIRE(two["data"].size() == 2);
  CHECK(two["data"][1]["index"] == 1);
  CHECK(two["model"] == "tiny-qwen3-classifier");  // no body.model: the model's name
  check_close(two["data"][1]["probs"], exp["probs"][2]);
  check_close(lines.at("raw")["response"]["body"]["data"][0]["probs"], exp["logits"][0]);
  check_close(lines.at("old")["response"]["body"]["data"][0]["probs"], exp["logits"][0]);
  check_close(lines.at("nospecial")["response"]["body"]["data"][0]["probs"], exp["probs"][0]);
}

TEST_CASE("classify: requests that cannot be served", "[classify][job]") {
  const json exp = expected("tiny-qwen3-classifier");
  const json chat = exp["conversations"][0];
  const std::string text =
      classify_line("both", {{"input", "a"}, {"messages", chat}}) + classify_line("none", json::object()) +
      classify_line("flag", {{"input", "a"}, {"use_activation", "yes"}}) +
      classify_line("genprompt", {{"input", "a"}, {"add_generation_prompt", true}}) +
      classify_line("cut", {{"input", "a"}, {"truncate_prompt_tokens", 300}}) +
      classify_line("role", {{"messages", {{{"content", "hi"}}}}}) +
      classify_line("vocab", {{"input", {1, 1000}}}) +
      json{{"custom_id", "embed"}, {"method", "POST"}, {"url", "/v1/embeddings"}, {"body", {{"input", "a"}}}}.dump() +
      "\n" +
      json{{"custom_id", "gen"}, {"method", "POST"}, {"url", "/v1/chat/completions"}, {"body", {{"messages", chat}}}}
          .dump() + "\n" + classify_line("ok", {{"input", "a"}});
  JobSummary s;
  const auto lines = run_job("tiny-qwen3-classifier", text, &s);
  CHECK(s.errors == 9);
  auto error = [&](const std::string& id) {
    const json& l = lines.at(id);
    CHECK(l["response"].is_null());
    return l["error"]["code"].get<std::string>() + ": " + l["error"]["message"].get<std::string>();
  };
  CHECK(error("both") == "invalid_value: give body.input or body.messages, not both");
  CHECK(error("none") == "missing_field: body.input or body.messages is required for classification");
  CHECK(error("flag") == "invalid_type: body.use_activation must be true or false, got \"yes\"");
  CHECK(error("genprompt") == "invalid_value: body.add_generation_prompt is for body.messages");
  CHECK(error("cut") == "invalid_value: body.truncate_prompt_tokens 300 exceeds the model's context of 256");
  CHECK(error("role") == "invalid_type: body.messages[0].role must be a string");
  CHECK(error("vocab") == "invalid_value: body.input: token id 1000 is outside the model's vocabulary of 1000");
  CHECK(error("embed") == "unsupported_model: tiny-qwen3-classifier is a sequence classifier: it answers "
                          "classification requests only (/v1/classify; the strata format's 'classify' lines)");
  CHECK(error("gen") == "unsupported_model: tiny-qwen3-classifier is a sequence classifier: it answers "
                        "classification requests only (/v1/classify; the strata format's 'classify' lines)");
  CHECK(lines.at("ok")["error"].is_null());

  // A model without a classifier's head answers /v1/classify with an error line.
  const fs::path out = test::temp_dir("classify") / "generative_out.jsonl";
  std::ostringstream log;
  run_batch_job(job((fs::path(STRATA_FIXTURES_DIR) / "models" / "tiny-qwen3").string(),
                    write("generative.jsonl", classify_line("c", {{"input", "a"}})), out),
                log);
  CHECK(lines_by_id(out).at("c")["error"]["message"] ==
        "classification needs a sequence classifier (config.json's architectures *ForSequenceClassification, with "
        "a score.weight head); tiny-qwen3 is not one");
}

TEST_CASE("classify: strata lines that cannot be served fail the job naming the line", "[classify][job]") {
  const std::string model = model_dir("tiny-qwen3-classifier").string();
  auto job_error = [&](const std::string& text, const std::string& model_path) {
    const fs::path out = test::temp_dir("classify") / "strata_error_out.jsonl";
    std::ostringstream log;
    const std::string e =
        test::error_of([&] { run_batch_job(job(model_path, write("strata_error.jsonl", text), out), log); });
    CHECK_FALSE(fs::exists(out));
    return e;
  };
  const std::string file = (test::temp_dir("classify") / "strata_error.jsonl").string();
  CHECK(job_error(R"({"id": 1, "classify": "a"})" "\n" R"({"id": 2, "prompt": "b"})" "\n", model) ==
        file + ":2: tiny-qwen3-classifier is a sequence classifier: it answers 'classify' lines only");
  CHECK(job_error(R"({"id": 1, "input": "a"})" "\n", model) ==
        file + ":1: tiny-qwen3-classifier is a sequence classifier: it answers classification requests only "
               "(/v1/classify; the strata format's 'classify' lines)");
  CHECK(job_error(R"({"id": 1, "classify": true})" "\n", model) ==
        file + ":1: field 'classify' true classifies 'messages', which is missing");
  CHECK(job_error(R"({"id": 1, "classify": "a", "prompt": "b"})" "\n", model) ==
        file + ":1: give 'classify' (a classification) or 'prompt' / 'messages' (an answer), not both");
  CHECK(job_error(R"({"id": 1, "classify": "a", "messages": [{"role": "user", "content": "b"}]})" "\n", model) ==
        file + ":1: give the input in field 'classify' or the conversation in field 'messages' (with \"classify\": "
               "true), not both");
  CHECK(job_error(R"({"id": 1, "classify": "a"})" "\n", (fs::path(STRATA_FIXTURES_DIR) / "models" / "tiny-qwen3").string()) ==
        file + ":1: classification needs a sequence classifier (config.json's architectures "
               "*ForSequenceClassification, with a score.weight head); tiny-qwen3 is not one");
  // Embedding options, the offloading engine and perplexity do not apply to a classifier.
  const fs::path in = write("ok.jsonl", R"({"id": 1, "classify": "a"})" "\n");
  std::ostringstream log;
  JobOptions o = job(model, in, test::temp_dir("classify") / "options_out.jsonl");
  o.pooling = "mean";
  CHECK(test::error_of([&] { run_batch_job(o, log); }) ==
        "--pooling is for embedding models; tiny-qwen3-classifier is a sequence classifier, which scores the last "
        "token that is not the pad token");
  o.pooling.clear();
  o.policy = "auto";
  CHECK(test::error_of([&] { run_batch_job(o, log); }) ==
        in.string() + ":1: a classification request: classifications run on the resident model; drop --policy (the "
                      "offloading engine generates only)");
  PerplexityOptions p;
  p.model = model;
  p.text = in;
  p.device = "cpu";
  p.progress = false;
  CHECK(test::error_of([&] { run_perplexity(p, log); }) ==
        model + ": a sequence classifier: it predicts no tokens to score");
}

TEST_CASE("classify: strata run scores a reward model's conversations", "[classify][cli]") {
  const json exp = expected("tiny-llama-reward");
  std::string text;
  for (size_t i = 0; i < exp["conversations"].size(); ++i)
    text += json{{"id", i}, {"classify", true}, {"messages", exp["conversations"][i]}}.dump() + "\n";
  const fs::path in = write("cli.jsonl", text);
  const fs::path out = test::temp_dir("classify") / "cli_out.jsonl";
  fs::remove(out);
  const auto r = test::run_strata("run --model " + model_dir("tiny-llama-reward").string() + " --prompts " +
                                  in.string() + " --out " + out.string() + " --no-progress");
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("classification: 1 label (LABEL_0), sigmoid"));
  const auto lines = lines_by_id(out);
  REQUIRE(lines.size() == exp["conversations"].size());
  for (size_t i = 0; i < exp["conversations"].size(); ++i) {
    const json& line = lines.at(std::to_string(i));
    check_close(line["logits"], exp["chat_logits"][i]);
    const double reward = exp["chat_logits"][i][0].get<double>();
    check_close(line["probs"], json::array({1.0 / (1.0 + std::exp(-reward))}));
  }
}

// fp16 on the GPU (the emulated backend in CI): within twice transformers' own fp16 distance from
// its fp32 logits, the largest over the model's texts: one text's distance is a single draw of the
// rounding and may cancel to nothing (the reward model's 2-token text: 4e-5 against 1e-3 to 3e-3 for
// the others), so the model's fp16 error scale is its largest.
TEST_CASE("CUDA: classification within twice transformers' own fp16 error", "[classify][hf][cuda]") {
  if (!cuda_available()) {
    WARN("no GPU: skipped");
    return;
  }
  for (const char* name : kModels) {
    SECTION(name) {
      const json exp = expected(name);
      const auto ids = exp["ids"].get<std::vector<std::vector<int32_t>>>();
      std::unique_ptr<Backend> backend = make_cuda_backend(0, DType::F16);
      const ModelBundle b = open_model(model_dir(name).string());
      Transformer model(b.config, load_model_weights(b.config, *b.weights, *backend), *backend);
      Embedder e(model, 16);
      const auto pooled = e.embed(ids, PoolingKind::Last);
      float fp16_scale = 0;
      for (const json& d : exp["fp16_vs_fp32_max_abs_diff"]) fp16_scale = std::max(fp16_scale, d.get<float>());
      for (size_t i = 0; i < ids.size(); ++i) {
        const std::vector<double> got = b.classifier->logits(pooled[i]);
        float worst = 0;
        for (size_t j = 0; j < got.size(); ++j)
          worst = std::max(worst, float(std::fabs(got[j] - exp["logits"][i][j].get<double>())));
        const float allowed = 2 * fp16_scale;
        INFO(name << " text " << i << ": worst " << worst << ", allowed " << allowed);
        CHECK(worst <= allowed);
      }
    }
  }
}
