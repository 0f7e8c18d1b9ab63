"""scripts/check_standalone.py finds each way out of the repository, and only those (ctest:
check_standalone_python). The repository itself is checked by ctest's standalone_repository."""
import contextlib
import io
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_standalone  # noqa: E402

TREE = {
    "README.md": "# x\n",
    "docs/offload.md": "See docs/cost-model.md and ../shared/DESIGN.md.\n",  # 1: climbs, 2: no such document
    "docs/cost-model.md": "FlexGen's FMInference/FlexGen benchmark/BATCH_TABLE.md and "
                          "https://github.com/x/y/blob/main/NOTES.md are other projects' files.\n",
    "docs/design.md": "Gone: docs/missing.md.\n",  # 3
    "tests/CMakeLists.txt": 'set(D "${PROJECT_SOURCE_DIR}/../shared")\n',  # 4
    "tests/t.cpp": 'auto s = fixtures / "../../bench/suites";\n'
                   'open("../x.safetensors");  // standalone: input\n',
    "bench/suites/a.yaml": "x: 1\n",
    "bench/run.sh": "/work/refenv/bin/python x.py\n",  # 5
    "bench/results/r.md": "model /root/.cache/strata/m.gguf (what the run printed)\n",
    "src/a.cpp": "// STYLE.md 9: measure in the limit's units\n",  # 6
}


class CheckStandaloneTest(unittest.TestCase):
    def run_on(self, tree):
        with tempfile.TemporaryDirectory() as root:
            for path, text in tree.items():
                os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
                with open(os.path.join(root, path), "w", encoding="utf-8") as f:
                    f.write(text)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                code = check_standalone.main(["check_standalone.py", root])
            return code, [line for line in out.getvalue().splitlines() if not line.startswith("check_standalone:")]

    def test_each_way_out_is_found_with_its_file_and_line(self):
        code, problems = self.run_on(TREE)
        self.assertEqual(code, 1)
        self.assertEqual(sorted(problems), sorted([
            "docs/offload.md:1: '../shared/DESIGN.md' climbs out of the repository",
            "docs/offload.md:1: '../shared/DESIGN.md' is not a file of the repository",
            "docs/design.md:1: 'docs/missing.md' is not a file of the repository",
            "tests/CMakeLists.txt:1: a CMake path above the source tree",
            "bench/run.sh:1: '/work/refenv' is a path on one machine",
            "src/a.cpp:1: 'STYLE.md' is not a file of the repository",
        ]))

    def test_a_clean_tree_passes(self):
        clean = {p: t for p, t in TREE.items()
                 if p not in ("docs/offload.md", "docs/design.md", "tests/CMakeLists.txt", "bench/run.sh", "src/a.cpp")}
        self.assertEqual(self.run_on(clean), (0, []))


if __name__ == "__main__":
    unittest.main()
