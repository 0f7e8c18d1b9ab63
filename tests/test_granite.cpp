// Granite (GraniteForCausalLM, GGUF granite): LLaMA with four multipliers (logits and greedy tokens
// against transformers: test_model_hf.cpp for the directory, here for the GGUF file).
#include "test_paths.h"
#include "temp_files.h"
#include "test_support.h"
#include <catch2/catch.hpp>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "strata/model/gguf.h"
#include "strata/model/model_loader.h"

using namespace strata;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {
const fs::path kDir = fs::path(STRATA_FIXTURES_DIR) / "models" / "tiny-granite";
const fs::path kGguf = fs::path(STRATA_FIXTURES_DIR) / "gguf" / "tiny_granite.gguf";

// make_granite_fixture.py's multipliers: embeddings x 2.5, scores x 0.2, branches x 0.6, logits / 3.
void check_multipliers(const ModelConfig& c) {
  CHECK(c.embed_scale == 2.5f);
  CHECK(c.attention_scale() == Approx(0.2).epsilon(1e-6));
  CHECK(c.residual_multiplier == 0.6f);
  CHECK(c.logit_scale == Approx(1.0 / 3.0).epsilon(1e-7));
  CHECK(c.tied_embeddings);
}

std::vector<uint8_t> slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}
}  // namespace

TEST_CASE("Granite: a directory's four multipliers", "[config]") {
  check_multipliers(open_model(kDir.string()).config);
  json cfg = json::parse(test::read_file(kDir / "config.json"));
  for (const char* key : {"embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling"}) {
    INFO(key);
    json bad = cfg;
    bad[key] = 0.0;
    CHECK_THROWS_WITH(config_from_hf_json_text(bad.dump(), "granite/config.json"),
                      Catch::Contains("granite/config.json: " + std::string(key) + " 0 is not positive"));
  }
  // Absent, each is transformers' default 1: scores then scale by 1, not 1 / sqrt(head_dim).
  for (const char* key : {"embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling"})
    cfg.erase(key);
  const ModelConfig plain = config_from_hf_json_text(cfg.dump(), "granite/config.json");
  CHECK(plain.embed_scale == 0.0f);
  CHECK(plain.attention_scale() == 1.0f);
  CHECK(plain.residual_multiplier == 1.0f);
  CHECK(plain.logit_scale == 1.0f);
}

TEST_CASE("gguf: Granite (granite: q/k permuted, four multipliers) gives transformers' logits and tokens",
          "[gguf][model]") {
  const json exp = json::parse(test::read_file(kDir / "expected.json"));
  ModelBundle b = open_model(kGguf.string());
  check_multipliers(b.config);
  test::check_hf_outputs(b, exp);

  // logit_scale is required (llama.cpp requires it); the key renamed in place keeps the file valid.
  std::vector<uint8_t> bytes = slurp(kGguf);
  const std::string key = "granite.logit_scale";
  auto at = std::search(bytes.begin(), bytes.end(), key.begin(), key.end());
  REQUIRE(at != bytes.end());
  *(at + std::ptrdiff_t(key.size()) - 1) = '~';
  CHECK_THROWS_WITH(config_from_gguf(GgufFile::from_bytes(std::move(bytes), "mem.gguf")),
                    Catch::Contains("mem.gguf") && Catch::Contains("granite without granite.logit_scale"));
}
