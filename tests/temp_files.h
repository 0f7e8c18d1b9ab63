// Per-process scratch directories and small files for tests (ctest runs cases of one binary in
// parallel processes, so every directory carries the pid).
#pragma once
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <string>

namespace strata::test {

// The directories temp_dir made, removed when the process that made them exits normally (a
// failed case included), so that test runs leave nothing in $TMPDIR. STRATA_KEEP_TEST_FILES=1
// keeps them to look at. A fork()ed child that exits leaves them to its parent.
class TempDirs {
public:
  void add(const std::filesystem::path& dir) {
    std::lock_guard<std::mutex> lock(mu_);
    dirs_.insert(dir);
  }
  ~TempDirs() {
    if (::getpid() != owner_ || std::getenv("STRATA_KEEP_TEST_FILES")) return;
    for (const std::filesystem::path& dir : dirs_) {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  }

private:
  const pid_t owner_ = ::getpid();
  std::mutex mu_;
  std::set<std::filesystem::path> dirs_;
};

inline TempDirs& temp_dirs() {
  static TempDirs dirs;
  return dirs;
}

// $TMPDIR/strata_<tag>_<pid>, created; removed at exit.
inline std::filesystem::path temp_dir(const std::string& tag) {
  const std::filesystem::path d =
      std::filesystem::temp_directory_path() / ("strata_" + tag + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(d);
  temp_dirs().add(d);
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
