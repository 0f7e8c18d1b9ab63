// GGUF reader: maps the file, parses header, metadata and tensor infos with a bounds check on every
// count, length and offset, and answers typed metadata lookups. Layout (little-endian):
//   "GGUF" u32 version, u64 n_tensors, u64 n_kv, n_kv x {string key, u32 type, value},
//   n_tensors x {string name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset}, padding to
//   general.alignment, tensor data. Strings are u64 length + bytes (no terminator).
#include "strata/model/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <unordered_map>
#include <utility>

#include "strata/core/error.h"

static_assert(std::endian::native == std::endian::little, "GGUF reader assumes a little-endian host");

namespace strata {

namespace {

constexpr uint64_t kDefaultAlignment = 32;
constexpr int kMaxDims = 4;           // GGML_MAX_DIMS
constexpr int kMaxArrayDepth = 8;     // nested arrays; bounds recursion on hostile input

// Smallest encoded size of one element of a type, used to bound counts before allocating.
uint64_t min_encoded_size(GgufType t) {
  switch (t) {
    case GgufType::U8: case GgufType::I8: case GgufType::Bool: return 1;
    case GgufType::U16: case GgufType::I16: return 2;
    case GgufType::U32: case GgufType::I32: case GgufType::F32: return 4;
    case GgufType::U64: case GgufType::I64: case GgufType::F64: return 8;
    case GgufType::String: return 8;      // the length
    case GgufType::Array: return 12;      // element type + count
  }
  return 1;
}

bool valid_type(uint32_t t) { return t <= uint32_t(GgufType::F64); }

// A cursor over the mapped bytes; every read checks the remaining length first.
struct Reader {
  const uint8_t* base;
  uint64_t size;
  uint64_t pos = 0;
  const std::string& file;

  [[noreturn]] void fail_short(uint64_t n, const std::string& what) const {
    STRATA_FAIL("GGUF file " << file << ": truncated: " << what << " needs " << n << " bytes at offset "
                             << pos << " but the file has " << size << " bytes");
  }
  void need(uint64_t n, const std::string& what) const {
    if (n > size - pos) fail_short(n, what);
  }
  template <class T>
  T read(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, base + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
  std::string_view read_string(const std::string& what) {
    uint64_t len = read<uint64_t>(what + " (string length)");
    if (len > size - pos)
      STRATA_FAIL("GGUF file " << file << ": " << what << ": string length " << len << " at offset " << pos
                               << " runs past the end of the file (" << size << " bytes)");
    std::string_view s(reinterpret_cast<const char*>(base + pos), len);
    pos += len;
    return s;
  }
};

void read_value(Reader& r, GgufValue& v, GgufType type, const std::string& what, int depth) {
  v.type = type;
  switch (type) {
    case GgufType::U8: v.u = r.read<uint8_t>(what); break;
    case GgufType::I8: v.i = r.read<int8_t>(what); break;
    case GgufType::U16: v.u = r.read<uint16_t>(what); break;
    case GgufType::I16: v.i = r.read<int16_t>(what); break;
    case GgufType::U32: v.u = r.read<uint32_t>(what); break;
    case GgufType::I32: v.i = r.read<int32_t>(what); break;
    case GgufType::U64: v.u = r.read<uint64_t>(what); break;
    case GgufType::I64: v.i = r.read<int64_t>(what); break;
    case GgufType::F32: v.f = r.read<float>(what); break;
    case GgufType::F64: v.f = r.read<double>(what); break;
    case GgufType::Bool: {
      uint8_t b = r.read<uint8_t>(what);
      if (b > 1) STRATA_FAIL("GGUF file " << r.file << ": " << what << ": bool value " << int(b) << " is not 0 or 1");
      v.u = b;
      break;
    }
    case GgufType::String: v.str = r.read_string(what); break;
    case GgufType::Array: {
      if (depth >= kMaxArrayDepth)
        STRATA_FAIL("GGUF file " << r.file << ": " << what << ": arrays nested deeper than " << kMaxArrayDepth);
      uint32_t et = r.read<uint32_t>(what + " (array element type)");
      if (!valid_type(et))
        STRATA_FAIL("GGUF file " << r.file << ": " << what << ": unknown array element type " << et);
      v.elem_type = GgufType(et);
      v.count = r.read<uint64_t>(what + " (array length)");
      // Check the count against the bytes left before reserving anything: a hostile count of
      // 2^60 must fail here, not in the allocator.
      uint64_t min_sz = min_encoded_size(v.elem_type);
      if (v.count > (r.size - r.pos) / min_sz)
        STRATA_FAIL("GGUF file " << r.file << ": " << what << ": array of " << v.count << " "
                                 << gguf_type_name(v.elem_type) << " elements does not fit in the "
                                 << (r.size - r.pos) << " bytes left");
      if (v.elem_type == GgufType::String) {
        v.strs.reserve(v.count);
        for (uint64_t k = 0; k < v.count; ++k) v.strs.push_back(r.read_string(what));
      } else if (v.elem_type == GgufType::Array) {
        v.items.resize(v.count);
        for (uint64_t k = 0; k < v.count; ++k)
          read_value(r, v.items[k], GgufType::Array, what + "[" + std::to_string(k) + "]", depth + 1);
      } else {
        uint64_t n = v.count * min_sz;
        r.need(n, what);
        v.raw = r.base + r.pos;
        if (v.elem_type == GgufType::Bool)
          for (uint64_t k = 0; k < v.count; ++k)
            if (v.raw[k] > 1)
              STRATA_FAIL("GGUF file " << r.file << ": " << what << "[" << k << "]: bool value " << int(v.raw[k])
                                       << " is not 0 or 1");
        r.pos += n;
      }
      break;
    }
  }
}

struct Mapping {
  void* addr = nullptr;
  size_t len = 0;
  ~Mapping() {
    if (addr) munmap(addr, len);
  }
};

}  // namespace

const char* gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::U8: return "u8";
    case GgufType::I8: return "i8";
    case GgufType::U16: return "u16";
    case GgufType::I16: return "i16";
    case GgufType::U32: return "u32";
    case GgufType::I32: return "i32";
    case GgufType::F32: return "f32";
    case GgufType::Bool: return "bool";
    case GgufType::String: return "string";
    case GgufType::Array: return "array";
    case GgufType::U64: return "u64";
    case GgufType::I64: return "i64";
    case GgufType::F64: return "f64";
  }
  return "?";
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufType::U8: case GgufType::I8: case GgufType::U16: case GgufType::I16:
    case GgufType::U32: case GgufType::I32: case GgufType::U64: case GgufType::I64: return true;
    default: return false;
  }
}

int64_t GgufValue::int_at(uint64_t k) const {
  STRATA_CHECK(type == GgufType::Array && raw && k < count, "GGUF array index " << k << " out of range");
  const uint8_t* p = raw + k * min_encoded_size(elem_type);
  auto ld = [p](auto v) { std::memcpy(&v, p, sizeof(v)); return v; };
  switch (elem_type) {
    case GgufType::U8: return ld(uint8_t{});
    case GgufType::I8: return ld(int8_t{});
    case GgufType::U16: return ld(uint16_t{});
    case GgufType::I16: return ld(int16_t{});
    case GgufType::U32: return ld(uint32_t{});
    case GgufType::I32: return ld(int32_t{});
    case GgufType::I64: return ld(int64_t{});
    case GgufType::Bool: return ld(uint8_t{});
    case GgufType::U64: {
      uint64_t v = ld(uint64_t{});
      if (v > uint64_t(INT64_MAX)) STRATA_FAIL("GGUF u64 array element " << v << " does not fit in int64");
      return int64_t(v);
    }
    default: STRATA_FAIL("GGUF array of " << gguf_type_name(elem_type) << " read as integers");
  }
}

double GgufValue::float_at(uint64_t k) const {
  STRATA_CHECK(type == GgufType::Array && raw && k < count, "GGUF array index " << k << " out of range");
  const uint8_t* p = raw + k * min_encoded_size(elem_type);
  if (elem_type == GgufType::F32) { float v; std::memcpy(&v, p, 4); return v; }
  if (elem_type == GgufType::F64) { double v; std::memcpy(&v, p, 8); return v; }
  if (elem_type == GgufType::U64) { uint64_t v; std::memcpy(&v, p, 8); return double(v); }
  return double(int_at(k));
}

struct GgufFile::Impl {
  std::string path;
  std::unique_ptr<Mapping> map;       // when opened from a file
  std::vector<uint8_t> bytes;         // when parsed from memory
  const uint8_t* base = nullptr;
  uint64_t size = 0;
  uint32_t version = 0;
  uint64_t alignment = kDefaultAlignment;
  uint64_t data_offset = 0;
  std::vector<std::pair<std::string, GgufValue>> kv;
  std::unordered_map<std::string, size_t> kv_index;
  std::vector<GgufTensorInfo> tensors;
  std::unordered_map<std::string, size_t> tensor_index;

  void parse();
  const GgufValue& need(std::string_view key) const;
  [[noreturn]] void wrong_type(std::string_view key, const GgufValue& v, const char* wanted) const {
    STRATA_FAIL("GGUF file " << path << ": key '" << key << "' is " << gguf_type_name(v.type)
                             << (v.type == GgufType::Array ? std::string(" of ") + gguf_type_name(v.elem_type) : "")
                             << ", expected " << wanted);
  }
};

void GgufFile::Impl::parse() {
  Reader r{base, size, 0, path};
  uint32_t magic = r.read<uint32_t>("magic");
  if (std::memcmp(&magic, "GGUF", 4) != 0)
    STRATA_FAIL("GGUF file " << path << ": bad magic (not a GGUF file)");
  version = r.read<uint32_t>("version");
  if (version == 1)
    STRATA_FAIL("GGUF file " << path << ": GGUF version 1 is not supported (only versions 2 and 3); re-convert the model");
  if (version != 2 && version != 3) {
    if ((version & 0xFFFF) == 0 && version != 0)
      STRATA_FAIL("GGUF file " << path << ": version field " << version
                               << " looks byte-swapped: big-endian GGUF files are not supported");
    STRATA_FAIL("GGUF file " << path << ": unsupported GGUF version " << version << " (only 2 and 3)");
  }
  uint64_t n_tensors = r.read<uint64_t>("tensor count");
  uint64_t n_kv = r.read<uint64_t>("metadata count");
  // Each key-value needs at least 12 bytes (key length + type), each tensor info at least 24.
  if (n_kv > (size - r.pos) / 12)
    STRATA_FAIL("GGUF file " << path << ": metadata count " << n_kv << " does not fit in the file (" << size << " bytes)");
  if (n_tensors > (size - r.pos) / 24)
    STRATA_FAIL("GGUF file " << path << ": tensor count " << n_tensors << " does not fit in the file (" << size << " bytes)");

  kv.reserve(n_kv);
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key(r.read_string("metadata key #" + std::to_string(k)));
    std::string what = "key '" + key + "'";
    uint32_t t = r.read<uint32_t>(what + " (value type)");
    if (!valid_type(t)) STRATA_FAIL("GGUF file " << path << ": " << what << ": unknown value type " << t);
    GgufValue v;
    read_value(r, v, GgufType(t), what, 0);
    if (!kv_index.emplace(key, kv.size()).second)
      STRATA_FAIL("GGUF file " << path << ": duplicate metadata key '" << key << "'");
    kv.emplace_back(std::move(key), std::move(v));
  }

  if (const GgufValue* a = kv_index.count("general.alignment") ? &kv[kv_index.at("general.alignment")].second : nullptr) {
    if (!(a->type == GgufType::U32 || a->type == GgufType::U64 || a->type == GgufType::U16 || a->type == GgufType::U8))
      wrong_type("general.alignment", *a, "an unsigned integer");
    if (a->u == 0 || (a->u & (a->u - 1)) != 0 || a->u > (uint64_t(1) << 30))
      STRATA_FAIL("GGUF file " << path << ": general.alignment " << a->u << " is not a power of two (up to 2^30)");
    alignment = a->u;
  }

  tensors.reserve(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensorInfo ti;
    ti.name = std::string(r.read_string("tensor info #" + std::to_string(k) + " name"));
    std::string what = "tensor '" + ti.name + "'";
    uint32_t n_dims = r.read<uint32_t>(what + " (n_dims)");
    if (n_dims > uint32_t(kMaxDims))
      STRATA_FAIL("GGUF file " << path << ": " << what << ": n_dims " << n_dims << " exceeds " << kMaxDims);
    int64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t ne = r.read<uint64_t>(what + " (dims)");
      if (ne > uint64_t(INT64_MAX) || (ne != 0 && uint64_t(numel) > uint64_t(INT64_MAX) / ne))
        STRATA_FAIL("GGUF file " << path << ": " << what << ": dimension " << d << " = " << ne << " overflows the element count");
      numel *= int64_t(ne);
      ti.ne.push_back(int64_t(ne));
    }
    uint32_t type = r.read<uint32_t>(what + " (type)");
    const GgmlTypeInfo* info = ggml_type_info(type);
    if (!info) STRATA_FAIL("GGUF file " << path << ": " << what << ": unknown ggml type id " << type);
    ti.type = GgmlType(type);
    ti.offset = r.read<uint64_t>(what + " (offset)");
    ti.numel = numel;
    int64_t row = ti.ne.empty() ? 1 : ti.ne[0];
    if (row % info->block_size != 0)
      STRATA_FAIL("GGUF file " << path << ": " << what << ": row length " << row << " is not a multiple of the "
                               << info->name << " block size " << info->block_size);
    if (uint64_t(numel / info->block_size) > uint64_t(INT64_MAX) / uint64_t(info->type_size))
      STRATA_FAIL("GGUF file " << path << ": " << what << ": byte size overflows");
    ti.nbytes = uint64_t(numel / info->block_size) * uint64_t(info->type_size);
    if (ti.offset % alignment != 0)
      STRATA_FAIL("GGUF file " << path << ": " << what << ": data offset " << ti.offset
                               << " is not a multiple of the alignment " << alignment);
    if (!tensor_index.emplace(ti.name, tensors.size()).second)
      STRATA_FAIL("GGUF file " << path << ": duplicate tensor name '" << ti.name << "'");
    tensors.push_back(std::move(ti));
  }

  data_offset = (r.pos + alignment - 1) / alignment * alignment;  // r.pos <= size < 2^63
  for (GgufTensorInfo& ti : tensors) {
    // Ranges may overlap (the spec does not forbid it) but must lie inside the file.
    if (data_offset > size || ti.offset > size - data_offset || ti.nbytes > size - data_offset - ti.offset)
      STRATA_FAIL("GGUF file " << path << ": tensor '" << ti.name << "': data [" << ti.offset << ", +" << ti.nbytes
                               << ") at data section offset " << data_offset << " runs past the end of the file ("
                               << size << " bytes)");
    ti.data = base + data_offset + ti.offset;
  }
}

const GgufValue& GgufFile::Impl::need(std::string_view key) const {
  auto it = kv_index.find(std::string(key));
  if (it == kv_index.end()) STRATA_FAIL("GGUF file " << path << ": missing metadata key '" << key << "'");
  return kv[it->second].second;
}

GgufFile::GgufFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;
GgufFile::~GgufFile() = default;

GgufFile GgufFile::open(const std::filesystem::path& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path.string();
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) STRATA_FAIL("GGUF file " << path.string() << ": cannot open: " << std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    STRATA_FAIL("GGUF file " << path.string() << ": fstat failed: " << std::strerror(e));
  }
  impl->map = std::make_unique<Mapping>();
  impl->size = uint64_t(st.st_size);
  if (st.st_size > 0) {
    void* p = mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    ::close(fd);
    if (p == MAP_FAILED) STRATA_FAIL("GGUF file " << path.string() << ": mmap failed: " << std::strerror(e));
    impl->map->addr = p;
    impl->map->len = size_t(st.st_size);
    impl->base = static_cast<const uint8_t*>(p);
  } else {
    ::close(fd);
  }
  impl->parse();
  return GgufFile(std::move(impl));
}

GgufFile GgufFile::from_bytes(std::vector<uint8_t> bytes, std::string name) {
  auto impl = std::make_unique<Impl>();
  impl->path = std::move(name);
  impl->bytes = std::move(bytes);
  impl->base = impl->bytes.data();
  impl->size = impl->bytes.size();
  impl->parse();
  return GgufFile(std::move(impl));
}

const std::string& GgufFile::path() const { return impl_->path; }
uint32_t GgufFile::version() const { return impl_->version; }
uint64_t GgufFile::alignment() const { return impl_->alignment; }
uint64_t GgufFile::data_offset() const { return impl_->data_offset; }
uint64_t GgufFile::file_size() const { return impl_->size; }
const std::vector<std::pair<std::string, GgufValue>>& GgufFile::metadata() const { return impl_->kv; }
const std::vector<GgufTensorInfo>& GgufFile::tensors() const { return impl_->tensors; }

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = impl_->kv_index.find(std::string(key));
  return it == impl_->kv_index.end() ? nullptr : &impl_->kv[it->second].second;
}

std::string GgufFile::get_string(std::string_view key) const {
  const GgufValue& v = impl_->need(key);
  if (v.type != GgufType::String) impl_->wrong_type(key, v, "string");
  return std::string(v.str);
}

int64_t GgufFile::get_int(std::string_view key) const {
  const GgufValue& v = impl_->need(key);
  if (!v.is_integer()) impl_->wrong_type(key, v, "an integer");
  if (v.type == GgufType::U8 || v.type == GgufType::U16 || v.type == GgufType::U32 || v.type == GgufType::U64) {
    if (v.u > uint64_t(INT64_MAX)) STRATA_FAIL("GGUF file " << impl_->path << ": key '" << key << "': " << v.u << " is too large");
    return int64_t(v.u);
  }
  return v.i;
}

double GgufFile::get_float(std::string_view key) const {
  const GgufValue& v = impl_->need(key);
  if (v.is_float()) return v.f;
  if (v.is_integer()) return double(get_int(key));
  impl_->wrong_type(key, v, "a number");
}

bool GgufFile::get_bool(std::string_view key) const {
  const GgufValue& v = impl_->need(key);
  if (v.type != GgufType::Bool) impl_->wrong_type(key, v, "bool");
  return v.u != 0;
}

std::optional<std::string> GgufFile::get_string_opt(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return get_string(key);
}
std::optional<int64_t> GgufFile::get_int_opt(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return get_int(key);
}
std::optional<double> GgufFile::get_float_opt(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return get_float(key);
}

std::vector<std::string> GgufFile::get_string_array(std::string_view key) const {
  const GgufValue& v = impl_->need(key);
  if (v.type != GgufType::Array || v.elem_type != GgufType::String) impl_->wrong_type(key, v, "array of string");
  return std::vector<std::string>(v.strs.begin(), v.strs.end());
}

std::vector<int64_t> GgufFile::get_int_array(std::string_view key) const {
  const GgufValue& v = impl_->need(key);
  GgufValue probe;
  probe.type = v.elem_type;
  // Bool elements read as 0/1 (int_at widens them like u8).
  if (v.type != GgufType::Array || !(probe.is_integer() || v.elem_type == GgufType::Bool))
    impl_->wrong_type(key, v, "array of integers");
  std::vector<int64_t> out(v.count);
  for (uint64_t k = 0; k < v.count; ++k) out[k] = v.int_at(k);
  return out;
}

std::vector<double> GgufFile::get_float_array(std::string_view key) const {
  const GgufValue& v = impl_->need(key);
  GgufValue probe;
  probe.type = v.elem_type;
  if (v.type != GgufType::Array || !(probe.is_integer() || probe.is_float())) impl_->wrong_type(key, v, "array of numbers");
  std::vector<double> out(v.count);
  for (uint64_t k = 0; k < v.count; ++k) out[k] = v.float_at(k);
  return out;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = impl_->tensor_index.find(std::string(name));
  return it == impl_->tensor_index.end() ? nullptr : &impl_->tensors[it->second];
}

const GgufTensorInfo& GgufFile::tensor(std::string_view name) const {
  const GgufTensorInfo* t = find_tensor(name);
  if (!t) STRATA_FAIL("GGUF file " << impl_->path << ": no tensor named '" << name << "'");
  return *t;
}

void GgufFile::dequantize(const GgufTensorInfo& t, float* dst) const {
  const GgmlTypeInfo* info = ggml_type_info(uint32_t(t.type));
  if (!info || !info->dequantizable)
    STRATA_FAIL("GGUF file " << impl_->path << ": tensor '" << t.name << "' has type "
                             << (info ? info->name : "?") << ", which Strata cannot dequantize");
  ggml_dequantize(t.type, t.data, dst, t.numel);
}

}  // namespace strata
