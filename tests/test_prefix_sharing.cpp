// Shared prompt prefixes (include/strata/runtime/prefix_sharing.h): the plan, generation with it
// against Hugging Face's greedy runs (tests/fixtures/logprobs/make_logprobs.py), against the same
// batch computed whole, and the `strata run` switch.
#include "test_paths.h"
#include "temp_files.h"
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "cli_support.h"
#include "forwarding_backend.h"
#include "logprobs_fixture.h"
#include "policy_fixtures.h"
#include "strata/backend/backend.h"
#include "strata/model/model_loader.h"
#include "strata/runtime/generator.h"
#include "strata/offload/engine.h"
#include "strata/runtime/prefix_sharing.h"

using namespace strata;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

using Tokens = std::vector<int32_t>;

std::vector<SharedPrefix> plan_of(const std::vector<Tokens>& prompts, int min_shared) {
  std::vector<const Tokens*> ptrs;
  for (const Tokens& p : prompts) ptrs.push_back(&p);
  return plan_shared_prefixes(ptrs, {min_shared});
}

// Prompt tokens a plan copies instead of computing.
int64_t shared_tokens(const std::vector<SharedPrefix>& plan) {
  int64_t n = 0;
  for (const SharedPrefix& s : plan) n += s.length;
  return n;
}

Tokens concat(Tokens a, const Tokens& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

Tokens range(int32_t first, int count) {
  Tokens t;
  for (int i = 0; i < count; ++i) t.push_back(first + i);
  return t;
}

// Generation is compared with and without sharing, and with Hugging Face, on these options:
// sharing for any common prefix, steps of 3 tokens so that sources span steps and a step holds
// the end of a source and the beginning of a prompt copying from it.
GenOptions forced_sharing() {
  GenOptions o;
  o.prefill_token_budget = 3;
  o.prefix_sharing = {1};
  return o;
}

GenOptions no_sharing() {
  GenOptions o = forced_sharing();
  o.share_prefixes = false;
  return o;
}

const json& fixture() { return test::logprobs_fixture(); }

using Loaded = test::FixtureModel;

Loaded load(const std::string& name, std::unique_ptr<Backend> backend) {
  return test::load_fixture_model(name, std::move(backend));
}

// Both runs' sequences have the same tokens, and log-probabilities within `tol`.
void check_same_generation(const std::vector<GenResult>& on, const std::vector<GenResult>& off, double tol) {
  REQUIRE(on.size() == off.size());
  for (size_t i = 0; i < on.size(); ++i) {
    INFO("sequence " << i);
    CHECK(on[i].tokens == off[i].tokens);
    REQUIRE(on[i].logprobs.size() == off[i].logprobs.size());
    for (size_t t = 0; t < on[i].logprobs.size(); ++t)
      CHECK(std::fabs(on[i].logprobs[t].sampled.logprob - off[i].logprobs[t].sampled.logprob) <= tol);
  }
}

// The fixture case's prompt extended by the first k tokens of HF's greedy continuation, for
// k = 0..4: HF's greedy run of P + g[0..k) is g[k..] with the fixture's log-probabilities from
// step k on (its loop recomputes the whole sequence at every step), and the five prompts share P.
std::vector<GenRequest> extended_prompts(const json& c) {
  std::vector<GenRequest> reqs;
  const int new_tokens = fixture()["new_tokens"].get<int>();
  for (int k = 4; k >= 0; --k) {  // longest first: the plan sorts them back
    GenRequest r;
    r.prompt = c["prompt"].get<Tokens>();
    for (int i = 0; i < k; ++i) r.prompt.push_back(c["steps"][size_t(i)]["token"].get<int32_t>());
    r.sampling.max_new_tokens = new_tokens - k;
    r.sampling.ignore_eos = true;
    r.logprobs = 5;
    reqs.push_back(r);
  }
  return reqs;
}

// The run of the case's prompt + k of HF's tokens: HF's tokens from k on, with their
// log-probabilities (as tests/test_stop_n_logprobs.cpp: float32 logits give them within 1e-4).
void check_matches_hf(const json& c, size_t k, const GenResult& got) {
  INFO("prompt + " << k << " generated tokens");
  REQUIRE(got.tokens.size() == c["steps"].size() - k);
  for (size_t i = 0; i < got.tokens.size(); ++i) {
    const json& step = c["steps"][k + i];
    CHECK(got.tokens[i] == step["token"].get<int32_t>());
    CHECK(std::fabs(got.logprobs[i].sampled.logprob - step["logprob"].get<double>()) <= 1e-4);
  }
}

}  // namespace

TEST_CASE("prefix plan: prompts share with the nearest source in sorted order", "[prefix]") {
  const Tokens instr = range(100, 20);
  const Tokens other = range(500, 20);
  const std::vector<Tokens> prompts = {
      concat(instr, {7, 8, 9}),  // 0
      concat(other, {1}),        // 1
      concat(instr, {3}),        // 2
      concat(instr, {7, 8, 9}),  // 3: equal to 0
      concat(other, {1, 2}),     // 4: extends 1
      range(100, 10),            // 5: the first 10 tokens of instr
      {42},                      // 6: alone
  };
  const std::vector<SharedPrefix> plan = plan_of(prompts, 8);
  REQUIRE(plan.size() == prompts.size());
  // Sorted: 6, 5, 2, 0, 3, 1, 4. 6 and 5 are sources (nothing in common); 2, 0 and 3 share the
  // 10 tokens of 5 (>= 8), not instr's 20 with each other: only sources are shared; 1 is a source.
  CHECK(plan[5].source == -1);
  CHECK(plan[2].source == 5);
  CHECK(plan[2].length == 10);
  CHECK(plan[0].source == 5);
  CHECK(plan[0].length == 10);
  CHECK(plan[3].source == 5);
  CHECK(plan[3].length == 10);
  CHECK(plan[6].source == -1);
  CHECK(plan[1].source == -1);
  CHECK(plan[4].source == 1);
  CHECK(plan[4].length == 21);  // all of prompt 1, the whole common prefix, leaving one token of 4's
  CHECK(shared_tokens(plan) == 10 * 3 + 21);

  // With a minimum of 12 the 10-token prefix no longer counts: 2 starts the instr family.
  const std::vector<SharedPrefix> p12 = plan_of(prompts, 12);
  CHECK(p12[5].source == -1);
  CHECK(p12[2].source == -1);
  CHECK(p12[0].source == 2);
  CHECK(p12[0].length == 20);
  CHECK(p12[3].source == 2);
  CHECK(p12[3].length == 20);
  CHECK(p12[4].source == 1);
}

TEST_CASE("prefix plan: equal prompts and one-token prompts", "[prefix]") {
  const std::vector<Tokens> same = {range(1, 5), range(1, 5), range(1, 5)};
  const std::vector<SharedPrefix> plan = plan_of(same, 1);
  CHECK(plan[0].source == -1);  // the first of equal prompts is the source
  CHECK(plan[1].source == 0);
  CHECK(plan[1].length == 4);   // the last token is computed: its logits are sampled
  CHECK(plan[2].source == 0);
  CHECK(plan[2].length == 4);
  const std::vector<SharedPrefix> ones = plan_of({{5}, {5}}, 1);
  CHECK(ones[1].source == -1);  // nothing to share but the one token it must compute
  CHECK(shared_tokens(ones) == 0);
}

TEST_CASE("prefix plan: random batches keep every rule", "[prefix]") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    // A few stems, each prompt a stem's beginning and a tail from a small alphabet (many ties).
    std::vector<Tokens> stems(1 + rng() % 3);
    for (Tokens& s : stems) s = range(int32_t(rng() % 4), int(rng() % 12));
    std::vector<Tokens> prompts(1 + rng() % 12);
    for (Tokens& p : prompts) {
      const Tokens& s = stems[rng() % stems.size()];
      p.assign(s.begin(), s.begin() + long(rng() % (s.size() + 1)));
      for (int i = int(rng() % 4); i >= 0; --i) p.push_back(int32_t(rng() % 3));
    }
    const int min_shared = 1 + int(rng() % 4);
    const std::vector<SharedPrefix> plan = plan_of(prompts, min_shared);
    for (size_t i = 0; i < prompts.size(); ++i) {
      const SharedPrefix& s = plan[i];
      if (s.source < 0) continue;
      INFO("trial " << trial << ", prompt " << i);
      const Tokens& src = prompts[size_t(s.source)];
      REQUIRE(plan[size_t(s.source)].source == -1);  // one level
      CHECK(s.length >= min_shared);
      CHECK(s.length < int(prompts[i].size()));       // its last token is computed
      REQUIRE(s.length <= int(src.size()));
      CHECK(std::equal(src.begin(), src.begin() + s.length, prompts[i].begin()));
    }
    // A source computes its own prompt whole; every prompt is either one or shares.
    int64_t computed = 0, total = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      total += int64_t(prompts[i].size());
      computed += int64_t(prompts[i].size()) - plan[i].length;
    }
    CHECK(total - computed == shared_tokens(plan));
    // A prompt that shares nothing has no earlier source with a long enough common prefix: the
    // brute force over all sources of the plan agrees with the sorted walk.
    for (size_t i = 0; i < prompts.size(); ++i) {
      if (plan[i].source >= 0) continue;
      for (size_t j = 0; j < prompts.size(); ++j) {
        if (j == i || plan[j].source >= 0) continue;
        const Tokens &a = prompts[i], &b = prompts[j];
        const size_t common = size_t(std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first - a.begin());
        // A source sorted before i (equal prompts: in batch order) that i could have shared with.
        if ((b < a || (b == a && j < i)) && std::min(common, a.size() - 1) >= size_t(min_shared))
          FAIL_CHECK("prompt " << i << " could have shared " << common << " tokens with source " << j);
      }
    }
  }
}

TEST_CASE("shared prefixes generate Hugging Face's greedy tokens and log-probabilities", "[prefix][logprobs]") {
  for (const json& c : fixture()["cases"]) {
    const std::string name = c["model"].get<std::string>();
    INFO(name << ": \"" << c["text"].get<std::string>() << "\"");
    Loaded l = load(name, make_cpu_backend(2));
    const std::vector<GenRequest> reqs = extended_prompts(c);
    GenStats stats;
    const std::vector<GenResult> got = generate(*l.model, reqs, forced_sharing(), &stats);
    REQUIRE(got.size() == reqs.size());
    const size_t p = c["prompt"].size();
    CHECK(stats.shared_prompt_tokens == int64_t(4 * p));  // the four longer prompts copy P
    for (size_t r = 0; r < reqs.size(); ++r) check_matches_hf(c, reqs[r].prompt.size() - p, got[r]);
  }
}

TEST_CASE("a kept prefix carries a batch's shared beginning to the next batches", "[prefix][logprobs]") {
  for (const json& c : fixture()["cases"]) {
    const std::string name = c["model"].get<std::string>();
    INFO(name << ": \"" << c["text"].get<std::string>() << "\"");
    Loaded l = load(name, make_cpu_backend(2));
    const std::vector<GenRequest> all = extended_prompts(c);  // P + 4, P + 3, ..., P + 0 tokens
    const size_t p = c["prompt"].size();
    KeptPrefixes kept;
    GenOptions o = forced_sharing();
    o.kept_prefixes = &kept;
    // Batch 1: P + 4 shares P + 3 with its source P + 3, which is kept (all that was shared).
    GenStats s1;
    const std::vector<GenResult> first = generate(*l.model, {all[0], all[1]}, o, &s1);
    CHECK(s1.shared_prompt_tokens == int64_t(p + 3));
    REQUIRE(kept.entries.size() == 1);
    CHECK(kept.entries[0].tokens == all[1].prompt);
    // Batch 2: P + 2 alone copies P + 1 of the kept rows (its last token is computed); batch 3: P + 1 copies P.
    GenStats s2, s3;
    const std::vector<GenResult> second = generate(*l.model, {all[2]}, o, &s2);
    CHECK(s2.shared_prompt_tokens == int64_t(p + 1));
    const std::vector<GenResult> third = generate(*l.model, {all[3]}, o, &s3);
    CHECK(s3.shared_prompt_tokens == int64_t(p));
    REQUIRE(kept.entries.size() == 1);  // nothing shared within batches 2 and 3: nothing new kept
    CHECK(kept.entries[0].tokens == all[1].prompt);
    const std::vector<std::pair<const GenResult*, size_t>> got = {{&first[0], 4}, {&first[1], 3}, {&second[0], 2},
                                                                  {&third[0], 1}};
    for (const auto& [r, k] : got) check_matches_hf(c, k, *r);
    // Sharing off: the kept prefix is neither used nor replaced.
    GenOptions off = no_sharing();
    off.kept_prefixes = &kept;
    GenStats s4;
    generate(*l.model, {all[2], all[4]}, off, &s4);
    CHECK(s4.shared_prompt_tokens == 0);
    REQUIRE(kept.entries.size() == 1);
    CHECK(kept.entries[0].tokens == all[1].prompt);
  }
}

TEST_CASE("the kept prefix is as long as most of the sharing, not its shortest", "[prefix]") {
  Loaded l = load("tiny-llama", make_cpu_backend(2));
  const Tokens instr = range(100, 30);
  auto request = [](Tokens prompt) {
    GenRequest r;
    r.prompt = std::move(prompt);
    r.sampling.max_new_tokens = 2;
    return r;
  };
  // Sorted: instr + {1, 2} is the source; instr + {3} and instr + {4} copy its 30 instruction
  // tokens, and a prompt that begins with only the instruction's first 17 tokens copies those.
  const std::vector<GenRequest> batch = {request(concat(instr, {1, 2})), request(concat(instr, {3})),
                                         request(concat(instr, {4})), request(concat(range(100, 17), {400}))};
  KeptPrefixes kept;
  GenOptions o;
  o.prefix_sharing = {1};
  o.kept_prefixes = &kept;
  GenStats s1;
  generate(*l.model, batch, o, &s1);
  CHECK(s1.shared_prompt_tokens == 30 + 30 + 17);
  REQUIRE(kept.entries.size() == 1);
  CHECK(kept.entries[0].tokens == instr);  // 2 x 30 copied tokens beat 3 x 17
  GenStats s2;
  generate(*l.model, {request(concat(instr, {5, 6}))}, o, &s2);
  CHECK(s2.shared_prompt_tokens == 30);
}

TEST_CASE("kept prefixes: a few instructions, most recently used first", "[prefix]") {
  Loaded l = load("tiny-llama", make_cpu_backend(2));
  const Tokens a = range(100, 30), b = range(300, 30), c = range(500, 30);
  auto request = [](Tokens prompt) {
    GenRequest r;
    r.prompt = std::move(prompt);
    r.sampling.max_new_tokens = 3;
    r.sampling.ignore_eos = true;
    return r;
  };
  KeptPrefixes kept;
  kept.capacity = 2;
  GenOptions o;
  o.prefix_sharing = {1};
  o.kept_prefixes = &kept;
  auto run = [&](const std::vector<GenRequest>& batch) {
    GenStats stats;
    const std::vector<GenResult> got = generate(*l.model, batch, o, &stats);
    check_same_generation(got, generate(*l.model, batch, no_sharing()), 1e-5);
    return stats.shared_prompt_tokens;
  };
  auto kept_tokens = [&] {
    std::vector<Tokens> t;
    for (const auto& e : kept.entries) t.push_back(e.tokens);
    return t;
  };
  CHECK(run({request(concat(a, {1})), request(concat(a, {2}))}) == 30);  // within the batch
  CHECK(run({request(concat(b, {1})), request(concat(b, {2}))}) == 30);
  CHECK(kept_tokens() == std::vector<Tokens>{b, a});
  CHECK(run({request(concat(a, {3}))}) == 30);  // a kept prefix, now the most recent
  CHECK(kept_tokens() == std::vector<Tokens>{a, b});
  CHECK(run({request(concat(c, {1})), request(concat(c, {2}))}) == 30);
  CHECK(kept_tokens() == std::vector<Tokens>{c, a});  // b was the least recent
  CHECK(run({request(concat(b, {3}))}) == 0);
  CHECK(run({request(concat(a, {4})), request(concat(c, {3}))}) == 60);  // each its own
}

TEST_CASE("a batch out of device memory takes the kept prefix's memory first", "[prefix]") {
  const json& c = fixture()["cases"][0];
  auto cpu = make_cpu_backend(2);
  test::RefusingBackend be(*cpu);
  const ModelBundle bundle = open_model(std::string(STRATA_FIXTURES_DIR) + "/models/" + c["model"].get<std::string>());
  Transformer model(bundle.config, load_model_weights(bundle.config, *bundle.weights, be), be);
  const std::vector<GenRequest> all = extended_prompts(c);
  KeptPrefixes kept;
  GenOptions o = forced_sharing();
  o.kept_prefixes = &kept;
  generate(model, {all[0], all[1]}, o);
  REQUIRE(kept.entries.size() == 1);
  // The next batch's cache is refused once: the kept prefix is given up, the retry succeeds, and
  // the batch computes its prompt whole.
  const size_t cache_bytes = 2 * size_t(bundle.config.n_layers) * all[2].prompt.size() * size_t(bundle.config.kv_dim()) * 4;
  be.refuse(cache_bytes, 1);
  GenStats stats;
  const std::vector<GenResult> got = generate(model, {all[2]}, o, &stats);
  CHECK(kept.entries.empty());
  CHECK(stats.shared_prompt_tokens == 0);
  check_matches_hf(c, 2, got[0]);
  // Without a kept prefix to give up, the error stands.
  be.refuse(cache_bytes, 1);
  CHECK_THROWS_WITH(generate(model, {all[2]}, o), Catch::Contains("out of memory"));
}

TEST_CASE("shared prefixes: sampling, n choices and finished requests as computed whole", "[prefix][n]") {
  Loaded l = load("tiny-llama", make_cpu_backend(2));
  const Tokens stem = range(300, 23);
  std::vector<GenRequest> reqs;
  auto add = [&](Tokens prompt, int max_new, float temperature, int n) {
    GenRequest r;
    r.prompt = std::move(prompt);
    r.sampling.max_new_tokens = max_new;
    r.sampling.temperature = temperature;
    r.sampling.seed = 11 + reqs.size();
    r.sampling.ignore_eos = true;
    r.n = n;
    r.logprobs = 2;
    reqs.push_back(r);
  };
  add(concat(stem, {5, 6}), 6, 0.0f, 1);
  add(concat(stem, {5}), 0, 0.0f, 1);           // finished at once: neither a source nor sharing
  add(concat(stem, {9, 9, 9}), 5, 1.2f, 3);     // sharing, with three sampled choices
  add(stem, 4, 0.8f, 2);                        // a prefix of all the others: their source
  add(concat(stem, {5, 6}), 6, 0.0f, 1);        // equal to the first
  add(range(900, 4), 6, 0.0f, 1);               // shares nothing
  GenStats on_stats, off_stats;
  const std::vector<GenResult> on = generate(*l.model, reqs, forced_sharing(), &on_stats);
  const std::vector<GenResult> off = generate(*l.model, reqs, no_sharing(), &off_stats);
  CHECK(on_stats.shared_prompt_tokens == 3 * 23);  // the stem, by the three running prompts that extend it
  CHECK(off_stats.shared_prompt_tokens == 0);
  CHECK(on_stats.prompt_tokens == off_stats.prompt_tokens);
  check_same_generation(on, off, 1e-5);
  REQUIRE(on.size() == 9);
  CHECK(on[1].tokens.empty());
}

TEST_CASE("the offloading engine shares prefixes within a prefill unit, on every tier", "[prefix][offload]") {
  auto backend = make_cpu_backend(2);
  struct Placement {
    const char* what;
    Policy policy;
  };
  // gbs 5: the five prompts in one prefill unit; gbs 3 over two batches: a unit of three and one of two.
  const std::vector<Placement> placements = {
      {"all on the GPU", test::policy_of(5, 1, {100, 0, 0}, {100, 0, 0}, {100, 0, 0})},
      {"CPU tier, CPU attention", test::policy_of(5, 1, {0, 100, 0}, {0, 100, 0}, {0, 100, 0}, true)},
      {"disk tier", test::policy_of(5, 1, {0, 0, 100}, {0, 0, 100}, {0, 0, 100})},
      {"two batches, disk cache, CPU attention, no overlap",
       test::policy_of(3, 2, {50, 50, 0}, {0, 0, 100}, {0, 100, 0}, true, false)},
  };
  for (const json& c : fixture()["cases"]) {
    const std::string name = c["model"].get<std::string>();
    const std::vector<GenRequest> reqs = extended_prompts(c);
    const ModelBundle model = open_model(std::string(STRATA_FIXTURES_DIR) + "/models/" + name);
    PlanShape shape{int(reqs[0].prompt.size()), fixture()["new_tokens"].get<int>()};
    for (const Placement& pl : placements) {
      INFO(name << ": \"" << c["text"].get<std::string>() << "\", " << pl.what);
      OffloadOptions o;
      o.policy = pl.policy;
      o.offload_dir = test::temp_dir("prefix_engine");
      o.prefix_sharing = {1};
      OffloadEngine engine(model.config, *model.weights, *backend, o, shape);
      GenStats stats;
      const std::vector<GenResult> got = engine.generate(reqs, &stats);
      // One unit of five: P + 1 .. P + 4 copy P from it. Units of three (P + 4 and P + 3 copy P + 2
      // from P + 2) and of two (P + 1 copies P from P).
      const size_t p = c["prompt"].size();
      CHECK(stats.shared_prompt_tokens == int64_t(pl.policy.gpu_batch_size == 5 ? 4 * p : 2 * (p + 2) + p));
      REQUIRE(got.size() == reqs.size());
      for (size_t r = 0; r < reqs.size(); ++r) check_matches_hf(c, reqs[r].prompt.size() - p, got[r]);
    }
  }
}

TEST_CASE("the offloading engine: shared prefixes of compressed caches as computed whole", "[prefix][offload][quant]") {
  // Copied code rows are the codes the prompt would have written itself: the same greedy tokens.
  auto backend = make_cpu_backend(2);
  for (const char* name : {"tiny-llama", "tiny-opt"}) {
    const json* c = nullptr;
    for (const json& k : fixture()["cases"])
      if (k["model"] == name) c = &k;
    REQUIRE(c != nullptr);
    const std::vector<GenRequest> reqs = extended_prompts(*c);
    const ModelBundle model = open_model(std::string(STRATA_FIXTURES_DIR) + "/models/" + name);
    std::vector<std::vector<GenResult>> runs;
    for (const bool share : {true, false}) {
      OffloadOptions o;
      o.policy = test::policy_of(5, 1, {0, 100, 0}, {0, 100, 0}, {100, 0, 0}, true);
      o.policy.compress_kv_cache = Compression{4, 32};
      o.policy.compress_weights = Compression{4, 64};
      o.offload_dir = test::temp_dir("prefix_engine_q");
      o.share_prefixes = share;
      o.prefix_sharing = {1};
      OffloadEngine engine(model.config, *model.weights, *backend, o, {int(reqs[0].prompt.size()), 8});
      GenStats stats;
      runs.push_back(engine.generate(reqs, &stats));
      CHECK(stats.shared_prompt_tokens == (share ? int64_t(4 * (*c)["prompt"].size()) : 0));
    }
    INFO(name);
    check_same_generation(runs[0], runs[1], 1e-5);
  }
}

TEST_CASE("a step's prefix copies are checked against the cache and the step", "[prefix]") {
  Loaded l = load("tiny-llama", make_cpu_backend(1));
  KvCache cache = make_kv_cache(l.bundle.config, *l.backend, 3, 8);
  StepBatch step;
  step.tokens = {5, 6, 7};
  step.positions = {0, 1, 4};
  step.slots = {0, 0, 1};
  step.logit_rows = {2};
  step.prefix_copies = {{0, 1, 4}};
  CHECK_NOTHROW(l.model->forward(step, cache));  // slot 1's token at 4 follows the 4 copied positions
  step.prefix_copies = {{0, 1, 5}};
  CHECK_THROWS_WITH(l.model->forward(step, cache), Catch::Contains("would overwrite position 4"));
  step.prefix_copies = {{0, 3, 2}};
  CHECK_THROWS_WITH(l.model->forward(step, cache), Catch::Contains("outside the cache"));
  step.prefix_copies = {{1, 1, 2}};
  CHECK_THROWS_WITH(l.model->forward(step, cache), Catch::Contains("outside the cache"));
  step.prefix_copies = {{0, 2, 9}};
  CHECK_THROWS_WITH(l.model->forward(step, cache), Catch::Contains("outside the cache"));
}

TEST_CASE("shared prefixes: random batches generate as computed whole", "[prefix]") {
  // Prompts cut from a few stems with short random tails (many equal, prefix-of and one-token
  // prompts), random step budgets, choices and budgets of 0: both generators, on and off.
  Loaded l = load("tiny-llama", make_cpu_backend(2));
  const ModelBundle& model = l.bundle;
  auto backend = make_cpu_backend(2);
  std::mt19937 rng(17);
  int64_t shared = 0, engine_shared = 0;
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<Tokens> stems(1 + rng() % 3);
    for (Tokens& st : stems) st = range(int32_t(10 + rng() % 200), int(1 + rng() % 30));
    std::vector<GenRequest> reqs(1 + rng() % 7);
    int longest = 1;
    for (GenRequest& r : reqs) {
      const Tokens& st = stems[rng() % stems.size()];
      r.prompt.assign(st.begin(), st.begin() + long(1 + rng() % st.size()));
      for (int i = int(rng() % 4); i > 0; --i) r.prompt.push_back(int32_t(rng() % 50));
      r.sampling.max_new_tokens = int(rng() % 5);
      r.sampling.ignore_eos = true;
      r.n = 1 + int(rng() % 2);
      r.logprobs = 1;
      longest = std::max(longest, int(r.prompt.size()));
    }
    INFO("trial " << trial);
    GenOptions on = forced_sharing(), off = no_sharing();
    on.prefill_token_budget = off.prefill_token_budget = 1 + int64_t(rng() % 40);
    GenStats stats;
    check_same_generation(generate(*l.model, reqs, on, &stats), generate(*l.model, reqs, off), 1e-5);
    shared += stats.shared_prompt_tokens;
    // The engine, with a block that holds every choice: one GPU batch, or two.
    int seqs = 0;
    for (const GenRequest& r : reqs) seqs += r.n;
    const int ngb = 1 + int(rng() % 2);
    const bool cpu_attention = rng() % 2 == 0;
    std::vector<std::vector<GenResult>> engine_runs;
    for (const bool share : {true, false}) {
      OffloadOptions o;
      o.policy = test::policy_of((seqs + ngb - 1) / ngb, ngb, {0, 100, 0}, {0, 100, 0}, {100, 0, 0}, cpu_attention);
      o.policy.prefill_tokens = 4096;
      o.offload_dir = test::temp_dir("prefix_random");
      o.share_prefixes = share;
      o.prefix_sharing = {1};
      OffloadEngine engine(model.config, *model.weights, *backend, o, {longest, 4});
      GenStats stats;
      engine_runs.push_back(engine.generate(reqs, &stats));
      engine_shared += stats.shared_prompt_tokens;
    }
    check_same_generation(engine_runs[0], engine_runs[1], 1e-5);
  }
  CHECK(shared > 100);  // the batches did share
  CHECK(engine_shared > 100);
}

TEST_CASE("strata run shares prefixes by default, also under --policy, and --no-prefix-sharing computes prompts whole",
          "[prefix][cli]") {
  const fs::path dir = test::temp_dir("prefixcli");
  const fs::path in = dir / "in.jsonl";
  {
    std::ofstream f(in);
    const std::string instr =
        "Answer in one word. Is the following sentence about an animal, a plant or a machine? Think of what "
        "the sentence names first, then of what it does. Sentence:";
    const char* items[] = {"The fox ran.", "The oak grew tall.", "The engine started.", "A cat slept.",
                           "The rose opened.", "The pump failed.", "An owl called.", "Moss spread."};
    for (size_t i = 0; i < 8; ++i) f << json{{"id", i}, {"prompt", instr + " " + items[i]}}.dump() << "\n";
  }
  // Blocks of 3: the first shares within itself, the next two begin from its kept instruction too.
  const std::string base = "run --model " + std::string(STRATA_FIXTURES_DIR) + "/models/tiny-llama -i " +
                           in.string() + " --device cpu --no-progress --max-new-tokens 5 --ignore-eos --batch-size 3";
  test::CliResult on = test::run_strata(base + " -o " + (dir / "on.jsonl").string());
  INFO(on.output);
  REQUIRE(on.code == 0);
  CHECK_THAT(on.output, Catch::Contains("prompt tokens copied from shared prefixes, not computed"));
  test::CliResult off = test::run_strata(base + " -o " + (dir / "off.jsonl").string() + " --no-prefix-sharing");
  INFO(off.output);
  REQUIRE(off.code == 0);
  CHECK_THAT(off.output, !Catch::Contains("shared prefixes"));
  auto tokens = [](const fs::path& p) {
    std::map<int, json> m;
    std::ifstream f(p);
    for (std::string line; std::getline(f, line);) {
      const json j = json::parse(line);
      m[j["id"].get<int>()] = j["tokens"];
    }
    return m;
  };
  const auto a = tokens(dir / "on.jsonl"), b = tokens(dir / "off.jsonl");
  CHECK(a.size() == 8);
  CHECK(a == b);
  // The offloading engine: prefill units of four prompts share within themselves.
  const fs::path policy = test::write_file(dir / "block8.yaml",
                                           "gpu_batch_size: 4\nnum_gpu_batches: 2\nweights: {gpu: 0, cpu: 100, disk: 0}\n"
                                           "kv_cache: {gpu: 0, cpu: 100, disk: 0}\nactivations: {gpu: 100, cpu: 0, disk: 0}\n"
                                           "prefill_tokens: 4096\n");
  test::CliResult engine = test::run_strata(base + " -o " + (dir / "engine.jsonl").string() + " --policy " +
                                            policy.string() + " --offload-dir " + (dir / "off").string() + " --report");
  INFO(engine.output);
  REQUIRE(engine.code == 0);
  CHECK_THAT(engine.output, Catch::Contains("prompt tokens copied from shared prefixes, not computed"));
  CHECK_THAT(engine.output, Catch::Contains(" copied from shared prefixes), decode "));  // --report's line
  CHECK(tokens(dir / "engine.jsonl") == a);
}

TEST_CASE("CUDA: shared prefixes copy fp16 cache rows and generate as computed whole", "[prefix][cuda]") {
  if (!cuda_available()) {
    WARN("no GPU: skipped");
    return;
  }
  const json& c = fixture()["cases"][0];
  Loaded l = load(c["model"].get<std::string>(), make_cuda_backend(0));
  const std::vector<GenRequest> reqs = extended_prompts(c);
  GenStats stats;
  const std::vector<GenResult> on = generate(*l.model, reqs, forced_sharing(), &stats);
  const std::vector<GenResult> off = generate(*l.model, reqs, no_sharing());
  CHECK(stats.shared_prompt_tokens == int64_t(4 * c["prompt"].size()));
  // Other step shapes may take another GEMM order over fp16 activations: logits a few 1e-3 apart.
  check_same_generation(on, off, 1e-2);
}
