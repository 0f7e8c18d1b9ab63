// OLMo 2 (Olmo2ForCausalLM, GGUF olmo2): LLaMA's layer with its norms after the attention and the
// MLP instead of before them, and q and k normed over all their heads at once; OLMo 3
// (Olmo3ForCausalLM, GGUF olmo2 with a window): the same with sliding-window layers (logits and
// greedy tokens against transformers: test_model_hf.cpp for the directories, test_gguf.cpp for the
// files; every placement: test_offload.cpp).
#include "test_paths.h"
#include "temp_files.h"
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

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

TEST_CASE("OLMo 3: sliding layers with their own RoPE base, YaRN and its factor on the full layers only",
          "[config][rope]") {
  const fs::path dir = fs::path(STRATA_FIXTURES_DIR) / "models" / "tiny-olmo3";
  const ModelBundle b = open_model(dir.string());
  const ModelConfig& c = b.config;
  CHECK_FALSE(c.pre_norms);
  CHECK(c.qk_norm_whole);
  CHECK(c.layer_window == 8);
  CHECK(c.window_layers == std::vector<int>{0, 1, 2});
  CHECK(c.rope_theta == 10000.0f);
  CHECK(c.local_rope_theta == 5000.0f);
  REQUIRE(c.rope_freq_factors.size() == 8);  // YaRN's divisors, the full layers' only
  // transformers' YaRN attention factor 0.1 ln(4) + 1 scales the full layer's scores by its square.
  const double factor = 0.1 * std::log(4.0) + 1.0;
  CHECK(c.attention_scale(3) == Approx(factor * factor / 4.0).epsilon(1e-6));
  CHECK(c.attention_scale(0) == Approx(0.25).epsilon(1e-7));
  const std::vector<float> inv = rope_inv_freq(c);
  REQUIRE(inv.size() == 16);  // the full layers' row, then the sliding layers' plain one
  CHECK(inv[8 + 1] == Approx(1.0 / std::pow(5000.0, 2.0 / 16.0)).epsilon(1e-6));
  CHECK(inv[7] < float(1.0 / std::pow(10000.0, 14.0 / 16.0)));  // the lowest frequency interpolated
  CHECK(c.rope_row(0) == 1);
  CHECK(c.rope_row(3) == 0);

  // The Hub's layout before transformers 5 (rope_theta and rope_scaling at the top, no
  // rope_parameters): the sliding layers rotate with rope_theta.
  nlohmann::json cfg = nlohmann::json::parse(test::read_file(dir / "config.json"));
  cfg.erase("rope_parameters");
  cfg.erase("layer_types");  // transformers' default: every fourth layer full
  const ModelConfig classic = config_from_hf_json_text(cfg.dump(), "olmo3/config.json");
  CHECK(classic.local_rope_theta == 10000.0f);
  CHECK(classic.window_layers == std::vector<int>{0, 1, 2});
  CHECK(classic.rope_freq_factors == c.rope_freq_factors);
  cfg["sliding_window"] = 0;
  CHECK_THROWS_WITH(config_from_hf_json_text(cfg.dump(), "olmo3/config.json"),
                    Catch::Contains("olmo3/config.json: sliding_window 0 is not positive"));
}
