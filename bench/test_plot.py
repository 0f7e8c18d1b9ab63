"""bench/plot.py's data loading on the committed smoke results and a peers' line; the drawing
itself only where matplotlib is installed. python3 -m unittest discover -s bench -p test_plot.py"""
import json
import os
import tempfile
import unittest

import plot

HERE = os.path.dirname(os.path.abspath(__file__))
SMOKE = os.path.join(HERE, "results", "2026-11-23-cpu-bench-smoke.jsonl")

PEER = {"name": "opt-1.3b-weights-cpu", "engine": "flexgen", "model": "opt-1.3b", "prompt_len": 64, "gen_len": 8,
        "status": "ok", "gpu_batch_size": 8, "num_gpu_batches": 1,
        "measured": {"prefill_tok_s": 50.0, "decode_tok_s": 8.0, "total_tok_s": 4.0, "repeats": 1}}
PARETO = {"model": "opt-1.3b", "hardware": "cpu", "workload": {"prompt_len": 64, "gen_len": 8},
          "points": [{"max_latency_s": 5, "policy": None},
                     {"max_latency_s": 10, "latency_s": 9.0, "throughput_tok_s": 7.0, "policy": {}},
                     {"max_latency_s": 20, "latency_s": 18.0, "throughput_tok_s": 9.0, "policy": {}}],
          "frontier": [{"latency_s": 9.0, "throughput_tok_s": 7.0}, {"latency_s": 18.0, "throughput_tok_s": 9.0}]}


class PlotDataTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.peers = os.path.join(self.tmp.name, "peers.jsonl")
        with open(self.peers, "w") as f:
            f.write(json.dumps(PEER) + "\n")
        self.rows = plot.load_rows(SMOKE, self.peers)

    def tearDown(self):
        self.tmp.cleanup()

    def test_throughput_peers_beside_strata(self):
        cases, engines, values = plot.throughput_series(self.rows)
        self.assertEqual(len(cases), 5)
        self.assertEqual(engines, ["strata", "flexgen"])
        self.assertEqual(list(values["flexgen"]), ["opt-1.3b-weights-cpu"])
        total, sd = values["strata"]["opt-125m-resident"]
        self.assertAlmostEqual(total, 86.72337361451585)
        self.assertGreater(sd, 0)

    def test_predicted_only_strata(self):
        pts = plot.predicted_series(self.rows)
        self.assertEqual(len(pts), 5)
        name, pred, meas = pts[0]
        self.assertEqual(name, "opt-125m-resident")
        self.assertAlmostEqual(pred, 122.81173093486832)

    def test_frontier_measured_points_of_the_same_workload(self):
        sweep, frontier, measured = plot.frontier_series(PARETO, self.rows)
        self.assertEqual(sweep, [(9.0, 7.0), (18.0, 9.0)])  # the bound nothing met is left out
        self.assertEqual(len(frontier), 2)
        names = [(m[0], m[1]) for m in measured]
        self.assertIn(("opt-1.3b-weights-cpu", "flexgen"), names)
        self.assertNotIn("opt-125m-resident", [n for n, _ in names])  # another model
        peer = next(m for m in measured if m[1] == "flexgen")
        self.assertAlmostEqual(peer[2], 8 * 8 / 4.0)  # block x gen / total: the block's time

    def test_block_size(self):
        self.assertEqual(plot.block_size({"policy": "gpu_batch_size: 4\nnum_gpu_batches: 2\n"}), 8)
        self.assertEqual(plot.block_size({"gpu_batch_size": 3}), 3)
        self.assertIsNone(plot.block_size({}))

    def test_failed_lines_and_bad_files(self):
        rows = [{"name": "x", "engine": "accelerate", "status": "failed: out of memory"}]
        cases, engines, _ = plot.throughput_series(rows)
        self.assertEqual((cases, engines), (["x"], []))
        bad = os.path.join(self.tmp.name, "bad.jsonl")
        with open(bad, "w") as f:
            f.write("{nope\n")
        with self.assertRaisesRegex(ValueError, "bad.jsonl:1"):
            plot.load_rows(bad)

    def test_draws_where_matplotlib_is_installed(self):
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            self.skipTest("matplotlib is not installed (bench/requirements.txt)")
        pareto = os.path.join(self.tmp.name, "pareto.json")
        with open(pareto, "w") as f:
            json.dump(PARETO, f)
        rc = plot.main([self.tmp.name, "--results", SMOKE, "--pareto", pareto])
        self.assertEqual(rc, 0)
        for name in ("throughput.png", "predicted_vs_measured.png", "frontier.png"):
            self.assertGreater(os.path.getsize(os.path.join(self.tmp.name, name)), 1000)


if __name__ == "__main__":
    unittest.main()
