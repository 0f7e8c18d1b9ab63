// Gemma checkpoints as the loader reads LLaMA's. Gemma's RMSNorm scales by (1 + w) (transformers'
// Gemma3RMSNorm): the norms add the 1 themselves, in fp32 (ForwardOps::norm_offset), since a
// 16-bit 1 + w would round w away; the stored w is read as it is.
// What this source takes away: Gemma 3's multimodal checkpoints (Gemma3ForConditionalGeneration:
// 4B, 12B, 27B) keep the text model under language_model.model. (transformers 4) or
// model.language_model. (transformers 5), beside a vision tower that a text job never reads: the
// text tensors are shown under LLaMA's model. names and the vision tensors not at all.
#include <string_view>
#include <unordered_map>

#include "strata/core/error.h"
#include "strata/model/weight_source.h"

namespace strata {
namespace {

bool is_vision(std::string_view name) {
  for (std::string_view prefix : {"vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                                  "model.multi_modal_projector."})
    if (name.starts_with(prefix)) return true;
  return false;
}

// The LLaMA-style name of a stored text tensor (itself where it has no multimodal prefix).
std::string text_name(const std::string& stored) {
  if (stored.starts_with("language_model.")) return stored.substr(std::string_view("language_model.").size());
  if (stored.starts_with("model.language_model."))
    return "model." + stored.substr(std::string_view("model.language_model.").size());
  return stored;
}

class GemmaSource final : public WeightSource {
public:
  explicit GemmaSource(std::unique_ptr<WeightSource> inner) : inner_(std::move(inner)) {
    for (const std::string& stored : inner_->names()) {
      if (is_vision(stored)) continue;
      const std::string name = text_name(stored);
      if (!stored_.emplace(name, stored).second)
        STRATA_FAIL(inner_->describe() << ": tensor '" << name << "' is stored twice (as '" << stored << "' too)");
      names_.push_back(name);
    }
  }

  std::string describe() const override { return inner_->describe(); }
  std::optional<quant::QuantSpec> codes_spec() const override { return inner_->codes_spec(); }
  bool contains(const std::string& name) const override { return stored_.count(name) != 0; }
  std::vector<std::string> names() const override { return names_; }
  std::vector<int64_t> shape(const std::string& name) const override { return inner_->shape(stored(name)); }

private:
  void read_into(const std::string& name, DType dst_dtype, void* dst, ThreadPool* pool) const override {
    inner_->read(stored(name), dst_dtype, dst, pool);
  }

  bool read_codes_into(const std::string& name, const quant::QuantSpec& spec, void* dst,
                       ThreadPool* pool) const override {
    return inner_->read_codes(stored(name), spec, dst, pool);  // projections only: no norm is quantized
  }

  const std::string& stored(const std::string& name) const {
    auto it = stored_.find(name);
    if (it == stored_.end()) STRATA_FAIL(inner_->describe() << ": missing tensor '" << name << "'");
    return it->second;
  }

  std::unique_ptr<WeightSource> inner_;
  std::unordered_map<std::string, std::string> stored_;  // shown name -> stored name
  std::vector<std::string> names_;
};

}  // namespace

std::unique_ptr<WeightSource> gemma_source(std::unique_ptr<WeightSource> inner) {
  return std::make_unique<GemmaSource>(std::move(inner));
}

}  // namespace strata
