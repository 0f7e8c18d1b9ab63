#include <catch2/catch.hpp>
#include <atomic>
#include <cmath>
#include <limits>

#include "strata/core/dtype.h"
#include "strata/core/error.h"
#include "strata/core/tensor.h"
#include "strata/core/thread_pool.h"

using namespace strata;

TEST_CASE("fp16 and bf16 conversions round to nearest even (IEEE 754 bit patterns)", "[core]") {
  // Bit patterns from IEEE 754 binary16 / bfloat16 (numpy.float16(x).view(uint16) gives the same).
  CHECK(float_to_half(1.0f) == 0x3c00);
  CHECK(float_to_half(-2.0f) == 0xc000);
  CHECK(float_to_half(65504.0f) == 0x7bff);
  CHECK(float_to_half(65520.0f) == 0x7c00);           // rounds to infinity
  CHECK(float_to_half(1.0f / 3.0f) == 0x3555);
  CHECK(float_to_half(5.960464477539063e-08f) == 0x0001);  // smallest subnormal
  CHECK(float_to_half(2.9802322387695312e-08f) == 0x0000); // half of it: ties to even (zero)
  CHECK(float_to_half(1.0009765625f + 0.00048828125f) == 0x3c02);  // tie between 0x3c01 and 0x3c02 -> even
  CHECK(float_to_half(std::numeric_limits<float>::infinity()) == 0x7c00);
  CHECK((float_to_half(std::nanf("")) & 0x7c00) == 0x7c00);
  int mismatches = 0;  // every finite positive half survives a round trip through float exactly
  for (uint32_t h = 0; h < 0x7c00; ++h) mismatches += float_to_half(half_to_float(uint16_t(h))) != h;
  CHECK(mismatches == 0);
  CHECK(half_to_float(0x0001) == 5.960464477539063e-08f);
  CHECK(half_to_float(0xfbff) == -65504.0f);
  CHECK(float_to_bf16(1.0f) == 0x3f80);
  CHECK(float_to_bf16(3.140625f) == 0x4049);
  CHECK(bf16_to_float(0x4049) == 3.140625f);
  CHECK(float_to_bf16(1.00390625f) == 0x3f80);  // tie rounds to even
}

TEST_CASE("tensor views check their bounds", "[core]") {
  float data[24];
  Tensor t(data, DType::F32, Device::CPU, {4, 6});
  CHECK(t.numel() == 24);
  CHECK(t.rows(1, 2).ptr<float>() == data + 6);
  CHECK(t.reshaped({2, 3, 4}).dim(2) == 4);
  CHECK_THROWS_AS(t.rows(3, 2), Error);
  CHECK_THROWS_AS(t.reshaped({5, 5}), Error);
  CHECK(t.shape_str() == "[4, 6]");
  const Tensor empty = t.rows(2, 0);  // zero rows: sizes stay defined (no division by zero)
  CHECK(empty.numel() == 0);
  CHECK(empty.row_size() == 6);
}

TEST_CASE("thread pool covers every index once and rethrows errors", "[core]") {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(1000);
  pool.parallel_for(1000, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
  });
  for (auto& h : hits) CHECK(h.load() == 1);
  CHECK_THROWS_WITH(pool.parallel_for(100, [](int64_t b, int64_t) { if (b > 50) throw Error("boom"); }), "boom");
  int calls = 0;
  pool.parallel_for(0, [&](int64_t, int64_t) { ++calls; });
  CHECK(calls == 0);
}
