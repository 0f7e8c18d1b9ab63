// GPT-OSS stores a layer's experts as four 3-D tensors (transformers' GptOssExperts), each the
// transpose of a stack of Linear weights: gate_up_proj [E, h, 2f], whose last dimension
// interleaves gate and up (gate = [..., 0::2], up = [..., 1::2]), gate_up_proj_bias [E, 2f]
// likewise, down_proj [E, f, h] and down_proj_bias [E, h]. The Hub's checkpoints hold the two
// matrices in MXFP4 instead: `<name>_blocks` uint8 [E, out, in / 32, 16], two e2m1 codes a byte
// (the low nibble the even element), and `<name>_scales` uint8 [E, out, in / 32], each group's
// power of two biased by 127, rows [out, in] (gate and up rows interleaved). This source shows
// them as each expert's Linear tensors under Qwen3-MoE's names (mlp.experts.E.gate_proj.weight
// [f, h], ... .down_proj.bias [h]), cut out on reading, so a layer's experts load as any other
// mixture's and the loader's compression applies to them alike.
//
// MXFP4 rows are also Strata's 8-bit rows of group 32 exactly (read_codes): e2m1 value v of a group
// of exponent s is code 2v + 12 (0 .. 24) under scale 2^(s - 1) and minimum -6 * 2^s, so a policy
// compressing weights at {bits: 8, group_size: 32} moves the experts at 9 bits a value, not 16,
// and not quantized a second time.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "strata/core/error.h"
#include "strata/core/thread_pool.h"
#include "strata/model/safetensors.h"
#include "strata/model/weight_source.h"

namespace strata {
namespace {

constexpr const char* kExperts = ".mlp.experts.";
constexpr int kMxGroup = 32;  // MXFP4 values per scale

// e2m1: sign, two exponent bits, one mantissa bit.
constexpr float kFp4Values[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

float load_float(const uint8_t* p, DType dt) {  // one stored element, perhaps misaligned
  if (dt == DType::F32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t b;
  std::memcpy(&b, p, 2);
  return dt == DType::F16 ? half_to_float(b) : bf16_to_float(b);
}

// One layer's stored expert tensors (names; empty where absent).
struct LayerExperts {
  std::string gate_up, gate_up_blocks, gate_up_scales, gate_up_bias;
  std::string down, down_blocks, down_scales, down_bias;
};

// Which part of which stored tensor an expert's tensor is.
struct Part {
  enum Kind : uint8_t { GateUp, Down, GateUpBias, DownBias } kind;
  const LayerExperts* layer;
  int expert;
  int which;  // GateUp, GateUpBias: 0 gate, 1 up
};

class GptOssSource final : public WeightSource {
public:
  GptOssSource(std::shared_ptr<const SafetensorsSet> set, const std::filesystem::path& path, const ModelConfig& cfg)
      : set_(set), plain_(make_safetensors_source(set, path)), E_(cfg.n_experts), h_(cfg.hidden),
        f_(cfg.expert_intermediate) {
    std::map<std::string, LayerExperts> layers;  // by prefix "model.layers.N.mlp.experts."
    for (const std::string& name : set_->names()) {
      const size_t at = name.find(kExperts);
      const std::string field = at == std::string::npos ? "" : name.substr(at + std::strlen(kExperts));
      LayerExperts* l = at == std::string::npos ? nullptr : &layers[name.substr(0, at + std::strlen(kExperts))];
      std::string* slot = !l                              ? nullptr
                          : field == "gate_up_proj"        ? &l->gate_up
                          : field == "gate_up_proj_blocks" ? &l->gate_up_blocks
                          : field == "gate_up_proj_scales" ? &l->gate_up_scales
                          : field == "gate_up_proj_bias"   ? &l->gate_up_bias
                          : field == "down_proj"           ? &l->down
                          : field == "down_proj_blocks"    ? &l->down_blocks
                          : field == "down_proj_scales"    ? &l->down_scales
                          : field == "down_proj_bias"      ? &l->down_bias
                                                           : nullptr;
      if (slot) {
        *slot = name;
        stored_.insert(name);
      } else {
        names_.push_back(name);
      }
    }
    for (auto& [prefix, l] : layers) {
      if (l.gate_up.empty() && l.gate_up_blocks.empty() && l.down.empty() && l.down_blocks.empty() &&
          l.gate_up_bias.empty() && l.down_bias.empty())
        continue;  // the layer's experts are stored per expert already
      layers_.push_back(std::make_unique<LayerExperts>(l));
      const LayerExperts* stored = layers_.back().get();
      check_layer(*stored);
      for (int e = 0; e < E_; ++e) {
        const std::string expert = prefix + std::to_string(e) + ".";
        add_part(expert + "gate_proj.weight", {Part::GateUp, stored, e, 0});
        add_part(expert + "up_proj.weight", {Part::GateUp, stored, e, 1});
        add_part(expert + "down_proj.weight", {Part::Down, stored, e, 0});
        if (!stored->gate_up_bias.empty()) {
          add_part(expert + "gate_proj.bias", {Part::GateUpBias, stored, e, 0});
          add_part(expert + "up_proj.bias", {Part::GateUpBias, stored, e, 1});
        }
        if (!stored->down_bias.empty()) add_part(expert + "down_proj.bias", {Part::DownBias, stored, e, 0});
      }
    }
  }

  std::string describe() const override { return plain_->describe(); }
  std::optional<quant::QuantSpec> codes_spec() const override {
    return has_mxfp4() ? std::optional<quant::QuantSpec>(quant::QuantSpec{8, kMxGroup}) : std::nullopt;
  }
  bool has_mxfp4() const {
    return std::any_of(layers_.begin(), layers_.end(),
                       [](const auto& l) { return !l->gate_up_blocks.empty() || !l->down_blocks.empty(); });
  }
  bool contains(const std::string& name) const override {
    return parts_.count(name) != 0 || (set_->contains(name) && !stored_.count(name));
  }
  std::vector<std::string> names() const override { return names_; }

  std::vector<int64_t> shape(const std::string& name) const override {
    auto it = parts_.find(name);
    if (it == parts_.end()) return plain_->shape(visible(name));
    switch (it->second.kind) {
      case Part::GateUp: return {f_, h_};
      case Part::Down: return {h_, f_};
      case Part::GateUpBias: return {f_};
      default: return {h_};
    }
  }

private:
  const std::string& visible(const std::string& name) const {
    if (stored_.count(name))
      STRATA_FAIL(describe() << ": tensor '" << name << "' is read as each expert's tensors, not by its own name");
    return name;
  }

  void add_part(const std::string& name, const Part& p) {
    parts_.emplace(name, p);
    names_.push_back(name);
  }

  void expect_shape(const std::string& name, const std::vector<int64_t>& want, DType dt) const {
    const SafetensorsEntry& e = set_->get(name);
    auto str = [](const std::vector<int64_t>& s) {
      std::string out = "[";
      for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
      return out + "]";
    };
    if (e.shape != want)
      STRATA_FAIL(e.file.string() << ": tensor '" << name << "' has shape " << str(e.shape) << ", the config implies "
                                  << str(want));
    const bool is_float = e.dtype == DType::F32 || e.dtype == DType::F16 || e.dtype == DType::BF16;
    if (dt == DType::U8 ? e.dtype != DType::U8 : !is_float)
      STRATA_FAIL(e.file.string() << ": tensor '" << name << "' is " << dtype_name(e.dtype) << ", expected "
                                  << (dt == DType::U8 ? "U8 (MXFP4)" : "F32, F16 or BF16"));
  }

  // A matrix stored either way, [E, in, out] as floats or [E, out, in / 32, 16] + scales as MXFP4.
  void check_matrix(const std::string& plain, const std::string& blocks, const std::string& scales, int64_t out,
                    int64_t in, const char* what) const {
    const std::string& any = !plain.empty() ? plain : !blocks.empty() ? blocks : scales;
    if (plain.empty() && (blocks.empty() || scales.empty()))
      STRATA_FAIL(describe() << ": the experts of '" << any << "' lack " << what
                             << " (stored as one tensor, or as MXFP4 _blocks and _scales)");
    if (!plain.empty() && !blocks.empty())
      STRATA_FAIL(describe() << ": '" << plain << "' and '" << blocks << "' both store " << what);
    if (!plain.empty()) return expect_shape(plain, {E_, in, out}, DType::F32);
    if (in % kMxGroup != 0)
      STRATA_FAIL(describe() << ": '" << blocks << "' holds MXFP4 rows of " << in << " values, not a multiple of 32");
    expect_shape(blocks, {E_, out, in / kMxGroup, kMxGroup / 2}, DType::U8);
    expect_shape(scales, {E_, out, in / kMxGroup}, DType::U8);
  }

  void check_layer(const LayerExperts& l) const {
    check_matrix(l.gate_up, l.gate_up_blocks, l.gate_up_scales, 2 * f_, h_, "gate_up_proj");
    check_matrix(l.down, l.down_blocks, l.down_scales, h_, f_, "down_proj");
    if (!l.gate_up_bias.empty()) expect_shape(l.gate_up_bias, {E_, 2 * f_}, DType::F32);
    if (!l.down_bias.empty()) expect_shape(l.down_bias, {E_, h_}, DType::F32);
  }

  void read_into(const std::string& name, DType dst_dtype, void* dst, ThreadPool* pool) const override {
    auto it = parts_.find(name);
    if (it == parts_.end()) return plain_->read(visible(name), dst_dtype, dst, pool);
    const Part& p = it->second;
    const LayerExperts& l = *p.layer;
    const bool gate_up = p.kind == Part::GateUp || p.kind == Part::GateUpBias;
    const bool bias = p.kind == Part::GateUpBias || p.kind == Part::DownBias;
    const int64_t out = gate_up ? 2 * f_ : h_;  // the expert's stored rows [out, in] (a bias: its width)
    const int64_t rows = bias ? 1 : gate_up ? f_ : h_, cols = bias ? out / (gate_up ? 2 : 1) : gate_up ? h_ : f_;
    auto row_of = [&](int64_t r) { return gate_up ? 2 * r + p.which : r; };  // the part's row r in [out, ...]
    // The stored tensors, looked up once: an MXFP4 matrix's blocks and scales, else floats.
    const std::string& blocks = bias ? std::string() : gate_up ? l.gate_up_blocks : l.down_blocks;
    const SafetensorsEntry* mx_blocks = blocks.empty() ? nullptr : &set_->get(blocks);
    const SafetensorsEntry* mx_scales = mx_blocks ? &set_->get(gate_up ? l.gate_up_scales : l.down_scales) : nullptr;
    const std::string& plain = bias ? (gate_up ? l.gate_up_bias : l.down_bias) : gate_up ? l.gate_up : l.down;
    const SafetensorsEntry* floats = mx_blocks ? nullptr : &set_->get(plain);
    // A float row's element c sits at first(r) + c * stride: a bias is its expert's row of [E, out]
    // (gate or up: every other entry), a matrix row a column of the expert's [in, out].
    auto first = [&](int64_t r) { return bias ? p.expert * out + row_of(0) : p.expert * cols * out + row_of(r); };
    const int64_t stride = bias ? (gate_up ? 2 : 1) : out;
    const size_t out_size = dtype_size(dst_dtype);
    auto rows_in = [&](int64_t r0, int64_t r1) {
      std::vector<float> row(static_cast<size_t>(cols));
      for (int64_t r = r0; r < r1; ++r) {
        if (mx_blocks) {
          decode_mxfp4_row(*mx_blocks, *mx_scales, out, p.expert, row_of(r), cols, row.data());
        } else {
          const int64_t es = int64_t(dtype_size(floats->dtype));
          const uint8_t* base = floats->data + first(r) * es;
          for (int64_t c = 0; c < cols; ++c) row[size_t(c)] = load_float(base + c * stride * es, floats->dtype);
        }
        convert_elements(row.data(), DType::F32, static_cast<uint8_t*>(dst) + size_t(r * cols) * out_size, dst_dtype,
                         size_t(cols));
      }
    };
    if (pool && rows > 1) pool->parallel_for(rows, rows_in);
    else rows_in(0, rows);
  }

  bool read_codes_into(const std::string& name, const quant::QuantSpec& spec, void* dst,
                       ThreadPool* pool) const override {
    auto it = parts_.find(name);
    if (it == parts_.end()) return plain_->read_codes(visible(name), spec, dst, pool);
    const Part& p = it->second;
    if (spec.bits != 8 || spec.group_size != kMxGroup || (p.kind != Part::GateUp && p.kind != Part::Down)) return false;
    const bool gate_up = p.kind == Part::GateUp;
    const std::string& blocks = gate_up ? p.layer->gate_up_blocks : p.layer->down_blocks;
    if (blocks.empty()) return false;  // float experts: the loader quantizes them
    const SafetensorsEntry& mx_blocks = set_->get(blocks);
    const SafetensorsEntry& mx_scales = set_->get(gate_up ? p.layer->gate_up_scales : p.layer->down_scales);
    const int64_t out = gate_up ? 2 * f_ : h_, rows = gate_up ? f_ : h_, cols = gate_up ? h_ : f_;
    const size_t row_bytes = quant::row_bytes(spec, cols);
    std::atomic<bool> exact{true};
    auto rows_in = [&](int64_t r0, int64_t r1) {
      const int64_t groups = cols / kMxGroup;
      std::vector<uint8_t> codes(static_cast<size_t>(cols));
      std::vector<float> scales(static_cast<size_t>(groups)), mins(static_cast<size_t>(groups));
      for (int64_t r = r0; r < r1 && exact; ++r) {
        const MxRow mx = mxfp4_row(mx_blocks, mx_scales, out, p.expert, gate_up ? 2 * r + p.which : r, cols);
        for (int64_t g = 0; g < groups; ++g) {
          scales[size_t(g)] = std::ldexp(0.5f, mx.exponent(g));
          mins[size_t(g)] = std::ldexp(-6.0f, mx.exponent(g));
          for (int64_t c = g * kMxGroup; c < (g + 1) * kMxGroup; ++c)
            codes[size_t(c)] = uint8_t(int(2.0f * kFp4Values[mx.nibble(c)]) + 12);
        }
        // A group far from 1 whose scale or minimum fp16 would round: the values are read instead.
        const bool fits = std::all_of(scales.begin(), scales.end(), fp16_exact) &&
                          std::all_of(mins.begin(), mins.end(), fp16_exact) &&
                          quant::pack_row(spec, cols, codes.data(), scales.data(), mins.data(),
                                          static_cast<uint8_t*>(dst) + size_t(r) * row_bytes);
        if (!fits) exact = false;
      }
    };
    if (pool && rows > 1) pool->parallel_for(rows, rows_in);
    else rows_in(0, rows);
    return exact;
  }

  static bool fp16_exact(float v) { return half_to_float(float_to_half(v)) == v; }

  // One row of an MXFP4 matrix: element c's e2m1 code and its group's power of two.
  struct MxRow {
    const uint8_t* blocks;  // two codes a byte, the low nibble the even element
    const uint8_t* scales;  // a group's exponent biased by 127
    int nibble(int64_t c) const { return c % 2 ? blocks[c / 2] >> 4 : blocks[c / 2] & 15; }
    int exponent(int64_t g) const { return int(scales[g]) - 127; }
  };
  // Row `row` of expert `expert` of an MXFP4 matrix of `out` rows of `in` values.
  static MxRow mxfp4_row(const SafetensorsEntry& blocks, const SafetensorsEntry& scales, int64_t out, int expert,
                         int64_t row, int64_t in) {
    const int64_t groups = in / kMxGroup, r = int64_t(expert) * out + row;
    return {blocks.data + r * groups * (kMxGroup / 2), scales.data + r * groups};
  }
  static void decode_mxfp4_row(const SafetensorsEntry& blocks, const SafetensorsEntry& scales, int64_t out,
                               int expert, int64_t row, int64_t in, float* values) {
    const MxRow mx = mxfp4_row(blocks, scales, out, expert, row, in);
    for (int64_t c = 0; c < in; ++c) values[c] = std::ldexp(kFp4Values[mx.nibble(c)], mx.exponent(c / kMxGroup));
  }

  std::shared_ptr<const SafetensorsSet> set_;
  std::unique_ptr<WeightSource> plain_;
  int64_t E_, h_, f_;
  std::vector<std::unique_ptr<LayerExperts>> layers_;
  std::map<std::string, Part> parts_;
  std::set<std::string> stored_;  // the fused tensors, hidden behind the parts
  std::vector<std::string> names_;
};

}  // namespace

std::unique_ptr<WeightSource> gpt_oss_source(const std::filesystem::path& path, const ModelConfig& cfg, bool* mxfp4) {
  auto source =
      std::make_unique<GptOssSource>(std::make_shared<const SafetensorsSet>(SafetensorsSet::open(path)), path, cfg);
  if (mxfp4) *mxfp4 = source->has_mxfp4();
  return source;
}

std::string mxfp4_load_note() {
  return "weights: MXFP4 experts; a policy with compress_weights {bits: 8, group_size: 32} keeps their values "
         "exactly (9 bits each), otherwise they are dequantized at load";
}

}  // namespace strata
