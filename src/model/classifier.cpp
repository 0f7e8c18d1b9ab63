#include "strata/model/classifier.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "strata/core/error.h"

namespace strata {
namespace fs = std::filesystem;
using json = nlohmann::json;

const char* activation_name(ClassifierActivation a) {
  switch (a) {
    case ClassifierActivation::Softmax: return "softmax";
    case ClassifierActivation::Sigmoid: return "sigmoid";
    case ClassifierActivation::None: return "none";
  }
  return "?";
}

std::vector<double> ClassifierHead::logits(std::span<const float> pooled) const {
  STRATA_CHECK(int64_t(pooled.size()) == hidden,
               "classifier: a pooled state of " << pooled.size() << " values for a head over " << hidden);
  std::vector<double> out(labels.size());
  for (size_t l = 0; l < labels.size(); ++l) {
    const float* w = weight.data() + l * size_t(hidden);
    double acc = 0;
    for (int64_t j = 0; j < hidden; ++j) acc += double(w[j]) * double(pooled[size_t(j)]);
    out[l] = acc;
  }
  return out;
}

std::vector<double> ClassifierHead::activate(std::vector<double> v) const {
  if (activation == ClassifierActivation::Sigmoid)
    for (double& x : v) x = 1.0 / (1.0 + std::exp(-x));
  if (activation == ClassifierActivation::Softmax && !v.empty()) {
    const double top = *std::max_element(v.begin(), v.end());
    double sum = 0;
    for (double& x : v) sum += x = std::exp(x - top);
    for (double& x : v) x /= sum;
  }
  return v;
}

size_t ClassifierHead::pooled_length(std::span<const int32_t> ids) const {
  if (pad_id < 0) return ids.size();
  for (size_t i = ids.size(); i > 0; --i)
    if (ids[i - 1] != pad_id) return i;
  return std::min<size_t>(1, ids.size());
}

namespace {

// id2label's names by index; transformers' LABEL_i where the config names none.
std::vector<std::string> label_names(const json& j, int count, const fs::path& file) {
  std::vector<std::string> names(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) names[size_t(i)] = "LABEL_" + std::to_string(i);
  const auto it = j.find("id2label");
  if (it == j.end() || !it->is_object()) return names;
  for (const auto& [key, value] : it->items()) {
    int index = -1;
    try {
      size_t used = 0;
      index = std::stoi(key, &used);
      if (used != key.size()) index = -1;
    } catch (const std::exception&) {
    }
    if (index < 0 || index >= count)
      STRATA_FAIL(file.string() << ": id2label key '" << key << "' is not a class index in [0, " << count << ")");
    if (!value.is_string()) STRATA_FAIL(file.string() << ": id2label[\"" << key << "\"] must be a string");
    names[size_t(index)] = value.get<std::string>();
  }
  return names;
}

ClassifierActivation activation_of(const json& j, int labels, const fs::path& file) {
  const auto it = j.find("problem_type");
  const std::string type = it != j.end() && it->is_string() ? it->get<std::string>() : "";
  if (type == "regression") return ClassifierActivation::None;
  if (type == "multi_label_classification") return ClassifierActivation::Sigmoid;
  if (!type.empty() && type != "single_label_classification")
    STRATA_FAIL(file.string() << ": problem_type '" << type
                              << "' is not one of regression, single_label_classification, multi_label_classification");
  return labels < 2 ? ClassifierActivation::Sigmoid : ClassifierActivation::Softmax;
}

}  // namespace

ClassifierHead read_classifier_head(const json& j, const fs::path& file, const ModelConfig& cfg,
                                    const WeightSource& weights) {
  STRATA_CHECK(cfg.num_labels > 0, "internal: read_classifier_head for a model without labels");
  ClassifierHead head;
  head.source = file.string();
  head.labels = label_names(j, cfg.num_labels, file);
  head.activation = activation_of(j, cfg.num_labels, file);
  head.pad_id = cfg.pad_id;
  head.hidden = cfg.hidden;
  if (!weights.contains("score.weight"))
    STRATA_FAIL(weights.describe() << ": missing tensor 'score.weight' (the head of a " << cfg.num_labels
                                   << "-label classifier, as " << file.string() << " says)");
  const std::vector<int64_t> shape = weights.shape("score.weight");
  if (shape.size() != 2 || shape[0] != cfg.num_labels || shape[1] != cfg.hidden)
    STRATA_FAIL(weights.describe() << ": tensor 'score.weight' has shape ["
                                   << (shape.empty() ? 0 : shape[0]) << (shape.size() > 1 ? ", " + std::to_string(shape[1]) : "")
                                   << (shape.size() > 2 ? ", ..." : "") << "], expected [" << cfg.num_labels << ", "
                                   << cfg.hidden << "] (num_labels x hidden_size)");
  head.weight.resize(size_t(cfg.num_labels) * size_t(cfg.hidden));
  weights.read("score.weight", DType::F32, head.weight.data());
  return head;
}

}  // namespace strata
