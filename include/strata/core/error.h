// Errors: library code throws strata::Error with a message that says where and why; only the CLI
// turns it into a message on stderr and a non-zero exit code.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace strata {

class Error : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

namespace detail {
[[noreturn]] void raise_check(const char* expr, const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace strata

// Always-on check for invariants and external calls; records the expression, file and line.
// Usage: STRATA_CHECK(n > 0, "bad n " << n);
#define STRATA_CHECK(cond, msg)                                                 \
  do {                                                                          \
    if (!(cond)) {                                                              \
      std::ostringstream strata_check_os_;                                      \
      strata_check_os_ << msg;                                                  \
      ::strata::detail::raise_check(#cond, __FILE__, __LINE__, strata_check_os_.str()); \
    }                                                                           \
  } while (0)

// Throws a user-facing strata::Error built from a stream expression (no source location).
#define STRATA_FAIL(msg)                                                        \
  do {                                                                          \
    std::ostringstream strata_fail_os_;                                         \
    strata_fail_os_ << msg;                                                     \
    throw ::strata::Error(strata_fail_os_.str());                               \
  } while (0)
