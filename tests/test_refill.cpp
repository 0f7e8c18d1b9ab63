// Continuous batching in the cost model (issue 37, point 4): answer-length statistics against brute
// force, the steady state's share of prefilling slots against a simulation of slots that refill,
// the steady step at its limits against the model's own prefill stage, and `strata policy`'s
// --gen-lens / --gen-len-mean.
#include "test_paths.h"

#include <catch2/catch.hpp>
#include <deque>
#include <nlohmann/json.hpp>
#include <numeric>

#include "cli_support.h"
#include "strata/core/error.h"
#include "strata/policy/refill.h"
#include "temp_files.h"

using namespace strata;
using strata::test::CliResult;
using strata::test::temp_dir;
using strata::test::write_file;

namespace {

CliResult strata_cli(const std::string& args) { return strata::test::run_strata(args); }

const std::string kPaperMachine = std::string(STRATA_FIXTURES_DIR) + "/../../policies/hardware/t4-paper.yaml";

Policy all_on_gpu(int gbs, int ngb) {
  Policy p;
  p.gpu_batch_size = gbs;
  p.num_gpu_batches = ngb;
  p.weights = {100, 0, 0};
  p.kv_cache = {100, 0, 0};
  p.activations = {100, 0, 0};
  return p;
}

}  // namespace

TEST_CASE("refill: answer-length statistics equal brute force over every draw", "[refill]") {
  GenLengths g;
  g.samples = {1, 2, 2, 5};
  CHECK(g.mean() == Approx(2.5));
  CHECK(g.slot_weighted_mean() == Approx(34.0 / 10.0));  // (1 + 4 + 4 + 25) / (1 + 2 + 2 + 5)
  // E[max of 3 draws with replacement]: all 4^3 ordered draws, equally likely.
  double sum = 0;
  for (int a : g.samples)
    for (int b : g.samples)
      for (int c : g.samples) sum += std::max({a, b, c});
  CHECK(g.expected_longest(3) == Approx(sum / 64));
  CHECK(g.expected_longest(1) == Approx(2.5));
  CHECK(g.expected_longest(1000) == Approx(5).epsilon(1e-6));

  const GenLengths assumed = GenLengths::assumed(96, 256);
  CHECK(assumed.mean() == 96);
  CHECK(assumed.slot_weighted_mean() == 96);
  CHECK(assumed.expected_longest(32) == 256);
  CHECK_THROWS_WITH(GenLengths::assumed(0.5, 256), Catch::Contains("at least 1 token"));
}

TEST_CASE("refill: the share of slots prefilling per step is 1 / mean answer, as slots that refill run",
          "[refill]") {
  // A simulation of the steady state: 8 slots, each taking the next request when its answer ends;
  // a request's first token comes from its prefill step, the rest from decode steps.
  const std::vector<int> lengths = {3, 40, 7, 1, 12, 90, 5, 22, 9, 60};
  std::deque<int> queue;
  for (int r = 0; r < 2000; ++r) queue.push_back(lengths[size_t(r) % lengths.size()]);
  std::vector<int> left(8, 0);
  long prefilling = 0, slot_steps = 0;
  while (!queue.empty()) {
    for (int& l : left) {
      if (l == 0 && !queue.empty()) {
        l = queue.front(), queue.pop_front();
        ++prefilling;
      }
      if (l > 0) --l, ++slot_steps;
    }
  }
  GenLengths g;
  g.samples = lengths;
  CHECK(double(prefilling) / double(slot_steps) == Approx(1.0 / g.mean()).epsilon(0.01));
}

TEST_CASE("refill: the steady step at its limits, and blocks waiting for their longest answer", "[refill]") {
  const HardwareProfile hw = load_hardware_profile(kPaperMachine);
  const ModelConfig cfg = *config_preset("opt-1.3b");
  for (const Policy& p : {all_on_gpu(8, 2), [] {
                            Policy q = all_on_gpu(16, 4);
                            q.weights = {0, 100, 0};
                            q.kv_cache = {0, 100, 0};
                            q.cpu_attention = true;
                            return q;
                          }()}) {
    INFO(policy_to_yaml(p));
    // Every answer one token long: every slot prefills in every step, so a steady step is a
    // prefill step of the whole block.
    const RefillPrediction one = predict_refill(cfg, p, 256, GenLengths::assumed(1, 1), hw);
    const Prediction pre = evaluate(cfg, p, Workload{256, 1}, hw);
    CHECK(one.steady_step.total == Approx(pre.prefill.total).epsilon(1e-9));
    CHECK(one.refill_tok_s == Approx(double(p.block_size()) / pre.prefill_s).epsilon(1e-9));

    // Blocks: the block's answers' tokens over a block that runs to its longest answer.
    GenLengths g;
    g.samples = {4, 10, 16, 30, 64};
    const RefillPrediction r = predict_refill(cfg, p, 256, g, hw);
    CHECK(r.block_len == Approx(g.expected_longest(p.block_size())));
    const Prediction block = evaluate(cfg, p, Workload{256, int(std::lround(r.block_len))}, hw);
    CHECK(r.blocks_tok_s == Approx(p.block_size() * g.mean() / block.total_s));
    CHECK(r.blocks_occupancy == Approx(g.mean() / r.block_len));
    // A steady step carries some prefill: slower than a pure decode step, faster than a prefill step.
    const Prediction steady_ctx = evaluate(cfg, p, Workload{256, int(std::lround(g.slot_weighted_mean()))}, hw);
    CHECK(r.steady_step.total > steady_ctx.decode.total);
    CHECK(r.steady_step.total < steady_ctx.prefill.total);
    CHECK(r.refill_tok_s > r.blocks_tok_s);  // answers of 4 to 64 tokens: blocks idle most slots
  }
}

TEST_CASE("refill: answer lengths from a file, and what the file can get wrong", "[refill]") {
  const auto dir = temp_dir("refill");
  // Integers, comments, strata run's output lines (one choice, n choices, a refused request).
  const auto good = write_file(dir / "lengths.jsonl",
                               "# answer lengths\n7\n\n{\"id\": 1, \"completion\": \"hi\", \"completion_tokens\": 12}\n"
                               "{\"id\": 2, \"choices\": [{\"completion_tokens\": 3}, {\"completion_tokens\": 5}]}\n"
                               "{\"id\": 3, \"error\": \"prompt too long\"}\n");
  CHECK(GenLengths::from_file(good.string()).samples == std::vector<int>{7, 12, 3, 5});
  const auto bad = write_file(dir / "bad.jsonl", "7\n{\"id\": 4, \"completion\": \"x\"}\n");
  CHECK_THROWS_WITH(GenLengths::from_file(bad.string()), Catch::Contains("bad.jsonl:2") && Catch::Contains("expected"));
  const auto zero = write_file(dir / "zero.txt", "5\n0\n");
  CHECK_THROWS_WITH(GenLengths::from_file(zero.string()), Catch::Contains("zero.txt:2") && Catch::Contains("positive"));
  const auto empty = write_file(dir / "empty.txt", "# nothing\n");
  CHECK_THROWS_WITH(GenLengths::from_file(empty.string()), Catch::Contains("no answer lengths"));
  CHECK_THROWS_WITH(GenLengths::from_file((dir / "missing.txt").string()), Catch::Contains("cannot read"));
}

TEST_CASE("strata policy predicts continuous batching for a job's answer lengths", "[refill][search]") {
  const auto dir = temp_dir("refill_cli");
  const auto lengths = write_file(dir / "lengths.txt", "3\n8\n20\n31\n5\n");
  const std::string base = "policy --model opt-1.3b --hardware " + kPaperMachine + " --prompt-len 128 --gen-len 32";
  const CliResult j = strata_cli(base + " --json --gen-lens " + lengths.string());
  REQUIRE(j.code == 0);
  const nlohmann::json c = nlohmann::json::parse(j.output)["continuous_batching"];
  CHECK(c["answers"] == 5);
  CHECK(c["mean_len"].get<double>() == Approx(13.4));
  CHECK(c["refill_tok_s"].get<double>() > c["blocks_tok_s"].get<double>());
  CHECK(c["blocks_occupancy"].get<double>() < 1);
  // The candidates are ranked by refill's throughput, the chosen policy first.
  const nlohmann::json cands = nlohmann::json::parse(j.output)["candidates"];
  REQUIRE(cands.size() >= 2);
  for (size_t i = 1; i < cands.size(); ++i)
    CHECK(cands[i - 1]["refill_tok_s"].get<double>() >= cands[i]["refill_tok_s"].get<double>());
  CHECK(cands[0]["refill_tok_s"].get<double>() == Approx(c["refill_tok_s"].get<double>()));
  CHECK(cands[0]["policy"] == nlohmann::json::parse(j.output)["policy"]);
  const CliResult text = strata_cli(base + " --gen-len-mean 12");
  REQUIRE(text.code == 0);
  CHECK_THAT(text.output, Catch::Contains("continuous batching, answers of 12.0 tokens") &&
                              Catch::Contains("blocks ") && Catch::Contains("refill ") &&
                              Catch::Contains("ranked by refill"));
  CHECK(nlohmann::json::parse(strata_cli(base + " --json").output).count("continuous_batching") == 0);
  // What the options can get wrong.
  CHECK_THAT(strata_cli(base + " --gen-len-mean 40").output, Catch::Contains("longer than --gen-len 32"));
  const auto longer = write_file(dir / "longer.txt", "3\n64\n");
  const CliResult l = strata_cli(base + " --gen-lens " + longer.string());
  CHECK(l.code == 1);
  CHECK_THAT(l.output, Catch::Contains("longer.txt: an answer of 64 tokens is longer than --gen-len 32"));
  CHECK_THAT(strata_cli(base + " --gen-len-mean 12 --gen-lens " + lengths.string()).output,
             Catch::Contains("give one of them"));
}
