// Which OpenBLAS kernels the CPU backend's GEMMs run on.
//
// OpenBLAS (built with DYNAMIC_ARCH, as Debian's is) picks its kernels for the CPU when it is
// loaded. Versions before 0.3.25 do not recognise Intel CPUs newer than themselves and fall back to
// their oldest x86-64 kernels, Prescott's (SSE3): Debian 12's 0.3.21 does that on a 5th-generation
// Xeon (family 6, model 207), where its sgemm then runs at about a third of the AVX-512 kernels'
// rate (OpenBLAS issue 4267). OPENBLAS_CORETYPE overrides the choice, but OpenBLAS reads it only
// while loading, before main(), so a program that finds the fallback runs itself again with it set.
#pragma once
#include <string>

namespace strata {

// The kernels OpenBLAS uses in this process, as openblas_get_corename() names them ("Haswell").
std::string blas_core();

// The best OpenBLAS 0.3.21 core this CPU's instructions and the OS support: "Cooperlake" (AVX-512
// with bf16), "SkylakeX" (AVX-512), "Haswell" (AVX2 and FMA; "Zen" on AMD), or "" when none of these.
std::string blas_core_for_cpu();

// Call first in main(). When OpenBLAS runs a core below blas_core_for_cpu() and the user set no
// OPENBLAS_CORETYPE, sets it to that core and execs the program again with the same arguments (the
// second run finds the variable set and goes on). Otherwise, or if the exec fails, returns.
void use_best_blas_core(char** argv);

}  // namespace strata
