// A GPTQ checkpoint's format from config.json's quantization_config or quantize_config.json
// (include/strata/model/gptq.h); the tensors are read by gptq_source.cpp.
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "strata/core/error.h"
#include "strata/model/gptq.h"

namespace strata {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// quantization_config (or quantize_config.json) -> GptqFormat; `where` names the object.
GptqFormat parse_format(const json& q, const std::string& where) {
  auto field = [&](const char* name) { return where + "." + name; };
  const json& m = q.contains("quant_method") ? q["quant_method"] : json("gptq");
  if (!m.is_string()) STRATA_FAIL(field("quant_method") << " is not a string");
  const std::string method = m.get<std::string>();
  if (method != "gptq")
    STRATA_FAIL(field("quant_method") << " is '" << method
                                      << "': Strata reads GPTQ checkpoints; other quantization methods are not supported"
                                         " (use the unquantized model, or a GGUF file)");
  GptqFormat f;
  f.source = where;
  if (!q.contains("bits") || !q["bits"].is_number_integer()) STRATA_FAIL(field("bits") << " is missing or not an integer");
  f.bits = q["bits"].get<int>();
  if (f.bits != 2 && f.bits != 4 && f.bits != 8)
    STRATA_FAIL(field("bits") << " is " << f.bits << ": GPTQ codes of 2, 4 or 8 bits are supported");
  if (!q.contains("group_size") || !q["group_size"].is_number_integer())
    STRATA_FAIL(field("group_size") << " is missing or not an integer");
  const int group = q["group_size"].get<int>();
  if (group != -1 && group <= 0) STRATA_FAIL(field("group_size") << " is " << group << ": a positive size or -1 (whole rows)");
  f.group_size = group == -1 ? 0 : group;
  // transformers calls it checkpoint_format; GPTQModel also writes format.
  for (const char* key : {"checkpoint_format", "format"}) {
    if (!q.contains(key)) continue;
    const std::string v = q[key].is_string() ? q[key].get<std::string>() : q[key].dump();
    if (v == "gptq") f.zero_minus_one = true;
    else if (v == "gptq_v2") f.zero_minus_one = false;
    else STRATA_FAIL(field(key) << " is '" << v << "': the packing of formats gptq and gptq_v2 is supported");
    break;
  }
  if (q.contains("pack_dtype") && q["pack_dtype"] != json("int32"))
    STRATA_FAIL(field("pack_dtype") << " is " << q["pack_dtype"].dump() << ": codes packed in int32 are supported");
  if (q.contains("dynamic") && !q["dynamic"].is_null() && !q["dynamic"].empty())
    STRATA_FAIL(field("dynamic") << " gives modules their own bits or groups, which Strata does not read");
  return f;
}

std::optional<json> read_json(const fs::path& p) {
  if (!fs::exists(p)) return std::nullopt;
  std::ifstream in(p);
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    STRATA_FAIL(p.string() << ": invalid JSON: " << e.what());
  }
}

}  // namespace

std::optional<GptqFormat> gptq_format_from_config_text(const std::string& text, const std::string& file) {
  json c;
  try {
    c = json::parse(text);
  } catch (const json::exception& e) {
    STRATA_FAIL(file << ": invalid JSON: " << e.what());
  }
  if (!c.is_object() || !c.contains("quantization_config")) return std::nullopt;
  const json& q = c["quantization_config"];
  if (!q.is_object()) STRATA_FAIL(file << ": quantization_config is not an object");
  if (!q.contains("quant_method")) STRATA_FAIL(file << ": quantization_config has no quant_method");
  return parse_format(q, file + ": quantization_config");
}

std::optional<GptqFormat> read_gptq_format(const fs::path& model_dir) {
  const fs::path config = model_dir / "config.json";
  if (std::ifstream in(config); in) {
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (std::optional<GptqFormat> f = gptq_format_from_config_text(text, config.string())) return f;
  }
  const fs::path legacy = model_dir / "quantize_config.json";
  if (const std::optional<json> q = read_json(legacy)) {
    if (!q->is_object()) STRATA_FAIL(legacy.string() << ": not a JSON object");
    return parse_format(*q, legacy.string());
  }
  return std::nullopt;
}

std::string describe_gptq(const GptqFormat& format) {
  std::ostringstream s;
  s << "GPTQ " << format.bits << "-bit, ";
  if (format.group_size) s << "group " << format.group_size;
  else s << "one group per row";
  return s.str();
}

std::string gptq_load_note(const GptqFormat& format) {
  std::ostringstream s;
  s << "weights: " << describe_gptq(format) << " checkpoint; a policy with compress_weights {bits: "
    << (format.bits <= 4 ? 4 : 8) << ", group_size: " << (format.group_size ? std::to_string(std::min(format.group_size, 128)) : "32")
    << "} keeps its codes, otherwise they are dequantized at load";
  return s.str();
}

}  // namespace strata
