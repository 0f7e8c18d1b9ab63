#!/usr/bin/env python3
"""Writes OUT/summary.json, the machine-readable summary of a GPU call (issue 36, point 3), from
the results lines in OUT: Strata's results.jsonl (`strata bench`) and the peers' peers.jsonl
(bench/peers/). Standard library only; always writes the file, with the cases it finds.

    python3 bench/summary_json.py OUT [--commit C] [--strata-build C] [--strata-command CMD]
        [--results FILE ...] [--engine DIR] [--log FILE ...]

{"gpu", "driver", "host": {"cores", "mem_gib"}, "commit", "date", "cases": [{"name", "engine",
"model", "policy", "prompt_len", "gen_len", "projected", "prefill_tok_s", "decode_tok_s",
"total_tok_s", "peak_gpu_bytes", "command", "commit", "date", "status", "metrics": {NAME: number}}]}
(bench/README.md, "summary.json"). A case that did not run has its status ("unsupported: ...",
"failed: ...") and null figures.

--engine DIR reads bench/gpu_suite.sh part engine's runs (DIR/after/CASE/results.jsonl, this build;
DIR/before/CASE/results.jsonl, the baseline named in DIR/before/commit). --log FILE reads the
call's log (suite.log) for what the metrics compare against, bench_generate's resident decode step
and bench_cpu_attention's bare fp16 cache GB/s, and for the results tables `strata bench` printed
of any case whose results.jsonl is missing. Metrics (per Strata case, where its inputs exist):
engine_step_over_resident_step (all-GPU cases at the resident run's batch),
cpu_attention_fraction_of_bare (the engine's CPU attention GB/s over the bare kernel's at the same
sequences, context and heads), decode_fraction_of_bound (the decode step's bound, the larger of the
busy cpu->gpu link time and the cache bytes read at the bare kernel's GB/s, over the measured step;
GPU compute, milliseconds for these batches, is left out of the bound). The log's bench_generate
and bench_decode_attention steps also become resident cases with the metrics of issue 35, point 7:
weights_read_fraction, launches_per_decode_step, prefill_gemm_share, attention_read_fraction
(kernel_cases).
"""
import argparse
import datetime
import glob
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers"))
from common import OPT_PRESETS  # noqa: E402

THROUGHPUT = ("prefill_tok_s", "decode_tok_s", "total_tok_s")


def read_lines(path):
    """The JSON lines of a file (none when it is missing); a broken line is skipped."""
    out = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
    return out


def numbers(d, prefix=""):
    """The numeric leaves of a nested dict, as {"a.b": x} (booleans and strings left out)."""
    out = {}
    for k, v in (d or {}).items():
        if isinstance(v, dict):
            out.update(numbers(v, f"{prefix}{k}."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[prefix + k] = v
    return out


def policy_of(line):
    """Strata's policy YAML; a peer's batch shape and where its placement came from."""
    if isinstance(line.get("policy"), str):
        return line["policy"]
    shape = f"{line.get('gpu_batch_size')}x{line.get('num_gpu_batches')}"
    return f"{shape} ({line['policy_source']})" if line.get("policy_source") else shape


def case_of(line, commit, strata_command=""):
    """One summary case from a results.jsonl or peers.jsonl line."""
    engine = line.get("engine", "strata")
    m = line.get("measured") or {}
    ok = line.get("status", "ok") == "ok" and bool(m)
    metrics = {}
    if engine == "strata":
        for key in ("links", "cpu_attention", "host_waits", "bytes", "moe"):
            metrics.update(numbers(line.get(key), key + "."))
        if "decode_steps_run" in m:
            metrics["decode_steps_run"] = m["decode_steps_run"]
        metrics.update(numbers(line.get("predicted"), "predicted."))
        metrics.update(line.get("metrics") or {})
    else:
        metrics.update(numbers(line.get(engine) if isinstance(line.get(engine), dict) else {}, engine + "."))
        for key in ("peak_gpu_gb", "prefill_tok_s", "decode_tok_s", "total_tok_s"):  # already fields
            metrics.pop(f"{engine}.{key}", None)
    peak = (line.get("peak_memory") or {}).get("gpu")
    return {
        "name": line.get("name"), "engine": engine, "model": line.get("model"), "policy": policy_of(line),
        "prompt_len": line.get("prompt_len"), "gen_len": line.get("gen_len"),
        "projected": bool(line.get("projected", False)),
        **{k: (float(m[k]) if ok and k in m else None) for k in THROUGHPUT},
        "peak_gpu_bytes": int(peak) if ok and peak is not None else None,
        "command": line.get("command") or (strata_command if engine == "strata" else ""),
        "commit": line.get("commit") or commit, "status": line.get("status", "ok"), "metrics": metrics,
    }


def run(cmd):
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        return out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def host():
    mem = 0
    try:
        with open("/proc/meminfo") as f:
            mem = int(next(line for line in f if line.startswith("MemTotal:")).split()[1]) * 1024
    except (OSError, StopIteration, ValueError):
        pass
    return {"cores": os.cpu_count(), "mem_gib": round(mem / 2**30, 1)}


def summary(out_dir, commit=None, strata_command="", results=None, gpu=None, driver=None, date=None,
            strata_build=None, engine_dir=None, logs=()):
    """The summary of OUT: Strata's cases in their order, each peer's after them, then part
    engine's (baseline and this build, pair by pair); metrics from the logs."""
    smi = run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]).splitlines()
    smi_gpu, _, smi_driver = (smi[0] if smi else "").partition(", ")
    commit = commit or run(["git", "rev-parse", "--short", "HEAD"]) or "unknown"
    lines = []
    for path in results or [os.path.join(out_dir, "results.jsonl")]:
        lines += read_lines(path)
    if strata_build:  # strata bench records its checkout's `git describe`, not the staged build's
        for line in lines:
            line["commit"] = strata_build
    lines += read_lines(os.path.join(out_dir, "peers.jsonl"))
    if engine_dir:
        lines += engine_lines(engine_dir, strata_build or commit)
    log_text = ""
    for path in logs:
        with open(path, errors="replace") as f:
            log_text += f.read() + "\n"
    have = {(line.get("name"), line.get("commit")) for line in lines}
    lines += [line for line in printed_cases(log_text, strata_build or commit) if (line["name"], line["commit"]) not in have]
    lines += kernel_cases(log_text, strata_build or commit)
    cases = [case_of(line, commit, strata_command) for line in lines]
    resident, bare = resident_steps(log_text), bare_cpu_attention(log_text)
    for case, line in zip(cases, lines):
        if case["engine"] == "strata" and case["status"] == "ok":
            case["metrics"].update(engine_metrics(line, case, resident, bare))
    date = date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")
    for case, line in zip(cases, lines):  # a peer's row kept from an earlier call keeps its date
        case["date"] = line.get("date") or date
    return {
        "gpu": gpu or smi_gpu or "none", "driver": driver or smi_driver or "none", "host": host(), "commit": commit,
        "date": date, "cases": cases,
    }


def engine_lines(engine_dir, commit):
    """part engine's results lines, baseline first, each with the commit of the build that ran it."""
    before_commit = "baseline"
    if os.path.exists(os.path.join(engine_dir, "before", "commit")):
        with open(os.path.join(engine_dir, "before", "commit")) as f:
            before_commit = f.readline().strip() or before_commit
    out = []
    for side, side_commit in (("before", before_commit), ("after", commit)):
        for path in sorted(glob.glob(os.path.join(engine_dir, side, "**", "results.jsonl"), recursive=True)):
            for line in read_lines(path):
                line["commit"] = side_commit
                out.append(line)
    return out


# A step header of bench/gpu_suite.sh's log ("### NAME: COMMAND"); a baseline's step is named
# "... before (COMMIT)".
STEP = re.compile(r"^### (?P<step>.*?): (?P<command>.*)$")
BEFORE = re.compile(r" before \((?P<commit>[^)]+)\)")
# A Strata row of the results table `strata bench` prints (src/job/bench.cpp, results.md).
ROW = re.compile(r"^\| (?P<name>[^|]+?) \| strata \| (?P<model>[^|]+?) \| (?P<prompt>\d+) \| (?P<gen>\d+) \| "
                 r"(?P<gbs>\d+) x (?P<ngb>\d+)[^|]*\| (?P<prefill>[\d.]+) \| (?P<decode>[\d.]+) \| "
                 r"(?P<total>[\d.]+)(?P<projected> \(projected\))?[^|]*\|(?:[^|]*\|){2} (?P<ctog>[\d.]+)[^|]*\| "
                 r"(?P<gpu>[\d.]+) (?P<unit>[KMGT]i)?B")


def printed_cases(log_text, commit):
    """Strata's cases from the results tables printed in a call's log: the figures of a case whose
    results.jsonl did not come back. Fewer fields than results.jsonl (no busy times, no CPU
    attention GB/s); the line's `source` says so."""
    out, step, command = [], "", ""
    for raw in log_text.splitlines():
        m = STEP.match(raw)
        if m:
            step, command = m.group("step"), m.group("command")
            continue
        m = ROW.match(raw)
        if not m:
            continue
        before = BEFORE.search(step)
        scale = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}[m.group("unit")]
        out.append({
            "name": m.group("name"), "engine": "strata", "model": m.group("model"),
            "prompt_len": int(m.group("prompt")), "gen_len": int(m.group("gen")), "status": "ok",
            "policy": f"gpu_batch_size: {m.group('gbs')}\nnum_gpu_batches: {m.group('ngb')}\n",
            "commit": before.group("commit") if before else commit, "command": command,
            "projected": bool(m.group("projected")),
            "measured": {k: float(m.group(k.split("_")[0])) for k in THROUGHPUT},
            "links": {"cpu_to_gpu_gbps": float(m.group("ctog"))},
            "peak_memory": {"gpu": float(m.group("gpu")) * scale},
            "source": "the results table printed in the call's log",
        })
    return out


# Part kernels (issue 35, point 7): bench_generate's resident decode and prefill, and
# bench_decode_attention's calls, as printed in the call's log.
DECODE = re.compile(r"^decode(?: \(sampled\))?: batch (?P<batch>\d+), \d+ steps, [\d.]+ ms/step, (?P<tok_s>[\d.]+) tok/s, weights read "
                    r"at [\d.]+ GB/s = (?P<percent>[\d.]+)% of copy bandwidth")
LAUNCHES = re.compile(r"^launches: (?P<per_step>[\d.]+) per decode step")
PREFILL = re.compile(r"^prefill: (?P<tokens>\d+) tokens in [\d.]+ ms \((?P<tok_s>[\d.]+) tok/s\); the same GEMMs alone "
                     r"take [\d.]+ ms = (?P<percent>[\d.]+)% of prefill")
ATTENTION = re.compile(r"^(?P<cache>f16|q4|q8)\s+(?P<slots>\d+) x (?P<context>\d+) tokens, (?P<heads>\d+) heads "
                       r"\((?P<kv>\d+) kv\) of \d+: .*?\(\s*(?P<percent>[\d.]+)% of copy\)")
OPTION = re.compile(r"--(?P<key>[a-z-]+) (?P<value>\S+)")


def kernel_cases(log_text, commit):
    """Resident cases from part kernels' bench_generate and bench_decode_attention steps, each with
    the metrics issue 35 judges by: weights_read_fraction and launches_per_decode_step (decode),
    prefill_gemm_share (prefill), attention_read_fraction (decode attention, of copy bandwidth)."""
    out, step, command, case = [], "", "", None
    for raw in log_text.splitlines():
        m = STEP.match(raw)
        if m:
            step, command, case = m.group("step"), m.group("command"), None
            continue
        if step.startswith("bench_generate"):
            opts = dict(OPTION.findall(command))
            if case is None:
                before = BEFORE.search(step)
                variant = "".join(f" {v}" for v in re.findall(r"\bSTRATA_\w+=\S+", command))
                variant += " bf16" if opts.get("dtype") == "bf16" else ""
                variant += " sampled" if float(opts.get("temperature", 0)) > 0 else ""
                variant += f" top-k {opts['top-k']}" if int(opts.get("top-k", 0)) > 0 else ""
                case = {"name": f"{opts.get('model', '?').removeprefix('dummy:')} resident b{opts.get('batch', '?')}"
                                f"{variant}", "engine": "strata", "model": opts.get("model", "").removeprefix("dummy:"),
                        "policy": "resident (bench_generate)", "prompt_len": int(opts.get("prompt-len", 0)) or None,
                        "gen_len": int(opts.get("gen-len", 0)) or None, "status": "ok", "measured": {},
                        "metrics": {}, "commit": before.group("commit") if before else commit, "command": command}
                out.append(case)
            if m := DECODE.match(raw):
                case["measured"]["decode_tok_s"] = float(m.group("tok_s"))
                case["metrics"]["weights_read_fraction"] = float(m.group("percent")) / 100
            elif m := LAUNCHES.match(raw):
                case["metrics"]["launches_per_decode_step"] = float(m.group("per_step"))
            elif m := PREFILL.match(raw):
                case["measured"]["prefill_tok_s"] = float(m.group("tok_s"))
                case["metrics"]["prefill_gemm_share"] = float(m.group("percent")) / 100
                case["metrics"]["prefill_tokens"] = int(m.group("tokens"))
        elif step.startswith("decode attention") and (m := ATTENTION.match(raw)):
            split = re.search(r"STRATA_SPLIT_KV=(\S+)", command)
            dtype = " bf16" if "--dtype bf16" in command else ""
            out.append({
                "name": f"decode attention {m.group('cache')}{dtype} {m.group('slots')} x {m.group('context')}, "
                        f"{m.group('heads')}/{m.group('kv')} heads, split {split.group(1) if split else 'auto'}",
                "engine": "strata", "model": "", "policy": "bench_decode_attention", "prompt_len": None,
                "gen_len": None, "status": "ok", "measured": {}, "commit": commit, "command": command,
                "metrics": {"attention_read_fraction": float(m.group("percent")) / 100,
                            "batch": int(m.group("slots")), "context": int(m.group("context"))},
            })
    return [c for c in out if c["measured"] or c["metrics"]]


DECODE_STEP = re.compile(r"^decode: batch (\d+), \d+ steps, ([\d.]+) ms/step")
BARE = re.compile(r"cpu decode attention: (\d+) sequences x (\d+) positions, (\d+) query heads / (\d+) kv heads"
                  r"[^\n]*\n\s+fp16\s+[\d.]+ ms per step, cache read at\s+([\d.]+) GB/s")


def resident_steps(log_text):
    """bench_generate's resident greedy decode step: {(model, batch): seconds}, the model as the
    step's --model gives it without "dummy:" (another model's step at the same batch is no bound)."""
    out, model = {}, None
    for raw in log_text.splitlines():
        if m := STEP.match(raw):
            model = dict(OPTION.findall(m.group("command"))).get("model", "").removeprefix("dummy:") or None
        elif (m := DECODE_STEP.match(raw)) and model:
            out[(model, int(m.group(1)))] = float(m.group(2)) / 1e3
    return out


def bare_cpu_attention(log_text):
    """bench_cpu_attention's fp16 decode: {(sequences, positions, heads): cache GB/s}."""
    return {(int(n), int(c), int(h)): float(gbps) for n, c, h, _, gbps in BARE.findall(log_text)}


def block_of(line):
    text = line.get("policy") if isinstance(line.get("policy"), str) else ""
    get = lambda key: int(re.search(rf"^{key}:\s*(\d+)", text, re.M).group(1))  # noqa: E731
    try:
        return get("gpu_batch_size"), get("num_gpu_batches")
    except AttributeError:
        return None


def engine_metrics(line, case, resident, bare):
    """The figures issue 34 judges the engine by, where the call measured their inputs."""
    out = {}
    block = block_of(line)
    decode = case.get("decode_tok_s")
    if not block or not decode:
        return out
    gbs, ngb = block
    step = gbs * ngb / decode  # seconds per decode step, from the measured (or projected) rate
    ctog = (line.get("links") or {}).get("cpu_to_gpu_gbps")
    name = str(case.get("model", "")).replace("facebook/", "")
    if ctog == 0 and (name, gbs * ngb) in resident:
        out["engine_step_s"] = step
        out["resident_step_s"] = resident[(name, gbs * ngb)]
        out["engine_step_over_resident_step"] = step / resident[(name, gbs * ngb)]
    heads = OPT_PRESETS.get(name, (0, 0, 0))[2]
    shape = (gbs, case["prompt_len"] + case["gen_len"], heads)
    attention = line.get("cpu_attention") or {}
    if attention.get("gbps") and shape in bare:
        out["cpu_attention_bare_gbps"] = bare[shape]
        out["cpu_attention_fraction_of_bare"] = attention["gbps"] / bare[shape]
        seconds = line.get("seconds") or {}
        steps = seconds.get("decode_steps")
        busy = (seconds.get("decode_busy") or {}).get("cpu_to_gpu")
        if steps and seconds.get("decode") and busy is not None:
            link = busy / steps
            cache = attention["seconds"] * attention["gbps"] / bare[shape] / steps
            measured = seconds["decode"] / steps
            out.update({"decode_step_s": measured, "decode_link_s_per_step": link,
                        "decode_cache_at_bare_s_per_step": cache,
                        "decode_fraction_of_bound": max(link, cache) / measured})
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="the call's folder: reads results.jsonl and peers.jsonl, writes summary.json")
    p.add_argument("--commit", help="the build that ran (default: .device/commit's first line, else git HEAD)")
    p.add_argument("--strata-command", default="", help="the strata bench command, for Strata's cases")
    p.add_argument("--results", action="append", help="Strata results.jsonl files (default: OUT/results.jsonl)")
    p.add_argument("--strata-build", help="the staged strata's commit, for Strata's cases (strata bench records "
                                          "the checkout's)")
    p.add_argument("--engine", help="bench/gpu_suite.sh part engine's folder (before/ and after/)")
    p.add_argument("--log", action="append", default=[], help="the call's log: metrics' inputs, printed tables")
    p.add_argument("--machine-from", help="a summary.json written on the GPU machine: its gpu, driver, host and "
                                          "date (when this runs elsewhere, on that call's files)")
    args = p.parse_args(argv)
    commit = args.commit
    if not commit and os.path.exists(".device/commit"):
        with open(".device/commit") as f:
            commit = f.readline().strip()
    machine = {}
    if args.machine_from:
        with open(args.machine_from) as f:
            machine = json.load(f)
    doc = summary(args.out, commit, args.strata_command, args.results, gpu=machine.get("gpu"),
                  driver=machine.get("driver"), date=machine.get("date"), strata_build=args.strata_build,
                  engine_dir=args.engine, logs=args.log)
    if "host" in machine:
        doc["host"] = machine["host"]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"{os.path.join(args.out, 'summary.json')}: {len(doc['cases'])} cases", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
