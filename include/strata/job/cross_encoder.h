// Score and rerank requests answered by a one-label sequence classifier: a cross-encoder (a
// reranker trained as a classifier, as bge-reranker-v2-gemma or a converted Qwen3-Reranker), or an
// LLM read as one through classifier_from_token (the original Qwen3-Reranker, mxbai-rerank-v2).
// Each (text_1, text_2) or (query, document) pair is one input, encoded as vLLM encodes it, and
// its score is the head's logit through the activation (docs/batch-format.md, "Cross-encoders").
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <variant>
#include <vector>

#include "strata/job/prompts.h"
#include "strata/model/chat_template.h"
#include "strata/model/model_loader.h"

namespace strata {

// The ids of one pair, as vLLM's score prompt: with a score template (--chat-template, given the
// messages [{"role": "query", "content": a}, {"role": "document", "content": b}]) the rendered text
// tokenized with the tokenizer's special tokens; else, for a head whose pair_separator is set,
// tokenizer(a, text_pair=b) (model.pair_template's special tokens around the two texts' ids); else
// tokenizer(a + b). `keep` > 0 is vLLM's truncate_prompt_tokens: a pair is cut as the tokenizer
// truncating on the left, longest first, cuts one (the longer text loses tokens until the two are
// even, then both), a single text to its last tokens, the special tokens kept. The error, a
// sentence, when the template refuses the messages or keep leaves no room beside the special tokens.
std::variant<std::vector<int32_t>, std::string> cross_encoder_ids(const ModelBundle& model, const std::string& a,
                                                                  const std::string& b,
                                                                  const ChatTemplate* score_template, int64_t keep);

// The answer to a score or rerank request from one pooled state per pair (request_pairs, in
// order): each pair's logit through the head's activation (a sigmoid for one label) unless
// use_activation is false, written by pair_score_line.
nlohmann::json cross_encoder_line(const PromptRecord& r, const std::vector<std::vector<float>>& pooled,
                                  const ClassifierHead& head, int64_t prompt_tokens, const std::string& model_name,
                                  int64_t created);

}  // namespace strata
