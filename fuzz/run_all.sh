#!/usr/bin/env bash
# Builds every libFuzzer target (clang, ASan + UBSan) and runs each for SECONDS (default 300) on a
# scratch copy of its committed seed corpus, at low priority (STRATA_FUZZ_JOBS at a time); new inputs it finds
# stay in build-fuzz/corpus/<target>/ (merge the useful ones into fuzz/corpus/ by hand), crashes go
# to build-fuzz/findings/<target>/. Prints each target's last status line (execs, cov, ft).
#   fuzz/run_all.sh [SECONDS] [TARGET...]
#   STRATA_FUZZ_SKIP_BUILD=1 fuzz/run_all.sh ...   # use the targets already built
#   STRATA_FUZZ_JOBS=2 fuzz/run_all.sh ...          # two targets at a time (one per core)
# Exit status 1 when any target reported a finding. docs/fuzzing.md has the details.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-300}
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(gguf_fuzz prompts_fuzz policy_fuzz hardware_fuzz safetensors_fuzz tokenizer_fuzz
                                      config_fuzz safetensors_index_fuzz bpe_files_fuzz chat_template_fuzz
                                      sentencepiece_vocab_fuzz packed_fuzz jinja_fuzz regex_fuzz)
BUILD=${STRATA_FUZZ_BUILD:-build-fuzz}

if [ "${STRATA_FUZZ_SKIP_BUILD:-0}" != 1 ]; then  # 1: two runs in parallel share one build
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DSTRATA_FUZZ=ON -DSTRATA_ENABLE_CUDA=OFF >/dev/null
  ninja -C "$BUILD" "${TARGETS[@]}"
fi

# One target's run: its log's last status line, or FINDING (exit 1).
run_target() {
  local t=$1 seeds=fuzz/corpus/$1 work=$BUILD/corpus/$1 findings=$BUILD/findings/$1 dict=()
  mkdir -p "$work" "$findings"
  [ -f "fuzz/dict/$t.dict" ] && dict=(-dict="fuzz/dict/$t.dict")
  local log=$BUILD/findings/$t.log result=0
  # -timeout: an input taking over 10 s is a hang; -rss_limit_mb: 2 GiB is unbounded allocation.
  nice -n 10 "$BUILD/fuzz/$t" "$work" "$seeds" "${dict[@]}" -max_total_time="$SECONDS_EACH" \
      -rss_limit_mb=2048 -timeout=10 -artifact_prefix="$findings/" -print_final_stats=1 >"$log" 2>&1 || result=1
  {
    echo "== $t: ${SECONDS_EACH}s"
    [ $result = 0 ] || echo "   FINDING: see $log and $findings/"
    grep -E "^#[0-9]+" "$log" | tail -n 1 || true
    grep -E "^stat::number_of_executed_units" "$log" || true
  }
  return $result
}

# STRATA_FUZZ_JOBS targets at a time (default 1; CI runs one per core). Each prints its lines
# when it ends.
jobs_max=${STRATA_FUZZ_JOBS:-1}
mkdir -p "$BUILD/findings"
status=0
running=0
for t in "${TARGETS[@]}"; do
  if [ "$running" -ge "$jobs_max" ]; then
    wait -n || status=1
    running=$((running - 1))
  fi
  (
    result=0
    run_target "$t" > "$BUILD/findings/$t.summary" 2>&1 || result=1
    cat "$BUILD/findings/$t.summary"
    exit $result
  ) &
  running=$((running + 1))
done
while [ "$running" -gt 0 ]; do
  wait -n || status=1
  running=$((running - 1))
done
exit $status
