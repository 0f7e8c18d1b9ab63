// The test runner: Catch2's, after the CPU backend's BLAS kernels are settled
// (strata/backend/blas_core.h), so the tests run the kernels `strata` runs.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "strata/backend/blas_core.h"

int main(int argc, char** argv) {
  strata::use_best_blas_core(argv);
  return Catch::Session().run(argc, argv);
}
