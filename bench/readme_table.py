#!/usr/bin/env python3
"""The README's side-by-side tables (issue 36, point 4), built from the committed GPU summaries
(bench/results/DATE-GPU-summary.json, bench/summary_json.py): per card kind, the newest summary
that has peers' rows, each case that a peer ran beside Strata with Strata's total over the peer's.
Standard library only.

    python3 bench/readme_table.py              # prints the tables
    python3 bench/readme_table.py --write      # puts them into README.md between the markers
    python3 bench/readme_table.py --check      # exits 1 when README.md's tables are not these
"""
import argparse
import glob
import json
import os
import re
import sys
import textwrap

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
BEGIN, END = "<!-- peers-table:begin (bench/readme_table.py --write) -->", "<!-- peers-table:end -->"
PEERS = {"flexgen": "FlexGen 0.1.8", "accelerate": "Accelerate", "deepspeed": "DeepSpeed ZeRO-Inference"}


def newest_per_gpu(results_dir):
    """{gpu name: (path, summary)}, the newest summary with a peer's row per card kind."""
    out = {}
    for path in sorted(glob.glob(os.path.join(results_dir, "*-summary.json"))):
        with open(path) as f:
            doc = json.load(f)
        if any(c.get("engine") != "strata" for c in doc.get("cases", [])):
            out[doc.get("gpu", "unknown GPU")] = (path, doc)  # sorted by date: the last one wins
    return out


def block(case):
    """'48 x 1' from Strata's policy YAML or a peer's '48x1 (...)'."""
    text = case.get("policy") or ""
    g = re.search(r"gpu_batch_size:\s*(\d+)", text)
    n = re.search(r"num_gpu_batches:\s*(\d+)", text)
    if g:
        q = " (4-bit)" if "compress_weights" in text else ""
        return f"{g.group(1)} x {n.group(1) if n else 1}{q}"
    m = re.match(r"(\d+)x(\d+)", text)
    return f"{m.group(1)} x {m.group(2)}" if m else "-"


def tok_s(case):
    if case.get("total_tok_s") is None:
        return case.get("status", "no figure")
    return f"{case['total_tok_s']:.2f}" + (" (projected)" if case.get("projected") else "")


def table(path, doc, root=ROOT):
    """The markdown of one card's pairs."""
    strata = {c["name"]: c for c in doc["cases"] if c["engine"] == "strata" and c.get("commit") == doc["commit"]}
    rows = []
    for peer in doc["cases"]:
        if peer["engine"] == "strata" or peer["name"] not in strata:
            continue
        s = strata[peer["name"]]
        ratio = ""
        if s.get("total_tok_s") and peer.get("total_tok_s"):
            ratio = f"**{s['total_tok_s'] / peer['total_tok_s']:.2f}x**"
        peer_date = f" ({peer['date'][:10]})" if peer.get("date", doc["date"])[:10] != doc["date"][:10] else ""
        rows.append(f"| {peer['name']} | {s['model']} | {block(s)} | {tok_s(s)} | "
                    f"{PEERS.get(peer['engine'], peer['engine'])}{peer_date}, {block(peer)} | {tok_s(peer)} | {ratio} |")
    rel = os.path.relpath(path, root)
    intro = (f"{doc['date'][:10]}, commit {doc['commit']}, from `{rel}`: prompt 512, generation 32, dummy "
             f"weights, total generated tok/s (generated tokens over prefill and decode time). Projected: decode "
             f"timed over a few steps and scaled to 31 (FlexGen's `fewer_batch`, Strata's `decode_steps`, "
             f"Accelerate's `--decode-steps`). A peer's date is given where its row was kept from an earlier call.")
    head = [f"### Strata beside FlexGen and Accelerate on {doc['gpu']}", "", textwrap.fill(intro, 100),
            "", "| case | model | Strata's block | Strata tok/s | peer, its block | peer tok/s | Strata / peer |",
            "|---|---|---|---|---|---|---|"]
    return "\n".join(head + rows) + "\n"


def tables(results_dir=os.path.join(ROOT, "bench", "results"), root=ROOT):
    found = newest_per_gpu(results_dir)
    if not found:
        return "No GPU call has run a peer yet.\n"
    return "\n".join(table(path, doc, root) for _, (path, doc) in sorted(found.items()))


def replace_block(readme_text, body):
    if BEGIN not in readme_text or END not in readme_text:
        raise SystemExit(f"README.md has no '{BEGIN}' ... '{END}' block")
    head, rest = readme_text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{body}{END}{tail}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="update README.md")
    ap.add_argument("--check", action="store_true", help="exit 1 when README.md differs")
    ap.add_argument("--readme", default=os.path.join(ROOT, "README.md"), help=argparse.SUPPRESS)
    ap.add_argument("--results-dir", default=os.path.join(ROOT, "bench", "results"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    body = tables(args.results_dir)
    if not (args.write or args.check):
        sys.stdout.write(body)
        return 0
    with open(args.readme) as f:
        text = f.read()
    new = replace_block(text, body)
    if args.check:
        if new != text:
            print("README.md's side-by-side tables are not bench/results' summaries: "
                  "run python3 bench/readme_table.py --write", file=sys.stderr)
            return 1
        return 0
    with open(args.readme, "w") as f:
        f.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
