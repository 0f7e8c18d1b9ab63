// A row of logits summarised for sampling where it was computed, so that a GPU's logits need not
// cross to the host: the row's largest logit, its sums of exponentials at the row's temperature
// and at 1, and its `capacity` largest logits with their ids. A draw, top-p's nucleus, min-p's
// floor and OpenAI's top logprobs usually lie among the first few hundred of a 128k vocabulary;
// the sampler decides from the candidates when they hold everything the full row would have
// given, and asks for the full row otherwise (Sampler::sample(const RowCandidates&)).
#pragma once
#include <cstddef>
#include <cstdint>

namespace strata {

// One row, as the host reads it. Candidates run most probable first: by logit descending, and
// among equal logits the higher id first (the sampler's walk order, sampler.cpp's sort_more).
struct RowCandidates {
  int64_t vocab = 0;
  float max = 0;       // the largest logit (NaN ignored)
  int32_t count = 0;   // candidates held: min(capacity, vocab)
  double sum_t = 0;    // sum over the row of exp(l * inv_t - max * inv_t), inv_t = 1 / temperature
                       // in double (1 where the temperature is 0), each term in double
  double sum_1 = 0;    // sum over the row of exp(l - max): the logprobs' normaliser
  const float* logits = nullptr;  // [count]
  const int32_t* ids = nullptr;   // [count]
};

// The layout one row takes where it is written (the CUDA backend's row_candidates): a 24-byte
// header {float max; int32 count; double sum_t; double sum_1}, then `capacity` fp32 logits, then
// `capacity` int32 ids. A multiple of 8 bytes, so rows stay aligned one after another.
constexpr int64_t kMaxRowCandidates = 1024;
constexpr size_t kRowCandidatesHeaderBytes = 24;
constexpr size_t row_candidates_bytes(int64_t capacity) {
  return kRowCandidatesHeaderBytes + 8 * size_t(capacity);
}

// A target token's logit in its row and its rank there: the row's logits at least as large, itself
// included (NaN counts nowhere). Backend::target_ranks writes one per row, 8 bytes each.
struct TargetRank {
  float logit = 0;
  int32_t rank = 0;
};
// The reference the device kernel is tested against.
TargetRank compute_target_rank(const float* logits, int64_t vocab, int32_t target);

// Row r of `rows` rows in that layout.
RowCandidates read_row_candidates(const void* rows, int64_t r, int64_t capacity, int64_t vocab);

// The candidates of one row of fp32 logits, written in that layout to `out`: the reference the
// device kernel is tested against. Sums run in index order.
void compute_row_candidates(const float* logits, int64_t vocab, float temperature, int64_t capacity, void* out);

}  // namespace strata
