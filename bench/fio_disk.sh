#!/usr/bin/env bash
# The reference for bench_disk: fio's sequential O_DIRECT write then read of a file of the same
# size, in the same directory, with the same request size. bench_disk's read GB/s should reach
# >= 80% of fio's.
# Usage: bench/fio_disk.sh [DIR=build/tmp] [SIZE=1GiB] [BLOCK=64MiB] [ENGINE=io_uring] [IODEPTH=1]
# SIZE and BLOCK take fio's suffixes (1g, 64m; "GiB"/"MiB" are rewritten to those). iodepth 1 is
# what bench_disk does (one blocking request at a time; the store splits each request and keeps
# its pieces in flight); raise IODEPTH to see the device's ceiling.
set -euo pipefail

dir=${1:-build/tmp}
size=${2:-1GiB}
block=${3:-64MiB}
engine=${4:-io_uring}
iodepth=${5:-1}

command -v fio >/dev/null || { echo "fio_disk.sh: fio is not installed" >&2; exit 1; }
# fio reads k/m/g as powers of 2 (its default kb_base=1024), as bench_disk's KiB/MiB/GiB.
to_fio() { echo "$1" | sed -E 's/([0-9])[[:space:]]*([KkMmGgTt])(i?[Bb])?$/\1\L\2/'; }
size_fio=$(to_fio "$size")
block_fio=$(to_fio "$block")

mkdir -p "$dir"
file="$dir/fio-disk-$$.bin"
trap 'rm -f "$file"' EXIT INT TERM

run() {  # $1 = read|write
  fio --name="seq-$1" --filename="$file" --rw="$1" --bs="$block_fio" --size="$size_fio" \
      --direct=1 --ioengine="$engine" --iodepth="$iodepth" --loops=3 --end_fsync=0 \
      --output-format=json 2>/dev/null |
    python3 -c '
import json, sys
op = sys.argv[1]
j = json.load(sys.stdin)["jobs"][0][op]
print("fio %-5s: %.2f GB/s" % (op, j["bw_bytes"] / 1e9))' "$1"
}

echo "fio $(fio --version): $file, $size_fio file, $block_fio requests, O_DIRECT, $engine, iodepth $iodepth, 3 loops"
run write  # lays the file out, then overwrites it twice (bench_disk's passes 2-3 are overwrites too)
run read
