#include "strata/job/prompts.h"

#include <fstream>
#include <set>
#include <unordered_set>

#include "strata/core/error.h"

namespace strata {
using json = nlohmann::json;

namespace {

const std::set<std::string> kKnownKeys = {"id", "prompt", "messages", "max_new_tokens", "temperature",
                                          "top_p", "top_k", "seed", "ignore_eos"};

struct LineContext {
  std::string where;  // "file:line"
  [[noreturn]] void fail(const std::string& why) const { throw Error(where + ": " + why); }
};

int64_t get_int(const json& obj, const char* key, const LineContext& ctx) {
  const json& v = obj[key];
  if (!v.is_number_integer()) ctx.fail(std::string("field '") + key + "' must be an integer, got " + v.dump());
  return v.get<int64_t>();
}

double get_number(const json& obj, const char* key, const LineContext& ctx) {
  const json& v = obj[key];
  if (!v.is_number()) ctx.fail(std::string("field '") + key + "' must be a number, got " + v.dump());
  return v.get<double>();
}

void read_sampling(const json& obj, const LineContext& ctx, SamplingParams& s) {
  if (obj.contains("max_new_tokens")) {
    const int64_t n = get_int(obj, "max_new_tokens", ctx);
    if (n < 1 || n > 1000000) ctx.fail("field 'max_new_tokens' must be in [1, 1000000], got " + std::to_string(n));
    s.max_new_tokens = int(n);
  }
  if (obj.contains("temperature")) {
    const double t = get_number(obj, "temperature", ctx);
    if (!(t >= 0 && t <= 100)) ctx.fail("field 'temperature' must be in [0, 100], got " + std::to_string(t));
    s.temperature = float(t);
  }
  if (obj.contains("top_p")) {
    const double p = get_number(obj, "top_p", ctx);
    if (!(p > 0 && p <= 1)) ctx.fail("field 'top_p' must be in (0, 1], got " + std::to_string(p));
    s.top_p = float(p);
  }
  if (obj.contains("top_k")) {
    const int64_t k = get_int(obj, "top_k", ctx);
    if (k < 0) ctx.fail("field 'top_k' must be >= 0, got " + std::to_string(k));
    s.top_k = int(std::min<int64_t>(k, 1 << 30));
  }
  if (obj.contains("seed")) {
    const json& v = obj["seed"];
    if (!v.is_number_integer() || (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0))
      ctx.fail("field 'seed' must be a non-negative integer, got " + v.dump());
    s.seed = v.get<uint64_t>();
  }
  if (obj.contains("ignore_eos")) {
    if (!obj["ignore_eos"].is_boolean()) ctx.fail("field 'ignore_eos' must be true or false");
    s.ignore_eos = obj["ignore_eos"].get<bool>();
  }
}

std::vector<ChatMessage> read_messages(const json& v, const LineContext& ctx) {
  if (!v.is_array() || v.empty()) ctx.fail("field 'messages' must be a non-empty array of {\"role\", \"content\"}");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < v.size(); ++i) {
    const json& m = v[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) ctx.fail(at + " must be an object");
    if (!m.contains("role") || !m["role"].is_string()) ctx.fail(at + ".role must be a string");
    if (!m.contains("content") || !m["content"].is_string()) ctx.fail(at + ".content must be a string");
    out.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  return out;
}

}  // namespace

std::vector<PromptRecord> read_prompts(const std::filesystem::path& file, const SamplingParams& defaults,
                                       const std::function<void(const std::string&)>& warn) {
  std::ifstream in(file);
  if (!in) STRATA_FAIL("cannot open prompts file " << file.string());
  std::vector<PromptRecord> records;
  std::unordered_set<std::string> seen_ids;
  std::set<std::string> warned_keys;
  std::string text;
  int line_no = 0;
  while (std::getline(in, text)) {
    ++line_no;
    if (!text.empty() && text.back() == '\r') text.pop_back();
    if (text.find_first_not_of(" \t") == std::string::npos) continue;
    LineContext ctx{file.string() + ":" + std::to_string(line_no)};
    json obj;
    try {
      obj = json::parse(text);
    } catch (const json::parse_error& e) {
      ctx.fail(std::string("invalid JSON: ") + e.what());
    }
    if (!obj.is_object()) ctx.fail("expected a JSON object, got " + std::string(obj.type_name()));
    PromptRecord r;
    r.line = line_no;
    if (!obj.contains("id")) ctx.fail("missing field 'id'");
    if (!obj["id"].is_string() && !obj["id"].is_number_integer())
      ctx.fail("field 'id' must be a string or an integer, got " + obj["id"].dump());
    r.id = obj["id"];
    r.id_key = r.id.dump();
    if (!seen_ids.insert(r.id_key).second) ctx.fail("duplicate id " + r.id_key);
    const bool has_prompt = obj.contains("prompt"), has_messages = obj.contains("messages");
    if (has_prompt && has_messages) ctx.fail("give either 'prompt' or 'messages', not both");
    if (has_prompt) {
      if (!obj["prompt"].is_string()) ctx.fail("field 'prompt' must be a string, got " + obj["prompt"].dump());
      r.prompt = obj["prompt"].get<std::string>();
      if (r.prompt.empty()) ctx.fail("field 'prompt' is empty");
    } else if (has_messages) {
      r.messages = read_messages(obj["messages"], ctx);
    } else {
      ctx.fail("missing field 'prompt'");
    }
    r.sampling = defaults;
    read_sampling(obj, ctx, r.sampling);
    for (const auto& [key, value] : obj.items())
      if (!kKnownKeys.count(key) && warned_keys.insert(key).second && warn)
        warn(ctx.where + ": ignoring unknown field '" + key + "'");
    records.push_back(std::move(r));
  }
  if (in.bad()) STRATA_FAIL("error reading " << file.string());
  return records;
}

}  // namespace strata
