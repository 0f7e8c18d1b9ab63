// Phi-3 directories: LLaMA with fused qkv_proj and gate_up_proj, cut into q/k/v and gate/up by
// split_fused_projections (logits and greedy tokens against transformers: test_model_hf.cpp).
#include "test_paths.h"
#include "temp_files.h"
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "strata/core/error.h"
#include "strata/model/model_loader.h"

using namespace strata;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {
const fs::path kPhi3 = fs::path(STRATA_FIXTURES_DIR) / "models" / "tiny-phi3";
}  // namespace

TEST_CASE("a Phi-3 directory shows its fused projections as LLaMA's", "[config]") {
  const ModelBundle b = open_model(kPhi3.string());
  CHECK(b.config.arch == Arch::Llama);
  CHECK(b.config.max_positions == 64);  // the sliding window, not the 128 positions
  const std::vector<std::string> names = b.weights->names();
  for (const char* part : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"}) {
    const std::string name = "model.layers.0." + std::string(part) + ".weight";
    INFO(name);
    CHECK(std::count(names.begin(), names.end(), name) == 1);
  }
  CHECK(b.weights->shape("model.layers.0.self_attn.q_proj.weight") == std::vector<int64_t>{64, 64});
  CHECK(b.weights->shape("model.layers.0.self_attn.k_proj.weight") == std::vector<int64_t>{32, 64});
  CHECK(b.weights->shape("model.layers.0.mlp.up_proj.weight") == std::vector<int64_t>{96, 64});
  CHECK_FALSE(b.weights->contains("model.layers.0.self_attn.qkv_proj.weight"));
  CHECK_THROWS_WITH(b.weights->shape("model.layers.0.self_attn.qkv_proj.weight"), Catch::Contains("read in parts"));
}

TEST_CASE("a fused projection that does not fit the config is refused naming it", "[config]") {
  const fs::path dir = test::temp_dir("phi3") / "tiny-phi3";
  fs::create_directories(dir);
  for (const auto& entry : fs::directory_iterator(kPhi3))
    fs::copy_file(entry.path(), dir / entry.path().filename(), fs::copy_options::overwrite_existing);
  json config = json::parse(test::read_file(dir / "config.json"));
  config["intermediate_size"] = 80;
  test::write_file(dir / "config.json", config.dump());
  CHECK_THROWS_WITH(open_model(dir.string()),
                    Catch::Contains("mlp.gate_up_proj.weight' has 192 rows; the config's projections need 160"));
}

namespace {
const fs::path kLongrope = fs::path(STRATA_FIXTURES_DIR) / "models" / "tiny-phi3-longrope";
}  // namespace

TEST_CASE("LongRoPE: a config.json laid out as Phi-3.5 mini's gives transformers' frequencies and attention factor",
          "[config][rope]") {
  // longrope_phi35.json: transformers' ROPE_INIT_FUNCTIONS["longrope"] on that config (short factors,
  // as within the original 4096 positions), tests/fixtures/models/make_phi3_fixture.py --longrope.
  const json fx = json::parse(test::read_file(kLongrope.parent_path() / "longrope_phi35.json"));
  const ModelConfig c = config_from_hf_json_text(fx["config"].dump(), "phi35/config.json");
  CHECK(c.max_positions == 4096);  // the original context: past it transformers takes the long factors
  CHECK(c.head_dim == 96);
  CHECK(c.rope_attention_factor == Approx(fx["attention_factor"].get<double>()).epsilon(1e-6));
  const std::vector<float> inv = rope_inv_freq(c);
  const std::vector<double> want = fx["inv_freq"].get<std::vector<double>>();
  REQUIRE(inv.size() == want.size());
  for (size_t i = 0; i < inv.size(); ++i) {
    INFO("frequency " << i);
    CHECK(inv[i] == Approx(want[i]).epsilon(1e-6));
  }
  // The scores' scale: the factor applies to queries and keys alike.
  CHECK(c.attention_scale() == Approx(fx["attention_factor"].get<double>() * fx["attention_factor"].get<double>() /
                                      std::sqrt(96.0)).epsilon(1e-6));
  // An explicit attention_factor wins over the default; "su" is the older files' name.
  json cfg = fx["config"];
  cfg["rope_scaling"]["type"] = "su";
  cfg["rope_scaling"]["attention_factor"] = 1.5;
  CHECK(config_from_hf_json_text(cfg.dump(), "phi35/config.json").rope_attention_factor == 1.5f);
}

TEST_CASE("LongRoPE: malformed or misplaced scaling is refused naming the field", "[config][rope]") {
  const json fx = json::parse(test::read_file(kLongrope.parent_path() / "longrope_phi35.json"));
  json cfg = fx["config"];
  cfg["rope_scaling"]["short_factor"].erase(0);
  CHECK_THROWS_WITH(config_from_hf_json_text(cfg.dump(), "phi35/config.json"),
                    Catch::Contains("phi35/config.json: rope_scaling.short_factor has 47 values; head_dim / 2 is 48"));
  cfg = fx["config"];
  cfg["rope_scaling"].erase("short_factor");
  CHECK_THROWS_WITH(config_from_hf_json_text(cfg.dump(), "phi35/config.json"),
                    Catch::Contains("needs rope_scaling.short_factor"));
  cfg = fx["config"];
  cfg["rope_scaling"]["short_factor"][3] = -1.0;
  CHECK_THROWS_WITH(config_from_hf_json_text(cfg.dump(), "phi35/config.json"),
                    Catch::Contains("RoPE frequency factor -1 is not positive"));
  cfg = fx["config"];
  cfg["model_type"] = "llama";  // LongRoPE is Phi-3's: a llama config with it is not read as Phi-3's
  CHECK_THROWS_WITH(config_from_hf_json_text(cfg.dump(), "phi35/config.json"),
                    Catch::Contains("rope scaling type 'longrope' is not supported"));
}

TEST_CASE("LongRoPE: tiny-phi3-longrope's context stops at its original 64 positions", "[config][rope]") {
  const ModelBundle b = open_model(kLongrope.string());
  CHECK(b.config.max_positions == 64);  // of 256
  CHECK(b.config.rope_freq_factors.size() == 8);
  CHECK(b.config.rope_attention_factor == Approx(std::sqrt(1.0 + std::log(4.0) / std::log(64.0))).epsilon(1e-6));
}

namespace {
const fs::path kPhi4Mini = fs::path(STRATA_FIXTURES_DIR) / "models" / "tiny-phi4-mini";
}  // namespace

TEST_CASE("partial rotary: a config.json laid out as Phi-4-mini's gives transformers' frequencies, then zeros",
          "[config][rope]") {
  // longrope_phi4_mini.json: transformers' ROPE_INIT_FUNCTIONS["longrope"] on that config (96 of
  // 128 dims rotate: 48 frequencies), tests/fixtures/models/make_phi3_fixture.py --partial.
  const json fx = json::parse(test::read_file(kPhi4Mini.parent_path() / "longrope_phi4_mini.json"));
  json cfg = fx["config"];
  for (int layout = 0; layout < 2; ++layout) {
    INFO((layout == 0 ? "partial_rotary_factor at the root" : "under rope_parameters (transformers 5)"));
    if (layout == 1) {
      cfg["rope_parameters"] = {{"partial_rotary_factor", cfg["partial_rotary_factor"]}, {"rope_theta", 10000.0}};
      cfg.erase("partial_rotary_factor");
    }
    const ModelConfig c = config_from_hf_json_text(cfg.dump(), "phi4mini/config.json");
    CHECK(c.head_dim == 128);
    CHECK(c.rotary_dim == 96);
    CHECK(c.partial_rotary());
    CHECK(c.tied_embeddings);
    CHECK(c.max_positions == 4096);
    CHECK(c.rope_attention_factor == Approx(fx["attention_factor"].get<double>()).epsilon(1e-6));
    const std::vector<float> inv = rope_inv_freq(c);
    const std::vector<double> want = fx["inv_freq"].get<std::vector<double>>();
    REQUIRE(want.size() == 48);
    REQUIRE(inv.size() == 64);  // the table's row is head_dim / 2 wide: the passing dims turn by 0
    for (size_t i = 0; i < inv.size(); ++i) {
      INFO("frequency " << i);
      if (i < want.size()) CHECK(inv[i] == Approx(want[i]).epsilon(1e-6));
      else CHECK(inv[i] == 0.0f);
    }
  }
  CHECK(config_preset("phi-4-mini")->rotary_dim == 96);
}

TEST_CASE("partial rotary: factors that do not fit the rotated dims, or another family's, are refused", "[config][rope]") {
  const json fx = json::parse(test::read_file(kPhi4Mini.parent_path() / "longrope_phi4_mini.json"));
  json cfg = fx["config"];
  cfg["rope_scaling"]["short_factor"] = json::array();
  for (int i = 0; i < 64; ++i) cfg["rope_scaling"]["short_factor"].push_back(1.0);  // head_dim / 2, not 96 / 2
  CHECK_THROWS_WITH(config_from_hf_json_text(cfg.dump(), "phi4mini/config.json"),
                    Catch::Contains("phi4mini/config.json: rope_scaling.short_factor has 64 values; the rotary dims / 2 are 48"));
  cfg = fx["config"];
  cfg["partial_rotary_factor"] = 0.7;  // 89.6: 89 dims, odd
  CHECK_THROWS_WITH(config_from_hf_json_text(cfg.dump(), "phi4mini/config.json"),
                    Catch::Contains("partial_rotary_factor 0.7 of head_dim 128 does not give an even number"));
  cfg["partial_rotary_factor"] = 1.5;
  CHECK_THROWS_WITH(config_from_hf_json_text(cfg.dump(), "phi4mini/config.json"),
                    Catch::Contains("partial_rotary_factor 1.5"));
  cfg = fx["config"];
  cfg["model_type"] = "llama";  // transformers' LLaMA rotates whole heads whatever the factor says
  cfg["architectures"] = {"LlamaForCausalLM"};
  cfg.erase("rope_scaling");
  CHECK_THROWS_WITH(config_from_hf_json_text(cfg.dump(), "llama/config.json"),
                    Catch::Contains("llama/config.json: partial_rotary_factor 0.75 is not supported for llama (phi3, glm, glm4)"));
  ModelConfig c = *config_preset("phi-4-mini");
  c.rotary_dim = 95;
  CHECK_THROWS_WITH(c.validate(), Catch::Contains("rotary dimension 95 is not an even number in 1..128"));
}

TEST_CASE("partial rotary: tiny-phi4-mini's directory reads as transformers runs it", "[config][rope]") {
  const ModelBundle b = open_model(kPhi4Mini.string());
  CHECK(b.config.rotary_dim == 12);  // of 16
  CHECK(b.config.rope_freq_factors.size() == 6);
  CHECK(b.config.tied_embeddings);
  CHECK(b.config.rope_attention_factor == Approx(std::sqrt(1.0 + std::log(4.0) / std::log(64.0))).epsilon(1e-6));
}
