#include <fstream>
#include <nlohmann/json.hpp>

#include "strata/core/error.h"
#include "strata/model/pooling.h"

namespace strata {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

json read_json(const fs::path& p) {
  std::ifstream in(p);
  if (!in) STRATA_FAIL(p.string() << ": cannot read the file");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    STRATA_FAIL(p.string() << ": invalid JSON: " << e.what());
  }
}

// sentence-transformers 6 writes "pooling_mode": "lasttoken"; earlier versions (and most published
// models) one boolean per mode: pooling_mode_lasttoken, pooling_mode_mean_tokens, ...
PoolingKind pooling_of(const json& cfg, const fs::path& file) {
  if (cfg.contains("pooling_mode")) {
    const json& m = cfg["pooling_mode"];
    if (!m.is_string()) STRATA_FAIL(file.string() << ": pooling_mode must be a string, got " << m.dump());
    const std::string mode = m.get<std::string>();
    if (mode == "lasttoken") return PoolingKind::Last;
    if (mode == "mean") return PoolingKind::Mean;
    if (mode == "cls") return PoolingKind::Cls;
    STRATA_FAIL(file.string() << ": pooling_mode '" << mode << "' is not supported (lasttoken, mean, cls)");
  }
  static const std::pair<const char*, std::optional<PoolingKind>> kModes[] = {
      {"pooling_mode_lasttoken", PoolingKind::Last},  {"pooling_mode_mean_tokens", PoolingKind::Mean},
      {"pooling_mode_cls_token", PoolingKind::Cls},   {"pooling_mode_max_tokens", std::nullopt},
      {"pooling_mode_mean_sqrt_len_tokens", std::nullopt}, {"pooling_mode_weightedmean_tokens", std::nullopt}};
  std::optional<PoolingKind> kind;
  std::string chosen;
  for (const auto& [key, mode] : kModes) {
    if (!cfg.contains(key)) continue;
    if (!cfg[key].is_boolean()) STRATA_FAIL(file.string() << ": " << key << " must be true or false");
    if (!cfg[key].get<bool>()) continue;
    if (!mode) STRATA_FAIL(file.string() << ": " << key << " is not supported (lasttoken, mean_tokens, cls_token)");
    if (kind)
      STRATA_FAIL(file.string() << ": " << chosen << " and " << key
                                << " are both true: the modes' vectors would be concatenated, which Strata does not do");
    kind = mode;
    chosen = key;
  }
  if (!kind) STRATA_FAIL(file.string() << ": no pooling mode is true (pooling_mode_lasttoken, _mean_tokens, _cls_token)");
  return *kind;
}

}  // namespace

const char* pooling_name(PoolingKind kind) {
  switch (kind) {
    case PoolingKind::Last: return "last";
    case PoolingKind::Mean: return "mean";
    case PoolingKind::Cls: return "cls";
  }
  return "?";
}

PoolingKind parse_pooling_kind(const std::string& name, const std::string& what) {
  if (name == "last" || name == "lasttoken") return PoolingKind::Last;
  if (name == "mean") return PoolingKind::Mean;
  if (name == "cls") return PoolingKind::Cls;
  STRATA_FAIL(what << " must be last, mean or cls, got '" << name << "'");
}

std::optional<PoolingConfig> read_pooling_config(const fs::path& dir) {
  const fs::path modules_file = dir / "modules.json";
  if (!fs::exists(modules_file)) return std::nullopt;
  const json modules = read_json(modules_file);
  if (!modules.is_array()) STRATA_FAIL(modules_file.string() << ": expected a JSON array of modules");
  PoolingConfig p;
  p.normalize = false;
  p.source = modules_file.string();
  bool pooled = false;
  for (size_t i = 0; i < modules.size(); ++i) {
    const json& m = modules[i];
    const std::string where = modules_file.string() + ": module " + std::to_string(i);
    if (!m.is_object() || !m.contains("type") || !m["type"].is_string())
      STRATA_FAIL(where << ": expected an object with a string 'type'");
    const std::string type = m["type"].get<std::string>();
    const std::string name = type.substr(type.rfind('.') == std::string::npos ? 0 : type.rfind('.') + 1);
    const std::string path = m.value("path", json("")).is_string() ? m.value("path", std::string()) : std::string();
    if (i == 0) {
      if (name != "Transformer") STRATA_FAIL(where << ": the first module is " << type << ", not a Transformer");
      if (!path.empty())
        STRATA_FAIL(where << ": the Transformer's files are in " << path
                          << "/; give that directory as the model (the pooling is then not read: --pooling)");
      continue;
    }
    if (name == "Pooling" && !pooled) {
      const fs::path file = dir / path / "config.json";
      const json cfg = read_json(file);
      if (!cfg.is_object()) STRATA_FAIL(file.string() << ": expected a JSON object");
      if (cfg.contains("include_prompt") && cfg["include_prompt"] == false)
        STRATA_FAIL(file.string() << ": include_prompt false (pooling that leaves out an instruction's tokens) is "
                                     "not supported");
      p.kind = pooling_of(cfg, file);
      pooled = true;
    } else if (name == "Normalize" && pooled) {
      p.normalize = true;
    } else {
      STRATA_FAIL(where << ": " << type << " is not supported after "
                        << (pooled ? "the Pooling" : "the Transformer")
                        << " (Strata computes a Transformer, one Pooling and an optional Normalize)");
    }
  }
  if (!pooled) STRATA_FAIL(modules_file.string() << ": no Pooling module");
  return p;
}

}  // namespace strata
