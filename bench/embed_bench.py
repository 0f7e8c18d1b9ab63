#!/usr/bin/env python3
"""Embeddings throughput: `strata run` on /v1/embeddings lines beside sentence-transformers on the
same machine, model and texts, and the achieved FLOP/s beside this machine's measured float32
GEMM rate.

The model is a random Qwen3-Embedding-shaped decoder (Qwen3-Embedding-0.6B's width: hidden 1024,
16 query heads and 8 key/value heads of 128, MLP 3072; --layers of its 28; the tiny fixture's
1000-token vocabulary, so the embedding table does not dominate the file), saved as
sentence-transformers saves Qwen3-Embedding (last-token pooling, Normalize, EOS appended). Texts
are random words of the tokenizer's vocabulary, --min-words to --max-words long.

Both engines run float32 on the CPU with every core: sentence-transformers' encode (batch
--st-batch, sorted by length as it sorts) and `strata run` (its default step budget of 4096
tokens). Each is timed --repeat times; the fastest counts. The vectors of the two are compared
(max |difference|). FLOP/s counts 2 x the layers' matrix elements per token (attention scores
left out: they are small at these lengths).

    .refenv/bin/python bench/embed_bench.py --strata build/strata --dir /tmp/ebench
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "..", "tests", "fixtures", "embeddings", "tiny-qwen3-embedding")


def make_model(d, layers):
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3Model

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=1000, hidden_size=1024, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                      intermediate_size=3072, num_hidden_layers=layers, max_position_embeddings=8192,
                      rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, rms_norm_eps=1e-6,
                      tie_word_embeddings=False, eos_token_id=0, pad_token_id=0)
    raw = d + "-raw"
    Qwen3Model(cfg).save_pretrained(raw)
    # model_max_length as Qwen3-Embedding's: sentence-transformers would cut longer texts.
    PreTrainedTokenizerFast.from_pretrained(FIXTURE, model_max_length=8192).save_pretrained(raw)
    st = Transformer(raw, max_seq_length=8192)
    SentenceTransformer(modules=[st, Pooling(1024, pooling_mode="lasttoken"), Normalize()], device="cpu").save(d)
    shutil.rmtree(raw)


def layer_elements(layers):
    h, q, kv, f = 1024, 16 * 128, 8 * 128, 3072
    return layers * (h * q + 2 * h * kv + q * h + 3 * h * f)


def gemm_rate():
    """float32 GEMM FLOP/s of this machine through torch (all cores), 2048^3, the best of 5."""
    import torch
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    best = 0.0
    for _ in range(5):
        t = time.perf_counter()
        a @ b
        best = max(best, 2 * 2048 ** 3 / (time.perf_counter() - t))
    return best


def vocab_words(fixture):
    """The alphabetic tokens of a tiny fixture's vocabulary: the words random texts are made of."""
    return [w for w in json.load(open(os.path.join(fixture, "tokenizer.json")))["model"]["vocab"] if w.isalpha()]


def time_strata(cmd, out, repeat, summary):
    """Runs `strata run` `repeat` times (removing `out` before each); returns the fastest wall
    seconds and the fastest seconds the log reports: `summary` is the "SUMMARY: N inputs, T tokens
    in S s" line's name, or a function from the log's lines to the seconds they report."""
    if isinstance(summary, str):
        name = summary
        summary = lambda lines: [float(line.split(" in ")[1].split(" s")[0]) for line in lines  # noqa: E731
                                 if line.startswith(name + ":") and " inputs, " in line]
    best_wall, best_own = 1e9, 1e9
    for _ in range(repeat):
        if os.path.exists(out):
            os.remove(out)
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if r.returncode != 0:
            sys.exit(r.stderr)
        best_wall = min(best_wall, wall)
        best_own = min([best_own] + summary(r.stderr.splitlines()))
    return best_wall, best_own


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--texts", type=int, default=256)
    ap.add_argument("--min-words", type=int, default=16)
    ap.add_argument("--max-words", type=int, default=200)
    ap.add_argument("--st-batch", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()

    import torch
    from sentence_transformers import SentenceTransformer
    os.makedirs(a.dir, exist_ok=True)
    model = os.path.join(a.dir, f"qwen3-embedding-shaped-{a.layers}l")
    if not os.path.exists(os.path.join(model, "modules.json")):
        make_model(model, a.layers)
    rng = random.Random(1)
    words = vocab_words(FIXTURE)
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(a.min_words, a.max_words))) for _ in range(a.texts)]
    src = os.path.join(a.dir, "embed.jsonl")
    with open(src, "w") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({"custom_id": f"t{i}", "method": "POST", "url": "/v1/embeddings",
                                "body": {"model": "m", "input": t}}) + "\n")

    st = SentenceTransformer(model, device="cpu")
    assert st.max_seq_length >= 8192, st.max_seq_length  # no text cut
    tokens = sum(len(st.tokenizer(t)["input_ids"]) for t in texts)
    st_best, st_vectors = 1e9, None
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        st_vectors = st.encode(texts, batch_size=a.st_batch, convert_to_numpy=True)
        st_best = min(st_best, time.perf_counter() - t0)

    out = os.path.join(a.dir, "embed_out.jsonl")
    cmd = [a.strata, "run", "--model", model, "--prompts", src, "--out", out, "--no-progress"]
    strata_best, embed_s = time_strata(cmd, out, a.repeat, "embeddings")
    got = {}
    for line in open(out):
        j = json.loads(line)
        got[j["custom_id"]] = j["response"]["body"]["data"][0]["embedding"]
    diff = max(abs(x - y) for i in range(len(texts)) for x, y in zip(got[f"t{i}"], st_vectors[i]))

    flop = 2.0 * layer_elements(a.layers) * tokens
    peak = gemm_rate()
    print(f"| engine | seconds | tok/s | GFLOP/s | share of the GEMM rate ({peak / 1e9:.1f} GFLOP/s) |")
    print("|---|---|---|---|---|")
    print(f"| sentence-transformers {__import__('sentence_transformers').__version__} (torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, batch {a.st_batch}) | {st_best:.2f} | {tokens / st_best:.0f} | "
          f"{flop / st_best / 1e9:.1f} | {flop / st_best / peak:.2f} |")
    print(f"| strata run (wall, with the model load) | {strata_best:.2f} | {tokens / strata_best:.0f} | "
          f"{flop / strata_best / 1e9:.1f} | {flop / strata_best / peak:.2f} |")
    print(f"| strata run (its embedding time) | {embed_s:.2f} | {tokens / embed_s:.0f} | {flop / embed_s / 1e9:.1f} | "
          f"{flop / embed_s / peak:.2f} |")
    print(f"\n{len(texts)} texts, {tokens} tokens; max |strata - sentence-transformers| = {diff:.2e}")
    print("command: " + " ".join(cmd))


if __name__ == "__main__":
    main()
