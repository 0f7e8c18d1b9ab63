// Embeddings (runtime/embedder.h, job/embeddings.h, model/pooling.h): the vectors
// sentence-transformers computes for the tiny embedding models (tests/fixtures/embeddings/
// make_embedding_fixtures.py), through the Embedder and through `strata run` in both formats, the
// pooling configs, and the refusals.
#include "test_paths.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_support.h"
#include "error_text.h"
#include "pooled_job.h"
#include "policy_fixtures.h"
#include "strata/backend/backend.h"
#include "strata/core/error.h"
#include "strata/job/batch_job.h"
#include "strata/job/embeddings.h"
#include "strata/job/perplexity.h"
#include "strata/job/prompts.h"
#include "strata/offload/engine.h"
#include "strata/model/model_loader.h"
#include "strata/runtime/embedder.h"
#include "strata/runtime/model_weights.h"
#include "temp_files.h"

using namespace strata;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const char* const kModels[] = {"tiny-qwen3-embedding", "tiny-llama-embedding"};

fs::path model_dir(const std::string& name) { return fs::path(STRATA_FIXTURES_DIR) / "embeddings" / name; }

json expected(const std::string& name) {
  std::ifstream in(model_dir(name) / "expected.json");
  REQUIRE(in.good());
  return json::parse(in);
}

std::vector<std::vector<int32_t>> expected_ids(const json& exp) {
  return exp["ids"].get<std::vector<std::vector<int32_t>>>();
}

// fp32 against fp32: summation order only.
void check_close(const std::vector<float>& got, const json& want, float tolerance_scale = 1.0f) {
  REQUIRE(got.size() == want.size());
  float scale = 0, worst = 0;
  for (size_t j = 0; j < got.size(); ++j) {
    scale = std::max(scale, std::fabs(want[j].get<float>()));
    worst = std::max(worst, std::fabs(got[j] - want[j].get<float>()));
  }
  INFO("worst |difference| " << worst << " over values up to " << scale);
  CHECK(worst <= tolerance_scale * (2e-5f + 1e-5f * scale));
}

struct Loaded {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Transformer> model;
};

Loaded load(const std::string& name, const std::string& device = "cpu") {
  Loaded l;
  l.backend = device == "cpu" ? make_cpu_backend(2) : make_cuda_backend(0, DType::F16);
  ModelBundle b = open_model(model_dir(name).string());
  l.model = std::make_unique<Transformer>(b.config, load_model_weights(b.config, *b.weights, *l.backend), *l.backend);
  return l;
}

// The vectors as the job writes them: cut and normalized as sentence-transformers' Normalize does.
std::vector<float> finished(std::vector<float> v, bool normalize, int dimensions = 0) {
  finish_embedding(v, dimensions, normalize);
  return v;
}

fs::path write(const std::string& name, const std::string& text) {
  return test::write_file(test::temp_dir("embeddings") / name, text);
}

std::vector<json> read_lines(const fs::path& p) {
  std::ifstream in(p);
  std::vector<json> out;
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
  return out;
}

std::map<std::string, json> by_id(const std::vector<json>& lines) {
  std::map<std::string, json> m;
  for (const json& l : lines) m[l.contains("custom_id") ? l["custom_id"].get<std::string>() : l["id"].dump()] = l;
  return m;
}

std::string embeddings_line(const std::string& id, const json& body) {
  return test::batch_request(id, "/v1/embeddings", body);
}

JobOptions job(const std::string& model, const fs::path& in, const fs::path& out) { return test::pooled_job(model, in, out); }

std::vector<float> floats_of(const json& v) { return v.get<std::vector<float>>(); }

double cosine_of(const json& exp, size_t a, size_t b) { return exp["cosine"][a][b].get<double>(); }

std::vector<float> from_base64(const std::string& s) {
  auto value = [](char c) -> uint32_t {
    if (c >= 'A' && c <= 'Z') return uint32_t(c - 'A');
    if (c >= 'a' && c <= 'z') return uint32_t(c - 'a' + 26);
    if (c >= '0' && c <= '9') return uint32_t(c - '0' + 52);
    return c == '+' ? 62u : 63u;
  };
  std::string bytes;
  for (size_t i = 0; i + 3 < s.size(); i += 4) {
    const uint32_t n = value(s[i]) << 18 | value(s[i + 1]) << 12 | (s[i + 2] == '=' ? 0 : value(s[i + 2]) << 6) |
                       (s[i + 3] == '=' ? 0 : value(s[i + 3]));
    bytes += char(n >> 16);
    if (s[i + 2] != '=') bytes += char((n >> 8) & 255);
    if (s[i + 3] != '=') bytes += char(n & 255);
  }
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

}  // namespace

TEST_CASE("embeddings: the Embedder pools as sentence-transformers, packed or chunked alike", "[embeddings][hf]") {
  for (const char* name : kModels) {
    SECTION(name) {
      const json exp = expected(name);
      const auto ids = expected_ids(exp);
      Loaded l = load(name);
      // 4096: every text in one step; 16: several steps, the longest (46 tokens) in chunks that
      // read their earlier keys from the cache; 1: one token a step.
      for (const int64_t budget : {int64_t(4096), int64_t(16), int64_t(1)}) {
        INFO("step budget " << budget);
        Embedder e(*l.model, budget);
        for (const auto& [mode, kind] : {std::pair{"mean", PoolingKind::Mean}, std::pair{"lasttoken", PoolingKind::Last},
                                         std::pair{"cls", PoolingKind::Cls}}) {
          INFO("pooling " << mode);
          const auto vectors = e.embed(ids, kind);
          REQUIRE(vectors.size() == ids.size());
          for (size_t i = 0; i < ids.size(); ++i) {
            INFO("text " << i);
            check_close(vectors[i], exp["poolings"][mode][i]);
            check_close(finished(vectors[i], true), exp["poolings"][std::string(mode) + "+normalize"][i]);
          }
        }
        if (budget == 1) CHECK(e.stats().steps >= int64_t(ids.back().size()));
      }
    }
  }
}

TEST_CASE("embeddings: a text ends as Hugging Face's tokenizer ends it, the job's vectors are the model's pooling",
          "[embeddings][hf][job]") {
  for (const char* name : kModels) {
    SECTION(name) {
      const json exp = expected(name);
      const auto ids = expected_ids(exp);
      std::string text;
      for (size_t i = 0; i < exp["texts"].size(); ++i) {
        text += embeddings_line("t" + std::to_string(i), {{"model", "m"}, {"input", exp["texts"][i]}});
        text += embeddings_line("ids" + std::to_string(i), {{"input", ids[i]}});  // as given: no tokens added
      }
      text += embeddings_line("all", {{"input", exp["texts"]}, {"encoding_format", "base64"}});
      const fs::path out = test::temp_dir("embeddings") / (std::string(name) + ".jsonl");
      std::ostringstream log;
      const JobSummary s = run_batch_job(job(model_dir(name).string(), write("texts.jsonl", text), out), log);
      INFO(log.str());
      CHECK_THAT(log.str(), Catch::Contains(model_dir(name).string() + "/modules.json"));
      const auto lines = by_id(read_lines(out));
      REQUIRE(lines.size() == 2 * ids.size() + 1);
      int64_t tokens = 0;
      for (const auto& i : ids) tokens += int64_t(i.size());
      CHECK(s.embedded_inputs == 3 * int64_t(ids.size()));
      CHECK(s.embedded_tokens == 3 * tokens);
      for (size_t i = 0; i < ids.size(); ++i) {
        INFO("text " << i);
        const json& body = lines.at("t" + std::to_string(i))["response"]["body"];
        CHECK(body["object"] == "list");
        CHECK(body["model"] == "m");
        CHECK(body["data"][0]["object"] == "embedding");
        CHECK(body["data"][0]["index"] == 0);
        // The tokens Hugging Face's tokenizer makes with its special tokens (Qwen3's appended EOS,
        // Llama's BOS): the usage counts them, and the same ids given as ids embed the same.
        CHECK(body["usage"]["prompt_tokens"] == ids[i].size());
        CHECK(body["usage"]["total_tokens"] == ids[i].size());
        check_close(floats_of(body["data"][0]["embedding"]), exp["model_pooling"][i]);
        // The same ids given as ids, and the base64 (little-endian float32) of the batched request:
        // the same vectors, packed into other steps (the CPU GEMM's sums may differ in the last bits).
        check_close(floats_of(lines.at("ids" + std::to_string(i))["response"]["body"]["data"][0]["embedding"]),
                    exp["model_pooling"][i]);
        const json& all = lines.at("all")["response"]["body"];
        CHECK(all["data"][i]["index"] == i);
        check_close(from_base64(all["data"][i]["embedding"].get<std::string>()), exp["model_pooling"][i]);
      }
      CHECK(lines.at("all")["response"]["body"]["usage"]["prompt_tokens"] == tokens);
    }
  }
}

TEST_CASE("embeddings: truncate_prompt_tokens keeps a text's last tokens and its special tokens, as vLLM",
          "[embeddings][hf][job]") {
  for (const char* name : kModels) {
    SECTION(name) {
      const json exp = expected(name);
      const int k = exp["truncate_prompt_tokens"].get<int>();
      std::string text;
      for (size_t i = 0; i < exp["texts"].size(); ++i) {
        text += embeddings_line("t" + std::to_string(i), {{"input", exp["texts"][i]}, {"truncate_prompt_tokens", k}});
        // Ids given are cut to their last k; -1 is the context, which cuts nothing here.
        text += embeddings_line("ids" + std::to_string(i), {{"input", exp["ids"][i]}, {"truncate_prompt_tokens", k}});
        text += embeddings_line("ctx" + std::to_string(i), {{"input", exp["texts"][i]}, {"truncate_prompt_tokens", -1}});
      }
      text += embeddings_line("past", {{"input", "a"}, {"truncate_prompt_tokens", 257}});
      text += embeddings_line("specials", {{"input", "a"}, {"truncate_prompt_tokens", 1}});
      text += embeddings_line("zero", {{"input", "a"}, {"truncate_prompt_tokens", 0}});
      const fs::path out = test::temp_dir("embeddings") / (std::string(name) + "_truncate.jsonl");
      std::ostringstream log;
      run_batch_job(job(model_dir(name).string(), write("truncate.jsonl", text), out), log);
      const auto lines = by_id(read_lines(out));
      for (size_t i = 0; i < exp["texts"].size(); ++i) {
        INFO("text " << i);
        const json& body = lines.at("t" + std::to_string(i))["response"]["body"];
        CHECK(body["usage"]["prompt_tokens"] == exp["truncated_ids"][i].size());
        check_close(floats_of(body["data"][0]["embedding"]), exp["truncated"][i]);
        const auto& ids = exp["ids"][i];
        CHECK(lines.at("ids" + std::to_string(i))["response"]["body"]["usage"]["prompt_tokens"] ==
              std::min<size_t>(ids.size(), size_t(k)));
        check_close(floats_of(lines.at("ctx" + std::to_string(i))["response"]["body"]["data"][0]["embedding"]),
                    exp["model_pooling"][i]);
      }
      CHECK(lines.at("past")["error"]["message"] == "body.truncate_prompt_tokens 257 exceeds the model's context of 256");
      CHECK(lines.at("specials")["error"]["message"] ==
            "body.truncate_prompt_tokens 1 leaves no room for text beside the tokenizer's 1 special tokens");
      CHECK(lines.at("zero")["error"]["message"] ==
            "body.truncate_prompt_tokens must be -1 (the model's context) or at least 1, got 0");
    }
  }
}

TEST_CASE("embeddings: /v1/score and /v1/rerank are sentence-transformers' cosine similarities", "[embeddings][hf][job]") {
  for (const char* name : kModels) {
    SECTION(name) {
      const json exp = expected(name);
      const json& texts = exp["texts"];
      const json& cosine = exp["cosine"];
      const json rest = {texts[1], texts[2], texts[3], texts[4]};
      auto line = [](const std::string& id, const std::string& url, const json& body) {
        return json{{"custom_id", id}, {"method", "POST"}, {"url", url}, {"body", body}}.dump() + "\n";
      };
      const std::string text =
          line("one", "/v1/score", {{"model", "m"}, {"text_1", texts[0]}, {"text_2", rest}}) +
          line("pairs", "/v1/score", {{"text_1", {texts[0], texts[2]}}, {"text_2", {texts[1], texts[3]}}}) +
          line("rerank", "/v1/rerank", {{"query", texts[2]}, {"documents", rest}, {"top_n", 3}}) +
          line("rerank-all", "/v1/rerank", {{"query", texts[0]}, {"documents", {texts[4], texts[1]}}});
      const fs::path out = test::temp_dir("embeddings") / (std::string(name) + "_score.jsonl");
      std::ostringstream log;
      run_batch_job(job(model_dir(name).string(), write("score.jsonl", text), out), log);
      INFO(log.str());
      const auto lines = by_id(read_lines(out));
      auto near = [](const json& got, const json& want) {
        INFO(got << " against " << want);
        CHECK(std::fabs(got.get<double>() - want.get<double>()) <= 5e-5);
      };
      const json& one = lines.at("one")["response"]["body"];
      CHECK(one["object"] == "list");
      CHECK(one["model"] == "m");
      REQUIRE(one["data"].size() == 4);
      for (size_t k = 0; k < 4; ++k) {
        CHECK(one["data"][k]["index"] == k);
        CHECK(one["data"][k]["object"] == "score");
        near(one["data"][k]["score"], cosine[0][k + 1]);
      }
      int64_t tokens = 0;
      for (const json& ids : exp["ids"]) tokens += int64_t(ids.size());
      CHECK(one["usage"]["prompt_tokens"] == tokens);
      const json& pairs = lines.at("pairs")["response"]["body"]["data"];
      REQUIRE(pairs.size() == 2);
      near(pairs[0]["score"], cosine[0][1]);
      near(pairs[1]["score"], cosine[2][3]);
      // Rerank: the documents (texts 1-4) by descending similarity to text 2, the best 3.
      std::vector<std::pair<double, size_t>> want;
      for (size_t d = 0; d < 4; ++d) want.emplace_back(cosine[2][d + 1].get<double>(), d);
      std::sort(want.begin(), want.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
      const json& results = lines.at("rerank")["response"]["body"]["results"];
      REQUIRE(results.size() == 3);
      for (size_t k = 0; k < 3; ++k) {
        CHECK(results[k]["index"] == want[k].second);
        near(results[k]["relevance_score"], json(want[k].first));
        CHECK(results[k]["document"]["text"] == rest[want[k].second]);
      }
      const json& all = lines.at("rerank-all")["response"]["body"];
      REQUIRE(all["results"].size() == 2);
      CHECK(all["usage"]["total_tokens"] == exp["ids"][0].size() + exp["ids"][4].size() + exp["ids"][1].size());
    }
  }
}

TEST_CASE("embeddings: score and rerank lines in the strata format, and what is refused", "[embeddings][job]") {
  const json exp = expected("tiny-qwen3-embedding");
  const json& texts = exp["texts"];
  const std::string text = json{{"id", "s"}, {"text_1", texts[0]}, {"text_2", texts[1]}}.dump() + "\n" +
                           json{{"id", "r"}, {"query", texts[0]}, {"documents", {texts[1], texts[2]}}}.dump() + "\n";
  const fs::path out = test::temp_dir("embeddings") / "strata_score.jsonl";
  std::ostringstream log;
  run_batch_job(job(model_dir("tiny-qwen3-embedding").string(), write("strata_score.jsonl", text), out), log);
  const auto lines = by_id(read_lines(out));
  REQUIRE(lines.at("\"s\"")["scores"].size() == 1);
  CHECK(std::fabs(lines.at("\"s\"")["scores"][0].get<double>() - cosine_of(exp, 0, 1)) <= 5e-5);
  const json& results = lines.at("\"r\"")["results"];
  REQUIRE(results.size() == 2);
  CHECK(results[0]["index"] == (cosine_of(exp, 0, 1) > cosine_of(exp, 0, 2) ? 0 : 1));
  CHECK_FALSE(results[0].contains("document"));  // the strata format leaves the text out

  auto error = [&](const json& line) {
    return test::error_of([&] { read_prompts(write("bad_score.jsonl", line.dump() + "\n"), {}); });
  };
  const std::string bad = (test::temp_dir("embeddings") / "bad_score.jsonl").string() + ":1: ";
  CHECK(error({{"id", 1}, {"text_1", {"a", "b"}}, {"text_2", {"c"}}}) ==
        bad + "field 'text_1' holds 2 texts and field 'text_2' 1: give one text_1 for many text_2, or as many of "
              "each (pairs)");
  CHECK(error({{"id", 1}, {"text_1", "a"}}) == bad + "field 'text_2' is required for scores");
  CHECK(error({{"id", 1}, {"query", {"a"}}, {"documents", {"b"}}}) == bad + "field 'query' must be a string, got [\"a\"]");
  CHECK(error({{"id", 1}, {"query", "a"}, {"documents", json::array()}}) == bad + "field 'documents' is an empty array");
  CHECK(error({{"id", 1}, {"query", "a"}, {"documents", {"b", ""}}}) == bad + "field 'documents[1]' is an empty string");
  CHECK(error({{"id", 1}, {"query", "a"}, {"documents", {"b"}}, {"top_n", -1}}) ==
        bad + "field 'top_n' must be an integer >= 0 (0: every document), got -1");
  CHECK(error({{"id", 1}, {"text_1", "a"}, {"text_2", "b"}, {"input", "c"}}) ==
        bad + "give 'input' (an embedding) or 'text_1', not both");

  // A generative model's last states are not embeddings: scores over them are refused.
  const fs::path gen_out = test::temp_dir("embeddings") / "generative_score.jsonl";
  const std::string oa = json{{"custom_id", "g"}, {"method", "POST"}, {"url", "/v1/rerank"},
                              {"body", {{"query", "a"}, {"documents", {"b"}}}}}.dump() + "\n";
  run_batch_job(job((fs::path(STRATA_FIXTURES_DIR) / "models" / "tiny-qwen3").string(), write("gen.jsonl", oa), gen_out),
                log);
  const json g = read_lines(gen_out).at(0);
  CHECK(g["error"]["code"] == "unsupported_model");
  CHECK_THAT(g["error"]["message"].get<std::string>(), Catch::StartsWith("reranking compare embeddings, and tiny-qwen3 "
                                                                         "is a generative model with no pooling config"));
}

TEST_CASE("embeddings: a GGUF embedding model's pooling_type and add_eos_token", "[embeddings][gguf][job]") {
  const json exp = expected("tiny-qwen3-embedding");
  const fs::path gguf = fs::path(STRATA_FIXTURES_DIR) / "embeddings" / "tiny_qwen3_embedding.gguf";
  const ModelBundle b = open_model(gguf.string());
  REQUIRE(b.pooling);
  CHECK(b.pooling->kind == PoolingKind::Last);
  CHECK(b.pooling->normalize);
  CHECK(b.append_ids == std::vector<int32_t>{0});
  std::string text;
  for (size_t i = 0; i < exp["texts"].size(); ++i)
    text += json{{"id", i}, {"input", exp["texts"][i]}}.dump() + "\n";
  const fs::path out = test::temp_dir("embeddings") / "gguf_out.jsonl";
  std::ostringstream log;
  run_batch_job(job(gguf.string(), write("gguf.jsonl", text), out), log);
  INFO(log.str());
  CHECK_THAT(log.str(), Catch::Contains("last pooling, normalized (" + gguf.string() + " (qwen3.pooling_type))"));
  const auto lines = by_id(read_lines(out));
  REQUIRE(lines.size() == exp["texts"].size());
  for (size_t i = 0; i < exp["texts"].size(); ++i) {
    INFO("text " << i);
    CHECK(lines.at(std::to_string(i))["prompt_tokens"] == exp["ids"][i].size());
    check_close(floats_of(lines.at(std::to_string(i))["embedding"]), exp["model_pooling"][i]);
  }
}

TEST_CASE("embeddings: --pooling, --normalize and the request's normalize and dimensions", "[embeddings][job]") {
  const std::string name = "tiny-qwen3-embedding";
  const json exp = expected(name);
  const std::string text = json{{"id", 1}, {"input", exp["texts"][1]}}.dump() + "\n" +
                           json{{"id", 2}, {"input", {exp["texts"][2], exp["texts"][3]}}, {"normalize", false}}.dump() +
                           "\n" + json{{"id", 3}, {"input", exp["texts"][0]}, {"dimensions", 8}}.dump() + "\n";
  const fs::path in = write("pooling.jsonl", text);
  for (const char* mode : {"mean", "last", "cls"}) {
    for (const bool normalize : {true, false}) {
      INFO("--pooling " << mode << (normalize ? " --normalize" : " --no-normalize"));
      const fs::path out = test::temp_dir("embeddings") / (std::string("pooling_") + mode + ".jsonl");
      fs::remove(out);
      JobOptions o = job(model_dir(name).string(), in, out);
      o.pooling = mode;
      o.normalize = normalize;
      std::ostringstream log;
      run_batch_job(o, log);
      const std::string key = std::string(mode) == "last" ? "lasttoken" : mode;
      const json& raw = exp["poolings"][key];
      const auto lines = by_id(read_lines(out));
      REQUIRE(lines.size() == 3);
      // The strata format: "embedding" for a string input, "embeddings" for an array.
      check_close(floats_of(lines.at("1")["embedding"]), exp["poolings"][key + (normalize ? "+normalize" : "")][1]);
      CHECK(lines.at("1")["prompt_tokens"] == exp["ids"][1].size());
      REQUIRE(lines.at("2")["embeddings"].size() == 2);
      check_close(floats_of(lines.at("2")["embeddings"][0]), raw[2]);  // the request's normalize false wins
      check_close(floats_of(lines.at("2")["embeddings"][1]), raw[3]);
      // dimensions: the first 8 values of the pooled vector, then normalized.
      std::vector<float> want = raw[0].get<std::vector<float>>();
      finish_embedding(want, 8, normalize);
      check_close(floats_of(lines.at("3")["embedding"]), want);
    }
  }
}

TEST_CASE("embeddings: a job resumes from OUT.partial, a torn last line dropped", "[embeddings][job]") {
  const json exp = expected("tiny-qwen3-embedding");
  std::string text;
  for (size_t i = 0; i < exp["texts"].size(); ++i) text += json{{"id", i}, {"input", exp["texts"][i]}}.dump() + "\n";
  const fs::path in = write("resume.jsonl", text), out = test::temp_dir("embeddings") / "resume_out.jsonl";
  fs::remove(out);
  // An earlier run finished id 1 (its line kept as written) and was cut while writing id 3.
  const std::string kept = json{{"id", 1}, {"embedding", {0.5}}, {"prompt_tokens", 7}}.dump() + "\n";
  std::ofstream(out.string() + ".partial") << kept << R"({"id": 3, "embedding": [0.1, )";
  std::ostringstream log;
  const JobSummary s = run_batch_job(job(model_dir("tiny-qwen3-embedding").string(), in, out), log);
  CHECK(s.resumed == 1);
  CHECK(s.embedded_inputs == int64_t(exp["texts"].size()) - 1);
  CHECK_FALSE(fs::exists(out.string() + ".partial"));
  const std::vector<json> lines = read_lines(out);
  REQUIRE(lines.size() == exp["texts"].size());
  CHECK(lines[0] == json::parse(kept));  // the finished line, untouched
  const auto got = by_id(lines);
  for (size_t i = 0; i < exp["texts"].size(); ++i)
    if (i != 1) check_close(floats_of(got.at(std::to_string(i))["embedding"]), exp["model_pooling"][i]);
}

TEST_CASE("embeddings: a job of embeddings and completions answers both", "[embeddings][job]") {
  // tiny-qwen3 has an LM head: any decoder embeds (last token, normalized, without a pooling config).
  const fs::path model = fs::path(STRATA_FIXTURES_DIR) / "models" / "tiny-qwen3";
  const std::string text =
      embeddings_line("e", {{"input", "The quick brown fox"}}) +
      json{{"custom_id", "c"}, {"method", "POST"}, {"url", "/v1/completions"},
           {"body", {{"prompt", "The quick brown fox"}, {"max_tokens", 4}, {"temperature", 0}}}}.dump() + "\n";
  const fs::path out = test::temp_dir("embeddings") / "mixed.jsonl";
  std::ostringstream log;
  const JobSummary s = run_batch_job(job(model.string(), write("mixed.jsonl", text), out), log);
  INFO(log.str());
  CHECK_THAT(log.str(), Catch::Contains("last pooling, normalized (no pooling config"));
  const auto lines = by_id(read_lines(out));
  REQUIRE(lines.size() == 2);
  const std::vector<float> v = floats_of(lines.at("e")["response"]["body"]["data"][0]["embedding"]);
  CHECK(v.size() == 64);
  double norm = 0;
  for (float x : v) norm += double(x) * x;
  CHECK(std::sqrt(norm) == Approx(1.0).epsilon(1e-5));
  CHECK(lines.at("c")["response"]["body"]["usage"]["completion_tokens"] == 4);
  CHECK(s.generated_tokens == 4);
  CHECK(s.embedded_inputs == 1);
  // --ordered: the lines in input order whatever finishes first; a shard answers its own ids only.
  const fs::path ordered = test::temp_dir("embeddings") / "mixed_ordered_out.jsonl";
  JobOptions o = job(model.string(), write("mixed_ordered.jsonl", text + embeddings_line("e2", {{"input", "fox"}})),
                     ordered);
  o.ordered = true;
  run_batch_job(o, log);
  std::vector<std::string> order;
  for (const json& l : read_lines(ordered)) order.push_back(l["custom_id"]);
  CHECK(order == std::vector<std::string>{"e", "c", "e2"});
  // The lines without their "created" (each run's start time).
  auto timeless = [](json l) {
    l["response"]["body"].erase("created");
    return l;
  };
  std::vector<json> all;
  for (const json& l : read_lines(ordered)) all.push_back(timeless(l));
  size_t in_shards = 0;
  for (const std::string shard : {"0/2", "1/2"}) {
    const fs::path part = test::temp_dir("embeddings") / ("mixed_shard" + std::to_string(in_shards) + ".jsonl");
    o.out = part;
    o.shard = shard;
    run_batch_job(o, log);
    for (const json& l : read_lines(part)) {
      ++in_shards;
      CHECK(std::find(all.begin(), all.end(), timeless(l)) != all.end());  // the whole job's answer
    }
  }
  CHECK(in_shards == all.size());
}

TEST_CASE("embeddings: requests that cannot be served", "[embeddings][job]") {
  const std::string name = "tiny-qwen3-embedding";
  const std::string long_text(600, 'x');  // past the context of 256 tokens
  const std::string text =
      embeddings_line("dims", {{"input", "a"}, {"dimensions", 65}}) +
      embeddings_line("long", {{"input", {"fine", long_text}}}) +
      embeddings_line("vocab", {{"input", {1, 2, 1000}}}) + embeddings_line("empty", {{"input", ""}}) +
      embeddings_line("none", json::object()) + embeddings_line("mixed", {{"input", {"a", 1}}}) +
      embeddings_line("format", {{"input", "a"}, {"encoding_format", "int8"}}) +
      embeddings_line("norm", {{"input", "a"}, {"normalize", "yes"}}) +
      embeddings_line("zero", {{"input", "a"}, {"dimensions", 0}}) +
      embeddings_line("many", {{"input", std::vector<std::string>(2049, "a")}}) +
      json{{"custom_id", "gen"}, {"method", "POST"}, {"url", "/v1/completions"}, {"body", {{"prompt", "a"}}}}.dump() +
      "\n" + embeddings_line("ok", {{"input", "a"}});
  const fs::path out = test::temp_dir("embeddings") / "errors.jsonl";
  std::ostringstream log;
  const JobSummary s = run_batch_job(job(model_dir(name).string(), write("errors.jsonl", text), out), log);
  CHECK(s.errors == 11);
  const auto lines = by_id(read_lines(out));
  auto error = [&](const std::string& id) {
    const json& l = lines.at(id);
    CHECK(l["response"].is_null());
    return l["error"]["code"].get<std::string>() + ": " + l["error"]["message"].get<std::string>();
  };
  CHECK(error("dims") == "invalid_value: body.dimensions 65 exceeds the model's embedding width of 64");
  CHECK_THAT(error("long"), Catch::StartsWith("context_length_exceeded: body.input[1] of 601 tokens exceeds the "
                                             "model's context of 256 tokens"));
  CHECK(error("vocab") ==
        "invalid_value: body.input: token id 1000 is outside the model's vocabulary of 1000");
  CHECK(error("empty") == "invalid_value: body.input is an empty string");
  CHECK(error("none") == "missing_field: body.input is required for embeddings");
  CHECK(error("mixed") == "invalid_type: body.input[1] must be a string or an array of token ids, got 1");
  CHECK_THAT(error("format"), Catch::StartsWith("invalid_value: body.encoding_format must be \"float\" or \"base64\""));
  CHECK(error("norm") == "invalid_type: body.normalize must be true or false");
  CHECK(error("zero") == "invalid_value: body.dimensions must be at least 1, got 0");
  CHECK(error("many") == "invalid_value: body.input holds 2049 inputs; at most 2048 are allowed");
  CHECK_THAT(error("gen"), Catch::StartsWith("unsupported_model: the checkpoint has no lm_head.weight"));
  CHECK(lines.at("ok")["error"].is_null());
}

TEST_CASE("embeddings: strata lines that cannot be served fail the job naming the line", "[embeddings][job]") {
  const std::string model = model_dir("tiny-qwen3-embedding").string();
  auto job_error = [&](const std::string& text) {
    const fs::path out = test::temp_dir("embeddings") / "strata_error_out.jsonl";
    std::ostringstream log;
    const std::string e = test::error_of([&] { run_batch_job(job(model, write("strata_error.jsonl", text), out), log); });
    CHECK_FALSE(fs::exists(out));
    return e;
  };
  const std::string file = (test::temp_dir("embeddings") / "strata_error.jsonl").string();
  CHECK(job_error(R"({"id": 1, "input": "a"})" "\n" R"({"id": 2, "input": "a", "prompt": "b"})" "\n") ==
        file + ":2: give 'input' (an embedding) or 'prompt' / 'messages' (an answer), not both");
  CHECK(job_error(R"({"id": 1, "input": []})" "\n") == file + ":1: field 'input' is an empty array");
  CHECK(job_error(R"({"id": 1, "input": [5, 2000]})" "\n") ==
        file + ":1: field 'input': token id 2000 is outside the model's vocabulary of 1000");
  CHECK(job_error(R"({"id": 1, "input": ")" + std::string(300, 'x') + "\"}\n") ==
        file + ":1: field 'input' of 301 tokens exceeds the model's context of 256 tokens");
  CHECK(job_error(R"({"id": 1, "input": "a"})" "\n" R"({"id": 2, "prompt": "b"})" "\n") ==
        file + ":2: tiny-qwen3-embedding has no lm_head.weight (an embedding model): it answers 'input' lines "
               "(embeddings) only");
  // --policy runs the offloading engine, which generates only.
  const fs::path in = write("policy.jsonl", R"({"id": 1, "input": "a"})" "\n");
  JobOptions o = job(model, in, test::temp_dir("embeddings") / "policy_out.jsonl");
  o.policy = "auto";
  std::ostringstream log;
  CHECK(test::error_of([&] { run_batch_job(o, log); }) ==
        in.string() + ":1: an embeddings request: embeddings run on the resident model; drop --policy (the "
                      "offloading engine generates only)");
}

TEST_CASE("embeddings: a checkpoint without lm_head loads as an embedding model", "[embeddings][model]") {
  const ModelBundle b = open_model(model_dir("tiny-qwen3-embedding").string());
  CHECK_FALSE(b.config.lm_head);
  CHECK_FALSE(b.config.tied_embeddings);
  // The tokenizer's post-processor appends <|endoftext|> (id 0): Qwen3-Embedding's.
  CHECK(b.append_ids == std::vector<int32_t>{0});
  REQUIRE(b.pooling);
  CHECK(b.pooling->kind == PoolingKind::Last);
  CHECK(b.pooling->normalize);
  const ModelBundle llama = open_model(model_dir("tiny-llama-embedding").string());
  CHECK(llama.add_bos);
  CHECK(llama.append_ids.empty());
  REQUIRE(llama.pooling);
  CHECK(llama.pooling->kind == PoolingKind::Mean);
  CHECK_FALSE(llama.pooling->normalize);
  // A generative checkpoint keeps its head, and has no pooling config.
  const ModelBundle gen = open_model((fs::path(STRATA_FIXTURES_DIR) / "models" / "tiny-llama").string());
  CHECK(gen.config.lm_head);
  CHECK_FALSE(gen.pooling);
  // The head is what generation needs: the step says so rather than reading nothing.
  Loaded l = load("tiny-qwen3-embedding");
  KvCache cache = make_kv_cache(l.model->config(), l.model->backend(), 1, 4);
  StepBatch step{{5, 6}, {0, 1}, {0, 0}, {1}, {}};
  CHECK_THAT(test::error_of([&] { l.model->forward(step, cache); }), Catch::Contains("the checkpoint has no lm_head"));
}

TEST_CASE("embeddings: perplexity and the offloading engine refuse a model without an LM head", "[embeddings][job]") {
  const std::string model = model_dir("tiny-qwen3-embedding").string();
  PerplexityOptions p;
  p.model = model;
  p.text = write("text.txt", "The quick brown fox jumps over the lazy dog.");
  p.progress = false;
  std::ostringstream log;
  CHECK(test::error_of([&] { run_perplexity(p, log); }) ==
        model + ": the checkpoint has no lm_head.weight (an embedding model): it predicts no tokens to score");
  const ModelBundle b = open_model(model);
  auto backend = make_cpu_backend(2);
  OffloadOptions o;
  o.policy = test::policy_of(1, 1, {100, 0, 0}, {100, 0, 0}, {100, 0, 0});
  o.offload_dir = test::temp_dir("embeddings_engine");
  CHECK(test::error_of([&] { OffloadEngine(b.config, *b.weights, *backend, o, PlanShape{8, 8}); }) ==
        "tiny-qwen3-embedding: the checkpoint has no lm_head.weight (an embedding model); the offloading engine "
        "generates and scores, which needs an LM head");
}

TEST_CASE("embeddings: bidirectional models are refused at load", "[embeddings][model]") {
  json cfg;
  std::ifstream(model_dir("tiny-qwen3-embedding") / "config.json") >> cfg;
  const fs::path dir = test::temp_dir("embeddings_bidirectional");
  for (const auto& [key, value] : {std::pair{"is_causal", false}, std::pair{"use_bidirectional_attention", true}}) {
    json edited = cfg;
    edited[key] = value;
    std::ofstream(dir / "config.json") << edited.dump();
    CHECK(test::error_of([&] { config_from_hf_json(dir / "config.json"); }) ==
          (dir / "config.json").string() + ": " + key + (value ? " true" : " false") +
              ": the model attends both ways (a bidirectional embedding model); Strata's attention is causal");
  }
}

TEST_CASE("embeddings: sentence-transformers pooling configs, old and new, and what is refused", "[embeddings][model]") {
  const fs::path dir = test::temp_dir("embeddings_pooling");
  auto with = [&](const json& modules, const json& pooling) {
    fs::create_directories(dir / "1_Pooling");
    std::ofstream(dir / "modules.json") << modules.dump();
    std::ofstream(dir / "1_Pooling" / "config.json") << pooling.dump();
    return dir;
  };
  const json transformer = {{"idx", 0}, {"path", ""}, {"type", "sentence_transformers.models.Transformer"}};
  const json pool = {{"idx", 1}, {"path", "1_Pooling"}, {"type", "sentence_transformers.models.Pooling"}};
  const json norm = {{"idx", 2}, {"path", "2_Normalize"}, {"type", "sentence_transformers.models.Normalize"}};
  const json classic_cls = {{"pooling_mode_cls_token", true}, {"pooling_mode_mean_tokens", false}};
  auto p = read_pooling_config(with({transformer, pool, norm}, classic_cls));
  REQUIRE(p);
  CHECK(p->kind == PoolingKind::Cls);
  CHECK(p->normalize);
  p = read_pooling_config(with({transformer, pool}, {{"pooling_mode", "mean"}}));
  REQUIRE(p);
  CHECK(p->kind == PoolingKind::Mean);
  CHECK_FALSE(p->normalize);
  CHECK_FALSE(read_pooling_config(test::temp_dir("embeddings_no_modules")));

  const std::string modules = (dir / "modules.json").string(), config = (dir / "1_Pooling" / "config.json").string();
  auto error = [&](const json& m, const json& c) { return test::error_of([&] { read_pooling_config(with(m, c)); }); };
  const json dense = {{"idx", 2}, {"path", "2_Dense"}, {"type", "sentence_transformers.models.Dense"}};
  CHECK(error({transformer, pool, dense}, classic_cls) ==
        modules + ": module 2: sentence_transformers.models.Dense is not supported after the Pooling (Strata computes "
                  "a Transformer, one Pooling and an optional Normalize)");
  CHECK(error({transformer, pool}, {{"pooling_mode_max_tokens", true}}) ==
        config + ": pooling_mode_max_tokens is not supported (lasttoken, mean_tokens, cls_token)");
  CHECK(error({transformer, pool}, {{"pooling_mode_cls_token", true}, {"pooling_mode_mean_tokens", true}}) ==
        config + ": pooling_mode_mean_tokens and pooling_mode_cls_token are both true: the modes' vectors would be "
                 "concatenated, which Strata does not do");
  CHECK(error({transformer, pool}, {{"pooling_mode", "max"}}) ==
        config + ": pooling_mode 'max' is not supported (lasttoken, mean, cls)");
  CHECK(error({transformer, pool}, {{"pooling_mode", "mean"}, {"include_prompt", false}}) ==
        config + ": include_prompt false (pooling that leaves out an instruction's tokens) is not supported");
  CHECK(error({transformer, pool}, {{"pooling_mode_mean_tokens", false}}) ==
        config + ": no pooling mode is true (pooling_mode_lasttoken, _mean_tokens, _cls_token)");
  CHECK(error(json::array({transformer}), classic_cls) == modules + ": no Pooling module");
  json sub = transformer;
  sub["path"] = "0_Transformer";
  CHECK(error({sub, pool}, classic_cls) ==
        modules + ": module 0: the Transformer's files are in 0_Transformer/; give that directory as the model (the "
                  "pooling is then not read: --pooling)");
}

TEST_CASE("embeddings: finish_embedding and base64", "[embeddings]") {
  std::vector<float> v = {3, 4, 12};
  finish_embedding(v, 2, true);
  CHECK(v == std::vector<float>{0.6f, 0.8f});
  v = {3, 4, 12};
  finish_embedding(v, 0, false);
  CHECK(v == std::vector<float>{3, 4, 12});
  v = {0, 0};
  finish_embedding(v, 0, true);  // a zero vector stays zero (the norm is clamped at 1e-12)
  CHECK(v == std::vector<float>{0, 0});
  // RFC 4648's test vectors.
  for (const auto& [in, out] : std::map<std::string, std::string>{
           {"", ""}, {"f", "Zg=="}, {"fo", "Zm8="}, {"foo", "Zm9v"}, {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="},
           {"foobar", "Zm9vYmFy"}})
    CHECK(base64_encode(in.data(), in.size()) == out);
}

TEST_CASE("embeddings: strata run --pooling writes the strata format", "[embeddings][cli]") {
  const json exp = expected("tiny-llama-embedding");
  const fs::path in = write("cli.jsonl", json{{"id", "a"}, {"input", exp["texts"][1]}}.dump() + "\n");
  const fs::path out = test::temp_dir("embeddings") / "cli_out.jsonl";
  fs::remove(out);
  const auto r = test::run_strata("run --model " + model_dir("tiny-llama-embedding").string() + " --prompts " +
                                  in.string() + " --out " + out.string() + " --pooling cls --normalize --no-progress");
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("embeddings: cls pooling, normalized (--pooling, --normalize)"));
  const auto lines = read_lines(out);
  REQUIRE(lines.size() == 1);
  check_close(floats_of(lines[0]["embedding"]), exp["poolings"]["cls+normalize"][1]);
  const auto bad = test::run_strata("run --model " + model_dir("tiny-llama-embedding").string() + " --prompts " +
                                    in.string() + " --out " + out.string() + " --pooling max");
  CHECK(bad.code != 0);
  CHECK_THAT(bad.output, Catch::Contains("--pooling"));
}

// fp16 on the GPU (the emulated backend in CI): within twice sentence-transformers' own fp16
// distance from its fp32 vectors, per text.
TEST_CASE("CUDA: embeddings within twice sentence-transformers' own fp16 error", "[embeddings][hf][cuda]") {
  if (!cuda_available()) {
    WARN("no GPU: skipped");
    return;
  }
  for (const char* name : kModels) {
    SECTION(name) {
      const json exp = expected(name);
      const auto ids = expected_ids(exp);
      Loaded l = load(name, "cuda");
      const ModelBundle b = open_model(model_dir(name).string());
      Embedder e(*l.model, 16);
      const auto vectors = e.embed(ids, b.pooling->kind);
      for (size_t i = 0; i < ids.size(); ++i) {
        const std::vector<float> got = finished(vectors[i], b.pooling->normalize);
        const json& want = exp["model_pooling"][i];
        float worst = 0;
        for (size_t j = 0; j < got.size(); ++j) worst = std::max(worst, std::fabs(got[j] - want[j].get<float>()));
        const float allowed = 2 * exp["fp16_vs_fp32_max_abs_diff"][i].get<float>();
        INFO(name << " text " << i << ": worst " << worst << ", allowed " << allowed);
        CHECK(worst <= allowed);
      }
    }
  }
}
