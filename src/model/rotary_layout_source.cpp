// Rotary layouts other than LLaMA's whole-head NeoX pairs. Strata's RoPE kernels rotate dim i of
// a query or key head with dim i + d/2, by frequency i of rope_inv_freq's table, which is 0
// (cos 1, sin 0: left as they are) for i >= r/2 under partial rotary. transformers rotates
//   - Phi-3's partial rotary (Phi-4-mini: r = 96 of d = 128): dim i with dim i + r/2, i < r/2;
//   - GLM's (interleaved, GPT-J style, partial too: 64 of 128): dim 2i with dim 2i + 1, i < r/2;
// and passes dims r .. d - 1. This source reorders the rows of each q and k head to match:
//
//   new dim j < r/2              <- dim j (Phi-3) or 2j (GLM)             (rotated, first of a pair)
//   new dim d/2 + j, j < r/2     <- dim r/2 + j (Phi-3) or 2j + 1 (GLM)   (rotated, second of a pair)
//   the other d - r new dims     <- dims r .. d - 1                       (passing), in order
//
// A score sums over dims, so reordering queries and keys alike leaves it as it was; the KV cache
// holds the reordered keys, which only attention reads.
//
// LongRoPE's attention factor multiplies transformers' cos and sin, so only the rotated dims grow
// by it; Strata scales whole scores by its square (ModelConfig::attention_scale), so the query's
// passing rows are divided by the square here, in fp32 before the weights' own rounding.
#include <cstring>
#include <vector>

#include "forwarding_source.h"
#include "strata/core/error.h"

namespace strata {
namespace {

enum class Role : uint8_t { None, Query, Key };

class RotaryLayoutSource final : public ForwardingSource {
public:
  RotaryLayoutSource(std::unique_ptr<WeightSource> inner, const ModelConfig& cfg)
      : ForwardingSource(std::move(inner)), head_dim_(cfg.head_dim), rotary_(cfg.rotary_dims()),
        passing_scale_(1.0f / (cfg.rope_attention_factor * cfg.rope_attention_factor)) {
    // A per-head q/k norm's weight would need the same reordering, and its RMS would see the
    // scaled passing dims (config.cpp admits these layouts for Phi-3's and GLM's attention only,
    // which have none).
    STRATA_CHECK(!cfg.qk_norm, "internal: a partial or interleaved rotary layout with q/k norms");
    const int d = cfg.head_dim, r = cfg.rotary_dims();
    for (int j = 0; j < d; ++j) {
      const int half = j < d / 2 ? j : j - d / 2;  // index within its half
      const bool second = j >= d / 2;
      if (half >= r / 2) order_.push_back(r + (second ? d / 2 - r / 2 : 0) + half - r / 2);
      else if (cfg.rope_interleaved) order_.push_back(2 * half + (second ? 1 : 0));
      else order_.push_back(half + (second ? r / 2 : 0));
    }
  }

private:
  void read_into(const std::string& name, DType dst_dtype, void* dst, ThreadPool* pool) const override {
    const Role role = role_of(name);
    if (role == Role::None) return inner_->read(name, dst_dtype, dst, pool);
    const int64_t rows = rows_of(name), n = numel(name) / rows;
    if (!scales_passing(role)) {
      std::vector<uint8_t> stored(size_t(rows * n) * dtype_size(dst_dtype));
      inner_->read(name, dst_dtype, stored.data(), pool);
      reorder(stored.data(), size_t(n) * dtype_size(dst_dtype), rows, dst, [](void*) {});
      return;
    }
    std::vector<float> stored(size_t(rows * n)), reordered(stored.size());
    inner_->read(name, DType::F32, stored.data(), pool);
    reorder(stored.data(), size_t(n) * sizeof(float), rows, reordered.data(), [&](void* row) {
      for (int64_t i = 0; i < n; ++i) static_cast<float*>(row)[i] *= passing_scale_;
    });
    convert_elements(reordered.data(), DType::F32, dst, dst_dtype, reordered.size());
  }

  bool read_codes_into(const std::string& name, const quant::QuantSpec& spec, void* dst,
                       ThreadPool* pool) const override {
    const Role role = role_of(name);
    if (role == Role::None) return inner_->read_codes(name, spec, dst, pool);
    const int64_t rows = rows_of(name), n = numel(name) / rows;
    const size_t row_bytes = quant::row_bytes(spec, n);  // quantized rows are self-contained
    std::vector<uint8_t> stored(size_t(rows) * row_bytes);
    if (!inner_->read_codes(name, spec, stored.data(), pool)) return false;
    reorder(stored.data(), row_bytes, rows, dst, [&](void* row) {
      if (scales_passing(role)) quant::scale_row(spec, n, row, passing_scale_);
    });
    return true;
  }

  // q_proj / k_proj weights and biases: rows of heads x head_dim.
  static Role role_of(const std::string& name) {
    for (const char* suffix : {".self_attn.q_proj.weight", ".self_attn.q_proj.bias"})
      if (name.ends_with(suffix)) return Role::Query;
    for (const char* suffix : {".self_attn.k_proj.weight", ".self_attn.k_proj.bias"})
      if (name.ends_with(suffix)) return Role::Key;
    return Role::None;
  }

  bool scales_passing(Role role) const { return role == Role::Query && passing_scale_ != 1.0f; }

  int64_t rows_of(const std::string& name) const {
    const std::vector<int64_t> s = inner_->shape(name);
    if (s.empty() || s[0] % head_dim_ != 0)
      STRATA_FAIL(inner_->describe() << ": tensor '" << name << "' has " << (s.empty() ? 0 : s[0])
                                     << " rows, not whole heads of " << head_dim_);
    return s[0];
  }

  // dst's row h * d + j is src's row h * d + order_[j]; `passing(row)` is called on each dst row
  // that does not rotate.
  template <class OnPassing>
  void reorder(const void* stored, size_t row_bytes, int64_t rows, void* dst, OnPassing passing) const {
    const auto* src = static_cast<const uint8_t*>(stored);
    auto* out = static_cast<uint8_t*>(dst);
    const int d = head_dim_;
    for (int64_t head = 0; head < rows / d; ++head)
      for (int j = 0; j < d; ++j) {
        uint8_t* row = out + size_t(head * d + j) * row_bytes;
        std::memcpy(row, src + size_t(head * d + order_[size_t(j)]) * row_bytes, row_bytes);
        if (order_[size_t(j)] >= rotary_) passing(row);
      }
  }

  int head_dim_;
  int rotary_;
  float passing_scale_;
  std::vector<int> order_;  // new dim j of a head <- stored dim order_[j]
};

}  // namespace

std::unique_ptr<WeightSource> rotary_layout_source(std::unique_ptr<WeightSource> inner, const ModelConfig& cfg) {
  if (!cfg.partial_rotary() && !cfg.rope_interleaved) return inner;
  return std::make_unique<RotaryLayoutSource>(std::move(inner), cfg);
}

}  // namespace strata
