"""Tests of bench/summary_json.py (OUT/summary.json from results.jsonl and peers.jsonl), here beside
the peers' tests so that ctest's bench_peers_python runs it. python3 -m unittest discover bench/peers"""
import json
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..")))
import summary_json  # noqa: E402

import common  # noqa: E402

CASE_KEYS = {"name", "engine", "model", "policy", "prompt_len", "gen_len", "projected", "prefill_tok_s",
             "decode_tok_s", "total_tok_s", "peak_gpu_bytes", "command", "commit", "status", "metrics"}


class SummaryTest(unittest.TestCase):
    def test_schema_from_strata_and_peers(self):
        strata = {"name": "opt-30b-48x1", "engine": "strata", "model": "opt-30b", "prompt_len": 512, "gen_len": 32,
                  "status": "ok", "policy": "gpu_batch_size: 48\n", "commit": "abc1234",
                  "measured": {"prefill_tok_s": 900.0, "decode_tok_s": 20.0, "total_tok_s": 15.0, "repeats": 1,
                               "decode_steps_run": 4, "sd": {"total_tok_s": 0.1}},
                  "projected": True, "peak_memory": {"gpu": 1.5e10, "cpu": 0}, "links": {"cpu_to_gpu_gbps": 21.5},
                  "predicted": None}
        p = common.Policy(gpu_batch_size=48, num_gpu_batches=1)
        case = common.Case(name="opt-30b-48x1", model="opt-30b", prompt_len=512, gen_len=32)
        flexgen = common.result_line(case, "flexgen", p, measured={"prefill_tok_s": 800.0, "decode_tok_s": 10.0,
                                                                   "total_tok_s": 8.0}, command="py -m flexgen",
                                     extra={"projected": True, "peak_memory": {"gpu": 1.2e10},
                                            "policy_source": "p.yaml",
                                            "flexgen": {"model_gb": 55.8, "peak_gpu_gb": 11.2, "projected": True}})
        failed = common.result_line(case, "accelerate", None, status="failed: CUDA out of memory")
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "results.jsonl"), "w") as f:
                f.write(json.dumps(strata) + "\nnot json\n")
            for line in (flexgen, failed):
                common.append_line(d, line)
            self.assertEqual(summary_json.main([d, "--commit", "def5678", "--strata-command", "strata bench x"]), 0)
            with open(os.path.join(d, "summary.json")) as f:
                doc = json.load(f)
        self.assertEqual(set(doc), {"gpu", "driver", "host", "commit", "date", "cases"})
        self.assertEqual(set(doc["host"]), {"cores", "mem_gib"})
        self.assertEqual(doc["commit"], "def5678")
        s, fg, acc = doc["cases"]
        for c in (s, fg, acc):
            self.assertEqual(set(c), CASE_KEYS)
        self.assertEqual((s["engine"], s["commit"], s["command"], s["projected"]), ("strata", "abc1234",
                                                                                   "strata bench x", True))
        self.assertEqual((s["total_tok_s"], s["peak_gpu_bytes"]), (15.0, 15000000000))
        self.assertEqual(s["metrics"], {"links.cpu_to_gpu_gbps": 21.5, "decode_steps_run": 4})
        self.assertEqual((fg["engine"], fg["commit"], fg["policy"], fg["decode_tok_s"]),
                         ("flexgen", "def5678", "48x1 (p.yaml)", 10.0))
        self.assertEqual(fg["metrics"], {"flexgen.model_gb": 55.8})
        self.assertEqual((acc["status"], acc["total_tok_s"], acc["peak_gpu_bytes"]),
                         ("failed: CUDA out of memory", None, None))

    def test_empty_call_still_writes(self):
        with tempfile.TemporaryDirectory() as d:
            summary_json.main([os.path.join(d, "out"), "--commit", "x"])
            with open(os.path.join(d, "out", "summary.json")) as f:
                self.assertEqual(json.load(f)["cases"], [])


if __name__ == "__main__":
    unittest.main()
