// The host's share of a sampled decode step: Sampler::sample over one row of fp32 logits, for
// greedy decoding, the logit adjustments (penalties, bias), temperature alone, and with top-k,
// top-p and min-p. Every row that is not plain greedy takes this path (StepSampler copies the
// step's logits to the host), once per sequence per decode step, so at a vocabulary of 128k and a
// batch of 64 a millisecond a row is 64 ms a step, more than a resident 8B model's decode step
// on an H100.
// Logits: a row like a language model's, most tokens N(0, 2) and 40 of them raised by 8 to 14
// (a peaked distribution whose top-p 0.9 nucleus holds tens of tokens). Reports microseconds per
// row (the fastest of --repeat rows), the rate at which the row's logits are read, and the time
// against plain greedy's, one pass over the row (max_element): the least any of them can cost.
// One thread (StepSampler spreads a large step's rows over a pool of them).
// Usage: bench_sampling [--vocab 128256] [--repeat 50] [--history 512]
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bench_common.h"
#include "strata/runtime/sampler.h"

using namespace strata;
using bench::Clock;
using bench::seconds;

namespace {

struct Args {
  int64_t vocab = 128256;  // Llama 3's
  int repeat = 50;
  int history = 512;       // prompt + answer tokens the penalties read
};

Args parse(int argc, char** argv) {
  Args a;
  bench::for_each_option(argc, argv, [&](const std::string& k, const std::string& v) {
    if (k == "--vocab") a.vocab = std::stoll(v);
    else if (k == "--repeat") a.repeat = std::stoi(v);
    else if (k == "--history") a.history = std::stoi(v);
    else STRATA_FAIL("unknown option " << k);
  });
  STRATA_CHECK(a.vocab >= 100 && a.repeat >= 1 && a.history >= 0, "--vocab >= 100, --repeat >= 1, --history >= 0");
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args args = parse(argc, argv);
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 2.0f);
    std::vector<float> logits(size_t(args.vocab));
    for (float& l : logits) l = normal(rng);
    std::uniform_int_distribution<int64_t> token(0, args.vocab - 1);
    for (int i = 0; i < 40; ++i) logits[size_t(token(rng))] += 8.0f + float(i % 7);
    std::vector<int32_t> history(size_t(args.history));
    for (int32_t& t : history) t = int32_t(token(rng));
    const std::span<const int32_t> prompt(history.data(), history.size() / 2);
    const std::span<const int32_t> answer(history.data() + history.size() / 2, history.size() - history.size() / 2);

    struct Setting {
      const char* name;
      SamplingParams p;
    };
    std::vector<Setting> settings;
    auto add = [&](const char* name, auto&& set) {
      SamplingParams p;
      p.seed = 7;
      set(p);
      settings.push_back({name, p});
    };
    add("greedy", [](SamplingParams&) {});
    add("greedy, repetition 1.1", [](SamplingParams& p) { p.repetition_penalty = 1.1f; });
    add("greedy, freq 0.5 + pres 0.5", [](SamplingParams& p) { p.frequency_penalty = p.presence_penalty = 0.5f; });
    add("temperature 1", [](SamplingParams& p) { p.temperature = 1.0f; });
    add("temperature 0.7, top-p 0.9", [](SamplingParams& p) { p.temperature = 0.7f, p.top_p = 0.9f; });
    add("temperature 1, top-k 50", [](SamplingParams& p) { p.temperature = 1.0f, p.top_k = 50; });
    add("temperature 1, min-p 0.05", [](SamplingParams& p) { p.temperature = 1.0f, p.min_p = 0.05f; });
    add("temp 0.8, top-k 40, top-p 0.95", [](SamplingParams& p) { p.temperature = 0.8f, p.top_k = 40, p.top_p = 0.95f; });

    std::printf("vocab %lld, history %d tokens, fastest of %d rows, one thread\n", static_cast<long long>(args.vocab),
                args.history, args.repeat);
    const double row_bytes = double(args.vocab) * sizeof(float);
    double pass = 0;  // plain greedy's time: one pass over the row
    for (const Setting& s : settings) {
      Sampler sampler(s.p);
      double best = 1e30;
      int64_t picked = 0;
      for (int r = 0; r < args.repeat; ++r) {
        const auto t0 = Clock::now();
        picked += sampler.sample(logits.data(), args.vocab, prompt, answer);
        best = std::min(best, seconds(t0, Clock::now()));
      }
      if (pass == 0) pass = best;  // the first setting is plain greedy
      std::printf("  %-32s %9.1f us a row  logits at %6.2f GB/s  %6.1fx one pass  (%lld)\n", s.name, best * 1e6,
                  row_bytes / best / 1e9, best / pass, static_cast<long long>(picked % 10));
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_sampling: %s\n", e.what());
    return 1;
  }
}
