#!/usr/bin/env bash
# Stages built programs for the GPU machine, which has the NVIDIA driver, the CUDA runtime and
# cuBLAS but not this project's other libraries (GLPK, liburing, yaml-cpp, OpenBLAS, ...):
# copies each program into .device/bin/ and every shared library it loads that the GPU machine
# lacks into .device/lib/, and writes .device/env.sh, which puts both on the search paths.
# .device/ is git-ignored. bench/pack_device.sh packs it into one tarball for the device tool.
#
#   bench/stage_device.sh build-sm90/strata build-sm90/tests/strata_tests
#   on the GPU machine:  source .device/env.sh && strata_tests "[cuda]"
set -euo pipefail
top=$(git rev-parse --show-toplevel)
stage="$top/.device"
rm -rf "$stage"
mkdir -p "$stage/bin" "$stage/lib"
# Libraries the GPU machine brings itself: the C and C++ runtimes and the NVIDIA stack, which
# must match its driver.
provided='^(linux-vdso|ld-linux|libc\.|libm\.|libpthread|libdl\.|librt\.|libgcc_s|libstdc\+\+|libcuda|libcudart|libcublas|libnvidia|libnvrtc|libcufft|libcurand|libcusparse|libcusolver|libnccl)'
for program in "$@"; do
  if [ ! -x "$program" ]; then
    echo "stage_device.sh: $program is not an executable (build it first)" >&2
    exit 2
  fi
  cp "$program" "$stage/bin/"
  ldd "$program" | awk '/=> \//{print $1, $3}' | while read -r name path; do
    [[ $name =~ $provided ]] || cp -L "$path" "$stage/lib/$name"
  done
done
cat > "$stage/env.sh" <<'ENV'
staged=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PATH="$staged/bin:$PATH"
export LD_LIBRARY_PATH="$staged/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
ENV
echo "staged $(du -sh "$stage" | cut -f1) in .device/: $(ls "$stage/bin" | tr '\n' ' ')"
