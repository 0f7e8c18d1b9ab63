// The sources that lay a checkpoint's tensors out for the forward pass (model_loader's
// as_forward_reads). rotary_layout_source (Phi-4-mini's partial rotary, GLM's interleaved pairs):
// each q/k head's rows reordered so that the rotated pairs sit at (i, i + d/2) and the passing
// dims meet the table's zero frequencies, the query's passing rows divided by LongRoPE's attention
// factor squared. residual_scale_source (Granite): o_proj and down_proj times the residual
// multiplier. Whole models against transformers: tiny-phi4-mini, tiny-glm4, tiny-granite in
// test_model_hf.cpp and test_gguf.cpp.
#include <catch2/catch.hpp>
#include <cstring>

#include "strata/model/weight_source.h"
#include "strata/quant/quant.h"

using namespace strata;

namespace {

constexpr int kHeadDim = 8, kRotary = 4, kIn = 64;
// Hand-derived for d = 8, r = 4: transformers rotates (0, 2) and (1, 3) and passes 4..7; the
// kernels rotate (j, j + 4). So new dims 0, 4 <- 0, 2; 1, 5 <- 1, 3; 2, 3, 6, 7 <- 4, 5, 6, 7.
constexpr int kOrder[kHeadDim] = {0, 1, 4, 5, 2, 3, 6, 7};

// q_proj (2 heads), k_proj (1 head), v_proj and o_proj of one layer, row r of each holding
// r * 100 + column (scaled per tensor so they differ); read_codes gives those values quantized.
class RowsSource final : public WeightSource {
public:
  std::string describe() const override { return "rows"; }
  bool contains(const std::string& name) const override { return rows_of(name) > 0; }
  std::vector<int64_t> shape(const std::string& name) const override { return {rows_of(name), kIn}; }
  std::vector<std::string> names() const override { return {name("q"), name("k"), name("v"), name("o")}; }
  static std::string name(const char* p) { return std::string("model.layers.0.self_attn.") + p + "_proj.weight"; }
  static float value(const std::string& tensor, int64_t row, int64_t col) {
    const float sign = tensor == name("q") ? 1.0f : tensor == name("k") ? -0.5f : tensor == name("v") ? 0.25f : 0.75f;
    return sign * float(row * 100 + col) / 1000.0f;
  }
  static std::vector<float> values(const std::string& tensor) {
    std::vector<float> v;
    for (int64_t r = 0; r < rows_of(tensor); ++r)
      for (int64_t c = 0; c < kIn; ++c) v.push_back(value(tensor, r, c));
    return v;
  }
  static int64_t rows_of(const std::string& n) {
    return n == name("q") ? 2 * kHeadDim : n == name("k") || n == name("v") || n == name("o") ? kHeadDim : 0;
  }

private:
  void read_into(const std::string& n, DType dst_dtype, void* dst, ThreadPool*) const override {
    const std::vector<float> v = values(n);
    convert_elements(v.data(), DType::F32, dst, dst_dtype, v.size());
  }
  bool read_codes_into(const std::string& n, const quant::QuantSpec& spec, void* dst, ThreadPool*) const override {
    quant::quantize_rows(spec, values(n).data(), DType::F32, rows_of(n), kIn, dst);
    return true;
  }
};

ModelConfig partial_config(float attention_factor) {
  ModelConfig cfg;
  cfg.n_heads = 2;
  cfg.n_kv_heads = 1;
  cfg.head_dim = kHeadDim;
  cfg.rotary_dim = kRotary;
  cfg.rope_attention_factor = attention_factor;
  return cfg;
}

}  // namespace

TEST_CASE("partial rotary: q/k rows reordered per head, the query's passing rows divided by the factor squared",
          "[model][rope]") {
  const float factor = 1.5f;
  auto src = rotary_layout_source(std::make_unique<RowsSource>(), partial_config(factor));
  for (const char* p : {"q", "k", "v"}) {
    const std::string n = RowsSource::name(p);
    INFO(n);
    const bool reordered = n != RowsSource::name("v");
    std::vector<float> got(size_t(RowsSource::rows_of(n) * kIn));
    src->read(n, DType::F32, got.data());
    for (int64_t row = 0; row < RowsSource::rows_of(n); ++row) {
      const int64_t head = row / kHeadDim, j = row % kHeadDim;
      const int64_t stored = reordered ? head * kHeadDim + kOrder[j] : row;
      const bool passing = reordered && kOrder[j] >= kRotary;
      const float scale = passing && n == RowsSource::name("q") ? 1.0f / (factor * factor) : 1.0f;
      for (int64_t c = 0; c < kIn; ++c) {
        INFO("row " << row << " column " << c);
        REQUIRE(got[size_t(row * kIn + c)] == Approx(RowsSource::value(n, stored, c) * scale).epsilon(1e-6));
      }
    }
  }
  // Without partial rotary the source is the inner one.
  ModelConfig whole = partial_config(factor);
  whole.rotary_dim = 0;
  WeightSource* inner = new RowsSource;
  CHECK(rotary_layout_source(std::unique_ptr<WeightSource>(inner), whole).get() == inner);
}

TEST_CASE("partial rotary: quantized rows move whole, the passing query rows' scales and minimums rescaled",
          "[model][rope][quant]") {
  const float factor = 1.25f;
  const quant::QuantSpec spec{4, 32};
  const size_t row_bytes = quant::row_bytes(spec, kIn);
  auto src = rotary_layout_source(std::make_unique<RowsSource>(), partial_config(factor));
  for (const char* p : {"q", "k"}) {
    const std::string n = RowsSource::name(p);
    INFO(n);
    const int64_t rows = RowsSource::rows_of(n);
    std::vector<uint8_t> stored(size_t(rows) * row_bytes), got(stored.size());
    quant::quantize_rows(spec, RowsSource::values(n).data(), DType::F32, rows, kIn, stored.data());
    REQUIRE(src->read_codes(n, spec, got.data()));
    std::vector<float> want(kIn), have(kIn);
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t from = row / kHeadDim * kHeadDim + kOrder[row % kHeadDim];
      const bool scaled = n == RowsSource::name("q") && kOrder[row % kHeadDim] >= kRotary;
      INFO("row " << row << " from " << from);
      const uint8_t* a = stored.data() + size_t(from) * row_bytes;
      const uint8_t* b = got.data() + size_t(row) * row_bytes;
      CHECK(std::memcmp(a, b, kIn / 2) == 0);  // the codes themselves
      quant::dequantize_rows(spec, a, 1, kIn, want.data(), DType::F32);
      quant::dequantize_rows(spec, b, 1, kIn, have.data(), DType::F32);
      // Each scaled parameter is rounded to fp16 again: within 2^-11 of it, relative.
      for (int c = 0; c < kIn; ++c)
        CHECK(have[size_t(c)] == Approx(want[size_t(c)] * (scaled ? 1.0f / (factor * factor) : 1.0f))
                                     .epsilon(1e-3)
                                     .margin(1e-4));
    }
  }
}

TEST_CASE("rotary layout: GLM's interleaved pairs (2i, 2i + 1) line up as (i, i + d/2)", "[model][rope]") {
  // d = 8, r = 4, interleaved: transformers rotates (0, 1) and (2, 3) and passes 4..7, so new dims
  // 0, 4 <- 0, 1; 1, 5 <- 2, 3; 2, 3, 6, 7 <- 4, 5, 6, 7. With r = d, every dim in a pair.
  const int partial[kHeadDim] = {0, 2, 4, 5, 1, 3, 6, 7}, whole[kHeadDim] = {0, 2, 4, 6, 1, 3, 5, 7};
  for (int rotary : {kRotary, kHeadDim}) {
    INFO("rotary dims " << rotary);
    ModelConfig cfg = partial_config(1.0f);
    cfg.rotary_dim = rotary == kHeadDim ? 0 : rotary;
    cfg.rope_interleaved = true;
    auto src = rotary_layout_source(std::make_unique<RowsSource>(), cfg);
    const std::string n = RowsSource::name("k");
    std::vector<float> got(size_t(kHeadDim * kIn));
    src->read(n, DType::F32, got.data());
    for (int j = 0; j < kHeadDim; ++j) {
      INFO("dim " << j);
      CHECK(got[size_t(j * kIn)] == RowsSource::value(n, rotary == kHeadDim ? whole[j] : partial[j], 0));
    }
  }
}

TEST_CASE("residual scale: o_proj's rows times Granite's residual multiplier, as floats and as codes", "[model][quant]") {
  ModelConfig cfg = partial_config(1.0f);
  cfg.rotary_dim = 0;
  cfg.residual_multiplier = 0.6f;
  auto src = residual_scale_source(std::make_unique<RowsSource>(), cfg);
  const quant::QuantSpec spec{8, 32};
  const size_t row_bytes = quant::row_bytes(spec, kIn);
  for (const char* p : {"o", "v"}) {
    const std::string n = RowsSource::name(p);
    INFO(n);
    const float m = n == RowsSource::name("o") ? 0.6f : 1.0f;
    std::vector<float> got(size_t(kHeadDim * kIn));
    src->read(n, DType::F32, got.data());
    for (size_t i = 0; i < got.size(); ++i)
      REQUIRE(got[i] == Approx(RowsSource::value(n, int64_t(i) / kIn, int64_t(i) % kIn) * m).epsilon(1e-6));
    std::vector<uint8_t> stored(size_t(kHeadDim) * row_bytes), codes(stored.size());
    quant::quantize_rows(spec, RowsSource::values(n).data(), DType::F32, kHeadDim, kIn, stored.data());
    REQUIRE(src->read_codes(n, spec, codes.data()));
    std::vector<float> want(size_t(kHeadDim * kIn)), have(want.size());
    quant::dequantize_rows(spec, stored.data(), kHeadDim, kIn, want.data(), DType::F32);
    quant::dequantize_rows(spec, codes.data(), kHeadDim, kIn, have.data(), DType::F32);
    for (size_t i = 0; i < want.size(); ++i) CHECK(have[i] == Approx(want[i] * m).epsilon(1e-3).margin(1e-4));
  }
  cfg.residual_multiplier = 1.0f;
  WeightSource* inner = new RowsSource;
  CHECK(residual_scale_source(std::unique_ptr<WeightSource>(inner), cfg).get() == inner);
}
