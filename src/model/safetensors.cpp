// Safetensors reader: mmap(2)s each file read-only and validates its header before any tensor is
// handed out, so a corrupt or hostile file fails here with a message naming the file and tensor
// rather than as a crash inside a kernel.
#include "strata/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "strata/core/error.h"

namespace strata {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The header is JSON read into memory at once; real checkpoints stay far below this.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

std::string shape_str(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

bool parse_dtype(const std::string& s, DType* out) {
  if (s == "F32") *out = DType::F32;
  else if (s == "F16") *out = DType::F16;
  else if (s == "BF16") *out = DType::BF16;
  else if (s == "I32") *out = DType::I32;  // a GPTQ checkpoint's packed codes and group indices
  else if (s == "U8") *out = DType::U8;    // GPT-OSS's MXFP4 blocks and scales
  else return false;
  return true;
}

}  // namespace

struct SafetensorsSet::Mapping {
  fs::path path;
  const uint8_t* base = nullptr;
  size_t size = 0;

  explicit Mapping(fs::path p) : path(std::move(p)) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) STRATA_FAIL(path.string() << ": cannot open: " << std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      int err = errno;
      ::close(fd);
      STRATA_FAIL(path.string() << ": cannot stat: " << std::strerror(err));
    }
    size = size_t(st.st_size);
    if (size > 0) {  // mmap of length 0 fails; an empty file is reported by the header check
      void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        int err = errno;
        ::close(fd);
        STRATA_FAIL(path.string() << ": cannot mmap " << size << " bytes: " << std::strerror(err));
      }
      base = static_cast<const uint8_t*>(p);
    }
    ::close(fd);  // the mapping keeps the file alive
  }
  ~Mapping() {
    if (base) ::munmap(const_cast<uint8_t*>(base), size);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
};

namespace {

// Parses and validates one file's header; returns its entries pointing into the mapping.
std::vector<SafetensorsEntry> parse_header(const fs::path& path, const uint8_t* base, size_t size) {
  const std::string file = path.string();
  if (size < 8) STRATA_FAIL(file << ": file is " << size << " bytes, too short for the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | base[i];  // little-endian regardless of host
  if (n > size - 8)
    STRATA_FAIL(file << ": header length " << n << " exceeds file size " << size << " - 8 bytes (truncated or not safetensors)");
  if (n > kMaxHeaderBytes) STRATA_FAIL(file << ": header length " << n << " exceeds the limit of " << kMaxHeaderBytes << " bytes");
  const uint8_t* data = base + 8 + n;
  const uint64_t data_size = size - 8 - n;

  json header;
  try {
    header = json::parse(base + 8, base + 8 + n);
  } catch (const json::exception& e) {
    STRATA_FAIL(file << ": header is not valid JSON: " << e.what());
  }
  if (!header.is_object()) STRATA_FAIL(file << ": header is not a JSON object");

  std::vector<SafetensorsEntry> out;
  for (const auto& [name, t] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string where = file + ": tensor '" + name + "'";
    if (!t.is_object()) STRATA_FAIL(where << " is not a JSON object");
    if (!t.contains("dtype") || !t["dtype"].is_string()) STRATA_FAIL(where << " has no string 'dtype'");
    if (!t.contains("shape") || !t["shape"].is_array()) STRATA_FAIL(where << " has no 'shape' array");
    if (!t.contains("data_offsets") || !t["data_offsets"].is_array() || t["data_offsets"].size() != 2)
      STRATA_FAIL(where << " has no 'data_offsets' pair");

    SafetensorsEntry e;
    e.name = name;
    e.file = path;
    const std::string dt = t["dtype"].get<std::string>();
    if (!parse_dtype(dt, &e.dtype)) STRATA_FAIL(where << " has unsupported dtype " << dt << " (supported: F32, F16, BF16, I32, U8)");

    uint64_t numel = 1;
    for (const json& d : t["shape"]) {
      if (!d.is_number_integer()) STRATA_FAIL(where << " shape has a non-integer dimension " << d.dump());
      if (!d.is_number_unsigned()) STRATA_FAIL(where << " shape has a negative dimension " << d.dump());
      uint64_t v = d.get<uint64_t>();
      if (v > uint64_t(INT64_MAX) || __builtin_mul_overflow(numel, v, &numel))
        STRATA_FAIL(where << " shape " << t["shape"].dump() << " overflows");
      e.shape.push_back(int64_t(v));
    }
    uint64_t nbytes = 0;
    if (__builtin_mul_overflow(numel, uint64_t(dtype_size(e.dtype)), &nbytes))
      STRATA_FAIL(where << " shape " << shape_str(e.shape) << " overflows");

    const json& offs = t["data_offsets"];
    if (!offs[0].is_number_unsigned() || !offs[1].is_number_unsigned())
      STRATA_FAIL(where << " data_offsets " << offs.dump() << " are not non-negative integers");
    const uint64_t begin = offs[0].get<uint64_t>(), end = offs[1].get<uint64_t>();
    if (begin > end || end > data_size)
      STRATA_FAIL(where << " data_offsets [" << begin << ", " << end << "] exceed the data area of " << data_size << " bytes");
    if (end - begin != nbytes)
      STRATA_FAIL(where << " data_offsets [" << begin << ", " << end << "] hold " << end - begin << " bytes but "
                        << dt << " x " << shape_str(e.shape) << " needs " << nbytes);
    e.data = data + begin;
    e.nbytes = size_t(nbytes);
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace

std::vector<SafetensorsEntry> parse_safetensors_header(const uint8_t* bytes, size_t size, const fs::path& file) {
  return parse_header(file, bytes, size);
}

std::map<std::string, std::vector<std::string>> parse_safetensors_index(const std::string& text, const fs::path& path) {
  json index;
  try {
    index = json::parse(text);
  } catch (const json::exception& e) {
    STRATA_FAIL(path.string() << ": not valid JSON: " << e.what());
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    STRATA_FAIL(path.string() << ": no 'weight_map' object");
  std::map<std::string, std::vector<std::string>> shard_tensors;  // shard -> tensors it should hold
  for (const auto& [name, file] : index["weight_map"].items()) {
    if (!file.is_string()) STRATA_FAIL(path.string() << ": weight_map entry for '" << name << "' is not a file name");
    const std::string f = file.get<std::string>();
    const fs::path rel(f);
    bool escapes = rel.is_absolute() || f.empty();
    for (const auto& part : rel) escapes |= part == "..";
    if (escapes) STRATA_FAIL(path.string() << ": weight_map names shard '" << f << "' outside the model directory");
    // open(2) would stop at a NUL and map another file than the one named; a directory is no shard.
    if (f.find('\0') != std::string::npos || !rel.has_filename() || rel.filename() == ".")
      STRATA_FAIL(path.string() << ": weight_map names shard " << file.dump() << " for '" << name
                                << "', which is not a file name");
    shard_tensors[f].push_back(name);
  }
  if (shard_tensors.empty()) STRATA_FAIL(path.string() << ": weight_map is empty");
  return shard_tensors;
}

SafetensorsSet::SafetensorsSet(SafetensorsSet&&) noexcept = default;
SafetensorsSet& SafetensorsSet::operator=(SafetensorsSet&&) noexcept = default;
SafetensorsSet::~SafetensorsSet() = default;

SafetensorsSet SafetensorsSet::open(const fs::path& path_in) {
  fs::path path = path_in;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    if (fs::exists(path / "model.safetensors", ec)) path /= "model.safetensors";
    else if (fs::exists(path / "model.safetensors.index.json", ec)) path /= "model.safetensors.index.json";
    else STRATA_FAIL(path.string() << ": directory holds neither model.safetensors nor model.safetensors.index.json");
  }

  SafetensorsSet set;
  auto add_file = [&](const fs::path& file) -> std::vector<SafetensorsEntry> {
    set.mappings_.push_back(std::make_unique<Mapping>(file));
    const Mapping& m = *set.mappings_.back();
    return parse_header(m.path, m.base, m.size);
  };

  if (path.extension() != ".json") {
    for (SafetensorsEntry& e : add_file(path)) {
      std::string name = e.name;
      set.entries_.emplace(std::move(name), std::move(e));
    }
    return set;
  }

  // Sharded: the index's weight_map (tensor -> shard file) is authoritative; each shard is
  // mapped once, and every tensor must be in the shard the index names.
  std::ifstream in(path, std::ios::binary);
  if (!in) STRATA_FAIL(path.string() << ": cannot open: " << std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  const std::map<std::string, std::vector<std::string>> shard_tensors = parse_safetensors_index(text.str(), path);

  const fs::path dir = path.parent_path();
  for (const auto& [shard, wanted] : shard_tensors) {
    const fs::path file = dir / shard;
    if (!fs::exists(file, ec))
      STRATA_FAIL(path.string() << ": shard file '" << shard << "' is missing (expected at " << file.string() << ")");
    std::map<std::string, SafetensorsEntry> held;
    for (SafetensorsEntry& e : add_file(file)) {
      std::string name = e.name;
      held.emplace(std::move(name), std::move(e));
    }
    for (const std::string& name : wanted) {
      auto it = held.find(name);
      if (it == held.end())
        STRATA_FAIL(path.string() << ": weight_map puts tensor '" << name << "' in '" << shard << "', which does not hold it");
      set.entries_.emplace(name, std::move(it->second));
      held.erase(it);
    }
    // A shard tensor the index does not list would otherwise be silently invisible.
    if (!held.empty())
      STRATA_FAIL(file.string() << ": tensor '" << held.begin()->first << "' is not listed in " << path.filename().string());
  }
  return set;
}

bool SafetensorsSet::contains(const std::string& name) const { return entries_.count(name) != 0; }

const SafetensorsEntry& SafetensorsSet::get(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    std::string where = mappings_.empty() ? std::string("empty set") : mappings_.front()->path.string();
    if (mappings_.size() > 1) where = std::to_string(mappings_.size()) + " shards in " + mappings_.front()->path.parent_path().string();
    STRATA_FAIL("missing tensor '" << name << "' (not in " << where << ")");
  }
  return it->second;
}

std::vector<std::string> SafetensorsSet::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;  // std::map keeps them sorted
}

}  // namespace strata
