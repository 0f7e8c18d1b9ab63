#!/usr/bin/env python3
"""Records a peer's run that left no line in peers.jsonl (killed by its step's time limit, or
never started because the call's time ran out), so that every pair of a GPU call has both rows and
summary.json says why one has no figures (issue 36: "the call always leaves summary.json").

    python3 bench/peers/record_missing.py --suite DIR/suite.yaml --out DIR --engine flexgen \
        --status "failed: timed out after 49 s (the step's limit)"

Does nothing when DIR/peers.jsonl already has a line of that engine for each case of the suite.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def recorded(out_dir, engine):
    """(case name) of the lines DIR/peers.jsonl holds for `engine`."""
    names = set()
    path = os.path.join(out_dir, "peers.jsonl")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    d = json.loads(line)
                except ValueError:
                    continue
                if d.get("engine") == engine:
                    names.add(d.get("name"))
    return names


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--engine", required=True)
    ap.add_argument("--status", required=True, help="'failed: ...' or 'not run: ...'")
    args = ap.parse_args(argv)
    have = recorded(args.out, args.engine)
    for case in common.load_cases(args.suite):
        if case.name not in have:
            common.append_line(args.out, common.result_line(case, args.engine, None, status=args.status))
            print(f"[{args.engine}] {case.name}: {args.status}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
