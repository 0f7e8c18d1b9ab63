// GGUF's SentencePiece vocabulary (tokenizer.ggml.model "llama"): tokens with scores, no merges.
// llama.cpp (and SentencePiece's BPE) repeatedly merge the adjacent pair whose concatenation is
// the highest-scoring token, leftmost first on ties. That is the rank-ordered BPE the tokenizer
// already runs once every way of cutting a token into two tokens is a merge whose rank is the
// token's place in score order (equal scores sharing a rank), so the vocabulary is turned into
// such merges here and encode() needs nothing of its own.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "strata/core/error.h"
#include "tokenizer_impl.h"
#include "tokenizer_unicode.h"

namespace strata {
namespace {

// llama.cpp's token types (llama_token_type).
enum TokenType : int { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

// Rank of each token: 0 for the highest score, equal scores equal ranks.
std::vector<int> score_ranks(const std::vector<float>& scores) {
  std::vector<int> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return scores[a] > scores[b]; });
  std::vector<int> rank(scores.size());
  int r = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    if (i > 0 && scores[order[i]] != scores[order[i - 1]]) ++r;
    rank[order[i]] = r;
  }
  return rank;
}

// Every cut of every token into two tokens, at character boundaries.
void add_score_merges(TokenizerModel& m, const std::vector<float>& scores) {
  const std::vector<int> rank = score_ranks(scores);
  for (size_t id = 0; id < m.vocab.size(); ++id) {
    const std::string& token = m.vocab[id];
    if (token.empty()) continue;
    // A text the vocabulary repeats merges into the id its lookup gives, as in llama.cpp.
    const int merged_rank = rank[size_t(m.vocab_ids.at(token))];
    size_t cut = 0;
    for (tok::next_code_point(token, cut); cut < token.size(); tok::next_code_point(token, cut)) {
      const std::string left = token.substr(0, cut), right = token.substr(cut);
      if (m.vocab_ids.contains(left) && m.vocab_ids.contains(right))
        m.add_merge(left, right, merged_rank, "token " + std::to_string(id));
    }
  }
}

}  // namespace

Tokenizer Tokenizer::from_sentencepiece(SentencePieceVocab v, const std::string& source) {
  auto m = std::make_unique<Impl>();
  m->source = source;
  const size_t n = v.tokens.size();
  if (n == 0) STRATA_FAIL(source << ": the SentencePiece vocabulary has no tokens");
  if (!v.scores.empty() && v.scores.size() != n)
    STRATA_FAIL(source << ": " << v.scores.size() << " token scores for " << n << " tokens");
  if (!v.types.empty() && v.types.size() != n)
    STRATA_FAIL(source << ": " << v.types.size() << " token types for " << n << " tokens");
  if (v.scores.empty()) v.scores.assign(n, 0.0f);
  if (v.types.empty()) v.types.assign(n, kNormal);
  for (size_t id = 0; id < n; ++id) {
    if (std::isnan(v.scores[id])) STRATA_FAIL(source << ": token " << id << " has a score that is not a number");
    if (tok::find_invalid_utf8(v.tokens[id]) != std::string_view::npos)
      STRATA_FAIL(source << ": token " << id << " is not valid UTF-8");
  }

  m->vocab = std::move(v.tokens);
  for (size_t id = 0; id < n; ++id) m->vocab_ids.insert_or_assign(m->vocab[id], int(id));  // llama.cpp: last wins
  for (size_t id = 0; id < n; ++id) {
    const int type = v.types[id];
    if (type == kUnknown && m->unk_id < 0) m->unk_id = int(id);
    // Matched whole in the text: control and unknown tokens as special, user-defined ones not.
    if (type == kControl || type == kUnknown || type == kUserDefined)
      m->added.push_back(AddedTokenRule{AddedToken{int(id), m->vocab[id], type != kUserDefined}, false,
                                        std::find(v.rstrip_ids.begin(), v.rstrip_ids.end(), int(id)) != v.rstrip_ids.end()});
  }
  add_score_merges(*m, v.scores);

  // llama.cpp puts a space before the text and after every token matched in it, then writes
  // spaces as "\u2581"; decoding drops the one leading space again.
  m->metaspace.emplace();
  m->metaspace->prepend = v.add_space_prefix ? MetaspaceOptions::Prepend::EveryPiece : MetaspaceOptions::Prepend::Never;
  m->metaspace->strip_leading = v.add_space_prefix ? 1 : 0;
  m->byte_fallback = true;
  m->finish();
  return Tokenizer(std::move(m));
}

}  // namespace strata
