#!/usr/bin/env python3
"""Writes a random LoRA adapter in PEFT's layout (adapter_config.json, adapter_model.safetensors)
for timing --lora's merge at load (bench_load --lora, strata run --lora): every attention and MLP
projection of every layer, rank --r, float32 values. Not a trained adapter: the outputs it gives
mean nothing. Standard library only.

    python3 bench/make_lora_adapter.py OUT_DIR [--preset smollm2-135m] [--r 16] [--alpha 32]
"""
import argparse
import array
import json
import os
import random
import struct

PRESETS = {  # hidden, intermediate, layers, attention heads, kv heads, head dim
    "smollm2-135m": (576, 1536, 30, 9, 3, 64),
    "llama-3-8b": (4096, 14336, 32, 32, 8, 128),
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--preset", default="smollm2-135m", choices=sorted(PRESETS))
    p.add_argument("--r", type=int, default=16)
    p.add_argument("--alpha", type=float, default=32)
    a = p.parse_args()
    hidden, inter, layers, heads, kv_heads, head_dim = PRESETS[a.preset]
    q, kv = heads * head_dim, kv_heads * head_dim
    shapes = {"self_attn.q_proj": (q, hidden), "self_attn.k_proj": (kv, hidden), "self_attn.v_proj": (kv, hidden),
              "self_attn.o_proj": (hidden, q), "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden),
              "mlp.down_proj": (hidden, inter)}
    rng = random.Random(1)
    tensors = {}
    for layer in range(layers):
        for module, (out_dim, in_dim) in shapes.items():
            key = f"base_model.model.model.layers.{layer}.{module}"
            tensors[key + ".lora_A.weight"] = ((a.r, in_dim), in_dim ** -0.5)
            tensors[key + ".lora_B.weight"] = ((out_dim, a.r), 0.01)
    header, offset = {}, 0
    for name, ((rows, cols), _) in sorted(tensors.items()):
        header[name] = {"dtype": "F32", "shape": [rows, cols], "data_offsets": [offset, offset + 4 * rows * cols]}
        offset += 4 * rows * cols
    os.makedirs(a.out, exist_ok=True)
    text = json.dumps(header).encode()
    with open(os.path.join(a.out, "adapter_model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name, ((rows, cols), std) in sorted(tensors.items()):
            f.write(array.array("f", (rng.gauss(0, std) for _ in range(rows * cols))).tobytes())
    config = {"peft_type": "LORA", "r": a.r, "lora_alpha": a.alpha, "target_modules": sorted(m.split(".")[1] for m in shapes),
              "bias": "none", "use_rslora": False, "base_model_name_or_path": a.preset}
    with open(os.path.join(a.out, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    print(f"{a.out}: {len(tensors) // 2} adapted matrices, rank {a.r}, {offset / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
