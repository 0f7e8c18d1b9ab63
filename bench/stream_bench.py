#!/usr/bin/env python3
"""Time to first answer and resident memory of `strata run` on big input files (issue 13 point 3).

For each line count it writes an input file (bench/make_jsonl.py), starts the job, and samples
/proc/PID/status every 20 ms: the RSS when pass 1 ends (the "checked N requests" log line), the
time until the first line is in OUT.partial, the largest RSS during generation, and the peak
(VmHWM). Jobs of more than --full lines are stopped (SIGINT) --run-seconds after their first
answer; smaller ones run to the end. Prints a Markdown table.

    bench/stream_bench.py --strata build-dev/strata --lines 10 1000000 10000000 --dir /tmp/sbench
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def status(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "VmHWM"):
                    out[k] = int(v.split()[0]) / 1024.0  # MiB
    except OSError:
        pass
    return out


def run_one(a, lines):
    src = os.path.join(a.dir, f"p{lines}.jsonl")
    if not os.path.exists(src):
        subprocess.run([sys.executable, os.path.join(HERE, "make_jsonl.py"), "--lines", str(lines), "--out", src,
                        "--max-new-tokens", str(a.max_new_tokens)], check=True)
    out = os.path.join(a.dir, f"o{lines}.jsonl")
    for f in (out, out + ".partial"):
        if os.path.exists(f):
            os.remove(f)
    log = os.path.join(a.dir, f"log{lines}.txt")
    cmd = [a.strata, "run", "--model", a.model, "-i", src, "-o", out, "--device", "cpu", "--threads", str(a.threads),
           "--batch-size", str(a.batch_size)] + a.extra
    t0 = time.monotonic()
    with open(log, "w") as logf:
        p = subprocess.Popen(cmd, stderr=logf, stdout=logf)
    r = {"lines": lines, "bytes": os.path.getsize(src), "cmd": " ".join(cmd)}
    checked = first = None
    rss_gen = 0.0
    last = {}
    stopped = False
    rusage = None
    while True:
        pid, _, ru = os.wait4(p.pid, os.WNOHANG)
        if pid != 0:
            rusage = ru
            break
        now = time.monotonic() - t0
        st = status(p.pid)
        if st:
            last = st
        if checked is None:
            with open(log) as f:
                m = re.search(r"checked (\d+) requests in ([\d.]+) s", f.read())
            if m:
                checked = now
                r["pass1_s"] = float(m.group(2))
                r["rss_after_pass1_mib"] = st.get("VmRSS", 0)
                r["hwm_pass1_mib"] = st.get("VmHWM", 0)
        if first is None and os.path.exists(out + ".partial") and os.path.getsize(out + ".partial") > 0:
            first = now
            r["first_answer_s"] = first
        if first is not None:
            rss_gen = max(rss_gen, st.get("VmRSS", 0))
            if lines > a.full and now - first > a.run_seconds:
                last = status(p.pid) or last
                p.send_signal(signal.SIGINT)
                stopped = True
                break
        time.sleep(0.02)
    if rusage is None:
        _, _, rusage = os.wait4(p.pid, 0)
    p.returncode = 0
    with open(log) as f:
        text = f.read()
    m = re.search(r"checked (\d+) requests in ([\d.]+) s", text)
    if m:
        r["pass1_s"] = float(m.group(2))
    m = re.search(r"first answer after ([\d.]+) s", text)
    if first is None and m:
        r["first_answer_s"] = float(m.group(1))  # finished between two samples: the job's own figure
    r["wall_s"] = time.monotonic() - t0
    r["rss_generating_max_mib"] = rss_gen
    r["hwm_mib"] = max(last.get("VmHWM", 0), rusage.ru_maxrss / 1024.0)  # ru_maxrss: KiB
    r["stopped"] = stopped
    answered = 0
    for f in (out, out + ".partial"):
        if os.path.exists(f):
            with open(f, "rb") as fh:
                answered = sum(1 for _ in fh)
    r["answered"] = answered
    m = re.search(r"padding efficiency: ([\d.]+).*?; ([\d.]+) in input order", text)
    if m:
        r["padding"] = f"{m.group(1)} (input order {m.group(2)})"
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strata", default="build-dev/strata")
    ap.add_argument("--model", default=os.path.join(HERE, "..", "tests", "fixtures", "models", "tiny-opt"))
    ap.add_argument("--lines", type=int, nargs="+", default=[10, 1000000, 10000000])
    ap.add_argument("--dir", default="/tmp/strata-stream-bench")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=2)
    ap.add_argument("--full", type=int, default=10000, help="run jobs of at most this many lines to the end")
    ap.add_argument("--run-seconds", type=float, default=20)
    ap.add_argument("extra", nargs="*", help="more strata run arguments (after --)")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    rows = [run_one(a, n) for n in a.lines]
    print("| lines | file | pass 1 | first answer | RSS after pass 1 | peak RSS in pass 1 | max RSS generating | "
          "peak RSS (VmHWM) | answered | wall | stopped |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['lines']:,} | {r['bytes'] / 1e6:.1f} MB | {r.get('pass1_s', float('nan')):.2f} s | "
              f"{r.get('first_answer_s', float('nan')):.2f} s | {r.get('rss_after_pass1_mib', 0):.1f} MiB | "
              f"{r.get('hwm_pass1_mib', 0):.1f} MiB | {r['rss_generating_max_mib']:.1f} MiB | {r['hwm_mib']:.1f} MiB | "
              f"{r['answered']:,} | {r['wall_s']:.1f} s | {'after ' + str(a.run_seconds) + ' s' if r['stopped'] else 'no'} |")
    for r in rows:
        if "padding" in r:
            print(f"\n{r['lines']:,} lines: padding efficiency {r['padding']}")
    print("\ncommands:")
    for r in rows:
        print(f"    {r['cmd']}")


if __name__ == "__main__":
    main()
