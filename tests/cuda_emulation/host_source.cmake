# cmake -DIN=kernel.cu -DOUT=kernel.cpp -P host_source.cmake
# Rewrites a CUDA source for the emulated build (fake/emulation.h): each launch
# `kernel<args><<<grid, threads, 0, stream>>>(p)` becomes `emu::launch(kernel<args>, grid, threads, p)`.
# A launch of another form is refused, so no kernel silently drops out of the emulated build.
file(READ "${IN}" text)
string(REGEX REPLACE "([A-Za-z_][A-Za-z_0-9]*(<[^<>]*>)?)<<<([^,;]+), ([^,;]+), 0, stream>>>\\(([A-Za-z_][A-Za-z_0-9]*)\\)"
       "emu::launch(\\1, \\3, \\4, \\5)" text "${text}")
string(FIND "${text}" "<<<" left)
if(NOT left EQUAL -1)
  message(FATAL_ERROR "${IN}: a kernel launch the emulated build cannot rewrite")
endif()
file(WRITE "${OUT}.tmp" "// Generated from ${IN} by host_source.cmake for the emulated build.\n#line 1 \"${IN}\"\n${text}")
file(RENAME "${OUT}.tmp" "${OUT}")
