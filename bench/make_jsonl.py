#!/usr/bin/env python3
"""Writes an N-line batch input file for `strata run` (the strata format, or --openai for the
OpenAI batch format), with prompts of mixed lengths (1 to --max-words words, a HELM-like spread),
deterministic for a seed. Used by bench/stream_bench.py; 10M lines take about a minute.

    bench/make_jsonl.py --lines 1000000 --out /tmp/p1m.jsonl [--max-new-tokens 2] [--max-words 24]
                        [--instruction-words 120]

--instruction-words N starts every prompt with one fixed instruction of N words, the shape of a job
that asks one question of many items (what shared prompt prefixes save: docs/batch-format.md).
"""
import argparse
import json
import random

WORDS = ("the quick brown fox jumps over a lazy dog while an old band plays on the hill "
         "story time once upon there was river city light morning stone garden letter").split()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-new-tokens", type=int, default=2)
    ap.add_argument("--max-words", type=int, default=24)
    ap.add_argument("--instruction-words", type=int, default=0,
                    help="a fixed instruction of this many words before every prompt")
    ap.add_argument("--openai", action="store_true", help="OpenAI batch requests (/v1/completions)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    # A pool of prompts reused round-robin with distinct ids: generating 10M random prompts in
    # Python would take longer than the job's pass 1.
    instruction = " ".join(rng.choice(WORDS) for _ in range(a.instruction_words))
    pool = []
    for _ in range(4096):
        n = min(a.max_words, max(1, int(rng.lognormvariate(1.8, 0.7))))
        item = " ".join(rng.choice(WORDS) for _ in range(n))
        pool.append(json.dumps(instruction + "\n\n" + item if instruction else item))
    with open(a.out, "w", buffering=1 << 22) as f:
        chunk = []
        for i in range(a.lines):
            p = pool[i % len(pool)]
            if a.openai:
                chunk.append('{"custom_id": "req-%d", "method": "POST", "url": "/v1/completions", '
                             '"body": {"model": "m", "prompt": %s, "max_tokens": %d}}\n' % (i, p, a.max_new_tokens))
            else:
                chunk.append('{"id": %d, "prompt": %s, "max_new_tokens": %d}\n' % (i, p, a.max_new_tokens))
            if len(chunk) == 65536:
                f.write("".join(chunk))
                chunk.clear()
        f.write("".join(chunk))


if __name__ == "__main__":
    main()
