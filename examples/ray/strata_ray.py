#!/usr/bin/env python3
"""Runs one `strata run` job over a Ray cluster: Ray Data starts one task per shard, each running
`strata run --shard i/N` on the whole input (docs/scale-out.md), then this driver gathers the
shards' outputs into one file sorted by custom_id (or id), refusing a request answered twice.

    python3 strata_ray.py --input batch.jsonl --output merged.jsonl --shards 8 \\
        --outdir results --gpus-per-shard 1 --strata-args "--model /models/opt-30b --policy auto"

Resume: rerun the same command. Finished shards are kept; the others resume their OUT.partial.
INPUT, OUTDIR and the model must be at the same path on every node (a shared file system).
The merge functions need no Ray, so they are unit tested without it (test_strata_ray.py).
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import time

MANIFEST = "shards.json"  # OUTDIR's record of N, so a rerun with another N is refused


class MergeError(Exception):
    pass


# --- which shard owns a request (the same FNV-1a 64 as strata's --shard) ---

def shard_of(id_text, n):
    h = 0xCBF29CE484222325
    for b in id_text.encode("utf-8"):
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h % n


def request_id(obj):
    """The id a line is joined on: the OpenAI format's custom_id, else the strata format's id."""
    if "custom_id" in obj:
        return obj["custom_id"]
    if "id" in obj:
        return obj["id"]
    raise MergeError("line has neither custom_id nor id")


def id_text(value):
    """The id as strata hashes it: a string as is, an integer in decimal."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise MergeError(f"id {json.dumps(value)} is neither a string nor an integer")


def sort_key(value):
    # Integers in numeric order before strings; both kinds can appear in a strata-format file.
    return (0, value, "") if isinstance(value, int) else (1, 0, value)


# --- OUTDIR's files ---

def shard_path(outdir, i, errors=False):
    return os.path.join(outdir, f"shard-{i}{'.errors' if errors else ''}.jsonl")


def unfinished_shards(outdir, n, errors=False):
    """{shard: why} for the shards that have not finished: a finished shard's file exists and has
    no OUT.partial beside it."""
    out = {}
    for i in range(n):
        for path in [shard_path(outdir, i)] + ([shard_path(outdir, i, True)] if errors else []):
            if os.path.exists(path + ".partial"):
                out[i] = f"{path}.partial is left (the shard stopped before finishing)"
            elif not os.path.exists(path):
                out[i] = f"no {path}"
    return out


def check_manifest(outdir, n, input_path):
    """Records N in OUTDIR on the first run; refuses another N later (its shards would hold other
    requests, and the old files would be resumed or merged as if they were the new split)."""
    path = os.path.join(outdir, MANIFEST)
    want = {"shards": n, "input": os.path.abspath(input_path)}
    if os.path.exists(path):
        with open(path) as f:
            have = json.load(f)
        if have.get("shards") != n:
            raise MergeError(f"{outdir} holds shards of a {have.get('shards')}-way split, not {n}: "
                             f"use another --outdir, or the same --shards")
        return
    os.makedirs(outdir, exist_ok=True)
    with open(path, "w") as f:
        json.dump(want, f)
        f.write("\n")


# --- gathering ---

def read_shard(path, shard, n, seen):
    """Yields (id, line) of a shard's output. `seen` maps id text to where it was first found; an id
    seen before, or one that does not hash to this shard, raises MergeError."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                rid = request_id(json.loads(line))
            except (ValueError, MergeError) as e:
                raise MergeError(f"{where}: {e}") from None
            text = id_text(rid)
            if text in seen:
                raise MergeError(f"{where}: request {json.dumps(rid)} is answered twice (also at {seen[text]})")
            if shard_of(text, n) != shard:
                raise MergeError(f"{where}: request {json.dumps(rid)} belongs to shard {shard_of(text, n)}/{n}, "
                                 f"not {shard}/{n}: the file is from a split with another N")
            seen[text] = where
            yield rid, line if line.endswith("\n") else line + "\n"


def merge_shards(paths, out_path, sort=True):
    """Writes the lines of paths[i] (shard i of len(paths); None: no file) to out_path, sorted by
    id unless sort is False, checking that every request is answered once and by its own shard.
    Writes out_path only when the merge succeeds. Returns the set of id texts written."""
    n = len(paths)
    seen = {}
    tmp = out_path + ".merging"
    try:
        with open(tmp, "w", encoding="utf-8") as out:
            if sort:
                lines = []
                for i, p in enumerate(paths):
                    if p is not None:
                        lines.extend(read_shard(p, i, n, seen))
                lines.sort(key=lambda item: sort_key(item[0]))
                out.writelines(line for _, line in lines)
            else:  # streams: only the ids are held in memory
                for i, p in enumerate(paths):
                    if p is not None:
                        out.writelines(line for _, line in read_shard(p, i, n, seen))
        os.replace(tmp, out_path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return set(seen)


def input_ids(path):
    """The id texts of the input's requests (strata has already refused a malformed or repeated one)."""
    ids = set()
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                ids.add(id_text(request_id(json.loads(line))))
    return ids


def is_openai_batch(path):
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                return "custom_id" in json.loads(line)
    return False


# --- one shard: runs where Ray places it ---

def shard_command(strata, input_path, outdir, i, n, strata_args, errors):
    cmd = [strata, "run", "-i", input_path, "-o", shard_path(outdir, i), "--shard", f"{i}/{n}", "--no-progress"]
    if errors:
        cmd += ["--errors", shard_path(outdir, i, True)]
    return cmd + shlex.split(strata_args)


def tail(path, nbytes=4000):
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - nbytes))
            return f.read().decode("utf-8", "replace")
    except OSError as e:
        return f"(cannot read {path}: {e})"


def run_shard(row, spec):
    """Runs shard row["shard"]; its stdout and stderr go to OUTDIR/shard-i.log. Returns the row
    with the exit code and, on failure, the log's tail (a failure is reported, not raised, so the
    other shards run to the end and the driver reports every failed shard at once)."""
    i = int(row["shard"])
    cmd = shard_command(spec["strata"], spec["input"], spec["outdir"], i, spec["shards"], spec["strata_args"],
                        spec["errors"])
    log = os.path.join(spec["outdir"], f"shard-{i}.log")
    start = time.time()
    cwd = spec["cwd"] if os.path.isdir(spec["cwd"]) else None  # relative paths in --strata-args
    try:
        with open(log, "ab") as f:
            f.write(f"$ {shlex.join(cmd)}\n".encode())
            f.flush()
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=cwd).returncode
    except OSError as e:  # no such binary, say
        return {"shard": i, "rc": 127, "seconds": time.time() - start, "host": os.uname().nodename,
                "tail": f"cannot run {cmd[0]}: {e}"}
    return {"shard": i, "rc": rc, "seconds": time.time() - start, "host": os.uname().nodename,
            "tail": "" if rc == 0 else tail(log)}


def run_shards_with_ray(todo, spec, args):
    import ray

    if args.address:
        ray.init(address=args.address)
    else:
        ray.init(num_cpus=args.num_cpus, include_dashboard=False)
    resources = {"num_cpus": args.cpus_per_shard}
    if args.gpus_per_shard:
        resources["num_gpus"] = args.gpus_per_shard
    items = [{"shard": i} for i in todo]
    try:  # one block per shard, so each shard is its own task
        ds = ray.data.from_items(items, override_num_blocks=len(items))
    except TypeError:  # Ray before 2.10
        ds = ray.data.from_items(items, parallelism=len(items))
    # max_retries: a task lost with its node is run again, and resumes the shard's OUT.partial.
    ds = ds.map(run_shard, fn_kwargs={"spec": spec}, max_retries=args.retries, **resources)
    return sorted(ds.take_all(), key=lambda r: r["shard"])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", "-i", required=True, help="input JSONL (strata or OpenAI batch format)")
    p.add_argument("--output", "-o", required=True, help="merged output JSONL")
    p.add_argument("--shards", "-n", type=int, required=True, help="N: the number of shards (Ray tasks)")
    p.add_argument("--outdir", help="shard outputs, logs and the manifest (default: OUTPUT.shards)")
    p.add_argument("--strata", default="strata", help="strata binary on every node (default: strata on PATH)")
    p.add_argument("--strata-args", default="", help='passed to each `strata run`, e.g. "--model /m --policy auto"')
    p.add_argument("--errors", help="OpenAI batch input: merged error lines go here (each shard runs with --errors)")
    p.add_argument("--address", help="an existing Ray cluster, e.g. auto or ray://head:10001 (default: a local one)")
    p.add_argument("--num-cpus", type=int, help="CPUs of the local Ray cluster (default: all)")
    p.add_argument("--cpus-per-shard", type=float, default=1, help="CPUs Ray reserves for each shard (default 1)")
    p.add_argument("--gpus-per-shard", type=float, default=0, help="GPUs Ray reserves for each shard (e.g. 1)")
    p.add_argument("--retries", type=int, default=3, help="times a shard lost with its node is run again")
    p.add_argument("--no-sort", action="store_true", help="concatenate the shards (holds only ids in memory)")
    p.add_argument("--no-check-input", action="store_true", help="do not check that every input id is answered")
    args = p.parse_args(argv)
    if args.shards < 1:
        p.error("--shards must be at least 1")
    if args.errors and not is_openai_batch(args.input):
        p.error("--errors needs an OpenAI batch input (a strata-format job writes its errors to the output)")

    outdir = os.path.abspath(args.outdir or args.output + ".shards")
    strata = os.path.abspath(args.strata) if os.sep in args.strata else args.strata
    try:
        check_manifest(outdir, args.shards, args.input)
    except MergeError as e:
        sys.exit(f"strata_ray: {e}")
    errors = bool(args.errors)

    # A finished shard is not run again: strata would answer it all over again.
    todo = sorted(unfinished_shards(outdir, args.shards, errors))
    done = args.shards - len(todo)
    print(f"strata_ray: {args.shards} shards in {outdir}: {done} finished, running {len(todo)}", flush=True)
    if todo:
        spec = {"strata": strata, "input": os.path.abspath(args.input), "outdir": outdir, "shards": args.shards,
                "strata_args": args.strata_args, "errors": errors, "cwd": os.getcwd()}
        results = run_shards_with_ray(todo, spec, args)
        failed = [r for r in results if r["rc"] != 0]
        for r in results:
            print(f"strata_ray: shard {r['shard']}/{args.shards} on {r['host']}: exit {r['rc']} "
                  f"after {r['seconds']:.1f} s", flush=True)
        for r in failed:
            print(f"--- shard {r['shard']}/{args.shards} failed (exit {r['rc']}), "
                  f"{shard_path(outdir, r['shard'])[:-6]}.log ends:\n{r['tail'].rstrip()}", file=sys.stderr)
        if failed:
            sys.exit(f"strata_ray: {len(failed)} of {args.shards} shards failed; rerun the same command to "
                     f"resume them")

    left = unfinished_shards(outdir, args.shards, errors)
    if left:
        sys.exit("strata_ray: not merged, shards unfinished: " + "; ".join(f"{i}: {w}" for i, w in left.items()))
    try:
        answered = merge_shards([shard_path(outdir, i) for i in range(args.shards)], args.output,
                                sort=not args.no_sort)
        count = len(answered)
        if errors:
            err = merge_shards([shard_path(outdir, i, True) for i in range(args.shards)], args.errors,
                               sort=not args.no_sort)
            doubled = answered & err
            if doubled:
                raise MergeError(f"request {sorted(doubled)[0]!r} is both answered and in the errors")
            answered |= err
        if not args.no_check_input:
            want = input_ids(args.input)
            if answered != want:
                missing, extra = sorted(want - answered), sorted(answered - want)
                raise MergeError(f"{len(missing)} input requests unanswered (first: {missing[:3]}), "
                                 f"{len(extra)} answers not in the input (first: {extra[:3]})")
    except MergeError as e:
        sys.exit(f"strata_ray: merge refused: {e}")
    print(f"strata_ray: {args.output}: {count} lines" +
          (f"; {args.errors}: {len(answered) - count} error lines" if errors else ""), flush=True)


if __name__ == "__main__":
    main()
