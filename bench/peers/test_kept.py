"""Tests of bench/peers/kept.py: a peer's row is kept from the newest committed summary of the
same card kind (issue 36, point 5). python3 -m unittest discover bench/peers"""
import json
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..")))
import kept  # noqa: E402


def summary(date, cases):
    return {"gpu": "NVIDIA H200", "driver": "580", "host": {"cores": 16, "mem_gib": 125.9}, "commit": "c0ffee1",
            "date": date, "cases": cases}


def case(name, engine, total, status="ok", date=None):
    c = {"name": name, "engine": engine, "model": "opt-30b", "policy": "48x1 (opt30-flexgen.yaml)",
         "prompt_len": 512, "gen_len": 32, "projected": True, "prefill_tok_s": 3614.5, "decode_tok_s": 14.0,
         "total_tok_s": total, "peak_gpu_bytes": 12133000000, "command": "python3 -m flexgen.flex_opt ...",
         "commit": "c0ffee1", "status": status, "metrics": {}}
    if date:
        c["date"] = date
    return c


class KeptTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.results = self.dir.name
        self.write("2026-11-27-h200-summary.json", summary("2026-11-27T10:22Z", [
            case("opt30-flexgen-48x1", "flexgen", 13.59), case("opt30-flexgen-4bit-64x2", "flexgen", None,
                                                                 status="failed: timed out")]))
        self.write("2026-11-20-h200-summary.json", summary("2026-11-20T09:00Z", [
            case("opt30-flexgen-48x1", "flexgen", 12.0), case("opt30-flexgen-4bit-64x2", "flexgen", 30.0)]))
        self.write("2026-11-28-h100-80gb-hbm3-summary.json", summary("2026-11-28T09:00Z", [
            case("opt30-flexgen-48x1", "flexgen", 11.0)]))

    def tearDown(self):
        self.dir.cleanup()

    def write(self, name, doc):
        with open(os.path.join(self.results, name), "w") as f:
            json.dump(doc, f)

    def run_kept(self, name, engine="flexgen", gpu="h200"):
        out = os.path.join(self.results, "out")
        rc = kept.main(["--gpu", gpu, "--name", name, "--engine", engine, "--out", out,
                        "--results-dir", self.results])
        path = os.path.join(out, "peers.jsonl")
        lines = []
        if os.path.exists(path):
            with open(path) as f:
                lines = [json.loads(x) for x in f]
            os.remove(path)
        return rc, lines

    def test_newest_ok_row_of_the_same_card(self):
        rc, (line,) = self.run_kept("opt30-flexgen-48x1")
        self.assertEqual(rc, 0)
        self.assertEqual(line["measured"]["total_tok_s"], 13.59)  # the 27th's, not the 20th's or the H100's
        self.assertEqual((line["gpu_batch_size"], line["num_gpu_batches"], line["projected"]), (48, 1, True))
        self.assertEqual(line["date"], "2026-11-27T10:22Z")
        self.assertIn("2026-11-27-h200-summary.json", line["kept_from"])
        self.assertEqual(line["peak_memory"], {"gpu": 12133000000})

    def test_a_failed_row_is_not_kept(self):
        rc, (line,) = self.run_kept("opt30-flexgen-4bit-64x2")  # failed on the 27th: the 20th's ok row
        self.assertEqual((rc, line["measured"]["total_tok_s"], line["date"]), (0, 30.0, "2026-11-20T09:00Z"))

    def test_nothing_to_keep(self):
        self.assertEqual(self.run_kept("opt67-flexgen-2x1"), (kept.NOT_KEPT, []))
        self.assertEqual(self.run_kept("opt30-flexgen-48x1", engine="accelerate"), (kept.NOT_KEPT, []))
        self.assertEqual(self.run_kept("opt30-flexgen-48x1", gpu="a100")[0], kept.NOT_KEPT)

    def test_a_kept_row_keeps_its_date_in_the_summary(self):
        import summary_json
        rc, (line,) = self.run_kept("opt30-flexgen-48x1")
        out = os.path.join(self.results, "call")
        os.makedirs(out)
        with open(os.path.join(out, "peers.jsonl"), "w") as f:
            f.write(json.dumps(line) + "\n")
        doc = summary_json.summary(out, commit="new1234", date="2026-12-01T08:00Z")
        (c,) = doc["cases"]
        self.assertEqual((c["date"], c["commit"], doc["date"]), ("2026-11-27T10:22Z", "c0ffee1", "2026-12-01T08:00Z"))


if __name__ == "__main__":
    unittest.main()


class RecordMissingTest(unittest.TestCase):
    def test_a_run_without_a_line_is_recorded_once(self):
        import record_missing
        with tempfile.TemporaryDirectory() as d:
            suite = os.path.join(d, "suite.yaml")
            with open(suite, "w") as f:
                f.write("name: peers-x\ncases:\n  - {name: opt30-4bit, model: opt-30b, prompt_len: 512, gen_len: 32, "
                        "policy: auto}\n")
            args = ["--suite", suite, "--out", d, "--engine", "flexgen", "--status", "failed: timed out after 49 s"]
            record_missing.main(args)
            record_missing.main(args)  # already recorded: nothing more
            record_missing.main(args[:5] + ["accelerate", "--status", "not run: the call's deadline came first"])
            with open(os.path.join(d, "peers.jsonl")) as f:
                lines = [json.loads(x) for x in f]
        self.assertEqual([(x["engine"], x["status"]) for x in lines],
                         [("flexgen", "failed: timed out after 49 s"),
                          ("accelerate", "not run: the call's deadline came first")])
        self.assertEqual((lines[0]["name"], lines[0]["model"], lines[0]["gen_len"]), ("opt30-4bit", "opt-30b", 32))
