# ctest starts tests with a higher COST first. A clean build has no timings of its own yet, so
# the slowest cases (seconds in a clean clone's ctest -j2 on 2 cores, 2026-12-03; the halved
# emulated grids measured alone) are named here: started last, any one of them would run alone
# while the other core idles. ctest reads this file after the
# discovered Catch cases (TEST_INCLUDE_FILES, tests/CMakeLists.txt); a name that no longer
# exists is ignored by ctest, so tests/check_ctest_costs.py fails on one.
set(strata_slow_tests
  [=[emulated-backend/CUDA compressed: every placement gives the all-on-GPU compressed run's greedy tokens]=] 110
  [=[a FlexGen-shaped policy runs in a small GPU budget and gives the resident tokens]=] 80
  [=[emulated-backend/CUDA: experts computed on the CPU give the GPU's tokens where their margin allows]=] 66
  [=[strata_ray_local_cluster]=] 59
  [=[every policy generates Hugging Face's greedy tokens]=] 55
  [=[emulated-backend/async: compressed placements give the in-order run's tokens with the device's work reordered]=] 54
  [=[emulated-backend/async: attention delegated to the CPU gives the in-order run's tokens with the device's work reordered]=] 52
  [=[emulated-backend/CUDA: experts placed apart give the all-on-GPU run's tokens]=] 48
  [=[emulated-backend/CUDA: offloaded policies give the resident CUDA run's greedy tokens]=] 45
  [=[emulated-backend/async: every policy gives the in-order run's tokens with the device's work reordered]=] 41
  [=[compressed: every placement gives the all-on-GPU compressed run's greedy tokens]=] 37
  [=[emulated-backend/engine graphs: replayed layer halves give the eager run's tokens and log-probabilities]=] 28
  [=[emulated-backend/CUDA: perplexity reduced on the device equals the host's reduction of the same logits]=] 26
  [=[emulated-backend/CUDA: attention delegated to the CPU gives the GPU attention's tokens where their margin allows]=] 23
  [=[every policy generates Hugging Face's greedy tokens for Gemma's sliding windows and soft caps]=] 20
  [=[serving: every policy generates Hugging Face's greedy tokens as slots refill]=] 19)
list(LENGTH strata_slow_tests n)
math(EXPR last "${n} - 1")
foreach(i RANGE 0 ${last} 2)
  math(EXPR j "${i} + 1")
  list(GET strata_slow_tests ${i} name)
  list(GET strata_slow_tests ${j} cost)
  set_tests_properties("${name}" PROPERTIES COST ${cost})
endforeach()
