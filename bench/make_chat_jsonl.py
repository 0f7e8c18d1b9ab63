#!/usr/bin/env python3
"""Writes N chat requests for `strata run` whose answers end at end-of-sequence after lengths that
vary tenfold (a one-word capital, a haiku, a list, a story that runs to the token limit): the
shape of job continuous batching is for (issue 37; docs/architecture.md "Continuous batching").
Deterministic for a seed; every line is {"id", "messages": [{"role": "user", ...}], "max_new_tokens"}.

    bench/make_chat_jsonl.py --lines 256 --out /tmp/chat256.jsonl [--max-new-tokens 256] [--seed 1]
"""
import argparse
import json
import random

COUNTRIES = "France Japan Brazil Kenya Canada Italy Egypt Norway Peru India Spain Chile".split()
TOPICS = "the sea,autumn leaves,a city at night,the moon,a lost key,winter,a garden,coffee".split(",")
THINGS = "a bicycle,a refrigerator,the internet,a rainbow,photosynthesis,a vaccine,an airplane,a battery".split(",")
ANIMALS = "a fox,an owl,a turtle,a dragon,a cat,a whale,a bee,a wolf".split(",")
ITEMS = "fruits,colors,programming languages,rivers,board games,musical instruments".split(",")
PHRASES = ["good morning", "thank you very much", "where is the station", "I like tea"]

# Templates from the shortest answers to the longest.
TEMPLATES = [
    lambda r: f"What is the capital of {r.choice(COUNTRIES)}? Answer in one word.",
    lambda r: f"Translate '{r.choice(PHRASES)}' into French.",
    lambda r: f"What is {r.randint(2, 40)} plus {r.randint(2, 40)}?",
    lambda r: f"Write a haiku about {r.choice(TOPICS)}.",
    lambda r: f"List {r.randint(3, 8)} {r.choice(ITEMS)}.",
    lambda r: f"Explain how {r.choice(THINGS)} works.",
    lambda r: f"Write a long story about {r.choice(ANIMALS)} who finds {r.choice(TOPICS)}.",
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    r = random.Random(a.seed)
    with open(a.out, "w") as f:
        for i in range(a.lines):
            content = r.choice(TEMPLATES)(r)
            f.write(json.dumps({"id": i, "messages": [{"role": "user", "content": content}],
                                "max_new_tokens": a.max_new_tokens}) + "\n")


if __name__ == "__main__":
    main()
