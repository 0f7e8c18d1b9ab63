# ctest starts tests with a higher COST first. A clean build has no timings of its own yet, so
# the slowest cases (seconds in a clean clone's ctest -j2 on 2 cores, 2026-11-29) are named here: started last, any
# one of them would run alone while the other core idles. ctest reads this file after the
# discovered Catch cases (TEST_INCLUDE_FILES, tests/CMakeLists.txt); a name that no longer
# exists is ignored by ctest, so tests/check_ctest_costs.py fails on one.
set(strata_slow_tests
  [=[emulated-backend/CUDA compressed: every placement gives the all-on-GPU compressed run's greedy tokens]=] 266
  [=[emulated-backend/CUDA: offloaded policies give the resident CUDA run's greedy tokens]=] 102
  [=[emulated-backend/async: compressed placements give the in-order run's tokens with the device's work reordered]=] 54
  [=[emulated-backend/async: every policy gives the in-order run's tokens with the device's work reordered]=] 58
  [=[emulated-backend/async: attention delegated to the CPU gives the in-order run's tokens with the device's work reordered]=] 54
  [=[a FlexGen-shaped policy runs in a small GPU budget and gives the resident tokens]=] 179
  [=[every policy generates Hugging Face's greedy tokens]=] 53
  [=[emulated-backend/CUDA: attention delegated to the CPU gives the GPU attention's tokens where their margin allows]=] 15
  [=[compressed: every placement gives the all-on-GPU compressed run's greedy tokens]=] 33
  [=[emulated-backend/CUDA: experts placed apart give the all-on-GPU run's tokens]=] 32
  [=[emulated-backend/CUDA: experts computed on the CPU give the GPU's tokens where their margin allows]=] 35
  [=[emulated-backend/CUDA: GPTQ and AWQ codes cross the links and give transformers' NLLs within fp16 tolerance]=] 5
  [=[emulated-backend/CUDA: logits match Hugging Face within fp16 tolerance, greedy where the margin allows]=] 7
  [=[emulated-backend/CUDA bf16: logits within twice transformers' own bf16 error, greedy where the margin allows]=] 4
  [=[emulated-backend/CUDA bf16: offloaded policies give the all-on-GPU bf16 run's tokens, delegated attention within margin]=] 7
  [=[emulated-backend/cuda: split-KV decode attention matches the CPU backend]=] 6)
list(LENGTH strata_slow_tests n)
math(EXPR last "${n} - 1")
foreach(i RANGE 0 ${last} 2)
  math(EXPR j "${i} + 1")
  list(GET strata_slow_tests ${i} name)
  list(GET strata_slow_tests ${j} cost)
  set_tests_properties("${name}" PROPERTIES COST ${cost})
endforeach()
