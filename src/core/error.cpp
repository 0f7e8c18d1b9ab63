#include "strata/core/error.h"

namespace strata::detail {

void raise_check(const char* expr, const char* file, int line, const std::string& msg) {
  std::ostringstream os;
  os << msg << " (check failed: " << expr << " at " << file << ":" << line << ")";
  throw Error(os.str());
}

}  // namespace strata::detail
