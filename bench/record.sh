#!/usr/bin/env bash
# Runs a benchmark command and writes its output to bench/results/ with the machine, the commit and
# the exact command, so a figure never travels without them.
#   bench/record.sh NAME build/bench/bench_generate --model dummy:opt-6.7b --device cuda
set -euo pipefail
name=$1; shift
here=$(cd "$(dirname "$0")" && pwd)
commit=$(git -C "$here" rev-parse --short HEAD)$(git -C "$here" diff --quiet HEAD -- src include bench || echo "-dirty")
gpu=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1 || true)
cpu=$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')
out="${BENCH_RESULTS_DIR:-$here/results}/$(date -u +%Y-%m-%d)-$name.md"
mkdir -p "$(dirname "$out")"
{
  echo "# $name"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "- commit: $commit"
  echo "- gpu: ${gpu:-none}"
  echo "- cpu: $cpu, $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB"
  echo "- command: \`$*\`"
  echo
  echo '```'
  "$@" 2>&1
  echo '```'
} | tee "$out"
echo "wrote $out" >&2
