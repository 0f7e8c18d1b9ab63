#!/usr/bin/env python3
"""Builds an offline Hugging Face hub cache entry for the OPT tokenizer that FlexGen loads
(`AutoTokenizer.from_pretrained("facebook/opt-30b")`, even with dummy weights) from the GPT-2
byte-level BPE the repository holds (tests/fixtures/tokenizer/gpt2). Standard library only, so it
runs on the GPU machine too.

    python3 bench/peers/opt_tokenizer_cache.py DIR
    HF_HOME=DIR HF_HUB_OFFLINE=1 python3 -c 'import transformers; transformers.AutoTokenizer.from_pretrained("facebook/opt-30b")'

OPT's tokenizer is GPT-2's BPE with fairseq's id order and the specials <s> <pad> </s> <unk> at
0..3. We do not hold OPT's vocab.json, so the GPT-2 vocabulary is shifted by 4 behind those
specials: the same merges (the same tokens for a text), other ids than the real OPT tokenizer's,
all below OPT's 50272 embeddings. With dummy weights the ids only need to be valid; the padding
id (<pad> = 1) is OPT's, which FlexGen's attention mask compares against.
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
GPT2_TOKENIZER = os.path.join(REPO, "tests", "fixtures", "tokenizer", "gpt2", "tokenizer.json")
MODELS = ("facebook/opt-30b", "facebook/opt-6.7b")
REVISION = "0" * 40  # a fixed, made-up commit: refs/main names it
SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # OPT's ids 0..3
OPT_VOCAB = 50272  # OPT's embedding rows: every id must stay below


def opt_tokenizer_json(gpt2):
    """GPT-2's tokenizer.json turned into OPT's shape: specials at 0..3, everything else shifted by
    4, and OPT's template (</s> before each text, as the real one's add_bos_token does)."""
    shift = len(SPECIALS)
    out = json.loads(json.dumps(gpt2))  # a deep copy
    model = out["model"]
    model["vocab"] = dict({s: i for i, s in enumerate(SPECIALS)},
                          **{tok: i + shift for tok, i in gpt2["model"]["vocab"].items()})
    added = [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for i, s in enumerate(SPECIALS)]
    for t in gpt2.get("added_tokens", []):
        added.append(dict(t, id=t["id"] + shift))
    out["added_tokens"] = added
    out["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "</s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "</s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"</s>": {"id": "</s>", "ids": [2], "tokens": ["</s>"]}},
    }
    top = max(model["vocab"].values())
    if top >= OPT_VOCAB:
        raise ValueError(f"id {top} does not fit OPT's {OPT_VOCAB} embeddings")
    return out


def snapshot_files(gpt2):
    """The files of one snapshot: tokenizer.json and the configs AutoTokenizer reads."""
    tok = opt_tokenizer_json(gpt2)
    tokenizer_config = {
        "tokenizer_class": "GPT2Tokenizer", "add_bos_token": True, "add_prefix_space": False, "errors": "replace",
        "bos_token": "</s>", "eos_token": "</s>", "unk_token": "</s>", "pad_token": "<pad>",
        "model_max_length": 1000000000000000019884624838656,
    }
    special_tokens_map = {"bos_token": "</s>", "eos_token": "</s>", "unk_token": "</s>", "pad_token": "<pad>"}
    # The model's config (AutoTokenizer reads model_type from it); FlexGen builds its own.
    config = {"model_type": "opt", "architectures": ["OPTForCausalLM"], "vocab_size": OPT_VOCAB,
              "pad_token_id": 1, "bos_token_id": 2, "eos_token_id": 2,
              "_note": "offline stand-in built by bench/peers/opt_tokenizer_cache.py: GPT-2 BPE, ids shifted by 4"}
    return {"tokenizer.json": tok, "tokenizer_config.json": tokenizer_config,
            "special_tokens_map.json": special_tokens_map, "config.json": config}


def build(dest, models=MODELS, source=GPT2_TOKENIZER):
    """Writes DEST/hub/models--ORG--NAME/{refs/main, snapshots/REV/...} for each model (the layout
    huggingface_hub reads under HF_HOME=DEST). Plain files, no blobs or links, so that the folder
    travels as it is. Returns the snapshot folders."""
    with open(source) as f:
        files = snapshot_files(json.load(f))
    snapshots = []
    for model in models:
        repo = os.path.join(dest, "hub", "models--" + model.replace("/", "--"))
        snap = os.path.join(repo, "snapshots", REVISION)
        os.makedirs(snap, exist_ok=True)
        os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
        with open(os.path.join(repo, "refs", "main"), "w") as f:
            f.write(REVISION)
        for name, doc in files.items():
            with open(os.path.join(snap, name), "w") as f:
                json.dump(doc, f, ensure_ascii=False)
        snapshots.append(snap)
    return snapshots


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dest", help="the folder to use as HF_HOME")
    p.add_argument("--source", default=GPT2_TOKENIZER, help="a GPT-2 byte-level BPE tokenizer.json")
    args = p.parse_args(argv)
    for snap in build(args.dest, source=args.source):
        print(snap)
    print(f"use: HF_HOME={os.path.abspath(args.dest)} HF_HUB_OFFLINE=1", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
