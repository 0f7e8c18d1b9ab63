#!/usr/bin/env python3
"""Scoring throughput: `strata run` on /v1/completions lines that ask for the prompt's logprobs
(echo, logprobs 1, max_tokens 0: what lm-evaluation-harness and HELM send for log-likelihoods)
beside transformers on the same machine, model and documents, and the achieved FLOP/s beside this
machine's measured float32 GEMM rate.

The model is a random LlamaForCausalLM of embed_bench.py's width (hidden 1024, 16 query heads and
8 key/value heads of 128, MLP 3072; --layers layers) with GPT-2's 50257-token vocabulary and
tokenizer (tests/fixtures/tokenizer/gpt2): a real vocabulary's LM head and log-softmax, which a
scoring job pays per position. Documents are --min-tokens to --max-tokens random token ids, sent as
token ids (no tokenization on either side).

transformers runs float32 on the CPU with every core, in batches of --hf-batch sorted by length and
right-padded: model(ids).logits, log_softmax, the prompt tokens' values gathered. `strata run`
runs with its defaults (continuous batching, prefill steps of 4096 tokens). Each is timed --repeat
times; the fastest counts. Strata's time is its log's prefill seconds (the forward passes and the
scoring; the job's fastest wall time is printed beside), and beside it the same prompts' prefill without
scoring (max_tokens 1, no logprobs): what scoring costs. The documents' summed logprobs of the two are
compared (max |difference|). FLOP/s counts 2 x (the layers' matrix elements + the LM head's) per
position.

    .refenv/bin/python bench/score_bench.py --strata build/strata --dir /tmp/sbench
"""
import argparse
import json
import os
import random
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from embed_bench import gemm_rate, layer_elements, time_strata  # noqa: E402

GPT2 = os.path.join(HERE, "..", "tests", "fixtures", "tokenizer", "gpt2", "tokenizer.json")
VOCAB = 50257
HIDDEN = 1024


def make_model(d, layers):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_attention_heads=16, num_key_value_heads=8,
                      head_dim=128, intermediate_size=3072, num_hidden_layers=layers, max_position_embeddings=8192,
                      rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=50256, eos_token_id=50256)
    LlamaForCausalLM(cfg).save_pretrained(d)
    shutil.copy(GPT2, os.path.join(d, "tokenizer.json"))


def strata_scores(path):
    out = {}
    for line in open(path):
        r = json.loads(line)
        lps = r["response"]["body"]["choices"][0]["logprobs"]["token_logprobs"]
        out[r["custom_id"]] = sum(v for v in lps if v is not None)
    return out


def prefill_seconds(lines):
    """The job log's "prefill: S s" seconds."""
    return [float(line.split(": ")[1].split(" s")[0]) for line in lines if line.startswith("prefill: ")]


def hf_scores(model, docs, batch):
    import torch
    out, order = {}, sorted(range(len(docs)), key=lambda i: len(docs[i]))
    with torch.no_grad():
        for b in range(0, len(order), batch):
            idx = order[b:b + batch]
            n = max(len(docs[i]) for i in idx)
            ids = torch.zeros(len(idx), n, dtype=torch.long)
            mask = torch.zeros(len(idx), n, dtype=torch.long)
            for r, i in enumerate(idx):
                ids[r, :len(docs[i])] = torch.tensor(docs[i])
                mask[r, :len(docs[i])] = 1
            lp = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float(), dim=-1)
            got = lp[:, :-1].gather(2, ids[:, 1:, None])[..., 0] * mask[:, 1:]
            for r, i in enumerate(idx):
                out[f"d{i}"] = float(got[r].sum())
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--docs", type=int, default=128)
    ap.add_argument("--min-tokens", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--hf-batch", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM
    os.makedirs(a.dir, exist_ok=True)
    model = os.path.join(a.dir, f"llama-gpt2-vocab-{a.layers}l")
    if not os.path.exists(os.path.join(model, "config.json")):
        make_model(model, a.layers)
    rng = random.Random(1)
    docs = [[rng.randrange(VOCAB - 1) for _ in range(rng.randint(a.min_tokens, a.max_tokens))] for _ in range(a.docs)]
    positions = sum(len(d) - 1 for d in docs)
    src, out = os.path.join(a.dir, "score.jsonl"), os.path.join(a.dir, "score.out.jsonl")
    with open(src, "w") as f:
        for i, d in enumerate(docs):
            f.write(json.dumps({"custom_id": f"d{i}", "method": "POST", "url": "/v1/completions",
                                "body": {"prompt": d, "echo": True, "logprobs": 1, "max_tokens": 0}}) + "\n")
    cmd = [a.strata, "run", "--model", model, "--prompts", src, "--out", out, "--device", "cpu", "--no-progress"]
    strata_wall, strata_s = time_strata(cmd, out, a.repeat, prefill_seconds)
    got = strata_scores(out)
    # The same prefill without scoring (one token drawn, no logprobs): what scoring adds.
    plain_src = os.path.join(a.dir, "plain.jsonl")
    with open(plain_src, "w") as f:
        for i, d in enumerate(docs):
            f.write(json.dumps({"custom_id": f"d{i}", "method": "POST", "url": "/v1/completions",
                                "body": {"prompt": d, "max_tokens": 1}}) + "\n")
    _, plain_s = time_strata([plain_src if x == src else x for x in cmd], out, a.repeat, prefill_seconds)

    torch.set_num_threads(os.cpu_count())
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    hf_s = 1e9
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        want = hf_scores(hf, docs, a.hf_batch)
        hf_s = min(hf_s, time.perf_counter() - t0)
    diff = max(abs(got[k] - want[k]) for k in want)
    rate = gemm_rate()
    flops = 2 * (layer_elements(a.layers) + HIDDEN * VOCAB) * positions
    print(json.dumps({
        "docs": a.docs, "positions": positions, "layers": a.layers, "vocab": VOCAB, "threads": os.cpu_count(),
        "strata_prefill_s": round(strata_s, 3), "strata_wall_s": round(strata_wall, 3),
        "strata_positions_per_s": round(positions / strata_s, 1), "strata_unscored_prefill_s": round(plain_s, 3),
        "transformers_s": round(hf_s, 3), "transformers_positions_per_s": round(positions / hf_s, 1),
        "speedup": round(hf_s / strata_s, 2),
        "strata_gflops": round(flops / strata_s / 1e9, 1), "transformers_gflops": round(flops / hf_s / 1e9, 1),
        "gemm_gflops": round(rate / 1e9, 1), "max_abs_sum_diff": diff,
        "command": " ".join(cmd)}, indent=1))


if __name__ == "__main__":
    main()
