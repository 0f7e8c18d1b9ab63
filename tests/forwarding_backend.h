// A backend that passes every call to another one, for tests that need to change one behaviour
// (a device that runs out of memory) and keep the rest.
#pragma once
#include <cstdint>
#include <vector>

#include "strata/backend/backend.h"
#include "strata/core/error.h"

namespace strata::test {

class ForwardingBackend : public Backend {
public:
  explicit ForwardingBackend(Backend& inner) : in_(inner) {}
  const char* name() const override { return in_.name(); }
  Device device() const override { return in_.device(); }
  DType activation_dtype() const override { return in_.activation_dtype(); }
  Buffer alloc(size_t bytes) override { return in_.alloc(bytes); }  // the inner backend releases it
  void release(void* data) override { in_.release(data); }
  void copy_to_device(void* d, const void* s, size_t n) override { in_.copy_to_device(d, s, n); }
  void copy_to_host(void* d, const void* s, size_t n) override { in_.copy_to_host(d, s, n); }
  void synchronize() override { in_.synchronize(); }
  size_t available_memory() const override { return in_.available_memory(); }
  void* alloc_host(size_t bytes) override { return in_.alloc_host(bytes); }
  void free_host(void* p) override { in_.free_host(p); }
  void copy_2d(CopyKind kind, void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
               size_t rows) override {
    in_.copy_2d(kind, dst, dst_pitch, src, src_pitch, width, rows);
  }
  void copy_on_device(void* d, const void* s, size_t n) override { in_.copy_on_device(d, s, n); }
  Event record(Stream s) override { return in_.record(s); }
  void wait(Stream s, const Event& e) override { in_.wait(s, e); }
  void wait_host(const Event& e) override { in_.wait_host(e); }
  void copy_2d_async(CopyKind kind, void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                     size_t rows) override {
    in_.copy_2d_async(kind, dst, dst_pitch, src, src_pitch, width, rows);
  }
  void upload(void* d, const void* s, size_t n) override { in_.upload(d, s, n); }
  void fill(void* d, uint8_t byte, size_t n) override { in_.fill(d, byte, n); }
  void embedding(const Tensor& ids, const Tensor& table, const Tensor& out, bool acc) override {
    in_.embedding(ids, table, out, acc);
  }
  void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, const Tensor& out) override {
    in_.layer_norm(x, w, b, eps, out);
  }
  void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out, float w_offset = 0.0f) override {
    in_.rms_norm(x, w, eps, out, w_offset);
  }
  void linear(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) override { in_.linear(x, w, b, y); }
  void linears(const std::vector<LinearJob>& jobs) override { in_.linears(jobs); }
  int64_t fused_dequant_max_tokens() const override { return in_.fused_dequant_max_tokens(); }
  void add(const Tensor& a, const Tensor& b, const Tensor& out) override { in_.add(a, b, out); }
  void activation(Activation act, const Tensor& x) override { in_.activation(act, x); }
  void swiglu(const Tensor& gu, const Tensor& out) override { in_.swiglu(gu, out); }
  void geglu(const Tensor& gu, const Tensor& out) override { in_.geglu(gu, out); }
  void clamped_swiglu(const Tensor& gu, const Tensor& out, float limit, float alpha) override {
    in_.clamped_swiglu(gu, out, limit, alpha);
  }
  void scale(const Tensor& x, float s) override { in_.scale(x, s); }
  void soft_cap(const Tensor& x, float cap) override { in_.soft_cap(x, cap); }
  void combine_rows(const Tensor& src, const Tensor& rows, const Tensor& weights, const Tensor& out) override {
    in_.combine_rows(src, rows, weights, out);
  }
  void rope(const Tensor& x, const Tensor& pos, const Tensor& inv_freq) override { in_.rope(x, pos, inv_freq); }
  void add_norm(const Tensor& x, const Tensor& delta, Norm norm, const Tensor& w, const Tensor& b, float eps,
                const Tensor& out, float w_offset = 0.0f) override {
    in_.add_norm(x, delta, norm, w, b, eps, out, w_offset);
  }
  void split_qkv_store(const Tensor& qkv, const Tensor& pos, const Tensor& inv_freq, const Tensor& q, const Tensor& slots,
                       const Tensor& cache_k, const Tensor& cache_v) override {
    in_.split_qkv_store(qkv, pos, inv_freq, q, slots, cache_k, cache_v);
  }
  void split_qkv(const Tensor& qkv, const Tensor& pos, const Tensor& inv_freq, const Tensor& q, const Tensor& k,
                 const Tensor& v) override {
    in_.split_qkv(qkv, pos, inv_freq, q, k, v);
  }
  void kv_store(const Tensor& k, const Tensor& v, const Tensor& ck, const Tensor& cv, const Tensor& slots,
                const Tensor& pos) override {
    in_.kv_store(k, v, ck, cv, slots, pos);
  }
  void attention(const Tensor& q, const Tensor& ck, const Tensor& cv, const Tensor& slots, const Tensor& pos,
                 const AttentionSpec& spec, const Tensor& out) override {
    in_.attention(q, ck, cv, slots, pos, spec, out);
  }
  void gather_rows(const Tensor& x, const Tensor& rows, const Tensor& out) override { in_.gather_rows(x, rows, out); }
  void argmax_rows(const Tensor& logits, const Tensor& out) override { in_.argmax_rows(logits, out); }
  bool samples_on_device() const override { return in_.samples_on_device(); }
  void row_candidates(const Tensor& logits, const Tensor& temperatures, int64_t capacity, void* out) override {
    in_.row_candidates(logits, temperatures, capacity, out);
  }
  void target_ranks(const Tensor& logits, const Tensor& targets, void* out) override {
    in_.target_ranks(logits, targets, out);
  }
  void quantize_rows(const quant::QuantSpec& spec, const Tensor& x, void* q) override { in_.quantize_rows(spec, x, q); }
  void dequantize_rows(const quant::QuantSpec& spec, const void* q, const Tensor& out) override {
    in_.dequantize_rows(spec, q, out);
  }

protected:
  Backend& in_;
};

// Refuses the next `count` allocations of at least `min_bytes`, as a full device would.
class RefusingBackend final : public ForwardingBackend {
public:
  using ForwardingBackend::ForwardingBackend;
  void refuse(size_t min_bytes, int count) {
    min_bytes_ = min_bytes;
    count_ = count;
  }
  Buffer alloc(size_t bytes) override {
    if (count_ > 0 && bytes >= min_bytes_) {
      --count_;
      STRATA_FAIL("test backend: out of memory allocating " << bytes << " bytes");
    }
    return ForwardingBackend::alloc(bytes);
  }

private:
  size_t min_bytes_ = 0;
  int count_ = 0;
};

// Records the sizes of the copies to the host (to tell a full row's copy from a step's) and the
// launches of row_candidates.
class CopyCountingBackend : public ForwardingBackend {
public:
  using ForwardingBackend::ForwardingBackend;
  void copy_to_host(void* d, const void* s, size_t n) override {
    copies.push_back(n);
    ForwardingBackend::copy_to_host(d, s, n);
  }
  void row_candidates(const Tensor& logits, const Tensor& temperatures, int64_t capacity, void* out) override {
    ++candidate_launches;
    ForwardingBackend::row_candidates(logits, temperatures, capacity, out);
  }
  std::vector<size_t> copies;
  int candidate_launches = 0;
};

}  // namespace strata::test
