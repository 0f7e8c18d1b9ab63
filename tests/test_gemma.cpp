// Gemma 2 and 3: their config.json files (transformers 5's and the Hub's older keys), the
// multimodal Gemma 3's text model, the (1 + w) norms and hidden vision tensors of the weight
// source, the per-layer attention settings, refusals naming the field, and the presets' sizes.
// Parity with transformers itself: test_model_hf.cpp (tiny-gemma2, tiny-gemma3, tiny-gemma3-mm).
#include "test_paths.h"
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "strata/backend/backend.h"
#include "strata/core/error.h"
#include "strata/model/config.h"
#include "strata/model/model_loader.h"
#include "strata/model/weight_source.h"
#include "strata/runtime/forward_ops.h"
#include "edited_model.h"
#include "temp_files.h"
#include "test_support.h"

using namespace strata;
using Catch::Matchers::Contains;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string kModels = std::string(STRATA_FIXTURES_DIR) + "/models/";

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

fs::path edited_model(const std::string& model, const std::function<void(json&)>& edit) {
  return test::edited_model(model, edit, "gemma");
}

void refused(const std::string& model, const std::function<void(json&)>& edit, const std::string& says) {
  const fs::path dir = edited_model(model, edit);
  INFO(says);
  CHECK_THROWS_WITH(config_from_hf_json(dir / "config.json"), Contains(says) && Contains("config.json"));
}

}  // namespace

TEST_CASE("gemma: Gemma 2's and Gemma 3's config.json map onto ModelConfig", "[gemma][config]") {
  const ModelConfig g2 = config_from_hf_json(kModels + "tiny-gemma2/config.json");
  CHECK(g2.mlp == MlpKind::GeGLU);
  CHECK(g2.norm_plus_one);
  CHECK(g2.sandwich_norms);
  CHECK_FALSE(g2.qk_norm);
  CHECK(g2.tied_embeddings);
  CHECK(g2.embed_scale == std::sqrt(64.0f));
  CHECK(g2.attention_scale() == 1.0f / std::sqrt(24.0f));  // query_pre_attn_scalar, not head_dim 16
  CHECK(g2.attn_softcap == 5.0f);
  CHECK(g2.final_softcap == 10.0f);
  CHECK(g2.layer_window == 8);
  CHECK(g2.window_layers == std::vector<int>{0, 2});  // Gemma 2's even layers
  CHECK(g2.local_rope_theta == 0.0f);
  CHECK(g2.max_positions == 128);  // the window does not cut the context, as for Mistral
  CHECK(g2.eos_ids == std::vector<int>{1});
  CHECK(g2.bos_id == 2);

  const ModelConfig g3 = config_from_hf_json(kModels + "tiny-gemma3/config.json");
  CHECK(g3.qk_norm);
  CHECK(g3.head_dim == 32);
  CHECK(g3.q_dim() == 128);
  CHECK(g3.attn_softcap == 0.0f);
  CHECK(g3.final_softcap == 0.0f);
  CHECK(g3.window_layers == std::vector<int>{0, 1, 3});  // layer_types, not sliding_window_pattern (3)
  CHECK(g3.rope_theta == 1000000.0f);
  CHECK(g3.local_rope_theta == 10000.0f);
  CHECK(g3.rope_freq_factors == std::vector<float>(16, 4.0f));  // linear, the full layers' only
  const std::vector<float> inv = rope_inv_freq(g3);
  REQUIRE(inv.size() == 32);  // two rows of head_dim / 2
  CHECK(inv[1] == 1.0f / std::pow(1000000.0f, 2.0f / 32.0f) / 4.0f);
  CHECK(inv[16 + 1] == 1.0f / std::pow(10000.0f, 2.0f / 32.0f));

  // The multimodal checkpoint's text_config is the same text model.
  const ModelConfig mm = config_from_hf_json(kModels + "tiny-gemma3-mm/config.json");
  CHECK(mm.vocab_size == g3.vocab_size);
  CHECK(mm.window_layers == g3.window_layers);
  CHECK(mm.rope_freq_factors == g3.rope_freq_factors);
  CHECK(mm.local_rope_theta == g3.local_rope_theta);
  CHECK(mm.attention_scale() == g3.attention_scale());
  CHECK(mm.eos_ids == g3.eos_ids);
}

TEST_CASE("gemma: a Gemma 3 config.json in the Hub's older keys runs as transformers 5's", "[gemma][config]") {
  // No layer_types and no rope_parameters: sliding_window_pattern (3: layers 0, 1 and 3 slide,
  // as tiny-gemma3's layer_types say), rope_theta with rope_scaling for the full layers and
  // rope_local_base_freq for the sliding ones. Transformers' greedy tokens must follow.
  const fs::path dir = edited_model("tiny-gemma3", [](json& c) {
    c.erase("layer_types");
    c.erase("rope_parameters");
  });
  const ModelBundle b = open_model(dir.string());
  CHECK(b.config.window_layers == std::vector<int>{0, 1, 3});
  test::check_hf_outputs(b, read_json(dir / "expected.json"));
}

TEST_CASE("gemma: per-layer attention: the window and soft cap, the RoPE row", "[gemma]") {
  const ModelConfig g3 = config_from_hf_json(kModels + "tiny-gemma3/config.json");
  std::vector<float> table = rope_inv_freq(g3);
  const Tensor rope(table.data(), DType::F32, Device::CPU, {int64_t(table.size())});
  const LayerAttention sliding = layer_attention(g3, rope, Tensor(), 0), full = layer_attention(g3, rope, Tensor(), 2);
  CHECK(sliding.spec.window == 8);
  CHECK(full.spec.window == 0);
  CHECK(sliding.inv_freq.data == table.data() + 16);  // the local row
  CHECK(full.inv_freq.data == table.data());
  CHECK(sliding.inv_freq.numel() == 16);
  const ModelConfig g2 = config_from_hf_json(kModels + "tiny-gemma2/config.json");
  CHECK(layer_attention(g2, Tensor(), Tensor(), 1).spec.softcap == 5.0f);
  CHECK(layer_attention(g2, Tensor(), Tensor(), 1).inv_freq.empty());

  // Window w: a token at position p sees (p - w, p].
  const AttentionSpec spec(1.0f, 8);
  CHECK(spec.first_key(0) == 0);
  CHECK(spec.first_key(7) == 0);
  CHECK(spec.first_key(8) == 1);
  CHECK(spec.first_key(100) == 93);
  CHECK(AttentionSpec(1.0f).first_key(100) == 0);
  CHECK(AttentionSpec(1.0f, 0, 2.0f).cap(100.0f) == Approx(2.0f));
  CHECK(AttentionSpec(1.0f).cap(100.0f) == 100.0f);
}

TEST_CASE("gemma: norms read as stored (the norm adds the 1) and a multimodal checkpoint's vision tensors stay hidden",
          "[gemma][safetensors]") {
  const ModelBundle b = open_model(kModels + "tiny-gemma3-mm");
  const std::vector<std::string> names = b.weights->names();
  for (const std::string& n : names) {
    INFO(n);
    CHECK(n.find("vision") == std::string::npos);
    CHECK(n.find("multi_modal_projector") == std::string::npos);
    CHECK(n.rfind("language_model.", 0) == std::string::npos);
  }
  CHECK(b.weights->contains("model.layers.0.post_feedforward_layernorm.weight"));

  const std::unique_ptr<WeightSource> raw = make_safetensors_source(kModels + "tiny-gemma3-mm");
  auto read = [](const WeightSource& s, const std::string& name) {
    size_t n = 1;
    for (int64_t d : s.shape(name)) n *= size_t(d);
    std::vector<float> v(n);
    s.read(name, DType::F32, v.data());
    return v;
  };
  for (const char* norm : {"model.layers.1.self_attn.q_norm.weight", "model.norm.weight",
                           "model.layers.0.pre_feedforward_layernorm.weight"}) {
    const std::vector<float> stored = read(*raw, std::string("language_model.") + norm), shown = read(*b.weights, norm);
    REQUIRE(stored.size() == shown.size());
    CHECK(shown == stored);
  }
  // Projections as stored.
  CHECK(read(*b.weights, "model.layers.0.self_attn.o_proj.weight") ==
        read(*raw, "language_model.model.layers.0.self_attn.o_proj.weight"));
}

TEST_CASE("gemma: a config.json it cannot serve is refused naming the field", "[gemma][config]") {
  refused("tiny-gemma3", [](json& c) { c["layer_types"] = json::array({"sliding_attention"}); }, "layer_types");
  refused("tiny-gemma3", [](json& c) { c["layer_types"][1] = "chunked_attention"; }, "layer_types[1]");
  refused("tiny-gemma3", [](json& c) { c["use_bidirectional_attention"] = true; }, "use_bidirectional_attention");
  refused("tiny-gemma3", [](json& c) { c["hidden_activation"] = "gelu"; }, "hidden_activation 'gelu'");
  refused("tiny-gemma3", [](json& c) { c["sliding_window"] = 0; }, "sliding_window 0");
  refused("tiny-gemma3", [](json& c) { c["rope_parameters"]["sliding_attention"]["rope_type"] = "yarn"; },
          "sliding layers' rope type 'yarn'");
  refused("tiny-gemma3", [](json& c) { c["rope_parameters"]["full_attention"]["rope_type"] = "llama3"; }, "'llama3'");
  refused("tiny-gemma2", [](json& c) { c["attn_logit_softcapping"] = -1.0; }, "attn_logit_softcapping");
  refused("tiny-gemma2", [](json& c) { c["query_pre_attn_scalar"] = 0; }, "query_pre_attn_scalar");
  refused("tiny-gemma3-mm", [](json& c) { c.erase("text_config"); }, "text_config");
}

TEST_CASE("gemma: the presets have the published sizes", "[gemma][config]") {
  // Parameter counts of the checkpoints (Gemma 3 12B and 27B: the text model; their vision tower
  // adds about 0.4B): google/gemma-2-9b 9.24B, gemma-2-27b 27.2B, gemma-3-1b-pt 1.00B,
  // gemma-3-12b-pt 11.8B, gemma-3-27b-pt 27.0B.
  const std::pair<const char*, double> sizes[] = {
      {"gemma-2-9b", 9.24e9}, {"gemma-2-27b", 27.2e9}, {"gemma-3-1b", 1.00e9}, {"gemma-3-12b", 11.8e9},
      {"gemma-3-27b", 27.0e9}};
  for (const auto& [name, size] : sizes) {
    const std::optional<ModelConfig> c = config_preset(name);
    REQUIRE(c.has_value());
    INFO(name << ": " << c->param_count());
    CHECK(double(c->param_count()) == Approx(size).epsilon(0.01));
    CHECK(c->norm_plus_one);
    CHECK(c->window_layer(0));
    CHECK_FALSE(c->window_layer(std::string(name).starts_with("gemma-2") ? 1 : 5));
  }
}
