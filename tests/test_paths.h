// Where the tests find their fixtures and the strata binary. The build's own paths by default;
// STRATA_TEST_FIXTURES and STRATA_TEST_BINARY replace them
// when the test binary runs from another place (the GPU machine runs a staged copy, see
// bench/gpu_suite.sh).
#pragma once
#include <cstdlib>

namespace strata::test {

inline const char* env_or(const char* name, const char* build_path) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? v : build_path;
}

}  // namespace strata::test

#define STRATA_FIXTURES_DIR ::strata::test::env_or("STRATA_TEST_FIXTURES", STRATA_BUILD_FIXTURES_DIR)
#define STRATA_BINARY ::strata::test::env_or("STRATA_TEST_BINARY", STRATA_BUILD_BINARY)
