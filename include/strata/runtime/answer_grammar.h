// Structured output's common parts: a grammar an answer is held to (json_grammar.h's JSON
// object or array, json_schema.h's JSON schema), a cursor that follows one answer through it, and
// the vocabulary laid out so that a state's allowed tokens take one walk.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace strata {

// One answer's place in its grammar. The sampler sets the logits of the tokens the grammar refuses
// to -inf before it draws, and moves the cursor on by the token drawn.
class AnswerCursor {
public:
  virtual ~AnswerCursor() = default;
  virtual std::unique_ptr<AnswerCursor> clone() const = 0;
  virtual bool accepts(int32_t token) const = 0;
  virtual void advance(int32_t token) = 0;  // a token accepts() allows
  // Whether the answer is a whole document: it ends there (no EOS is drawn).
  virtual bool complete() const = 0;
  // Sets to -inf the logits of the tokens that cannot come next (ids past the vocabulary too);
  // returns how many may.
  virtual int64_t mask(float* logits, int64_t vocab) const = 0;
};

// A grammar over a tokenizer's vocabulary, shared by the answers held to it; thread-safe.
class AnswerGrammar {
public:
  virtual ~AnswerGrammar() = default;
  virtual std::unique_ptr<AnswerCursor> start() const = 0;
};

// A tokenizer's vocabulary laid out for masks: its tokens' bytes sorted, with how many leading
// bytes each shares with the one before, so that a walk from a state reads each distinct prefix
// once and skips every token that starts with a refused prefix.
class SortedVocabulary {
public:
  // token_bytes[id]: the bytes token `id` stands for; "" for special tokens and unused ids, which
  // are never allowed (EOS included: an answer ends where its document does).
  explicit SortedVocabulary(std::vector<std::string> token_bytes);

  int64_t size() const { return int64_t(bytes_.size()); }
  const std::string& bytes(int32_t id) const { return bytes_[size_t(id)]; }
  bool known(int32_t id) const { return id >= 0 && id < size() && !bytes_[size_t(id)].empty(); }

  // Moves `s` by token `id`'s bytes, each through `step(State&, uint8_t) -> bool`; false when the
  // token is unknown or a byte is refused (`s` is then unspecified).
  template <class State, class Step>
  bool read(State& s, int32_t id, Step step) const {
    if (!known(id)) return false;
    for (char c : bytes_[size_t(id)])
      if (!step(s, uint8_t(c))) return false;
    return true;
  }

  // The tokens every byte of which `step(State&, uint8_t) -> bool` accepts from `start`: bit id of
  // the mask (size() bits, 64 to a word). at[k] is the state after the first k bytes of the token
  // last walked, valid for k <= valid; a token sharing more than `valid` bytes with the one before
  // starts with a refused prefix and is skipped without reading a byte.
  template <class State, class Step>
  std::vector<uint64_t> allowed(const State& start, Step step) const {
    std::vector<uint64_t> mask(size_t((size() + 63) / 64), 0);
    std::vector<State> at(longest_ + 1);
    at[0] = start;
    size_t valid = 0;
    for (size_t i = 0; i < sorted_.size(); ++i) {
      if (shared_[i] > valid) continue;
      const std::string& t = bytes_[size_t(sorted_[i])];
      size_t k = shared_[i];
      for (; k < t.size(); ++k) {
        at[k + 1] = at[k];
        if (!step(at[k + 1], uint8_t(t[k]))) break;
      }
      valid = k;
      if (k == t.size()) mask[size_t(sorted_[i]) / 64] |= uint64_t(1) << (sorted_[i] % 64);
    }
    return mask;
  }

private:
  std::vector<std::string> bytes_;  // by id
  std::vector<int32_t> sorted_;     // ids with bytes, by their bytes
  std::vector<uint32_t> shared_;    // shared_[i]: leading bytes sorted_[i] shares with sorted_[i - 1]
  size_t longest_ = 0;
};

// Sets to -inf the logits `mask` refuses among the first `known` ids, and every id from `known` to
// `vocab`; returns how many it keeps.
int64_t apply_token_mask(const std::vector<uint64_t>& mask, int64_t known, float* logits, int64_t vocab);

// Masks kept per grammar state (an answer returns to few states: inside a string at the same
// depth, between members, ...), up to kMasks of them; thread-safe.
template <class State, class Hash>
class MaskCache {
public:
  static constexpr size_t kMasks = 1024;

  template <class Compute>
  std::shared_ptr<const std::vector<uint64_t>> get(const State& s, Compute compute) const {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (auto it = masks_.find(s); it != masks_.end()) return it->second;
    }
    // Computed outside the lock: two rows in the same new state compute it twice, alike.
    auto mask = std::make_shared<const std::vector<uint64_t>>(compute());
    std::lock_guard<std::mutex> lock(mutex_);
    if (masks_.size() >= kMasks) masks_.clear();
    masks_.emplace(s, mask);
    return mask;
  }

private:
  mutable std::mutex mutex_;
  mutable std::unordered_map<State, std::shared_ptr<const std::vector<uint64_t>>, Hash> masks_;
};

}  // namespace strata
