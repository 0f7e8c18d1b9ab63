// WeightSource over memory-mapped safetensors: shapes come from the validated header, reads
// convert the stored dtype (F32/F16/BF16) into the dtype the backend asked for.
#include <algorithm>
#include <cstring>
#include <vector>

#include "strata/core/error.h"
#include "strata/core/thread_pool.h"
#include "strata/model/safetensors.h"
#include "strata/model/weight_source.h"

namespace strata {
namespace {

class SafetensorsSource final : public WeightSource {
public:
  SafetensorsSource(std::shared_ptr<const SafetensorsSet> set, std::filesystem::path path)
      : set_(std::move(set)), path_(std::move(path)) {}

  std::string describe() const override { return path_.string(); }
  bool contains(const std::string& name) const override { return set_->contains(name); }
  std::vector<int64_t> shape(const std::string& name) const override { return set_->get(name).shape; }
  std::vector<std::string> names() const override { return set_->names(); }

private:
  void read_into(const std::string& name, DType dst_dtype, void* dst, ThreadPool* pool) const override {
    const SafetensorsEntry& e = set_->get(name);
    if (dst_dtype != DType::F32 && dst_dtype != DType::F16 && dst_dtype != DType::BF16)
      STRATA_FAIL(e.file.string() << ": tensor '" << name << "' cannot be read as " << dtype_name(dst_dtype)
                                  << " (F32, F16 or BF16 only)");
    if (e.dtype == DType::I32 || e.dtype == DType::U8)
      STRATA_FAIL(e.file.string() << ": tensor '" << name << "' is " << dtype_name(e.dtype)
                                  << ", not a weight Strata reads as floats (packed GPTQ codes are read through "
                                  << "config.json's quantization_config, MXFP4 experts through a gpt_oss config)");
    const size_t n = e.nbytes / dtype_size(e.dtype);
    // The data area starts wherever the header ends, so elements may be misaligned; the
    // converter loads them as typed values, which must be aligned.
    if (reinterpret_cast<uintptr_t>(e.data) % dtype_size(e.dtype) != 0 && e.dtype != dst_dtype) {
      std::vector<uint8_t> aligned(e.data, e.data + e.nbytes);
      convert_elements(aligned.data(), e.dtype, dst, dst_dtype, n);
      return;
    }
    if (!pool) return convert_elements(e.data, e.dtype, dst, dst_dtype, n);
    // In slices, so that the pages of a mapped file fault in on every thread too.
    const int64_t slices = int64_t((n + kSlice - 1) / kSlice);
    const size_t in_size = dtype_size(e.dtype), out_size = dtype_size(dst_dtype);
    pool->parallel_for(slices, [&](int64_t s0, int64_t s1) {
      const size_t first = size_t(s0) * kSlice, count = std::min(n, size_t(s1) * kSlice) - first;
      convert_elements(e.data + first * in_size, e.dtype, static_cast<uint8_t*>(dst) + first * out_size, dst_dtype,
                       count);
    });
  }

  static constexpr size_t kSlice = size_t(1) << 18;  // elements
  std::shared_ptr<const SafetensorsSet> set_;
  std::filesystem::path path_;
};

}  // namespace

std::unique_ptr<WeightSource> make_safetensors_source(const std::filesystem::path& path) {
  return make_safetensors_source(std::make_shared<const SafetensorsSet>(SafetensorsSet::open(path)), path);
}

std::unique_ptr<WeightSource> make_safetensors_source(std::shared_ptr<const SafetensorsSet> set,
                                                      const std::filesystem::path& path) {
  return std::make_unique<SafetensorsSource>(std::move(set), path);
}

}  // namespace strata
