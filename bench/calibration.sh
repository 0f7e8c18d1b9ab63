#!/usr/bin/env bash
# Compares the cost model with a GPU run (issue 11, calibration): for each policy that
# bench/gpu_suite.sh ran (OUTDIR/policies.tgz, OUTDIR/calib.tsv), the prediction of
# `strata policy --evaluate` with a hardware profile beside the measured total generated tok/s.
# Prints a Markdown table, the median and worst error, and whether the search's pick ("pick") is
# within 10% of the best measured policy.
#
#   bench/calibration.sh OUTDIR policies/hardware/h100-80gb-hbm3.yaml [strata binary]
set -euo pipefail
dir=$1 hw=$2 strata=${3:-build/strata}
model=${CALIB_MODEL:-opt-6.7b} prompt=${CALIB_PROMPT:-512} gen=${CALIB_GEN:-32} gpu_mem=${CALIB_GPU_MEM:-16GiB}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
tar -C "$work" -xzf "$dir/policies.tgz"

echo "| policy | block | weights g/c | kv g/c | act g/c | cpu attn | predicted tok/s | measured tok/s | error |"
echo "|---|---|---|---|---|---|---|---|---|"
errors=()
best_name="" best=0 pick=""
while IFS=$'\t' read -r name file measured; do
  [[ $name == opt30* ]] && continue  # another model; the table is one model's
  policy="$work/policies/$(basename "$file")"
  predicted=$("$strata" policy --model "$model" --hardware "$hw" --prompt-len "$prompt" --gen-len "$gen" \
    --gpu-mem "$gpu_mem" --evaluate "$policy" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["predicted"]["throughput_tok_s"])')
  shape=$(python3 - "$policy" <<'PY'
import sys, yaml
p = yaml.safe_load(open(sys.argv[1]))
f = lambda k: f"{p[k]['gpu']}/{p[k]['cpu']}"
print(f"{p['gpu_batch_size']}x{p['num_gpu_batches']} | {f('weights')} | {f('kv_cache')} | {f('activations')} | {p['cpu_attention']}")
PY
)
  if [[ $measured == failed || -z $measured ]]; then
    printf '| %s | %s | %.1f | failed | |\n' "$name" "$shape" "$predicted"
    continue
  fi
  err=$(python3 -c "print(f'{($predicted - $measured) / $measured * 100:+.0f}')")
  errors+=("$err")
  printf '| %s | %s | %.1f | %.1f | %s%% |\n' "$name" "$shape" "$predicted" "$measured" "$err"
  if python3 -c "import sys; sys.exit(0 if $measured > $best else 1)"; then best=$measured best_name=$name; fi
  [[ $name == pick ]] && pick=$measured
done < "$dir/calib.tsv"

echo
python3 - "${errors[@]}" <<'PY'
import statistics, sys
e = [abs(float(x)) for x in sys.argv[1:]]
if e:
    print(f"policies measured: {len(e)}; median |error| {statistics.median(e):.0f}%, worst {max(e):.0f}%")
PY
if [[ -n $pick ]]; then
  python3 -c "
pick, best = $pick, $best
print(f'search pick: {pick:.1f} tok/s; best measured: {best:.1f} ($best_name); pick/best = {pick / best:.2f}'
      + (' (within 10%)' if pick >= 0.9 * best else ' (NOT within 10%)'))"
fi
