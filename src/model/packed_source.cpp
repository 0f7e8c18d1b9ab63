// GPTQ and AWQ checkpoints as Hugging Face weights: packed linears shown as `P.weight`,
// dequantized on read() or handed over as Strata's quantized rows by read_codes()
// (include/strata/model/packed_checkpoint.h).
#include "strata/model/packed_checkpoint.h"

#include <atomic>
#include <cstring>
#include <map>
#include <sstream>

#include "strata/core/error.h"
#include "strata/core/thread_pool.h"
#include "strata/model/safetensors.h"

namespace strata {
namespace fs = std::filesystem;

namespace {

const char* const kPackedParts[] = {".qweight", ".qzeros", ".scales", ".g_idx"};

// AWQ packs eight outputs to a word out of order: nibble k holds output 8c + {0, 2, 4, 6, 1, 3, 5,
// 7}[k], so output 8c + r is in nibble kAwqNibble[r].
constexpr int kAwqNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};

// The linear a packed tensor belongs to ("" for other tensors).
std::string packed_prefix(const std::string& name) {
  for (const char* part : kPackedParts)
    if (name.ends_with(part)) return name.substr(0, name.size() - std::strlen(part));
  return {};
}

uint32_t word_at(const SafetensorsEntry& e, size_t index) {
  uint32_t w;
  std::memcpy(&w, e.data + index * 4, 4);  // the data area need not be aligned
  return w;
}

// One packed linear's tensors and dimensions, checked against each other.
struct PackedLinear {
  const SafetensorsEntry *qweight = nullptr, *qzeros = nullptr, *scales = nullptr, *g_idx = nullptr;
  int64_t in = 0, out = 0, groups = 0;
  int64_t group_size = 0;  // inputs per group: the format's, or the whole row
};

class PackedSource final : public WeightSource {
public:
  PackedSource(const fs::path& path, PackedFormat format)
      : set_(std::make_shared<const SafetensorsSet>(SafetensorsSet::open(path))),
        plain_(make_safetensors_source(set_, path)),
        format_(std::move(format)) {
    for (const std::string& name : set_->names()) {
      const std::string prefix = packed_prefix(name);
      if (prefix.empty()) {
        names_.push_back(name);
        continue;
      }
      if (!set_->contains(prefix + ".qweight"))
        STRATA_FAIL(set_->get(name).file.string() << ": tensor '" << name << "' has no '" << prefix << ".qweight' beside it");
      if (name.ends_with(".qweight")) add_linear(prefix);
    }
  }

  std::string describe() const override { return plain_->describe(); }
  std::optional<quant::QuantSpec> codes_spec() const override { return packed_codes_spec(format_); }
  bool contains(const std::string& name) const override {
    return linears_.count(name) != 0 || (plain_->contains(name) && packed_prefix(name).empty());
  }
  std::vector<std::string> names() const override { return names_; }

  std::vector<int64_t> shape(const std::string& name) const override {
    auto it = linears_.find(name);
    if (it == linears_.end()) return plain_->shape(name);
    return {it->second.out, it->second.in};
  }

private:
  void read_into(const std::string& name, DType dst_dtype, void* dst, ThreadPool* pool) const override {
    auto it = linears_.find(name);
    if (it == linears_.end()) return plain_->read(name, dst_dtype, dst, pool);
    const PackedLinear& m = it->second;
    const Unpacked u = unpack(name, m, pool);
    auto* out = static_cast<uint8_t*>(dst);
    parallel_for(pool, m.out, [&](int64_t o0, int64_t o1) {
      std::vector<float> row(static_cast<size_t>(m.in));
      for (int64_t o = o0; o < o1; ++o) {
        const uint8_t* codes = u.codes.data() + size_t(o * m.in);
        for (int64_t i = 0; i < m.in; ++i) {
          const size_t gp = size_t(u.group[size_t(i)] * m.out + o);
          row[size_t(i)] = u.scale[gp] * float(int(codes[i]) - u.zero[gp]);
        }
        convert_elements(row.data(), DType::F32, out + size_t(o * m.in) * dtype_size(dst_dtype), dst_dtype,
                         row.size());
      }
    });
  }

  bool read_codes_into(const std::string& name, const quant::QuantSpec& spec, void* dst,
                       ThreadPool* pool) const override {
    auto it = linears_.find(name);
    if (it == linears_.end()) return plain_->read_codes(name, spec, dst, pool);
    const PackedLinear& m = it->second;
    if (format_.bits > spec.bits || m.group_size % spec.group_size != 0) return false;
    const Unpacked u = unpack(name, m, pool);
    // Only consecutive groups become Strata's (a desc_act checkpoint permutes its inputs).
    for (int64_t i = 0; i < m.in; ++i)
      if (u.group[size_t(i)] != i / m.group_size) return false;
    const int64_t n_groups = (m.in + spec.group_size - 1) / spec.group_size;
    const size_t out_row = quant::row_bytes(spec, m.in);
    std::atomic<bool> packed{true};
    parallel_for(pool, m.out, [&](int64_t o0, int64_t o1) {
      std::vector<float> scales(static_cast<size_t>(n_groups)), mins(scales.size());
      for (int64_t o = o0; o < o1 && packed.load(std::memory_order_relaxed); ++o) {
        for (int64_t k = 0; k < n_groups; ++k) {
          const size_t gp = size_t((k * spec.group_size / m.group_size) * m.out + o);
          scales[size_t(k)] = u.scale[gp];
          // s * (q - z) = q * s + (-s * z); the product is exact in fp32 (an fp16 scale times a
          // small integer) and rounded once to the row's fp16 minimum.
          mins[size_t(k)] = -u.scale[gp] * float(u.zero[gp]);
        }
        if (!quant::pack_row(spec, m.in, u.codes.data() + size_t(o * m.in), scales.data(), mins.data(),
                             static_cast<uint8_t*>(dst) + size_t(o) * out_row))
          packed = false;
      }
    });
    return packed;
  }

  struct Unpacked {
    std::vector<uint8_t> codes;  // [out][in]
    std::vector<float> scale;    // [groups][out]
    std::vector<int> zero;       // [groups][out], the true zero point
    std::vector<int64_t> group;  // [in]
  };

  std::string where(const std::string& tensor) const {
    return set_->get(tensor).file.string() + ": tensor '" + tensor + "'";
  }

  // Checks one linear's four tensors against each other and the format.
  void add_linear(const std::string& prefix) {
    const std::string weight = prefix + ".weight";
    if (set_->contains(weight))
      STRATA_FAIL(where(weight) << " is stored beside the packed '" << prefix << ".qweight'");
    PackedLinear m;
    m.qweight = &set_->get(prefix + ".qweight");
    auto need = [&](const char* part) -> const SafetensorsEntry* {
      const std::string name = prefix + part;
      if (!set_->contains(name))
        STRATA_FAIL(where(prefix + ".qweight") << " has no '" << name << "' beside it (" << describe_packed(format_)
                                               << ", " << format_.source << ")");
      return &set_->get(name);
    };
    m.qzeros = need(".qzeros");
    m.scales = need(".scales");
    if (set_->contains(prefix + ".g_idx")) m.g_idx = &set_->get(prefix + ".g_idx");
    auto check_2d = [&](const SafetensorsEntry& e, bool packed) {
      if (e.shape.size() != 2) STRATA_FAIL(where(e.name) << " has " << e.shape.size() << " dimensions, not 2");
      if (packed ? e.dtype != DType::I32 : e.dtype == DType::I32)
        STRATA_FAIL(where(e.name) << " has dtype " << dtype_name(e.dtype) << (packed ? ", not I32" : ", not a float type"));
    };
    check_2d(*m.qweight, true);
    check_2d(*m.qzeros, true);
    check_2d(*m.scales, false);
    const int per_word = 32 / format_.bits;
    if (m.qweight->shape[0] == 0 || m.qweight->shape[1] == 0) STRATA_FAIL(where(m.qweight->name) << " is empty");
    const bool awq = format_.method == PackedMethod::Awq;
    m.in = m.qweight->shape[0] * (awq ? 1 : per_word);  // GPTQ packs along the input, AWQ along the output
    m.out = m.qweight->shape[1] * (awq ? per_word : 1);
    if (awq && m.g_idx) STRATA_FAIL(where(m.g_idx->name) << ": AWQ checkpoints have no g_idx");
    m.groups = m.scales->shape[0];
    m.group_size = format_.group_size ? format_.group_size : m.in;
    auto mismatch = [&](const SafetensorsEntry& e, const std::string& want) {
      std::ostringstream shape;
      for (size_t d = 0; d < e.shape.size(); ++d) shape << (d ? ", " : "") << e.shape[d];
      STRATA_FAIL(where(e.name) << " has shape [" << shape.str() << "]; " << want << " (" << describe_packed(format_)
                                << ", " << m.in << " inputs, " << m.out << " outputs)");
    };
    if (m.scales->shape[1] != m.out) mismatch(*m.scales, "its columns must be the outputs");
    if (!m.g_idx && m.groups != (m.in + m.group_size - 1) / m.group_size)
      mismatch(*m.scales, "its rows must be the groups");
    if (m.qzeros->shape[0] != m.groups || m.qzeros->shape[1] != (m.out + per_word - 1) / per_word)
      mismatch(*m.qzeros, "it must be [groups, outputs / " + std::to_string(per_word) + "]");
    if (m.g_idx) {
      if (m.g_idx->dtype != DType::I32 || m.g_idx->shape.size() != 1 || m.g_idx->shape[0] != m.in)
        mismatch(*m.g_idx, "it must be I32 [inputs]");
    }
    linears_.emplace(weight, m);
    names_.push_back(weight);
  }

  // The codes unpacked over `pool` where there is one (words of different inputs are independent).
  Unpacked unpack(const std::string& name, const PackedLinear& m, ThreadPool* pool) const {
    const int bits = format_.bits, per_word = 32 / bits;
    const uint32_t mask = (1u << bits) - 1;
    Unpacked u;
    const bool awq = format_.method == PackedMethod::Awq;
    // Where output o's field sits in its word: GPTQ's zeros and AWQ's codes and zeros pack
    // along the output.
    auto out_shift = [&](int64_t o) { return (awq ? kAwqNibble[o % per_word] : int(o % per_word)) * bits; };
    u.codes.resize(size_t(m.out * m.in));
    if (awq) {
      const int64_t cols = m.qweight->shape[1];
      parallel_for(pool, m.in, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i)
          for (int64_t o = 0; o < m.out; ++o)
            u.codes[size_t(o * m.in + i)] =
                uint8_t((word_at(*m.qweight, size_t(i * cols + o / per_word)) >> out_shift(o)) & mask);
      });
    } else {
      parallel_for(pool, m.qweight->shape[0], [&](int64_t w0, int64_t w1) {
        for (int64_t w = w0; w < w1; ++w)
          for (int64_t o = 0; o < m.out; ++o) {
            const uint32_t word = word_at(*m.qweight, size_t(w * m.out + o));
            for (int j = 0; j < per_word; ++j)
              u.codes[size_t(o * m.in + w * per_word + j)] = uint8_t((word >> (j * bits)) & mask);
          }
      });
    }
    u.scale.resize(size_t(m.groups * m.out));
    plain_->read(m.scales->name, DType::F32, u.scale.data());
    u.zero.resize(u.scale.size());
    const int64_t zero_cols = m.qzeros->shape[1];
    for (int64_t g = 0; g < m.groups; ++g)
      for (int64_t o = 0; o < m.out; ++o) {
        const uint32_t word = word_at(*m.qzeros, size_t(g * zero_cols + o / per_word));
        u.zero[size_t(g * m.out + o)] = int((word >> out_shift(o)) & mask) + (format_.zero_minus_one ? 1 : 0);
      }
    u.group.resize(size_t(m.in));
    for (int64_t i = 0; i < m.in; ++i) {
      const int64_t g = m.g_idx ? int64_t(int32_t(word_at(*m.g_idx, size_t(i)))) : i / m.group_size;
      if (g < 0 || g >= m.groups)
        STRATA_FAIL(where(m.g_idx ? m.g_idx->name : name) << ": input " << i << " is in group " << g << " of " << m.groups);
      u.group[size_t(i)] = g;
    }
    return u;
  }

  std::shared_ptr<const SafetensorsSet> set_;
  std::unique_ptr<WeightSource> plain_;
  PackedFormat format_;
  std::map<std::string, PackedLinear> linears_;  // by the HF weight name they stand for
  std::vector<std::string> names_;
};

}  // namespace

std::unique_ptr<WeightSource> make_packed_source(const fs::path& path, const PackedFormat& format) {
  return std::make_unique<PackedSource>(path, format);
}

}  // namespace strata
