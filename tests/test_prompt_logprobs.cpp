// Prompt logprobs (vLLM's prompt_logprobs; the completions API's echo with logprobs and max_tokens
// 0): each prompt token's log-probability, rank and top tokens against Hugging Face's
// (tests/fixtures/logprobs/make_prompt_logprobs.py), on the resident generator and its continuous
// batcher, in the offloading engine's blocks and while it serves, on the CUDA backend, and in the
// batch job's answer lines of both formats.
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <random>
#include <nlohmann/json.hpp>

#include "candidate_test_rows.h"
#include "forwarding_backend.h"
#include "logprobs_fixture.h"
#include "policy_fixtures.h"
#include "pooled_job.h"
#include "strata/backend/backend.h"
#include "strata/job/batch_job.h"
#include "strata/job/prompts.h"
#include "strata/offload/engine.h"
#include "strata/runtime/continuous.h"
#include "strata/runtime/generator.h"
#include "strata/runtime/prompt_logprobs.h"
#include "temp_files.h"
#include "test_paths.h"
#include "test_support.h"

using namespace strata;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const json& fixture() {
  static const json fx = [] {
    std::ifstream in(std::string(STRATA_FIXTURES_DIR) + "/logprobs/prompt_logprobs_cases.json");
    REQUIRE(in.good());
    return json::parse(in);
  }();
  return fx;
}

// A logprob is a logit minus the log-sum-exp of the row, each within test_model_hf.cpp's float32
// bound of HF's (2e-5 + 1e-5 * max|logit|); fp16 activations: its fp16 allowance (1e-2 + 2e-3 *
// max|logit|), twice for the same reason.
double fp32_tolerance(const json& c) { return 2 * (2e-5 + 1e-5 * c["max_abs_logit"].get<double>()); }
double fp16_tolerance(const json& c) { return 2 * (1e-2 + 2e-3 * c["max_abs_logit"].get<double>()); }

GenRequest scored_request(const json& c, int top) {
  GenRequest r;
  r.prompt = c["prompt"].get<std::vector<int32_t>>();
  r.sampling.max_new_tokens = 1;
  r.sampling.ignore_eos = true;
  r.prompt_logprobs = top;
  return r;
}

// Every position's token, logprob and rank; the top tokens and theirs (where the fp32 tolerance
// holds, the ids exactly and the rank within the fixture's range).
void check_matches_hf(const json& c, const GenResult& got, double tol, bool exact_order = true) {
  const json& want = c["positions"];
  REQUIRE(got.prompt_logprobs.size() == want.size());
  for (size_t t = 0; t < want.size(); ++t) {
    INFO(c["model"].get<std::string>() << ", prompt of " << c["prompt"].size() << ", position " << t + 1);
    const StepLogprobs& s = got.prompt_logprobs[t];
    CHECK(s.sampled.token == want[t]["token"].get<int32_t>());
    CHECK(std::fabs(s.sampled.logprob - want[t]["logprob"].get<double>()) <= tol);
    // Tokens within the tolerance of the token's logprob may count either way: the fixture's range.
    if (exact_order) {
      CHECK(s.sampled_rank >= want[t]["rank_range"][0].get<int64_t>());
      CHECK(s.sampled_rank <= want[t]["rank_range"][1].get<int64_t>());
    }
    REQUIRE(s.top.size() == want[t]["top"].size());
    for (size_t k = 0; k < s.top.size(); ++k) {
      if (exact_order) CHECK(s.top[k].token == want[t]["top"][k][0].get<int32_t>());
      CHECK(std::fabs(s.top[k].logprob - want[t]["top"][k][1].get<double>()) <= tol);
    }
  }
  REQUIRE(got.tokens.size() == 1);
  if (exact_order) CHECK(got.tokens[0] == c["next"]["token"].get<int32_t>());
}

std::vector<std::vector<GenResult>> run_all(Transformer& model, const std::vector<GenRequest>& reqs, int slots,
                                            int64_t budget) {
  ContinuousOptions o;
  o.slots = slots;
  o.gen.prefill_token_budget = budget;
  for (const GenRequest& r : reqs) o.capacity = std::max(o.capacity, int(r.prompt.size()) + r.sampling.max_new_tokens);
  std::vector<std::vector<GenResult>> out(reqs.size());
  size_t next = 0;
  run_continuous(
      model, o, [&] { return next < reqs.size() ? Admission{&reqs[next], next++} : Admission{}; },
      [&](size_t tag, std::vector<GenResult> results) { out[tag] = std::move(results); });
  return out;
}

// A request whose prompt begins like `c`'s and then differs: admitted first, it would lend the
// scored prompt its rows, which have no logits.
GenRequest sharing_neighbour(const json& c) {
  GenRequest r;
  r.prompt = c["prompt"].get<std::vector<int32_t>>();
  r.prompt.resize(r.prompt.size() - 1);
  r.prompt.push_back(r.prompt.back() == 5 ? 6 : 5);
  r.sampling.max_new_tokens = 3;
  return r;
}

}  // namespace

TEST_CASE("target_logprobs: log_softmax, rank counting ties and the top tokens lower id first", "[logprobs]") {
  ThreadPool pool(2);
  const std::vector<float> logits = {1.0f, 3.0f, 3.0f, -INFINITY, 0.5f,   // row 0
                                     0.0f, 0.0f, 0.0f, 0.0f, 0.0f};       // row 1: uniform
  const std::vector<int32_t> targets = {2, 4};
  const std::vector<StepLogprobs> got = target_logprobs(pool, logits.data(), 2, 5, targets.data(), 3);
  REQUIRE(got.size() == 2);
  const double z = std::log(std::exp(1.0) + 2 * std::exp(3.0) + std::exp(0.5));
  CHECK(got[0].sampled.token == 2);
  CHECK(got[0].sampled.logprob == Approx(3.0 - z).epsilon(1e-12));
  CHECK(got[0].sampled_rank == 2);  // ids 1 and 2 tie: both count
  REQUIRE(got[0].top.size() == 3);
  CHECK(got[0].top[0].token == 1);
  CHECK(got[0].top[1].token == 2);
  CHECK(got[0].top[2].token == 0);
  CHECK(got[1].sampled.logprob == Approx(-std::log(5.0)).epsilon(1e-12));
  CHECK(got[1].sampled_rank == 5);
  CHECK(got[1].top[0].token == 0);
}

TEST_CASE("prompt logprobs match Hugging Face's on the resident generator, whole or in pieces",
          "[logprobs][prompt_logprobs][hf]") {
  for (const json& c : fixture()["cases"]) {
    test::FixtureModel l = test::load_fixture_model(c["model"].get<std::string>(), make_cpu_backend(2));
    const GenRequest scored = scored_request(c, 5);
    const double tol = fp32_tolerance(c);
    for (int64_t budget : {int64_t(4096), int64_t(7)}) {
      INFO("prefill budget " << budget);
      GenOptions gen;
      gen.prefill_token_budget = budget;
      // The neighbour first: it would be the scored prompt's source, were scored prompts shared.
      const std::vector<GenResult> got = generate(*l.model, {sharing_neighbour(c), scored}, gen);
      check_matches_hf(c, got[1], tol);
      CHECK(got[0].prompt_logprobs.empty());  // not asked
    }
    for (int64_t budget : {int64_t(4096), int64_t(5)}) {
      INFO("continuous, prefill budget " << budget);
      GenRequest two = scored;
      two.n = 2;
      const auto got = run_all(*l.model, {sharing_neighbour(c), two, scored}, 3, budget);
      REQUIRE(got[1].size() == 2);
      check_matches_hf(c, got[1][0], tol);
      check_matches_hf(c, got[1][1], tol);  // every choice carries it
      check_matches_hf(c, got[2][0], tol);
    }
  }
}

TEST_CASE("the offloading engine scores prompts in blocks and while serving, on every tier",
          "[logprobs][prompt_logprobs][offload][hf]") {
  const TierSplit G{100, 0, 0}, C{0, 100, 0}, D{0, 0, 100};
  struct Placement {
    const char* what;
    TierSplit cache;
    bool cpu_attention;
    int prefill_tokens;
  };
  for (const Placement& p : {Placement{"cache on gpu", G, false, 0}, Placement{"cache on cpu, cpu attention", C, true, 6},
                             Placement{"cache on disk", D, false, 0}}) {
    for (size_t k : {size_t(0), size_t(5)}) {  // tiny-llama short, tiny-opt long
      const json& c = fixture()["cases"][k];
      INFO(p.what << ", " << c["model"].get<std::string>());
      test::FixtureModel l = test::load_fixture_model(c["model"].get<std::string>(), make_cpu_backend(2));
      OffloadOptions opt;
      opt.policy = test::policy_of(2, 2, C, p.cache, G, p.cpu_attention);
      opt.policy.prefill_tokens = p.prefill_tokens;
      opt.offload_dir = test::temp_dir("prompt-logprobs");
      GenRequest two = scored_request(c, 5);
      two.n = 2;
      const std::vector<GenRequest> reqs = {sharing_neighbour(c), two, scored_request(c, 5)};
      OffloadEngine engine(l.bundle.config, *l.bundle.weights, *l.backend, opt, {int(two.prompt.size()), 3});
      const std::vector<GenResult> blocks = engine.generate(reqs);
      REQUIRE(blocks.size() == 4);
      for (size_t i : {size_t(1), size_t(2), size_t(3)}) check_matches_hf(c, blocks[i], fp32_tolerance(c));
      std::vector<std::vector<GenResult>> served(reqs.size());
      size_t next = 0;
      engine.serve([&] { return next < reqs.size() ? Admission{&reqs[next], next++} : Admission{}; },
                   [&](size_t tag, std::vector<GenResult> r) { served[tag] = std::move(r); });
      REQUIRE(served[1].size() == 2);
      for (const GenResult& g : {served[1][0], served[1][1], served[2][0]}) check_matches_hf(c, g, fp32_tolerance(c));
    }
  }
}

TEST_CASE("CUDA: rows scored on the device give the host's logprobs, ranks and top tokens", "[logprobs][prompt_logprobs][cuda]") {
  if (!cuda_available()) {
    WARN("no GPU: skipped");
    return;
  }
  // The candidate test rows (ties on a coarse grid, masked tokens, signed zeros), a row whose top
  // 30 tie (past the 20 asked, within the 64 candidates) and one whose top 100 tie (past the
  // candidates: that row crosses whole); targets first, last, anywhere and the least probable.
  auto cuda = make_cuda_backend(0);
  test::CopyCountingBackend backend(*cuda);
  std::mt19937 rng(7);
  for (int64_t V : {int64_t(7), int64_t(1000), int64_t(4099)}) {
    std::vector<std::vector<float>> rows = test::candidate_test_rows(V, rng, [](float x) { return x; });
    for (int64_t tied : {int64_t(30), int64_t(100)}) {
      std::vector<float> r = rows[0];
      for (int64_t j = 0; j < std::min(tied, V); ++j) r[size_t((j * 37) % V)] = 20.0f;
      rows.push_back(r);
    }
    const int64_t R = int64_t(rows.size());
    std::vector<float> flat;
    std::vector<int32_t> targets;
    std::vector<int> tops;
    for (int64_t r = 0; r < R; ++r) {
      flat.insert(flat.end(), rows[size_t(r)].begin(), rows[size_t(r)].end());
      const auto least = std::min_element(rows[size_t(r)].begin(), rows[size_t(r)].end());
      const int32_t picks[] = {0, int32_t(V - 1), int32_t(rng() % uint32_t(V)), int32_t(least - rows[size_t(r)].begin())};
      targets.push_back(picks[r % 4]);
      tops.push_back(std::array<int, 3>{20, 0, 5}[size_t(r % 3)]);
    }
    Buffer buf = backend.alloc(flat.size() * 4);
    backend.copy_to_device(buf.data(), flat.data(), flat.size() * 4);
    RowScorer scorer(backend);
    backend.copies.clear();
    const std::vector<StepLogprobs> got = scorer.score(buf.view(0, DType::F32, {R, V}), targets, tops);
    size_t copied = 0;
    for (size_t n : backend.copies) copied += n;
    // The summaries, and at most the one row whose ties run past its candidates, whole.
    CHECK(copied <= size_t(R) * (row_candidates_bytes(RowScorer::kCandidates) + 8) + size_t(V) * 4);
    ThreadPool pool(2);
    REQUIRE(got.size() == size_t(R));
    for (int64_t r = 0; r < R; ++r) {
      INFO("vocabulary " << V << ", row " << r << ", target " << targets[size_t(r)] << ", top " << tops[size_t(r)]);
      const StepLogprobs want =
          target_logprobs(pool, rows[size_t(r)].data(), 1, V, &targets[size_t(r)], tops[size_t(r)])[0];
      const StepLogprobs& g = got[size_t(r)];
      CHECK(g.sampled.token == want.sampled.token);
      CHECK(g.sampled_rank == want.sampled_rank);
      // The same sum in another order: within 1e-9, or both -inf (a masked token).
      auto same = [](double a, double b) { return a == b || std::fabs(a - b) <= 1e-9; };
      CHECK(same(g.sampled.logprob, want.sampled.logprob));
      REQUIRE(g.top.size() == want.top.size());
      for (size_t k = 0; k < want.top.size(); ++k) {
        CHECK(g.top[k].token == want.top[k].token);
        CHECK(same(g.top[k].logprob, want.top[k].logprob));
      }
    }
  }
}

TEST_CASE("CUDA: prompt logprobs within fp16 tolerance of Hugging Face's", "[logprobs][prompt_logprobs][hf][cuda]") {
  if (!cuda_available()) {
    WARN("no GPU: skipped");
    return;
  }
  for (const json& c : fixture()["cases"]) {
    test::FixtureModel l = test::load_fixture_model(c["model"].get<std::string>(), make_cuda_backend(0));
    const auto got = run_all(*l.model, {sharing_neighbour(c), scored_request(c, 5)}, 2, 7);
    // fp16 may swap near-ties: values only, not the order of equal-looking tokens.
    check_matches_hf(c, got[1][0], fp16_tolerance(c), /*exact_order=*/false);
  }
}

namespace {

// A one-line job's output line, on the resident generator or (policy given) the offloading engine.
json run_one(const std::string& model, const std::string& line, const fs::path& policy = {}, std::string* job_log = nullptr) {
  const fs::path dir = test::temp_dir("prompt-logprobs-job");
  const fs::path in = dir / "in.jsonl", out = dir / "out.jsonl";
  fs::remove(out);
  std::ofstream(in) << line;
  JobOptions o = test::pooled_job(std::string(STRATA_FIXTURES_DIR) + "/models/" + model, in, out);
  o.policy = policy;
  std::ostringstream log;
  run_batch_job(o, log);
  if (job_log) *job_log = log.str();
  const auto lines = test::lines_by_id(out);
  REQUIRE(lines.size() == 1);
  return lines.begin()->second;
}

}  // namespace

TEST_CASE("echo: the prompt's tokens and logprobs before the answer's, as the completions API writes them",
          "[logprobs][prompt_logprobs][job][hf]") {
  const json& c = fixture()["cases"][3];  // tiny-llama3, the long prompt
  const std::vector<int32_t> prompt = c["prompt"].get<std::vector<int32_t>>();
  const json& want = c["positions"];
  const fs::path policy = test::temp_dir("prompt-logprobs-job") / "policy.yaml";
  std::ofstream(policy) << "gpu_batch_size: 2\nnum_gpu_batches: 1\nweights: {gpu: 0, cpu: 100, disk: 0}\n"
                           "kv_cache: {gpu: 0, cpu: 100, disk: 0}\nactivations: {gpu: 100, cpu: 0, disk: 0}\n"
                           "cpu_attention: true\nprefill_tokens: 16\n";
  for (const fs::path& p : {fs::path(), policy}) {
    INFO((p.empty() ? "resident" : "offloading engine"));
    for (int max_tokens : {0, 1}) {
      INFO("max_tokens " << max_tokens);
      std::string log;
      const json line = run_one("tiny-llama3", test::batch_request("e", "/v1/completions",
                                                                  {{"prompt", prompt}, {"echo", true}, {"logprobs", 2},
                                                                   {"max_tokens", max_tokens}, {"temperature", 0}}), p, &log);
      CHECK_THAT(log, Catch::Contains("prompt logprobs: " + std::to_string(prompt.size() - 1) + " positions of 1 prompts scored"));
      const json& body = line["response"]["body"];
      const json& choice = body["choices"][0];
      const std::string text = c["decoded"].get<std::string>() + (max_tokens ? c["next"]["text"].get<std::string>() : "");
      CHECK(choice["text"] == text);
      CHECK(choice["finish_reason"] == "length");
      CHECK(body["usage"]["prompt_tokens"] == prompt.size());
      CHECK(body["usage"]["completion_tokens"] == max_tokens);
      const json& lp = choice["logprobs"];
      REQUIRE(lp["tokens"].size() == prompt.size() + size_t(max_tokens));
      CHECK(lp["token_logprobs"][0].is_null());
      CHECK(lp["top_logprobs"][0].is_null());
      CHECK(lp["text_offset"][0] == 0);
      for (size_t t = 1; t < prompt.size(); ++t) {
        INFO("position " << t);
        CHECK(std::fabs(lp["token_logprobs"][t].get<double>() - want[t - 1]["logprob"].get<double>()) <= fp32_tolerance(c));
        const json& top = lp["top_logprobs"][t];
        CHECK(top.size() <= 3);  // the 2 most probable and the token itself
        CHECK(top.contains(lp["tokens"][t].get<std::string>()));
        CHECK(lp["text_offset"][t] >= lp["text_offset"][t - 1]);
      }
      if (max_tokens)
        CHECK(std::fabs(lp["token_logprobs"][prompt.size()].get<double>() - c["next"]["logprob"].get<double>()) <=
              fp32_tolerance(c));
      // vLLM's prompt_logprobs, which echo with logprobs implies: by token id, with ranks.
      const json& pl = choice["prompt_logprobs"];
      REQUIRE(pl.size() == prompt.size());
      CHECK(pl[0].is_null());
      for (size_t t = 1; t < prompt.size(); ++t) {
        INFO("position " << t);
        const json& d = pl[t];
        const std::string own = std::to_string(prompt[t]);
        REQUIRE(d.contains(own));
        CHECK(std::fabs(d[own]["logprob"].get<double>() - want[t - 1]["logprob"].get<double>()) <= fp32_tolerance(c));
        CHECK(d[own]["rank"] >= want[t - 1]["rank_range"][0]);
        CHECK(d[own]["rank"] <= want[t - 1]["rank_range"][1]);
        for (size_t k = 0; k < 2; ++k) {
          const std::string id = std::to_string(want[t - 1]["top"][k][0].get<int32_t>());
          REQUIRE(d.contains(id));
          CHECK(d[id]["rank"] == k + 1);
        }
      }
    }
  }
}

TEST_CASE("prompt_logprobs on chat, completions and strata lines, and what is refused", "[logprobs][prompt_logprobs][job]") {
  const json& c = fixture()["cases"][2];  // tiny-llama3, the short prompt
  const std::vector<int32_t> prompt = c["prompt"].get<std::vector<int32_t>>();
  // Completions: each choice carries them; the answer is generated as without them.
  const json plain = run_one("tiny-llama3", test::batch_request("p", "/v1/completions",
                                                               {{"prompt", prompt}, {"max_tokens", 4}, {"n", 2}}));
  const json scored = run_one("tiny-llama3", test::batch_request("p", "/v1/completions",
                                                                {{"prompt", prompt}, {"max_tokens", 4}, {"n", 2},
                                                                 {"prompt_logprobs", 0}}));
  const json& choices = scored["response"]["body"]["choices"];
  REQUIRE(choices.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    CHECK(choices[i]["text"] == plain["response"]["body"]["choices"][i]["text"]);
    const json& pl = choices[i]["prompt_logprobs"];
    REQUIRE(pl.size() == prompt.size());
    for (size_t t = 1; t < prompt.size(); ++t) CHECK(pl[t].size() == 1);  // the token alone
  }
  CHECK_FALSE(plain["response"]["body"]["choices"][0].contains("prompt_logprobs"));

  // Chat: at the response's top level, over the rendered prompt.
  const json chat = run_one("tiny-llama2", test::batch_request("c", "/v1/chat/completions",
                                                              {{"messages", {{{"role", "user"}, {"content", "Hi there"}}}},
                                                               {"max_tokens", 2}, {"prompt_logprobs", 1}}));
  const json& body = chat["response"]["body"];
  REQUIRE(body.contains("prompt_logprobs"));
  CHECK(body["prompt_logprobs"].size() == body["usage"]["prompt_tokens"]);
  CHECK(body["prompt_logprobs"][0].is_null());
  for (size_t t = 1; t < body["prompt_logprobs"].size(); ++t) {
    const json& d = body["prompt_logprobs"][t];
    CHECK((d.size() == 1 || d.size() == 2));
    for (const auto& [id, e] : d.items()) CHECK(e["logprob"].get<double>() <= 0);
  }

  // The strata format: parallel to the prompt's tokens, with ids and ranks.
  const json s = run_one("tiny-llama3", json{{"id", 1}, {"prompt", "The quick brown fox"}, {"max_new_tokens", 1},
                                             {"prompt_logprobs", 3}}.dump() + "\n");
  REQUIRE(s.contains("prompt_logprobs"));
  CHECK(s["prompt_logprobs"].size() == s["prompt_tokens"]);
  CHECK(s["prompt_logprobs"][0].is_null());
  for (size_t t = 1; t < s["prompt_logprobs"].size(); ++t) {
    const json& e = s["prompt_logprobs"][t];
    CHECK(e["rank"].get<int64_t>() >= 1);
    CHECK(e["top_logprobs"].size() == 3);
    CHECK(e["logprob"].get<double>() <= e["top_logprobs"][0]["logprob"].get<double>());
  }

  // Refused, each with its code, the job going on.
  const std::vector<std::pair<json, std::string>> refused = {
      {{{"prompt", "x"}, {"max_tokens", 0}}, "invalid_value"},                        // 0 needs echo
      {{{"prompt", prompt}, {"prompt_logprobs", 21}}, "invalid_value"},                 // past vLLM's 20
      {{{"prompt", {1, 2, 5000}}}, "invalid_value"},                                    // past the vocabulary
      {{{"prompt", {1, -2}}}, "invalid_value"},                                         // not a token id
      {{{"prompt", {"a", "b", {1, 5000}}}}, "invalid_value"},                           // one of several
      {{{"prompt", json::array()}}, "invalid_value"},
      {{{"prompt", "x"}, {"echo", "yes"}}, "invalid_type"}};
  for (const auto& [body, code] : refused) {
    INFO(body.dump());
    const json l = run_one("tiny-llama3", test::batch_request("r", "/v1/completions", body));
    CHECK(l["error"]["code"] == code);
  }
  const json echo_chat = run_one("tiny-llama2", test::batch_request("r", "/v1/chat/completions",
                                                                   {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                                                                    {"echo", true}}));
  CHECK(echo_chat["error"]["code"] == "unsupported_value");
}
