// Granite multiplies each residual branch by residual_multiplier before adding it to the stream:
// h + m o_proj(attention) and h + m down_proj(mlp). A projection is linear, so m W x = (m W) x:
// this source multiplies o_proj's and down_proj's weights (and biases) by m as they are read, in
// fp32 before the weights' own rounding (quantized rows: their groups' scales and minimums), and
// the forward pass needs no op of its own.
#include <vector>

#include "forwarding_source.h"
#include "strata/core/error.h"

namespace strata {
namespace {

class ResidualScaleSource final : public ForwardingSource {
public:
  ResidualScaleSource(std::unique_ptr<WeightSource> inner, float multiplier)
      : ForwardingSource(std::move(inner)), multiplier_(multiplier) {}

private:
  // The projections whose outputs are the residual branches (a dense layer's; Granite has no MoE).
  static bool writes_residual(const std::string& name) {
    for (const char* suffix : {".self_attn.o_proj.weight", ".self_attn.o_proj.bias", ".mlp.down_proj.weight",
                               ".mlp.down_proj.bias"})
      if (name.ends_with(suffix)) return true;
    return false;
  }

  void read_into(const std::string& name, DType dst_dtype, void* dst, ThreadPool* pool) const override {
    if (!writes_residual(name)) return inner_->read(name, dst_dtype, dst, pool);
    std::vector<float> values(size_t(numel(name)));
    inner_->read(name, DType::F32, values.data(), pool);
    for (float& v : values) v *= multiplier_;
    convert_elements(values.data(), DType::F32, dst, dst_dtype, values.size());
  }

  bool read_codes_into(const std::string& name, const quant::QuantSpec& spec, void* dst,
                       ThreadPool* pool) const override {
    if (!inner_->read_codes(name, spec, dst, pool)) return false;
    if (!writes_residual(name)) return true;
    const std::vector<int64_t> s = inner_->shape(name);
    STRATA_CHECK(s.size() == 2, "internal: codes of a " << s.size() << "-D tensor '" << name << "'");
    const size_t row_bytes = quant::row_bytes(spec, s[1]);
    for (int64_t r = 0; r < s[0]; ++r) quant::scale_row(spec, s[1], static_cast<uint8_t*>(dst) + size_t(r) * row_bytes, multiplier_);
    return true;
  }

  float multiplier_;
};

}  // namespace

std::unique_ptr<WeightSource> residual_scale_source(std::unique_ptr<WeightSource> inner, const ModelConfig& cfg) {
  if (cfg.residual_multiplier == 1.0f) return inner;
  return std::make_unique<ResidualScaleSource>(std::move(inner), cfg.residual_multiplier);
}

}  // namespace strata
