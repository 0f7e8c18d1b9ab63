// Several prompts in one /v1/completions request (body.prompt a list of strings or of token-id
// lists, what lm-evaluation-harness sends with batch_size > 1): each prompt is answered as a request
// of its own, and the one output line holds prompt i's choice j at index i * n + j with the usage
// summed (OpenAI's and vLLM's answer). Expected values: the same prompts sent one a line.
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "pooled_job.h"
#include "strata/job/batch_job.h"
#include "strata/job/output.h"
#include "strata/job/prompts.h"
#include "temp_files.h"
#include "test_paths.h"

using namespace strata;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::vector<PromptRecord> parse(const std::string& text) {
  const fs::path p = test::temp_dir("completion-prompts") / "parse.jsonl";
  std::ofstream(p) << text;
  return read_prompts(p, {});
}

// A batch output line answering one prompt with `texts` (one choice each) and the usage given.
json answer(const std::string& id, const std::vector<std::string>& texts, int64_t prompt_tokens, int64_t completion_tokens) {
  PromptRecord r;
  r.id = id;
  r.format = InputFormat::OpenAIBatch;
  r.endpoint = Endpoint::Completions;
  Completion c;
  for (const std::string& t : texts) c.choices.push_back({t, "length", nullptr});
  c.prompt_tokens = prompt_tokens;
  c.completion_tokens = completion_tokens;
  return openai_response_line(r, c);
}

}  // namespace

TEST_CASE("completions: a list of prompts is read as one request, split a prompt at a time", "[job][completion_prompts]") {
  const auto recs = parse(test::batch_request("m", "/v1/completions", {{"prompt", {"one", "two", "three"}}, {"n", 2}}) +
                          test::batch_request("i", "/v1/completions", {{"prompt", {{5, 6}, {7}}}}) +
                          test::batch_request("s", "/v1/completions", {{"prompt", {"alone"}}}) +
                          test::batch_request("d", "/v1/completions", {{"prompt", {{8, 9}}}}));
  REQUIRE(recs.size() == 4);
  for (const PromptRecord& r : recs) REQUIRE_FALSE(r.error);
  REQUIRE(recs[0].prompts.size() == 3);
  CHECK(recs[0].prompt.empty());
  const std::vector<PromptRecord> parts = completion_parts(recs[0]);
  REQUIRE(parts.size() == 3);
  for (int i = 0; i < 3; ++i) {
    CHECK(parts[size_t(i)].part == i);
    CHECK(parts[size_t(i)].parts == 3);
    CHECK(parts[size_t(i)].prompts.empty());
    CHECK(parts[size_t(i)].id == "m");
    CHECK(parts[size_t(i)].n == 2);
  }
  CHECK(parts[1].prompt == "two");
  const std::vector<PromptRecord> ids = completion_parts(recs[1]);
  REQUIRE(ids.size() == 2);
  CHECK(ids[0].prompt_ids == std::vector<int32_t>{5, 6});
  CHECK(ids[1].prompt_ids == std::vector<int32_t>{7});
  CHECK(ids[1].prompt.empty());
  // A list of one prompt is that prompt, alone.
  CHECK(recs[2].prompts.empty());
  CHECK(recs[2].prompt == "alone");
  CHECK(recs[3].prompt_ids == std::vector<int32_t>{8, 9});
  const std::vector<PromptRecord> one = completion_parts(recs[2]);
  REQUIRE(one.size() == 1);
  CHECK(one[0].parts == 1);
  CHECK(one[0].prompt == "alone");
}

TEST_CASE("completions: the prompts' lines join into one, choices numbered on and the usage summed",
          "[job][completion_prompts]") {
  const json joined = join_prompt_lines({answer("m", {"a", "b"}, 3, 4), answer("m", {"c", "d"}, 5, 6)});
  const json& body = joined["response"]["body"];
  CHECK(joined["custom_id"] == "m");
  CHECK(joined["error"].is_null());
  REQUIRE(body["choices"].size() == 4);
  for (size_t i = 0; i < 4; ++i) {
    CHECK(body["choices"][i]["index"] == i);
    CHECK(body["choices"][i]["text"] == std::string(1, char('a' + i)));
  }
  CHECK(body["usage"] == json{{"prompt_tokens", 8}, {"completion_tokens", 10}, {"total_tokens", 18}});
  // A prompt that failed fails the request: the first failed prompt's error line.
  PromptRecord r;
  r.id = "m";
  const json error = openai_error_line(r, {"invalid_value", "body.prompt[1]: too long"});
  const json failed = join_prompt_lines({answer("m", {"a"}, 1, 1), error, openai_error_line(r, {"x", "later"})});
  CHECK(failed == error);
}

TEST_CASE("completions: several prompts give the answers the same prompts give one a line, resident and offloaded",
          "[job][completion_prompts][offload]") {
  const fs::path dir = test::temp_dir("completion-prompts");
  const fs::path in = dir / "in.jsonl", out = dir / "out.jsonl";
  const std::vector<int32_t> long_ids = [] {
    std::vector<int32_t> v;
    for (int i = 0; i < 40; ++i) v.push_back(int32_t(3 + 11 * i % 900));
    return v;
  }();
  const json sampling = {{"max_tokens", 5}, {"temperature", 0}, {"logprobs", 2}, {"n", 2}};
  auto body = [&](json prompt, json extra = json::object()) {
    json b = sampling;
    b["prompt"] = std::move(prompt);
    b.update(extra);
    return b;
  };
  const json echo = {{"echo", true}, {"max_tokens", 0}, {"n", 1}, {"logprobs", 1}};
  std::ofstream(in) << test::batch_request("words", "/v1/completions", body({"Hello there", "The cat sat on", "x"}))
                    << test::batch_request("w0", "/v1/completions", body("Hello there"))
                    << test::batch_request("w1", "/v1/completions", body("The cat sat on"))
                    << test::batch_request("w2", "/v1/completions", body("x"))
                    // Token ids, the longest prompt of the file: --policy plans the engine for it.
                    << test::batch_request("ids", "/v1/completions", body({{5, 6, 7}, long_ids}, echo))
                    << test::batch_request("i0", "/v1/completions", body({5, 6, 7}, echo))
                    << test::batch_request("i1", "/v1/completions", body(long_ids, echo))
                    << test::batch_request("bad", "/v1/completions", body({"fine", "also fine", {99999}}));
  const fs::path policy = dir / "policy.yaml";
  std::ofstream(policy) << "gpu_batch_size: 2\nnum_gpu_batches: 2\nweights: {gpu: 50, cpu: 50, disk: 0}\n"
                           "kv_cache: {gpu: 0, cpu: 100, disk: 0}\nactivations: {gpu: 100, cpu: 0, disk: 0}\n";
  for (const fs::path& p : {fs::path(), policy}) {
    for (bool ordered : {false, true}) {
      INFO((p.empty() ? "resident" : "offloading engine") << (ordered ? ", ordered" : ""));
      fs::remove(out);
      JobOptions o = test::pooled_job(std::string(STRATA_FIXTURES_DIR) + "/models/tiny-llama", in, out);
      o.policy = p;
      o.ordered = ordered;
      std::ostringstream log;
      run_batch_job(o, log);
      auto lines = test::lines_by_id(out);
      REQUIRE(lines.size() == 8);
      auto check_joined = [&](const std::string& id, const std::vector<std::string>& singles) {
        INFO(id);
        const json& joined = lines[id]["response"]["body"];
        REQUIRE(lines[id]["error"].is_null());
        json want_usage = {{"prompt_tokens", 0}, {"completion_tokens", 0}, {"total_tokens", 0}};
        size_t at = 0;
        for (const std::string& single : singles) {
          const json& one = lines[single]["response"]["body"];
          for (const auto& [key, value] : one["usage"].items()) want_usage[key] = want_usage[key].get<int64_t>() + value.get<int64_t>();
          for (const json& choice : one["choices"]) {
            INFO("choice " << at << " (" << single << "'s " << choice["index"] << ")");
            REQUIRE(at < joined["choices"].size());
            const json& got = joined["choices"][at];
            CHECK(got["index"] == at);
            CHECK(got["text"] == choice["text"]);
            CHECK(got["finish_reason"] == choice["finish_reason"]);
            // Batched with other neighbours, the sums run in another order: logprobs to 1e-4.
            const json &g = got["logprobs"], &w = choice["logprobs"];
            CHECK(g["tokens"] == w["tokens"]);
            REQUIRE(g["token_logprobs"].size() == w["token_logprobs"].size());
            for (size_t t = 0; t < w["token_logprobs"].size(); ++t) {
              if (w["token_logprobs"][t].is_null()) {
                CHECK(g["token_logprobs"][t].is_null());
                continue;
              }
              CHECK(std::fabs(g["token_logprobs"][t].get<double>() - w["token_logprobs"][t].get<double>()) < 1e-4);
            }
            ++at;
          }
        }
        CHECK(joined["choices"].size() == at);
        CHECK(joined["usage"] == want_usage);
      };
      check_joined("words", {"w0", "w1", "w2"});
      CHECK(lines["words"]["response"]["body"]["choices"].size() == 6);  // 3 prompts x n = 2
      check_joined("ids", {"i0", "i1"});
      CHECK(lines["ids"]["response"]["body"]["usage"]["prompt_tokens"] == 3 + long_ids.size());
      // One prompt the model cannot read fails its request, naming which.
      REQUIRE(lines["bad"]["response"].is_null());
      CHECK(lines["bad"]["error"]["code"] == "invalid_value");
      CHECK_THAT(lines["bad"]["error"]["message"].get<std::string>(), Catch::StartsWith("body.prompt[2]: "));
    }
  }
}
