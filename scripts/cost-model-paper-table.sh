#!/usr/bin/env bash
# Regenerates the side-by-side table of docs/cost-model.md: on the FlexGen paper's machine
# (policies/hardware/t4-paper.yaml), the policy `strata policy` picks for OPT-6.7B/30B/175B, prompt
# 512 and 1024, generation 32, without and with --compress, beside the paper's own policy (FlexGen's
# benchmark/flexgen/bench_suite.py), its measured throughput, and the cost model's prediction for it.
# FlexGen publishes its measured throughputs for prompt 512 only (benchmark/batch_size_table.md);
# the 1024 rows print "—" for them.
# Usage: scripts/cost-model-paper-table.sh [STRATA_BINARY]   (default: build/strata)
set -euo pipefail
cd "$(dirname "$0")/.."
STRATA=${1:-build/strata}
HW=policies/hardware/t4-paper.yaml
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The paper's policies: model, prompt, compression (- | kv | w+kv), gpu_batch_size, num_gpu_batches,
# FlexGen --percent (weights gpu cpu, cache gpu cpu, activations gpu cpu), --cpu, --overlap, and the
# measured throughput (tok/s) of FlexGen's benchmark/batch_size_table.md, or - where it has none.
cases=(
  "opt-6.7b 512 - 2 1 100 0 100 0 100 0 false false 25.26"
  "opt-6.7b 512 w+kv 72 1 100 0 100 0 100 0 false false 29.12"
  "opt-6.7b 1024 - 1 1 100 0 100 0 100 0 false false -"
  "opt-6.7b 1024 w+kv 28 1 100 0 100 0 100 0 false false -"
  "opt-30b 512 - 48 3 20 80 0 100 0 100 true true 7.32"
  "opt-30b 512 kv 64 8 0 100 0 100 0 100 false true 8.38"
  "opt-30b 1024 - 20 4 4 96 0 100 0 100 true true -"
  "opt-30b 1024 kv 20 12 0 100 0 100 0 100 false true -"
  "opt-175b 512 - 32 8 0 50 0 0 0 100 true true 0.69"
  "opt-175b 512 w+kv 48 3 0 100 0 100 0 100 false true 1.12"
  "opt-175b 1024 - 12 12 0 50 0 0 0 100 true true -"
  "opt-175b 1024 w+kv 12 4 0 100 0 100 0 100 false true -"
)

JQ_POLICY='def split(s): "\(s.gpu)/\(s.cpu)/\(s.disk)";
  def comp: if .compress_weights and .compress_kv_cache then ", 4-bit w+kv"
            elif .compress_weights then ", 4-bit w" elif .compress_kv_cache then ", 4-bit kv" else "" end;
  def pol: "\(.gpu_batch_size)×\(.num_gpu_batches), w \(split(.weights)), kv \(split(.kv_cache)), act \(split(.activations))"
           + (if .cpu_attention then ", cpu-attn" else "" end) + comp + (if .overlap then "" else ", no overlap" end)
           + (if (.prefill_batches_per_step // 0) > 0 then ", stagger \(.prefill_batches_per_step)" else "" end);'

echo "| model | prompt | paper policy (gbs×ngb, % gpu/cpu/disk) | paper tok/s | model's tok/s for it | Strata's choice | predicted tok/s | latency s | bound (decode) |"
echo "|---|---|---|---|---|---|---|---|---|"
for c in "${cases[@]}"; do
  read -r model prompt comp gbs ngb wg wc cg cc hg hc cpu overlap paper <<<"$c"
  pf="$tmp/paper.yaml"
  {
    echo "gpu_batch_size: $gbs"
    echo "num_gpu_batches: $ngb"
    echo "weights:     {gpu: $wg, cpu: $wc, disk: $((100 - wg - wc))}"
    echo "kv_cache:    {gpu: $cg, cpu: $cc, disk: $((100 - cg - cc))}"
    echo "activations: {gpu: $hg, cpu: $hc, disk: $((100 - hg - hc))}"
    echo "overlap: $overlap"
    echo "cpu_attention: $cpu"
    [[ $comp == w+kv ]] && echo "compress_weights: {bits: 4, group_size: 64}"
    [[ $comp != - ]] && echo "compress_kv_cache: {bits: 4, group_size: 64}"
  } >"$pf"
  flags=(--model "$model" --hardware "$HW" --prompt-len "$prompt" --gen-len 32 --json)
  ev=$("$STRATA" policy "${flags[@]}" --evaluate "$pf")
  search_flags=()
  [[ $comp != - ]] && search_flags=(--compress)
  se=$("$STRATA" policy "${flags[@]}" "${search_flags[@]}")
  paper_pol=$(jq -r "$JQ_POLICY .policy | pol" <<<"$ev")
  ev_tput=$(jq -r '"\(.predicted.throughput_tok_s * 100 | round / 100)" + (if .fits then "" else " (over budget)" end)' <<<"$ev")
  our_pol=$(jq -r "$JQ_POLICY .policy | pol" <<<"$se")
  our=$(jq -r '"\(.predicted.throughput_tok_s * 100 | round / 100) | \(.predicted.latency_s | round) | \(.predicted.per_layer.decode.bound)"' <<<"$se")
  label="$model"
  [[ $comp != - ]] && label="$model (c)"
  [[ $paper == - ]] && paper="—"
  echo "| $label | $prompt | $paper_pol | $paper | $ev_tput | $our_pol | $our |"
done
