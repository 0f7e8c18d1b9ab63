// RoPE scaling read from config.json (linear, dynamic NTK, YaRN) against the inverse frequencies and attention
// factor transformers computes for the same files (tests/fixtures/models/make_rope_cases.py).
// Llama 3's scaling and LongRoPE have their own tests (test_model_config.cpp, test_phi3.cpp).
#include "test_paths.h"
#include "temp_files.h"
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "strata/core/error.h"
#include "strata/model/config.h"
#include "strata/model/gguf.h"
#include "worst_error.h"

using namespace strata;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

json rope_cases() {
  return json::parse(test::read_file(fs::path(STRATA_FIXTURES_DIR) / "models" / "rope_cases.json"))["cases"];
}

ModelConfig read(const json& config) { return config_from_hf_json_text(config.dump(), "m/config.json"); }

// The largest relative difference between a config's RoPE inverse frequencies and transformers'.
double worst_frequency_error(const ModelConfig& cfg, const json& rope_case) {
  const std::vector<float> got = rope_inv_freq(cfg);
  const std::vector<double> want = rope_case["inv_freq"].get<std::vector<double>>();
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = test::worst_of(worst, std::fabs(got[i] - want[i]) / want[i]);
  return worst;
}

}  // namespace

TEST_CASE("linear, dynamic and YaRN RoPE scaling give transformers' frequencies and attention factor",
          "[config][rope]") {
  for (const json& c : rope_cases()) {
    INFO(c["note"].get<std::string>());
    const ModelConfig cfg = read(c["config"]);
    CHECK(worst_frequency_error(cfg, c) < 1e-6);  // both float32, divisions in another order: a few ulp
    CHECK(cfg.rope_attention_factor == Approx(c["attention_factor"].get<double>()).epsilon(1e-6));
  }
}

TEST_CASE("YaRN's context is the factor times the original one, linear and dynamic keep max_position_embeddings",
          "[config][rope]") {
  const json cases = rope_cases();
  CHECK(read(cases[0]["config"]).max_positions == 8192);
  CHECK(read(cases[1]["config"]).max_positions == 4 * 32768);  // Qwen2.5's 128k
  CHECK(read(cases[2]["config"]).max_positions == 16384);     // max_position_embeddings is the larger
  CHECK(read(cases[3]["config"]).max_positions == 4096);      // dynamic: as plain RoPE up to here
  // A sliding window shorter than the context stays the context.
  json windowed = cases[1]["config"];
  windowed["use_sliding_window"] = true;
  windowed["sliding_window"] = 4096;
  const ModelConfig w = read(windowed);
  CHECK(w.max_positions == 4096);
  CHECK(w.sliding_window == 4096);
}

TEST_CASE("malformed RoPE scaling is refused naming the field", "[config][rope]") {
  const json cases = rope_cases();
  json c = cases[0]["config"];
  c["rope_scaling"].erase("factor");
  CHECK_THROWS_WITH(read(c), Catch::Contains("m/config.json: rope_scaling of type 'linear' needs 'factor'"));
  c["rope_scaling"]["factor"] = -2.0;
  CHECK_THROWS_WITH(read(c), Catch::Contains("m/config.json: rope_scaling.factor -2 is not positive"));
  c = cases[1]["config"];
  c["rope_scaling"]["factor"] = "four";
  CHECK_THROWS_WITH(read(c), Catch::Contains("rope_scaling.factor"));
  c["rope_scaling"] = {{"type", "dynamic"}};
  CHECK_THROWS_WITH(read(c), Catch::Contains("rope_scaling of type 'dynamic' needs 'factor'"));
  c["rope_scaling"] = {{"type", "ntk"}, {"factor", 2.0}};
  CHECK_THROWS_WITH(read(c),
                    Catch::Contains("rope scaling type 'ntk' is not supported (llama3, linear, dynamic, yarn"));
}

TEST_CASE("GGUF: linear and YaRN scaling as llama.cpp's converter writes it give transformers' values",
          "[gguf][config][rope]") {
  // The linear and Qwen2.5 YaRN cases' metadata as the converter writes it (make_rope_cases.py):
  // the file must run as transformers runs the config.json it came from.
  const json cases = rope_cases();
  const std::pair<const char*, int> files[] = {{"rope_linear.gguf", 0}, {"rope_yarn_qwen25.gguf", 1}};
  for (const auto& [name, index] : files) {
    INFO(name);
    const json& c = cases[size_t(index)];
    const ModelConfig cfg = config_from_gguf(GgufFile::open(fs::path(STRATA_FIXTURES_DIR) / "gguf" / name));
    CHECK(worst_frequency_error(cfg, c) < 1e-6);
    CHECK(cfg.rope_attention_factor == Approx(c["attention_factor"].get<double>()).epsilon(1e-6));
    CHECK(cfg.max_positions == read(c["config"]).max_positions);
  }
  const fs::path attn_factor = fs::path(STRATA_FIXTURES_DIR) / "gguf" / "rope_yarn_attn_factor.gguf";
  CHECK_THROWS_WITH(config_from_gguf(GgufFile::open(attn_factor)),
                    Catch::Contains("YaRN with qwen2.rope.scaling.attn_factor is not supported"));
}
