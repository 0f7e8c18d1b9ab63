#include "strata/job/cross_encoder.h"

#include <algorithm>
#include <utility>

#include "strata/core/error.h"
#include "strata/job/embeddings.h"

namespace strata {
using json = nlohmann::json;

namespace {

// How many ids of each text a pair keeps when `room` are left for them: Hugging Face tokenizers'
// longest-first rule (the shorter text keeps all it can, at least half of the room).
std::pair<size_t, size_t> longest_first(size_t n1, size_t n2, size_t room) {
  if (n1 + n2 <= room) return {n1, n2};
  const bool swapped = n1 > n2;
  size_t shorter = std::min(n1, n2);
  size_t longer = shorter > room ? shorter : std::max(shorter, room - shorter);
  if (shorter + longer > room) {
    shorter = room / 2;
    longer = shorter + room % 2;
  }
  return swapped ? std::pair{longer, shorter} : std::pair{shorter, longer};
}

// Keeps the last `n` ids (the tokenizer truncating on the left).
void keep_last(std::vector<int32_t>& ids, size_t n) {
  if (ids.size() > n) ids.erase(ids.begin(), ids.end() - std::ptrdiff_t(n));
}

std::string no_room(int64_t keep, size_t specials) {
  return "truncate_prompt_tokens " + std::to_string(keep) + " leaves no room for text beside the tokenizer's " +
         std::to_string(specials) + " special tokens";
}

}  // namespace

std::variant<std::vector<int32_t>, std::string> cross_encoder_ids(const ModelBundle& model, const std::string& a,
                                                                  const std::string& b,
                                                                  const ChatTemplate* score_template, int64_t keep) {
  STRATA_CHECK(model.classifier && model.tokenizer, "cross_encoder_ids: not a classifier with a tokenizer");
  const Tokenizer& tok = *model.tokenizer;
  std::vector<int32_t> ids;
  if (!score_template && model.classifier->pair_separator) {
    const ModelBundle::PairTemplate& t = model.pair_template;
    const size_t specials = t.lead.size() + t.middle.size() + t.tail.size();
    std::vector<int32_t> first = tok.encode(a), second = tok.encode(b);
    if (keep > 0) {
      if (size_t(keep) <= specials) return no_room(keep, specials);
      const auto [n1, n2] = longest_first(first.size(), second.size(), size_t(keep) - specials);
      keep_last(first, n1);
      keep_last(second, n2);
    }
    for (const std::vector<int32_t>* part : {&t.lead, &std::as_const(first), &t.middle, &std::as_const(second), &t.tail})
      ids.insert(ids.end(), part->begin(), part->end());
    return ids;
  }
  std::string text = a + b;
  if (score_template) {
    try {
      text = score_template->render({{"query", a}, {"document", b}}, /*add_generation_prompt=*/false);
    } catch (const ChatTemplateError& e) {
      return std::string("the score template (--chat-template) refuses the pair: ") + e.what();
    }
  }
  if (keep > 0 && keep <= model.special_tokens()) return no_room(keep, size_t(model.special_tokens()));
  return model.with_special_tokens(tok.encode(text), keep);
}

json cross_encoder_line(const PromptRecord& r, const std::vector<std::vector<float>>& pooled,
                        const ClassifierHead& head, int64_t prompt_tokens, const std::string& model_name,
                        int64_t created) {
  STRATA_CHECK(r.embedding && head.labels.size() == 1 && pooled.size() == request_pairs(*r.embedding).size(),
               "cross_encoder_line: " << pooled.size() << " pooled states for the request on line " << r.line);
  std::vector<double> scores;
  for (const std::vector<float>& p : pooled) {
    const std::vector<double> logits = head.logits(p);
    scores.push_back(r.embedding->activation ? head.activate(logits)[0] : logits[0]);
  }
  return pair_score_line(r, scores, prompt_tokens, model_name, created);
}

}  // namespace strata
