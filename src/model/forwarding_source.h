// A WeightSource over another that shows the inner one's tensors as they are, for the decorators
// that change a few tensors as they are read (rotary_layout_source, residual_scale_source):
// they override read_into / read_codes_into and pass the rest through.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "strata/model/weight_source.h"

namespace strata {

class ForwardingSource : public WeightSource {
public:
  explicit ForwardingSource(std::unique_ptr<WeightSource> inner) : inner_(std::move(inner)) {}

  std::string describe() const override { return inner_->describe(); }
  std::optional<quant::QuantSpec> codes_spec() const override { return inner_->codes_spec(); }
  bool contains(const std::string& name) const override { return inner_->contains(name); }
  std::vector<std::string> names() const override { return inner_->names(); }
  std::vector<int64_t> shape(const std::string& name) const override { return inner_->shape(name); }

protected:
  void read_into(const std::string& name, DType dst_dtype, void* dst, ThreadPool* pool) const override {
    inner_->read(name, dst_dtype, dst, pool);
  }
  bool read_codes_into(const std::string& name, const quant::QuantSpec& spec, void* dst,
                       ThreadPool* pool) const override {
    return inner_->read_codes(name, spec, dst, pool);
  }

  int64_t numel(const std::string& name) const {
    int64_t total = 1;
    for (int64_t e : inner_->shape(name)) total *= e;
    return total;
  }

  std::unique_ptr<WeightSource> inner_;
};

}  // namespace strata
