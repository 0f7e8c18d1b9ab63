#include <catch2/catch.hpp>

#include "strata/core/error.h"
#include "strata/core/size.h"

using namespace strata;

TEST_CASE("parse_size reads binary and decimal suffixes", "[size]") {
  CHECK(parse_size("512MiB") == size_t(512) << 20);
  CHECK(parse_size("16GiB") == size_t(16) << 30);
  CHECK(parse_size("16G") == size_t(16000000000));
  CHECK(parse_size("16GB") == size_t(16000000000));
  CHECK(parse_size("1.5GiB") == (size_t(3) << 30) / 2);
  CHECK(parse_size("1.5K") == 1500);
  CHECK(parse_size("2TiB") == size_t(2) << 40);
  CHECK(parse_size("1T") == size_t(1000000000000));
  CHECK(parse_size("4096") == 4096);
  CHECK(parse_size("4096B") == 4096);
  CHECK(parse_size("0") == 0);
  CHECK(parse_size("1.0") == 1);  // a zero fraction is not a fraction of a byte
  CHECK(parse_size(".5KiB") == 512);
}

TEST_CASE("parse_size ignores case and surrounding or inner whitespace", "[size]") {
  CHECK(parse_size("512mib") == size_t(512) << 20);
  CHECK(parse_size("16gib") == size_t(16) << 30);
  CHECK(parse_size("16g") == size_t(16000000000));
  CHECK(parse_size("4k") == 4000);
  CHECK(parse_size("4kb") == 4000);
  CHECK(parse_size("  512MiB\t") == size_t(512) << 20);
  CHECK(parse_size("16 GiB") == size_t(16) << 30);
  CHECK(parse_size("\n4096 ") == 4096);
}

TEST_CASE("parse_size rejects malformed text and names what was parsed", "[size]") {
  for (const char* bad : {"", "   ", "-1", "12X", "1.2.3G", "GiB", "1.5", "1.5B", "12 G B", "1e9", "0x10", "."}) {
    INFO("input '" << bad << "'");
    CHECK_THROWS_AS(parse_size(bad, "--gpu-mem"), Error);
    CHECK_THROWS_WITH(parse_size(bad, "--gpu-mem"), Catch::Contains("--gpu-mem") && Catch::Contains("invalid size"));
  }
  CHECK_THROWS_WITH(parse_size("12X", "--disk-mem"), Catch::Contains("--disk-mem") && Catch::Contains("'X'"));
  CHECK_THROWS_WITH(parse_size("-1"), Catch::Contains("size") && Catch::Contains("negative"));
}

TEST_CASE("parse_size refuses sizes that overflow 64 bits", "[size]") {
  CHECK(parse_size("18446744073709551615") == size_t(18446744073709551615ull));
  CHECK_THROWS_WITH(parse_size("18446744073709551616", "--cpu-mem"), Catch::Contains("--cpu-mem") && Catch::Contains("too large"));
  CHECK_THROWS_WITH(parse_size("99999999999999999999999GiB"), Catch::Contains("too large"));
  CHECK_THROWS_WITH(parse_size("17179869184GiB"), Catch::Contains("too large"));  // 2^34 * 2^30
  CHECK_THROWS_WITH(parse_size("20000000000G"), Catch::Contains("too large"));
  CHECK(parse_size("15EiB") == size_t(15) << 60);
  CHECK(parse_size("15.5EiB") == (size_t(31) << 59));
  CHECK_THROWS_WITH(parse_size("16EiB"), Catch::Contains("too large"));
}

TEST_CASE("format_bytes prints binary units with about four digits", "[size]") {
  CHECK(format_bytes(4096) == "4096 B");
  CHECK(format_bytes(0) == "0 B");
  CHECK(format_bytes(double(size_t(512) << 20)) == "512.0 MiB");
  CHECK(format_bytes(double(size_t(16) << 30)) == "16.00 GiB");
  CHECK(format_bytes(3.1 * double(size_t(1) << 30)) == "3.10 GiB");
  CHECK(format_bytes(double(size_t(1) << 60)) == "1.00 EiB");
  CHECK(format_bytes(1023.99 * 1024 * 1024) == "1.00 GiB");  // never "1024.0 MiB"
  CHECK(format_bytes(20480) == "20.00 KiB");
  CHECK(format_bytes(double(parse_size("16G"))) == "14.90 GiB");
}
