#!/usr/bin/env bash
# Packs the GPU suite's programs for the device tool: stages them with bench/stage_device.sh
# (programs + the libraries the GPU machine lacks), strips them, and writes one gzip tarball,
# .devpack/dev.tgz (git-ignored). The staged tree is ~81 MiB (OpenBLAS alone 36 MiB), over the
# tool's 64 MiB with the working tree; the tarball is ~26 MiB.
#
#   bench/pack_device.sh [BUILD_DIR]      # default build-sm90, built with the programs below
#   STRATA_BEFORE_BUILD=BASELINE_CHECKOUT/build-sm90 bench/pack_device.sh   # also a baseline's strata (part engine)
#   device run, carry [".devpack"]:
#     mkdir -p .device && tar -C .device -xzf .devpack/dev.tgz && source .device/env.sh && bench/gpu_suite.sh $OUT 1
set -euo pipefail
build=${1:-build-sm90}
top=$(git rev-parse --show-toplevel)
cd "$top"
programs=("$build/strata" "$build/tests/strata_tests")
for b in bench_generate bench_offload bench_disk bench_quant bench_cpu_attention bench_decode_attention; do
  programs+=("$build/bench/$b")
done
bench/stage_device.sh "${programs[@]}" > /dev/null
strip -s .device/bin/*
git rev-parse --short HEAD > .device/commit
git diff --quiet HEAD -- src include tests bench || echo "(with uncommitted changes)" >> .device/commit
# A baseline build beside it (issue 34's before/after in one call): its strata, stripped, as
# .device/before/strata (and bench_generate) with the commit it was built from (the libraries are
# this build's).
if [ -n "${STRATA_BEFORE_BUILD:-}" ]; then
  mkdir -p .device/before
  cp "$STRATA_BEFORE_BUILD/strata" .device/before/strata
  strip -s .device/before/strata
  # and its bench_generate (part kernels), where it was built
  if [ -x "$STRATA_BEFORE_BUILD/bench/bench_generate" ]; then
    cp "$STRATA_BEFORE_BUILD/bench/bench_generate" .device/before/bench_generate
    strip -s .device/before/bench_generate
  fi
  git -C "$STRATA_BEFORE_BUILD/.." rev-parse --short HEAD > .device/before/commit
fi
grep -qxF '/.devpack/' .git/info/exclude || echo '/.devpack/' >> .git/info/exclude
mkdir -p .devpack
tar -C .device -czf .devpack/dev.tgz bin lib env.sh commit $( [ -d .device/before ] && echo before )
du -h .devpack/dev.tgz | awk '{print "packed " $1 " in .devpack/dev.tgz (commit " "'"$(head -1 .device/commit)"'" ")"}'
