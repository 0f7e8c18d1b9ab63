// The LoRA adapters of tests/fixtures/lora/ (make_lora_fixtures.py) and the tiny model each adapts.
#pragma once
#include <filesystem>
#include <string>

#include "test_paths.h"

namespace strata::test {

struct LoraFixture {
  const char* adapter;
  const char* base;
};
inline constexpr LoraFixture kLoraFixtures[] = {{"tiny-llama-lora", "tiny-llama"},
                                                {"tiny-llama3-lora", "tiny-llama3"},
                                                {"tiny-qwen2-lora", "tiny-qwen2"},
                                                {"tiny-opt-lora", "tiny-opt"},
                                                {"tiny-phi3-lora", "tiny-phi3"}};

inline std::filesystem::path lora_fixture_dir(const std::string& adapter) {
  return std::filesystem::path(STRATA_FIXTURES_DIR) / "lora" / adapter;
}

}  // namespace strata::test
