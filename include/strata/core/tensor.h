// Tensor: a non-owning, contiguous, row-major view of up to 4 dimensions on one device.
// Memory is owned elsewhere (a Buffer from a backend, a weight block, an mmap); views are cheap.
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "strata/core/dtype.h"

namespace strata {

enum class Device : uint8_t { CPU, CUDA };

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  Device device = Device::CPU;
  int ndim = 0;
  std::array<int64_t, 4> shape{0, 0, 0, 0};
  int group = 0;  // Q4 / Q8 only: elements per quantization group along the last dimension

  Tensor() = default;
  Tensor(void* data, DType dtype, Device device, std::initializer_list<int64_t> dims);

  // A view of group-wise quantized rows (Q4 or Q8): the last dimension is quantized in groups.
  static Tensor quantized(void* data, DType dtype, int group, Device device, std::initializer_list<int64_t> dims);
  bool empty() const { return data == nullptr; }
  bool quantized() const { return is_quantized(dtype); }
  int64_t dim(int i) const { return shape[i < 0 ? ndim + i : i]; }
  int64_t numel() const;
  size_t nbytes() const;
  // Bytes of one index of the first dimension (quantized rows included).
  size_t row_bytes() const;
  // Elements per row: the product of all dimensions but the first.
  // (Computed as a product, not numel / shape[0], so [0, n] views report n.)
  int64_t row_size() const {
    int64_t n = ndim == 0 ? 0 : 1;
    for (int i = 1; i < ndim; ++i) n *= shape[i];
    return n;
  }

  template <class T> T* ptr() const { return static_cast<T*>(data); }

  // A view of rows [begin, begin + count) along the first dimension.
  Tensor rows(int64_t begin, int64_t count) const;
  // The same memory with another shape of the same element count.
  Tensor reshaped(std::initializer_list<int64_t> dims) const;

  std::string shape_str() const;  // e.g. "[4, 768]"
};

}  // namespace strata
