#!/usr/bin/env python3
"""GPTQ and AWQ checkpoints of a real model, through Strata and through transformers.

SmolLM2-135M-Instruct (the default model's GGUF, dequantized by transformers and saved in fp16)
is quantized by GPTQModel with GPTQ (4-bit, group 64, desc_act false) and AWQ (4-bit, group 64,
GEMM) on CPU, calibrated on tests/fixtures/perplexity/sample.txt. Then the perplexity of
tests/fixtures/perplexity/long.txt (windows of 512, as `strata perplexity`) is computed

- by transformers, on an fp32 model whose linears are the library's own dequantization of the
  checkpoint ("exact") and the same with each group's minimum rounded to fp16 ("fp16 minimum":
  what Strata computes when a compressed policy keeps the codes);
- by `strata perplexity` on the checkpoint directory: uncompressed (dequantized at load), and
  through the offloading engine with compress_weights {bits: 4, group_size: 64} (codes kept).

Prints a markdown table.
    GPTQMODEL_CPU_WORKERS=2 .refenv/bin/python bench/packed_checkpoints.py [STRATA] [OUT_DIR]
"""
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests/fixtures/models"))
sys.path.insert(0, str(ROOT / "tests/fixtures/perplexity"))

import torch  # noqa: E402
from gptqmodel import GPTQModel, QuantizeConfig  # noqa: E402
from gptqmodel.quantization import FORMAT, METHOD  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from make_packed_fixtures import awq_parts, codes_weight, gptq_parts  # noqa: E402
from make_perplexity import default_smollm2, read_text, score  # noqa: E402

CONTEXT = 512
TEXT = ROOT / "tests/fixtures/perplexity/long.txt"
CALIBRATION = ROOT / "tests/fixtures/perplexity/sample.txt"
VARIANTS = [
    ("GPTQ 4-bit g64", dict(bits=4, group_size=64, sym=False, desc_act=False)),
    ("AWQ 4-bit g64", dict(bits=4, group_size=64, sym=False, quant_method=METHOD.AWQ, format=FORMAT.GEMM)),
]
POLICY = """gpu_batch_size: 7
num_gpu_batches: 2
weights: {gpu: 100, cpu: 0, disk: 0}
kv_cache: {gpu: 100, cpu: 0, disk: 0}
activations: {gpu: 100, cpu: 0, disk: 0}
compress_weights: {bits: 4, group_size: 64}
"""


def fp_model_dir(tmp):
    gguf = Path(default_smollm2())
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float16)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # A plain copy: transformers marks a model read from GGUF as quantized and will not save it.
    config = loaded.config
    config.quantization_config = None
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = type(loaded)(config).half()
    model.load_state_dict(loaded.state_dict())
    d = os.path.join(tmp, "fp")
    model.save_pretrained(d, safe_serialization=True)
    tok.save_pretrained(d)
    return d, tok


def quantize(fp_dir, out_dir, tok, qargs):
    ids = tok(read_text(CALIBRATION), add_special_tokens=False)["input_ids"]
    calib = [{"input_ids": torch.tensor([ids[i:i + 256]]), "attention_mask": torch.ones(1, 256, dtype=torch.long)}
             for i in range(0, max(1, len(ids) - 256), 128)][:32]
    cwd = os.getcwd()
    os.chdir(os.path.dirname(fp_dir))  # GPTQModel writes a logs/ folder where it runs
    try:
        model = GPTQModel.load(fp_dir, QuantizeConfig(**qargs), device="cpu")
        model.quantize(calib)
        model.save(out_dir)
    finally:
        os.chdir(cwd)


def hf_perplexity(fp_dir, q_dir, weights, ids):
    """transformers' perplexity with the given linear weights and the checkpoint's other tensors."""
    model = AutoModelForCausalLM.from_pretrained(fp_dir, dtype=torch.float32).eval()
    sd = load_file(os.path.join(q_dir, "model.safetensors"))
    state = {k: v.float() for k, v in sd.items() if k.rsplit(".", 1)[-1] not in ("qweight", "qzeros", "scales", "g_idx")}
    state.update({name + ".weight": w for name, w in weights.items()})
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all(k == "lm_head.weight" for k in missing), (missing, unexpected)
    total, count, _ = score(model, ids, CONTEXT)
    return math.exp(total / count), count


def strata_perplexity(strata, q_dir, policy=None):
    cmd = [strata, "perplexity", "--model", q_dir, "--text", str(TEXT), "--context", str(CONTEXT), "--json",
           "--no-progress"]
    if policy:
        cmd += ["--policy", policy]
    out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return out["perplexity"], out["tokens"]


def main():
    strata = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "build/strata")
    out_root = sys.argv[2] if len(sys.argv) > 2 else None
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        fp_dir, tok = fp_model_dir(tmp)
        ids = tok(read_text(TEXT), add_special_tokens=False)["input_ids"]
        policy = os.path.join(tmp, "policy.yaml")
        Path(policy).write_text(POLICY)
        fp_ppl, n = hf_perplexity(fp_dir, fp_dir, {}, ids)
        rows.append(("fp16 (the GGUF, dequantized)", f"{fp_ppl:.4f}", "", "", ""))
        for label, qargs in VARIANTS:
            q_dir = os.path.join(out_root or tmp, label.split()[0].lower())
            quantize(fp_dir, q_dir, tok, qargs)
            awq = qargs.get("quant_method") == METHOD.AWQ
            parts = awq_parts(q_dir, qargs["group_size"]) if awq else gptq_parts(q_dir)
            exact, _ = hf_perplexity(fp_dir, q_dir, {k: p["weight"] for k, p in parts.items()}, ids)
            rounded, _ = hf_perplexity(fp_dir, q_dir, {k: codes_weight(p) for k, p in parts.items()}, ids)
            plain, tokens = strata_perplexity(strata, q_dir)
            kept, _ = strata_perplexity(strata, q_dir, policy)
            assert tokens == n, (tokens, n)
            rows.append((label, f"{exact:.4f}", f"{plain:.4f}", f"{rounded:.4f}", f"{kept:.4f}"))
    print(f"SmolLM2-135M-Instruct, {TEXT.name}, windows of {CONTEXT}, {n} predictions\n")
    print("| checkpoint | transformers, exact | strata, dequantized at load | transformers, fp16 minimum |"
          " strata, codes kept ({4, 64} policy) |")
    print("|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
