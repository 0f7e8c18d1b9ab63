// The host's share of a sampled decode step: Sampler::sample over one row of fp32 logits, for
// greedy decoding, the logit adjustments (penalties, bias), temperature alone, and with top-k,
// top-p and min-p; and the same draws from the row's 1024 candidates (row_candidates.h), which is
// what a GPU's rows bring to the host since 2026-11-29 (StepSampler, where the backend samples on
// the device), at 8 KiB a row against a 128k vocabulary's 512.
// Logits: a row like a language model's, most tokens N(0, 2) and 40 of them raised by 8 to 14
// (a peaked distribution whose top-p 0.9 nucleus holds tens of tokens). Reports microseconds per
// row (the fastest of --repeat rows), the rate at which the row's logits are read, and the time
// against plain greedy's, one pass over the row (max_element): the least any of them can cost;
// then the mean per row from the candidates, with the share of draws they decided (the rest fall
// back to the full row). One thread (StepSampler spreads a large step's rows over a pool of them).
// With a GPU: a step of --rows rows on the device, the full logits' copy to the host (what a
// sampled step cost before) against row_candidates and the candidates' copy.
// Usage: bench_sampling [--vocab 128256] [--repeat 50] [--history 512] [--rows 64]
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bench_common.h"
#include "strata/backend/backend.h"
#include "strata/runtime/row_candidates.h"
#include "strata/runtime/sampler.h"

using namespace strata;
using bench::Clock;
using bench::seconds;

namespace {

struct Args {
  int64_t vocab = 128256;  // Llama 3's
  int repeat = 50;
  int history = 512;       // prompt + answer tokens the penalties read
  int64_t rows = 64;       // the device step's rows
};

Args parse(int argc, char** argv) {
  Args a;
  bench::for_each_option(argc, argv, [&](const std::string& k, const std::string& v) {
    if (k == "--vocab") a.vocab = std::stoll(v);
    else if (k == "--repeat") a.repeat = std::stoi(v);
    else if (k == "--history") a.history = std::stoi(v);
    else if (k == "--rows") a.rows = std::stoll(v);
    else STRATA_FAIL("unknown option " << k);
  });
  STRATA_CHECK(a.vocab >= 100 && a.repeat >= 1 && a.history >= 0 && a.rows >= 1,
               "--vocab >= 100, --repeat >= 1, --history >= 0, --rows >= 1");
  return a;
}

// A row like a language model's (above).
std::vector<float> model_like_row(int64_t vocab, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(static_cast<size_t>(vocab));
  for (float& l : logits) l = normal(rng);
  std::uniform_int_distribution<int64_t> token(0, vocab - 1);
  for (int i = 0; i < 40; ++i) logits[size_t(token(rng))] += 8.0f + float(i % 7);
  return logits;
}

// The device's side of a sampled step: copying the logits whole (as every sampled step did
// before) against the candidates' kernel and their copy. Seconds per step, the fastest of
// `repeat`, each ending in its synchronizing copy.
void time_device_step(const Args& args, std::mt19937& rng) {
  if (!cuda_available()) {
    std::printf("no GPU: the device step is not timed\n");
    return;
  }
  auto backend = make_cuda_backend(0);
  const int64_t R = args.rows, V = args.vocab;
  std::vector<float> host(static_cast<size_t>(R * V));
  for (int64_t r = 0; r < R; ++r) {
    const std::vector<float> row = model_like_row(V, rng);
    std::copy(row.begin(), row.end(), host.begin() + r * V);
  }
  Buffer logits_buf = backend->alloc(host.size() * 4);
  backend->copy_to_device(logits_buf.data(), host.data(), host.size() * 4);
  const Tensor logits = logits_buf.view(0, DType::F32, {R, V});
  std::vector<float> temperatures(static_cast<size_t>(R), 0.8f);
  Buffer temps_buf = backend->alloc(size_t(R) * 4);
  backend->copy_to_device(temps_buf.data(), temperatures.data(), size_t(R) * 4);
  const int64_t capacity = kMaxRowCandidates;
  const size_t candidates_bytes = size_t(R) * row_candidates_bytes(capacity);
  Buffer out_buf = backend->alloc(candidates_bytes);
  std::vector<uint8_t> candidates(candidates_bytes);
  double full = 1e30, kernel = 1e30;
  for (int i = 0; i < args.repeat; ++i) {
    auto t0 = Clock::now();
    backend->copy_to_host_f32(logits, host.data());
    full = std::min(full, seconds(t0, Clock::now()));
    t0 = Clock::now();
    backend->row_candidates(logits, temps_buf.view(0, DType::F32, {R}), capacity, out_buf.data());
    backend->copy_to_host(candidates.data(), out_buf.data(), candidates_bytes);
    kernel = std::min(kernel, seconds(t0, Clock::now()));
  }
  const double full_bytes = double(R * V) * 4;
  std::printf("device step, %lld rows (fp32 logits), fastest of %d:\n", static_cast<long long>(R), args.repeat);
  std::printf("  %-32s %9.1f us a step  %8.1f MB at %6.2f GB/s\n", "logits copied whole", full * 1e6, full_bytes / 1e6,
              full_bytes / full / 1e9);
  std::printf("  %-32s %9.1f us a step  %8.1f MB; logits read at %6.2f GB/s\n", "row_candidates + their copy",
              kernel * 1e6, double(candidates_bytes) / 1e6, full_bytes / kernel / 1e9);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args args = parse(argc, argv);
    std::mt19937 rng(1);
    const std::vector<float> logits = model_like_row(args.vocab, rng);
    std::uniform_int_distribution<int64_t> token(0, args.vocab - 1);
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

    // The same draws from the row's candidates, as on a GPU: the host's part only (the kernel
    // made them on the device). Greedy and adjusted rows never take this path.
    std::printf("from the row's %lld candidates (%zu bytes against the row's %.0f):\n",
                static_cast<long long>(kMaxRowCandidates), row_candidates_bytes(kMaxRowCandidates), row_bytes);
    for (const Setting& s : settings) {
      if (s.p.greedy() || s.p.adjusts_logits()) continue;
      std::vector<uint8_t> bytes(row_candidates_bytes(kMaxRowCandidates));
      compute_row_candidates(logits.data(), args.vocab, s.p.temperature, kMaxRowCandidates, bytes.data());
      const RowCandidates c = read_row_candidates(bytes.data(), 0, kMaxRowCandidates, args.vocab);
      Sampler sampler(s.p);
      double total = 0;  // the mean, not the fastest: a draw's walk is as long as its number says
      int decided = 0;
      for (int r = 0; r < args.repeat; ++r) {
        const auto t0 = Clock::now();
        const std::optional<int32_t> t = sampler.sample(c, 0);
        total += seconds(t0, Clock::now());
        if (t) ++decided;
        else sampler.sample(logits.data(), args.vocab);  // the fallback, untimed
      }
      std::printf("  %-32s %9.2f us a row (mean)  decided %d of %d draws\n", s.name, total / args.repeat * 1e6,
                  decided, args.repeat);
    }
    time_device_step(args, rng);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_sampling: %s\n", e.what());
    return 1;
  }
}
