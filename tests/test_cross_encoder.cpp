// Cross-encoders (job/cross_encoder.h): score and rerank requests answered by a one-label
// classifier, each pair encoded as vLLM encodes it, against what transformers says of the pairs
// (tests/fixtures/classify/make_cross_encoder_fixtures.py): the reward model's pair template,
// concatenation, a score template and truncation; the original Qwen3-Reranker's shape read through
// --hf-overrides; and the refusals.
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
#include "strata/job/batch_job.h"
#include "strata/job/cross_encoder.h"
#include "strata/model/model_loader.h"
#include "strata/runtime/embedder.h"
#include "strata/runtime/model_weights.h"
#include "temp_files.h"

using namespace strata;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

// vLLM's hf_overrides for the original Qwen3-Reranker (its model card and vLLM's example).
const char* const kQwen3Reranker =
    R"({"architectures": ["Qwen3ForSequenceClassification"], "classifier_from_token": ["no", "yes"], )"
    R"("is_original_qwen3_reranker": true})";

fs::path model_dir(const std::string& name) { return fs::path(STRATA_FIXTURES_DIR) / "classify" / name; }

json read_json(const fs::path& p) {
  std::ifstream in(p);
  REQUIRE(in.good());
  return json::parse(in);
}

json pairs_expected() { return read_json(model_dir("tiny-llama-reward") / "cross_encoder.json"); }

// fp32 against fp32: summation order only.
void check_close(double got, double want) {
  INFO("got " << got << ", want " << want);
  CHECK(std::fabs(got - want) <= 2e-5 + 1e-5 * std::fabs(want));
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

std::vector<int32_t> ids_of(const std::variant<std::vector<int32_t>, std::string>& r) {
  if (const auto* why = std::get_if<std::string>(&r)) FAIL(*why);
  return std::get<std::vector<int32_t>>(r);
}

using test::lines_by_id;

std::string request(const std::string& id, const std::string& url, const json& body) {
  return test::batch_request(id, url, body);
}

struct JobRun {
  std::map<std::string, json> lines;
  JobSummary summary;
  std::string log;
};

JobRun run_job(const std::string& model, const std::string& text, const std::string& overrides = {},
               const fs::path& chat_template = {}) {
  static int runs = 0;
  const fs::path dir = test::temp_dir("cross_encoder");
  const fs::path in = test::write_file(dir / ("in" + std::to_string(runs) + ".jsonl"), text);
  const fs::path out = dir / ("out" + std::to_string(runs++) + ".jsonl");
  JobOptions o = test::pooled_job(model, in, out);
  o.hf_overrides = overrides;
  o.chat_template = chat_template;
  std::ostringstream log;
  JobRun r;
  r.summary = run_batch_job(o, log);
  r.log = log.str();
  r.lines = lines_by_id(out);
  return r;
}

std::vector<std::string> column(const json& pairs, size_t which, size_t from, size_t count) {
  std::vector<std::string> out;
  for (size_t k = from; k < from + count; ++k) out.push_back(pairs[k][which].get<std::string>());
  return out;
}

}  // namespace

TEST_CASE("cross-encoder: pairs are encoded as Hugging Face's tokenizer encodes them", "[classify][model]") {
  const json exp = pairs_expected();
  ModelBundle m = open_model(model_dir("tiny-llama-reward").string());
  // The tokenizer's pair template: "<s> $A <s> $B".
  CHECK(m.pair_template.lead == std::vector<int32_t>{1});
  CHECK(m.pair_template.middle == std::vector<int32_t>{1});
  CHECK(m.pair_template.tail.empty());
  REQUIRE(m.classifier->pair_separator);
  const auto tmpl = ChatTemplate::interpreted(exp["score_template"].get<std::string>(), m.chat_tokens);
  const int64_t keep = exp["truncate_prompt_tokens"].get<int64_t>();
  for (size_t k = 0; k < exp["pairs"].size(); ++k) {
    const std::string a = exp["pairs"][k][0], b = exp["pairs"][k][1];
    INFO("pair " << k);
    CHECK(ids_of(cross_encoder_ids(m, a, b, nullptr, 0)) == exp["pair_ids"][k].get<std::vector<int32_t>>());
    CHECK(ids_of(cross_encoder_ids(m, a, b, &tmpl, 0)) == exp["template_ids"][k].get<std::vector<int32_t>>());
  }
  for (size_t k = 0; k < exp["truncated_pairs"].size(); ++k) {
    INFO("truncated pair " << k);
    CHECK(ids_of(cross_encoder_ids(m, exp["truncated_pairs"][k][0], exp["truncated_pairs"][k][1], nullptr, keep)) ==
          exp["truncated_ids"][k].get<std::vector<int32_t>>());
  }
  m.classifier->pair_separator = false;  // use_sep_token false: one text
  for (size_t k = 0; k < exp["pairs"].size(); ++k)
    CHECK(ids_of(cross_encoder_ids(m, exp["pairs"][k][0], exp["pairs"][k][1], nullptr, 0)) ==
          exp["concat_ids"][k].get<std::vector<int32_t>>());
  // Two special tokens leave no room in 2.
  m.classifier->pair_separator = true;
  const auto refused = cross_encoder_ids(m, "a", "b", nullptr, 2);
  REQUIRE(std::holds_alternative<std::string>(refused));
  CHECK(std::get<std::string>(refused) ==
        "truncate_prompt_tokens 2 leaves no room for text beside the tokenizer's 2 special tokens");

  // A tokenizer without specials in its pair template puts the two texts' ids side by side.
  const ModelBundle q = open_model(model_dir("tiny-qwen3-classifier").string());
  CHECK(q.pair_template.lead.empty());
  CHECK(q.pair_template.middle.empty());
  CHECK(q.pair_template.tail.empty());
}

TEST_CASE("cross-encoder: use_sep_token and use_pad_token say how a pair is encoded", "[classify][model]") {
  auto separator = [](const std::function<void(json&)>& edit) {
    return open_model(test::edited_model("tiny-llama-reward", edit, "cross_encoder", "classify").string())
        .classifier->pair_separator;
  };
  CHECK(separator([](json&) {}));
  CHECK_FALSE(separator([](json& c) { c["use_sep_token"] = false; }));
  CHECK_FALSE(separator([](json& c) { c["use_pad_token"] = false; }));
  CHECK(separator([](json& c) { c["use_pad_token"] = true, c["use_sep_token"] = false; }));  // the older name wins
  CHECK(test::error_of([&] { separator([](json& c) { c["use_sep_token"] = "no"; }); })
            .ends_with("config.json: 'use_sep_token' must be true or false"));
}

TEST_CASE("cross-encoder: scores and reranking are transformers' logits of the pairs", "[classify][hf][job]") {
  const json exp = pairs_expected();
  const json& pairs = exp["pairs"];
  const std::string model = model_dir("tiny-llama-reward").string();
  // One query against four documents, pairwise, raw logits, truncated, reranked, the strata format.
  const std::vector<std::string> docs = column(pairs, 1, 0, 4);
  std::string text = request("one", "/v1/score", {{"text_1", pairs[0][0]}, {"text_2", docs}, {"use_activation", false}}) +
                     request("pairwise", "/v1/score", {{"text_1", column(pairs, 0, 2, 4)}, {"text_2", column(pairs, 1, 2, 4)}}) +
                     request("cut", "/v1/score", {{"text_1", pairs[0][0]}, {"text_2", docs}, {"activation", false},
                                                  {"truncate_prompt_tokens", exp["truncate_prompt_tokens"]}}) +
                     request("rerank", "/v1/rerank", {{"query", pairs[4][0]}, {"documents", column(pairs, 1, 4, 4)},
                                                      {"top_n", 3}});
  const JobRun run = run_job(model, text);
  CHECK(run.summary.errors == 0);
  CHECK_THAT(run.log, Catch::Contains("score and rerank pairs: tokenizer(text_1, text_2), the tokenizer's pair template"));

  const json& one = run.lines.at("one")["response"]["body"];
  CHECK(one["object"] == "list");
  CHECK(one["id"].get<std::string>().starts_with("score-"));
  int64_t tokens = 0;
  for (size_t k = 0; k < 4; ++k) {
    CHECK(one["data"][k]["index"] == k);
    CHECK(one["data"][k]["object"] == "score");
    check_close(one["data"][k]["score"], exp["pair_logits"][k]);
    tokens += int64_t(exp["pair_ids"][k].size());
  }
  CHECK(one["usage"]["prompt_tokens"] == tokens);
  const json& pairwise = run.lines.at("pairwise")["response"]["body"]["data"];
  for (size_t k = 0; k < 4; ++k) check_close(pairwise[k]["score"], sigmoid(exp["pair_logits"][2 + k]));
  const json& cut = run.lines.at("cut")["response"]["body"]["data"];
  for (size_t k = 0; k < 4; ++k) check_close(cut[k]["score"], exp["truncated_logits"][k]);

  // Reranked: the documents by descending sigmoid of their logits, the best three, with their text.
  const json& results = run.lines.at("rerank")["response"]["body"]["results"];
  std::vector<std::pair<double, size_t>> want;
  for (size_t d = 0; d < 4; ++d) want.emplace_back(sigmoid(exp["pair_logits"][4 + d]), d);
  std::sort(want.rbegin(), want.rend());
  REQUIRE(results.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(results[i]["index"] == want[i].second);
    check_close(results[i]["relevance_score"], want[i].first);
    CHECK(results[i]["document"]["text"] == pairs[4 + want[i].second][1]);
  }

  // The strata format's lines, and the pairs rendered by a score template (--chat-template).
  const fs::path tmpl = test::write_file(test::temp_dir("cross_encoder") / "score.jinja", exp["score_template"]);
  const std::string strata = json{{"id", "s"}, {"text_1", pairs[0][0]}, {"text_2", docs}, {"use_activation", false}}.dump() +
                             "\n" + json{{"id", "r"}, {"query", pairs[0][0]}, {"documents", docs}}.dump() + "\n";
  const JobRun templated = run_job(model, strata, {}, tmpl);
  CHECK_THAT(templated.log, Catch::Contains("score and rerank pairs: rendered by the score template " + tmpl.string()));
  const json& s = templated.lines.at("\"s\"");
  for (size_t k = 0; k < 4; ++k) check_close(s["scores"][k], exp["template_logits"][k]);
  int64_t template_tokens = 0;
  for (size_t k = 0; k < 4; ++k) template_tokens += int64_t(exp["template_ids"][k].size());
  CHECK(s["prompt_tokens"] == template_tokens);
  const json& r = templated.lines.at("\"r\"")["results"];
  REQUIRE(r.size() == 4);
  for (size_t i = 0; i + 1 < 4; ++i) CHECK(r[i]["relevance_score"].get<double>() >= r[i + 1]["relevance_score"].get<double>());
  CHECK_FALSE(r[0].contains("document"));
  check_close(r[0]["relevance_score"],
              sigmoid(exp["template_logits"][r[0]["index"].get<size_t>()].get<double>()));
}

TEST_CASE("cross-encoder: the original Qwen3-Reranker through --hf-overrides gives its model card's P(yes)",
          "[classify][hf][job]") {
  const json exp = read_json(model_dir("tiny-qwen3-reranker") / "expected.json");
  const std::string model = model_dir("tiny-qwen3-reranker").string();
  const ModelBundle b = open_model(model, {}, {}, kQwen3Reranker);
  REQUIRE(b.classifier);
  CHECK(b.config.num_labels == 1);
  CHECK_FALSE(b.config.lm_head);
  CHECK(b.classifier->labels == std::vector<std::string>{"LABEL_0"});
  CHECK_FALSE(b.classifier->pair_separator);  // an LLM as a reranker reads one text
  CHECK(b.classifier->made_from == "from_2_way_softmax of model.embed_tokens.weight's rows \"no\" (" +
                                       std::to_string(exp["no_id"].get<int>()) + "), \"yes\" (" +
                                       std::to_string(exp["yes_id"].get<int>()) + ")");
  for (size_t k = 0; k < exp["ids"].size(); ++k)
    CHECK(ids_of(cross_encoder_ids(b, exp["text_1"][k], exp["text_2"][k], nullptr, 0)) ==
          exp["ids"][k].get<std::vector<int32_t>>());

  const JobRun run = run_job(model, request("s", "/v1/score", {{"text_1", exp["text_1"]}, {"text_2", exp["text_2"]}}),
                             kQwen3Reranker);
  CHECK_THAT(run.log, Catch::Contains("classifier head: from_2_way_softmax of model.embed_tokens.weight's rows"));
  CHECK_THAT(run.log, Catch::Contains("score and rerank pairs: text_1 + text_2, one text"));
  const json& data = run.lines.at("s")["response"]["body"]["data"];
  REQUIRE(data.size() == exp["scores"].size());
  for (size_t k = 0; k < data.size(); ++k) check_close(data[k]["score"], exp["scores"][k]);

  // Without the overrides it is a generative model, whose last states are not scores.
  const JobRun plain = run_job(model, request("s", "/v1/score", {{"text_1", "a"}, {"text_2", "b"}}));
  CHECK_THAT(plain.lines.at("s")["error"]["message"].get<std::string>(),
             Catch::Contains("or --hf-overrides with classifier_from_token if it is a reranker"));
}

TEST_CASE("cross-encoder: strata run --hf-overrides scores with the original Qwen3-Reranker", "[classify][cli]") {
  const json exp = read_json(model_dir("tiny-qwen3-reranker") / "expected.json");
  const fs::path dir = test::temp_dir("cross_encoder");
  const fs::path in = test::write_file(
      dir / "cli.jsonl", json{{"id", 1}, {"query", exp["text_1"][0]}, {"documents", {exp["text_2"][0]}}}.dump() + "\n");
  const fs::path out = dir / "cli_out.jsonl";
  fs::remove(out);
  const auto r = test::run_strata("run --model " + model_dir("tiny-qwen3-reranker").string() + " --prompts " +
                                  in.string() + " --out " + out.string() + " --no-progress --hf-overrides '" +
                                  kQwen3Reranker + "'");
  INFO(r.output);
  REQUIRE(r.code == 0);
  const json line = lines_by_id(out).at("1");
  check_close(line["results"][0]["relevance_score"], exp["scores"][0]);
  // Bad overrides fail before anything runs, naming the option.
  const auto bad = test::run_strata("run --model " + model_dir("tiny-qwen3-reranker").string() + " --prompts " +
                                    in.string() + " --out " + out.string() + " --hf-overrides '[1]'");
  CHECK(bad.code != 0);
  CHECK_THAT(bad.output, Catch::Contains("--hf-overrides must be a JSON object of config.json keys, got array"));
}

TEST_CASE("cross-encoder: requests and overrides that cannot be served", "[classify][job]") {
  // A classifier of three labels classifies; it does not score pairs.
  const JobRun multi = run_job(model_dir("tiny-qwen3-classifier").string(),
                               request("s", "/v1/score", {{"text_1", "a"}, {"text_2", "b"}}) +
                                   request("r", "/v1/rerank", {{"query", "a"}, {"documents", {"b"}}}));
  CHECK(multi.lines.at("s")["error"]["message"] ==
        "scores of a classifier need one label (a cross-encoder's relevance); tiny-qwen3-classifier has 3 labels: "
        "classify instead");
  CHECK(multi.lines.at("r")["error"]["code"] == "unsupported_model");
  // A one-label classifier answers scores, not embeddings; truncation must leave room for text.
  const JobRun reward = run_job(model_dir("tiny-llama-reward").string(),
                                request("e", "/v1/embeddings", {{"input", "a"}}) +
                                    request("cut", "/v1/score", {{"text_1", "a"}, {"text_2", {"b", "c"}},
                                                                 {"truncate_prompt_tokens", 2}}) +
                                    request("flag", "/v1/rerank", {{"query", "a"}, {"documents", {"b"}},
                                                                   {"use_activation", 1}}));
  CHECK(reward.lines.at("e")["error"]["message"] ==
        "tiny-llama-reward is a one-label sequence classifier (a cross-encoder): it answers classification, score "
        "and rerank requests only (/v1/classify, /v1/score, /v1/rerank; the strata format's 'classify', 'text_1' "
        "and 'query' lines)");
  CHECK(reward.lines.at("cut")["error"]["message"] ==
        "body.text_1 and body.text_2[0]: truncate_prompt_tokens 2 leaves no room for text beside the tokenizer's 2 "
        "special tokens");
  CHECK(reward.lines.at("flag")["error"]["message"] == "body.use_activation must be true or false, got 1");

  // Overrides that do not make a classifier, or cannot be read.
  const std::string reranker = model_dir("tiny-qwen3-reranker").string();
  auto load_error = [&](const std::string& overrides) {
    return test::error_of([&] { open_model(reranker, {}, {}, overrides); });
  };
  const std::string config = reranker + "/config.json";
  CHECK(load_error("{") .starts_with("--hf-overrides: invalid JSON: "));
  CHECK(load_error(R"({"classifier_from_token": ["no", "yes"], "method": "from_2_way_softmax"})") ==
        config + ": classifier_from_token makes a sequence classifier of a causal LM, but architectures is "
                 "Qwen3ForCausalLM; set it to the ForSequenceClassification class as well (--hf-overrides "
                 "'{\"architectures\": [\"Qwen3ForSequenceClassification\"], ...}')");
  const std::string arch = R"("architectures": ["Qwen3ForSequenceClassification"], )";
  CHECK(load_error("{" + arch + R"("is_original_qwen3_reranker": true})") ==
        config + ": is_original_qwen3_reranker needs 'classifier_from_token', a list of token strings (Qwen3-Reranker: "
                 "[\"no\", \"yes\"])");
  CHECK(load_error("{" + arch + R"("classifier_from_token": ["no"], "method": "from_2_way_softmax"})") ==
        config + ": from_2_way_softmax needs two classifier_from_token entries ([false, true] tokens, as [\"no\", "
                 "\"yes\"]), got 1");
  CHECK(load_error("{" + arch + R"("classifier_from_token": ["no", "yes"], "method": "softmax"})") ==
        config + ": method 'softmax' is not one of from_2_way_softmax, no_post_processing");
  CHECK(load_error("{" + arch + R"("classifier_from_token": ["no", "maybe"], "method": "from_2_way_softmax"})") ==
        config + ": classifier_from_token names \"maybe\", which is not a token of the tokenizer");
  CHECK(test::error_of([] { open_model("dummy:opt-125m", {}, {}, "{}"); }) ==
        "--hf-overrides edits a model directory's config.json; dummy:opt-125m is not a model directory");
  // no_post_processing: a label per token, each its row of the LM head.
  const ModelBundle two = open_model(reranker, {}, {}, "{" + arch + R"("classifier_from_token": ["no", "yes"], "method": "no_post_processing"})");
  CHECK(two.classifier->labels == std::vector<std::string>{"LABEL_0", "LABEL_1"});
  CHECK(two.classifier->activation == ClassifierActivation::Softmax);
}

// fp16 on the GPU (the emulated backend in CI): P(yes) of the reranker within twice transformers'
// own fp16 distance from its fp32 value.
TEST_CASE("CUDA: the Qwen3-Reranker's P(yes) within twice transformers' own fp16 error", "[classify][hf][cuda]") {
  if (!cuda_available()) {
    WARN("no GPU: skipped");
    return;
  }
  const json exp = read_json(model_dir("tiny-qwen3-reranker") / "expected.json");
  std::unique_ptr<Backend> backend = make_cuda_backend(0, DType::F16);
  const ModelBundle b = open_model(model_dir("tiny-qwen3-reranker").string(), {}, {}, kQwen3Reranker);
  Transformer model(b.config, load_model_weights(b.config, *b.weights, *backend), *backend);
  Embedder e(model, 64);
  const auto pooled = e.embed(exp["ids"].get<std::vector<std::vector<int32_t>>>(), PoolingKind::Last);
  const double allowed = 2 * exp["fp16_vs_fp32_max_abs_diff"].get<double>();
  for (size_t k = 0; k < pooled.size(); ++k) {
    const double got = b.classifier->activate(b.classifier->logits(pooled[k]))[0];
    INFO("pair " << k << ": got " << got << ", want " << exp["scores"][k] << ", allowed " << allowed);
    CHECK(std::fabs(got - exp["scores"][k].get<double>()) <= allowed);
  }
}
