// Group-wise quantization's host reference against hand-worked layouts and numpy's twin
// (tests/fixtures/quant/make_quant.py).
#include "test_paths.h"
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <nlohmann/json.hpp>

#include "strata/backend/backend.h"
#include "strata/core/error.h"
#include "strata/quant/quant.h"

using namespace strata;
using quant::QuantSpec;

namespace {

QuantSpec spec_of(int bits, int group_size) {
  QuantSpec s;
  s.bits = bits;
  s.group_size = group_size;
  return s;
}

float stored_half(const std::vector<uint8_t>& q, size_t offset) {
  uint16_t h;
  std::memcpy(&h, q.data() + offset, 2);
  return half_to_float(h);
}

// Where rint's input sits within 1e-4 of a .5, fp32 rounding may legitimately pick either side.
bool near_tie(double x, double min, double scale) {
  if (scale == 0.0) return false;
  const double v = (x - min) / scale;
  return std::fabs(v - std::floor(v) - 0.5) < 1e-4;
}

float max_code_of(int bits) { return float((1 << bits) - 1); }

}  // namespace

TEST_CASE("row sizes count codes plus fp16 scale and minimum per group", "[quant]") {
  CHECK(quant::bytes_per_element(spec_of(4, 64)) == 0.5625);
  CHECK(quant::bytes_per_element(spec_of(4, 32)) == 0.625);
  CHECK(quant::bytes_per_element(spec_of(4, 128)) == 0.53125);
  CHECK(quant::bytes_per_element(spec_of(8, 32)) == 1.125);
  CHECK(quant::bytes_per_element(spec_of(8, 64)) == 1.0625);
  CHECK(quant::bytes_per_element(spec_of(8, 128)) == 1.03125);

  CHECK(quant::row_bytes(spec_of(4, 64), 4096) == 2048 + 64 * 4);
  CHECK(quant::row_bytes(spec_of(8, 128), 4096) == 4096 + 32 * 4);
  CHECK(quant::row_bytes(spec_of(4, 32), 32) == 16 + 4);
  for (int bits : {4, 8})
    for (int g : {32, 64, 128})
      CHECK(double(quant::row_bytes(spec_of(bits, g), 1024)) == quant::bytes_per_element(spec_of(bits, g)) * 1024);
}

TEST_CASE("4-bit codes pack element 2k in the low nibble, then scales, then minimums", "[quant]") {
  // One group of 32: values 0..15 then 15..0, so lo = 0, hi = 15, scale = 1 and code = value.
  std::vector<float> x(32);
  for (int i = 0; i < 16; ++i) {
    x[size_t(i)] = float(i);
    x[size_t(31 - i)] = float(i);
  }
  const QuantSpec s = spec_of(4, 32);
  std::vector<uint8_t> q(quant::row_bytes(s, 32), 0xAB);  // poisoned, so unwritten bytes show
  quant::quantize_rows(s, x.data(), DType::F32, 1, 32, q.data());
  REQUIRE(q.size() == 20);
  CHECK(q[0] == 0x10);   // elements 0 (low) and 1 (high)
  CHECK(q[1] == 0x32);
  CHECK(q[7] == 0xFE);   // elements 14 and 15
  CHECK(q[8] == 0xEF);   // elements 16 (= 15) and 17 (= 14)
  CHECK(q[15] == 0x01);  // elements 30 (= 1) and 31 (= 0)
  CHECK(stored_half(q, 16) == 1.0f);  // scale
  CHECK(stored_half(q, 18) == 0.0f);  // minimum

  std::vector<float> y(32, -1.0f);
  quant::dequantize_rows(s, q.data(), 1, 32, y.data(), DType::F32);
  CHECK(y == x);

  // 8-bit: one byte per code, same parameter tail.
  const QuantSpec s8 = spec_of(8, 32);
  std::vector<uint8_t> q8(quant::row_bytes(s8, 32), 0xAB);
  std::vector<float> x8(32);
  for (int i = 0; i < 32; ++i) x8[size_t(i)] = float(i) * 255.0f / 31.0f;
  x8[31] = 255.0f;
  quant::quantize_rows(s8, x8.data(), DType::F32, 1, 32, q8.data());
  REQUIRE(q8.size() == 36);
  CHECK(q8[0] == 0);
  CHECK(q8[31] == 255);
  CHECK(stored_half(q8, 32) == 1.0f);
  CHECK(stored_half(q8, 34) == 0.0f);
}

TEST_CASE("codes, parameters and dequantized values equal numpy's", "[quant]") {
  std::ifstream in(std::string(STRATA_FIXTURES_DIR) + "/quant/quant_cases.json");
  REQUIRE(in.good());
  const auto fx = nlohmann::json::parse(in);
  REQUIRE(fx["cases"].size() >= 15);
  for (const auto& c : fx["cases"]) {
    INFO(c["name"].get<std::string>());
    const QuantSpec s = spec_of(c["bits"].get<int>(), c["group_size"].get<int>());
    const int64_t rows = c["rows"].get<int64_t>(), n = c["n"].get<int64_t>();
    const auto x = c["input"].get<std::vector<float>>();
    const auto codes = c["codes"].get<std::vector<int>>();
    const auto scales = c["scales"].get<std::vector<float>>();
    const auto mins = c["mins"].get<std::vector<float>>();
    const auto want = c["dequantized"].get<std::vector<float>>();
    const size_t groups_per_row = size_t((n + s.group_size - 1) / s.group_size), rb = quant::row_bytes(s, n);

    std::vector<uint8_t> q(size_t(rows) * rb, 0xAB);
    quant::quantize_rows(s, x.data(), DType::F32, rows, n, q.data());

    int param_mismatches = 0, code_mismatches = 0, ties = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<uint8_t> row(q.begin() + r * int64_t(rb), q.begin() + (r + 1) * int64_t(rb));
      const size_t code_bytes = ((size_t(n) * size_t(s.bits) + 7) / 8 + 3) / 4 * 4;  // padded to 4 bytes
      REQUIRE(rb == code_bytes + 4 * groups_per_row);
      for (size_t b = (size_t(n) * size_t(s.bits) + 7) / 8; b < code_bytes; ++b) CHECK(row[b] == 0);  // padding
      for (size_t gi = 0; gi < groups_per_row; ++gi) {
        const size_t k = size_t(r) * groups_per_row + gi;
        if (stored_half(row, code_bytes + 2 * gi) != scales[k]) ++param_mismatches;
        if (stored_half(row, code_bytes + 2 * (groups_per_row + gi)) != mins[k]) ++param_mismatches;
      }
      for (int64_t i = 0; i < n; ++i) {
        const size_t e = size_t(r * n + i), k = size_t(r) * groups_per_row + size_t(i / s.group_size);
        const int got = s.bits == 8 ? row[size_t(i)] : (i % 2 == 0 ? row[size_t(i / 2)] & 0xF : row[size_t(i / 2)] >> 4);
        if (near_tie(x[e], mins[k], scales[k])) {
          ++ties;
        } else if (got != codes[e]) {
          ++code_mismatches;
        }
      }
    }
    CHECK(param_mismatches == 0);
    CHECK(code_mismatches == 0);
    CHECK(ties < 4);  // a handful at most; many would mean the tie rule hides real mismatches

    std::vector<float> y(x.size(), NAN);
    quant::dequantize_rows(s, q.data(), rows, n, y.data(), DType::F32);
    int far = 0;
    for (size_t e = 0; e < y.size(); ++e)
      if (!(std::fabs(y[e] - want[e]) <= 1e-3 * std::max(1.0f, std::fabs(want[e])))) ++far;
    CHECK(far == 0);

    if (c["fp16_exact"].get<bool>()) {
      // The same values given as fp16 must quantize to the same bytes.
      std::vector<uint16_t> x16(x.size());
      for (size_t e = 0; e < x.size(); ++e) {
        x16[e] = float_to_half(x[e]);
        REQUIRE(half_to_float(x16[e]) == x[e]);
      }
      std::vector<uint8_t> q16(q.size(), 0xCD);
      quant::quantize_rows(s, x16.data(), DType::F16, rows, n, q16.data());
      CHECK(q16 == q);

      std::vector<uint16_t> y16(x.size(), 0xFFFF);
      quant::dequantize_rows(s, q.data(), rows, n, y16.data(), DType::F16);
      int far16 = 0;
      for (size_t e = 0; e < y16.size(); ++e)
        if (!(std::fabs(half_to_float(y16[e]) - want[e]) <= 1e-3 * std::max(1.0f, std::fabs(want[e])))) ++far16;
      CHECK(far16 == 0);
    }
  }
}

TEST_CASE("round trip error stays within half a step", "[quant]") {
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t rows = 5, n = 384;
  for (int bits : {4, 8}) {
    for (int g : {32, 64, 128}) {
      INFO("bits " << bits << " group " << g);
      const QuantSpec s = spec_of(bits, g);
      std::vector<float> x(size_t(rows * n));
      for (size_t e = 0; e < x.size(); ++e) x[e] = normal(rng) * float(1 + e % 7);
      std::vector<uint8_t> q(size_t(rows) * quant::row_bytes(s, n));
      quant::quantize_rows(s, x.data(), DType::F32, rows, n, q.data());
      std::vector<float> y(x.size());
      quant::dequantize_rows(s, q.data(), rows, n, y.data(), DType::F32);

      int worse = 0;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t gi = 0; gi < n / g; ++gi) {
          const float* xg = x.data() + r * n + gi * g;
          const float lo = *std::min_element(xg, xg + g), hi = *std::max_element(xg, xg + g);
          // Half a step, plus fp16's rounding of the scale (stretched over 2^bits - 1 steps) and
          // of the minimum: both relative 2^-11.
          const double step = double(hi - lo) / double((1 << bits) - 1);
          const double slack = (hi - lo) * 0x1p-11 + std::fabs(lo) * 0x1p-11 + 1e-6;
          for (int64_t i = 0; i < g; ++i) {
            const size_t e = size_t(r * n + gi * g + i);
            if (!(std::fabs(double(x[e]) - double(y[e])) <= step / 2 + slack)) ++worse;  // NaN is worse too
          }
        }
      }
      CHECK(worse == 0);
    }
  }
}

// quantize_rows runs eight elements at a time where the CPU has AVX2. Held, bit for bit, to the
// formula written out here one element at a time in fp32 (the numpy test above allows near-ties
// either way; this one does not): extremes by std::min / std::max in order, fp16 parameters,
// round((x - min) / scale) half to even, clamped.
namespace {
std::vector<uint8_t> quantize_one_by_one(const QuantSpec& s, const std::vector<float>& x, int64_t rows, int64_t n) {
  const size_t rb = quant::row_bytes(s, n), code_bytes = (size_t(n) * size_t(s.bits) + 31) / 32 * 4;
  const size_t groups = size_t((n + s.group_size - 1) / s.group_size);
  const float max_code = float((1 << s.bits) - 1);
  std::vector<uint8_t> q(size_t(rows) * rb, 0);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = q.data() + size_t(r) * rb;
    for (size_t g = 0; g < groups; ++g) {
      const size_t first = g * size_t(s.group_size), end = std::min(size_t(n), first + size_t(s.group_size));
      const float* xr = x.data() + size_t(r * n);
      float lo = xr[first], hi = xr[first];
      for (size_t i = first; i < end; ++i) lo = std::min(lo, xr[i]), hi = std::max(hi, xr[i]);
      const uint16_t min_bits = float_to_half(lo), scale_bits = float_to_half((hi - lo) / max_code);
      std::memcpy(row + code_bytes + 2 * g, &scale_bits, 2);
      std::memcpy(row + code_bytes + 2 * (groups + g), &min_bits, 2);
      const float min16 = half_to_float(min_bits), scale16 = half_to_float(scale_bits);
      for (size_t i = first; i < end; ++i) {
        const unsigned c = scale16 == 0.0f ? 0u : unsigned(std::clamp(std::nearbyint((xr[i] - min16) / scale16), 0.0f, max_code));
        if (s.bits == 8) row[i] = uint8_t(c);
        else row[i / 2] = uint8_t(row[i / 2] | (c << (4 * (i % 2))));
      }
    }
  }
  return q;
}
}  // namespace

TEST_CASE("quantize_rows gives the formula's bytes one element at a time would, ties and signed zeros included", "[quant]") {
  std::mt19937 rng(2026);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int bits : {4, 8})
    for (int g : {32, 64, 128})
      for (int64_t n : {int64_t(512), int64_t(200)}) {  // 200: a shorter last group
        INFO("bits " << bits << " group " << g << " n " << n);
        const QuantSpec s = spec_of(bits, g);
        const int64_t rows = 8;
        std::vector<float> x(size_t(rows * n));
        for (float& v : x) v = normal(rng);
        float* special = x.data();
        // Row 0: exact ties. With lo = 0 and hi = 15 (or 255) the scale is 1 and x = k + 0.5 lies
        // halfway between two codes.
        for (int64_t i = 0; i < n; ++i) special[i] = float(i % (1 << bits)) + ((i / 3) % 2 ? 0.5f : 0.0f);
        for (int64_t first = 0; first < n; first += g) special[first] = 0.0f, special[std::min(n, first + g) - 1] = max_code_of(bits);
        // Row 1: zero extremes of both signs, in both orders, and in different lanes of eight (the
        // scalar loop keeps the first zero it meets; a lane-wise minimum would not).
        special += n;
        for (int64_t i = 0; i < n; ++i) special[i] = std::fabs(special[i]) * ((i / g) % 2 ? -1.0f : 1.0f);
        for (int64_t first = 0; first < n; first += g) {
          const bool plus_first = (first / g) % 4 < 2;
          special[first + 1] = plus_first ? 0.0f : -0.0f;
          special[first + 8] = plus_first ? -0.0f : 0.0f;
        }
        // Row 2: constant groups (scale 0), one of them all negative zeros.
        special += n;
        std::fill(special, special + n, 0.3f);
        std::fill(special, special + std::min<int64_t>(g, n), -0.0f);
        // Row 3: a tiny range, where the fp16 scale is subnormal.
        special += n;
        for (int64_t i = 0; i < n; ++i) special[i] = 1.0f + float(i % 7) * 1e-7f;
        std::vector<uint8_t> got(size_t(rows) * quant::row_bytes(s, n), 0xAB);
        quant::quantize_rows(s, x.data(), DType::F32, rows, n, got.data());
        const std::vector<uint8_t> want = quantize_one_by_one(s, x, rows, n);
        size_t differ = 0;
        for (size_t b = 0; b < got.size(); ++b) differ += got[b] != want[b];
        CHECK(differ == 0);
        // fp32 rows one byte off float alignment (a caller's packed buffer) give the same bytes.
        std::vector<uint8_t> shifted(x.size() * 4 + 1);
        std::memcpy(shifted.data() + 1, x.data(), x.size() * 4);
        quant::quantize_rows(s, shifted.data() + 1, DType::F32, rows, n, got.data());
        CHECK(got == want);
        // The same values in fp16 and bf16 (rounded first) through the converting path.
        for (DType dt : {DType::F16, DType::BF16}) {
          std::vector<uint16_t> x16(x.size());
          std::vector<float> back(x.size());
          for (size_t e = 0; e < x.size(); ++e) {
            x16[e] = dt == DType::F16 ? float_to_half(x[e]) : float_to_bf16(x[e]);
            back[e] = dt == DType::F16 ? half_to_float(x16[e]) : bf16_to_float(x16[e]);
          }
          quant::quantize_rows(s, x16.data(), dt, rows, n, got.data());
          CHECK(got == quantize_one_by_one(s, back, rows, n));
        }
      }
}

TEST_CASE("BF16 input and output go through the same fp32 formula", "[quant]") {
  std::mt19937 rng(99);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  const QuantSpec s = spec_of(4, 64);
  const int64_t rows = 2, n = 128;
  std::vector<uint16_t> x16(size_t(rows * n));
  std::vector<float> x(x16.size());
  for (size_t e = 0; e < x.size(); ++e) {
    x16[e] = float_to_bf16(normal(rng));
    x[e] = bf16_to_float(x16[e]);
  }
  std::vector<uint8_t> q(size_t(rows) * quant::row_bytes(s, n), 0xAB), q16(q.size(), 0xCD);
  quant::quantize_rows(s, x.data(), DType::F32, rows, n, q.data());
  quant::quantize_rows(s, x16.data(), DType::BF16, rows, n, q16.data());
  CHECK(q16 == q);

  std::vector<float> y(x.size());
  std::vector<uint16_t> y16(x.size());
  quant::dequantize_rows(s, q.data(), rows, n, y.data(), DType::F32);
  quant::dequantize_rows(s, q.data(), rows, n, y16.data(), DType::BF16);
  int differ = 0;
  for (size_t e = 0; e < y.size(); ++e) differ += y16[e] != float_to_bf16(y[e]);
  CHECK(differ == 0);
}

TEST_CASE("a constant group has scale 0 and dequantizes to its fp16 minimum", "[quant]") {
  const QuantSpec s = spec_of(4, 32);
  std::vector<float> x(32, 0.1f);
  std::vector<uint8_t> q(quant::row_bytes(s, 32));
  quant::quantize_rows(s, x.data(), DType::F32, 1, 32, q.data());
  for (size_t b = 0; b < 16; ++b) CHECK(q[b] == 0);
  CHECK(stored_half(q, 16) == 0.0f);
  std::vector<float> y(32);
  quant::dequantize_rows(s, q.data(), 1, 32, y.data(), DType::F32);
  for (float v : y) CHECK(v == half_to_float(float_to_half(0.1f)));
}

TEST_CASE("bad specs and inputs are refused, naming the field", "[quant]") {
  CHECK_THROWS_AS(quant::check_spec(spec_of(3, 64), 128), Error);
  CHECK_THROWS_WITH(quant::check_spec(spec_of(3, 64), 128), Catch::Contains("quantization: bits must be 4 or 8, got 3"));
  CHECK_THROWS_WITH(quant::check_spec(spec_of(4, 48), 96),
                    Catch::Contains("quantization: group_size must be 32, 64 or 128, got 48"));
  CHECK_THROWS_WITH(quant::check_spec(spec_of(4, 64), 0), Catch::Contains("n = 0"));
  CHECK_NOTHROW(quant::check_spec(spec_of(8, 128), 256));
  // A group that does not divide the row leaves a shorter last group: 50 code bytes padded to 52, 2 groups.
  CHECK(quant::row_bytes(spec_of(4, 64), 100) == 52 + 2 * 4);
  CHECK(quant::row_bytes(spec_of(4, 32), 21) == 12 + 4);
  CHECK_THROWS_WITH(quant::bytes_per_element(spec_of(16, 64)), Catch::Contains("bits must be 4 or 8, got 16"));

  std::vector<float> x(64, 1.0f);
  std::vector<uint8_t> q(quant::row_bytes(spec_of(4, 64), 64));
  CHECK_THROWS_WITH(quant::quantize_rows(spec_of(4, 64), x.data(), DType::I32, 1, 64, q.data()),
                    Catch::Contains("source dtype must be F32, F16 or BF16, got I32"));
  x[5] = NAN;
  CHECK_THROWS_WITH(quant::quantize_rows(spec_of(4, 64), x.data(), DType::F32, 1, 64, q.data()),
                    Catch::Contains("inputs must be finite"));
  std::vector<float> x2(128, 1.0f);  // an infinity in the second group, named
  x2[100] = -INFINITY;
  std::vector<uint8_t> q2(quant::row_bytes(spec_of(4, 64), 128));
  CHECK_THROWS_WITH(quant::quantize_rows(spec_of(4, 64), x2.data(), DType::F32, 1, 128, q2.data()),
                    Catch::Contains("inputs must be finite (group 1)"));
  x[5] = 1e6f;  // the scale, 1e6 / 15, is beyond fp16
  CHECK_THROWS_WITH(quant::quantize_rows(spec_of(4, 64), x.data(), DType::F32, 1, 64, q.data()),
                    Catch::Contains("beyond fp16's range"));
}

TEST_CASE("the CPU backend quantizes and dequantizes rows as the reference does", "[quant][backend]") {
  auto be = make_cpu_backend(2);
  QuantSpec spec = spec_of(4, 64);
  const int64_t rows = 9, n = 192;
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Buffer xb = be->alloc(size_t(rows * n) * 4), outb = be->alloc(size_t(rows * n) * 4);
  const Tensor x = xb.view(0, DType::F32, {rows, n}), out = outb.view(0, DType::F32, {rows, n});
  for (int64_t i = 0; i < rows * n; ++i) x.ptr<float>()[i] = dist(rng);
  std::vector<uint8_t> want(size_t(rows) * quant::row_bytes(spec, n)), got(want.size(), 0xAB);
  quant::quantize_rows(spec, x.data, DType::F32, rows, n, want.data());
  be->quantize_rows(spec, x, got.data());
  CHECK(got == want);
  std::vector<float> back(size_t(rows * n));
  quant::dequantize_rows(spec, want.data(), rows, n, back.data(), DType::F32);
  be->dequantize_rows(spec, got.data(), out);
  CHECK(std::equal(back.begin(), back.end(), out.ptr<float>()));
  // A row the group does not divide: a shorter last group, as the reference.
  const Tensor odd = xb.view(0, DType::F32, {3, 100}), odd_out = outb.view(0, DType::F32, {3, 100});
  std::vector<uint8_t> want_odd(3 * quant::row_bytes(spec, 100)), got_odd(want_odd.size(), 0xAB);
  quant::quantize_rows(spec, odd.data, DType::F32, 3, 100, want_odd.data());
  be->quantize_rows(spec, odd, got_odd.data());
  CHECK(got_odd == want_odd);
  be->dequantize_rows(spec, got_odd.data(), odd_out);
  std::vector<float> back_odd(300);
  quant::dequantize_rows(spec, want_odd.data(), 3, 100, back_odd.data(), DType::F32);
  CHECK(std::equal(back_odd.begin(), back_odd.end(), odd_out.ptr<float>()));
}
