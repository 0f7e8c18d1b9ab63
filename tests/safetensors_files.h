// A safetensors file as raw tensors a test can edit and write back (broken checkpoints and
// adapters for the refusal tests).
#pragma once
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "strata/core/dtype.h"
#include "strata/model/safetensors.h"

namespace strata::test {

struct RawTensor {
  std::string dtype;  // safetensors' name: "F32", "I32", ...
  std::vector<int64_t> shape;
  std::string bytes;
};

inline std::map<std::string, RawTensor> read_raw_tensors(const std::filesystem::path& file) {
  const SafetensorsSet set = SafetensorsSet::open(file);
  std::map<std::string, RawTensor> tensors;
  for (const std::string& name : set.names()) {
    const SafetensorsEntry& e = set.get(name);
    tensors[name] = {dtype_name(e.dtype), e.shape, std::string(reinterpret_cast<const char*>(e.data), e.nbytes)};
  }
  return tensors;
}

inline void write_raw_tensors(const std::filesystem::path& file, const std::map<std::string, RawTensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const auto& [name, t] : tensors) {
    header[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data += t.bytes;
  }
  const std::string h = header.dump();
  const uint64_t n = h.size();
  std::ofstream out(file, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << h << data;
}

}  // namespace strata::test
