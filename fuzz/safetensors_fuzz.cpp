// libFuzzer entry for the safetensors header (parse_safetensors_header on bytes in memory, as
// open() does on the mapping), then touches every tensor's first and last byte so an entry that
// points outside the buffer shows under ASan. strata::Error is the expected way to reject input;
// anything else (crash, sanitizer report, nlohmann::json::exception escaping) is a bug.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "strata/core/error.h"
#include "strata/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<uint8_t> bytes(data, data + size);  // exact-size heap copy: overreads are caught
  try {
    volatile uint8_t sink = 0;
    for (const strata::SafetensorsEntry& e : strata::parse_safetensors_header(bytes.data(), bytes.size(), "fuzz.safetensors")) {
      if (e.nbytes == 0) continue;
      sink = sink + e.data[0] + e.data[e.nbytes - 1];
    }
  } catch (const strata::Error&) {
  }
  return 0;
}
