#include "strata/model/classifier.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "strata/core/error.h"
#include "strata/model/weight_specs.h"

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

// vLLM's use_sep_token (use_pad_token, its older name, wins when given).
bool pair_separator(const json& j, bool made_from_tokens, const fs::path& file) {
  for (const char* key : {"use_pad_token", "use_sep_token"}) {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_boolean()) STRATA_FAIL(file.string() << ": '" << key << "' must be true or false");
    return it->get<bool>();
  }
  return !made_from_tokens;
}

// score = the LM head's rows of the tokens (lm_head.weight, else the embedding it is tied to).
void head_from_tokens(ClassifierHead& head, const TokenClassifier& from, const ModelConfig& cfg,
                      const WeightSource& weights, const Tokenizer* tokenizer, const fs::path& file) {
  if (!tokenizer)
    STRATA_FAIL(file.string() << ": classifier_from_token names tokens, but the model has no tokenizer to find them in");
  std::vector<int32_t> ids;
  for (const std::string& t : from.tokens) {
    const std::optional<int> id = tokenizer->token_id(t);
    if (!id || *id >= cfg.vocab_size)
      STRATA_FAIL(file.string() << ": classifier_from_token names \"" << t << "\", which is not a token of the "
                                << (id ? "model's vocabulary of " + std::to_string(cfg.vocab_size) : std::string("tokenizer")));
    ids.push_back(*id);
  }
  std::string name = "lm_head.weight";
  if (!weights.contains(name))
    for (const WeightSpec& s : global_weight_specs(cfg))
      if (s.role == WeightRole::Embed) name = s.name;
  const std::vector<int64_t> shape = weights.shape(name);
  if (shape.size() != 2 || shape[0] < cfg.vocab_size || shape[1] != cfg.hidden)
    STRATA_FAIL(weights.describe() << ": tensor '" << name << "' is not a [vocab, " << cfg.hidden
                                   << "] matrix, so classifier_from_token's rows cannot be taken from it");
  // The whole matrix in float32 for a moment (the source reads whole tensors): vocab x hidden x 4 bytes.
  std::vector<float> rows(size_t(shape[0]) * size_t(shape[1]));
  weights.read(name, DType::F32, rows.data());
  auto row = [&](int32_t id) { return rows.data() + size_t(id) * size_t(cfg.hidden); };
  head.weight.clear();
  if (from.two_way) {  // [no, yes]: yes - no
    for (int64_t k = 0; k < cfg.hidden; ++k) head.weight.push_back(row(ids[1])[k] - row(ids[0])[k]);
  } else {
    for (int32_t id : ids) head.weight.insert(head.weight.end(), row(id), row(id) + cfg.hidden);
  }
  head.made_from = std::string(from.two_way ? "from_2_way_softmax" : "no_post_processing") + " of " + name + "'s rows";
  for (size_t i = 0; i < ids.size(); ++i)
    head.made_from += std::string(i ? ", " : " ") + "\"" + from.tokens[i] + "\" (" + std::to_string(ids[i]) + ")";
}

}  // namespace

std::optional<TokenClassifier> token_classifier(const json& j, const std::string& file) {
  const auto method = j.find("method");
  const auto original = j.find("is_original_qwen3_reranker");
  const bool qwen3 = original != j.end() && original->is_boolean() && original->get<bool>();
  if (original != j.end() && !original->is_boolean() && !original->is_null())
    STRATA_FAIL(file << ": 'is_original_qwen3_reranker' must be true or false");
  if (!qwen3 && (method == j.end() || method->is_null())) return std::nullopt;
  TokenClassifier t;
  std::string how = "from_2_way_softmax";
  if (!qwen3) {
    if (!method->is_string()) STRATA_FAIL(file << ": 'method' must be a string");
    how = method->get<std::string>();
    if (how != "from_2_way_softmax" && how != "no_post_processing")
      STRATA_FAIL(file << ": method '" << how << "' is not one of from_2_way_softmax, no_post_processing");
  }
  t.two_way = how == "from_2_way_softmax";
  const auto tokens = j.find("classifier_from_token");
  if (tokens == j.end() || !tokens->is_array() || tokens->empty())
    STRATA_FAIL(file << ": " << (qwen3 ? "is_original_qwen3_reranker" : "method " + how)
                     << " needs 'classifier_from_token', a list of token strings (Qwen3-Reranker: [\"no\", \"yes\"])");
  for (const json& v : *tokens) {
    if (!v.is_string() || v.get_ref<const std::string&>().empty())
      STRATA_FAIL(file << ": classifier_from_token must list token strings, got " << v.dump());
    t.tokens.push_back(v.get<std::string>());
  }
  if (t.two_way && t.tokens.size() != 2)
    STRATA_FAIL(file << ": from_2_way_softmax needs two classifier_from_token entries ([false, true] tokens, as "
                        "[\"no\", \"yes\"]), got " << t.tokens.size());
  return t;
}

ClassifierHead read_classifier_head(const json& j, const fs::path& file, const ModelConfig& cfg,
                                    const WeightSource& weights, const Tokenizer* tokenizer) {
  STRATA_CHECK(cfg.num_labels > 0, "internal: read_classifier_head for a model without labels");
  const std::optional<TokenClassifier> from = token_classifier(j, file.string());
  ClassifierHead head;
  head.source = file.string();
  // A head made from tokens changes the label count; transformers then names them LABEL_i.
  head.labels = from ? label_names(json::object(), cfg.num_labels, file) : label_names(j, cfg.num_labels, file);
  head.activation = activation_of(j, cfg.num_labels, file);
  head.pad_id = cfg.pad_id;
  head.hidden = cfg.hidden;
  head.pair_separator = pair_separator(j, from.has_value(), file);
  if (from) {
    head_from_tokens(head, *from, cfg, weights, tokenizer, file);
    return head;
  }
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
