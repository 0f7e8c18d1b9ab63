#!/usr/bin/env bash
# The whole GPU check in two calls of under 10 minutes each (issue 11): run on the GPU machine over
# the staged programs (strata, strata_tests, bench_generate, bench_offload, bench_disk on PATH, as
# bench/stage_device.sh and .device/env.sh arrange), from the repository root.
#
#   bench/gpu_suite.sh OUTDIR 1     # = tests profile generate offload run30  (about 6 minutes on an H100)
#   bench/gpu_suite.sh OUTDIR 2     # = calibrate                             (about 9 minutes)
#   bench/gpu_suite.sh OUTDIR "tests offload"   # any of the named parts (quant: only by name)
#
#   tests      nvidia-smi, strata_tests "[cuda]", again with STRATA_CUDA_SYNC=1 (unless
#              STRATA_SUITE_SYNC_RERUN=0), the HF fp16 parity
#   profile    strata profile -> OUTDIR/hardware.yaml
#   generate   bench_generate on dummy:opt-6.7b (decode GB/s, prefill GEMM share at 4096 tokens),
#              then with STRATA_CUDA_ATTENTION=per-token (prefill attention without tensor cores)
#   offload    bench_offload on dummy:opt-6.7b, bench_disk
#   run30      the paper's OPT-30B policy (block scaled to 48 x 1 for the host's memory) under
#              --gpu-mem 16GiB, with nvidia-smi's reading of the GPU memory it used
#   quant      strata_tests "[cuda][quant]", bench_quant on dummy:opt-1.3b (needs bench_quant staged)
#              and its kernels on dummy:opt-6.7b's matrices, bench_cpu_attention at OPT-30B's shape
#              when staged
#   calibrate  strata bench --suite calibrate-gpu --calibrate (dummy:opt-6.7b, 14 policies under 16 GiB,
#              the search's pick among them) with OUTDIR/hardware.yaml when part profile wrote it,
#              else $STRATA_HARDWARE or policies/hardware/<gpu>.yaml: OUTDIR/calibrate.tgz holds
#              results.md (predicted beside measured), calibration.md and calibrated-profile.yaml
#   engine     issue 34: calibrate-gpu's c2, c3, c5, c7 with the staged baseline build and this one,
#              bench_generate's resident step at batch 8, bench_cpu_attention at the CPU-attention
#              shapes: OUT/engine.tgz and its cases in OUT/summary.json (with the metrics issue 34
#              judges by). Only by name
#   kernels    issue 35: bench_generate's batch-1 decode and 4096-token prefill on dummy:opt-6.7b and
#              dummy:llama-3-8b with the staged baseline's bench_generate and this one (step graphs
#              on, then STRATA_CUDA_GRAPHS=0), bench_offload's batch-8 engine with its layer-half
#              graphs on and off, then bench_decode_attention under STRATA_SPLIT_KV=0, auto and 8; also
#              LLaMA-3-8B's decode at batch 64 greedy and sampled (temperature 0.8 with top-p 0.95,
#              whose flat dummy rows fall back to the host, and with top-k 50, drawn from the device's
#              candidates) and bench_sampling (one host thread, then the device step). Only by name
#   moe        issue 39: dummy:mixtral-8x7b under --gpu-mem 16GiB, prompt 512, generation 32 (decode
#              projected from 4 steps): the search's policy, then 16 x 2 with 2 of 32 layers on the
#              GPU and the experts moved, and the same computing them on the CPU in decode (cpu_experts):
#              OUT/moe.tgz and its cases in OUT/summary.json; resident 4-bit Qwen3-30B-A3B and Mixtral
#              (4 and 2 layers, batch 8; Qwen3 also 64) routed on the host, then on the device; then
#              bench_quant --grouped on the GPU
#              and --cold --grouped on the host CPU over Qwen3-30B-A3B's expert matrices (when
#              staged). Only by name
#   gptoss     dummy:gpt-oss-20b under --gpu-mem 16GiB (decode projected from 4 steps), the same
#              weights split (20/80) with fp16 experts and with compress_weights {8, 32} (what
#              MXFP4 experts keep exactly, 9 bits a value), at prompt 512; then the cache on the CPU
#              with GPU attention at prompt 4096, where its sliding layers load only their window:
#              OUT/gptoss.tgz and its cases in OUT/summary.json (cpu->gpu bytes, predicted beside
#              measured). Only by name
#   peers      issue 36: FlexGen 0.1.8 and Accelerate beside Strata on the same cases (prompt 512,
#              generation 32), in pairs, fastest first: OUT/peers.tgz and OUT/summary.json. A peer's
#              row already committed for this card kind (bench/results/*-GPU-summary.json) is kept,
#              not rerun (bench/peers/kept.py; STRATA_PEERS_RERUN=1 reruns). Needs .whl/
#              (bench/peers/prepare_offline.py) carried; only by name
#   embed      embeddings (docs/batch-format.md "Embeddings") on Qwen3-Embedding-8B's shape
#              (dummy:qwen3-8b, $STRATA_SUITE_EMBED_MODEL to change it): 256 /v1/embeddings inputs of
#              512 tokens through `strata run`, then the same texts as prompts generating one token
#              (their prefill), then the same prompts scored (prompt_logprobs 1: the prefill with
#              every position's logprob, reduced on the device by RowScorer), each's tok/s in the
#              summary. Only by name
#
# STRATA_SUITE_DEADLINE=S: no step starts later than S seconds into the script, and a running one
# is cut before it (a device call's limit), so the archives and summaries are always written.
#
# OUTDIR (default $OUT, else bench/suite-out) receives suite.log (every command and its output),
# summary.md, hardware.yaml, calib.tsv and policies.tgz (run30), calibrate.tgz. Everything is also
# printed.
set -uo pipefail
out=${1:-${OUT:-bench/suite-out}}
parts=${2:-12}
case $parts in 1) parts="tests profile generate offload run30" ;; 2) parts="calibrate" ;; 12) parts="tests profile generate offload run30 calibrate" ;; esac
mkdir -p "$out"
log="$out/suite.log"
summary="$out/summary.md"
root=$(pwd)
offload_dir=${STRATA_SUITE_OFFLOAD_DIR:-/tmp/strata-suite}
mkdir -p "$offload_dir"
# The staged test binary runs far from its build tree: point it at this checkout.
export STRATA_TEST_FIXTURES="$root/tests/fixtures"
export STRATA_TEST_BINARY
STRATA_TEST_BINARY=$(command -v strata)
export STRATA_CACHE=${STRATA_CACHE:-/tmp/strata-cache}

# the staged build's ("abc1234 (with uncommitted changes)" on one line)
commit=$( (cat .device/commit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown) | paste -sd' ')
failures=0
skipped=0
step_skipped=0
step_seconds=0

say() { echo "$*" | tee -a "$summary"; }
# step NAME CMD...: runs one command, its output into suite.log and the terminal, its exit status
# and wall time into the summary.
step() {
  local name=$1; shift
  echo "### $name: $*" | tee -a "$log"
  local limit=${STRATA_SUITE_STEP_TIMEOUT:-300}
  if [ -n "${STRATA_SUITE_DEADLINE:-}" ]; then
    # A device call has a hard end: a step that cannot finish before it is skipped, and one that
    # starts is cut in time for the archives and summary.json to be written.
    local left=$((STRATA_SUITE_DEADLINE - SECONDS - 15))
    if [ "$left" -lt "${STRATA_SUITE_MIN_STEP:-20}" ]; then
      say "- $name: skipped (the call's deadline, ${STRATA_SUITE_DEADLINE} s, is near): \`$*\`"
      skipped=$((skipped + 1))
      step_skipped=1
      return 124
    fi
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  local t0=$SECONDS
  step_skipped=0
  timeout "$limit" "$@" 2>&1 | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  local status="ok"; [ "$rc" -ne 0 ] && { status="FAILED (exit $rc)"; failures=$((failures + 1)); }
  step_seconds=$((SECONDS - t0))
  say "- $name: $status in $step_seconds s: \`$*\`"
  return "$rc"
}
catch_summary() {  # the Catch2 result line of the last test run in the log
  grep -E "^(All tests passed|test cases:)" "$log" | tail -1
}

gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
gpu_slug=$(echo "${gpu_name:-nogpu}" | tr 'A-Z' 'a-z' | sed 's/^nvidia //; s/[^a-z0-9]\+/-/g; s/-$//')
{
  echo "# GPU suite, part(s) $parts"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "- commit: $commit"
  echo "- gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
  echo "- cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB"
  echo "- command: \`bench/gpu_suite.sh $out $parts\`"
  echo
} | tee -a "$summary"

ran_cuda_tests=0
part_tests() {
  step nvidia-smi nvidia-smi
  step "cuda tests" strata_tests "[cuda]" --durations yes
  say "  - $(catch_summary)"
  ran_cuda_tests=1
  # The rerun with every call synchronised tells a race from a wrong kernel; a short device
  # session skips it with STRATA_SUITE_SYNC_RERUN=0.
  if [ "${STRATA_SUITE_SYNC_RERUN:-1}" != 0 ]; then
    STRATA_CUDA_SYNC=1 step "cuda tests, STRATA_CUDA_SYNC=1" strata_tests "[cuda]"
    say "  - $(catch_summary)"
  fi
  step "HF fp16 parity" strata_tests "[model][hf][cuda]" -s
  say "  - $(catch_summary)"
}
part_profile() {
  step "profile" strata profile --device cuda --offload-dir "$offload_dir" --out "$out/hardware.yaml"
}
part_generate() {
  step "bench_generate opt-6.7b" bench_generate --model dummy:opt-6.7b --device cuda --batch 1 \
    --prompt-len 32 --gen-len 32 --prefill-tokens 4096
  # The same prefill on the per-token attention kernel alone (before attention_tc.cu), to compare.
  step "bench_generate opt-6.7b, per-token attention" env STRATA_CUDA_ATTENTION=per-token bench_generate \
    --model dummy:opt-6.7b --device cuda --batch 1 --prompt-len 32 --gen-len 32 --prefill-tokens 4096
}
part_offload() {
  # Weights on disk would read 13 GB per pass at the disk's ~2 GB/s: the store is measured alone.
  step "bench_offload opt-6.7b" bench_offload --model dummy:opt-6.7b --device cuda --gen-len 16 --skip-disk
  step "bench_disk" bench_disk --dir "$offload_dir" --size 4GiB
}
part_quant() {
  # Compression (issue 9): the quantized kernels' tests, then their speed and the engine's decode
  # step with 4-bit weights on the CPU tier against fp16 (disk skipped, as in part offload).
  # (part tests, when it ran in this call, has run them already)
  [ "$ran_cuda_tests" = 1 ] || step "[cuda][quant] tests" strata_tests "[cuda][quant]"
  # Issue 9's shape: dummy:opt-1.3b, weights on the CPU tier and on disk (2.6 GB per fp16 pass).
  step "bench_quant opt-1.3b" bench_quant --model dummy:opt-1.3b --device cuda --batch 8 --gen-len 8 \
    --offload-dir "$offload_dir"
  # The kernels alone on OPT-6.7B's larger matrices ([16384 x 4096]): where the fused linear stops
  # beating dequantize + fp16 linear, against fused_dequant_max_tokens().
  step "bench_quant opt-6.7b kernels" bench_quant --model dummy:opt-6.7b --device cuda --skip-engine
  # CPU attention over fp16 / 4-bit caches at OPT-30B's shape (FlexGen's 48-sequence batches of
  # 512 + 32 tokens): the host side of cpu_attention policies, on all of the host's cores.
  if command -v bench_cpu_attention >/dev/null; then
    step "bench_cpu_attention opt-30b" bench_cpu_attention --slots 48 --context 544 --heads 56 --kv-heads 56
  fi
}

# A JSONL of N prompts of LEN tokens each (the dummy models' tokenizer is one token per byte).
make_prompts() {
  local n=$1 len=$2 file=$3
  python3 - "$n" "$len" > "$file" <<'PY'
import json, sys
n, length = int(sys.argv[1]), int(sys.argv[2])
for i in range(n):
    text = (f"prompt {i}: " + "the quick brown fox jumps over the lazy dog " * 64)[:length]
    print(json.dumps({"id": i, "prompt": text}))
PY
}

# run_policy NAME POLICY.yaml MODEL GPU_MEM [extra strata run flags]: one block of the policy at
# prompt 512, generation 32; appends "name <tab> measured total tok/s" to calib.tsv.
run_policy() {
  local name=$1 policy=$2 model=$3 gpu_mem=$4; shift 4
  local gbs ngb
  gbs=$(awk '/^gpu_batch_size:/{print $2}' "$policy")
  ngb=$(awk '/^num_gpu_batches:/{print $2}' "$policy")
  make_prompts $((gbs * ngb)) 512 "$out/prompts.jsonl"
  rm -f "$out/run.jsonl" "$out/run.jsonl.partial"
  step "run $name" strata run --model "$model" --device cuda --prompts "$out/prompts.jsonl" --out "$out/run.jsonl" \
    --max-new-tokens 32 --ignore-eos --no-progress --policy "$policy" --gpu-mem "$gpu_mem" \
    --offload-dir "$offload_dir" --report "$@"
  local rc=$?
  local tps
  tps=$(tac "$log" | grep -m1 -oE 'total [0-9.]+ generated tok/s' | awk '{print $2}')
  [ "$rc" -eq 0 ] || tps="failed"
  printf '%s\t%s\t%s\n' "$name" "$policy" "$tps" >> "$out/calib.tsv"
  rm -f "$out/run.jsonl" "$out/run.jsonl.partial" "$out/prompts.jsonl"
}

part_embed() {
  local model=${STRATA_SUITE_EMBED_MODEL:-dummy:qwen3-8b}
  python3 - "$out/embed.jsonl" "$out/prefill.jsonl" "$out/score.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as e, open(sys.argv[2], "w") as p, open(sys.argv[3], "w") as s:
    for i in range(256):
        text = (f"text {i}: " + "the quick brown fox jumps over the lazy dog " * 16)[:512]
        e.write(json.dumps({"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
                            "body": {"model": "m", "input": text}}) + "\n")
        p.write(json.dumps({"id": i, "prompt": text}) + "\n")
        s.write(json.dumps({"id": i, "prompt": text, "prompt_logprobs": 1}) + "\n")
PY
  rm -f "$out"/embed-out.jsonl* "$out"/prefill-out.jsonl*
  step "embeddings $model" strata run --model "$model" --device cuda --prompts "$out/embed.jsonl" \
    --out "$out/embed-out.jsonl" --no-progress
  say "  - $(tac "$log" | grep -m1 -E '^embeddings: [0-9]+ inputs')"
  step "prefill $model" strata run --model "$model" --device cuda --prompts "$out/prefill.jsonl" \
    --out "$out/prefill-out.jsonl" --max-new-tokens 1 --ignore-eos --batch-size 256 --no-progress
  say "  - $(tac "$log" | grep -m1 -E '^prefill: ')"
  step "scored prefill $model" strata run --model "$model" --device cuda --prompts "$out/score.jsonl" \
    --out "$out/score-out.jsonl" --max-new-tokens 1 --ignore-eos --batch-size 256 --no-progress
  say "  - scored $(tac "$log" | grep -m1 -E '^prefill: ')"
  say "  - $(tac "$log" | grep -m1 -E '^prompt logprobs: ')"
  rm -f "$out"/embed*.jsonl* "$out"/prefill*.jsonl* "$out"/score*.jsonl*
}

write_policy() {  # write_policy FILE GBS NGB W_GPU W_CPU KV_GPU KV_CPU ACT_GPU ACT_CPU CPU_ATTENTION
  cat > "$1" <<EOF
gpu_batch_size: $2
num_gpu_batches: $3
weights:     {gpu: $4, cpu: $5, disk: 0}
kv_cache:    {gpu: $6, cpu: $7, disk: 0}
activations: {gpu: $8, cpu: $9, disk: 0}
overlap: true
cpu_attention: ${10}
EOF
}

part_run30() {
  local pol="$out/policies"
  mkdir -p "$pol"
  # FlexGen's OPT-30B policy (48 x 3, weights 20/80, cache and activations on the CPU, CPU
  # attention) under FlexGen's 16 GB GPU. Its 100 GiB KV cache needs more pinned memory than a
  # 128 GiB machine has, so the block is scaled to 48 x 1: the GPU's plan does not depend on the
  # number of GPU batches (homes of cache and hidden states are on the CPU).
  write_policy "$pol/opt30-paper-48x1.yaml" 48 1 20 80 0 100 0 100 true
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$out/gpu-mem.log" 2>/dev/null &
  local smi=$!
  run_policy opt30-paper-48x1 "$pol/opt30-paper-48x1.yaml" dummy:opt-30b 16GiB --verbose
  kill "$smi" 2>/dev/null
  say "  - GPU memory used while it ran (nvidia-smi, MiB, max of 200 ms samples): $(sort -n "$out/gpu-mem.log" | tail -1)"
  rm -f "$out/gpu-mem.log"
}

part_calibrate() {
  # The cost model's calibration grid (bench/suites/calibrate-gpu.yaml, about 9 minutes): measured
  # beside predicted with the profile, then the profile fitted to the runs. strata bench keeps each
  # finished case in results.jsonl, so a run cut by the step's timeout is fitted from what it has.
  local hw="$out/hardware.yaml"
  [ -f "$hw" ] || hw=${STRATA_HARDWARE:-policies/hardware/$gpu_slug.yaml}
  if [ ! -f "$hw" ]; then
    say "- calibrate: FAILED: no hardware profile at $hw (run part profile first, or set STRATA_HARDWARE)"
    failures=$((failures + 1))
    return
  fi
  local dir="$out/calibrate"
  STRATA_SUITE_STEP_TIMEOUT=${STRATA_SUITE_CALIBRATE_TIMEOUT:-540} step "bench calibrate-gpu" \
    strata bench --suite bench/suites/calibrate-gpu.yaml --device cuda --hardware "$hw" --calibrate \
    --offload-dir "$offload_dir" --out "$dir" --no-progress
  if [ -f "$dir/results.jsonl" ] && [ ! -f "$dir/calibration.md" ]; then
    step "calibration fit (the finished cases)" strata bench --report "$dir" --calibrate --hardware "$hw"
  fi
  [ -f "$dir/calibration.md" ] && tee -a "$summary" < "$dir/calibration.md"
  # One archive: the device tool returns at most 8 files.
  [ -d "$dir" ] && tar -C "$out" -czf "$out/calibrate.tgz" calibrate && rm -rf "$dir"
}

# The asynchronous engine's GPU figures (issue 34, point 4): calibrate-gpu's c2 (all on the GPU,
# 8 x 1) and its CPU-attention policies c3, c5, c7, each first with the baseline build when one is
# staged (.device/before/strata, bench/pack_device.sh with STRATA_BEFORE_BUILD) and then with this
# build, pair by pair; bench_generate's resident step at c2's batch; bench_cpu_attention's bare
# fp16 cache GB/s at each CPU-attention shape and at OPT-30B's 48 x 544. OUT/engine.tgz.
part_engine() {
  local dir="$out/engine" hw=${STRATA_HARDWARE:-policies/hardware/$gpu_slug.yaml}
  local steps=${STRATA_ENGINE_DECODE_STEPS:-8} before=.device/before/strata
  rm -rf "$dir"; mkdir -p "$dir/before" "$dir/after"
  [ -f .device/before/commit ] && cp .device/before/commit "$dir/before/commit"
  # What the pairs are judged against first (half a minute): a call cut short still has it.
  step "bench_generate opt-6.7b batch 8 (c2's resident step)" bench_generate --model dummy:opt-6.7b --device cuda \
    --batch 8 --prompt-len 512 --gen-len 32
  local shape
  for shape in 16:32 32:32 48:32 48:56; do
    step "bench_cpu_attention ${shape%%:*} slots x 544, ${shape#*:} heads" bench_cpu_attention --slots "${shape%%:*}" \
      --context 544 --heads "${shape#*:}" --kv-heads "${shape#*:}" --caches fp16
  done
  local c policy
  for c in c2:all-gpu-8x1 c3:cache-cpu-attn-16x1 c5:weights-cpu-attn-32x4 c7:act-cpu-attn-48x3; do
    policy="$root/bench/suites/calibrate-gpu/${c#*:}.yaml"
    printf 'name: engine-%s\ncases:\n  - {name: %s, model: opt-6.7b, prompt_len: 512, gen_len: 32, gpu_mem: 16GiB, policy: %s, decode_steps: %s}\n' \
      "${c%%:*}" "${c/:/-}" "$policy" "$steps" > "$dir/${c%%:*}.yaml"
    if [ -x "$before" ]; then
      step "engine ${c%%:*} before ($(cat .device/before/commit 2>/dev/null))" "$before" bench --suite "$dir/${c%%:*}.yaml" \
        --device cuda --hardware "$hw" --offload-dir "$offload_dir" --out "$dir/before/${c%%:*}" --no-progress
    fi
    step "engine ${c%%:*}" strata bench --suite "$dir/${c%%:*}.yaml" --device cuda --hardware "$hw" \
      --offload-dir "$offload_dir" --out "$dir/after/${c%%:*}" --no-progress
  done
}

# Issue 35's kernels, before (the staged baseline's bench_generate, when packed) and after, with
# step graphs and without: the resident decode step at batch 1 and a 4096-token prefill of OPT-6.7B and of LLaMA-3-8B (SwiGLU,
# GQA: the stacked projections' other shapes; 16 GB in fp16), then decode attention
# alone under STRATA_SPLIT_KV=0 (the per-token kernel), auto (the rule) and forced chunk counts.
part_kernels() {
  kernels_ran=1  # write_summary: its metrics come from the log (bench/summary_json.py, kernel_cases)
  local before=.device/before/bench_generate model
  for model in opt-6.7b llama-3-8b; do
    local args=(--model "dummy:$model" --device cuda --batch 1 --prompt-len 32 --gen-len 32 --prefill-tokens 4096)
    [ -x "$before" ] && step "bench_generate $model before ($(cat .device/before/commit 2>/dev/null))" "$before" "${args[@]}"
    step "bench_generate $model" bench_generate "${args[@]}"
    step "bench_generate $model, STRATA_CUDA_GRAPHS=0" env STRATA_CUDA_GRAPHS=0 bench_generate "${args[@]}"
  done
  # bf16 (issue 35, point 5): LLaMA-3-8B is a bf16 release; the same steps in bf16 beside fp16's.
  step "bench_generate llama-3-8b --dtype bf16" bench_generate --model dummy:llama-3-8b --device cuda --batch 1 \
    --prompt-len 32 --gen-len 32 --prefill-tokens 4096 --dtype bf16
  # Sampling (bench/results/2026-11-29-cpu-sampling*.md): LLaMA-3-8B's 128k vocabulary at batch 64,
  # greedy (the device's argmax) against every row sampled; then bench_sampling.
  local sampled_args=(--model dummy:llama-3-8b --device cuda --batch 64 --prompt-len 32 --gen-len 16 --prefill-tokens 512)
  step "bench_generate llama-3-8b batch 64 greedy" bench_generate "${sampled_args[@]}"
  step "bench_generate llama-3-8b batch 64 sampled" bench_generate "${sampled_args[@]}" --temperature 0.8 --top-p 0.95
  # Dummy weights' rows are flat: top-p 0.95 above falls back to the rows' logits, top-k 50 stays
  # within their device-made candidates (docs/cuda-backend.md, "Sampling on the device").
  step "bench_generate llama-3-8b batch 64 sampled, top-k 50" bench_generate "${sampled_args[@]}" --temperature 0.8 \
    --top-k 50
  command -v bench_sampling >/dev/null && step "bench_sampling" bench_sampling --vocab 128256 --repeat 30
  # The engine's per-layer-half graphs (docs/offload.md, "Graphs"): its resident decode step at
  # batch 8 with and without them.
  local offload_args=(--model dummy:opt-6.7b --device cuda --batch 8 --gen-len 16 --skip-disk)
  step "bench_offload opt-6.7b batch 8 (engine graphs)" bench_offload "${offload_args[@]}"
  step "bench_offload opt-6.7b batch 8, STRATA_CUDA_GRAPHS=0" env STRATA_CUDA_GRAPHS=0 bench_offload "${offload_args[@]}"
  command -v bench_decode_attention >/dev/null || { say "- bench_decode_attention not staged: skipped"; return; }
  local shape split slots ctx heads kvh
  for shape in 1:4096:32:8 1:32768:32:8 4:2048:32:32 16:2048:32:32 64:1024:32:8; do
    IFS=: read -r slots ctx heads kvh <<< "$shape"
    for split in 0 auto 8; do
      step "decode attention $slots x $ctx, $heads/$kvh heads, STRATA_SPLIT_KV=$split" env STRATA_SPLIT_KV=$split \
        bench_decode_attention --slots "$slots" --context "$ctx" --heads "$heads" --kv-heads "$kvh" --head-dim 128
    done
  done
  step "decode attention 1 x 32768, 32/8 heads, bf16" bench_decode_attention --slots 1 --context 32768 --heads 32 \
    --kv-heads 8 --head-dim 128 --dtype bf16
}

# Issue 39's GPU figure: Mixtral-8x7B under 16 GiB, the search's choice first (a call cut short
# still has it), then experts moved against experts computed where they live, one policy apart.
# Run part profile first where time allows: its profile has the CPU weight-streaming rate that
# prices experts on the CPU; the shipped GPU profiles predate it (the model then falls back to the
# CPU attention rate, bench/results/2026-11-28-cpu-moe-weight-rate.md).
part_moe() {
  local dir="$out/moe" hw="$out/hardware.yaml"
  [ -f "$hw" ] || hw=${STRATA_HARDWARE:-policies/hardware/$gpu_slug.yaml}
  rm -rf "$dir"; mkdir -p "$dir"
  local base="gpu_batch_size: 16\nnum_gpu_batches: 2\nweights: {gpu: 6, cpu: 94, disk: 0}\nkv_cache: {gpu: 100, cpu: 0, disk: 0}\nactivations: {gpu: 100, cpu: 0, disk: 0}\n"
  printf "$base" > "$dir/moved.yaml"
  printf "${base}cpu_experts: decode\n" > "$dir/cpu-decode.yaml"
  {
    echo "name: moe-gpu"
    echo "cases:"
    local c
    for c in auto:auto moved:"$dir/moved.yaml" cpu-decode:"$dir/cpu-decode.yaml"; do
      echo "  - {name: mixtral-${c%%:*}, model: mixtral-8x7b, prompt_len: 512, gen_len: 32, gpu_mem: 16GiB, decode_steps: 4, policy: ${c#*:}}"
    done
  } > "$dir/suite.yaml"
  STRATA_SUITE_STEP_TIMEOUT=${STRATA_SUITE_MOE_TIMEOUT:-480} step "bench moe-gpu (mixtral-8x7b)" \
    strata bench --suite "$dir/suite.yaml" --device cuda --hardware "$hw" --offload-dir "$offload_dir" \
    --out "$dir/run" --no-progress
  [ -f "$dir/run/results.md" ] && tee -a "$summary" < "$dir/run/results.md"
  # Routing on the device against the host's round trip per sparse layer (STRATA_DEVICE_ROUTING=0):
  # resident 4-bit experts, 8 tokens a decode step (and Qwen3-MoE's 64, which route on the device
  # too), cut to 4 and 2 layers (each case loads and quantizes its weights); the device's run
  # replays its layer halves as graphs, the host's only the attention halves.
  local b
  for b in 8 64; do
    printf 'gpu_batch_size: %s\nnum_gpu_batches: 1\nweights: {gpu: 100, cpu: 0, disk: 0}\nkv_cache: {gpu: 100, cpu: 0, disk: 0}\nactivations: {gpu: 100, cpu: 0, disk: 0}\ncompress_weights: {bits: 4, group_size: 64}\n' \
      "$b" > "$dir/resident-q4-b$b.yaml"
  done
  local where
  for where in host device; do
    {
      echo "name: moe-routing-$where"
      echo "cases:"
      echo "  - {name: qwen3-30b-a3b-4l-q4-b8-$where-routing, model: qwen3-30b-a3b, layers: 4, prompt_len: 128, gen_len: 32, decode_steps: 16, policy: $dir/resident-q4-b8.yaml}"
      echo "  - {name: mixtral-8x7b-2l-q4-b8-$where-routing, model: mixtral-8x7b, layers: 2, prompt_len: 128, gen_len: 32, decode_steps: 16, policy: $dir/resident-q4-b8.yaml}"
      echo "  - {name: qwen3-30b-a3b-4l-q4-b64-$where-routing, model: qwen3-30b-a3b, layers: 4, prompt_len: 128, gen_len: 32, decode_steps: 16, policy: $dir/resident-q4-b64.yaml}"
    } > "$dir/routing-$where.yaml"
    STRATA_DEVICE_ROUTING=$([ $where = host ] && echo 0 || echo 1) STRATA_SUITE_STEP_TIMEOUT=120 \
      step "bench moe routing on the $where" strata bench --suite "$dir/routing-$where.yaml" --device cuda \
      --hardware "$hw" --offload-dir "$offload_dir" --out "$dir/routing-$where" --no-progress
    [ -f "$dir/routing-$where/results.md" ] && tee -a "$summary" < "$dir/routing-$where/results.md"
  done
  # Qwen3-30B-A3B's expert matrices: on the GPU, the fused linear and a step's experts one launch
  # each against the grouped launches (Backend::linears); on the host's CPU (the CPU lane's
  # experts), the linear over codes cached and from memory, and the experts one linear each
  # against one parallel region.
  if command -v bench_quant > /dev/null; then
    STRATA_SUITE_STEP_TIMEOUT=120 step "bench_quant experts on the GPU" \
      bash -c "bench_quant --model dummy:qwen3-30b-a3b --skip-engine --device cuda --grouped > '$dir/bench_quant-experts-gpu.txt' 2>&1; rc=\$?; cat '$dir/bench_quant-experts-gpu.txt'; exit \$rc"
    STRATA_SUITE_STEP_TIMEOUT=120 step "bench_quant experts on the host CPU" \
      bash -c "bench_quant --model dummy:qwen3-30b-a3b --skip-engine --device cpu --cold --grouped > '$dir/bench_quant-experts.txt' 2>&1; rc=\$?; cat '$dir/bench_quant-experts.txt'; exit \$rc"
  fi
}

part_gptoss() {
  local dir="$out/gptoss" hw="$out/hardware.yaml"
  [ -f "$hw" ] || hw=${STRATA_HARDWARE:-policies/hardware/$gpu_slug.yaml}
  rm -rf "$dir"; mkdir -p "$dir"
  local base="gpu_batch_size: 8\nnum_gpu_batches: 1\nweights: {gpu: 20, cpu: 80, disk: 0}\nactivations: {gpu: 100, cpu: 0, disk: 0}\n"
  printf "${base}kv_cache: {gpu: 100, cpu: 0, disk: 0}\n" > "$dir/fp16.yaml"
  printf "${base}kv_cache: {gpu: 100, cpu: 0, disk: 0}\ncompress_weights: {bits: 8, group_size: 32}\n" > "$dir/w8g32.yaml"
  printf "${base}kv_cache: {gpu: 0, cpu: 100, disk: 0}\ncpu_attention: false\n" > "$dir/cpu-cache.yaml"
  {
    echo "name: gptoss-gpu"
    echo "cases:"
    # STRATA_SUITE_GPTOSS_LAYERS=N cuts the model (a rehearsal on a small host).
    local cut=${STRATA_SUITE_GPTOSS_LAYERS:+, layers: $STRATA_SUITE_GPTOSS_LAYERS}
    echo "  - {name: gpt-oss-20b-fp16, model: gpt-oss-20b, prompt_len: 512, gen_len: 32, gpu_mem: 16GiB, decode_steps: 4, policy: $dir/fp16.yaml$cut}"
    echo "  - {name: gpt-oss-20b-w8g32, model: gpt-oss-20b, prompt_len: 512, gen_len: 32, gpu_mem: 16GiB, decode_steps: 4, policy: $dir/w8g32.yaml$cut}"
    echo "  - {name: gpt-oss-20b-cpu-cache-4k, model: gpt-oss-20b, prompt_len: 4096, gen_len: 32, gpu_mem: 16GiB, decode_steps: 4, policy: $dir/cpu-cache.yaml$cut}"
  } > "$dir/suite.yaml"
  STRATA_SUITE_STEP_TIMEOUT=${STRATA_SUITE_GPTOSS_TIMEOUT:-420} step "bench gptoss-gpu (gpt-oss-20b)" \
    strata bench --suite "$dir/suite.yaml" --device "${STRATA_SUITE_DEVICE:-cuda}" --hardware "$hw" \
    --offload-dir "$offload_dir" --out "$dir/run" --no-progress
  [ -f "$dir/run/results.md" ] && tee -a "$summary" < "$dir/run/results.md"
}

# peer_pair NAME MODEL POLICY ENGINES... : one case (prompt 512, generation 32) in Strata (policy
# file, or auto under --gpu-mem 16GiB), then in each peer engine named, into $out/peers/NAME/.
peer_pair() {
  local name=$1 model=$2 policy=$3; shift 3
  local dir="$out/peers/$name" steps=${STRATA_PEERS_DECODE_STEPS:-4}
  mkdir -p "$dir"
  # decode_steps: decode projected from a few steps, as FlexGen's --debug-mode fewer_batch does.
  printf 'name: peers-%s\ncases:\n  - {name: %s, model: %s, prompt_len: 512, gen_len: 32, policy: %s, gpu_mem: 16GiB, cpu_mem: %sGiB, decode_steps: %s}\n' \
    "$name" "$name" "$model" "$policy" "$host_budget" "$steps" > "$dir/suite.yaml"
  step "strata $name" strata bench --suite "$dir/suite.yaml" --device cuda --hardware "$peers_hw" \
    --offload-dir "$offload_dir" --out "$dir" --no-progress
  local engine
  for engine in "$@"; do
    # Once per card kind: a peer's ok row committed for this card is kept, not rerun
    # (STRATA_PEERS_RERUN=1 reruns it).
    if [ "${STRATA_PEERS_RERUN:-0}" = 0 ] && python3 bench/peers/kept.py --gpu "$gpu_slug" --name "$name" \
         --engine "$engine" --out "$dir" | tee -a "$log"; [ "${PIPESTATUS[0]}" = 0 ]; then
      say "- $engine $name: kept from an earlier call on this card kind ($(tail -1 "$dir/peers.jsonl" | grep -o '"kept_from": "[^"]*"'))"
      continue
    fi
    case $engine in
      flexgen) STRATA_SUITE_STEP_TIMEOUT=${STRATA_PEERS_TIMEOUT:-240} step "flexgen $name" \
                 python3 bench/peers/flexgen_runner.py --suite "$dir/suite.yaml" --out "$dir" --fewer-batch \
                 --hf-home "$peers_hf" --offload-dir "$offload_dir/flexgen" --strata strata --hardware "$peers_hw" ;;
      accelerate) STRATA_SUITE_STEP_TIMEOUT=${STRATA_PEERS_TIMEOUT:-240} step "accelerate $name" \
                 python3 bench/peers/accelerate_runner.py --suite "$dir/suite.yaml" --out "$dir" \
                 --offload-dir "$offload_dir/accelerate" --strata strata --hardware "$peers_hw" --batch-size 8 \
                 --decode-steps "${STRATA_PEERS_ACCELERATE_DECODE_STEPS:-3}" ;;
    esac
    local rc=$? status
    if [ "$step_skipped" = 1 ]; then status="not run: the call's deadline came first"
    elif [ "$rc" = 124 ]; then status="failed: timed out after $step_seconds s (the step's limit)"
    else status="failed: exit $rc without a result line (suite.log has its output)"; fi
    [ "$rc" = 0 ] || python3 bench/peers/record_missing.py --suite "$dir/suite.yaml" --out "$dir" --engine "$engine" \
      --status "$status" | tee -a "$log"
  done
  cat "$dir/results.jsonl" >> "$out/peers/results.jsonl" 2>/dev/null
  cat "$dir/peers.jsonl" >> "$out/peers/peers.jsonl" 2>/dev/null
}

part_peers() {
  # Offline peers (bench/peers/README.md): FlexGen's wheel from .whl/, its OPT tokenizer from a
  # cache built here from the repository's GPT-2 BPE, FlexGen patched by flexgen_shim.py.
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/peers-site .whl/*.whl
    export PYTHONPATH=/tmp/peers-site${PYTHONPATH:+:$PYTHONPATH}
  fi
  peers_hf=/tmp/peers-hf
  python3 bench/peers/opt_tokenizer_cache.py "$peers_hf" > /dev/null
  peers_hw="$out/hardware.yaml"
  [ -f "$peers_hw" ] || peers_hw=${STRATA_HARDWARE:-policies/hardware/$gpu_slug.yaml}
  # The host's CPU budget: its memory less 16 GiB for the system and the pinned staging buffers.
  host_budget=$(( $(free -g | awk '/Mem:/{print $2}') - 16 ))
  rm -rf "$out/peers"; mkdir -p "$out/peers/policies"
  local pol="$out/peers/policies"
  HF_HOME=$peers_hf step "flexgen shim check" python3 bench/peers/flexgen_shim.py --check
  # FlexGen's OPT-30B policy: 48 x N, the most GPU batches the host holds (each 48-sequence batch's
  # fp16 cache is 36 GB beside 48 GB of CPU weights: 1 on a 128 GiB host).
  local n30=$(( (host_budget - 50) / 36 )); [ "$n30" -ge 1 ] || n30=1
  write_policy "$pol/opt30-flexgen.yaml" 48 "$n30" 20 80 0 100 0 100 true
  # FlexGen's 4-bit OPT-30B policy (64 x 8, all on the CPU), scaled: 4-bit weights ~17 GB, a
  # 64-sequence batch's 4-bit cache ~14 GB.
  # STRATA_PEERS_4BIT_MAX_BATCHES cuts it further where a call's time is short (both engines
  # prefill the whole block, Strata twice with its warm-up).
  local n4=$(( (host_budget - 25) / 14 )); [ "$n4" -le "${STRATA_PEERS_4BIT_MAX_BATCHES:-8}" ] || n4=${STRATA_PEERS_4BIT_MAX_BATCHES:-8}
  [ "$n4" -ge 1 ] || n4=1
  write_policy "$pol/opt30-flexgen-4bit.yaml" 64 "$n4" 0 100 0 100 0 100 false
  printf 'compress_weights: {bits: 4, group_size: 64}\ncompress_kv_cache: {bits: 4, group_size: 64}\n' \
    >> "$pol/opt30-flexgen-4bit.yaml"
  # FlexGen's OPT-6.7B 2 x 1 on the GPU (overlap off, as its policy file).
  write_policy "$pol/opt67-flexgen.yaml" 2 1 100 0 100 0 100 0 false
  sed -i 's/^overlap: true/overlap: false/' "$pol/opt67-flexgen.yaml"
  # Pairs first, the cheapest one first (it shows whether FlexGen runs at all), then FlexGen's
  # headline policy and Accelerate: a call cut short still leaves complete pairs.
  peer_pair opt67-flexgen-2x1 opt-6.7b "$pol/opt67-flexgen.yaml" flexgen
  peer_pair opt30-flexgen-48x$n30 opt-30b "$pol/opt30-flexgen.yaml" flexgen
  peer_pair opt30-strata-auto opt-30b auto accelerate
  peer_pair opt30-flexgen-4bit-64x$n4 opt-30b "$pol/opt30-flexgen-4bit.yaml" flexgen
  peer_pair opt67-strata-auto opt-6.7b auto
  strata bench --report "$out/peers" > /dev/null 2>&1
}

# OUT/summary.json (issue 36, point 3) from parts peers, engine, moe and kernels, then their archives.
write_summary() {
  [ -d "$out/peers" ] || [ -d "$out/engine" ] || [ -d "$out/moe" ] || [ -d "$out/gptoss" ] || [ -n "${kernels_ran:-}" ] ||
    return 0
  local inputs="$out/peers" args=(--commit "$commit" --strata-build "${commit%% *}" --log "$log"
    --strata-command "strata bench --suite CASE.yaml --device cuda (bench/gpu_suite.sh $parts)")
  [ -d "$inputs" ] || { inputs="$out/summary-inputs"; mkdir -p "$inputs"; }
  [ -d "$out/engine" ] && args+=(--engine "$out/engine")
  if [ -f "$out/moe/run/results.jsonl" ]; then  # --results replaces the default: name both
    [ -f "$inputs/results.jsonl" ] && args+=(--results "$inputs/results.jsonl")
    args+=(--results "$out/moe/run/results.jsonl")
  fi
  local where
  for where in host device; do
    [ -f "$out/moe/routing-$where/results.jsonl" ] && args+=(--results "$out/moe/routing-$where/results.jsonl")
  done
  if [ -f "$out/gptoss/run/results.jsonl" ]; then
    [ -f "$inputs/results.jsonl" ] && [ ! -f "$out/moe/run/results.jsonl" ] && args+=(--results "$inputs/results.jsonl")
    args+=(--results "$out/gptoss/run/results.jsonl")
  fi
  python3 bench/summary_json.py "$inputs" "${args[@]}" && cp "$inputs/summary.json" "$out/summary.json"
  rm -rf "$out/summary-inputs"
  local d
  for d in peers engine moe gptoss; do
    [ -d "$out/$d" ] && tar -C "$out" -czf "$out/$d.tgz" "$d" && rm -rf "${out:?}/$d"
  done
}

for part in $parts; do
  case $part in
    tests|profile|generate|offload|run30|calibrate|quant|peers|engine|kernels|moe|gptoss|embed) "part_$part" ;;
    *) echo "gpu_suite.sh: unknown part '$part'" >&2; exit 2 ;;
  esac
done
write_summary
[ -d "$out/policies" ] && tar -C "$out" -czf "$out/policies.tgz" policies && rm -rf "$out/policies"
rm -rf "$offload_dir"
say ""
say "failed steps: $failures"
[ "$skipped" -eq 0 ] || say "skipped steps (deadline): $skipped"
[ "$failures" -eq 0 ]
