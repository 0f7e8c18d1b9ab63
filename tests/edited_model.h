// A copy of a fixture model directory whose config.json a test edits (refusals, variants).
#pragma once
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "temp_files.h"

namespace strata::test {

// <group>/<model> of the fixtures copied into a fresh directory of temp_dir(tag), its config.json
// passed through `edit`.
inline std::filesystem::path edited_model(const std::string& model, const std::function<void(nlohmann::json&)>& edit,
                                          const std::string& tag = "edited", const std::string& group = "models") {
  namespace fs = std::filesystem;
  static int made = 0;
  const fs::path dir = temp_dir(tag) / std::to_string(made++);
  fs::create_directories(dir);
  for (const fs::directory_entry& e : fs::directory_iterator(fs::path(STRATA_FIXTURES_DIR) / group / model))
    fs::copy_file(e.path(), dir / e.path().filename());
  nlohmann::json cfg;
  {
    std::ifstream in(dir / "config.json");
    cfg = nlohmann::json::parse(in);
  }
  edit(cfg);
  std::ofstream(dir / "config.json") << cfg.dump();
  return dir;
}

}  // namespace strata::test
