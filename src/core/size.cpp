// Byte sizes as users write them (parse_size) and as messages print them (format_bytes).
#include "strata/core/size.h"

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "strata/core/error.h"

namespace strata {
namespace {

std::string upper(std::string s) {
  for (char& c : s) c = char(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// Multiplier for a suffix, 0 when unknown. Decimal letters follow `df -H` and disk vendors
// (16G = 16e9); the binary ones need the "i".
uint64_t suffix_multiplier(const std::string& suffix) {
  const std::string s = upper(suffix);
  if (s.empty() || s == "B") return 1;
  static const char kLetters[] = "KMGTPE";  // P and E beyond the header's list cost nothing
  uint64_t decimal = 1;
  for (int i = 0; i < 6; ++i) {
    decimal *= 1000;
    const std::string l(1, kLetters[i]);
    if (s == l || s == l + "B") return decimal;
    if (s == l + "IB") return uint64_t(1) << (10 * (i + 1));
  }
  return 0;
}

}  // namespace

size_t parse_size(const std::string& text, const std::string& what) {
  auto bad = [&](const std::string& why) -> Error {
    return Error(what + ": invalid size '" + text + "': " + why +
                 " (expected a number with an optional suffix, e.g. 4096, 512MiB, 16GiB, 16G, 1.5GiB)");
  };
  size_t i = 0, n = text.size();
  auto skip_space = [&] {
    while (i < n && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  };
  skip_space();
  if (i == n) throw bad("empty");
  if (text[i] == '-') throw bad("negative");
  if (text[i] == '+') ++i;

  // Integer part exactly in 64 bits (sizes near 2^64 must not round through a double); the
  // fraction separately, scaled by the multiplier at the end.
  uint64_t whole = 0;
  size_t digits = 0;
  for (; i < n && std::isdigit(static_cast<unsigned char>(text[i])); ++i, ++digits) {
    if (__builtin_mul_overflow(whole, uint64_t(10), &whole) ||
        __builtin_add_overflow(whole, uint64_t(text[i] - '0'), &whole))
      throw bad("too large");
  }
  std::string fraction;
  if (i < n && text[i] == '.') {
    for (++i; i < n && std::isdigit(static_cast<unsigned char>(text[i])); ++i) fraction += text[i];
    if (fraction.empty() && digits == 0) throw bad("no digits");
  }
  if (digits == 0 && fraction.empty()) throw bad("no number");
  skip_space();
  const size_t suffix_begin = i;
  while (i < n && std::isalpha(static_cast<unsigned char>(text[i]))) ++i;
  const std::string suffix = text.substr(suffix_begin, i - suffix_begin);
  skip_space();
  if (i != n) throw bad("unexpected '" + text.substr(i) + "'");
  const uint64_t mult = suffix_multiplier(suffix);
  if (mult == 0) throw bad("unknown suffix '" + suffix + "'");
  const bool has_fraction = fraction.find_first_not_of('0') != std::string::npos;
  if (has_fraction && mult == 1) throw bad("a fraction of a byte");

  uint64_t bytes = 0;
  if (__builtin_mul_overflow(whole, mult, &bytes)) throw bad("too large");
  if (has_fraction) {
    // 0.xyz * mult < mult, so long double (64-bit mantissa) is exact enough; round to nearest.
    const long double frac = std::strtold(("0." + fraction).c_str(), nullptr);
    const uint64_t extra = uint64_t(std::llround(frac * (long double)mult));
    if (__builtin_add_overflow(bytes, extra, &bytes)) throw bad("too large");
  }
  if (bytes > std::numeric_limits<size_t>::max()) throw bad("too large");
  return size_t(bytes);
}

std::string format_bytes(double bytes) {
  // Small sizes print exactly (4096 B reads better than 4.00 KiB next to alignment rules);
  // otherwise about four significant digits in the largest unit that keeps the value >= 1.
  const double mag = std::fabs(bytes);
  char buf[64];
  if (!(mag >= 10240.0)) {  // also NaN
    std::snprintf(buf, sizeof buf, "%.0f B", bytes);
    return buf;
  }
  static const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  double v = bytes / 1024.0;
  while (u + 1 < 6 && std::fabs(v) >= 1024.0) {
    v /= 1024.0;
    ++u;
  }
  if (std::fabs(v) >= 99.995) {
    // 1023.96 MiB would print as "1024.0 MiB"; say "1.00 GiB" instead.
    if (std::fabs(v) >= 1023.95 && u + 1 < 6) {
      std::snprintf(buf, sizeof buf, "%.2f %s", v / 1024.0, kUnits[u + 1]);
    } else {
      std::snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[u]);
    }
  } else {
    std::snprintf(buf, sizeof buf, "%.2f %s", v, kUnits[u]);
  }
  return buf;
}

std::string format_rate(double per_second, const char* unit) {
  static const char* prefixes[] = {"", "k", "M", "G", "T", "P"};
  int i = 0;
  while (per_second >= 1000 && i < 5) {
    per_second /= 1000;
    ++i;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3g %s%s", per_second, prefixes[i], unit);
  return buf;
}

}  // namespace strata
