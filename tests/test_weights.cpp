// Loading weights onto a backend: every tensor the config implies, no more, with the right shapes.
#include <catch2/catch.hpp>

#include <algorithm>

#include "strata/backend/backend.h"
#include "strata/core/dtype.h"
#include "strata/core/error.h"
#include "strata/model/weight_specs.h"
#include "strata/runtime/model_weights.h"

using namespace strata;

namespace {

// Wraps a source and hides, adds or reshapes one tensor.
class AlteredSource final : public WeightSource {
public:
  AlteredSource(std::unique_ptr<WeightSource> inner, std::string hide, std::string extra, std::string reshape)
      : inner_(std::move(inner)), hide_(std::move(hide)), extra_(std::move(extra)), reshape_(std::move(reshape)) {}
  std::string describe() const override { return "altered"; }
  bool contains(const std::string& n) const override { return n == extra_ || (n != hide_ && inner_->contains(n)); }
  std::vector<int64_t> shape(const std::string& n) const override {
    if (n == extra_) return {3};
    std::vector<int64_t> s = inner_->shape(n);
    if (n == reshape_) s[0] += 1;
    return s;
  }
  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    for (const std::string& n : inner_->names())
      if (n != hide_) out.push_back(n);
    if (!extra_.empty()) out.push_back(extra_);
    return out;
  }

private:
  void read_into(const std::string& n, DType dt, void* dst, ThreadPool* pool) const override {
    if (n != extra_) inner_->read(n, dt, dst, pool);
  }
  std::unique_ptr<WeightSource> inner_;
  std::string hide_, extra_, reshape_;
};

ModelConfig small_opt() {
  ModelConfig c = *config_preset("opt-125m");
  c.n_layers = 2;
  c.vocab_size = 100;
  c.max_positions = 16;
  return c;
}

}  // namespace

TEST_CASE("weight specs follow the Hugging Face names of each architecture", "[weights]") {
  const ModelConfig opt = small_opt();
  const auto specs = layer_weight_specs(opt, 1);
  CHECK(specs.size() == 16);  // OPT: 2 norms x (w, b), q/k/v/o x (w, b), fc1/fc2 x (w, b)
  CHECK(specs[0].name == "model.decoder.layers.1.self_attn_layer_norm.weight");
  ModelConfig llama = *config_preset("llama-3-8b");
  const auto lspecs = layer_weight_specs(llama, 0);
  CHECK(lspecs.size() == 9);  // 2 norms, q/k/v/o, gate/up/down
  CHECK(lspecs[1].name == "model.layers.0.self_attn.q_proj.weight");
  CHECK(lspecs[2].shape == std::vector<int64_t>{1024, 4096});  // k_proj: 8 kv heads x 128
  int64_t n = 0;
  for (const auto& s : lspecs) n += s.numel();
  CHECK(n == llama.layer_param_count());
  CHECK(is_ignorable_weight(llama, "model.layers.0.self_attn.rotary_emb.inv_freq"));
  CHECK_FALSE(is_ignorable_weight(llama, "lm_head.weight"));
}

TEST_CASE("missing, extra and misshapen tensors are errors that name them", "[weights]") {
  const ModelConfig cfg = small_opt();
  auto backend = make_cpu_backend(1);
  auto load = [&](const std::string& hide, const std::string& extra, const std::string& reshape) {
    AlteredSource src(make_dummy_source(cfg), hide, extra, reshape);
    return load_model_weights(cfg, src, *backend);
  };
  CHECK_NOTHROW(load("", "", ""));
  CHECK_THROWS_WITH(load("model.decoder.layers.1.fc2.bias", "", ""),
                    Catch::Contains("missing tensor 'model.decoder.layers.1.fc2.bias'"));
  CHECK_THROWS_WITH(load("", "model.decoder.layers.2.fc1.weight", ""),
                    Catch::Contains("unexpected tensor 'model.decoder.layers.2.fc1.weight'"));
  CHECK_THROWS_WITH(load("", "", "model.decoder.layers.0.self_attn.k_proj.weight"),
                    Catch::Contains("'model.decoder.layers.0.self_attn.k_proj.weight' has shape [769, 768]") &&
                        Catch::Contains("implies [768, 768]"));
}

TEST_CASE("dummy weights are deterministic and small", "[weights]") {
  const ModelConfig cfg = small_opt();
  auto a = make_dummy_source(cfg), b = make_dummy_source(cfg);
  std::vector<float> x(size_t(768 * 768)), y(x.size());
  a->read("model.decoder.layers.0.self_attn.q_proj.weight", DType::F32, x.data());
  b->read("model.decoder.layers.0.self_attn.q_proj.weight", DType::F32, y.data());
  CHECK(x == y);
  float lo = 1, hi = -1;
  for (float v : x) lo = std::min(lo, v), hi = std::max(hi, v);
  CHECK(lo >= -0.02f);
  CHECK(hi <= 0.02f);
  CHECK(hi - lo > 0.03f);
  std::vector<float> norm(768);
  a->read("model.decoder.layers.0.final_layer_norm.weight", DType::F32, norm.data());
  CHECK(norm[5] == 1.0f);
}

TEST_CASE("dummy weights of a large tensor are filled in parallel, the same every time", "[weights]") {
  const ModelConfig cfg = small_opt();
  auto src = make_dummy_source(cfg);
  const std::string name = "model.decoder.layers.1.fc1.weight";  // 3072 x 768: above the one-thread size
  std::vector<float> x(size_t(3072 * 768)), y(x.size());
  std::vector<uint16_t> h(x.size());
  src->read(name, DType::F32, x.data());
  src->read(name, DType::F32, y.data());
  src->read(name, DType::F16, h.data());
  CHECK(x == y);
  size_t out_of_range = 0, half_mismatch = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    out_of_range += !(x[i] >= -0.02f && x[i] <= 0.02f);
    half_mismatch += h[i] != float_to_half(x[i]);
  }
  CHECK(out_of_range == 0);
  CHECK(half_mismatch == 0);
  // No two quarters of the tensor repeat each other (each thread's range has its own values).
  const size_t q = x.size() / 4;
  for (size_t a = 0; a < 4; ++a)
    for (size_t b = a + 1; b < 4; ++b) CHECK(!std::equal(x.begin() + a * q, x.begin() + a * q + 64, x.begin() + b * q));
}

TEST_CASE("ops on zero tokens are no-ops on the CPU backend", "[weights][backend]") {
  auto be = make_cpu_backend(1);
  Buffer x = be->alloc(64), w = be->alloc(4 * 8 * 4), y = be->alloc(64), ids = be->alloc(16);
  CHECK_NOTHROW(be->linear(x.view(0, DType::F32, {0, 8}), w.view(0, DType::F32, {4, 8}), Tensor(),
                           y.view(0, DType::F32, {0, 4})));
  CHECK_NOTHROW(be->argmax_rows(x.view(0, DType::F32, {0, 8}), ids.view(0, DType::I32, {0})));
}
