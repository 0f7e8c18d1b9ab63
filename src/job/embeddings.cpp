#include "strata/job/embeddings.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "strata/core/error.h"
#include "strata/job/output.h"

namespace strata {
using json = nlohmann::json;

const std::set<std::string> kEmbeddingFields = {"input", "dimensions", "encoding_format", "normalize",
                                                "truncate_prompt_tokens", "user"};

namespace {

ServeError refusal(std::string code, std::string message) { return ServeError{std::move(code), std::move(message)}; }

// A token id list, or why it is not one (ids are checked against the vocabulary once the model is known).
std::optional<ServeError> read_ids(const json& list, const std::string& name, std::vector<int32_t>& ids) {
  if (list.empty()) return refusal("invalid_value", name + " is an empty list of token ids");
  for (size_t i = 0; i < list.size(); ++i) {
    const json& v = list[i];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
      return refusal("invalid_value", name + "[" + std::to_string(i) + "] must be a token id (an integer >= 0), got " +
                                          v.dump());
    ids.push_back(v.get<int32_t>());
  }
  return std::nullopt;
}

std::optional<ServeError> read_inputs(const json& input, const std::string& name, EmbeddingRequest& e) {
  auto text = [&](const json& v, const std::string& at) -> std::optional<ServeError> {
    if (v.get_ref<const std::string&>().empty()) return refusal("invalid_value", at + " is an empty string");
    e.inputs.push_back({v.get<std::string>(), {}});
    return std::nullopt;
  };
  if (input.is_string()) return text(input, name);
  if (!input.is_array())
    return refusal("invalid_type", name + " must be a string, an array of strings, an array of token ids or an "
                                          "array of such arrays, got " + std::string(input.type_name()));
  if (input.empty()) return refusal("invalid_value", name + " is an empty array");
  if (input[0].is_number()) {  // one input of token ids
    e.inputs.emplace_back();
    return read_ids(input, name, e.inputs.back().ids);
  }
  e.listed = true;
  if (input.size() > size_t(kMaxEmbeddingInputs))
    return refusal("invalid_value", name + " holds " + std::to_string(input.size()) + " inputs; at most " +
                                        std::to_string(kMaxEmbeddingInputs) + " are allowed");
  for (size_t i = 0; i < input.size(); ++i) {
    const std::string at = name + "[" + std::to_string(i) + "]";
    const json& v = input[i];
    if (v.is_string()) {
      if (auto err = text(v, at)) return err;
    } else if (v.is_array()) {
      e.inputs.emplace_back();
      if (auto err = read_ids(v, at, e.inputs.back().ids)) return err;
    } else {
      return refusal("invalid_type", at + " must be a string or an array of token ids, got " + v.dump());
    }
  }
  return std::nullopt;
}

// The shortest decimal that reads back as the same float32 (float's to_chars), as a JSON number.
json compact_number(float v) {
  if (!std::isfinite(v)) return json(nullptr);  // never from a finite model; JSON has no inf
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf - 1, v);
  *end = '\0';
  return json(std::strtod(buf, nullptr));
}

json vector_json(const std::vector<float>& v, bool base64) {
  if (base64) {
    static_assert(std::endian::native == std::endian::little, "base64 embeddings are little-endian float32");
    return base64_encode(v.data(), v.size() * sizeof(float));
  }
  json out = json::array();
  for (float x : v) out.push_back(compact_number(x));
  return out;
}

}  // namespace

std::optional<ServeError> read_embedding_request(const json& obj, const std::function<std::string(const char*)>& field,
                                                 PromptRecord& r) {
  EmbeddingRequest e;
  if (!obj.contains("input")) return refusal("missing_field", field("input") + " is required for embeddings");
  if (auto err = read_inputs(obj["input"], field("input"), e)) return err;
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
  if (given("truncate_prompt_tokens")) {
    const json& v = obj["truncate_prompt_tokens"];
    if (!v.is_number_integer())
      return refusal("invalid_type", field("truncate_prompt_tokens") + " must be an integer, got " + v.dump());
    if (v.get<int64_t>() == 0 || v.get<int64_t>() < -1 || v.get<int64_t>() > INT32_MAX)
      return refusal("invalid_value", field("truncate_prompt_tokens") + " must be -1 (the model's context) or at "
                                                                        "least 1, got " + v.dump());
    e.truncate = v.get<int>();
  }
  if (given("normalize")) {
    if (!obj["normalize"].is_boolean()) return refusal("invalid_type", field("normalize") + " must be true or false");
    e.normalize = obj["normalize"].get<bool>();
  }
  r.embedding = std::move(e);
  return std::nullopt;
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
  STRATA_CHECK(r.embedding && vectors.size() == r.embedding->inputs.size(),
               "embedding_line: " << vectors.size() << " vectors for a request of "
                                  << (r.embedding ? r.embedding->inputs.size() : 0) << " inputs");
  const EmbeddingRequest& e = *r.embedding;
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
  json body = {{"id", "embd-" + openai_request_hex(r)},
                     {"object", "list"},
                     {"created", created},
                     {"model", r.model.empty() ? model_name : r.model},
                     {"data", std::move(data)},
                     {"usage", {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}, {"completion_tokens", 0}}}};
  return openai_batch_line(r, std::move(body));
}

}  // namespace strata
