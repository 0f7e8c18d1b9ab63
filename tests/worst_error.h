// The largest error of a comparison, with NaN kept.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>

namespace strata::test {

// std::max(worst, NaN) returns worst, so a check of the largest error against a bound would pass
// an output that is NaN; here a NaN error makes the result NaN for good, and the check fails.
template <class T>
T worst_of(T worst, T err) {
  return std::isnan(worst) || std::isnan(err) ? std::numeric_limits<T>::quiet_NaN() : std::max(worst, err);
}

}  // namespace strata::test
