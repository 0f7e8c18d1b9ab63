# cmake -DIN=kernel.cu -DOUT=kernel.cpp -P host_source.cmake
# Rewrites a CUDA source for the emulated build (fake/emulation.h): each launch
# `kernel<targs><<<grid, block, shared, stream>>>(args)` becomes
# `emu::Launch(<a lambda calling kernel<targs>>, emu::LaunchConfig{grid, block, shared, stream}).run(args)`
# (a lambda, so a kernel template still deduces its arguments from the call).
# `extern __shared__ T name[]` becomes `T* name = emu::dynamic_shared<T>()`, the launch's dynamic
# shared memory. A `<<<` left over fails, so no kernel silently drops out of the emulated build.
file(READ "${IN}" text)
string(REGEX REPLACE "([A-Za-z_][A-Za-z_0-9]*(<[^<>]*>)?)<<<" "emu::Launch([](const auto&... a) { \\1(a...); }, emu::LaunchConfig{" text "${text}")
string(REPLACE ">>>(" "}).run(" text "${text}")
string(REGEX REPLACE "extern __shared__ ([A-Za-z_0-9]+) ([A-Za-z_0-9]+)\\[\\]" "\\1* \\2 = emu::dynamic_shared<\\1>()" text "${text}")
string(FIND "${text}" "<<<" left)
if(NOT left EQUAL -1)
  message(FATAL_ERROR "${IN}: a kernel launch the emulated build cannot rewrite")
endif()
string(FIND "${text}" ">>>" left)
if(NOT left EQUAL -1)
  message(FATAL_ERROR "${IN}: a kernel launch the emulated build cannot rewrite")
endif()
file(WRITE "${OUT}.tmp" "// Generated from ${IN} by host_source.cmake for the emulated build.\n#line 1 \"${IN}\"\n${text}")
file(RENAME "${OUT}.tmp" "${OUT}")
