// BPE encode/decode (the loaders are in tokenizer_load.cpp). Mirrors Hugging Face tokenizers:
// added tokens are split out first (leftmost-longest, with lstrip/rstrip/single_word), then each
// remaining piece goes through the split regexes and byte-level BPE by merge rank, or, for
// SentencePiece-style tokenizers, gets its "\u2581" spaces and BPE over characters with byte fallback.
#include "strata/model/tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <queue>

#include "strata/core/error.h"
#include "tokenizer_impl.h"
#include "tokenizer_unicode.h"

namespace strata {

namespace {

constexpr size_t kMaxCachedWords = 1 << 16;  // bounds memory on adversarial input

uint64_t pair_key(int left, int right) { return (uint64_t(uint32_t(left)) << 32) | uint32_t(right); }

// HF's ByteLevel decoder: a token whose characters all come from the byte-to-unicode table
// becomes those bytes; any other token (e.g. an added "<|im start|>" with a real space) stays
// as its own UTF-8.
std::string token_to_bytes(const std::string& token) {
  std::string bytes;
  for (size_t pos = 0; pos < token.size();) {
    int b = tok::unicode_to_byte(tok::next_code_point(token, pos));
    if (b < 0) return token;
    bytes += char(b);
  }
  return bytes;
}

constexpr std::string_view kMetaspace = "\u2581";  // SentencePiece's visible space
constexpr size_t kMaxCachedWordBytes = 256;          // longer words (a whole SentencePiece piece) are not cached

std::string replace_spaces(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 8);
  for (char c : text) {
    if (c == ' ') out += kMetaspace;
    else out += c;
  }
  return out;
}

// "<0xAB>" -> 0xAB, the byte-fallback tokens; -1 for any other token.
int fallback_byte(std::string_view token) {
  if (token.size() != 6 || !token.starts_with("<0x") || token[5] != '>') return -1;
  int value = 0;
  for (char c : token.substr(3, 2)) {
    const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

// Appends a word's ids: from the per-word cache, or from compute() (then cached, when short).
template <class Compute>
void cached_word(const TokenizerModel& m, std::string_view word, std::vector<int32_t>& out, Compute compute) {
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  std::string key;
  if (cacheable) {
    key.assign(word);
    std::shared_lock lock(m.cache_mutex);
    if (auto it = m.cache.find(key); it != m.cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids = compute();
  out.insert(out.end(), ids.begin(), ids.end());
  if (!cacheable) return;
  std::unique_lock lock(m.cache_mutex);
  if (m.cache.size() < kMaxCachedWords) m.cache.emplace(std::move(key), std::move(ids));
}

size_t prev_code_point_start(std::string_view s, size_t pos) {
  do --pos;
  while (pos > 0 && (static_cast<unsigned char>(s[pos]) & 0xC0) == 0x80);
  return pos;
}

char32_t code_point_at(std::string_view s, size_t pos) { return tok::next_code_point(s, pos); }

// A stretch of the input: an added token (id >= 0) or text still to pre-tokenize (id < 0).
struct Piece {
  std::string_view text;
  int id = -1;
};

// One pass of HF's AddedVocabulary::find_matches over `text`, for the tokens whose `normalized`
// flag equals `normalized_pass` (HF matches unnormalized tokens first, then normalized ones).
void split_on_added(const TokenizerModel& m, std::string_view text, bool normalized_pass, std::vector<Piece>& out) {
  size_t start_offset = 0;  // end of the previous accepted match
  size_t pos = 0;
  while (pos < text.size()) {
    const AddedTokenRule* hit = nullptr;
    for (int idx : m.added_by_first_byte[static_cast<unsigned char>(text[pos])]) {
      const AddedTokenRule& rule = m.added[idx];
      if (rule.normalized == normalized_pass && text.substr(pos).starts_with(rule.token.content)) {
        hit = &rule;  // candidates are sorted longest first: leftmost-longest
        break;
      }
    }
    if (hit == nullptr) {
      ++pos;
      continue;
    }
    size_t start = pos, stop = pos + hit->token.content.size();
    pos = stop;  // the automaton consumes the match even when single_word rejects it
    if (hit->single_word) {
      bool space_before = start == 0 || !tok::is_alphanumeric(code_point_at(text, prev_code_point_start(text, start)));
      bool space_after = stop == text.size() || !tok::is_alphanumeric(code_point_at(text, stop));
      if (!space_before || !space_after) continue;
    }
    if (hit->lstrip) {
      size_t new_start = start;
      while (new_start > 0) {
        size_t p = prev_code_point_start(text, new_start);
        if (!tok::is_unicode_whitespace(code_point_at(text, p))) break;
        new_start = p;
      }
      start = std::max(new_start, start_offset);  // an earlier match may own those spaces
    }
    if (hit->rstrip) {
      while (stop < text.size()) {
        size_t p = stop;
        if (!tok::is_unicode_whitespace(tok::next_code_point(text, p))) break;
        stop = p;
      }
      pos = stop;
    }
    if (start_offset < start) out.push_back({text.substr(start_offset, start - start_offset), -1});
    out.push_back({text.substr(start, stop - start), hit->token.id});
    start_offset = stop;
  }
  if (start_offset < text.size()) out.push_back({text.substr(start_offset), -1});
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Construction

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

void TokenizerModel::add_merge(const std::string& left, const std::string& right, int rank, const std::string& where) {
  auto find = [&](const std::string& token) {
    auto it = vocab_ids.find(token);
    if (it == vocab_ids.end()) {
      STRATA_FAIL(source << ": " << where << " '" << left << " " << right << "' refers to token '" << token
                         << "' which is not in the vocab");
    }
    return it->second;
  };
  int a = find(left), b = find(right);
  int merged = find(left + right);
  merges.insert_or_assign(pair_key(a, b), Merge{rank, merged});  // a later duplicate wins, as in HF
}

void TokenizerModel::finish() {
  for (int b = 0; b < 256; ++b) {  // the byte's token: GPT-2's byte character, or "<0xAB>"
    char fallback[8];
    std::snprintf(fallback, sizeof fallback, "<0x%02X>", b);
    auto it = vocab_ids.find(metaspace ? std::string(fallback) : tok::byte_to_unicode()[b]);
    byte_ids[b] = it == vocab_ids.end() ? -1 : it->second;
  }
  size_t n_ids = vocab.size();
  for (const auto& rule : added) {
    STRATA_CHECK(rule.token.id >= 0, source << ": added token '" << rule.token.content << "' has a negative id " << rule.token.id);
    n_ids = std::max(n_ids, size_t(rule.token.id) + 1);
  }
  id_bytes.assign(n_ids, {});
  id_special.assign(n_ids, 0);
  // What a token stands for in text: byte-level tokens their bytes; SentencePiece ones their text
  // with real spaces, and a byte-fallback token its byte (where the decoder has ByteFallback).
  auto text_of = [this](const std::string& token) {
    if (bytes_only) return token;
    if (!metaspace) return token_to_bytes(token);
    const int byte = metaspace->metaspace_decoder ? -1 : fallback_byte(token);
    if (byte >= 0) return std::string(1, char(byte));
    std::string text;  // the token with each metaspace turned into a space
    text.reserve(token.size());
    size_t from = 0;
    for (size_t p = token.find(kMetaspace); p != std::string::npos; p = token.find(kMetaspace, from)) {
      text.append(token, from, p - from).push_back(' ');
      from = p + kMetaspace.size();
    }
    return text.append(token, from, std::string::npos);
  };
  if (metaspace) id_tokens.assign(n_ids, {});
  for (size_t id = 0; id < vocab.size(); ++id) {
    id_bytes[id] = text_of(vocab[id]);
    if (metaspace) id_tokens[id] = vocab[id];
  }
  for (size_t i = 0; i < added.size(); ++i) {
    const AddedToken& t = added[i].token;
    id_bytes[t.id] = metaspace ? text_of(t.content) : token_to_bytes(t.content);  // the added vocabulary wins
    if (metaspace) id_tokens[t.id] = t.content;
    id_special[t.id] = t.special;
    added_ids[t.content] = t.id;
    if (t.content.empty()) continue;  // HF never matches an empty added token
    added_by_first_byte[static_cast<unsigned char>(t.content[0])].push_back(int(i));
    (added[i].normalized ? has_normalized_added : has_unnormalized_added) = true;
  }
  for (auto& candidates : added_by_first_byte) {
    std::stable_sort(candidates.begin(), candidates.end(),
                     [&](int a, int b) { return added[a].token.content.size() > added[b].token.content.size(); });
  }
}

Tokenizer Tokenizer::bytes_only() {
  auto m = std::make_unique<Impl>();
  m->source = "bytes_only";
  m->bytes_only = true;
  for (int b = 0; b < 256; ++b) m->vocab.push_back(std::string(1, char(b)));
  m->finish();
  return Tokenizer(std::move(m));
}

Tokenizer Tokenizer::from_parts(std::vector<std::string> tokens, const std::vector<std::string>& merges,
                                std::vector<AddedToken> added, PreTokenizer pre, bool ignore_merges) {
  auto m = std::make_unique<Impl>();
  m->source = "tokenizer from parts";
  m->vocab = std::move(tokens);
  for (size_t id = 0; id < m->vocab.size(); ++id) m->vocab_ids.emplace(m->vocab[id], int(id));
  for (size_t i = 0; i < merges.size(); ++i) {
    size_t space = merges[i].find(' ');
    if (space == std::string::npos) STRATA_FAIL(m->source << ": merge " << i << " '" << merges[i] << "' has no space");
    m->add_merge(merges[i].substr(0, space), merges[i].substr(space + 1), int(i), "merge " + std::to_string(i));
  }
  for (auto& t : added) {
    const bool rstrip = t.rstrip;
    m->added.push_back(AddedTokenRule{std::move(t), false, rstrip});
  }
  switch (pre) {
    case PreTokenizer::GPT2: m->splits.emplace_back(tok::kGpt2Pattern, false, m->source); break;
    case PreTokenizer::Llama3: m->splits.emplace_back(tok::kLlama3Pattern, false, m->source); break;
    case PreTokenizer::Qwen2: m->splits.emplace_back(tok::kQwen2Pattern, false, m->source); break;
    case PreTokenizer::Gpt4o: m->splits.emplace_back(tok::kGpt4oPattern, false, m->source); break;
    case PreTokenizer::SmolLM:
      m->splits.emplace_back(tok::kDigitPattern, false, m->source);
      m->splits.emplace_back(tok::kGpt2Pattern, false, m->source);
      break;
  }
  m->ignore_merges = ignore_merges;
  m->finish();
  return Tokenizer(std::move(m));
}

// ---------------------------------------------------------------------------------------------
// Encoding

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  const Impl& m = *impl_;
  std::vector<int32_t> ids;
  if (m.bytes_only) {
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  if (size_t bad = tok::find_invalid_utf8(text); bad != std::string_view::npos) {
    STRATA_FAIL("tokenizer (" << m.source << "): input text is not valid UTF-8 (bad byte 0x" << std::hex
                              << int(static_cast<unsigned char>(text[bad])) << std::dec << " at offset " << bad << ")");
  }
  std::vector<Piece> pieces{{text, -1}};
  for (bool normalized_pass : {false, true}) {
    if (!(normalized_pass ? m.has_normalized_added : m.has_unnormalized_added)) continue;
    std::vector<Piece> next;
    for (const Piece& p : pieces) {
      if (p.id >= 0) next.push_back(p);
      else split_on_added(m, p.text, normalized_pass, next);
    }
    pieces = std::move(next);
  }
  for (const Piece& p : pieces) {
    if (p.id >= 0) ids.push_back(p.id);
    else if (m.metaspace) m.encode_metaspace_piece(p.text, p.text.data() == text.data(), ids);
    else m.encode_piece(p.text, ids);
  }
  return ids;
}

// HF's Prepend + Replace normalizer, or its Metaspace pre-tokenizer, then BPE over characters.
void TokenizerModel::encode_metaspace_piece(std::string_view text, bool at_start, std::vector<int32_t>& out) const {
  using Prepend = Metaspace::Prepend;
  std::string s = replace_spaces(text);
  const Prepend prepend = metaspace->prepend;
  if (prepend == Prepend::EveryPiece ||
      ((prepend == Prepend::Always || (prepend == Prepend::First && at_start)) && !s.starts_with(kMetaspace)))
    s.insert(0, kMetaspace);
  if (!metaspace->split) {
    bpe_chars(s, out);
    return;
  }
  // Split before every "\u2581" (HF's MergedWithNext): "a\u2581b\u2581\u2581c" -> "a", "\u2581b", "\u2581", "\u2581c".
  size_t begin = 0;
  for (size_t p = s.find(kMetaspace, 1); p != std::string::npos; p = s.find(kMetaspace, p + 1)) {
    bpe_chars(std::string_view(s).substr(begin, p - begin), out);
    begin = p;
  }
  bpe_chars(std::string_view(s).substr(begin), out);
}

void TokenizerModel::encode_piece(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<std::string_view> words{text}, next;
  for (const auto& re : splits) {
    next.clear();
    for (std::string_view w : words) re.split_isolated(w, next);
    words.swap(next);
  }
  std::string prefixed;
  for (std::string_view w : words) {
    if (w.empty()) continue;
    if (add_prefix_space && w[0] != ' ') {
      prefixed.assign(1, ' ').append(w);
      w = prefixed;
    }
    if (!byte_level_split) {
      bpe_word(w, out);
      continue;
    }
    next.clear();
    byte_level_split->split_isolated(w, next);
    for (std::string_view sub : next) bpe_word(sub, out);
  }
}

void TokenizerModel::bpe_word(std::string_view bytes, std::vector<int32_t>& out) const {
  cached_word(*this, bytes, out, [&] {
    std::vector<int32_t> result;
    if (auto it = ignore_merges ? vocab_ids.find(tok::bytes_to_unicode_string(bytes)) : vocab_ids.end();
        it != vocab_ids.end()) {
      result.push_back(it->second);
    } else {
      result.reserve(bytes.size());
      for (unsigned char b : bytes) {
        int id = byte_ids[b];
        if (id < 0) {
          if (unk_id < 0) continue;  // HF without unk_token silently drops it
          if (fuse_unk && !result.empty() && result.back() == unk_id) continue;
          id = unk_id;
        }
        result.push_back(id);
      }
      merge(result);
    }
    return result;
  });
}

// HF's BPE::merge_word: each character in the vocab is a symbol; any other becomes its <0xXX>
// byte tokens (byte_fallback, when all of them exist), else <unk>, consecutive ones fused. HF
// adds a pending <unk> only when the next character is in the vocab, or at the end.
void TokenizerModel::bpe_chars(std::string_view word, std::vector<int32_t>& out) const {
  cached_word(*this, word, out, [&] {
    std::vector<int32_t> symbols;
    symbols.reserve(word.size());
    bool unk_pending = false;
    for (size_t pos = 0; pos < word.size();) {
      const size_t begin = pos;
      tok::next_code_point(word, pos);
      const std::string_view ch = word.substr(begin, pos - begin);
      if (auto it = vocab_ids.find(std::string(ch)); it != vocab_ids.end()) {
        if (unk_pending) symbols.push_back(unk_id), unk_pending = false;
        symbols.push_back(it->second);
        continue;
      }
      if (byte_fallback && std::all_of(ch.begin(), ch.end(), [&](char b) { return byte_ids[uint8_t(b)] >= 0; })) {
        for (char b : ch) symbols.push_back(byte_ids[uint8_t(b)]);
        continue;
      }
      if (unk_id < 0) continue;  // HF without unk_token drops the character
      if (unk_pending && !fuse_unk) symbols.push_back(unk_id);
      unk_pending = true;
    }
    if (unk_pending) symbols.push_back(unk_id);
    merge(symbols);
    return symbols;
  });
}

void TokenizerModel::merge(std::vector<int32_t>& symbols) const {
  // Symbols form a linked list; a min-heap of candidate pairs ordered by (rank, position)
  // applies the lowest-rank merge first, leftmost on ties, exactly as HF's Word::merge_all.
  struct Symbol {
    int id, prev, next;
    bool alive;
  };
  std::vector<Symbol> sym;
  sym.reserve(symbols.size());
  for (int32_t id : symbols) {
    const int i = int(sym.size());
    sym.push_back({id, i - 1, -1, true});
    if (i > 0) sym[i - 1].next = i;
  }
  struct Candidate {
    int rank, pos, new_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push_pair = [&](int pos) {
    if (pos < 0 || sym[pos].next < 0) return;
    auto it = merges.find(pair_key(sym[pos].id, sym[sym[pos].next].id));
    if (it != merges.end()) heap.push({it->second.rank, pos, it->second.new_id});
  };
  for (int i = 0; i + 1 < int(sym.size()); ++i) push_pair(i);
  while (!heap.empty()) {
    Candidate c = heap.top();
    heap.pop();
    Symbol& left = sym[c.pos];
    if (!left.alive || left.next < 0) continue;
    auto it = merges.find(pair_key(left.id, sym[left.next].id));
    if (it == merges.end() || it->second.new_id != c.new_id) continue;  // stale candidate
    Symbol& right = sym[left.next];
    right.alive = false;
    left.id = c.new_id;
    left.next = right.next;
    if (left.next >= 0) sym[left.next].prev = c.pos;
    push_pair(left.prev);
    push_pair(c.pos);
  }
  symbols.clear();
  for (const Symbol& s : sym)
    if (s.alive) symbols.push_back(s.id);
}

// ---------------------------------------------------------------------------------------------
// Decoding and lookups

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  const Impl& m = *impl_;
  std::vector<int32_t> kept;
  for (int32_t id : ids) {
    if (id < 0 || size_t(id) >= m.id_bytes.size()) continue;  // HF skips ids it does not know
    if (skip_special && m.id_special[id]) continue;
    kept.push_back(id);
  }
  if (m.metaspace) return m.decode_metaspace(kept);
  std::string bytes;
  for (int32_t id : kept) bytes += m.id_bytes[id];
  return tok::utf8_decode_lossy(bytes);
}

// HF's decoders for SentencePiece-style tokenizers. ByteFallback turns each run of <0xXX> tokens
// into its bytes when they are valid UTF-8, else into one U+FFFD a byte; Strip then drops leading
// spaces. The Metaspace decoder writes "\u2581" as a space except in the first token.
std::string TokenizerModel::decode_metaspace(const std::vector<int32_t>& ids) const {
  std::string text;
  auto append_spaced = [&text](std::string_view token, bool drop_metaspace) {
    for (size_t p = 0; p < token.size();) {
      if (token.substr(p).starts_with(kMetaspace)) {
        if (!drop_metaspace) text += ' ';
        p += kMetaspace.size();
      } else {
        text += token[p++];
      }
    }
  };
  if (metaspace->metaspace_decoder) {
    for (size_t i = 0; i < ids.size(); ++i)
      append_spaced(id_tokens[ids[i]], i == 0 && metaspace->prepend != Metaspace::Prepend::Never);
    return text;
  }
  std::string run;  // bytes of consecutive byte-fallback tokens
  auto flush = [&] {
    if (tok::find_invalid_utf8(run) == std::string_view::npos) text += run;
    else for (size_t i = 0; i < run.size(); ++i) text += "\uFFFD";
    run.clear();
  };
  for (int32_t id : ids) {
    if (const int byte = fallback_byte(id_tokens[id]); byte >= 0) {
      run += char(byte);
      continue;
    }
    flush();
    append_spaced(id_tokens[id], false);
  }
  flush();
  for (int i = 0; i < metaspace->strip_leading && !text.empty() && text[0] == ' '; ++i) text.erase(0, 1);
  return text;
}

std::string Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || size_t(id) >= impl_->id_bytes.size()) return {};
  return impl_->id_bytes[size_t(id)];
}

int Tokenizer::vocab_size() const { return int(impl_->id_bytes.size()); }

std::optional<int> Tokenizer::token_id(std::string_view token) const {
  std::string key(token);
  if (auto it = impl_->added_ids.find(key); it != impl_->added_ids.end()) return it->second;
  if (impl_->bytes_only) {
    if (token.size() == 1) return static_cast<unsigned char>(token[0]);
    return std::nullopt;
  }
  if (auto it = impl_->vocab_ids.find(key); it != impl_->vocab_ids.end()) return it->second;
  return std::nullopt;
}

bool Tokenizer::is_special(int id) const {
  return id >= 0 && size_t(id) < impl_->id_special.size() && impl_->id_special[id];
}

}  // namespace strata
