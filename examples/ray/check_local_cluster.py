#!/usr/bin/env python3
"""CI check of strata_ray.py on a local Ray cluster (ctest strata_ray_local_cluster): 3 shards of a
small OpenAI batch on the tiny test model, merged, must equal the unsharded `strata run`, each
request once; a rerun resumes an unfinished shard; another N in the same OUTDIR is refused.

Ray comes from $STRATA_RAY_PYTHON (a python with ray[data]), else a venv at --venv, installed by
pip the first time (about 40 s, 600 MB). Exits 77 (ctest's SKIP_RETURN_CODE) when Ray cannot be
had: STRATA_SKIP_RAY=1, no network, no wheel for this Python.
"""
import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
RAY_SPEC = os.environ.get("STRATA_RAY_SPEC", "ray[data]")


def skip(why):
    print(f"SKIPPED: {why}", flush=True)
    sys.exit(SKIP)


def has_ray(python):
    return subprocess.run([python, "-c", "import ray, ray.data"], capture_output=True).returncode == 0


def ray_python(venv):
    """A python that imports ray.data, installing it into `venv` the first time."""
    env = os.environ.get("STRATA_RAY_PYTHON")
    if env:
        if not has_ray(env):
            sys.exit(f"STRATA_RAY_PYTHON={env} cannot import ray.data")
        return env
    python = os.path.join(venv, "bin", "python")
    os.makedirs(os.path.dirname(venv) or ".", exist_ok=True)
    with open(venv + ".lock", "w") as lock:  # one installer at a time (ctest -j, two builds)
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(python) and has_ray(python):
            return python
        tmp = venv + ".installing"  # renamed into place when complete, so a broken install is not reused
        shutil.rmtree(tmp, ignore_errors=True)
        start = time.time()
        try:
            subprocess.run([sys.executable, "-m", "venv", tmp], check=True, capture_output=True, timeout=120)
            r = subprocess.run([os.path.join(tmp, "bin", "pip"), "install", "-q", "--disable-pip-version-check",
                                "--retries", "2", "--timeout", "30", RAY_SPEC], capture_output=True, text=True, timeout=600)
        except (subprocess.SubprocessError, OSError) as e:
            shutil.rmtree(tmp, ignore_errors=True)
            skip(f"cannot create a venv with {RAY_SPEC}: {e}")
        if r.returncode != 0 or not has_ray(os.path.join(tmp, "bin", "python")):
            shutil.rmtree(tmp, ignore_errors=True)
            skip(f"pip install {RAY_SPEC} failed (no network, or no wheel for Python "
                 f"{sys.version.split()[0]}):\n{r.stderr[-2000:]}")
        shutil.rmtree(venv, ignore_errors=True)
        os.rename(tmp, venv)
        print(f"installed {RAY_SPEC} into {venv} in {time.time() - start:.0f} s", flush=True)
    return python


def request(cid, prompt, **body):
    return {"custom_id": cid, "method": "POST", "url": "/v1/completions",
            "body": {"model": "tiny-opt", "prompt": prompt, **body}}


def read(path):
    with open(path) as f:
        return [json.loads(l) for l in f]


def comparable(line):
    """A line without what differs between two runs of the same request: the time."""
    line = json.loads(json.dumps(line))
    if line.get("response"):
        line["response"]["body"].pop("created", None)
    return line


def check_equal(merged, whole):
    got, want = read(merged), read(whole)
    ids = [l["custom_id"] for l in got]
    assert len(ids) == len(set(ids)), f"{merged}: a request is doubled"
    assert ids == sorted(ids), f"{merged}: not sorted by custom_id"
    want_by_id = {l["custom_id"]: comparable(l) for l in want}
    assert set(ids) == set(want_by_id), f"{merged} answers {sorted(ids)}, the unsharded job {sorted(want_by_id)}"
    for l in got:
        assert comparable(l) == want_by_id[l["custom_id"]], f"{l['custom_id']}: {l} != {want_by_id[l['custom_id']]}"
    return len(got)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--strata", required=True)
    p.add_argument("--models", required=True, help="tests/fixtures/models")
    p.add_argument("--venv", required=True, help="where the Ray venv is kept between runs")
    p.add_argument("--workdir", required=True)
    args = p.parse_args()
    if os.environ.get("STRATA_SKIP_RAY") == "1":
        skip("STRATA_SKIP_RAY=1")
    start = time.time()
    python = ray_python(args.venv)

    work = args.workdir
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    inp = os.path.join(work, "batch.jsonl")
    with open(inp, "w") as f:
        for i in range(12):
            f.write(json.dumps(request(f"req-{i:02d}", f"story {i}", max_tokens=3, temperature=0)) + "\n")
        f.write(json.dumps(request("bad", "x", n=0)) + "\n")  # answered with an error line
    strata_args = ["--model", os.path.join(args.models, "tiny-opt"), "--device", "cpu", "--threads", "1"]

    whole, whole_err = os.path.join(work, "whole.jsonl"), os.path.join(work, "whole.errors.jsonl")
    subprocess.run([args.strata, "run", "-i", inp, "-o", whole, "--errors", whole_err, "--no-progress"] + strata_args,
                   check=True)

    merged, merged_err, outdir = (os.path.join(work, n) for n in ("merged.jsonl", "merged.errors.jsonl", "shards"))
    cmd = [python, os.path.join(HERE, "strata_ray.py"), "--input", inp, "--output", merged, "--errors", merged_err,
           "--outdir", outdir, "--shards", "3", "--num-cpus", "2", "--strata", args.strata,
           "--strata-args", " ".join(strata_args)]

    def ray_run(*extra, expect=0):
        t = time.time()
        r = subprocess.run(cmd + list(extra), capture_output=True, text=True)
        print(f"$ strata_ray.py ... {' '.join(extra)}: exit {r.returncode} in {time.time() - t:.1f} s\n{r.stdout}"
              f"{r.stderr[-3000:] if r.returncode != expect else ''}", flush=True)
        assert r.returncode == expect, f"strata_ray.py exited {r.returncode}, not {expect}"
        return r

    ray_run()
    n = check_equal(merged, whole)
    check_equal(merged_err, whole_err)
    print(f"3 shards on a local Ray cluster: {n} lines, the unsharded job's, nothing doubled", flush=True)

    # Resume: shard 1 stopped part way (its output back to .partial, less its last line).
    s1 = os.path.join(outdir, "shard-1.jsonl")
    with open(s1) as f:
        lines = f.readlines()
    assert lines, "shard 1 is empty: pick other ids"
    with open(s1 + ".partial", "w") as f:
        f.writelines(lines[:-1])
    os.remove(s1)
    os.remove(merged)
    r = ray_run()
    assert "2 finished, running 1" in r.stdout, r.stdout
    check_equal(merged, whole)
    with open(os.path.join(outdir, "shard-1.log")) as f:
        assert "resuming" in f.read(), "shard 1 did not resume its .partial"

    # Another N in the same OUTDIR: refused before anything runs.
    cmd[cmd.index("--shards") + 1] = "2"
    r = ray_run(expect=1)
    assert "3-way split" in r.stderr, r.stderr
    print(f"ok in {time.time() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
