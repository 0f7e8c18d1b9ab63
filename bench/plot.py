#!/usr/bin/env python3
"""Plots of a `strata bench` run (issue 12): writes into DIR

  throughput.png             total tok/s per case, each peer's bar beside Strata's (bench/peers/)
  predicted_vs_measured.png  the cost model's total tok/s against the measured, per Strata case
  frontier.png               the latency-throughput frontier of `strata policy --pareto` (FlexGen's
                             Figure 1) with the measured cases of the same model and workload on it

    python3 bench/plot.py DIR [--pareto PARETO.json] [--results FILE] [--peers FILE] [--prefix P]

DIR/results.jsonl and DIR/peers.jsonl are read when there; --results/--peers name other files.
The data loading (load_rows, throughput_series, predicted_series, frontier_series) needs only the
standard library; drawing needs matplotlib (bench/requirements.txt).
"""
import argparse
import json
import math
import os
import re
import sys


def read_jsonl(path):
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{n}: not JSON: {e}") from None
    return rows


def load_rows(results=None, peers=None):
    """Strata's lines (engine "strata" where the field is missing: older files) and the peers'."""
    rows = []
    for path in (results, peers):
        if path and os.path.exists(path):
            for r in read_jsonl(path):
                r.setdefault("engine", "strata")
                rows.append(r)
    return rows


def ok(r):
    return r.get("status", "ok") == "ok" and isinstance(r.get("measured"), dict)


def block_size(r):
    """Sequences per block: from Strata's policy YAML, or a peer's batch fields."""
    pol = r.get("policy")
    if isinstance(pol, str):
        g = re.search(r"gpu_batch_size:\s*(\d+)", pol)
        n = re.search(r"num_gpu_batches:\s*(\d+)", pol)
        if g:
            return int(g.group(1)) * (int(n.group(1)) if n else 1)
    if r.get("gpu_batch_size"):
        return int(r["gpu_batch_size"]) * int(r.get("num_gpu_batches") or 1)
    return None


def throughput_series(rows):
    """(cases in first-seen order, engines with Strata first, {engine: {case: (total, sd)}})."""
    cases, engines, values = [], [], {}
    for r in rows:
        if r["name"] not in cases:
            cases.append(r["name"])
        if not ok(r):
            continue
        e = r["engine"]
        if e not in engines:
            engines.append(e)
        m = r["measured"]
        values.setdefault(e, {})[r["name"]] = (float(m["total_tok_s"]), float((m.get("sd") or {}).get("total_tok_s", 0)))
    engines = sorted(engines, key=lambda e: (e != "strata", engines.index(e)))
    return cases, engines, values


def predicted_series(rows):
    """[(case, predicted total tok/s, measured total tok/s)] for Strata's cases with a prediction."""
    out = []
    for r in rows:
        if r["engine"] == "strata" and ok(r) and isinstance(r.get("predicted"), dict):
            out.append((r["name"], float(r["predicted"]["total_tok_s"]), float(r["measured"]["total_tok_s"])))
    return out


def frontier_series(pareto, rows):
    """From `strata policy --pareto --json-file` and the results lines: the sweep's points and the
    frontier as (latency s, tok/s), and the measured cases of the same model, prompt and generation
    as (name, engine, latency s, tok/s); a case's latency is its block's time: block x gen / total."""
    sweep = [(p["latency_s"], p["throughput_tok_s"]) for p in pareto.get("points", [])
             if p.get("policy") is not None]
    frontier = [(p["latency_s"], p["throughput_tok_s"]) for p in pareto.get("frontier", [])]
    w = pareto.get("workload", {})
    measured = []
    for r in rows:
        if not ok(r) or r.get("model", "").replace("dummy:", "") != pareto.get("model"):
            continue
        if r.get("prompt_len") != w.get("prompt_len") or r.get("gen_len") != w.get("gen_len"):
            continue
        bls, total = block_size(r), float(r["measured"]["total_tok_s"])
        if bls and total > 0:
            measured.append((r["name"], r["engine"], bls * r["gen_len"] / total, total))
    return sweep, frontier, measured


# ---------------------------------------------------------------- drawing


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path):
    """Writes the figure to `path` and frees it; True (the plot functions' "written")."""
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def plot_throughput(rows, path, title):
    plt = _plt()
    cases, engines, values = throughput_series(rows)
    if not engines:
        return False
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(cases) + 2), 4))
    width = 0.8 / len(engines)
    for k, e in enumerate(engines):
        xs = [i + (k - (len(engines) - 1) / 2) * width for i, c in enumerate(cases) if c in values[e]]
        ys = [values[e][c][0] for c in cases if c in values[e]]
        err = [values[e][c][1] for c in cases if c in values[e]]
        bars = ax.bar(xs, ys, width, yerr=err, capsize=3, label=e)
        ax.bar_label(bars, labels=[f"{y:.3g}" for y in ys], fontsize=7, padding=2)
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels(cases, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("total throughput (generated tok/s)")
    lo, hi = min(v[0] for e in engines for v in values[e].values()), max(v[0] for e in engines for v in values[e].values())
    if lo > 0 and hi / lo > 20:  # cases an order of magnitude apart: log axis
        ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    return _save(plt, fig, path)


def plot_predicted(rows, path, title):
    plt = _plt()
    pts = predicted_series(rows)
    if not pts:
        return False
    fig, ax = plt.subplots(figsize=(5.5, 5))
    lo = min(min(p, m) for _, p, m in pts) / 1.5
    hi = max(max(p, m) for _, p, m in pts) * 1.5
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8, label="predicted = measured")
    ax.fill_between([lo, hi], [lo * 0.8, hi * 0.8], [lo * 1.2, hi * 1.2], color="0.9", label="±20%")
    for k, (name, p, m) in enumerate(pts):
        ax.scatter(m, p, zorder=3, marker="osD^v<>"[k % 7], label=f"{name} ({100 * (p / m - 1):+.0f}%)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured total tok/s")
    ax.set_ylabel("predicted total tok/s (cost model)")
    ax.set_title(title, fontsize=9)
    ax.legend(loc="upper left", fontsize=7)
    return _save(plt, fig, path)


def plot_frontier(pareto, rows, path):
    plt = _plt()
    sweep, frontier, measured = frontier_series(pareto, rows)
    if not frontier and not sweep:
        return False
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    if frontier:
        xs, ys = zip(*frontier)
        ax.step(xs, ys, where="post", color="C0", lw=1.2, label="predicted frontier (strata policy --pareto)")
        ax.scatter(xs, ys, s=10, color="C0")
    if sweep:
        xs, ys = zip(*sweep)
        ax.scatter(xs, ys, marker="x", color="C1", label="best policy per latency bound")
    markers = {"strata": "o", "flexgen": "s", "accelerate": "^", "deepspeed": "D"}
    for name, engine, lat, tput in measured:
        ax.scatter(lat, tput, marker=markers.get(engine, "v"), s=45, edgecolor="k", zorder=4,
                   label=f"measured: {name} ({engine})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("latency: time of one block (s)")
    ax.set_ylabel("throughput (generated tok/s)")
    w = pareto.get("workload", {})
    ax.set_title(f"{pareto.get('model', '')}, prompt {w.get('prompt_len')}, gen {w.get('gen_len')}"
                 f" on {pareto.get('hardware', '')}", fontsize=10)
    ax.grid(which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return _save(plt, fig, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", help="where the PNGs go; DIR/results.jsonl and DIR/peers.jsonl are read by default")
    ap.add_argument("--results", help="Strata's results lines (default DIR/results.jsonl)")
    ap.add_argument("--peers", help="the peers' lines (default DIR/peers.jsonl)")
    ap.add_argument("--pareto", help="JSON of strata policy --pareto --json-file FILE")
    ap.add_argument("--prefix", default="", help="prefix of the PNGs' names")
    ap.add_argument("--title", help="of the throughput plots (default: the suite, or the results file's name)")
    args = ap.parse_args(argv)
    rows = load_rows(args.results or os.path.join(args.dir, "results.jsonl"),
                     args.peers or os.path.join(args.dir, "peers.jsonl"))
    if not rows:
        print(f"plot.py: no results lines in {args.dir}", file=sys.stderr)
        return 1
    source = os.path.splitext(os.path.basename(args.results))[0] if args.results else os.path.basename(
        os.path.abspath(args.dir))
    machine = rows[0].get("machine") or {}
    title = args.title or f"{rows[0].get('suite') or source}: gpu {machine.get('gpu', '?')}, cpu {machine.get('cpu', '?')}"
    out = lambda name: os.path.join(args.dir, args.prefix + name)  # noqa: E731
    written = []
    if plot_throughput(rows, out("throughput.png"), title):
        written.append(out("throughput.png"))
    if plot_predicted(rows, out("predicted_vs_measured.png"), title):
        written.append(out("predicted_vs_measured.png"))
    if args.pareto:
        with open(args.pareto) as f:
            pareto = json.load(f)
        if plot_frontier(pareto, rows, out("frontier.png")):
            written.append(out("frontier.png"))
    for w in written:
        print("wrote", w)
    return 0


if __name__ == "__main__":
    sys.exit(main())
