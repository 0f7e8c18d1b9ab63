// Sampling from a row's candidates (row_candidates.h) against sampling from the full row: the
// same seeded sampler must draw the same tokens either way, falling back to the full row where
// the candidates cannot decide, and logprobs from candidates must equal the full row's. The full
// row's sampler is itself checked against transformers' warpers (test_sampler.cpp), so this file
// only needs the two paths to agree; compute_row_candidates sums in index order, as the full
// row's path does, so agreement is exact.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "strata/runtime/row_candidates.h"
#include "strata/runtime/sampler.h"

using namespace strata;

namespace {

// Rows that exercise the candidates' limits: peaked (a draw inside the first few), flat (draws
// and nuclei past a small capacity), ties on a coarse grid (top-k's and logprobs' tie runs),
// masked tokens at -inf, and signed zeros (which tie).
std::vector<std::vector<float>> test_rows(int64_t vocab, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> rows;
  for (float scale : {6.0f, 0.3f}) {
    std::vector<float> r(static_cast<size_t>(vocab));
    for (float& x : r) x = scale * normal(rng);
    rows.push_back(r);
  }
  std::vector<float> grid(static_cast<size_t>(vocab));
  for (float& x : grid) x = std::round(2.0f * normal(rng)) / 2.0f;
  rows.push_back(grid);
  std::vector<float> masked = rows[0];
  for (size_t i = 0; i < masked.size(); i += 3) masked[i] = -INFINITY;
  rows.push_back(masked);
  std::vector<float> zeros(static_cast<size_t>(vocab), -3.0f);
  for (size_t i = 0; i < zeros.size(); i += 7) zeros[i] = (i / 7) % 2 ? 0.0f : -0.0f;
  rows.push_back(zeros);
  return rows;
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
  for (int64_t vocab : {50, 3000}) {
    const auto rows = test_rows(vocab, rng);
    for (int64_t capacity : {int64_t(8), int64_t(64), kMaxRowCandidates}) {
      for (size_t r = 0; r < rows.size(); ++r) {
        for (const SamplingParams& params : test_params()) {
          const auto bytes = candidates_of(rows[r], params.temperature, capacity);
          const RowCandidates c = read_row_candidates(bytes.data(), 0, capacity, vocab);
          Sampler full(params), from_candidates(params);
          for (int step = 0; step < 12; ++step) {
            INFO("vocab " << vocab << " capacity " << capacity << " row " << r << " t " << params.temperature
                          << " k " << params.top_k << " p " << params.top_p << " min_p " << params.min_p
                          << " step " << step);
            const int32_t expected = full.sample(rows[r].data(), vocab);
            std::optional<int32_t> got = from_candidates.sample(c, 0);
            if (got) {
              ++decided;
            } else {
              ++fell_back;
              CHECK(capacity < vocab);  // candidates holding the whole row always decide
              got = from_candidates.sample(rows[r].data(), vocab);
            }
            REQUIRE(*got == expected);
          }
        }
      }
    }
  }
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
  for (int64_t vocab : {50, 3000}) {
    const auto rows = test_rows(vocab, rng);
    for (int64_t capacity : {int64_t(8), int64_t(64), kMaxRowCandidates}) {
      for (size_t r = 0; r < rows.size(); ++r) {
        const auto bytes = candidates_of(rows[r], 0.0f, capacity);
        const RowCandidates c = read_row_candidates(bytes.data(), 0, capacity, vocab);
        for (int top : {0, 1, 5, 20}) {
          for (int64_t pick = 0; pick < std::min<int64_t>(c.count, 12); pick += 3) {
            INFO("vocab " << vocab << " capacity " << capacity << " row " << r << " top " << top << " pick " << pick);
            const int32_t sampled = c.ids[pick];
            const StepLogprobs expected = step_logprobs(rows[r].data(), vocab, sampled, top);
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
      }
    }
  }
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
