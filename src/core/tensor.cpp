#include "strata/core/tensor.h"

#include <sstream>

#include "strata/core/error.h"

namespace strata {

Tensor::Tensor(void* data_, DType dtype_, Device device_, std::initializer_list<int64_t> dims)
    : data(data_), dtype(dtype_), device(device_) {
  STRATA_CHECK(dims.size() >= 1 && dims.size() <= 4, "tensor rank must be 1..4, got " << dims.size());
  ndim = int(dims.size());
  int i = 0;
  for (int64_t d : dims) {
    STRATA_CHECK(d >= 0, "negative dimension " << d);
    shape[i++] = d;
  }
}

int64_t Tensor::numel() const {
  if (ndim == 0) return 0;
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

Tensor Tensor::rows(int64_t begin, int64_t count) const {
  STRATA_CHECK(ndim >= 1 && begin >= 0 && count >= 0 && begin + count <= shape[0],
               "rows [" << begin << ", " << begin + count << ") outside " << shape_str());
  Tensor t = *this;
  t.shape[0] = count;
  t.data = static_cast<char*>(data) + size_t(begin * row_size()) * dtype_size(dtype);
  return t;
}

Tensor Tensor::reshaped(std::initializer_list<int64_t> dims) const {
  Tensor t(data, dtype, device, dims);
  STRATA_CHECK(t.numel() == numel(), "cannot reshape " << shape_str() << " to " << t.shape_str());
  return t;
}

std::string Tensor::shape_str() const {
  std::ostringstream os;
  os << "[";
  for (int i = 0; i < ndim; ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

}  // namespace strata
