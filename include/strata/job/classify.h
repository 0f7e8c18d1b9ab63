// The answer to a classification request (vLLM's /v1/classify, the strata format's "classify"
// line; docs/batch-format.md, "Classification") from the pooled states of a sequence classifier.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "strata/job/prompts.h"
#include "strata/model/classifier.h"

namespace strata {

// One pooled state [hidden] per input of r (Embedder::embed, last-token pooling over the ids
// ClassifierHead::pooled_length keeps) through the head. OpenAI: the batch line around vLLM's
// classification body (object "list", data [{index, label, probs, num_classes}], usage), probs the
// activated logits, or the logits themselves under use_activation false; strata: {"id", "label",
// "probs", "logits", "prompt_tokens"}, or for an input given as an array {"id", "classifications":
// [{"label", "probs", "logits"}], "prompt_tokens"}. The label is the most probable class's name.
nlohmann::json classification_line(const PromptRecord& r, const std::vector<std::vector<float>>& pooled,
                                   const ClassifierHead& head, int64_t prompt_tokens, const std::string& model_name,
                                   int64_t created);

}  // namespace strata
