"""Tests of what makes FlexGen run offline on the GPU machine, without network, torch or FlexGen:
the wheel download command (prepare_offline.py), the OPT tokenizer cache (opt_tokenizer_cache.py;
loaded through transformers when it is installed), the shims (flexgen_shim.py, on a stand-in
flexgen package) and the runner's command and environment. python3 -m unittest discover bench/peers"""
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest
import zipfile

import common
import flexgen_runner
import flexgen_shim
import opt_tokenizer_cache
import prepare_offline

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))


class WheelsTest(unittest.TestCase):
    def test_download_command(self):
        cmd = prepare_offline.download_command("/x/.whl", ["flexgen==0.1.8"], python="py")
        self.assertEqual(cmd[:4], ["py", "-m", "pip", "download"])
        for flag in ("--no-deps", "--only-binary=:all:"):
            self.assertIn(flag, cmd)
        args = " ".join(cmd)
        self.assertIn("--python-version 3.12 --implementation cp", args)
        self.assertIn("--platform manylinux_2_28_x86_64", args)
        self.assertIn("--platform manylinux2014_x86_64", args)
        self.assertEqual(cmd[-3:], ["-d", "/x/.whl", "flexgen==0.1.8"])

    def test_only_what_the_gpu_machine_lacks(self):
        # torch, transformers, numpy, tqdm, attrs are there; pulp is not imported by flex_opt.
        self.assertEqual(prepare_offline.WHEELS, ["flexgen==0.1.8"])
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            self.assertEqual(prepare_offline.main(["--dry-run", "--dest", "/tmp/w", "--extra", "pulp==2.9.0"]), 0)
        self.assertTrue(printed.getvalue().rstrip().endswith("-d /tmp/w flexgen==0.1.8 pulp==2.9.0"))

    def test_folder_is_git_ignored_once(self):
        with tempfile.TemporaryDirectory() as repo:
            os.makedirs(os.path.join(repo, ".git", "info"))
            self.assertEqual(prepare_offline.ignore_in_git(os.path.join(repo, ".whl"), repo), "/.whl/")
            prepare_offline.ignore_in_git(os.path.join(repo, ".whl"), repo)
            with open(os.path.join(repo, ".git", "info", "exclude")) as f:
                self.assertEqual(f.read(), "/.whl/\n")
            self.assertIsNone(prepare_offline.ignore_in_git("/elsewhere/w", repo))


class TokenizerCacheTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        cls.snaps = opt_tokenizer_cache.build(cls.dir.name)

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def test_hub_layout(self):
        for model in ("facebook/opt-30b", "facebook/opt-6.7b"):
            repo = os.path.join(self.dir.name, "hub", "models--" + model.replace("/", "--"))
            with open(os.path.join(repo, "refs", "main")) as f:
                rev = f.read()
            snap = os.path.join(repo, "snapshots", rev)
            self.assertIn(snap, self.snaps)
            for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json"):
                self.assertTrue(os.path.isfile(os.path.join(snap, name)), name)
                self.assertFalse(os.path.islink(os.path.join(snap, name)), name)

    def test_ids_are_opts(self):
        snap = self.snaps[0]
        with open(os.path.join(snap, "tokenizer.json")) as f:
            tok = json.load(f)
        vocab = tok["model"]["vocab"]
        self.assertEqual([vocab[s] for s in ("<s>", "<pad>", "</s>", "<unk>")], [0, 1, 2, 3])
        self.assertEqual(len(set(vocab.values())), len(vocab))
        self.assertLess(max(vocab.values()), 50272)
        with open(opt_tokenizer_cache.GPT2_TOKENIZER) as f:
            gpt2 = json.load(f)
        self.assertEqual(vocab["Paris"], gpt2["model"]["vocab"]["Paris"] + 4)
        self.assertEqual(tok["model"]["merges"], gpt2["model"]["merges"])
        with open(os.path.join(snap, "config.json")) as f:
            self.assertEqual(json.load(f)["pad_token_id"], 1)

    def test_loads_offline_in_transformers(self):
        try:
            import transformers  # noqa: F401
        except ImportError:
            self.skipTest("transformers is not installed here")
        # A child process: HF_HOME is read when huggingface_hub is imported.
        code = textwrap.dedent("""
            import json, transformers
            tok = transformers.AutoTokenizer.from_pretrained("facebook/opt-30b", padding_side="left")
            ids = tok(["Paris is the capital city of"], padding="max_length", max_length=16).input_ids[0]
            print(json.dumps(ids))
        """)
        env = dict(os.environ, HF_HOME=self.dir.name, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        ids = json.loads(out.stdout.strip().splitlines()[-1])
        self.assertEqual(len(ids), 16)
        self.assertEqual(ids[:9], [1] * 9)  # left padding with OPT's pad id
        self.assertEqual(ids[9], 2)  # </s> opens the text, as OPT's tokenizer does
        self.assertTrue(all(0 <= i < 50272 for i in ids))


# A stand-in for FlexGen 0.1.8's module structure: pytorch_backend and flex_opt import
# cpu_mem_stats by name from utils, as the real ones do.
FAKE_FLEXGEN = {
    "torch/__init__.py": "def is_tensor(o):\n    return hasattr(o, 'untyped_storage')\n__version__ = 'fake'\n",
    "flexgen/__init__.py": "",
    "flexgen/utils.py": "def cpu_mem_stats():\n    raise RuntimeError('unpatched')\n"
                        "def torch_mem_stats():\n    raise RuntimeError('unpatched')\n",
    "flexgen/pytorch_backend.py": "from flexgen.utils import cpu_mem_stats\n",
    "flexgen/flex_opt.py": textwrap.dedent("""
        import sys
        from flexgen.pytorch_backend import cpu_mem_stats
        from flexgen.utils import torch_mem_stats
        if __name__ == "__main__":
            print("main", sys.argv[1:], cpu_mem_stats(), torch_mem_stats())
    """),
}


class FakeTensor:
    def __init__(self, ptr, numel, size=2, cuda=False):
        self.ptr, self.n, self.size, self.is_cuda = ptr, numel, size, cuda

    def untyped_storage(self):
        if self.ptr is None:
            raise NotImplementedError("no storage")
        return type("S", (), {"data_ptr": lambda s: self.ptr})()

    def numel(self):
        return self.n

    def element_size(self):
        return self.size


class ShimTest(unittest.TestCase):
    def test_storage_bytes_counts_each_storage_once(self):
        ts = [FakeTensor(1, 10), FakeTensor(1, 4), FakeTensor(2, 3, size=4), FakeTensor(None, 100)]
        self.assertEqual(flexgen_shim.storage_bytes(ts), 10 * 2 + 3 * 4)

    def test_hub_offline_only_with_a_cache(self):
        env = {}
        flexgen_shim.set_hub_offline(env)
        self.assertEqual(env, {})
        env = {"HF_HOME": "/c", "HF_HUB_OFFLINE": "0"}
        flexgen_shim.set_hub_offline(env)
        self.assertEqual(env, {"HF_HOME": "/c", "HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "1"})

    def test_launcher_patches_before_flexgen_imports_the_names(self):
        with tempfile.TemporaryDirectory() as d:
            for name, text in FAKE_FLEXGEN.items():
                os.makedirs(os.path.join(d, os.path.dirname(name)), exist_ok=True)
                with open(os.path.join(d, name), "w") as f:
                    f.write(text)
            env = dict(os.environ, PYTHONPATH=d)
            env.pop("HF_HOME", None)
            out = subprocess.run([sys.executable, flexgen_shim.__file__, "-m", "flexgen.flex_opt", "--model", "m"],
                                 env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.strip(), "main ['--model', 'm'] 0 0")

    def test_usage(self):
        with contextlib.redirect_stderr(io.StringIO()):
            self.assertEqual(flexgen_shim.main(["flexgen.flex_opt"]), 2)

    def test_patch_targets_exist_in_the_wheel(self):
        # Where prepare_offline.py has fetched the wheel (REPO/.whl), its source has what the
        # shim replaces, imported by name where the shim expects.
        wheel = os.path.join(REPO, ".whl", "flexgen-0.1.8-py3-none-any.whl")
        if not os.path.exists(wheel):
            self.skipTest("no .whl/flexgen-0.1.8-py3-none-any.whl (bench/peers/prepare_offline.py fetches it)")
        with zipfile.ZipFile(wheel) as z:
            utils = z.read("flexgen/utils.py").decode()
            backend = z.read("flexgen/pytorch_backend.py").decode()
            flex_opt = z.read("flexgen/flex_opt.py").decode()
        self.assertIn("def cpu_mem_stats():", utils)
        self.assertIn("def torch_mem_stats():", utils)
        self.assertIn("tensor.storage()", utils)
        self.assertIn("from flexgen.utils import (GB, T, cpu_mem_stats", backend)
        self.assertIn("torch_mem_stats", flex_opt)
        self.assertIn('AutoTokenizer.from_pretrained("facebook/opt-30b", padding_side="left")', flex_opt)
        self.assertIn("def get_test_inputs(prompt_len, num_prompts, tokenizer):", flex_opt)


class RunnerOfflineTest(unittest.TestCase):
    def test_child_env(self):
        env = flexgen_runner.child_env("rel/hf", {"PATH": "/bin"})
        self.assertEqual(env["HF_HOME"], os.path.abspath("rel/hf"))
        self.assertEqual((env["HF_HUB_OFFLINE"], env["TRANSFORMERS_OFFLINE"], env["PATH"]), ("1", "1", "/bin"))
        self.assertEqual(flexgen_runner.child_env(None, {"PATH": "/bin"}), {"PATH": "/bin"})

    def test_dry_run_goes_through_the_shim(self):
        policy = os.path.join(REPO, "bench", "suites", "smoke", "all-gpu-8x1.yaml")
        base = ["--model", "opt-6.7b", "--prompt-len", "512", "--gen-len", "32", "--policy", policy, "--dry-run",
                "--python", "py", "--offload-dir", "/tmp/o", "--hf-home", "/tmp/hf"]
        for extra, head in (([], f"py {flexgen_runner.SHIM} -m flexgen.flex_opt --model facebook/opt-6.7b"),
                            (["--no-shim"], "py -m flexgen.flex_opt --model facebook/opt-6.7b")):
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                self.assertEqual(flexgen_runner.main(base + extra), 0)
            self.assertTrue(printed.getvalue().startswith(head), printed.getvalue())

    def test_failed_peer_leaves_its_last_line(self):
        # A python that is not FlexGen: the line says failed, with the last error line.
        with tempfile.TemporaryDirectory() as d:
            fake = os.path.join(d, "py")
            with open(fake, "w") as f:
                f.write("#!/bin/sh\necho 'Traceback ...' >&2\necho 'ModuleNotFoundError: no flexgen' >&2\nexit 1\n")
            os.chmod(fake, 0o755)
            policy = os.path.join(REPO, "bench", "suites", "smoke", "all-gpu-8x1.yaml")
            with contextlib.redirect_stderr(io.StringIO()):
                flexgen_runner.main(["--model", "opt-125m", "--prompt-len", "8", "--gen-len", "2", "--policy", policy,
                                     "--python", fake, "--out", d, "--offload-dir", d, "--hf-home", d])
            with open(os.path.join(d, "peers.jsonl")) as f:
                row = json.loads(f.readline())
        self.assertEqual(row["status"], "failed: ModuleNotFoundError: no flexgen")
        self.assertIn("offline stand-in", row["tokenizer"])
        self.assertEqual(row["engine"], "flexgen")
        self.assertIsInstance(common.parse_size("16GiB"), int)


if __name__ == "__main__":
    unittest.main()
