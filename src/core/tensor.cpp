#include "strata/core/tensor.h"

#include <algorithm>
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

Tensor Tensor::quantized(void* data, DType dtype, int group, Device device, std::initializer_list<int64_t> dims) {
  STRATA_CHECK(is_quantized(dtype) && group > 0, "internal: " << dtype_name(dtype) << " with group " << group
                                                              << " is not a quantized dtype");
  Tensor t(data, dtype, device, dims);
  t.group = group;
  return t;
}

size_t Tensor::nbytes() const {
  if (!quantized()) return size_t(numel()) * dtype_size(dtype);
  const int64_t n = shape[size_t(ndim - 1)];
  return n == 0 ? 0 : size_t(numel() / n) * quantized_row_bytes(quantized_bits(dtype), group, n);
}

size_t Tensor::row_bytes() const {
  if (!quantized()) return size_t(row_size()) * dtype_size(dtype);
  STRATA_CHECK(ndim >= 2, "internal: a 1-d quantized tensor is one row; it has no rows to index");
  const int64_t n = shape[size_t(ndim - 1)];
  return size_t(row_size() / std::max<int64_t>(n, 1)) * quantized_row_bytes(quantized_bits(dtype), group, n);
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
  t.data = static_cast<char*>(data) + size_t(begin) * row_bytes();
  return t;
}

Tensor Tensor::reshaped(std::initializer_list<int64_t> dims) const {
  Tensor t(data, dtype, device, dims);
  t.group = group;
  STRATA_CHECK(t.numel() == numel(), "cannot reshape " << shape_str() << " to " << t.shape_str());
  STRATA_CHECK(!quantized() || t.shape[size_t(t.ndim - 1)] == shape[size_t(ndim - 1)],
               "cannot reshape quantized " << shape_str() << " to " << t.shape_str() << ": rows are quantized whole");
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
