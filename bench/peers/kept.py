#!/usr/bin/env python3
"""Peers are measured once per card kind (issue 36, point 5): their figures do not change with our
commits, so a later GPU call reruns only Strata's rows and keeps the peer's from the newest
committed summary of the same card (bench/results/DATE-GPU-summary.json). Standard library only.

    python3 bench/peers/kept.py --gpu h200 --name opt30-flexgen-48x1 --engine flexgen --out DIR

Appends the kept row to DIR/peers.jsonl, with `kept_from` (the file and the call's date), and
exits 0; exits 3 when no committed summary of that card has an `ok` row of that case and engine
(the caller then runs the peer).
"""
import argparse
import glob
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

RESULTS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "results"))
NOT_KEPT = 3


def summaries(gpu_slug, results_dir=RESULTS):
    """The committed summaries of one card kind, newest first (their names start with the date)."""
    return sorted(glob.glob(os.path.join(results_dir, f"*-{gpu_slug}-summary.json")), reverse=True)


def kept_case(gpu_slug, name, engine, results_dir=RESULTS):
    """(summary path, its date, the case) of the newest ok row, or None."""
    for path in summaries(gpu_slug, results_dir):
        with open(path) as f:
            doc = json.load(f)
        for case in doc.get("cases", []):
            if case.get("name") == name and case.get("engine") == engine and case.get("status") == "ok" \
                    and case.get("total_tok_s") is not None:
                return path, case.get("date") or doc.get("date"), case
    return None


def peers_line(path, date, case):
    """The peers.jsonl line `strata bench --report` and bench/summary_json.py read, from a summary case."""
    shape = re.match(r"(\d+)x(\d+)", case.get("policy") or "")
    measured = {k: case[k] for k in ("prefill_tok_s", "decode_tok_s", "total_tok_s")}
    line = {
        "name": case["name"], "engine": case["engine"], "model": case.get("model"),
        "prompt_len": case.get("prompt_len"), "gen_len": case.get("gen_len"), "status": "ok",
        "gpu_batch_size": int(shape.group(1)) if shape else None,
        "num_gpu_batches": int(shape.group(2)) if shape else None,
        "measured": dict(measured, repeats=1), "projected": bool(case.get("projected")),
        "command": case.get("command", ""), "commit": case.get("commit"), "date": date,
        "kept_from": f"{os.path.relpath(path, os.path.dirname(os.path.dirname(RESULTS)))} ({date})",
    }
    if case.get("peak_gpu_bytes") is not None:
        line["peak_memory"] = {"gpu": case["peak_gpu_bytes"]}
    return line


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", required=True, help="the card's slug, as in the summaries' names (h200, h100-80gb-hbm3)")
    ap.add_argument("--name", required=True, help="the case")
    ap.add_argument("--engine", required=True, help="the peer (flexgen, accelerate, deepspeed)")
    ap.add_argument("--out", required=True, help="the case's folder: the row goes to its peers.jsonl")
    ap.add_argument("--results-dir", default=RESULTS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    found = kept_case(args.gpu, args.name, args.engine, args.results_dir)
    if not found:
        return NOT_KEPT
    line = peers_line(*found)
    common.append_line(args.out, line)
    print(f"[kept] {args.engine} {args.name}: {line['measured']['total_tok_s']:.2f} tok/s from {line['kept_from']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
