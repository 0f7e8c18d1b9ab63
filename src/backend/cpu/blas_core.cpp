#include "strata/backend/blas_core.h"

#include <cblas.h>
#include <unistd.h>

#include <cstdlib>

namespace strata {
namespace {

// The x86-64 cores of OpenBLAS 0.3.21 without AVX2, as openblas_get_corename() names them: what it
// falls back to on a CPU it does not know. Only these are replaced; a core with AVX2 or AVX-512, or
// one newer than this list, is OpenBLAS's own informed choice.
bool pre_avx2(const std::string& core) {
  for (const char* old : {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Sandybridge", "Atom", "Nano",
                          "Opteron", "Opteron_SSE3", "Barcelona", "Bobcat", "Bulldozer", "Piledriver", "Steamroller"})
    if (core == old) return true;
  return false;
}

}  // namespace

std::string blas_core() {
  const char* name = openblas_get_corename();
  return name ? name : "";
}

std::string blas_core_for_cpu() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (__builtin_cpu_is("amd")) return avx2 ? "Zen" : "";  // OpenBLAS's AMD kernels stop at AVX2
  if (!__builtin_cpu_is("intel")) return "";
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512cd");
  if (avx512) return __builtin_cpu_supports("avx512bf16") ? "Cooperlake" : "SkylakeX";
  return avx2 ? "Haswell" : "";
#else
  return "";
#endif
}

void use_best_blas_core(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;  // the user's choice, or our second run
  const std::string want = blas_core_for_cpu();
  const std::string have = blas_core();
  if (want.empty() || !pre_avx2(have)) return;
  if (setenv("OPENBLAS_CORETYPE", want.c_str(), 1) != 0) return;
  execv("/proc/self/exe", argv);
  unsetenv("OPENBLAS_CORETYPE");  // the exec failed: go on with OpenBLAS's choice
}

}  // namespace strata
