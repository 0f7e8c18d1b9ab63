// libFuzzer entry for the GGUF reader: parses the bytes from memory, then dequantizes every small
// tensor it can, so out-of-bounds reads in the decoders show too. strata::Error is the expected
// way to reject input; anything else (crash, sanitizer report, other exception) is a bug.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "strata/core/error.h"
#include "strata/model/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    strata::GgufFile f = strata::GgufFile::from_bytes(std::vector<uint8_t>(data, data + size), "fuzz.gguf");
    for (const auto& kv : f.metadata()) (void)f.find(kv.first);
    for (const strata::GgufTensorInfo& t : f.tensors()) {
      const strata::GgmlTypeInfo* info = strata::ggml_type_info(uint32_t(t.type));
      if (!info->dequantizable || t.numel > (1 << 16)) continue;
      std::vector<float> out(static_cast<size_t>(t.numel));
      f.dequantize(t, out.data());
    }
  } catch (const strata::Error&) {
  }
  return 0;
}
