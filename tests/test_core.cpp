#include <catch2/catch.hpp>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "strata/core/dtype.h"
#include "strata/core/error.h"
#include "strata/core/tensor.h"
#include "strata/core/thread_pool.h"
#include "worst_error.h"

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

// convert_elements runs eight at a time where the CPU has F16C; it must give the scalar
// functions' bits (checked against IEEE above) on every input, NaNs included.
TEST_CASE("convert_elements gives the scalar conversions' bits on every half and a sweep of floats", "[core]") {
  // Every half, in an odd-length array so the last few take the scalar tail.
  std::vector<uint16_t> halves(0x10001);
  for (uint32_t h = 0; h < halves.size(); ++h) halves[h] = uint16_t(h);
  std::vector<float> widened(halves.size());
  convert_elements(halves.data(), DType::F16, widened.data(), DType::F32, halves.size());
  int wrong = 0;
  for (size_t i = 0; i < halves.size(); ++i) {
    const float want = half_to_float(halves[i]);
    wrong += std::memcmp(&widened[i], &want, 4) != 0;
  }
  CHECK(wrong == 0);

  std::vector<uint16_t> bf16s(halves);  // every bf16 too
  convert_elements(bf16s.data(), DType::BF16, widened.data(), DType::F32, bf16s.size());
  wrong = 0;
  for (size_t i = 0; i < bf16s.size(); ++i) {
    const float want = bf16_to_float(bf16s[i]);
    wrong += std::memcmp(&widened[i], &want, 4) != 0;
  }
  CHECK(wrong == 0);
  std::vector<uint16_t> bf16_as_half(bf16s.size());  // every bf16 rounded to fp16 (NaNs included)
  convert_elements(bf16s.data(), DType::BF16, bf16_as_half.data(), DType::F16, bf16s.size());
  wrong = 0;
  for (size_t i = 0; i < bf16s.size(); ++i) wrong += bf16_as_half[i] != float_to_half(bf16_to_float(bf16s[i]));
  CHECK(wrong == 0);

  // Floats: a sweep of bit patterns (every class: zeros, subnormals, normals, infinities, NaNs),
  // then every tie between adjacent halves of both signs and the floats on either side of it.
  std::vector<float> floats;
  for (uint64_t u = 0; u <= 0xffffffffull; u += 4099) {
    const uint32_t bits = uint32_t(u);
    float f;
    std::memcpy(&f, &bits, 4);
    floats.push_back(f);
  }
  for (uint32_t h = 0; h < 0x7bff; ++h)
    for (float sign : {1.0f, -1.0f}) {
      const float tie = sign * float((double(half_to_float(uint16_t(h))) + double(half_to_float(uint16_t(h + 1)))) / 2);
      floats.push_back(tie);
      floats.push_back(std::nextafter(tie, 0.0f));
      floats.push_back(std::nextafter(tie, sign * INFINITY));
    }
  floats.push_back(65519.996f);
  std::vector<uint16_t> narrowed(floats.size());
  convert_elements(floats.data(), DType::F32, narrowed.data(), DType::F16, floats.size());
  wrong = 0;
  for (size_t i = 0; i < floats.size(); ++i) wrong += narrowed[i] != float_to_half(floats[i]);
  CHECK(wrong == 0);
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

TEST_CASE("the tests' largest error keeps a NaN, where std::max would drop it", "[core]") {
  CHECK(test::worst_of(0.5, 2.0) == 2.0);
  CHECK(test::worst_of(2.0f, 0.5f) == 2.0f);
  CHECK(std::isnan(test::worst_of(0.0, std::nan(""))));
  // Once NaN, it stays NaN, so a bound check after the loop fails.
  CHECK(std::isnan(test::worst_of(test::worst_of(0.0f, std::nanf("")), 1.0f)));
  CHECK_FALSE(test::worst_of(test::worst_of(0.0, std::nan("")), 0.0) <= 1.0);
}
