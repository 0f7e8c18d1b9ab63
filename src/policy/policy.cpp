#include "strata/policy/policy.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "strata/core/error.h"
#include "strata/core/yaml_reader.h"

namespace strata {
namespace {

struct Reader : YamlReader {

  int integer(const YAML::Node& n, const std::string& field, int lo, int hi) const {
    int v = 0;
    try {
      v = n.as<int>();
    } catch (const YAML::Exception&) {
      fail(n, "field '" + field + "' must be an integer, got '" + (n.IsScalar() ? n.Scalar() : "a " + std::string(n.IsMap() ? "map" : "list")) + "'");
    }
    if (v < lo || v > hi)
      fail(n, "field '" + field + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + std::to_string(v));
    return v;
  }

  bool boolean(const YAML::Node& n, const std::string& field) const {
    try {
      return n.as<bool>();
    } catch (const YAML::Exception&) {
      fail(n, "field '" + field + "' must be true or false");
    }
  }

  TierSplit split(const YAML::Node& n, const std::string& field) const {
    if (!n.IsMap()) fail(n, "field '" + field + "' must be a map {gpu: %, cpu: %, disk: %}");
    only_keys(n, {"gpu", "cpu", "disk"}, field + ".");
    TierSplit s{0, 0, 0};
    if (n["gpu"]) s.gpu = integer(n["gpu"], field + ".gpu", 0, 100);
    if (n["cpu"]) s.cpu = integer(n["cpu"], field + ".cpu", 0, 100);
    if (n["disk"]) s.disk = integer(n["disk"], field + ".disk", 0, 100);
    const int sum = s.gpu + s.cpu + s.disk;
    if (sum != 100)
      fail(n, "field '" + field + "': percentages sum to " + std::to_string(sum) + ", not 100");
    return s;
  }

  std::optional<Compression> compression(const YAML::Node& n, const std::string& field) const {
    if (!n || n.IsNull()) return std::nullopt;
    if (n.IsScalar()) {
      if (!boolean(n, field)) return std::nullopt;
      return Compression{};
    }
    if (!n.IsMap()) fail(n, "field '" + field + "' must be a map {bits, group_size} or false");
    only_keys(n, {"bits", "group_size"}, field + ".");
    Compression c;
    if (n["bits"]) {
      c.bits = integer(n["bits"], field + ".bits", 4, 8);
      if (c.bits != 4 && c.bits != 8) fail(n["bits"], "field '" + field + ".bits' must be 4 or 8, got " + std::to_string(c.bits));
    }
    if (n["group_size"]) {
      c.group_size = integer(n["group_size"], field + ".group_size", 32, 128);
      if (c.group_size != 32 && c.group_size != 64 && c.group_size != 128)
        fail(n["group_size"], "field '" + field + ".group_size' must be 32, 64 or 128, got " + std::to_string(c.group_size));
    }
    return c;
  }
};

}  // namespace

Policy parse_policy(const std::string& text, const std::string& source) {
  Reader r{source};
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    throw Error(source + ":" + std::to_string(e.mark.line + 1) + ": invalid YAML: " + e.msg);
  }
  if (!root.IsMap()) throw Error(source + ": a policy is a YAML map of fields");
  // Activations are one hidden state per sequence and move every layer; the runtime quantizes only
  // what is stored long and read often (weights, KV cache), as FlexGen does.
  if (root["compress_activations"])
    r.fail(root["compress_activations"], "field 'compress_activations': activations cannot be compressed (only "
                                         "compress_weights and compress_kv_cache)");
  r.only_keys(root, {"gpu_batch_size", "num_gpu_batches", "weights", "expert_weights", "kv_cache", "activations", "overlap",
                     "cpu_attention", "cpu_experts", "compress_weights", "compress_kv_cache", "prefill_tokens",
                     "prefill_batches_per_step"}, "");
  Policy p;
  for (const char* required : {"gpu_batch_size", "num_gpu_batches", "weights", "kv_cache", "activations"})
    if (!root[required]) throw Error(source + ": missing field '" + required + "'");
  p.gpu_batch_size = r.integer(root["gpu_batch_size"], "gpu_batch_size", 1, 1 << 20);
  p.num_gpu_batches = r.integer(root["num_gpu_batches"], "num_gpu_batches", 1, 1 << 20);
  p.weights = r.split(root["weights"], "weights");
  p.kv_cache = r.split(root["kv_cache"], "kv_cache");
  p.activations = r.split(root["activations"], "activations");
  if (root["expert_weights"]) p.expert_weights = r.split(root["expert_weights"], "expert_weights");
  if (root["overlap"]) p.overlap = r.boolean(root["overlap"], "overlap");
  if (root["cpu_attention"]) p.cpu_attention = r.boolean(root["cpu_attention"], "cpu_attention");
  if (const YAML::Node n = root["cpu_experts"]) {
    const std::string v = n.IsScalar() ? n.Scalar() : "";
    if (v != "none" && v != "decode" && v != "prefill" && v != "both")
      r.fail(n, "field 'cpu_experts' must be none, decode, prefill or both, got '" + (n.IsScalar() ? v : "a " + std::string(n.IsMap() ? "map" : "list")) + "'");
    p.cpu_experts_decode = v == "decode" || v == "both";
    p.cpu_experts_prefill = v == "prefill" || v == "both";
  }
  p.compress_weights = r.compression(root["compress_weights"], "compress_weights");
  p.compress_kv_cache = r.compression(root["compress_kv_cache"], "compress_kv_cache");
  if (root["prefill_tokens"]) p.prefill_tokens = r.integer(root["prefill_tokens"], "prefill_tokens", 1, 1 << 24);
  if (root["prefill_batches_per_step"])
    p.prefill_batches_per_step =
        r.integer(root["prefill_batches_per_step"], "prefill_batches_per_step", 0, p.num_gpu_batches);
  return p;
}

PrefillSteps prefill_steps(const Policy& p, int prompt_len) {
  STRATA_CHECK(prompt_len > 0, "prefill: prompt length must be positive");
  const int chunk = p.prefill_step_tokens(), gbs = p.gpu_batch_size;
  PrefillSteps s;
  s.seqs = std::clamp(chunk / prompt_len, 1, gbs);
  s.step_tokens = std::max<int64_t>(gbs, std::min<int64_t>(chunk, int64_t(s.seqs) * prompt_len));
  return s;
}

Policy load_policy(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) STRATA_FAIL("cannot open policy file " << file.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_policy(ss.str(), file.string());
}

const char* cpu_experts_name(const Policy& p) {
  if (p.cpu_experts_prefill) return p.cpu_experts_decode ? "both" : "prefill";
  return p.cpu_experts_decode ? "decode" : "none";
}

std::string policy_to_yaml(const Policy& p) {
  std::ostringstream os;
  auto split = [&](const char* name, const TierSplit& s) {
    os << name << "{gpu: " << s.gpu << ", cpu: " << s.cpu << ", disk: " << s.disk << "}\n";
  };
  auto comp = [&](const char* name, const std::optional<Compression>& c) {
    if (c) os << name << "{bits: " << c->bits << ", group_size: " << c->group_size << "}\n";
  };
  os << "gpu_batch_size: " << p.gpu_batch_size << "\nnum_gpu_batches: " << p.num_gpu_batches << "\n";
  split("weights:     ", p.weights);
  if (p.expert_weights) split("expert_weights: ", *p.expert_weights);
  split("kv_cache:    ", p.kv_cache);
  split("activations: ", p.activations);
  os << "overlap: " << (p.overlap ? "true" : "false") << "\ncpu_attention: " << (p.cpu_attention ? "true" : "false")
     << "\n";
  if (p.cpu_experts_prefill || p.cpu_experts_decode) os << "cpu_experts: " << cpu_experts_name(p) << "\n";
  comp("compress_weights: ", p.compress_weights);
  comp("compress_kv_cache: ", p.compress_kv_cache);
  if (p.prefill_tokens > 0) os << "prefill_tokens: " << p.prefill_tokens << "\n";
  if (p.prefill_batches_per_step > 0) os << "prefill_batches_per_step: " << p.prefill_batches_per_step << "\n";
  return os.str();
}

}  // namespace strata
