#!/usr/bin/env python3
"""Fails when a file of the repository reaches outside it (ctest: standalone_repository).

A fresh clone with nothing beside it must build, test and read completely, so no tracked source,
test, script or doc may name:
  - a relative path that climbs out of the repository ("../shared/...", from the file's folder
    and from the root alike), or a CMake path above the source tree ("${PROJECT_SOURCE_DIR}/..");
  - an absolute path on one machine (/work/..., /root/..., /home/...) in code, scripts or docs
    (bench/results/ may quote the paths a recorded run printed);
  - a document that is not in the repository: an upper-case Markdown name ("DESIGN.md" of a
    planning folder) or a docs/ page that does not exist.
A reference to another project's file names that project (a URL, or "owner/repo" before the path).
A line that holds such a path as data (a path-traversal input a test refuses) says so with the
marker "standalone: input".

    scripts/check_standalone.py [ROOT]     # prints FILE:LINE: reason for each, exits 1 if any
"""
import os
import re
import subprocess
import sys

TEXT_SUFFIXES = (".cpp", ".h", ".cu", ".cuh", ".txt", ".cmake", ".sh", ".py", ".md", ".yaml", ".yml",
                 ".json", ".toml", ".cfg", ".in")
# Fixture data (token ids, expected logits) is not prose; its generator scripts are checked.
SKIP_DIRS = ("tests/fixtures/models/", "tests/fixtures/gguf/", "tests/fixtures/tokenizer/gpt2/",
             "fuzz/corpus/", "fuzz/dict/")
# The check and its test hold every kind of way out as examples.
SELF = ("scripts/check_standalone.py", "scripts/test_check_standalone.py")
# Paths a program prints are quoted in result records; everything else must not name a machine.
RECORDS = ("bench/results/", "policies/hardware/")

RELATIVE = re.compile(r"(?<![\w.$/])((?:\.\./)+[\w.@+-][\w./@+-]*)")
CMAKE_ABOVE = re.compile(r"\$\{(?:PROJECT_SOURCE_DIR|CMAKE_SOURCE_DIR)\}/\.\.(?:/|\b)")
MACHINE_PATH = re.compile(r"(?<![\w.~$/-])/(?:work|root|home)/[\w.-]+")
# Documents by name: upper-case files (README.md, DESIGN.md) and docs/ pages; lower-case names such
# as results.md are files that programs write.
DOCUMENT = re.compile(r"(?<![\w./-])((?:[\w.-]+/)*[A-Z][A-Z0-9_-]*\.md|docs/[\w-]+\.md)\b")
# "owner/repo" or a URL just before a path: another project's file, cited as such.
FOREIGN = re.compile(r"(https?://\S*|github\.com\S*|\b[\w-]+/[\w.-]+'s\s*|\b[\w-]+/[\w-]+\s+\S*$)$")


class TrackedFiles(set):
    def __init__(self, files):
        super().__init__(files)
        self.names = {os.path.basename(f) for f in files}
        self.folders = {os.path.dirname(f) for f in files}


def tracked_files(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z"], capture_output=True, check=True)
        return [f for f in out.stdout.decode().split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for folder, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if not d.startswith((".", "build"))]
            files += [os.path.relpath(os.path.join(folder, n), root) for n in names]
        return files


def outside(root, base, rel):
    target = os.path.normpath(os.path.join(root, base, rel))
    return os.path.relpath(target, root).startswith("..")


def exists_inside(root, base, rel):
    return not outside(root, base, rel) and os.path.exists(os.path.join(root, base, rel))


def climbs_out(root, folder, rel, top_entries):
    """A path that is no file of the repository from the file's folder or from the root, and
    climbs out from either. "../../bench/x" from a fixtures folder names a top-level entry of the
    repository, so it stays in."""
    first = next((part for part in rel.split("/") if part not in ("..", ".", "")), "")
    if first in top_entries or exists_inside(root, folder, rel) or exists_inside(root, "", rel):
        return False
    return outside(root, folder, rel) or outside(root, "", rel)


def check_file(root, path, files, top_entries):
    problems = []
    try:
        with open(os.path.join(root, path), encoding="utf-8") as f:
            lines = f.read().split("\n")
    except (UnicodeDecodeError, OSError):
        return problems
    folder = os.path.dirname(path)
    for number, line in enumerate(lines, 1):
        if "standalone: input" in line:
            continue
        def report(reason):
            problems.append(f"{path}:{number}: {reason}")

        for m in RELATIVE.finditer(line):
            rel = m.group(1).rstrip(".")
            if climbs_out(root, folder, rel, top_entries):
                report(f"'{rel}' climbs out of the repository")
        if path.endswith(("CMakeLists.txt", ".cmake")) and CMAKE_ABOVE.search(line):
            report("a CMake path above the source tree")
        if not path.startswith(RECORDS):
            for m in MACHINE_PATH.finditer(line):
                report(f"'{m.group(0)}' is a path on one machine")
        if path.endswith((".md", ".py", ".sh", ".cpp", ".h", ".cu", ".txt", ".yaml")):
            for m in DOCUMENT.finditer(line):
                name = m.group(1)
                known = name in files if name.startswith("docs/") else os.path.basename(name) in files.names
                # bench/results/DATE-NAME.md: a name to fill in, in a folder of the repository.
                template = "/" in name and os.path.dirname(name) in files.folders and re.fullmatch(
                    r"[A-Z]+(-[A-Z]+)*\.md", os.path.basename(name))
                if known or template or FOREIGN.search(line[:m.start()]):
                    continue
                report(f"'{name}' is not a file of the repository")
    return problems


def main(argv):
    root = os.path.abspath(argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    files = tracked_files(root)
    tracked = TrackedFiles(files)
    top_entries = {f.split("/")[0] for f in files}
    problems = []
    for path in files:
        if path.startswith(SKIP_DIRS) or not path.endswith(TEXT_SUFFIXES) or path in SELF:
            continue
        problems += check_file(root, path, tracked, top_entries)
    for p in problems:
        print(p)
    print(f"check_standalone: {len(files)} files, {len(problems)} references outside the repository")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
