#!/usr/bin/env python3
"""Runs FlexGen 0.1.8 (written for torch 1.13/2.0 and transformers 4.2x) on the GPU machine's
torch 2.11 and transformers 5: patches FlexGen's modules in memory, then runs a module's main as
`python -m` would. FlexGen's installed source is never edited.

    python3 bench/peers/flexgen_shim.py -m flexgen.flex_opt ARGS...   # what flexgen_runner.py runs
    python3 bench/peers/flexgen_shim.py --check                       # imports, patches, tokenizer

The changes (bench/peers/README.md names each):
- mem-stats: flexgen.utils.cpu_mem_stats / torch_mem_stats count bytes through
  `Tensor.storage()`, the TypedStorage that torch 2.x deprecates (a warning per tensor) and will
  remove, and fail on a tensor without storage. Replaced by the same count through
  `untyped_storage()`, skipping tensors that have none. Patched in flexgen.utils before
  flexgen.pytorch_backend and flexgen.flex_opt import the names.
- hub-offline: with HF_HOME set (the cache bench/peers/opt_tokenizer_cache.py builds), the hub is
  put offline (HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE) so that transformers reads the cache instead
  of trying a network the GPU machine does not have.
"""
import importlib
import os
import runpy
import sys

PATCHED = []  # names of the changes applied, in order (printed by --check)


def storage_bytes(tensors):
    """FlexGen's count (numel x element size, once per storage, by data pointer) through the
    untyped storage; a tensor without one (meta, sparse, a subclass) is skipped."""
    seen, total = set(), 0
    for t in tensors:
        try:
            ptr = t.untyped_storage().data_ptr()
        except (AttributeError, NotImplementedError, RuntimeError, TypeError):
            continue
        if ptr in seen:
            continue
        seen.add(ptr)
        total += t.numel() * t.element_size()
    return total


def patch_mem_stats(utils, torch):
    """Replaces utils.cpu_mem_stats and utils.torch_mem_stats (flexgen/utils.py)."""
    import gc

    def tensors(on_gpu):
        return (o for o in gc.get_objects() if torch.is_tensor(o) and bool(o.is_cuda) == on_gpu)

    def cpu_mem_stats():
        return storage_bytes(tensors(False))

    def torch_mem_stats():
        return storage_bytes(tensors(True))

    utils.cpu_mem_stats = cpu_mem_stats
    utils.torch_mem_stats = torch_mem_stats
    PATCHED.append("mem-stats")


def set_hub_offline(environ=os.environ):
    """The GPU machine has no network: with a local cache (HF_HOME), never ask the hub."""
    if environ.get("HF_HOME"):
        environ.setdefault("HF_HUB_OFFLINE", "1")
        environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        PATCHED.append("hub-offline")


def apply():
    """Applies every change; must run before flexgen.pytorch_backend is imported."""
    set_hub_offline()
    if "flexgen.pytorch_backend" in sys.modules:
        raise RuntimeError("flexgen.pytorch_backend was imported before the shim patched flexgen.utils")
    import torch
    utils = importlib.import_module("flexgen.utils")
    patch_mem_stats(utils, torch)


def check():
    """What runs without a model: the patched imports, the offline tokenizer as FlexGen calls it
    (flex_opt.py run_flexgen, get_test_inputs), and a pinned allocation when CUDA is there."""
    apply()
    import torch
    import transformers
    flex_opt = importlib.import_module("flexgen.flex_opt")
    tok = transformers.AutoTokenizer.from_pretrained("facebook/opt-30b", padding_side="left")
    ids = flex_opt.get_test_inputs(512, 2, tok)
    assert len(ids) == 2 and len(ids[0]) == 512, "get_test_inputs: wrong shape"
    assert all(0 <= i < 50272 for i in ids[0]), "token ids outside OPT's 50272 embeddings"
    assert ids[0][0] == 1, "left padding must use OPT's pad id 1 (FlexGen's attention mask)"
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, patches: {', '.join(PATCHED)}")
    print(f"tokenizer {type(tok).__name__}: prompt ids {ids[0][-8:]}")
    utils = sys.modules["flexgen.utils"]
    assert sys.modules["flexgen.pytorch_backend"].cpu_mem_stats is utils.cpu_mem_stats, "mem-stats patched too late"
    if torch.cuda.is_available():
        x = torch.empty((1 << 20,), dtype=torch.float16, pin_memory=True)
        print(f"cuda: {torch.cuda.get_device_name(0)}, pinned: {x.is_pinned()}, "
              f"cpu_mem_stats: {utils.cpu_mem_stats()} B")
    return 0


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv == ["--check"]:
        return check()
    if len(argv) < 2 or argv[0] != "-m":
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    module = argv[1]
    apply()
    sys.argv = [module] + argv[2:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
