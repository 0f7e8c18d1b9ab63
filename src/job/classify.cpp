#include "strata/job/classify.h"

#include <algorithm>

#include "strata/core/error.h"
#include "strata/job/embeddings.h"

namespace strata {
using json = nlohmann::json;

namespace {

json numbers(const std::vector<double>& v) {
  json out = json::array();
  for (double x : v) out.push_back(float32_number(float(x)));  // float32, as vLLM's tensors
  return out;
}

struct Classified {
  std::string label;
  std::vector<double> logits, probs;
};

Classified classify(const ClassifierHead& head, const std::vector<float>& pooled, bool activation) {
  Classified c;
  c.logits = head.logits(pooled);
  c.probs = activation ? head.activate(c.logits) : c.logits;
  // The activations keep the logits' order, so the top class is the same either way.
  c.label = head.labels[size_t(std::max_element(c.logits.begin(), c.logits.end()) - c.logits.begin())];
  return c;
}

}  // namespace

json classification_line(const PromptRecord& r, const std::vector<std::vector<float>>& pooled,
                         const ClassifierHead& head, int64_t prompt_tokens, const std::string& model_name,
                         int64_t created) {
  STRATA_CHECK(r.embedding && r.embedding->use == EmbeddingUse::Classify && pooled.size() == r.embedding->inputs.size(),
               "classification_line: " << pooled.size() << " pooled states for the request on line " << r.line);
  const EmbeddingRequest& e = *r.embedding;
  std::vector<Classified> classes;
  for (const std::vector<float>& p : pooled) classes.push_back(classify(head, p, e.activation));
  if (r.format == InputFormat::Strata) {
    auto item = [](json& into, const Classified& c) {
      into["label"] = c.label;
      into["probs"] = numbers(c.probs);
      into["logits"] = numbers(c.logits);
    };
    json line = {{"id", r.id}};
    if (e.listed) {
      json list = json::array();
      for (const Classified& c : classes) {
        json one = json::object();
        item(one, c);
        list.push_back(std::move(one));
      }
      line["classifications"] = std::move(list);
    } else {
      item(line, classes[0]);
    }
    line["prompt_tokens"] = prompt_tokens;
    return line;
  }
  json data = json::array();
  for (size_t i = 0; i < classes.size(); ++i)
    data.push_back({{"index", i}, {"label", classes[i].label}, {"probs", numbers(classes[i].probs)},
                    {"num_classes", head.labels.size()}});
  return pooled_list_line(r, "classify", std::move(data), prompt_tokens, model_name, created);
}

}  // namespace strata
