#!/usr/bin/env python3
"""Writes OUT/summary.json, the machine-readable summary of a GPU call (issue 36, point 3), from
the results lines in OUT: Strata's results.jsonl (`strata bench`) and the peers' peers.jsonl
(bench/peers/). Standard library only; always writes the file, with the cases it finds.

    python3 bench/summary_json.py OUT [--commit C] [--strata-command CMD] [--results FILE ...]

{"gpu", "driver", "host": {"cores", "mem_gib"}, "commit", "date", "cases": [{"name", "engine",
"model", "policy", "prompt_len", "gen_len", "projected", "prefill_tok_s", "decode_tok_s",
"total_tok_s", "peak_gpu_bytes", "command", "commit", "status", "metrics": {NAME: number}}]}
(bench/README.md, "summary.json"). A case that did not run has its status ("unsupported: ...",
"failed: ...") and null figures.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys

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
        for key in ("links", "cpu_attention", "host_waits"):
            metrics.update(numbers(line.get(key), key + "."))
        if "decode_steps_run" in m:
            metrics["decode_steps_run"] = m["decode_steps_run"]
        metrics.update(numbers(line.get("predicted"), "predicted."))
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


def summary(out_dir, commit=None, strata_command="", results=None, gpu=None, driver=None, date=None):
    """The summary of OUT: Strata's cases in their order, each peer's after them."""
    smi = run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]).splitlines()
    smi_gpu, _, smi_driver = (smi[0] if smi else "").partition(", ")
    commit = commit or run(["git", "rev-parse", "--short", "HEAD"]) or "unknown"
    lines = []
    for path in results or [os.path.join(out_dir, "results.jsonl")]:
        lines += read_lines(path)
    lines += read_lines(os.path.join(out_dir, "peers.jsonl"))
    return {
        "gpu": gpu or smi_gpu or "none", "driver": driver or smi_driver or "none", "host": host(), "commit": commit,
        "date": date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
        "cases": [case_of(line, commit, strata_command) for line in lines],
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="the call's folder: reads results.jsonl and peers.jsonl, writes summary.json")
    p.add_argument("--commit", help="the build that ran (default: .device/commit's first line, else git HEAD)")
    p.add_argument("--strata-command", default="", help="the strata bench command, for Strata's cases")
    p.add_argument("--results", action="append", help="Strata results.jsonl files (default: OUT/results.jsonl)")
    args = p.parse_args(argv)
    commit = args.commit
    if not commit and os.path.exists(".device/commit"):
        with open(".device/commit") as f:
            commit = f.readline().strip()
    doc = summary(args.out, commit, args.strata_command, args.results)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"{os.path.join(args.out, 'summary.json')}: {len(doc['cases'])} cases", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
