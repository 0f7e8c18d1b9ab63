#!/usr/bin/env bash
# Packs the GPU suite's programs for the device tool: stages them with bench/stage_device.sh
# (programs + the libraries the GPU machine lacks), strips them, and writes one gzip tarball,
# .devpack/dev.tgz (git-ignored), then checks that what a call carries fits the tool's 64 MiB:
# the tracked and untracked files, .devpack and .whl (if present). Every program links all the
# kernels, so build it for the card alone and without line tables (the default):
# -DCMAKE_CUDA_ARCHITECTURES=90-real. Then the tarball is 27 MiB and a call carries 54 MiB
# (2026-11-29; with -lineinfo and PTX the tarball was 40 MiB, and 67 MiB with the tree: over).
# A baseline's programs (STRATA_BEFORE_BUILD, below) add ~3 MiB each if built the same way.
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
for b in bench_generate bench_offload bench_disk bench_quant bench_cpu_attention bench_decode_attention bench_sampling; do
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
# What a device call carries with .devpack (and .whl, for the peers): over 64 MiB the call fails
# before it starts, at device time's cost.
tree=$( { git ls-files -z; git ls-files -z --others --exclude-standard; } | xargs -0 -r stat -c %s -- 2>/dev/null |
        awk '{s += $1} END {print s + 0}')
carried=$(du -sb .devpack $( [ -d .whl ] && echo .whl ) | awk '{s += $1} END {print s}')
mib=$(( (tree + carried) / 1048576 ))
echo "a call carries ${mib} MiB of 64: the tree $(( tree / 1048576 )), .devpack$( [ -d .whl ] && echo ' and .whl') $(( carried / 1048576 ))"
if (( tree + carried > 64 * 1048576 )); then
  echo "pack_device: over the device tool's 64 MiB; build with -DCMAKE_CUDA_ARCHITECTURES=90-real and without" \
       "-DSTRATA_CUDA_LINEINFO=ON, or pack fewer programs" >&2
  exit 1
fi
