// libFuzzer entry for the GGUF reader: parses the bytes from memory, reads a model config from the
// metadata (config_from_gguf, then validate), then dequantizes every small tensor it can and
// repacks the affine types' codes as Strata's quantized rows (what a compressed policy keeps), so
// out-of-bounds reads in the decoders show too. strata::Error is the expected
// way to reject input; anything else (crash, sanitizer report, other exception) is a bug.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "strata/core/error.h"
#include "strata/model/gguf.h"
#include "strata/quant/quant.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    strata::GgufFile f = strata::GgufFile::from_bytes(std::vector<uint8_t>(data, data + size), "fuzz.gguf");
    for (const auto& kv : f.metadata()) (void)f.find(kv.first);
    try {
      strata::config_from_gguf(f).validate();
    } catch (const strata::Error&) {  // not a model Strata runs: the tensors are still read below
    }
    for (const strata::GgufTensorInfo& t : f.tensors()) {
      const strata::GgmlTypeInfo* info = strata::ggml_type_info(uint32_t(t.type));
      if (!info->dequantizable || t.numel > (1 << 16)) continue;
      std::vector<float> out(static_cast<size_t>(t.numel));
      f.dequantize(t, out.data());
      const int bits = strata::ggml_affine_code_bits(t.type);
      // A zero dimension elsewhere leaves numel 0 whatever ne[0] says: one row must fit the tensor.
      if (bits == 0 || t.ne.empty() || t.ne[0] > t.numel || t.ne[0] % info->block_size != 0) continue;
      const int64_t n = t.ne[0];
      std::vector<uint8_t> codes(static_cast<size_t>(n)), row(strata::quant::row_bytes({8, 32}, n));
      std::vector<float> scales(static_cast<size_t>(n / 32)), mins(scales.size());
      strata::ggml_affine_decode(t.type, t.data, n, codes.data(), scales.data(), mins.data());
      (void)strata::quant::pack_row({bits <= 4 ? 4 : 8, 32}, n, codes.data(), scales.data(), mins.data(), row.data());
    }
  } catch (const strata::Error&) {
  }
  return 0;
}
