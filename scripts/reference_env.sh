#!/usr/bin/env bash
# Makes the reference Python environment that the fixture scripts under tests/fixtures/ run in
# (Hugging Face transformers and tokenizers, gguf, llama-cpp-python, GPTQModel): a venv at
# ${STRATA_REFENV:-.refenv} in the repository root, git-ignored. Only fixture writers need it.
#   scripts/reference_env.sh && .refenv/bin/python tests/fixtures/models/make_models.py
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
env_dir=${STRATA_REFENV:-$here/.refenv}
[ -x "$env_dir/bin/python" ] || python3 -m venv "$env_dir"
"$env_dir/bin/pip" install -q --upgrade pip
# CPU torch first, so that transformers does not pull the CUDA build (gigabytes).
"$env_dir/bin/pip" install -q torch --index-url https://download.pytorch.org/whl/cpu ||
  "$env_dir/bin/pip" install -q torch
"$env_dir/bin/pip" install -q -r "$here/tests/fixtures/requirements.txt"
echo "reference environment ready: $env_dir/bin/python"
