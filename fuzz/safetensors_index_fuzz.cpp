// libFuzzer entry for model.safetensors.index.json (parse_safetensors_index, what
// SafetensorsSet::open runs on the index's text before it maps the shards). Checks what open()
// relies on: every shard is a relative file name (no NUL byte, not a directory) that stays inside
// the model directory, and every tensor is listed under one shard. strata::Error is the expected
// way to reject input; anything else (crash, sanitizer report, nlohmann::json::exception
// escaping) is a bug.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <set>
#include <string>

#include "strata/core/error.h"
#include "strata/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto shards = strata::parse_safetensors_index(text, "fuzz-model/model.safetensors.index.json");
    if (shards.empty()) __builtin_trap();
    std::set<std::string> seen;
    for (const auto& [shard, tensors] : shards) {
      const std::filesystem::path rel(shard);
      if (shard.empty() || rel.is_absolute() || shard.find('\0') != std::string::npos || tensors.empty())
        __builtin_trap();
      if (!rel.has_filename() || rel.filename() == ".") __builtin_trap();  // a directory, not a shard file
      for (const auto& part : rel)
        if (part == "..") __builtin_trap();
      for (const std::string& t : tensors)
        if (!seen.insert(t).second) __builtin_trap();  // one tensor named under two shards
    }
  } catch (const strata::Error&) {
  }
  return 0;
}
