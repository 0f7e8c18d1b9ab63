// Byte sizes as users write them on the command line and in files: 512MiB, 16GiB, 16G, 1.5T, 4096.
#pragma once
#include <cstddef>
#include <string>

namespace strata {

// Parses a non-negative size. Suffixes (case-insensitive): K/KB = 1e3, KiB = 2^10, M/MB/MiB,
// G/GB/GiB, T/TB/TiB likewise; "16G" means 16e9 as in `df -H`. A fraction is allowed with a
// suffix ("1.5GiB"). Throws strata::Error naming `what` (e.g. "--gpu-mem") on anything else.
size_t parse_size(const std::string& text, const std::string& what = "size");

// Human-readable, binary units: "512.0 MiB", "16.00 GiB", "4096 B".
std::string format_bytes(double bytes);

// A rate in decimal units for people: "12.3 GB/s" from (12.3e9, "B/s"), "65 TFLOP/s".
std::string format_rate(double per_second, const char* unit);

}  // namespace strata
