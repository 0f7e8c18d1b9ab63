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

  // The logits of one pooled state [hidden], in double.
  std::vector<double> logits(std::span<const float> pooled) const;
  // The probabilities of `logits` under the activation (the logits themselves for None).
  std::vector<double> activate(std::vector<double> logits) const;
  // The ids that transformers pools: up to the last id that is not pad_id (the first id when all are
  // pad; every id without a pad token). A causal model's state there does not depend on what follows.
  size_t pooled_length(std::span<const int32_t> ids) const;
};

// The head of a classifier checkpoint (cfg.num_labels > 0): id2label and problem_type from its
// config.json (parsed, and its path for messages), score.weight from `weights`. Throws
// strata::Error naming the file when the weight is missing or of the wrong shape, or problem_type
// is unknown.
ClassifierHead read_classifier_head(const nlohmann::json& config, const std::filesystem::path& config_file,
                                    const ModelConfig& cfg, const WeightSource& weights);

}  // namespace strata
