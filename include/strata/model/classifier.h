// A sequence classifier's head (transformers' *ForSequenceClassification: reward models such as
// Skywork-Reward, sentiment and moderation classifiers): `score.weight` [labels, hidden] over the
// final-norm state of the last token that is not the pad token, then the activation vLLM's
// /v1/classify applies to the logits.
#pragma once
#include <cstdint>
#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "strata/model/config.h"
#include "strata/model/tokenizer.h"
#include "strata/model/weight_source.h"

namespace strata {

// What turns the logits into the probabilities a classification answer reports, as vLLM chooses it
// from config.json: problem_type "regression" none, "multi_label_classification" a sigmoid per
// label, otherwise a softmax over the labels, or a sigmoid when there is one label (a reward or a
// relevance score).
enum class ClassifierActivation : uint8_t { Softmax, Sigmoid, None };
const char* activation_name(ClassifierActivation a);  // "softmax", "sigmoid", "none"

struct ClassifierHead {
  std::vector<std::string> labels;  // id2label by class index (transformers' LABEL_i when unnamed)
  int64_t hidden = 0;
  std::vector<float> weight;        // [labels x hidden], score.weight as stored, in fp32
  ClassifierActivation activation = ClassifierActivation::Softmax;
  int32_t pad_id = -1;              // config.json's pad_token_id; -1: none
  std::string source;               // "DIR/config.json"
  // How a score or rerank request's (text_1, text_2) pair becomes one input (vLLM's use_sep_token,
  // or its older name use_pad_token): true, the tokenizer's pair encoding (its template's special
  // tokens before, between and after the two texts), as a cross-encoder was trained; false, the one
  // text text_1 + text_2, as an LLM used as a reranker reads its prompt. Default true, false for a
  // head made from the LM head's tokens.
  bool pair_separator = true;
  // Set for a head made from the LM head's rows (TokenClassifier): "from_2_way_softmax" or
  // "no_post_processing", and its tokens, for the job's log.
  std::string made_from;

  // The logits of one pooled state [hidden], in double.
  std::vector<double> logits(std::span<const float> pooled) const;
  // The probabilities of `logits` under the activation (the logits themselves for None).
  std::vector<double> activate(std::vector<double> logits) const;
  // The ids that transformers pools: up to the last id that is not pad_id (the first id when all are
  // pad; every id without a pad token). A causal model's state there does not depend on what follows.
  size_t pooled_length(std::span<const int32_t> ids) const;
};

// A classifier made from a causal LM's own head, as vLLM reads a reranker such as Qwen3-Reranker
// or mxbai-rerank-v2 (config.json's fields, usually given through --hf-overrides):
// "classifier_from_token" names tokens of the vocabulary and "method" how their rows of the LM head
// become `score`: "from_2_way_softmax" (two tokens, [no, yes]: one label, row(yes) - row(no), so
// that its sigmoid is the softmax of yes against no) or "no_post_processing" (a label per token,
// its row). "is_original_qwen3_reranker": true means from_2_way_softmax.
struct TokenClassifier {
  bool two_way = false;             // from_2_way_softmax
  std::vector<std::string> tokens;  // classifier_from_token
  int labels() const { return two_way ? 1 : int(tokens.size()); }
};
// nullopt for a config without "method" or "is_original_qwen3_reranker"; throws strata::Error
// naming the file for an unknown method or tokens that do not suit it.
std::optional<TokenClassifier> token_classifier(const nlohmann::json& config, const std::string& file);

// The head of a classifier checkpoint (cfg.num_labels > 0): id2label and problem_type from its
// config.json (parsed, and its path for messages), score.weight from `weights`, or for a
// TokenClassifier the LM head's rows (lm_head.weight, the embedding when the checkpoint has no LM
// head of its own) of the tokens `tokenizer` names. Throws strata::Error naming the file when the
// weight is missing or of the wrong shape, a token is not in the vocabulary, or problem_type is
// unknown.
ClassifierHead read_classifier_head(const nlohmann::json& config, const std::filesystem::path& config_file,
                                    const ModelConfig& cfg, const WeightSource& weights,
                                    const Tokenizer* tokenizer = nullptr);

}  // namespace strata
