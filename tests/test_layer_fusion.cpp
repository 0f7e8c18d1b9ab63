// A layer in fewer passes (issue 35, points 1 and 2). The stacked projections: a layer's q, k and v
// rows, and SwiGLU's gate and up, lie back to back in its block, so each runs as one GEMM; the ops
// that take their outputs apart (split_qkv, swiglu). The residual add fused with the next norm
// (add_norm). Each op against a float64 reference with poisoned outputs; Hugging Face parity over
// every family (test_model_hf, test_offload) checks the whole forward pass through them.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "kernel_test_support.h"
#include "strata/backend/backend.h"
#include "strata/model/config.h"
#include "strata/quant/quant.h"
#include "strata/runtime/model_weights.h"

using namespace strata;
using namespace strata::test;

namespace {

std::vector<float> nans(size_t n) { return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()); }

using Host = CpuTensors;

void check_close(const float* got, const double* want, size_t n, double tol, const std::string& what) {
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i)
    if (!(std::fabs(double(got[i]) - want[i]) <= tol * (1.0 + std::fabs(want[i])))) {
      if (bad++ == 0) INFO(what << ": element " << i << " is " << got[i] << ", want " << want[i]);
    }
  INFO(what);
  CHECK(bad == 0);
}

// Configs of every layout shape: OPT (biases on q, k, v; no gate), LLaMA with GQA, Qwen2 (biases
// and GQA), Qwen3 (per-head norms), each cut to two layers.
std::vector<ModelConfig> layout_configs() {
  std::vector<ModelConfig> out;
  for (const char* name : {"opt-125m", "llama-3-8b", "qwen2-7b", "qwen3-8b"}) {
    ModelConfig c = *config_preset(name);
    c.n_layers = 2;
    out.push_back(c);
  }
  return out;
}

}  // namespace

TEST_CASE("cpu backend: split_qkv splits and rotates the stacked rows as a float64 reference does",
          "[weights][backend]") {
  std::mt19937 rng(11);
  for (auto [heads, kv_heads, d] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {6, 6, 20}, {8, 2, 64}, {4, 1, 128}, {3, 3, 2}}) {
    for (int64_t T : {1, 3, 17}) {
      for (bool rotate : {true, false}) {
        Host h;
        std::vector<int32_t> pos(static_cast<size_t>(T));
        for (int32_t& p : pos) p = int32_t(rng() % 5000);
        pos[0] = 131071;  // a long position: the fp32 angle, not a reduced one
        const int64_t qd = heads * d, kvd = kv_heads * d;
        const std::vector<float> qkv = random_floats(size_t(T * (qd + 2 * kvd)), rng, -2.0f, 2.0f, false);
        const std::vector<float> inv = rotate ? rope_inv_freq_of(d) : std::vector<float>();
        Tensor q = h.f32(nans(size_t(T * qd)), {T, heads, d});
        Tensor k = h.f32(nans(size_t(T * kvd)), {T, kv_heads, d});
        Tensor v = h.f32(nans(size_t(T * kvd)), {T, kv_heads, d});
        h.be->split_qkv(h.f32(qkv, {T, qd + 2 * kvd}), h.i32(pos), rotate ? h.f32(inv, {d / 2}) : Tensor(), q, k, v);
        const std::vector<double> want = split_qkv_reference(qkv, pos, inv, heads, kv_heads, d);
        const std::string what = "heads " + std::to_string(heads) + "/" + std::to_string(kv_heads) + " d " +
                                 std::to_string(d) + " T " + std::to_string(T) + (rotate ? " rotated" : " copied");
        check_close(q.ptr<float>(), want.data(), size_t(T * qd), 1e-5, what + ": q");
        check_close(k.ptr<float>(), want.data() + T * qd, size_t(T * kvd), 1e-5, what + ": k");
        check_close(v.ptr<float>(), want.data() + T * (qd + kvd), size_t(T * kvd), 0.0, what + ": v");
      }
    }
  }
}

TEST_CASE("cpu backend: split_qkv_store puts k and v in their cache rows and leaves the others", "[weights][backend]") {
  std::mt19937 rng(14);
  const int64_t S = 3, C = 9;
  for (auto [heads, kv_heads, d] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{6, 2, 20}, {4, 4, 64}}) {
    for (bool rotate : {true, false}) {
      Host h;
      const std::vector<int32_t> slots{2, 0, 2, 1}, pos{0, 8, 5, 3};
      const int64_t T = 4, qd = heads * d, kvd = kv_heads * d;
      const std::vector<float> qkv = random_floats(size_t(T * (qd + 2 * kvd)), rng, -2.0f, 2.0f, false);
      const std::vector<float> inv = rotate ? rope_inv_freq_of(d) : std::vector<float>();
      const std::vector<float> old_k = random_floats(size_t(S * C * kvd), rng, 5.0f, 6.0f, false);
      const std::vector<float> old_v = random_floats(size_t(S * C * kvd), rng, 5.0f, 6.0f, false);
      Tensor q = h.f32(nans(size_t(T * qd)), {T, heads, d});
      Tensor ck = h.f32(old_k, {S, C, kv_heads, d}), cv = h.f32(old_v, {S, C, kv_heads, d});
      h.be->split_qkv_store(h.f32(qkv, {T, qd + 2 * kvd}), h.i32(pos), rotate ? h.f32(inv, {d / 2}) : Tensor(), q,
                            h.i32(slots), ck, cv);
      const std::vector<double> want = split_qkv_reference(qkv, pos, inv, heads, kv_heads, d);
      const std::vector<double> want_k = caches_after_store(old_k, want, slots, pos, qd, kvd, S, C).first;
      const std::vector<double> want_v = caches_after_store(old_v, want, slots, pos, qd, kvd, S, C).second;
      const std::string what = "heads " + std::to_string(heads) + "/" + std::to_string(kv_heads) + (rotate ? " rotated" : "");
      check_close(q.ptr<float>(), want.data(), size_t(T * qd), 1e-5, what + ": q");
      check_close(ck.ptr<float>(), want_k.data(), want_k.size(), 1e-5, what + ": cache k");
      check_close(cv.ptr<float>(), want_v.data(), want_v.size(), 0.0, what + ": cache v");
      CHECK_THROWS_WITH(h.be->split_qkv_store(h.f32(qkv, {T, qd + 2 * kvd}), h.i32({0, 9, 0, 0}), Tensor(), q,
                                              h.i32(slots), ck, cv),
                        Catch::Contains("position 9 outside the cache"));
    }
  }
}

TEST_CASE("cpu backend: split_qkv_store into quantized caches stores the codes of the split rows", "[weights][backend][quant]") {
  // The split rows (checked against float64 above), quantized by the host reference into their
  // cache rows; the others keep their bytes.
  std::mt19937 rng(15);
  const int64_t S = 3, C = 9, T = 4, heads = 6, kv_heads = 2, d = 20, qd = heads * d, kvd = kv_heads * d;
  const std::vector<int32_t> slots{2, 0, 2, 1}, pos{0, 8, 5, 3};
  for (const quant::QuantSpec spec : {quant::QuantSpec{4, 32}, quant::QuantSpec{8, 64}}) {
    Host h;
    const std::vector<float> qkv = random_floats(size_t(T * (qd + 2 * kvd)), rng, -2.0f, 2.0f, false);
    const std::vector<float> inv = rope_inv_freq_of(d);
    const size_t row_bytes = quant::row_bytes(spec, d), cache_bytes = size_t(S * C * kv_heads) * row_bytes;
    std::vector<uint8_t> ck(cache_bytes), cv(cache_bytes);
    for (uint8_t& b : ck) b = uint8_t(rng());
    cv = ck;
    std::vector<uint8_t> want_k = ck, want_v = cv;
    Tensor q = h.f32(nans(size_t(T * qd)), {T, heads, d});
    Tensor k = h.f32(nans(size_t(T * kvd)), {T, kv_heads, d}), v = h.f32(nans(size_t(T * kvd)), {T, kv_heads, d});
    h.be->split_qkv(h.f32(qkv, {T, qd + 2 * kvd}), h.i32(pos), h.f32(inv, {d / 2}), q, k, v);
    for (int64_t t = 0; t < T; ++t) {
      const size_t at = size_t((slots[size_t(t)] * C + pos[size_t(t)]) * kv_heads) * row_bytes;
      quant::quantize_rows(spec, k.ptr<float>() + t * kvd, DType::F32, kv_heads, d, want_k.data() + at);
      quant::quantize_rows(spec, v.ptr<float>() + t * kvd, DType::F32, kv_heads, d, want_v.data() + at);
    }
    const DType qt = quant::dtype_of(spec);
    const Tensor cache_k = Tensor::quantized(ck.data(), qt, spec.group_size, Device::CPU, {S, C, kv_heads, d});
    const Tensor cache_v = Tensor::quantized(cv.data(), qt, spec.group_size, Device::CPU, {S, C, kv_heads, d});
    Tensor q2 = h.f32(nans(size_t(T * qd)), {T, heads, d});
    h.be->split_qkv_store(h.f32(qkv, {T, qd + 2 * kvd}), h.i32(pos), h.f32(inv, {d / 2}), q2, h.i32(slots), cache_k,
                          cache_v);
    INFO(spec.bits << "-bit, group " << spec.group_size);
    CHECK(std::memcmp(q2.ptr<float>(), q.ptr<float>(), size_t(T * qd) * 4) == 0);
    CHECK(ck == want_k);
    CHECK(cv == want_v);
  }
}

TEST_CASE("cpu backend: swiglu over the stacked gate/up rows matches a float64 reference", "[weights][backend]") {
  std::mt19937 rng(12);
  for (int64_t T : {1, 5}) {
    for (int64_t f : {1, 7, 300}) {
      Host h;
      const std::vector<float> gu = random_floats(size_t(T * 2 * f), rng, -6.0f, 6.0f, false);
      Tensor out = h.f32(nans(size_t(T * f)), {T, f});
      h.be->swiglu(h.f32(gu, {T, 2 * f}), out);
      check_close(out.ptr<float>(), swiglu_reference(gu, T, f).data(), size_t(T * f), 1e-6,
                  "T " + std::to_string(T) + " f " + std::to_string(f));
    }
  }
  Host h;
  const Tensor gu = h.f32(std::vector<float>(8), {2, 4});
  CHECK_THROWS_WITH(h.be->swiglu(gu, h.f32(std::vector<float>(6), {2, 3})), Catch::Contains("swiglu"));
}

TEST_CASE("cpu backend: GPT-OSS's clamped swiglu matches a float64 reference", "[weights][backend]") {
  std::mt19937 rng(14);
  for (int64_t T : {1, 5})
    for (int64_t f : {1, 7, 300})
      for (float limit : {1.5f, 7.0f}) {  // values in [-6, 6]: a limit that clamps many, and one that clamps none
        Host h;
        const std::vector<float> gu = random_floats(size_t(T * 2 * f), rng, -6.0f, 6.0f, false);
        Tensor out = h.f32(nans(size_t(T * f)), {T, f});
        h.be->clamped_swiglu(h.f32(gu, {T, 2 * f}), out, limit, 1.702f);
        check_close(out.ptr<float>(), clamped_swiglu_reference(gu, T, f, limit, 1.702f).data(), size_t(T * f), 1e-6,
                    "T " + std::to_string(T) + " f " + std::to_string(f) + " limit " + std::to_string(limit));
      }
}

TEST_CASE("a layer block stacks q, k, v (and their biases) and gate, up into one matrix each", "[weights]") {
  for (const ModelConfig& cfg : layout_configs()) {
    for (const std::optional<quant::QuantSpec>& comp : {std::optional<quant::QuantSpec>(), std::optional(spec_of(4, 64))}) {
      INFO(cfg.name << (comp ? ", 4-bit" : ", fp16"));
      const HalvedLayout halves = halved_layer_layout(cfg, 1, DType::F16, 4096, comp);
      std::vector<uint8_t> block(halves.layout.bytes);
      const LayerWeights w = layer_views(halves.layout, block.data(), Device::CPU);
      const int64_t qd = cfg.q_dim(), kvd = cfg.kv_dim(), f = cfg.intermediate;
      REQUIRE_FALSE(w.qkv_w.empty());
      CHECK(w.qkv_w.data == w.q_w.data);
      CHECK(w.qkv_w.dim(0) == qd + 2 * kvd);
      CHECK(w.qkv_w.dim(1) == cfg.hidden);
      CHECK(w.qkv_w.dtype == w.q_w.dtype);
      CHECK(w.qkv_w.nbytes() == w.q_w.nbytes() + w.k_w.nbytes() + w.v_w.nbytes());
      CHECK(static_cast<char*>(w.k_w.data) == static_cast<char*>(w.q_w.data) + w.q_w.nbytes());
      CHECK(static_cast<char*>(w.v_w.data) == static_cast<char*>(w.k_w.data) + w.k_w.nbytes());
      CHECK(w.qkv_b.empty() == !cfg.qkv_bias);
      if (cfg.qkv_bias) {
        CHECK(w.qkv_b.data == w.q_b.data);
        CHECK(w.qkv_b.numel() == qd + 2 * kvd);
        CHECK(static_cast<char*>(w.v_b.data) == static_cast<char*>(w.q_b.data) + (qd + kvd) * 2);
      }
      CHECK(w.gate_up_w.empty() == !cfg.gated_mlp());
      if (!w.gate_up_w.empty()) {
        CHECK(w.gate_up_w.data == w.fc1_w.data);
        CHECK(w.gate_up_w.dim(0) == 2 * f);
        CHECK(static_cast<char*>(w.up_w.data) == static_cast<char*>(w.fc1_w.data) + w.fc1_w.nbytes());
      }
      // Either half alone, as the offloading engine streams it, has the same stacks.
      const LayerWeights attn = layer_views(half_block_layout(halves, 0), block.data(), Device::CPU);
      CHECK(attn.qkv_w.dim(0) == qd + 2 * kvd);
      const LayerWeights mlp = layer_views(half_block_layout(halves, 1), block.data() + halves.mlp_offset, Device::CPU);
      CHECK(mlp.gate_up_w.empty() == !cfg.gated_mlp());
      CHECK(mlp.fc2_w.data == static_cast<const void*>(static_cast<const char*>(w.fc2_w.data)));
    }
  }
}

TEST_CASE("cpu backend: add_norm adds the residual and norms it as a float64 reference does", "[weights][backend]") {
  std::mt19937 rng(13);
  for (int64_t T : {1, 4}) {
    for (int64_t h : {1, 72, 1001}) {
      for (Backend::Norm norm : {Backend::Norm::Layer, Backend::Norm::Rms}) {
        for (bool bias : {false, true}) {
          if (bias && norm == Backend::Norm::Rms) continue;
          Host hst;
          const std::vector<float> x = random_floats(size_t(T * h), rng, -3.0f, 3.0f, false);
          const std::vector<float> d = random_floats(size_t(T * h), rng, -3.0f, 3.0f, false);
          const std::vector<float> w = random_floats(size_t(h), rng, 0.5f, 1.5f, false);
          const std::vector<float> b = random_floats(size_t(h), rng, -0.5f, 0.5f, false);
          const float eps = 1e-5f;
          std::vector<double> want_x(size_t(T * h)), want(size_t(T * h));
          for (int64_t r = 0; r < T; ++r) {
            double mean = 0, ss = 0;
            for (int64_t i = 0; i < h; ++i) {
              const double v = double(float(x[size_t(r * h + i)] + d[size_t(r * h + i)]));  // add() rounds to fp32
              want_x[size_t(r * h + i)] = v;
              mean += v / double(h);
            }
            for (int64_t i = 0; i < h; ++i) {
              const double v = want_x[size_t(r * h + i)] - (norm == Backend::Norm::Layer ? mean : 0.0);
              ss += v * v / double(h);
            }
            for (int64_t i = 0; i < h; ++i) {
              const double v = want_x[size_t(r * h + i)] - (norm == Backend::Norm::Layer ? mean : 0.0);
              want[size_t(r * h + i)] = v / std::sqrt(ss + eps) * w[size_t(i)] + (bias ? b[size_t(i)] : 0.0);
            }
          }
          Tensor tx = hst.f32(x, {T, h}), out = hst.f32(nans(size_t(T * h)), {T, h});
          hst.be->add_norm(tx, hst.f32(d, {T, h}), norm, hst.f32(w, {h}), bias ? hst.f32(b, {h}) : Tensor(), eps, out);
          const std::string what = std::string(norm == Backend::Norm::Layer ? "layer" : "rms") + (bias ? "+bias" : "") +
                                   " T " + std::to_string(T) + " h " + std::to_string(h);
          check_close(tx.ptr<float>(), want_x.data(), size_t(T * h), 0.0, what + ": x");
          check_close(out.ptr<float>(), want.data(), size_t(T * h), 2e-5, what + ": out");
          // out may alias delta: the output projection's buffer takes the normed input.
          Tensor tx2 = hst.f32(x, {T, h}), delta = hst.f32(d, {T, h});
          hst.be->add_norm(tx2, delta, norm, hst.f32(w, {h}), bias ? hst.f32(b, {h}) : Tensor(), eps, delta);
          check_close(delta.ptr<float>(), want.data(), size_t(T * h), 2e-5, what + ": out aliasing delta");
        }
      }
    }
  }
}
