#!/usr/bin/env python3
"""Runs FlexGen 0.1.8 (PyPI `flexgen`, `python -m flexgen.flex_opt`) on a Strata bench case: the
same model shape (an OPT preset, dummy weights: --path _DUMMY_), prompt and generation length, and
the case's policy translated into FlexGen's flags, then appends its figures to OUT/peers.jsonl.

    python3 bench/peers/flexgen_runner.py --suite paper-table2 --case opt-6.7b-512 --out bench-out

FlexGen has no memory caps: the policy's percentages decide what goes where (the case's caps are
recorded beside its line, not enforced). It writes its figures to --log-file
(flexgen/utils.py write_benchmark_log); parse_log reads them back.
"""
import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

ENGINE = "flexgen"
DUMMY_PATH = "_DUMMY_"  # flex_opt.py DUMMY_WEIGHT: weights are random, nothing is downloaded
# Patches FlexGen for torch 2.11 / transformers 5 in memory, then runs `-m flexgen.flex_opt`.
SHIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "flexgen_shim.py")
TOKENIZER_NOTE = ("OPT tokenizer: an offline stand-in (GPT-2 byte-level BPE from tests/fixtures, ids shifted "
                  "by 4; bench/peers/opt_tokenizer_cache.py); with dummy weights the ids only need to be valid")


def flexgen_args(case, policy, log_file, offload_dir, fewer_batch=False, python="python3", shim=True):
    """The command line for one case (through flexgen_shim.py unless shim is False). CaseError when
    FlexGen cannot express the case."""
    model = common.hf_model_name(case.model)
    if policy.activations.get("disk", 0):
        raise CaseError_(case, "FlexGen keeps no activations on disk")
    for what, comp in (("weights", policy.compress_weights), ("KV cache", policy.compress_kv_cache)):
        if comp and (int(comp.get("bits", 4)), int(comp.get("group_size", 64))) != (4, 64):
            raise CaseError_(case, f"FlexGen compresses {what} at 4 bits in groups of 64 only")
    w, c, h = policy.weights, policy.kv_cache, policy.activations
    cmd = [python] + ([SHIM] if shim else []) + ["-m", "flexgen.flex_opt"]
    cmd += ["--model", model, "--path", DUMMY_PATH, "--offload-dir", offload_dir,
            "--prompt-len", str(case.prompt_len), "--gen-len", str(case.gen_len),
            "--gpu-batch-size", str(policy.gpu_batch_size), "--num-gpu-batches", str(policy.num_gpu_batches),
            "--percent", str(w["gpu"]), str(w["cpu"]), str(c["gpu"]), str(c["cpu"]), str(h["gpu"]), str(h["cpu"])]
    if not policy.overlap:
        cmd += ["--overlap", "false"]
    if policy.cpu_attention:
        cmd.append("--cpu-cache-compute")
    if policy.compress_weights:
        cmd.append("--compress-weight")
    if policy.compress_kv_cache:
        cmd.append("--compress-cache")
    if fewer_batch:  # the paper's published runs: all of prefill, a few decode steps, projected
        cmd += ["--debug-mode", "fewer_batch"]
    cmd += ["--log-file", log_file]
    return cmd


def CaseError_(case, why):
    return common.CaseError(f"case {case.name}: {why}")


_FLOAT = r"([-+0-9.eE]+|nan|inf)"
_LOG_FIELDS = {
    "model_gb": r"model size: " + _FLOAT + " GB",
    "cache_gb": r"cache size: " + _FLOAT + " GB",
    "hidden_gb": r"hidden size \(p\): " + _FLOAT + " GB",
    "peak_gpu_gb": r"peak gpu mem: " + _FLOAT + " GB",
    "projected": r"projected: (True|False)",
    "prefill_latency_s": r"prefill latency: " + _FLOAT + " s",
    "prefill_tok_s": r"prefill throughput: " + _FLOAT + " token/s",
    "decode_latency_s": r"decode latency: " + _FLOAT + " s",
    "decode_tok_s": r"decode throughput: " + _FLOAT + " token/s",
    "total_latency_s": r"total latency: " + _FLOAT + " s",
    "total_tok_s": r"total throughput: " + _FLOAT + " token/s",
}


def parse_log(text):
    """The last record of a FlexGen benchmark log (the file is appended to, one record per run):
    a dict of _LOG_FIELDS' keys. ValueError when no complete record is there."""
    starts = [m.start() for m in re.finditer(r"model size: ", text)]
    if not starts:
        raise ValueError("no FlexGen benchmark record (no 'model size:')")
    record = text[starts[-1]:]
    out = {}
    for key, pattern in _LOG_FIELDS.items():
        m = re.search(pattern, record)
        if not m:
            raise ValueError(f"FlexGen record without '{pattern.split(':')[0]}'")
        out[key] = m.group(1) == "True" if key == "projected" else float(m.group(1))
    return out


def measured_from_log(record):
    """FlexGen's own throughputs are Strata's definitions already (flex_opt.py run_flexgen:
    prefill = prompts x prompt_len / prefill latency, decode = prompts x (gen_len - 1) / decode
    latency, total = prompts x gen_len / (prefill + decode latency))."""
    return {k: record[k] for k in ("prefill_tok_s", "decode_tok_s", "total_tok_s")}


def child_env(hf_home, environ=None):
    """FlexGen's environment: with hf_home, the Hugging Face cache that holds its tokenizer, offline."""
    env = dict(os.environ if environ is None else environ)
    if hf_home:
        env.update(HF_HOME=os.path.abspath(hf_home), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return env


def run_case(case, args):
    policy, policy_cmd = common.resolve_policy(case, args.strata, args.hardware)
    log_file = os.path.join(args.out, f"flexgen-{case.name}.log")
    offload = args.offload_dir or tempfile.mkdtemp(prefix="flexgen-offload-")
    cmd = flexgen_args(case, policy, log_file, offload, args.fewer_batch, args.python, shim=not args.no_shim)
    command = shlex.join(cmd)
    if args.dry_run:
        print(command)
        return None
    os.makedirs(args.out, exist_ok=True)
    if os.path.exists(log_file):
        os.remove(log_file)
    print(f"[flexgen] {case.name}: {command}", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=child_env(args.hf_home))
    with open(os.path.join(args.out, f"flexgen-{case.name}.out"), "w") as f:
        f.write(proc.stdout + proc.stderr)
    extra = {"machine": common.machine(), "policy_source": policy_cmd or case.policy_path()}
    if args.hf_home:
        extra["tokenizer"] = TOKENIZER_NOTE
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        status = "out of memory" if "out of memory" in (proc.stderr + proc.stdout).lower() else tail[0][:200]
        return common.result_line(case, ENGINE, policy, status=f"failed: {status}", command=command, extra=extra)
    text = open(log_file).read() if os.path.exists(log_file) else proc.stdout
    record = parse_log(text)
    extra.update({"projected": record["projected"], "peak_memory": {"gpu": record["peak_gpu_gb"] * 2**30},
                  "flexgen": record})
    return common.result_line(case, ENGINE, policy, measured=measured_from_log(record), command=command, extra=extra)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_case_arguments(p)
    p.add_argument("--offload-dir", help="FlexGen's disk tier (default: a new temporary directory)")
    p.add_argument("--fewer-batch", action="store_true", help="FlexGen's --debug-mode fewer_batch (projected decode)")
    p.add_argument("--python", default=sys.executable, help="the Python that has flexgen installed")
    p.add_argument("--timeout", type=float, default=4 * 3600, help="seconds per case")
    p.add_argument("--hf-home", help="HF_HOME holding the OPT tokenizer (opt_tokenizer_cache.py); sets the hub offline")
    p.add_argument("--no-shim", action="store_true", help="run `python -m flexgen.flex_opt` without flexgen_shim.py")
    args = p.parse_args(argv)
    timed_out = (subprocess.TimeoutExpired, lambda e: f"timed out after {args.timeout:.0f} s")
    return common.run_cases(args, ENGINE, run_case, failures=[timed_out])


if __name__ == "__main__":
    sys.exit(main())
