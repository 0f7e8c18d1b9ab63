// Safetensors files, memory-mapped: single file or sharded (model.safetensors.index.json).
// The header is validated before any tensor is read: its size within the file, JSON shape,
// dtypes (F32, F16, BF16, and I32 for GPTQ's and AWQ's packed tensors), shapes, and that every
// tensor's byte range lies inside the data area and matches dtype x shape.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "strata/core/dtype.h"

namespace strata {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // inside the mapping
  size_t nbytes = 0;
  std::filesystem::path file;     // for error messages
};

// Validates the header of one file's bytes (8-byte length, JSON, every entry) and returns its
// entries, pointing into `bytes`; throws strata::Error naming `file`. open() uses it on the mapping.
std::vector<SafetensorsEntry> parse_safetensors_header(const uint8_t* bytes, size_t size,
                                                       const std::filesystem::path& file);

// Reads the text of a model.safetensors.index.json: its weight_map as shard file -> the tensors the
// index puts in it, each shard a relative path inside the model directory; throws strata::Error
// naming `file`. open() uses it on the file it reads, then maps the shards.
std::map<std::string, std::vector<std::string>> parse_safetensors_index(const std::string& text,
                                                                       const std::filesystem::path& file);

class SafetensorsSet {
public:
  // `path` is a .safetensors file, a model.safetensors.index.json, or a directory holding either.
  static SafetensorsSet open(const std::filesystem::path& path);

  SafetensorsSet(SafetensorsSet&&) noexcept;
  SafetensorsSet& operator=(SafetensorsSet&&) noexcept;
  ~SafetensorsSet();

  bool contains(const std::string& name) const;
  const SafetensorsEntry& get(const std::string& name) const;  // throws naming the tensor
  std::vector<std::string> names() const;                        // sorted

private:
  struct Mapping;
  SafetensorsSet() = default;
  std::vector<std::unique_ptr<Mapping>> mappings_;
  std::map<std::string, SafetensorsEntry> entries_;
};

}  // namespace strata
