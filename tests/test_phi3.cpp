// Phi-3 directories: LLaMA with fused qkv_proj and gate_up_proj, cut into q/k/v and gate/up by
// split_fused_projections (logits and greedy tokens against transformers: test_model_hf.cpp).
#include "test_paths.h"
#include "temp_files.h"
#include <catch2/catch.hpp>
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
