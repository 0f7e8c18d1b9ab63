// Pieces the benchmarks share: timing, `--key value` options and the device's copy bandwidth, the
// peak that memory-bound kernels are reported against.
#pragma once
#include <chrono>
#include <cstring>
#include <string>

#include "strata/backend/backend.h"
#include "strata/core/error.h"

#ifdef STRATA_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace strata::bench {

using Clock = std::chrono::steady_clock;

inline double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
inline double seconds_since(Clock::time_point t0) { return seconds(t0, Clock::now()); }

// Calls on(key, value) for each `--key value` pair of the command line (options only, no switches);
// throws where the last key has no value.
template <class F>
void for_each_option(int argc, char** argv, F on) {
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    if (i + 1 >= argc) STRATA_FAIL("option " << k << " needs a value");
    on(k, std::string(argv[i + 1]));
  }
}

// Device-to-device copy bandwidth, counting bytes read plus bytes written.
inline double measure_copy_gbps(Backend& be) {
  const size_t bytes = size_t(1) << 30;
  Buffer a = be.alloc(bytes), b = be.alloc(bytes);
  auto copy = [&] {
#ifdef STRATA_HAVE_CUDA
    if (be.device() == Device::CUDA) {
      cudaMemcpy(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice);
      return;
    }
#endif
    std::memcpy(b.data(), a.data(), bytes);
  };
  copy();  // warm up (first touch of pages)
  be.synchronize();
  const int reps = 5;
  const auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) copy();
#ifdef STRATA_HAVE_CUDA
  if (be.device() == Device::CUDA) cudaDeviceSynchronize();
#endif
  return 2.0 * double(bytes) * reps / seconds(t0, Clock::now()) / 1e9;
}

}  // namespace strata::bench
