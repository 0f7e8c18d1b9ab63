// A GPTQ or AWQ checkpoint's format from config.json's quantization_config, AutoGPTQ's
// quantize_config.json or AutoAWQ's quant_config.json
// (include/strata/model/packed_checkpoint.h); the tensors are read by packed_source.cpp.
#include <fstream>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <sstream>

#include "strata/core/error.h"
#include "strata/model/packed_checkpoint.h"

namespace strata {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The group size (key `key`): a positive count, or -1 for whole rows (stored as 0).
int group_size_of(const json& q, const char* key, const std::string& field) {
  if (!q.contains(key) || !q[key].is_number_integer()) STRATA_FAIL(field << " is missing or not an integer");
  const int64_t group = q[key].get<int64_t>();
  if (group != -1 && (group <= 0 || group > (int64_t(1) << 30)))
    STRATA_FAIL(field << " is " << group << ": a positive size or -1 (whole rows)");
  return group == -1 ? 0 : int(group);
}

// The bits (key `key`), when one of `allowed`; `field` names it in errors, `what` the codes read.
int bits_of(const json& q, const char* key, const std::string& field, std::initializer_list<int> allowed,
            const char* what) {
  if (!q.contains(key) || !q[key].is_number_integer()) STRATA_FAIL(field << " is missing or not an integer");
  const int64_t bits = q[key].get<int64_t>();
  for (int a : allowed)
    if (bits == a) return a;
  STRATA_FAIL(field << " is " << bits << ": " << what);
}

// A string field's value ("" when absent); `field` names it in errors.
std::string string_of(const json& q, const char* key, const std::string& field) {
  if (!q.contains(key)) return {};
  if (!q[key].is_string()) STRATA_FAIL(field << " is not a string");
  return q[key].get<std::string>();
}

// Key names of an AWQ format: transformers' quantization_config, or AutoAWQ's quant_config.json.
struct AwqKeys {
  const char* bits;
  const char* group_size;
};
constexpr AwqKeys kHfAwqKeys{"bits", "group_size"}, kAutoAwqKeys{"w_bit", "q_group_size"};

PackedFormat parse_awq(const json& q, const std::string& where, const AwqKeys& keys = kHfAwqKeys) {
  auto field = [&](const char* name) { return where + "." + name; };
  PackedFormat f;
  f.method = PackedMethod::Awq;
  f.source = where;
  f.zero_minus_one = false;
  f.bits = bits_of(q, keys.bits, field(keys.bits), {4}, "AWQ checkpoints of 4 bits are supported");
  f.group_size = group_size_of(q, keys.group_size, field(keys.group_size));
  if (f.group_size == 0) STRATA_FAIL(field(keys.group_size) << " is -1: AWQ checkpoints have groups");
  const std::string version = string_of(q, "version", field("version"));
  if (!version.empty() && version != "gemm" && version != "GEMM")
    STRATA_FAIL(field("version") << " is '" << version << "': AWQ's GEMM packing is supported (not GEMV, Marlin or"
                                    " ExLlama repacking)");
  if (q.contains("zero_point") && q["zero_point"] != json(true))
    STRATA_FAIL(field("zero_point") << " is " << q["zero_point"].dump()
                                    << ": AWQ checkpoints with zero points (the GEMM default) are supported");
  return f;
}

// quantization_config (or quantize_config.json) -> PackedFormat; `where` names the object.
PackedFormat parse_format(const json& q, const std::string& where) {
  auto field = [&](const char* name) { return where + "." + name; };
  std::string method = string_of(q, "quant_method", field("quant_method"));
  if (method.empty()) method = "gptq";  // quantize_config.json of AutoGPTQ predates the field
  if (method == "awq") return parse_awq(q, where);
  if (method != "gptq")
    STRATA_FAIL(field("quant_method") << " is '" << method
                                      << "': Strata reads GPTQ and AWQ checkpoints; other quantization methods are not"
                                         " supported (use the unquantized model, or a GGUF file)");
  PackedFormat f;
  f.source = where;
  f.bits = bits_of(q, "bits", field("bits"), {2, 4, 8}, "GPTQ codes of 2, 4 or 8 bits are supported");
  f.group_size = group_size_of(q, "group_size", field("group_size"));
  // transformers calls it checkpoint_format; GPTQModel also writes format.
  for (const char* key : {"checkpoint_format", "format"}) {
    if (!q.contains(key)) continue;
    const std::string v = string_of(q, key, field(key));
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

json parse_json(const std::string& text, const std::string& file) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    STRATA_FAIL(file << ": invalid JSON: " << e.what());
  }
}

std::optional<std::string> read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return std::nullopt;
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

std::optional<PackedFormat> packed_format_from_config_text(const std::string& text, const std::string& file) {
  const json c = parse_json(text, file);
  if (!c.is_object() || !c.contains("quantization_config")) return std::nullopt;
  const json& q = c["quantization_config"];
  if (!q.is_object()) STRATA_FAIL(file << ": quantization_config is not an object");
  if (!q.contains("quant_method")) STRATA_FAIL(file << ": quantization_config has no quant_method");
  // GPT-OSS's MXFP4 experts are no packed format: gpt_oss_source reads them.
  if (q["quant_method"] == "mxfp4" && c.value("model_type", json()) == "gpt_oss") return std::nullopt;
  return parse_format(q, file + ": quantization_config");
}

std::optional<PackedFormat> read_packed_format(const fs::path& model_dir) {
  const fs::path config = model_dir / "config.json";
  if (const std::optional<std::string> text = read_text(config))
    if (std::optional<PackedFormat> f = packed_format_from_config_text(*text, config.string())) return f;
  // Older checkpoints describe their codes beside an unmarked config.json: AutoGPTQ in
  // quantize_config.json, AutoAWQ in quant_config.json (w_bit, q_group_size, zero_point, version).
  auto legacy = [&](const char* name) -> std::optional<std::pair<json, std::string>> {
    const fs::path file = model_dir / name;
    const std::optional<std::string> text = read_text(file);
    if (!text) return std::nullopt;
    json q = parse_json(*text, file.string());
    if (!q.is_object()) STRATA_FAIL(file.string() << ": not a JSON object");
    return std::pair{std::move(q), file.string()};
  };
  if (const auto q = legacy("quantize_config.json")) return parse_format(q->first, q->second);
  if (const auto q = legacy("quant_config.json")) return parse_awq(q->first, q->second, kAutoAwqKeys);
  return std::nullopt;
}

std::string describe_packed(const PackedFormat& format) {
  std::ostringstream s;
  s << (format.method == PackedMethod::Awq ? "AWQ " : "GPTQ ") << format.bits << "-bit, ";
  if (format.group_size) s << "group " << format.group_size;
  else s << "one group per row";
  return s.str();
}

std::optional<quant::QuantSpec> packed_codes_spec(const PackedFormat& format) {
  // The largest of Strata's group sizes that divides the file's keeps the codes (read_codes).
  for (int g : {128, 64, 32})
    if (format.group_size == 0 || format.group_size % g == 0) return quant::QuantSpec{format.bits <= 4 ? 4 : 8, g};
  return std::nullopt;
}

std::string packed_load_note(const PackedFormat& format) {
  std::ostringstream s;
  s << "weights: " << describe_packed(format) << " checkpoint; ";
  if (const auto spec = packed_codes_spec(format))
    s << "a policy with compress_weights {bits: " << spec->bits << ", group_size: " << spec->group_size
      << "} keeps its codes, otherwise they are dequantized at load";
  else
    s << "its groups are not a multiple of 32, so its matrices are dequantized at load";
  return s.str();
}

}  // namespace strata
