// libFuzzer entry for a GPTQ or AWQ checkpoint's tensors (make_packed_source): the first byte
// picks the format (bits 2, 4 or 8; group 0 = whole rows, 32, 64 or 128; zero stored minus one or
// not; GPTQ or AWQ packing), the
// rest is a safetensors file, written to a scratch file because the source maps files. Then every
// tensor is shaped, read as floats, and read as codes at two specs, as the loader and a compressed
// policy would. strata::Error is the expected way to reject input; anything else (crash,
// sanitizer report, an allocation far beyond the input's size) is a bug.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "strata/core/error.h"
#include "strata/model/packed_checkpoint.h"
#include "strata/quant/quant.h"

namespace {

// The process's scratch file, removed when libFuzzer exits (after -runs, or at the end of a corpus).
struct ScratchFile {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("strata_packed_fuzz_" + std::to_string(::getpid()) + ".safetensors")).string();
  ~ScratchFile() { std::remove(path.c_str()); }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const ScratchFile scratch;
  const std::string& path = scratch.path;
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data + 1), long(size - 1));
  strata::PackedFormat format;
  format.bits = (const int[]){2, 4, 8}[data[0] % 3];
  format.group_size = (const int[]){0, 32, 64, 128}[(data[0] / 3) % 4];
  format.zero_minus_one = (data[0] / 12) % 2 == 0;
  if ((data[0] / 24) % 2) {  // AWQ: 4-bit codes packed along the output
    format.method = strata::PackedMethod::Awq;
    format.bits = 4;
  }
  format.source = "fuzz";
  try {
    const std::unique_ptr<strata::WeightSource> src = strata::make_packed_source(path, format);
    for (const std::string& name : src->names()) {
      const std::vector<int64_t> shape = src->shape(name);
      int64_t numel = 1;
      for (int64_t d : shape) numel = __builtin_mul_overflow(numel, d, &numel) ? INT64_MAX : numel;
      if (numel > (int64_t(1) << 22)) continue;  // the safetensors reader's own checks cover those
      std::vector<float> values(static_cast<size_t>(numel));
      src->read(name, strata::DType::F32, values.data());
      if (shape.size() != 2 || shape[1] == 0) continue;
      for (const strata::quant::QuantSpec spec : {strata::quant::QuantSpec{4, 32}, strata::quant::QuantSpec{8, 64}}) {
        std::vector<uint8_t> rows(strata::quant::row_bytes(spec, shape[1]) * size_t(shape[0]));
        src->read_codes(name, spec, rows.data());
      }
    }
  } catch (const strata::Error&) {
  }
  return 0;
}
