// The message of the strata::Error a call throws, for the refusal tests.
#pragma once
#include <functional>
#include <string>

#include "strata/core/error.h"

namespace strata::test {

// f's strata::Error message, or "(no error)" when it returns.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace strata::test
