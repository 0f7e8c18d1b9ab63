#!/usr/bin/env python3
"""Classification throughput: `strata run` on /v1/classify lines (a reward model scoring
conversations) beside transformers' AutoModelForSequenceClassification on the same machine, model
and conversations, and the achieved FLOP/s beside this machine's measured float32 GEMM rate.

The model is a random one-label LlamaForSequenceClassification (a reward model's head, as
Skywork-Reward) of embed_bench.py's width (hidden 1024, 16 query heads and 8 key/value heads of
128, MLP 3072; --layers layers; the tiny fixture's 1000-token vocabulary and chat template).
Conversations are a user turn and an assistant turn of random words, --min-words to --max-words
each, scored as apply_chat_template(tokenize=True) tokenizes them.

--rerank scores (query, document) pairs with the same model read as a cross-encoder instead:
/v1/rerank lines, and transformers on tokenizer(query, text_pair=document) (the fixture's pair
template "<s> A <s> B"), compared by each pair's logit.

Both engines run float32 on the CPU with every core: transformers in batches of --hf-batch,
sorted by length and right-padded (the classifier pools the last non-pad token), and `strata run`
(its default step budget of 4096 tokens). Each is timed --repeat times; the fastest counts. The
rewards (logits) of the two are compared (max |difference|). FLOP/s counts 2 x the layers' matrix
elements per token (embed_bench.layer_elements).

    .refenv/bin/python bench/classify_bench.py --strata build/strata --dir /tmp/cbench
"""
import argparse
import json
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from embed_bench import gemm_rate, layer_elements, time_strata, vocab_words  # noqa: E402

FIXTURE = os.path.join(HERE, "..", "tests", "fixtures", "classify", "tiny-llama-reward")


def make_model(d, layers):
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(FIXTURE)
    cfg = LlamaConfig(vocab_size=1000, hidden_size=1024, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                      intermediate_size=3072, num_hidden_layers=layers, max_position_embeddings=8192,
                      rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, num_labels=1,
                      architectures=["LlamaForSequenceClassification"])
    LlamaForSequenceClassification(cfg).save_pretrained(d)
    tok.save_pretrained(d)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--conversations", type=int, default=256)
    ap.add_argument("--min-words", type=int, default=8)
    ap.add_argument("--max-words", type=int, default=100)
    ap.add_argument("--hf-batch", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rerank", action="store_true",
                    help="rerank instead: --queries queries of 8-20 words, each against --documents documents of "
                         "--min-words to --max-words words (/v1/rerank lines; transformers reads tokenizer(query, "
                         "document), the fixture's pair template)")
    ap.add_argument("--queries", type=int, default=32)
    ap.add_argument("--documents", type=int, default=16)
    a = ap.parse_args()

    import torch
    import transformers
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    os.makedirs(a.dir, exist_ok=True)
    model = os.path.join(a.dir, f"llama-reward-shaped-{a.layers}l")
    if not os.path.exists(os.path.join(model, "config.json")):
        make_model(model, a.layers)
    rng = random.Random(1)
    words = vocab_words(FIXTURE)

    def words_text():
        return " ".join(rng.choice(words) for _ in range(rng.randint(a.min_words, a.max_words)))

    tok = AutoTokenizer.from_pretrained(model)
    hf = AutoModelForSequenceClassification.from_pretrained(model, dtype=torch.float32).eval()
    src = os.path.join(a.dir, "rerank.jsonl" if a.rerank else "classify.jsonl")
    with open(src, "w") as f:
        if a.rerank:  # ids in (query, document) order, one request per query
            queries = [" ".join(rng.choice(words) for _ in range(rng.randint(8, 20))) for _ in range(a.queries)]
            docs = [[words_text() for _ in range(a.documents)] for _ in queries]
            ids = [tok(q, text_pair=d)["input_ids"] for q, ds in zip(queries, docs) for d in ds]
            for i, (q, ds) in enumerate(zip(queries, docs)):
                f.write(json.dumps({"custom_id": f"q{i}", "method": "POST", "url": "/v1/rerank",
                                    "body": {"model": "m", "query": q, "documents": ds, "use_activation": False}}) + "\n")
        else:
            convs = [[{"role": "user", "content": words_text()}, {"role": "assistant", "content": words_text()}]
                     for _ in range(a.conversations)]
            ids = [list(tok.apply_chat_template(c, tokenize=True, return_dict=False)) for c in convs]
            for i, c in enumerate(convs):
                f.write(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/classify",
                                    "body": {"model": "m", "messages": c, "use_activation": False}}) + "\n")
    tokens = sum(len(i) for i in ids)
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    hf_best, hf_rewards = 1e9, [0.0] * len(ids)
    with torch.no_grad():
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            for b in range(0, len(order), a.hf_batch):
                batch = order[b:b + a.hf_batch]
                width = max(len(ids[i]) for i in batch)
                x = torch.full((len(batch), width), tok.pad_token_id, dtype=torch.long)
                mask = torch.zeros((len(batch), width), dtype=torch.long)
                for r, i in enumerate(batch):
                    x[r, :len(ids[i])] = torch.tensor(ids[i])
                    mask[r, :len(ids[i])] = 1
                logits = hf(input_ids=x, attention_mask=mask).logits[:, 0]
                for r, i in enumerate(batch):
                    hf_rewards[i] = float(logits[r])
            hf_best = min(hf_best, time.perf_counter() - t0)

    out = os.path.join(a.dir, "rerank_out.jsonl" if a.rerank else "classify_out.jsonl")
    cmd = [a.strata, "run", "--model", model, "--prompts", src, "--out", out, "--no-progress"]
    strata_best, classify_s = time_strata(cmd, out, a.repeat, "classified")
    got = [None] * len(ids)
    for line in open(out):
        j = json.loads(line)
        body, n = j["response"]["body"], int(j["custom_id"][1:])
        if a.rerank:
            for r in body["results"]:
                got[n * a.documents + r["index"]] = r["relevance_score"]
            assert body["usage"]["total_tokens"] == sum(len(ids[n * a.documents + d]) for d in range(a.documents))
        else:
            got[n] = body["data"][0]["probs"][0]
            assert body["usage"]["prompt_tokens"] == len(ids[n])
    diff = max(abs(g - h) for g, h in zip(got, hf_rewards))

    flop = 2.0 * layer_elements(a.layers) * tokens
    peak = gemm_rate()
    print(f"| engine | seconds | tok/s | GFLOP/s | share of the GEMM rate ({peak / 1e9:.1f} GFLOP/s) |")
    print("|---|---|---|---|---|")
    print(f"| transformers {transformers.__version__} (torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"batch {a.hf_batch}, sorted) | {hf_best:.2f} | {tokens / hf_best:.0f} | {flop / hf_best / 1e9:.1f} | "
          f"{flop / hf_best / peak:.2f} |")
    print(f"| strata run (wall, with the model load) | {strata_best:.2f} | {tokens / strata_best:.0f} | "
          f"{flop / strata_best / 1e9:.1f} | {flop / strata_best / peak:.2f} |")
    print(f"| strata run (its classification time{', pairs' if a.rerank else ''}) | {classify_s:.2f} | {tokens / classify_s:.0f} | "
          f"{flop / classify_s / 1e9:.1f} | {flop / classify_s / peak:.2f} |")
    inputs = f"{a.queries} queries x {a.documents} documents" if a.rerank else f"{len(ids)} conversations"
    print(f"\n{inputs}, {tokens} tokens; max |strata - transformers| score = {diff:.2e}")
    print("command: " + " ".join(cmd))


if __name__ == "__main__":
    main()
