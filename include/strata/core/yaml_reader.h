// The shared core of the YAML readers (policies, hardware profiles): errors that name the source
// and the line, and a check for unknown keys. Each reader adds its own typed fields on top.
#pragma once
#include <set>
#include <string>

#include <yaml-cpp/yaml.h>

#include "strata/core/error.h"

namespace strata {

struct YamlReader {
  std::string source;

  [[noreturn]] void fail(const YAML::Node& at, const std::string& why) const {
    const YAML::Mark m = at.Mark();
    if (m.line >= 0) throw Error(source + ":" + std::to_string(m.line + 1) + ": " + why);
    throw Error(source + ": " + why);
  }

  // `where` prefixes the key in the message (e.g. "weights.").
  void only_keys(const YAML::Node& map, const std::set<std::string>& known, const std::string& where) const {
    for (const auto& kv : map) {
      // YAML allows a map, a list or null as a key ("? [a]: 1", "{a: 1}: 2", "~: 3"): no field name.
      if (!kv.first.IsScalar())
        fail(kv.first, "a key" + (where.empty() ? std::string() : " in '" + where.substr(0, where.size() - 1) + "'") +
                           " is a map, a list or null; keys are field names");
      const std::string key = kv.first.Scalar();
      if (!known.count(key)) {
        std::string list;
        for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
        fail(kv.first, "unknown key '" + where + key + "' (expected one of: " + list + ")");
      }
    }
  }
};

}  // namespace strata
