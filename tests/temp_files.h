// Per-process scratch directories and small files for tests (ctest runs cases of one binary in
// parallel processes, so every directory carries the pid).
#pragma once
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace strata::test {

// $TMPDIR/strata_<tag>_<pid>, created.
inline std::filesystem::path temp_dir(const std::string& tag) {
  const std::filesystem::path d =
      std::filesystem::temp_directory_path() / ("strata_" + tag + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(d);
  return d;
}

inline std::filesystem::path write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace strata::test
