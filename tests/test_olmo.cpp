// OLMo 2 (Olmo2ForCausalLM, GGUF olmo2): LLaMA's layer with its norms after the attention and the
// MLP instead of before them, and q and k normed over all their heads at once (logits and greedy
// tokens against transformers: test_model_hf.cpp for the directory, test_gguf.cpp for the file;
// every placement: test_offload.cpp).
#include "test_paths.h"
#include <catch2/catch.hpp>
#include <filesystem>
#include <numeric>

#include "strata/model/model_loader.h"
#include "strata/model/weight_specs.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {
const fs::path kDir = fs::path(STRATA_FIXTURES_DIR) / "models" / "tiny-olmo2";

std::vector<std::string> layer_names(const ModelConfig& c) {
  std::vector<std::string> names;
  for (const WeightSpec& s : layer_weight_specs(c, 1)) names.push_back(s.name);
  return names;
}
}  // namespace

TEST_CASE("OLMo 2: norms only after each block, q and k normed whole", "[config]") {
  const ModelBundle b = open_model(kDir.string());
  const ModelConfig& c = b.config;
  CHECK_FALSE(c.pre_norms);
  CHECK(c.sandwich_norms);
  CHECK(c.qk_norm);
  CHECK(c.qk_norm_whole);
  CHECK_FALSE(c.norm_plus_one);
  CHECK_FALSE(c.tied_embeddings);
  // transformers' Olmo2DecoderLayer's tensors, and no others: loading checks each against the file.
  const std::vector<std::string> want = {
      "model.layers.1.self_attn.q_norm.weight", "model.layers.1.self_attn.k_norm.weight",
      "model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight",
      "model.layers.1.self_attn.v_proj.weight", "model.layers.1.self_attn.o_proj.weight",
      "model.layers.1.post_attention_layernorm.weight", "model.layers.1.mlp.gate_proj.weight",
      "model.layers.1.mlp.up_proj.weight", "model.layers.1.mlp.down_proj.weight",
      "model.layers.1.post_feedforward_layernorm.weight"};
  CHECK(layer_names(c) == want);
  for (const WeightSpec& s : layer_weight_specs(c, 0)) {
    INFO(s.name);
    if (s.role == WeightRole::QNormW) CHECK(s.shape == std::vector<int64_t>{c.q_dim()});   // 64, not head_dim 16
    if (s.role == WeightRole::KNormW) CHECK(s.shape == std::vector<int64_t>{c.kv_dim()});  // 32
  }
  // The count the cost model charges is the tensors' (no pre-norms, whole-width q/k norms).
  int64_t spec_sum = 0;
  for (int l = 0; l < c.n_layers; ++l)
    for (const WeightSpec& s : layer_weight_specs(c, l)) spec_sum += s.numel();
  for (const WeightSpec& s : global_weight_specs(c)) spec_sum += s.numel();
  CHECK(c.param_count() == spec_sum);
}

TEST_CASE("OLMo 2: the 32B preset's shape", "[config]") {
  const std::optional<ModelConfig> c = config_preset("olmo-2-32b");
  REQUIRE(c);
  int64_t spec_sum = 0;
  for (const WeightSpec& s : layer_weight_specs(*c, 0)) spec_sum += s.numel();
  CHECK(c->layer_param_count() == spec_sum);
  CHECK(c->q_dim() == 5120);
  CHECK(c->kv_dim() == 1024);
}
