#!/usr/bin/env python3
"""Downloads, on a machine that reaches PyPI, the wheels FlexGen 0.1.8 needs on the GPU machine,
which has python3 3.12 with torch, transformers, accelerate, numpy, tqdm and attrs but no
package registry: they travel in DEST (default .whl at the repository root, git-ignored) named
in the device call's `carry`, and are installed there with
`python3 -m pip install --no-index --no-deps --target /tmp/site .whl/*.whl`.

    python3 bench/peers/prepare_offline.py [--dest .whl] [--dry-run]

flexgen 0.1.8's Requires-Dist: torch>=1.12, transformers>=4.24, numpy, tqdm, pulp, attrs. All but
pulp are on the GPU machine; pulp is imported only by FlexGen's experimental/cost_model.py (the
policy search), never by flexgen.flex_opt, and `--no-deps` installs skip the requirement, so it
is not fetched (--extra pulp==VERSION adds it).
"""
import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
WHEELS = ["flexgen==0.1.8"]
# The GPU machine's interpreter (the device tool's README): pip matches each platform tag exactly.
PYTHON_VERSION = "3.12"
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64"]


def download_command(dest, packages, python=sys.executable):
    """pip download of exactly `packages` (no dependencies) as wheels for the GPU machine."""
    cmd = [python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", PYTHON_VERSION,
           "--implementation", "cp"]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    return cmd + ["-d", dest] + list(packages)


def ignore_in_git(dest, repo=REPO):
    """Appends DEST (when inside the repository) to .git/info/exclude, once: the wheels must never
    be committed, and an ignored folder travels only when `carry` names it."""
    rel = os.path.relpath(os.path.abspath(dest), repo)
    if rel.startswith(".."):
        return None
    git_dir = os.path.join(repo, ".git")
    if not os.path.isdir(git_dir):  # a worktree: .git is a file naming the real folder
        out = subprocess.run(["git", "-C", repo, "rev-parse", "--git-common-dir"], capture_output=True, text=True)
        git_dir = os.path.join(repo, out.stdout.strip())
    exclude = os.path.join(git_dir, "info", "exclude")
    line = "/" + rel.replace(os.sep, "/").strip("/") + "/"
    existing = []
    if os.path.exists(exclude):
        with open(exclude) as f:
            existing = f.read().splitlines()
    if line not in existing:
        os.makedirs(os.path.dirname(exclude), exist_ok=True)
        with open(exclude, "a") as f:
            f.write(line + "\n")
    return line


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dest", default=os.path.join(REPO, ".whl"), help="folder for the wheels (default: REPO/.whl)")
    p.add_argument("--extra", action="append", default=[], help="another NAME==VERSION to fetch (repeatable)")
    p.add_argument("--dry-run", action="store_true", help="print the pip command, download nothing")
    args = p.parse_args(argv)
    cmd = download_command(args.dest, WHEELS + args.extra)
    print(" ".join(cmd))
    if args.dry_run:
        return 0
    os.makedirs(args.dest, exist_ok=True)
    ignored = ignore_in_git(args.dest)
    if ignored:
        print(f"git-ignored: {ignored} (.git/info/exclude)", file=sys.stderr)
    return subprocess.run(cmd).returncode


if __name__ == "__main__":
    sys.exit(main())
