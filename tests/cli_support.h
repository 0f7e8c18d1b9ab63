// Runs the strata binary (or any shell command) as a user would, for the CLI tests.
#pragma once
#include "test_paths.h"
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include <catch2/catch.hpp>

namespace strata::test {

struct CliResult {
  int code;            // exit status; -1 when the process did not exit normally
  std::string output;  // stdout and stderr together
};

inline CliResult run_shell(const std::string& command) {
  const std::string cmd = command + " 2>&1";
  CliResult r{0, {}};
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// `args`: strata's arguments, e.g. "run --model ... --prompts ...".
inline CliResult run_strata(const std::string& args) { return run_shell(std::string(STRATA_BINARY) + " " + args); }

}  // namespace strata::test
