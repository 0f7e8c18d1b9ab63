#include "strata/backend/backend.h"

#include <vector>

#include "strata/core/error.h"

namespace strata {

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    owner_ = o.owner_;
    data_ = o.data_;
    bytes_ = o.bytes_;
    o.owner_ = nullptr;
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void Buffer::reset() {
  if (owner_ && data_) owner_->release(data_);
  owner_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

Tensor Buffer::view(size_t offset, DType dtype, std::initializer_list<int64_t> dims) const {
  STRATA_CHECK(owner_ != nullptr, "view of an empty buffer");
  Tensor t(static_cast<char*>(data_) + offset, dtype, owner_->device(), dims);
  STRATA_CHECK(offset + t.nbytes() <= bytes_,
               "view " << t.shape_str() << " at " << offset << " exceeds buffer of " << bytes_ << " bytes");
  return t;
}

void Backend::copy_to_host_f32(const Tensor& src, float* host_dst) {
  if (src.dtype == DType::F32) {
    copy_to_host(host_dst, src.data, src.nbytes());
    return;
  }
  std::vector<uint8_t> staging(src.nbytes());
  copy_to_host(staging.data(), src.data, src.nbytes());
  convert_elements(staging.data(), src.dtype, host_dst, DType::F32, size_t(src.numel()));
}

#ifndef STRATA_HAVE_CUDA
bool cuda_available() { return false; }
std::unique_ptr<Backend> make_cuda_backend(int) {
  throw Error("this strata was built without the CUDA backend (no nvcc at build time); use --device cpu");
}
#endif

std::unique_ptr<Backend> make_backend(const std::string& name, int threads) {
  if (name == "cpu") return make_cpu_backend(threads);
  if (name == "cuda") return make_cuda_backend(0);
  if (name == "auto") return cuda_available() ? make_cuda_backend(0) : make_cpu_backend(threads);
  STRATA_FAIL("unknown device '" << name << "' (expected cpu, cuda or auto)");
}

}  // namespace strata
