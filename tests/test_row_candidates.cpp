// Sampling from a row's candidates (row_candidates.h) against sampling from the full row: the
// same seeded sampler must draw the same tokens either way, falling back to the full row where
// the candidates cannot decide, and logprobs from candidates must equal the full row's. The full
// row's sampler is itself checked against transformers' warpers (test_sampler.cpp), so this file
// only needs the two paths to agree; compute_row_candidates sums in index order, as the full
// row's path does, so agreement is exact. On the GPU (the emulated backend in CI) the step's
// sampler draws from the device's candidates and must give the host's draws.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "candidate_test_rows.h"
#include "forwarding_backend.h"
#include "strata/backend/backend.h"
#include "strata/runtime/row_candidates.h"
#include "strata/runtime/sampler.h"
#include "strata/runtime/sequence.h"

using namespace strata;

namespace {

std::vector<std::vector<float>> test_rows(int64_t vocab, std::mt19937& rng) {
  return test::candidate_test_rows(vocab, rng, [](float x) { return x; });
}

// Each vocabulary, capacity and row of the grid the host tests walk.
template <class Fn>
void for_each_row(std::mt19937& rng, Fn&& fn) {
  for (int64_t vocab : {50, 3000}) {
    const auto rows = test_rows(vocab, rng);
    for (int64_t capacity : {int64_t(8), int64_t(64), kMaxRowCandidates})
      for (size_t r = 0; r < rows.size(); ++r) fn(vocab, capacity, r, rows[r]);
  }
}

std::vector<SamplingParams> test_params() {
  std::vector<SamplingParams> out;
  for (float t : {0.6f, 1.0f, 1.7f})
    for (int k : {0, 5, 40, 2000})
      for (float p : {1.0f, 0.9f, 0.5f})
        for (float mp : {0.0f, 0.05f}) {
          SamplingParams s;
          s.temperature = t, s.top_k = k, s.top_p = p, s.min_p = mp, s.seed = 17;
          out.push_back(s);
        }
  return out;
}

std::vector<uint8_t> candidates_of(const std::vector<float>& row, float temperature, int64_t capacity) {
  std::vector<uint8_t> bytes(row_candidates_bytes(capacity));
  compute_row_candidates(row.data(), int64_t(row.size()), temperature, capacity, bytes.data());
  return bytes;
}

}  // namespace

TEST_CASE("row candidates: the same draws as the full row, falling back where they cannot decide", "[sampler]") {
  std::mt19937 rng(5);
  int64_t decided = 0, fell_back = 0;
  for_each_row(rng, [&](int64_t vocab, int64_t capacity, size_t r, const std::vector<float>& row) {
    for (const SamplingParams& params : test_params()) {
      const auto bytes = candidates_of(row, params.temperature, capacity);
      const RowCandidates c = read_row_candidates(bytes.data(), 0, capacity, vocab);
      Sampler full(params), from_candidates(params);
      for (int step = 0; step < 12; ++step) {
        INFO("vocab " << vocab << " capacity " << capacity << " row " << r << " t " << params.temperature << " k "
                      << params.top_k << " p " << params.top_p << " min_p " << params.min_p << " step " << step);
        const int32_t expected = full.sample(row.data(), vocab);
        std::optional<int32_t> got = from_candidates.sample(c, 0);
        if (got) {
          ++decided;
        } else {
          ++fell_back;
          CHECK(capacity < vocab);  // candidates holding the whole row always decide
          got = from_candidates.sample(row.data(), vocab);
        }
        REQUIRE(*got == expected);
      }
    }
  });
  // Both paths ran, many times (flat rows at capacity 8 fall back on most draws).
  CHECK(decided > 10000);
  CHECK(fell_back > 5000);
}

TEST_CASE("row candidates: greedy and adjusted rows are left to the caller, without a draw", "[sampler]") {
  const std::vector<float> row = {0.5f, 2.0f, -1.0f, 2.0f};
  const auto bytes = candidates_of(row, 1.0f, 4);
  const RowCandidates c = read_row_candidates(bytes.data(), 0, 4, 4);
  SamplingParams greedy;
  CHECK_FALSE(Sampler(greedy).sample(c, 0));
  SamplingParams penalised;
  penalised.temperature = 1.0f, penalised.repetition_penalty = 1.3f, penalised.seed = 3;
  Sampler a(penalised), b(penalised);
  CHECK_FALSE(a.sample(c, 0));
  // No uniform number was taken: the next full-row draws agree with a fresh sampler's.
  for (int i = 0; i < 8; ++i) CHECK(a.sample(row.data(), 4) == b.sample(row.data(), 4));
  SamplingParams held;
  held.temperature = 1.0f, held.min_tokens = 2;
  Sampler holding(held, {1});
  CHECK_FALSE(holding.sample(c, 1));
}

TEST_CASE("row candidates: a row with NaN falls back to the full row", "[sampler]") {
  std::vector<float> row = {0.5f, 2.0f, NAN, 1.0f};
  const auto bytes = candidates_of(row, 1.0f, 4);
  const RowCandidates c = read_row_candidates(bytes.data(), 0, 4, 4);
  SamplingParams params;
  params.temperature = 1.0f;
  CHECK_FALSE(Sampler(params).sample(c, 0));
  CHECK_FALSE(step_logprobs(c, 1, 2));
}

TEST_CASE("row candidates: logprobs equal the full row's, or fall back", "[sampler]") {
  std::mt19937 rng(9);
  int64_t decided = 0, fell_back = 0;
  for_each_row(rng, [&](int64_t vocab, int64_t capacity, size_t r, const std::vector<float>& row) {
    const auto bytes = candidates_of(row, 0.0f, capacity);
    const RowCandidates c = read_row_candidates(bytes.data(), 0, capacity, vocab);
    for (int top : {0, 1, 5, 20}) {
      for (int64_t pick = 0; pick < std::min<int64_t>(c.count, 12); pick += 3) {
        INFO("vocab " << vocab << " capacity " << capacity << " row " << r << " top " << top << " pick " << pick);
        const int32_t sampled = c.ids[pick];
        const StepLogprobs expected = step_logprobs(row.data(), vocab, sampled, top);
        const std::optional<StepLogprobs> got = step_logprobs(c, sampled, top);
        if (!got) {
          ++fell_back;
          CHECK(capacity < vocab);
          continue;
        }
        ++decided;
        CHECK(got->sampled.token == expected.sampled.token);
        CHECK(got->sampled.logprob == expected.sampled.logprob);
        REQUIRE(got->top.size() == expected.top.size());
        for (size_t i = 0; i < got->top.size(); ++i) {
          CHECK(got->top[i].token == expected.top[i].token);
          CHECK(got->top[i].logprob == expected.top[i].logprob);
        }
      }
    }
  });
  CHECK(fell_back > 0);
  CHECK(decided > 4 * fell_back);
  // A token that is not among the candidates needs the full row.
  std::vector<float> row(100);
  for (size_t i = 0; i < row.size(); ++i) row[i] = float(i);
  const auto bytes = candidates_of(row, 0.0f, 8);
  CHECK_FALSE(step_logprobs(read_row_candidates(bytes.data(), 0, 8, 100), 3, 0));
  CHECK(step_logprobs(read_row_candidates(bytes.data(), 0, 8, 100), 99, 0));
}

TEST_CASE("row candidates: the reference orders by logit, the higher id first among ties", "[sampler]") {
  const std::vector<float> row = {1.0f, 3.0f, -0.0f, 3.0f, 0.0f, -INFINITY, 2.0f};
  const auto bytes = candidates_of(row, 2.0f, 6);
  const RowCandidates c = read_row_candidates(bytes.data(), 0, 6, 7);
  CHECK(c.max == 3.0f);
  CHECK(c.count == 6);
  const std::vector<int32_t> ids(c.ids, c.ids + c.count);
  CHECK(ids == std::vector<int32_t>{3, 1, 6, 0, 4, 2});
  double sum_t = 0, sum_1 = 0;
  for (float x : row) {
    sum_t += std::exp(double(x) * 0.5 - 1.5);
    sum_1 += std::exp(double(x) - 3.0);
  }
  CHECK(c.sum_t == sum_t);
  CHECK(c.sum_1 == sum_1);
}

TEST_CASE("CUDA: a step's sampled rows drawn from their candidates give the host's draws and logprobs",
          "[sampler][cuda]") {
  if (!cuda_available()) {
    WARN("no GPU: skipped");
    return;
  }
  // 32 rows of a 3000-token vocabulary (past the 1024 candidates): greedy, sampled with each
  // warper, adjusted (their logits must cross whole), and four flat rows whose draws often fall
  // past their candidates. Several steps, so that sequences that fell back go on drawing in step.
  // At most 7 rows fall back a step, within StepSampler's quarter of the step: those cross one by
  // one.
  constexpr int64_t R = 32, V = 3000;
  constexpr int kSteps = 6;
  auto cuda = make_cuda_backend(0);
  test::CopyCountingBackend backend(*cuda);
  ModelConfig cfg;
  cfg.vocab_size = int(V);
  cfg.max_positions = 64;
  cfg.eos_ids = {int32_t(V + 1)};  // never drawn: every row runs all the steps
  std::mt19937 rng(12);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> host(static_cast<size_t>(R * V));
  for (int64_t r = 0; r < R; ++r)
    for (int64_t i = 0; i < V; ++i) host[size_t(r * V + i)] = (r >= 10 && r < 14 ? 0.05f : 3.0f) * normal(rng);
  Buffer buf = backend.alloc(host.size() * 4);
  backend.copy_to_device(buf.data(), host.data(), host.size() * 4);
  const Tensor logits = buf.view(0, DType::F32, {R, V});

  std::vector<GenRequest> reqs(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    GenRequest& q = reqs[size_t(r)];
    q.prompt = {int32_t(r), 5};
    q.sampling.seed = uint64_t(300 + r);
    q.sampling.max_new_tokens = kSteps;
    if (r != 0 && r != 1) q.sampling.temperature = r % 2 ? 0.8f : 1.2f;  // rows 0 and 1 greedy
    if (r == 3 || r == 11) q.sampling.top_p = 0.9f;
    if (r == 4 || r == 12) q.sampling.top_k = 40;
    if (r == 5) q.sampling.min_p = 0.1f;
    if (r == 6 || r == 1) q.sampling.repetition_penalty = 1.4f;
    if (r == 7) q.sampling.logit_bias = {{17, 5.0f}};
    if (r % 3 == 0) q.logprobs = r == 9 ? 0 : 5;
  }
  std::vector<Sequence> seqs;
  for (int64_t r = 0; r < R; ++r) seqs.push_back(start_sequence(reqs[size_t(r)], cfg, int(r), size_t(r)));
  std::vector<Sequence*> rows;
  for (Sequence& s : seqs) rows.push_back(&s);
  StepSampler sampler(backend, cfg, size_t(R));
  for (int step = 0; step < kSteps; ++step) sampler.sample(logits, rows);

  for (int64_t r = 0; r < R; ++r) {
    INFO("row " << r);
    const GenRequest& q = reqs[size_t(r)];
    const Sequence& s = seqs[size_t(r)];
    REQUIRE(s.result.tokens.size() == size_t(kSteps));
    Sampler reference(q.sampling);
    std::vector<int32_t> answer;
    for (int step = 0; step < kSteps; ++step) {
      INFO("step " << step);
      const float* row = host.data() + r * V;
      answer.push_back(reference.sample(row, V, q.prompt, answer));
      CHECK(s.result.tokens[size_t(step)] == answer.back());
      if (q.logprobs < 0) continue;
      const StepLogprobs want = step_logprobs(row, V, answer.back(), q.logprobs);
      const StepLogprobs& got = s.result.logprobs[size_t(step)];
      CHECK(got.sampled.logprob == Approx(want.sampled.logprob).margin(1e-9));
      REQUIRE(got.top.size() == want.top.size());
      for (size_t i = 0; i < got.top.size(); ++i) {
        CHECK(got.top[i].token == want.top[i].token);
        CHECK(got.top[i].logprob == Approx(want.top[i].logprob).margin(1e-9));
      }
    }
  }
  // No step copied all its logits; the adjusted rows and the flat rows' late draws copied theirs.
  const size_t row_bytes = size_t(V) * 4;
  int64_t row_copies = 0;
  for (size_t n : backend.copies) {
    CHECK(n < size_t(R) * row_bytes);
    row_copies += n == row_bytes;
  }
  CHECK(row_copies >= 2 * kSteps + 3);

  // A step most of whose rows fall back (every row flat) copies its logits once.
  for (int64_t r = 0; r < R; ++r) std::copy_n(host.data() + 10 * V, V, host.begin() + r * V);
  backend.copy_to_device(buf.data(), host.data(), host.size() * 4);
  std::vector<GenRequest> flat(static_cast<size_t>(R));
  std::vector<Sequence> flat_seqs;
  for (int64_t r = 0; r < R; ++r) {
    GenRequest& q = flat[size_t(r)];
    q.prompt = {1, 2};
    q.sampling.temperature = 1.0f;
    q.sampling.seed = uint64_t(r);  // the candidates hold about a third of the mass: most draws fall past
    q.sampling.max_new_tokens = 1;
    flat_seqs.push_back(start_sequence(q, cfg, int(r), size_t(r)));
  }
  std::vector<Sequence*> flat_rows;
  for (Sequence& s : flat_seqs) flat_rows.push_back(&s);
  backend.copies.clear();
  sampler.sample(logits, flat_rows);
  CHECK(std::count(backend.copies.begin(), backend.copies.end(), size_t(R) * row_bytes) == 1);
  CHECK(std::count(backend.copies.begin(), backend.copies.end(), row_bytes) == 0);
  CHECK(backend.candidate_launches == kSteps + 1);

  // A step whose rows are all adjusted (no logprobs) has no use for candidates: no launch.
  for (GenRequest& q : flat) q.sampling.repetition_penalty = 1.2f;
  flat_seqs.clear();
  for (int64_t r = 0; r < R; ++r) flat_seqs.push_back(start_sequence(flat[size_t(r)], cfg, int(r), size_t(r)));
  flat_rows.clear();
  for (Sequence& s : flat_seqs) flat_rows.push_back(&s);
  backend.copies.clear();
  sampler.sample(logits, flat_rows);
  CHECK(backend.candidate_launches == kSteps + 1);
  CHECK(std::count(backend.copies.begin(), backend.copies.end(), size_t(R) * row_bytes) == 1);
}
