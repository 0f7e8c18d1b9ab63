// Embeddings requests in a batch job (docs/batch-format.md, "Embeddings"): OpenAI's /v1/embeddings
// body, or the strata format's "input" line, read into PromptRecord::embedding; vLLM's /v1/score
// and /v1/rerank over an embedding model (the cosine similarity of pairs of vectors); and the
// answer line from the pooled vectors.
#pragma once
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "strata/job/prompts.h"

namespace strata {

// The fields a request of this use reads besides the OpenAI body's "model" and the strata line's
// "id". Embed: input, dimensions, encoding_format, normalize and truncate_prompt_tokens (vLLM's),
// user (OpenAI's, not used). Score: text_1, text_2, truncate_prompt_tokens, use_activation (a
// cross-encoder's; and its deprecated name activation), user. Rerank: query, documents, top_n,
// truncate_prompt_tokens, use_activation, activation, user. The strata format's score and rerank
// lines: those without user and activation.
// Classify (vLLM's /v1/classify): input or messages, use_activation (and its deprecated names
// softmax and activation), add_special_tokens, add_generation_prompt, truncate_prompt_tokens, user;
// in the strata format classify (the input, or true with messages), messages, use_activation,
// add_special_tokens, add_generation_prompt, truncate_prompt_tokens.
const std::set<std::string>& embedding_fields(EmbeddingUse use, InputFormat format = InputFormat::OpenAIBatch);

// Sets r.embedding from `obj` (an OpenAI body, or a strata line) for the use; the error of the
// first field that cannot be served otherwise. `field(key)` names a field in messages
// ("body.input", "field 'input'").
std::optional<ServeError> read_embedding_request(const nlohmann::json& obj,
                                                 const std::function<std::string(const char*)>& field,
                                                 PromptRecord& r, EmbeddingUse use = EmbeddingUse::Embed);

// Input i's name in messages, without the format's prefix: "input", "input[2]", "text_2[0]",
// "query", "documents[3]", "messages".
std::string embedding_input_name(const EmbeddingRequest& e, size_t i);

// The output line answering r from one pooled, unnormalized vector per input (Embedder::embed).
// Embed: each cut to r's dimensions and normalized unless the record or `normalize_default` says
// not (finish_embedding). OpenAI: the batch line around vLLM's embeddings body (object "list", data
// [{index, object "embedding", embedding}], usage); strata: {"id", "embedding" (or "embeddings"
// for an input given as an array), "prompt_tokens"}. Values are written as the shortest decimals
// that read back as the same float32, or base64 of little-endian float32 when asked.
// Score and rerank: each pair's cosine similarity, answered by pair_score_line.
nlohmann::json embedding_line(const PromptRecord& r, std::vector<std::vector<float>> vectors, int64_t prompt_tokens,
                              bool normalize_default, const std::string& model_name, int64_t created);

// The pairs a score or rerank request compares, as indices into its inputs: (text_1, text_2 k) for
// one text_1 against many, (text_1 k, text_2 k) pairwise, (query, document k) for reranking.
std::vector<std::pair<size_t, size_t>> request_pairs(const EmbeddingRequest& e);

// The output line answering a score or rerank request from one score per pair (request_pairs):
// the cosine similarity of an embedding model's vectors, or a cross-encoder's score. Score: vLLM's
// score body (data [{index, object "score", score}]); strata {"id", "scores", "prompt_tokens"}.
// Rerank: the documents by descending score, the best top_n, vLLM's rerank body (results [{index,
// document {text}, relevance_score}]); strata {"id", "results": [{index, relevance_score}],
// "prompt_tokens"}.
nlohmann::json pair_score_line(const PromptRecord& r, const std::vector<double>& scores, int64_t prompt_tokens,
                               const std::string& model_name, int64_t created);

// What the response carries: the first `dimensions` values (0: all; Matryoshka-trained models
// such as Qwen3-Embedding keep meaning in a prefix), then divided by their L2 norm when
// `normalize` (sentence-transformers' Normalize: norm clamped below at 1e-12).
void finish_embedding(std::vector<float>& v, int dimensions, bool normalize);

// The cosine similarity of two vectors (each norm clamped below at 1e-12, as sentence-transformers'
// cos_sim), in double.
double cosine_similarity(const std::vector<float>& a, const std::vector<float>& b);

// The OpenAI batch line around a vLLM pooling body: {"id": "PREFIX-<16 hex>", "object": "list",
// "created", "model" (the request's, else model_name), "data", "usage" {prompt_tokens,
// total_tokens, completion_tokens 0}}: embeddings ("embd"), scores ("score"), classifications
// ("classify").
nlohmann::json pooled_list_line(const PromptRecord& r, const char* prefix, nlohmann::json data, int64_t prompt_tokens,
                                const std::string& model_name, int64_t created);

// The shortest decimal that reads back as the same float32 (float's to_chars), as a JSON number
// (null for a value that is not finite).
nlohmann::json float32_number(float v);

// Base64 (RFC 4648, padded) of the bytes; exposed for tests.
std::string base64_encode(const void* data, size_t bytes);

}  // namespace strata
