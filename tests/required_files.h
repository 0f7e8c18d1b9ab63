// Files a test needs that the build does not make: the default model, which scripts/setup.sh
// fetches. A missing one fails the test with its name and how to get it; a test never passes by
// skipping what it was meant to check.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <string>

#include <catch2/catch.hpp>

#include "strata/model/model_loader.h"

namespace strata::test {

// Fails the running test unless `path` exists, naming it and `how_to_get` it.
inline void require_file(const std::filesystem::path& path, const std::string& how_to_get) {
  if (!std::filesystem::exists(path)) FAIL("missing " << path.string() << ": " << how_to_get);
}

// SmolLM2-135M-Instruct's GGUF file: STRATA_SMOLLM2_GGUF, else where `strata run` looks for its
// default model. Fails the test when it is not there.
inline std::filesystem::path require_smollm2_gguf() {
  const char* env = std::getenv("STRATA_SMOLLM2_GGUF");
  const std::filesystem::path path = env && *env ? std::filesystem::path(env) : default_model_path();
  require_file(path, "run scripts/fetch_model.sh (scripts/setup.sh runs it; it needs PyPI), "
                     "or set STRATA_SMOLLM2_GGUF to the file");
  return path;
}

}  // namespace strata::test
