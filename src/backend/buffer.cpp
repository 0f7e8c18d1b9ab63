// The device-independent parts of backend.h: Buffer, and Backend's helpers over its virtual
// copies. Apart from the registry (backend.cpp), so that code built without a backend choice (the
// CUDA kernels' emulation tests) links them.
#include <vector>

#include "strata/backend/backend.h"
#include "strata/core/error.h"

namespace strata {

HostWaits& this_thread_host_waits() {
  thread_local HostWaits waits;
  return waits;
}

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

// Callers ask routes_on_device first; a backend that says yes overrides both.
void Backend::route_experts(const Tensor&, int64_t, bool, const DeviceRouting&) {
  STRATA_FAIL("internal: the " << name() << " backend does not route experts on the device");
}
void Backend::routed_linears(const Tensor&, const std::vector<Tensor>&, const DeviceRouting&, int64_t, const Tensor&,
                             const std::vector<Tensor>&) {
  STRATA_FAIL("internal: the " << name() << " backend does not route experts on the device");
}
// Callers ask samples_on_device first.
void Backend::row_candidates(const Tensor&, const Tensor&, int64_t, void*) {
  STRATA_FAIL("internal: the " << name() << " backend does not sample on the device");
}
void Backend::target_ranks(const Tensor&, const Tensor&, void*) {
  STRATA_FAIL("internal: the " << name() << " backend does not score on the device");
}

}  // namespace strata
