// GLM (glm-4-9b-chat-hf: GlmForCausalLM) and GLM-4 (GLM-4-0414: Glm4ForCausalLM) directories:
// LLaMA with fused gate_up_proj, q/k/v biases, RoPE over half of each head on interleaved pairs,
// and for GLM-4 a norm after the attention and one after the MLP (logits and greedy tokens against
// transformers: test_model_hf.cpp; the GGUF file: test_gguf.cpp).
#include "test_paths.h"
#include "temp_files.h"
#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "strata/backend/backend.h"
#include "strata/model/model_loader.h"
#include "strata/runtime/model_weights.h"
#include "strata/model/weight_specs.h"

using namespace strata;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {
const fs::path kModels = fs::path(STRATA_FIXTURES_DIR) / "models";

bool has_spec(const ModelConfig& c, const std::string& name) {
  for (const WeightSpec& s : layer_weight_specs(c, 0))
    if (s.name == name) return true;
  return false;
}
}  // namespace

TEST_CASE("GLM and GLM-4 directories: half of each head rotates on interleaved pairs, q/k/v biased", "[config][rope]") {
  for (const char* name : {"tiny-glm4", "tiny-glm"}) {
    INFO(name);
    const ModelBundle b = open_model((kModels / name).string());
    const bool glm4 = std::string(name) == "tiny-glm4";
    CHECK(b.config.rotary_dim == 8);  // of 16
    CHECK(b.config.rope_interleaved);
    CHECK(b.config.qkv_bias);
    CHECK_FALSE(b.config.o_bias);
    CHECK(b.config.sandwich_norms == glm4);
    CHECK_FALSE(b.config.norm_plus_one);
    const std::vector<float> inv = rope_inv_freq(b.config);
    REQUIRE(inv.size() == 8);  // head_dim / 2: four frequencies, then the passing dims' zeros
    CHECK(inv[1] == Approx(1.0 / std::pow(10000.0, 2.0 / 8.0)).epsilon(1e-6));
    CHECK(inv[4] == 0.0f);
    // GLM-4's names for its four norms; gate_up_proj shown as gate and up.
    CHECK(has_spec(b.config, "model.layers.0.post_attention_layernorm.weight"));
    CHECK(has_spec(b.config, "model.layers.0.post_self_attn_layernorm.weight") == glm4);
    CHECK(has_spec(b.config, "model.layers.0.post_mlp_layernorm.weight") == glm4);
    CHECK_FALSE(has_spec(b.config, "model.layers.0.pre_feedforward_layernorm.weight"));
    CHECK(b.weights->contains("model.layers.0.mlp.up_proj.weight"));
  }
}

TEST_CASE("GLM: a config.json without partial_rotary_factor rotates half the head, as transformers' default",
          "[config][rope]") {
  json cfg = json::parse(test::read_file(kModels / "tiny-glm4" / "config.json"));
  cfg["rope_parameters"].erase("partial_rotary_factor");
  CHECK(config_from_hf_json_text(cfg.dump(), "glm4/config.json").rotary_dim == 8);
  cfg["partial_rotary_factor"] = 1.0;  // the whole head: interleaved pairs over all 16 dims
  const ModelConfig whole = config_from_hf_json_text(cfg.dump(), "glm4/config.json");
  CHECK(whole.rotary_dims() == 16);
  CHECK(whole.rope_interleaved);
}

TEST_CASE("GLM-4's checkpoint read as GLM's is refused naming a sandwich norm it has no place for", "[config]") {
  const fs::path dir = test::temp_dir("glm4") / "tiny-glm4";
  fs::create_directories(dir);
  for (const auto& entry : fs::directory_iterator(kModels / "tiny-glm4"))
    fs::copy_file(entry.path(), dir / entry.path().filename(), fs::copy_options::overwrite_existing);
  json config = json::parse(test::read_file(dir / "config.json"));
  config["model_type"] = "glm";  // a GLM reads GLM-4's checkpoint: its extra norms are left over
  config["architectures"] = {"GlmForCausalLM"};
  test::write_file(dir / "config.json", config.dump());
  const ModelBundle b = open_model(dir.string());
  auto backend = make_cpu_backend(1);
  CHECK_THROWS_WITH(load_model_weights(b.config, *b.weights, *backend),
                    Catch::Contains("unexpected tensor 'model.layers.0.post_mlp_layernorm.weight'"));
}
