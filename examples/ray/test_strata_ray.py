"""Unit tests of strata_ray.py's shard and merge functions: stdlib only, no Ray, no strata.
    python3 -m unittest discover -s examples/ray -p "test_*.py"
"""
import json
import os
import tempfile
import unittest

import strata_ray as sr


def line(rid, key="custom_id"):
    return json.dumps({key: rid, "response": {"text": f"answer {rid}"}}) + "\n"


class ShardOf(unittest.TestCase):
    def test_matches_the_documented_fnv1a(self):
        # docs/scale-out.md: fnv1a64("a") = 0xaf63dc4c8601ec8c
        self.assertEqual(sr.shard_of("a", 1 << 64), 0xAF63DC4C8601EC8C)
        self.assertEqual(sr.shard_of("", 1 << 64), 0xCBF29CE484222325)

    def test_integer_ids_hash_as_their_decimal_text(self):
        self.assertEqual(sr.id_text(7), "7")
        self.assertEqual(sr.id_text("7"), "7")
        with self.assertRaises(sr.MergeError):
            sr.id_text(True)
        with self.assertRaises(sr.MergeError):
            sr.id_text(1.5)

    def test_custom_id_wins_over_the_output_id(self):
        # An OpenAI output line has both: "id" is batch_req_…, the join key is custom_id.
        self.assertEqual(sr.request_id({"id": "batch_req_1", "custom_id": "q"}), "q")
        self.assertEqual(sr.request_id({"id": 3}), 3)


class Merge(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def split(self, ids, n, key="custom_id"):
        """Writes each id into the shard file that owns it; returns the paths."""
        paths = [os.path.join(self.dir, f"shard-{i}.jsonl") for i in range(n)]
        for p in paths:
            open(p, "w").close()
        for rid in ids:
            with open(paths[sr.shard_of(sr.id_text(rid), n)], "a") as f:
                f.write(line(rid, key))
        return paths

    def read(self, path):
        with open(path) as f:
            return [json.loads(l) for l in f]

    def test_union_sorted_by_id(self):
        ids = [f"req-{i}" for i in range(20)]
        paths = self.split(reversed(ids), 3)
        out = os.path.join(self.dir, "merged.jsonl")
        got = sr.merge_shards(paths, out)
        self.assertEqual(got, set(ids))
        self.assertEqual([l["custom_id"] for l in self.read(out)], sorted(ids))

    def test_integer_ids_sort_numerically_before_strings(self):
        paths = self.split([10, 2, "b", "a", 1], 2, key="id")
        out = os.path.join(self.dir, "merged.jsonl")
        sr.merge_shards(paths, out)
        self.assertEqual([l["id"] for l in self.read(out)], [1, 2, 10, "a", "b"])

    def test_unsorted_merge_keeps_every_line(self):
        ids = [f"r{i}" for i in range(10)]
        paths = self.split(ids, 4)
        out = os.path.join(self.dir, "merged.jsonl")
        self.assertEqual(sr.merge_shards(paths, out, sort=False), set(ids))
        self.assertEqual(sorted(l["custom_id"] for l in self.read(out)), sorted(ids))

    def test_a_request_in_two_shards_is_refused(self):
        # The same id in two files: it cannot hash to both, so a rerun changed N.
        paths = self.split(["a", "b", "c"], 2)
        owner = sr.shard_of("a", 2)
        with open(paths[1 - owner], "a") as f:
            f.write(line("a"))
        out = os.path.join(self.dir, "merged.jsonl")
        with self.assertRaisesRegex(sr.MergeError, '"a"'):
            sr.merge_shards(paths, out)
        self.assertFalse(os.path.exists(out))  # nothing written on a refused merge
        self.assertFalse(os.path.exists(out + ".merging"))

    def test_a_request_twice_in_one_shard_is_refused(self):
        paths = self.split(["a"], 1)
        with open(paths[0], "a") as f:
            f.write(line("a"))
        with self.assertRaisesRegex(sr.MergeError, "answered twice"):
            sr.merge_shards(paths, os.path.join(self.dir, "m.jsonl"))

    def test_a_file_from_another_split_is_refused(self):
        # Shard files of a 2-way split merged as a 3-way one: some id is in the wrong file.
        ids = [f"x{i}" for i in range(30)]
        paths = self.split(ids, 2) + [os.path.join(self.dir, "empty.jsonl")]
        open(paths[2], "w").close()
        with self.assertRaisesRegex(sr.MergeError, "another N"):
            sr.merge_shards(paths, os.path.join(self.dir, "m.jsonl"))

    def test_a_line_without_id_names_its_place(self):
        paths = self.split([], 1)
        with open(paths[0], "w") as f:
            f.write('{"x": 1}\n')
        with self.assertRaisesRegex(sr.MergeError, "shard-0.jsonl:1"):
            sr.merge_shards(paths, os.path.join(self.dir, "m.jsonl"))

    def test_unfinished_shards(self):
        outdir = self.dir
        open(sr.shard_path(outdir, 0), "w").close()
        open(sr.shard_path(outdir, 1), "w").close()
        open(sr.shard_path(outdir, 1) + ".partial", "w").close()  # a rerun of a finished shard
        left = sr.unfinished_shards(outdir, 3)
        self.assertEqual(sorted(left), [1, 2])
        self.assertIn(".partial", left[1])
        self.assertEqual(sorted(sr.unfinished_shards(outdir, 1, errors=True)), [0])  # no errors file

    def test_manifest_refuses_another_n(self):
        inp = os.path.join(self.dir, "in.jsonl")
        outdir = os.path.join(self.dir, "out")
        sr.check_manifest(outdir, 4, inp)
        sr.check_manifest(outdir, 4, inp)  # the same command again: resume
        with self.assertRaisesRegex(sr.MergeError, "4-way"):
            sr.check_manifest(outdir, 5, inp)

    def test_input_ids_and_format(self):
        inp = os.path.join(self.dir, "in.jsonl")
        with open(inp, "w") as f:
            f.write('{"id": 1, "prompt": "a"}\n\n{"id": "b", "prompt": "c"}\n')
        self.assertEqual(sr.input_ids(inp), {"1", "b"})
        self.assertFalse(sr.is_openai_batch(inp))

    def test_a_failed_shard_reports_its_log_tail(self):
        # run_shard is what Ray runs; called here directly with a fake strata that fails.
        fake = os.path.join(self.dir, "fake-strata")
        with open(fake, "w") as f:
            f.write("#!/bin/sh\necho \"args: $*\"\necho 'model not found' >&2\nexit 3\n")
        os.chmod(fake, 0o755)
        spec = {"strata": fake, "input": "/in.jsonl", "outdir": self.dir, "shards": 2, "strata_args": "--seed 1",
                "errors": False, "cwd": self.dir}
        r = sr.run_shard({"shard": 1}, spec)
        self.assertEqual((r["shard"], r["rc"]), (1, 3))
        self.assertIn("model not found", r["tail"])
        self.assertIn("--shard 1/2 --no-progress --seed 1", r["tail"])
        r = sr.run_shard({"shard": 0}, dict(spec, strata=os.path.join(self.dir, "missing")))
        self.assertEqual(r["rc"], 127)
        self.assertIn("cannot run", r["tail"])

    def test_shard_command(self):
        cmd = sr.shard_command("strata", "/in.jsonl", "/o", 2, 5, '--model "/m dir" --seed 3', errors=True)
        self.assertEqual(cmd, ["strata", "run", "-i", "/in.jsonl", "-o", "/o/shard-2.jsonl", "--shard", "2/5",
                               "--no-progress", "--errors", "/o/shard-2.errors.jsonl", "--model", "/m dir",
                               "--seed", "3"])


if __name__ == "__main__":
    unittest.main()
