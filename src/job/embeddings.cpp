#include "strata/job/embeddings.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "strata/core/error.h"
#include "strata/job/output.h"
#include "strata/model/chat_json.h"

namespace strata {
using json = nlohmann::json;

const std::set<std::string>& embedding_fields(EmbeddingUse use, InputFormat format) {
  static const std::set<std::string> embed = {"input", "dimensions", "encoding_format", "normalize",
                                              "truncate_prompt_tokens", "user"};
  // use_activation (and its deprecated name activation) applies to a cross-encoder's scores.
  static const std::set<std::string> score = {"text_1", "text_2", "truncate_prompt_tokens", "use_activation",
                                              "activation", "user"};
  static const std::set<std::string> rerank = {"query", "documents", "top_n", "truncate_prompt_tokens",
                                               "use_activation", "activation", "user"};
  static const std::set<std::string> score_strata = {"text_1", "text_2", "truncate_prompt_tokens", "use_activation"};
  static const std::set<std::string> rerank_strata = {"query", "documents", "top_n", "truncate_prompt_tokens",
                                                      "use_activation"};
  static const std::set<std::string> classify = {"input", "messages", "use_activation", "softmax", "activation",
                                                 "add_special_tokens", "add_generation_prompt",
                                                 "truncate_prompt_tokens", "user"};
  static const std::set<std::string> classify_strata = {"classify", "messages", "use_activation",
                                                        "add_special_tokens", "add_generation_prompt",
                                                        "truncate_prompt_tokens"};
  switch (use) {
    case EmbeddingUse::Embed: return embed;
    case EmbeddingUse::Score: return format == InputFormat::Strata ? score_strata : score;
    case EmbeddingUse::Rerank: return format == InputFormat::Strata ? rerank_strata : rerank;
    case EmbeddingUse::Classify: return format == InputFormat::Strata ? classify_strata : classify;
  }
  return embed;
}

namespace {

ServeError refusal(std::string code, std::string message) { return ServeError{std::move(code), std::move(message)}; }

using FieldName = std::function<std::string(const char*)>;

// A field's name in messages, for a key that may carry indices: "body.input[2]", "field 'input[2]'".
std::string named(const FieldName& field, const std::string& key) { return field(key.c_str()); }
std::string indexed(const std::string& key, size_t i) { return key + "[" + std::to_string(i) + "]"; }

// A token id list, or why it is not one (ids are checked against the vocabulary once the model is known).
std::optional<ServeError> read_ids(const json& list, const FieldName& field, const std::string& key,
                                   std::vector<int32_t>& ids) {
  if (list.empty()) return refusal("invalid_value", named(field, key) + " is an empty list of token ids");
  for (size_t i = 0; i < list.size(); ++i) {
    const json& v = list[i];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
      return refusal("invalid_value",
                     named(field, indexed(key, i)) + " must be a token id (an integer >= 0), got " + v.dump());
    ids.push_back(v.get<int32_t>());
  }
  return std::nullopt;
}

// One text, non-empty, appended to `out`.
std::optional<ServeError> read_text(const json& t, const FieldName& field, const std::string& key,
                                    std::vector<EmbeddingInput>& out) {
  if (!t.is_string()) return refusal("invalid_type", named(field, key) + " must be a string, got " + t.dump());
  if (t.get_ref<const std::string&>().empty()) return refusal("invalid_value", named(field, key) + " is an empty string");
  out.push_back({t.get<std::string>(), {}});
  return std::nullopt;
}

// `key`'s inputs: a text, texts, token ids, or arrays of ids ("input"; the strata format's "classify").
std::optional<ServeError> read_inputs(const json& input, const FieldName& field, const std::string& key,
                                      EmbeddingRequest& e) {
  if (input.is_string()) return read_text(input, field, key, e.inputs);
  if (!input.is_array())
    return refusal("invalid_type", named(field, key) + " must be a string, an array of strings, an array of token ids "
                                                       "or an array of such arrays, got " + std::string(input.type_name()));
  if (input.empty()) return refusal("invalid_value", named(field, key) + " is an empty array");
  if (input[0].is_number()) {  // one input of token ids
    e.inputs.emplace_back();
    return read_ids(input, field, key, e.inputs.back().ids);
  }
  e.listed = true;
  if (input.size() > size_t(kMaxEmbeddingInputs))
    return refusal("invalid_value", named(field, key) + " holds " + std::to_string(input.size()) +
                                        " inputs; at most " + std::to_string(kMaxEmbeddingInputs) + " are allowed");
  for (size_t i = 0; i < input.size(); ++i) {
    const json& v = input[i];
    if (v.is_string()) {
      if (auto err = read_text(v, field, indexed(key, i), e.inputs)) return err;
    } else if (v.is_array()) {
      e.inputs.emplace_back();
      if (auto err = read_ids(v, field, indexed(key, i), e.inputs.back().ids)) return err;
    } else {
      return refusal("invalid_type",
                     named(field, indexed(key, i)) + " must be a string or an array of token ids, got " + v.dump());
    }
  }
  return std::nullopt;
}

// A string, or a non-empty array of strings, each non-empty: its texts appended to `out`.
std::optional<ServeError> read_texts(const json& v, const FieldName& field, const std::string& key,
                                     std::vector<EmbeddingInput>& out) {
  if (!v.is_array()) return read_text(v, field, key, out);
  if (v.empty()) return refusal("invalid_value", named(field, key) + " is an empty array");
  for (size_t i = 0; i < v.size(); ++i)
    if (auto err = read_text(v[i], field, indexed(key, i), out)) return err;
  return std::nullopt;
}

std::optional<ServeError> read_truncate(const json& obj, const FieldName& field,
                                        EmbeddingRequest& e) {
  if (!obj.contains("truncate_prompt_tokens") || obj["truncate_prompt_tokens"].is_null()) return std::nullopt;
  const json& v = obj["truncate_prompt_tokens"];
  if (!v.is_number_integer())
    return refusal("invalid_type", field("truncate_prompt_tokens") + " must be an integer, got " + v.dump());
  if (v.get<int64_t>() == 0 || v.get<int64_t>() < -1 || v.get<int64_t>() > INT32_MAX)
    return refusal("invalid_value", field("truncate_prompt_tokens") + " must be -1 (the model's context) or at "
                                                                      "least 1, got " + v.dump());
  e.truncate = v.get<int>();
  return std::nullopt;
}

// vLLM's /v1/score: text_1 and text_2, one against many (text_1 one text) or pairwise (equal counts).
std::optional<ServeError> read_score(const json& obj, const FieldName& field,
                                     EmbeddingRequest& e) {
  for (const char* key : {"text_1", "text_2"})
    if (!obj.contains(key)) return refusal("missing_field", field(key) + " is required for scores");
  if (auto err = read_texts(obj["text_1"], field, "text_1", e.inputs)) return err;
  e.first = e.inputs.size();
  if (auto err = read_texts(obj["text_2"], field, "text_2", e.inputs)) return err;
  const size_t second = e.inputs.size() - e.first;
  if (e.first > 1 && e.first != second)
    return refusal("invalid_value", field("text_1") + " holds " + std::to_string(e.first) + " texts and " +
                                        field("text_2") + " " + std::to_string(second) +
                                        ": give one text_1 for many text_2, or as many of each (pairs)");
  return std::nullopt;
}

// vLLM's /v1/rerank: a query and the documents to order by their similarity to it.
std::optional<ServeError> read_rerank(const json& obj, const FieldName& field,
                                      EmbeddingRequest& e) {
  for (const char* key : {"query", "documents"})
    if (!obj.contains(key)) return refusal("missing_field", field(key) + " is required for reranking");
  if (!obj["query"].is_string())
    return refusal("invalid_type", field("query") + " must be a string, got " + obj["query"].dump());
  if (auto err = read_texts(obj["query"], field, "query", e.inputs)) return err;
  e.first = 1;
  if (!obj["documents"].is_array())
    return refusal("invalid_type", field("documents") + " must be an array of strings, got " + obj["documents"].dump());
  if (auto err = read_texts(obj["documents"], field, "documents", e.inputs)) return err;
  if (obj.contains("top_n") && !obj["top_n"].is_null()) {
    const json& v = obj["top_n"];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
      return refusal("invalid_value", field("top_n") + " must be an integer >= 0 (0: every document), got " + v.dump());
    e.top_n = v.get<int>();
  }
  return std::nullopt;
}

// A boolean field, if given (null: not given).
std::optional<ServeError> read_flag(const json& obj, const FieldName& field, const char* key, std::optional<bool>& out) {
  if (!obj.contains(key) || obj[key].is_null()) return std::nullopt;
  if (!obj[key].is_boolean()) return refusal("invalid_type", field(key) + " must be true or false, got " + obj[key].dump());
  out = obj[key].get<bool>();
  return std::nullopt;
}

// use_activation, or vLLM's deprecated names (classify: softmax and activation; score and rerank:
// activation), the later in this order winning: activation, softmax, use_activation. The strata
// format reads use_activation only.
std::optional<ServeError> read_activation(const json& obj, const FieldName& field, InputFormat format,
                                          EmbeddingRequest& e) {
  std::optional<bool> activation;
  for (const char* flag : {"activation", "softmax", "use_activation"}) {
    std::optional<bool> v;
    if (!embedding_fields(e.use, format).count(flag)) continue;
    if (auto err = read_flag(obj, field, flag, v)) return err;
    if (v) activation = v;
  }
  e.activation = activation.value_or(true);
  return std::nullopt;
}

// vLLM's /v1/classify: `input` (texts or ids, as for embeddings) or `messages` (one conversation,
// rendered by the chat template); the strata format's "classify" holds the input, or is true beside
// "messages".
std::optional<ServeError> read_classify(const json& obj, const FieldName& field, PromptRecord& r, EmbeddingRequest& e) {
  const bool openai = r.format == InputFormat::OpenAIBatch;
  const std::string key = openai ? "input" : "classify";
  const bool has_input = obj.contains(key) && !(openai && obj[key].is_null());
  const bool has_messages = obj.contains("messages") && !obj["messages"].is_null();
  e.chat = has_messages && (openai || obj[key] == json(true));
  if (openai && has_input && has_messages)
    return refusal("invalid_value", "give " + field("input") + " or " + field("messages") + ", not both");
  if (!has_input && !has_messages)
    return refusal("missing_field", field("input") + " or " + field("messages") + " is required for classification");
  if (!openai && obj[key].is_boolean() && !e.chat)
    return refusal("invalid_value", obj[key] == json(true) ? field("classify") + " true classifies 'messages', which is missing"
                                                           : field("classify") + " must be the input, or true with 'messages'");
  if (!openai && has_messages && !e.chat)
    return refusal("invalid_value", "give the input in " + field("classify") + " or the conversation in " +
                                        field("messages") + " (with \"classify\": true), not both");
  if (e.chat) {
    try {
      r.messages = read_chat_messages(obj["messages"], openai ? "body.messages" : "messages", /*text_parts=*/openai);
    } catch (const ChatMessageError& err) {
      return refusal(err.code, err.what());
    }
    e.inputs.emplace_back();
  } else if (auto err = read_inputs(obj[key], field, key, e)) {
    return err;
  }
  if (auto err = read_activation(obj, field, r.format, e)) return err;
  std::optional<bool> specials, generation_prompt;
  if (auto err = read_flag(obj, field, "add_special_tokens", specials)) return err;
  if (auto err = read_flag(obj, field, "add_generation_prompt", generation_prompt)) return err;
  if (generation_prompt && !e.chat)
    return refusal("invalid_value", field("add_generation_prompt") + " is for " + field("messages"));
  // vLLM's defaults: a text gets the tokenizer's special tokens; a rendered conversation has its own.
  e.add_special_tokens = specials.value_or(!e.chat);
  e.add_generation_prompt = generation_prompt.value_or(false);
  return read_truncate(obj, field, e);
}

}  // namespace

json pooled_list_line(const PromptRecord& r, const char* prefix, json data, int64_t prompt_tokens,
                      const std::string& model_name, int64_t created) {
  return openai_batch_line(r, {{"id", std::string(prefix) + "-" + openai_request_hex(r)},
                               {"object", "list"},
                               {"created", created},
                               {"model", r.model.empty() ? model_name : r.model},
                               {"data", std::move(data)},
                               {"usage", {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens},
                                          {"completion_tokens", 0}}}});
}

json float32_number(float v) {
  if (!std::isfinite(v)) return json(nullptr);  // never from a finite model; JSON has no inf
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf - 1, v);
  *end = '\0';
  return json(std::strtod(buf, nullptr));
}

namespace {

json vector_json(const std::vector<float>& v, bool base64) {
  if (base64) {
    static_assert(std::endian::native == std::endian::little, "base64 embeddings are little-endian float32");
    return base64_encode(v.data(), v.size() * sizeof(float));
  }
  json out = json::array();
  for (float x : v) out.push_back(float32_number(x));
  return out;
}

json score_line(const PromptRecord& r, const std::vector<double>& scores, int64_t prompt_tokens,
                const std::string& model_name, int64_t created) {
  json values = json::array();
  for (double v : scores) values.push_back(float32_number(float(v)));
  if (r.format == InputFormat::Strata) return {{"id", r.id}, {"scores", std::move(values)}, {"prompt_tokens", prompt_tokens}};
  json data = json::array();
  for (size_t k = 0; k < values.size(); ++k) data.push_back({{"index", k}, {"object", "score"}, {"score", values[k]}});
  return pooled_list_line(r, "score", std::move(data), prompt_tokens, model_name, created);
}

json rerank_line(const PromptRecord& r, const std::vector<double>& scores, int64_t prompt_tokens,
                 const std::string& model_name) {
  const EmbeddingRequest& e = *r.embedding;
  std::vector<std::pair<double, size_t>> ranked;  // (score, document index)
  for (size_t d = 0; d < scores.size(); ++d) ranked.emplace_back(scores[d], d);
  std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  if (e.top_n > 0 && size_t(e.top_n) < ranked.size()) ranked.resize(size_t(e.top_n));
  const bool openai = r.format == InputFormat::OpenAIBatch;
  json results = json::array();
  for (const auto& [score, d] : ranked) {
    json item = {{"index", d}, {"relevance_score", float32_number(float(score))}};
    if (openai) item["document"] = {{"text", e.inputs[d + 1].text}};
    results.push_back(std::move(item));
  }
  if (!openai) return {{"id", r.id}, {"results", std::move(results)}, {"prompt_tokens", prompt_tokens}};
  return openai_batch_line(r, {{"id", "rerank-" + openai_request_hex(r)},
                               {"model", r.model.empty() ? model_name : r.model},
                               {"usage", {{"total_tokens", prompt_tokens}}},
                               {"results", std::move(results)}});
}

}  // namespace

std::optional<ServeError> read_embedding_request(const json& obj, const std::function<std::string(const char*)>& field,
                                                 PromptRecord& r, EmbeddingUse use) {
  EmbeddingRequest e;
  e.use = use;
  if (use == EmbeddingUse::Classify) {
    if (auto err = read_classify(obj, field, r, e)) return err;
    r.embedding = std::move(e);
    return std::nullopt;
  }
  if (use != EmbeddingUse::Embed) {
    if (auto err = use == EmbeddingUse::Score ? read_score(obj, field, e) : read_rerank(obj, field, e)) return err;
    if (e.inputs.size() > size_t(kMaxEmbeddingInputs))
      return refusal("invalid_value", "the request holds " + std::to_string(e.inputs.size()) + " texts; at most " +
                                          std::to_string(kMaxEmbeddingInputs) + " are allowed");
    if (auto err = read_truncate(obj, field, e)) return err;
    if (auto err = read_activation(obj, field, r.format, e)) return err;
    r.embedding = std::move(e);
    return std::nullopt;
  }
  if (!obj.contains("input")) return refusal("missing_field", field("input") + " is required for embeddings");
  if (auto err = read_inputs(obj["input"], field, "input", e)) return err;
  auto given = [&](const char* key) { return obj.contains(key) && !obj[key].is_null(); };
  if (given("dimensions")) {
    const json& v = obj["dimensions"];
    if (!v.is_number_integer()) return refusal("invalid_type", field("dimensions") + " must be an integer, got " + v.dump());
    if (v.get<int64_t>() < 1 || v.get<int64_t>() > (1 << 20))
      return refusal("invalid_value", field("dimensions") + " must be at least 1, got " + v.dump());
    e.dimensions = v.get<int>();
  }
  if (given("encoding_format")) {
    const json& v = obj["encoding_format"];
    if (v != "float" && v != "base64")
      return refusal("invalid_value", field("encoding_format") + " must be \"float\" or \"base64\", got " + v.dump());
    e.base64 = v == "base64";
  }
  if (auto err = read_truncate(obj, field, e)) return err;
  if (given("normalize")) {
    if (!obj["normalize"].is_boolean()) return refusal("invalid_type", field("normalize") + " must be true or false");
    e.normalize = obj["normalize"].get<bool>();
  }
  r.embedding = std::move(e);
  return std::nullopt;
}

std::vector<std::pair<size_t, size_t>> request_pairs(const EmbeddingRequest& e) {
  STRATA_CHECK(e.use == EmbeddingUse::Score || e.use == EmbeddingUse::Rerank, "request_pairs of a request without pairs");
  std::vector<std::pair<size_t, size_t>> pairs;
  for (size_t k = 0; k + e.first < e.inputs.size(); ++k)  // one text_1 (the query) against each, or pair k
    pairs.emplace_back(e.first == 1 ? 0 : k, e.first + k);
  return pairs;
}

json pair_score_line(const PromptRecord& r, const std::vector<double>& scores, int64_t prompt_tokens,
                     const std::string& model_name, int64_t created) {
  STRATA_CHECK(r.embedding && scores.size() == request_pairs(*r.embedding).size(),
               "pair_score_line: " << scores.size() << " scores for the request's pairs");
  if (r.embedding->use == EmbeddingUse::Score) return score_line(r, scores, prompt_tokens, model_name, created);
  return rerank_line(r, scores, prompt_tokens, model_name);
}

std::string embedding_input_name(const EmbeddingRequest& e, size_t i) {
  auto indexed = [](const char* name, size_t k) { return std::string(name) + "[" + std::to_string(k) + "]"; };
  switch (e.use) {
    case EmbeddingUse::Embed: return e.listed ? indexed("input", i) : "input";
    case EmbeddingUse::Score:
      if (i < e.first) return e.first > 1 ? indexed("text_1", i) : "text_1";
      return e.inputs.size() - e.first > 1 || e.first > 1 ? indexed("text_2", i - e.first) : "text_2";
    case EmbeddingUse::Rerank: return i == 0 ? "query" : indexed("documents", i - 1);
    case EmbeddingUse::Classify: {
      const char* key = e.chat ? "messages" : "input";
      return e.listed ? indexed(key, i) : key;
    }
  }
  return "input";
}

double cosine_similarity(const std::vector<float>& a, const std::vector<float>& b) {
  STRATA_CHECK(a.size() == b.size(), "cosine of vectors of " << a.size() << " and " << b.size() << " values");
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ab += double(a[i]) * b[i];
    aa += double(a[i]) * a[i];
    bb += double(b[i]) * b[i];
  }
  return ab / (std::max(std::sqrt(aa), 1e-12) * std::max(std::sqrt(bb), 1e-12));
}

void finish_embedding(std::vector<float>& v, int dimensions, bool normalize) {
  STRATA_CHECK(dimensions >= 0 && size_t(dimensions) <= v.size(),
               "dimensions " << dimensions << " outside [0, " << v.size() << "]");
  if (dimensions > 0) v.resize(size_t(dimensions));
  if (!normalize) return;
  double sq = 0;
  for (float x : v) sq += double(x) * double(x);
  const double norm = std::max(std::sqrt(sq), 1e-12);
  for (float& x : v) x = float(double(x) / norm);
}

std::string base64_encode(const void* data, size_t bytes) {
  static const char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const auto* p = static_cast<const unsigned char*>(data);
  std::string out;
  out.reserve((bytes + 2) / 3 * 4);
  for (size_t i = 0; i < bytes; i += 3) {
    const uint32_t n = uint32_t(p[i]) << 16 | (i + 1 < bytes ? uint32_t(p[i + 1]) << 8 : 0u) |
                       (i + 2 < bytes ? uint32_t(p[i + 2]) : 0u);
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += i + 1 < bytes ? kAlphabet[(n >> 6) & 63] : '=';
    out += i + 2 < bytes ? kAlphabet[n & 63] : '=';
  }
  return out;
}

json embedding_line(const PromptRecord& r, std::vector<std::vector<float>> vectors, int64_t prompt_tokens,
                    bool normalize_default, const std::string& model_name, int64_t created) {
  STRATA_CHECK(r.embedding && r.embedding->use != EmbeddingUse::Classify && vectors.size() == r.embedding->inputs.size(),
               "embedding_line: " << vectors.size() << " vectors for a request of "
                                  << (r.embedding ? r.embedding->inputs.size() : 0) << " inputs");
  const EmbeddingRequest& e = *r.embedding;
  if (e.use == EmbeddingUse::Score || e.use == EmbeddingUse::Rerank) {
    std::vector<double> scores;  // the cosine similarity of each pair's vectors
    for (const auto& [a, b] : request_pairs(e)) scores.push_back(cosine_similarity(vectors[a], vectors[b]));
    return pair_score_line(r, scores, prompt_tokens, model_name, created);
  }
  for (std::vector<float>& v : vectors) finish_embedding(v, e.dimensions, e.normalize.value_or(normalize_default));
  if (r.format == InputFormat::Strata) {
    json line;
    line["id"] = r.id;
    if (e.listed) {
      json list = json::array();
      for (const std::vector<float>& v : vectors) list.push_back(vector_json(v, e.base64));
      line["embeddings"] = std::move(list);
    } else {
      line["embedding"] = vector_json(vectors[0], e.base64);
    }
    line["prompt_tokens"] = prompt_tokens;
    return line;
  }
  json data = json::array();
  for (size_t i = 0; i < vectors.size(); ++i)
    data.push_back({{"index", i}, {"object", "embedding"}, {"embedding", vector_json(vectors[i], e.base64)}});
  return pooled_list_line(r, "embd", std::move(data), prompt_tokens, model_name, created);
}

}  // namespace strata
