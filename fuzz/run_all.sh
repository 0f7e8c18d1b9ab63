#!/usr/bin/env bash
# Builds every libFuzzer target (clang, ASan + UBSan) and runs each for SECONDS (default 300) on a
# scratch copy of its committed seed corpus, one after another at low priority; new inputs it finds
# stay in build-fuzz/corpus/<target>/ (merge the useful ones into fuzz/corpus/ by hand), crashes go
# to build-fuzz/findings/<target>/. Prints each target's last status line (execs, cov, ft).
#   fuzz/run_all.sh [SECONDS] [TARGET...]
#   STRATA_FUZZ_SKIP_BUILD=1 fuzz/run_all.sh ...   # use the targets already built
# Exit status 1 when any target reported a finding. docs/fuzzing.md has the details.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-300}
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(gguf_fuzz prompts_fuzz policy_fuzz hardware_fuzz safetensors_fuzz tokenizer_fuzz
                                      config_fuzz safetensors_index_fuzz bpe_files_fuzz chat_template_fuzz
                                      sentencepiece_vocab_fuzz packed_fuzz)
BUILD=${STRATA_FUZZ_BUILD:-build-fuzz}

if [ "${STRATA_FUZZ_SKIP_BUILD:-0}" != 1 ]; then  # 1: two runs in parallel share one build
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DSTRATA_FUZZ=ON -DSTRATA_ENABLE_CUDA=OFF >/dev/null
  ninja -C "$BUILD" "${TARGETS[@]}"
fi

status=0
for t in "${TARGETS[@]}"; do
  seeds=fuzz/corpus/$t
  work=$BUILD/corpus/$t
  findings=$BUILD/findings/$t
  mkdir -p "$work" "$findings"
  dict=()
  [ -f "fuzz/dict/$t.dict" ] && dict=(-dict="fuzz/dict/$t.dict")
  log=$BUILD/findings/$t.log
  echo "== $t: ${SECONDS_EACH}s"
  # -timeout: an input taking over 10 s is a hang; -rss_limit_mb: 2 GiB is unbounded allocation.
  if ! nice -n 10 "$BUILD/fuzz/$t" "$work" "$seeds" "${dict[@]}" -max_total_time="$SECONDS_EACH" \
      -rss_limit_mb=2048 -timeout=10 -artifact_prefix="$findings/" -print_final_stats=1 >"$log" 2>&1; then
    echo "   FINDING: see $log and $findings/"
    status=1
  fi
  grep -E "^#[0-9]+" "$log" | tail -n 1 || true
  grep -E "^stat::number_of_executed_units" "$log" || true
done
exit $status
