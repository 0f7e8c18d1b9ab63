#!/usr/bin/env bash
# The fidelity table of docs/quantization.md: strata perplexity of a text under every compression
# setting the policy accepts, through the offloading engine (the real path of --policy), all
# tensors on the "gpu" tier so only compression differs between rows.
#   bench/perplexity_table.sh [STRATA] [TEXT] [MODEL] [DEVICE]
# Defaults: build/strata, tests/fixtures/perplexity/long.txt (Genesis 1-9, KJV, 6875 SmolLM2
# tokens), the default model (SmolLM2-135M-Instruct, Q4_1 GGUF), cpu. Prints a markdown table.
set -euo pipefail
strata=${1:-build/strata}
text=${2:-tests/fixtures/perplexity/long.txt}
model=${3:-}
device=${4:-cpu}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

run() {  # NAME [YAML LINES...]
  local name=$1; shift
  {
    printf 'gpu_batch_size: 7\nnum_gpu_batches: 2\n'
    printf 'weights: {gpu: 100, cpu: 0, disk: 0}\nkv_cache: {gpu: 100, cpu: 0, disk: 0}\n'
    printf 'activations: {gpu: 100, cpu: 0, disk: 0}\n'
    for line in "$@"; do printf '%s\n' "$line"; done
  } > "$dir/p.yaml"
  local json
  json=$("$strata" perplexity ${model:+--model "$model"} --text "$text" --policy "$dir/p.yaml" --device "$device" \
         --context 512 --json --no-progress 2>/dev/null)
  printf '| %s | %s |\n' "$name" "$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print("%.4f | %d" % (d["perplexity"], d["tokens"]))' "$json")"
}

echo "| compression | perplexity | tokens scored |"
echo "|---|---|---|"
run "none (fp)"
for g in 32 64 128; do run "4-bit weights, g$g" "compress_weights: {bits: 4, group_size: $g}"; done
for g in 32 64 128; do run "4-bit KV cache, g$g" "compress_kv_cache: {bits: 4, group_size: $g}"; done
for g in 32 64 128; do
  run "4-bit weights + KV cache, g$g" "compress_weights: {bits: 4, group_size: $g}" "compress_kv_cache: {bits: 4, group_size: $g}"
done
run "8-bit weights, g64" "compress_weights: {bits: 8, group_size: 64}"
run "8-bit weights + KV cache, g64" "compress_weights: {bits: 8, group_size: 64}" "compress_kv_cache: {bits: 8, group_size: 64}"
