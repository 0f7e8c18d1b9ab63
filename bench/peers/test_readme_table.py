"""Tests of bench/readme_table.py: the README's side-by-side tables are the committed summaries'
(issue 36, point 4). python3 -m unittest discover bench/peers"""
import json
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..")))
import readme_table  # noqa: E402


def case(name, engine, total, policy, status="ok", commit="new1234", date=None):
    c = {"name": name, "engine": engine, "model": "opt-30b", "policy": policy, "projected": True,
         "total_tok_s": total, "status": status, "commit": commit, "metrics": {}}
    if date:
        c["date"] = date
    return c


class ReadmeTableTest(unittest.TestCase):
    def test_readme_shows_the_committed_summaries(self):
        self.assertEqual(readme_table.main(["--check"]), 0)

    def test_pairs_ratios_and_kept_dates(self):
        strata_policy = "gpu_batch_size: 48\nnum_gpu_batches: 1\n"
        doc = {"gpu": "NVIDIA H200", "commit": "new1234", "date": "2026-12-01T08:00Z", "cases": [
            case("opt30-48x1", "strata", 36.0, strata_policy),
            case("opt30-4bit", "strata", 125.0, strata_policy + "compress_weights: {bits: 4, group_size: 64}\n"),
            case("c2", "strata", 300.0, strata_policy),  # no peer: not in the table
            case("opt30-48x1", "strata", 20.0, strata_policy, commit="bf16bec"),  # a baseline build's row
            case("opt30-48x1", "flexgen", 12.0, "48x1 (p.yaml)", commit="old0001", date="2026-11-27T10:22Z"),
            case("opt30-4bit", "flexgen", None, None, status="failed: timed out after 49 s"),
        ]}
        older = dict(doc, date="2026-11-20T08:00Z", commit="old0000")
        with tempfile.TemporaryDirectory() as d:
            for name, body in (("2026-12-01-h200-summary.json", doc), ("2026-11-20-h200-summary.json", older),
                               ("2026-12-01-h100-80gb-hbm3-summary.json", dict(doc, gpu="NVIDIA H100", cases=[]))):
                with open(os.path.join(d, name), "w") as f:
                    json.dump(body, f)
            text = readme_table.tables(d, root=d)
        self.assertIn("on NVIDIA H200", text)
        self.assertNotIn("H100", text)  # no peer rows there
        self.assertIn("2026-12-01, commit new1234", text)
        rows = [r for r in text.splitlines() if r.startswith("| opt30")]
        self.assertEqual(len(rows), 2)
        self.assertIn("| 36.00 (projected) | FlexGen 0.1.8 (2026-11-27), 48 x 1 | 12.00 (projected) | **3.00x** |",
                      rows[0])
        self.assertIn("| 64 x 1 (4-bit) |".replace("64", "48"), rows[1])
        self.assertIn("failed: timed out after 49 s |  |", rows[1])

    def test_missing_markers(self):
        with self.assertRaises(SystemExit):
            readme_table.replace_block("no markers here", "x")


if __name__ == "__main__":
    unittest.main()
