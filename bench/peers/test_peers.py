"""Unit tests of the peers' runners without the peers: argument building from Strata's cases and
policies, FlexGen's log format (testdata/, written from its source), the results lines. Standard
library only: python3 -m unittest discover bench/peers (ctest runs it)."""
import contextlib
import io
import json
import os
import tempfile
import importlib.util
import unittest

import accelerate_runner
import common
import deepspeed_runner
import flexgen_runner
import hf_peer

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))


def case(**kw):
    base = dict(name="c", model="opt-6.7b", prompt_len=512, gen_len=32, policy="p.yaml")
    base.update(kw)
    return common.Case(**base)


class YamlTest(unittest.TestCase):
    def test_flow_maps_scalars_and_case_lists(self):
        doc = common.read_yaml_subset("# c\nname: s  # trailing\ncases:\n  - {name: a, model: opt-125m, prompt_len: 64, "
                               "compress: true, gpu_mem: 16GB}\n  - {name: b, model: opt-1.3b}\n"
                               "weights: {gpu: 20, cpu: 80, disk: 0}\noverlap: false\n")
        self.assertEqual(doc["name"], "s")
        self.assertEqual(doc["cases"][0], {"name": "a", "model": "opt-125m", "prompt_len": 64, "compress": True,
                                           "gpu_mem": "16GB"})
        self.assertEqual(doc["cases"][1]["name"], "b")
        self.assertEqual(doc["weights"], {"gpu": 20, "cpu": 80, "disk": 0})
        self.assertIs(doc["overlap"], False)

    def test_every_shipped_suite_and_policy_reads(self):
        suites = os.path.join(REPO, "bench", "suites")
        names = [f for f in os.listdir(suites) if f.endswith(".yaml")]
        self.assertGreaterEqual(len(names), 3)
        for f in names:
            with open(os.path.join(suites, f)) as fh:
                text = fh.read()
            self.assertEqual(common.read_yaml_subset(text)["cases"], common.read_yaml(text)["cases"])
            cases = common.load_cases(os.path.join(suites, f))
            self.assertTrue(cases, f)
            for c in cases:
                if c.policy != "auto":
                    with open(c.policy_path()) as fh:
                        text = fh.read()
                    self.assertEqual(common.read_yaml_subset(text), common.read_yaml(text), c.policy_path())
                    p = common.load_policy(c.policy_path())
                    self.assertGreaterEqual(p.block_size, 1)
                    self.assertEqual(sum(p.weights.values()), 100, c.name)

    def test_suite_by_name(self):
        cases = common.load_cases("paper-table2")
        c = next(c for c in cases if c.name == "opt-30b-512")
        self.assertEqual((c.model, c.prompt_len, c.gen_len, c.gpu_mem), ("opt-30b", 512, 32, "16GB"))
        with self.assertRaises(common.CaseError):
            common.load_cases("no-such-suite")


class FlexGenArgsTest(unittest.TestCase):
    def test_paper_policy_opt30b(self):
        c = next(c for c in common.load_cases("paper-table2") if c.name == "opt-30b-512")
        p = common.load_policy(c.policy_path())
        cmd = flexgen_runner.flexgen_args(c, p, "/tmp/f.log", "/tmp/off", python="py")
        self.assertEqual(cmd[:4], ["py", flexgen_runner.SHIM, "-m", "flexgen.flex_opt"])
        self.assertEqual(flexgen_runner.flexgen_args(c, p, "l", "o", python="py", shim=False)[:3],
                         ["py", "-m", "flexgen.flex_opt"])
        args = " ".join(cmd)
        self.assertIn("--model facebook/opt-30b --path _DUMMY_", args)
        self.assertIn("--prompt-len 512 --gen-len 32", args)
        self.assertIn(f"--gpu-batch-size {p.gpu_batch_size} --num-gpu-batches {p.num_gpu_batches}", args)
        w, k, h = p.weights, p.kv_cache, p.activations
        self.assertIn(f"--percent {w['gpu']} {w['cpu']} {k['gpu']} {k['cpu']} {h['gpu']} {h['cpu']}", args)
        self.assertEqual("--cpu-cache-compute" in cmd, p.cpu_attention)
        self.assertEqual(cmd[-2:], ["--log-file", "/tmp/f.log"])

    def test_options(self):
        p = common.policy_from_dict({"gpu_batch_size": 48, "num_gpu_batches": 3,
                                     "weights": {"gpu": 20, "cpu": 80, "disk": 0},
                                     "kv_cache": {"gpu": 0, "cpu": 100, "disk": 0},
                                     "activations": {"gpu": 0, "cpu": 100, "disk": 0}, "overlap": False,
                                     "cpu_attention": True, "compress_weights": {"bits": 4, "group_size": 64},
                                     "compress_kv_cache": {"bits": 4, "group_size": 64}})
        cmd = flexgen_runner.flexgen_args(case(model="dummy:opt-30b"), p, "l", "o", fewer_batch=True)
        for flag in ("--cpu-cache-compute", "--compress-weight", "--compress-cache"):
            self.assertIn(flag, cmd)
        self.assertIn("--percent 20 80 0 100 0 100", " ".join(cmd))
        self.assertIn("--overlap false", " ".join(cmd))
        self.assertIn("--debug-mode fewer_batch", " ".join(cmd))
        plain = flexgen_runner.flexgen_args(case(), common.Policy(), "l", "o")
        self.assertNotIn("--overlap", plain)
        self.assertNotIn("--compress-weight", plain)
        self.assertIn("--percent 100 0 100 0 100 0", " ".join(plain))

    def test_what_flexgen_cannot_run(self):
        with self.assertRaisesRegex(common.CaseError, "OPT presets"):
            flexgen_runner.flexgen_args(case(model="llama-3-8b"), common.Policy(), "l", "o")
        p = common.Policy(activations={"gpu": 0, "cpu": 50, "disk": 50})
        with self.assertRaisesRegex(common.CaseError, "activations on disk"):
            flexgen_runner.flexgen_args(case(), p, "l", "o")
        p = common.Policy(compress_weights={"bits": 8, "group_size": 64})
        with self.assertRaisesRegex(common.CaseError, "4 bits"):
            flexgen_runner.flexgen_args(case(), p, "l", "o")


class FlexGenLogTest(unittest.TestCase):
    def test_sample_log_last_record(self):
        with open(os.path.join(HERE, "testdata", "flexgen-0.1.8-sample.log")) as f:
            r = flexgen_runner.parse_log(f.read())
        self.assertEqual(r["projected"], True)
        self.assertAlmostEqual(r["prefill_latency_s"], 6.401)
        self.assertAlmostEqual(r["total_tok_s"], 5.134)
        self.assertAlmostEqual(r["peak_gpu_gb"], 15.102)
        self.assertEqual(flexgen_runner.measured_from_log(r),
                         {"prefill_tok_s": 319.950, "decode_tok_s": 6.691, "total_tok_s": 5.134})

    def test_incomplete_logs(self):
        with self.assertRaisesRegex(ValueError, "no FlexGen benchmark record"):
            flexgen_runner.parse_log("warmup - generate\n")
        with self.assertRaisesRegex(ValueError, "decode latency"):
            flexgen_runner.parse_log("model size: 1 GB\tcache size: 1 GB\thidden size (p): 1 GB\n"
                                     "peak gpu mem: 1 GB\tprojected: False\nprefill latency: 1 s\t"
                                     "prefill throughput: 2 token/s\n")


class AccelerateTest(unittest.TestCase):
    def test_plan(self):
        p = common.policy_from_dict({"gpu_batch_size": 8, "num_gpu_batches": 3})
        pl = accelerate_runner.plan(case(gpu_mem="16GB", cpu_mem="200GiB"), p)
        self.assertEqual(pl["batch_size"], 24)
        self.assertEqual(pl["max_memory"], {0: 16 * 10**9, "cpu": 200 * 2**30})
        self.assertEqual(pl["config"]["hidden_size"], 4096)
        self.assertEqual(pl["config"]["ffn_dim"], 16384)
        self.assertEqual(pl["config"]["num_hidden_layers"], 32)
        self.assertEqual(accelerate_runner.plan(case(), p, batch_size=4, gpu_mem_default="8GB")["max_memory"],
                         {0: 8 * 10**9})
        with self.assertRaisesRegex(common.CaseError, "2048 positions"):
            accelerate_runner.plan(case(prompt_len=2040, gen_len=32), p)

    def test_prompts_match_strata(self):
        pr = hf_peer.synthetic_prompts(2, 3, 50272)
        self.assertEqual(pr[0], [7919, 15838, 23757])
        self.assertEqual(pr[1][0], (7919 + 104729) % 50272)

    def test_timing(self):
        # 4 sequences, prompt 10: prefill 2 s, then 3 more tokens in 3 s.
        m = hf_peer.measure_from_stamps(0.0, [2.0, 3.0, 4.0, 5.0], 4, 10)
        self.assertAlmostEqual(m["prefill_tok_s"], 20.0)
        self.assertAlmostEqual(m["decode_tok_s"], 4.0)
        self.assertAlmostEqual(m["total_tok_s"], 16 / 5)

    def test_projected_timing(self):
        # gen_len 32 from 3 decode steps of 1 s each: decode 31 s for 31 x 4 tokens.
        m = hf_peer.measure_from_stamps(0.0, [2.0, 3.0, 4.0, 5.0], 4, 10, gen_len=32)
        self.assertAlmostEqual(m["decode_tok_s"], 4.0)
        self.assertAlmostEqual(m["total_tok_s"], 4 * 32 / (2 + 31))
        with self.assertRaisesRegex(ValueError, "decode step"):
            hf_peer.measure_from_stamps(0.0, [2.0], 4, 10, gen_len=32)

    def test_decode_steps(self):
        p = common.Policy(gpu_batch_size=8, num_gpu_batches=1)
        self.assertEqual(accelerate_runner.plan(case(), p, decode_steps=3)["decode_steps"], 3)
        self.assertEqual(accelerate_runner.plan(case(), p)["decode_steps"], 0)
        self.assertEqual(accelerate_runner.plan(case(gen_len=4), p, decode_steps=3)["decode_steps"], 0)
        self.assertEqual(hf_peer.generated_tokens({"gen_len": 32, "decode_steps": 3}), 4)
        self.assertEqual(hf_peer.generated_tokens({"gen_len": 32, "decode_steps": 0}), 32)
        self.assertEqual(hf_peer.generated_tokens({"gen_len": 32}), 32)

    @unittest.skipUnless(importlib.util.find_spec("torch"), "torch is not installed")
    def test_fill_random(self):
        import torch
        a, b = torch.empty(1000, dtype=torch.float16), torch.empty(3, 7, dtype=torch.float32)
        hf_peer.fill_random_([a, b], pool_elements=64)
        self.assertTrue(torch.equal(a[:64], a[64:128]))  # tiled
        self.assertLess(float(a.float().abs().max()), 0.2)
        self.assertGreater(float(a.float().std()), 0.005)
        self.assertTrue(torch.equal(b.view(-1).half(), a[:21]))  # one pool, each dtype's copy of it


class DeepSpeedTest(unittest.TestCase):
    def test_offload_device_from_the_policy(self):
        on = lambda **w: common.Policy(weights=dict({"gpu": 0, "cpu": 0, "disk": 0}, **w))  # noqa: E731
        self.assertEqual(deepspeed_runner.offload_device(on(gpu=100)), "none")
        self.assertEqual(deepspeed_runner.offload_device(on(gpu=20, cpu=80)), "cpu")
        self.assertEqual(deepspeed_runner.offload_device(on(cpu=50, disk=50)), "nvme")

    def test_config(self):
        p = common.Policy(gpu_batch_size=16, num_gpu_batches=4, weights={"gpu": 0, "cpu": 100, "disk": 0})
        pl = deepspeed_runner.plan(case(model="opt-30b"), p)
        cfg = pl["ds_config"]
        self.assertEqual(cfg["zero_optimization"]["stage"], 3)
        self.assertEqual(cfg["zero_optimization"]["offload_param"], {"device": "cpu", "pin_memory": True})
        self.assertEqual(cfg["zero_optimization"]["stage3_prefetch_bucket_size"], 2 * 7168 * 7168)
        self.assertEqual(cfg["train_batch_size"], 64)
        self.assertTrue(cfg["fp16"]["enabled"])
        self.assertNotIn("max_memory", pl)
        disk = common.Policy(weights={"gpu": 0, "cpu": 50, "disk": 50})
        nv = deepspeed_runner.plan(case(), disk, offload_dir="/nvme/x")["ds_config"]["zero_optimization"]
        self.assertEqual((nv["offload_param"]["device"], nv["offload_param"]["nvme_path"]), ("nvme", "/nvme/x"))
        with self.assertRaisesRegex(common.CaseError, "offload-dir"):
            deepspeed_runner.plan(case(), disk)
        gpu_only = deepspeed_runner.plan(case(), common.Policy())["ds_config"]["zero_optimization"]
        self.assertNotIn("offload_param", gpu_only)


class ResultLineTest(unittest.TestCase):
    def test_line_fields_and_append(self):
        p = common.Policy(gpu_batch_size=4, num_gpu_batches=2)
        m = common.measure(8 * 512, 8 * 32, 8, 2.0, 10.0)
        line = common.result_line(case(gpu_mem="16GB"), "flexgen", p, measured=m, command="x")
        for key in ("name", "engine", "model", "prompt_len", "gen_len", "status", "measured", "command"):
            self.assertIn(key, line)
        self.assertEqual(line["measured"]["repeats"], 1)
        self.assertAlmostEqual(line["measured"]["total_tok_s"], 256 / 12)
        self.assertEqual((line["gpu_batch_size"], line["num_gpu_batches"]), (4, 2))
        with tempfile.TemporaryDirectory() as d:
            common.append_line(d, line)
            common.append_line(d, common.result_line(case(name="d"), "flexgen", None, status="unsupported"))
            with open(os.path.join(d, "peers.jsonl")) as f:
                rows = [json.loads(x) for x in f]
        self.assertEqual([r["name"] for r in rows], ["c", "d"])
        self.assertNotIn("measured", rows[1])

    def test_sizes(self):
        self.assertEqual(common.parse_size("16GB"), 16 * 10**9)
        self.assertEqual(common.parse_size("1.5 GiB"), int(1.5 * 2**30))
        with self.assertRaises(common.CaseError):
            common.parse_size("lots")

    def test_dry_run_from_suite(self):
        with tempfile.TemporaryDirectory() as d:
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                rc = flexgen_runner.main(["--suite", "smoke-cpu", "--case", "opt-125m-cpu-attn", "--dry-run", "--out",
                                          d, "--offload-dir", d])
            self.assertEqual(rc, 0)
            self.assertIn("-m flexgen.flex_opt --model facebook/opt-125m --path _DUMMY_", printed.getvalue())
            self.assertIn("--percent 50 50 0 100 0 100 --cpu-cache-compute", printed.getvalue())
            self.assertFalse(os.path.exists(os.path.join(d, "peers.jsonl")))
            # A model FlexGen does not have is recorded as unsupported, not run.
            with contextlib.redirect_stderr(io.StringIO()):
                flexgen_runner.main(["--model", "llama-3-8b", "--prompt-len", "8", "--gen-len", "2", "--policy",
                                     os.path.join(REPO, "bench", "suites", "smoke", "all-gpu-8x1.yaml"), "--out", d])
            with open(os.path.join(d, "peers.jsonl")) as f:
                row = json.loads(f.readline())
            self.assertTrue(row["status"].startswith("unsupported"))


if __name__ == "__main__":
    unittest.main()
