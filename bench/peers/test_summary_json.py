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
             "decode_tok_s", "total_tok_s", "peak_gpu_bytes", "command", "commit", "date", "status", "metrics"}


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


# Lines as the GPU machine printed them (bench/gpu_suite.sh's log, 2026-11-27 on an H200).
LOG = """### engine c2 before (bf16bec): .device/before/strata bench --suite c2.yaml --device cuda --out engine/before
| case | engine | model | prompt | gen | block | prefill tok/s | decode tok/s | total tok/s | predicted | error | cpu->gpu GB/s (peak) | peak gpu / cpu / disk |
|---|---|---|---|---|---|---|---|---|---|---|---|---|
| c2-all-gpu-8x1 | strata | opt-6.7b | 512 | 32 | 8 x 1 | 30143.57 | 430.18 | 359.35 (projected) | 1005.77 | +180% | 0.00 (54.9) | 14.66 GiB / 0 B / 0 B |
### engine c2: strata bench --suite c2.yaml --device cuda --out engine/after
| c2-all-gpu-8x1 | strata | opt-6.7b | 512 | 32 | 8 x 1 | 30283.82 | 452.22 | 374.45 (projected) | 1005.77 | +169% | 0.00 (54.9) | 14.66 GiB / 0 B / 0 B |
| c4-4bit | strata | opt-6.7b | 512 | 32 | 64 x 2 (4-bit) | 7407.59 | 166.38 | 125.28 | 137.61 | +10% | 57.34 (54.9) | 2.80 GiB / 41.49 GiB / 0 B |
### bench_generate opt-6.7b batch 8 (c2's resident step): bench_generate --model dummy:opt-6.7b --batch 8
decode: batch 8, 31 steps, 13.291 ms/step, 601.9 tok/s, weights read at 1002.0 GB/s = 28.0% of copy bandwidth
cpu decode attention: 48 sequences x 544 positions, 56 query heads / 56 kv heads of 128, F16 queries, 16 threads; read bandwidth 128.7 GB/s
  fp16          6.332 ms per step, cache read at  118.2 GB/s =  92% of the read bandwidth
"""


# Part kernels' steps as bench/gpu_suite.sh logs them (the programs' lines as they print them).
KERNELS_LOG = """### bench_generate opt-6.7b before (518c070): .device/before/bench_generate --model dummy:opt-6.7b --device cuda --batch 1 --prompt-len 32 --gen-len 32 --prefill-tokens 4096
decode: batch 1, 31 steps, 6.590 ms/step, 151.7 tok/s, weights read at 2022.0 GB/s = 57.0% of copy bandwidth
prefill: 4096 tokens in 480.1 ms (8531 tok/s); the same GEMMs alone take 196.8 ms = 41.0% of prefill, at 560.1 TFLOP/s
### bench_generate opt-6.7b: bench_generate --model dummy:opt-6.7b --device cuda --batch 1 --prompt-len 32 --gen-len 32 --prefill-tokens 4096
decode: batch 1, 31 steps, 5.100 ms/step, 196.1 tok/s, weights read at 2613.0 GB/s = 73.6% of copy bandwidth
launches: 1.0 per decode step (31 over 31 steps, graph replays counting one)
prefill: 4096 tokens in 400.0 ms (10240 tok/s); the same GEMMs alone take 260.0 ms = 65.0% of prefill, at 424.0 TFLOP/s
### bench_generate opt-6.7b, STRATA_CUDA_GRAPHS=0: env STRATA_CUDA_GRAPHS=0 bench_generate --model dummy:opt-6.7b --device cuda --batch 1 --prompt-len 32 --gen-len 32 --prefill-tokens 4096
decode: batch 1, 31 steps, 5.900 ms/step, 169.5 tok/s, weights read at 2258.6 GB/s = 63.6% of copy bandwidth
launches: 418.0 per decode step (12958 over 31 steps, graph replays counting one)
### bench_generate llama-3-8b --dtype bf16: bench_generate --model dummy:llama-3-8b --device cuda --batch 1 --prompt-len 32 --gen-len 32 --prefill-tokens 4096 --dtype bf16
bench_generate: out of memory
### bench_generate llama-3-8b batch 64 sampled: bench_generate --model dummy:llama-3-8b --device cuda --batch 64 --prompt-len 32 --gen-len 16 --prefill-tokens 512 --temperature 0.8 --top-p 0.95
decode (sampled): batch 64, 15 steps, 30.000 ms/step, 2133.3 tok/s, weights read at 535.0 GB/s = 15.1% of copy bandwidth
### bench_generate llama-3-8b batch 64 sampled, top-k 50: bench_generate --model dummy:llama-3-8b --device cuda --batch 64 --prompt-len 32 --gen-len 16 --prefill-tokens 512 --temperature 0.8 --top-k 50
decode (sampled): batch 64, 15 steps, 12.000 ms/step, 5333.3 tok/s, weights read at 1337.5 GB/s = 37.8% of copy bandwidth
### decode attention 1 x 32768, 32/8 heads, STRATA_SPLIT_KV=auto: env STRATA_SPLIT_KV=auto bench_decode_attention --slots 1 --context 32768 --heads 32 --kv-heads 8 --head-dim 128
decode attention on cuda (NVIDIA H200, fp16); STRATA_SPLIT_KV=auto; device copy bandwidth (read + write) 3540.2 GB/s
f16  1 x 32768 tokens, 32 heads (8 kv) of 128:    30.12 us a call,  2228.4 GB/s of cache (63% of copy), 40 layers, 33000 calls
q4   1 x 32768 tokens, 32 heads (8 kv) of 128:    12.50 us a call,  1500.0 GB/s of cache (42% of copy), 120 layers, 80000 calls
"""


class KernelMetricsTest(unittest.TestCase):
    def test_kernel_cases(self):
        cases = summary_json.kernel_cases(KERNELS_LOG, "new1234")
        names = [(c["name"], c["commit"]) for c in cases]
        self.assertEqual(names, [("opt-6.7b resident b1", "518c070"), ("opt-6.7b resident b1", "new1234"),
                                 ("opt-6.7b resident b1 STRATA_CUDA_GRAPHS=0", "new1234"),
                                 ("llama-3-8b resident b64 sampled", "new1234"),
                                 ("llama-3-8b resident b64 sampled top-k 50", "new1234"),
                                 ("decode attention f16 1 x 32768, 32/8 heads, split auto", "new1234"),
                                 ("decode attention q4 1 x 32768, 32/8 heads, split auto", "new1234")])
        before, after, eager, sampled, top_k, f16, q4 = cases
        self.assertEqual(sampled["measured"], {"decode_tok_s": 2133.3})
        self.assertEqual(top_k["measured"], {"decode_tok_s": 5333.3})
        self.assertEqual(before["metrics"], {"weights_read_fraction": 0.57, "prefill_gemm_share": 0.41,
                                             "prefill_tokens": 4096})
        self.assertEqual(after["metrics"]["launches_per_decode_step"], 1.0)
        self.assertEqual(eager["metrics"]["launches_per_decode_step"], 418.0)
        self.assertEqual(after["measured"], {"decode_tok_s": 196.1, "prefill_tok_s": 10240.0})
        self.assertEqual((after["prompt_len"], after["gen_len"], after["model"]), (32, 32, "opt-6.7b"))
        self.assertEqual(f16["metrics"], {"attention_read_fraction": 0.63, "batch": 1, "context": 32768})
        self.assertEqual(q4["metrics"]["attention_read_fraction"], 0.42)
        # In the summary: the figures and metrics of a case (the failed bf16 step has none: no case)
        case = summary_json.case_of(after, "new1234")
        self.assertEqual((case["decode_tok_s"], case["prefill_tok_s"], case["total_tok_s"]), (196.1, 10240.0, None))
        self.assertEqual(case["metrics"]["weights_read_fraction"], 0.736)


class EngineMetricsTest(unittest.TestCase):
    def test_printed_tables(self):
        before, after, q4 = summary_json.printed_cases(LOG, "new1234")
        self.assertEqual((before["name"], before["commit"], after["commit"]), ("c2-all-gpu-8x1", "bf16bec", "new1234"))
        self.assertEqual(before["measured"], {"prefill_tok_s": 30143.57, "decode_tok_s": 430.18, "total_tok_s": 359.35})
        self.assertTrue(before["projected"])
        self.assertFalse(q4["projected"])
        self.assertEqual(summary_json.block_of(q4), (64, 2))
        self.assertEqual(before["links"]["cpu_to_gpu_gbps"], 0.0)
        self.assertEqual(q4["links"]["cpu_to_gpu_gbps"], 57.34)
        self.assertAlmostEqual(before["peak_memory"]["gpu"], 14.66 * 2**30)
        self.assertIn("--out engine/after", after["command"])

    def test_compared_figures(self):
        self.assertEqual(summary_json.resident_steps(LOG), {("opt-6.7b", 8): 0.013291})
        # another model's step at the same batch is kept apart (part kernels runs LLaMA-3-8B too)
        other = LOG + "### bench_generate llama-3-8b batch 8: bench_generate --model dummy:llama-3-8b --batch 8\n" \
            "decode: batch 8, 15 steps, 20.000 ms/step, 400.0 tok/s, weights read at 800.0 GB/s = 22.0% of copy bandwidth\n"
        self.assertEqual(summary_json.resident_steps(other), {("opt-6.7b", 8): 0.013291, ("llama-3-8b", 8): 0.020})
        self.assertEqual(summary_json.bare_cpu_attention(LOG), {(48, 544, 56): 118.2})

    def test_metrics(self):
        resident, bare = {("opt-6.7b", 8): 0.010}, {(48, 544, 56): 100.0}
        gpu_case = {"decode_tok_s": 400.0, "model": "opt-6.7b", "prompt_len": 512, "gen_len": 32}
        line = {"policy": "gpu_batch_size: 8\nnum_gpu_batches: 1\n", "links": {"cpu_to_gpu_gbps": 0.0}}
        m = summary_json.engine_metrics(line, gpu_case, resident, bare)
        self.assertAlmostEqual(m["engine_step_over_resident_step"], 0.020 / 0.010)  # 8 tokens / 400 tok/s
        self.assertNotIn("decode_fraction_of_bound", m)
        # OPT-30B, 48 x 1, 4 decode steps in 4 s; the link busy 2.4 s; CPU attention read 120 GB in 1.5 s
        # (80 GB/s), 1.2 s at the bare 100 GB/s: bound max(0.6, 0.3) s of a 1 s step.
        offload = {"decode_tok_s": 48.0, "model": "opt-30b", "prompt_len": 512, "gen_len": 32}
        line = {"policy": "gpu_batch_size: 48\nnum_gpu_batches: 1\n", "links": {"cpu_to_gpu_gbps": 50.0},
                "cpu_attention": {"seconds": 1.5, "gbps": 80.0},
                "seconds": {"decode": 4.0, "decode_steps": 4, "decode_busy": {"cpu_to_gpu": 2.4}}}
        m = summary_json.engine_metrics(line, offload, resident, bare)
        self.assertAlmostEqual(m["cpu_attention_fraction_of_bare"], 0.8)
        self.assertAlmostEqual(m["decode_link_s_per_step"], 0.6)
        self.assertAlmostEqual(m["decode_cache_at_bare_s_per_step"], 0.3)
        self.assertAlmostEqual(m["decode_fraction_of_bound"], 0.6)
        self.assertNotIn("engine_step_over_resident_step", m)  # it crosses the link
        # another shape than the bare kernel's: no fraction
        self.assertEqual(summary_json.engine_metrics(line, dict(offload, gen_len=64), resident, bare), {})

    def test_moe_metrics(self):
        # strata bench's bytes moved and a mixture of experts' routing become metrics; the
        # cpu_experts phase (a word) does not
        line = {"name": "mixtral-cpu-decode", "measured": {"total_tok_s": 1.0},
                "bytes": {"cpu_to_gpu": 2e9, "gpu_to_cpu": 1e6, "cpu_to_gpu_predicted": 2.2e9},
                "moe": {"cpu_experts": "decode", "cpu_experts_seconds": 3.5, "decode_active_experts": 7.9,
                        "decode_active_experts_expected": 7.96}}
        m = summary_json.case_of(line, "abc")["metrics"]
        self.assertEqual(m["bytes.cpu_to_gpu"], 2e9)
        self.assertEqual(m["bytes.cpu_to_gpu_predicted"], 2.2e9)
        self.assertEqual(m["moe.decode_active_experts"], 7.9)
        self.assertEqual(m["moe.cpu_experts_seconds"], 3.5)
        self.assertNotIn("moe.cpu_experts", m)

    def test_engine_folder_and_log(self):
        after = {"name": "c7", "engine": "strata", "model": "opt-6.7b", "prompt_len": 512, "gen_len": 32,
                 "status": "ok", "commit": "checkout-dirty", "policy": "gpu_batch_size: 48\nnum_gpu_batches: 3\n",
                 "measured": {"prefill_tok_s": 1.0, "decode_tok_s": 2.0, "total_tok_s": 3.0}}
        with tempfile.TemporaryDirectory() as d:
            for side in ("before/c7", "after/c7"):
                os.makedirs(os.path.join(d, "engine", side))
                with open(os.path.join(d, "engine", side, "results.jsonl"), "w") as f:
                    f.write(json.dumps(after) + "\n")
            with open(os.path.join(d, "engine", "before", "commit"), "w") as f:
                f.write("bf16bec\n")
            with open(os.path.join(d, "suite.log"), "w") as f:
                f.write(LOG)
            machine = os.path.join(d, "device-summary.json")
            with open(machine, "w") as f:
                json.dump({"gpu": "NVIDIA H200", "driver": "580", "host": {"cores": 16, "mem_gib": 125.9},
                           "date": "2026-11-27T10:22Z", "commit": "x", "cases": []}, f)
            summary_json.main([d, "--commit", "new1234", "--strata-build", "new1234", "--engine",
                               os.path.join(d, "engine"), "--log", os.path.join(d, "suite.log"),
                               "--machine-from", machine])
            with open(os.path.join(d, "summary.json")) as f:
                doc = json.load(f)
        self.assertEqual((doc["gpu"], doc["host"]["cores"], doc["date"]), ("NVIDIA H200", 16, "2026-11-27T10:22Z"))
        names = [(c["name"], c["commit"]) for c in doc["cases"]]
        self.assertEqual(names, [("c7", "bf16bec"), ("c7", "new1234"), ("c2-all-gpu-8x1", "bf16bec"),
                                 ("c2-all-gpu-8x1", "new1234"), ("c4-4bit", "new1234"),
                                 ("opt-6.7b resident b8", "new1234")])
        c2_after = doc["cases"][3]
        self.assertAlmostEqual(c2_after["metrics"]["engine_step_over_resident_step"], 8 / 452.22 / 0.013291)


if __name__ == "__main__":
    unittest.main()
