#!/usr/bin/env python3
"""Writes a llama-shaped GGUF file of random weights in llama.cpp's Q4_K_M mix (Q4_K matrices, Q6_K
for attn_v, ffn_down and the output; F32 norms), or one ggml type throughout, for timing how fast
Strata loads such files (bench_load). The values are random block bytes with a small valid fp16
scale, not a model: nothing is evaluated on them.

  pip install gguf numpy    (bench/requirements.txt)
  python3 bench/make_synthetic_gguf.py OUT.gguf [--hidden 2048] [--layers 16] [--ffn 5632]
                                       [--heads 32] [--kv-heads 4] [--vocab 32000] [--type q4_k_m|q8_0|q4_0|f16]
"""
import argparse

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

# (block elements, block bytes, byte offsets of the fp16 scales in a block)
BLOCKS = {
    T.Q4_K: (256, 144, [0, 2]),
    T.Q6_K: (256, 210, [208]),
    T.Q8_0: (32, 34, [0]),
    T.Q4_0: (32, 18, [0]),
}


def random_blocks(rng, rows, cols, qtype):
    elems, nbytes, scale_offsets = BLOCKS[qtype]
    assert cols % elems == 0, f"{cols} is not a multiple of {elems}"
    blocks = rng.integers(0, 256, size=(rows, cols // elems, nbytes), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.01).tobytes(), dtype=np.uint8)
    for off in scale_offsets:
        blocks[:, :, off:off + 2] = scale
    return blocks.reshape(rows, (cols // elems) * nbytes)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--ffn", type=int, default=5632)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--type", default="q4_k_m", choices=["q4_k_m", "q8_0", "q4_0", "f16"])
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    head_dim = a.hidden // a.heads
    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name("synthetic")
    w.add_context_length(4096)
    w.add_embedding_length(a.hidden)
    w.add_block_count(a.layers)
    w.add_feed_forward_length(a.ffn)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.kv_heads)
    w.add_layer_norm_rms_eps(1e-5)

    def matrix(name, rows, cols, heavy=False):
        if a.type == "f16":
            w.add_tensor(name, (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16))
            return
        qtype = {"q4_k_m": T.Q6_K if heavy else T.Q4_K, "q8_0": T.Q8_0, "q4_0": T.Q4_0}[a.type]
        w.add_tensor(name, random_blocks(rng, rows, cols, qtype), raw_dtype=qtype)

    def norm(name):
        w.add_tensor(name, np.ones(a.hidden, dtype=np.float32))

    matrix("token_embd.weight", a.vocab, a.hidden)
    for i in range(a.layers):
        b = f"blk.{i}."
        norm(b + "attn_norm.weight")
        matrix(b + "attn_q.weight", a.hidden, a.hidden)
        matrix(b + "attn_k.weight", a.kv_heads * head_dim, a.hidden)
        matrix(b + "attn_v.weight", a.kv_heads * head_dim, a.hidden, heavy=True)
        matrix(b + "attn_output.weight", a.hidden, a.hidden)
        norm(b + "ffn_norm.weight")
        matrix(b + "ffn_gate.weight", a.ffn, a.hidden)
        matrix(b + "ffn_up.weight", a.ffn, a.hidden)
        matrix(b + "ffn_down.weight", a.hidden, a.ffn, heavy=True)
    norm("output_norm.weight")
    matrix("output.weight", a.vocab, a.hidden, heavy=True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
