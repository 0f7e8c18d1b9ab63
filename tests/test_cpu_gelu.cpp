// The CPU backend's GELU (transformers' exact erf form, eight values at a time by an erfc
// approximation) against a float64 reference over a fine grid, its tails and special values, at
// lengths that leave every remainder of eight to the scalar path.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "strata/backend/backend.h"

using namespace strata;

namespace {

double gelu_reference(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }

// The backend's GELU over `values` as one [1, n] tensor.
std::vector<float> backend_gelu(Backend& be, const std::vector<float>& values) {
  const int64_t n = int64_t(values.size());
  Buffer buf = be.alloc(values.size() * 4);
  be.copy_to_device(buf.data(), values.data(), values.size() * 4);
  be.activation(Activation::GELU, buf.view(0, DType::F32, {1, n}));
  std::vector<float> out(values.size());
  be.copy_to_host_f32(buf.view(0, DType::F32, {1, n}), out.data());
  return out;
}

}  // namespace

TEST_CASE("the CPU backend's GELU is the exact erf form within its erfc approximation's bound", "[cpu][gelu]") {
  auto be = make_cpu_backend(2);
  std::vector<float> x;
  for (int i = -120000; i <= 120000; ++i) x.push_back(float(i) * 1e-4f);  // [-12, 12] in steps of 1e-4
  for (float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-6f, -1e-6f, 30.0f, -30.0f, 100.0f, -100.0f, 1e4f, -1e4f})
    x.push_back(v);
  // Abramowitz and Stegun 7.1.26's |error| in erf, 1.5e-7, is 0.75e-7 |x| in GELU; float rounding
  // of the result adds a few ulp of it.
  for (size_t n : {x.size(), size_t(1), size_t(7), size_t(9), size_t(15)}) {
    const std::vector<float> in(x.begin(), x.begin() + std::ptrdiff_t(n));
    const std::vector<float> got = backend_gelu(*be, in);
    size_t bad = 0;
    double worst = 0;
    for (size_t i = 0; i < n; ++i) {
      const double want = gelu_reference(double(in[i]));
      const double err = std::fabs(double(got[i]) - want);
      const double bound = 0.75e-7 * std::fabs(double(in[i])) + 4 * double(std::numeric_limits<float>::epsilon()) * std::fabs(want);
      worst = std::max(worst, err / std::max(std::fabs(double(in[i])), 1e-300));
      if (!(err <= bound)) ++bad;
    }
    INFO("n " << n << ": worst |error| / |x| " << worst);
    CHECK(bad == 0);
  }
  // The tails: far below 0 the value is under 1e-37 (the exponential is held at 1e-38 rather than
  // going subnormal), far above it is x.
  const std::vector<float> tails = backend_gelu(*be, {-100.0f, -30.0f, 30.0f, 100.0f, 0.0f, -0.0f, 1.0f, -1.0f, 2.0f});
  CHECK(std::fabs(tails[0]) < 1e-37f);
  CHECK(std::fabs(tails[1]) < 1e-37f);
  CHECK(tails[2] == 30.0f);
  CHECK(tails[3] == 100.0f);
  CHECK(tails[4] == 0.0f);
  CHECK(tails[6] == Approx(0.8413447460685429).epsilon(1e-7));
}
