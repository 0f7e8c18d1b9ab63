#!/usr/bin/env python3
"""Writes the committed seed corpora under fuzz/corpus/<target>/ from the repository's fixtures.

Small on purpose (a few hundred KB in all): tokenizers are trimmed to a few hundred tokens, the
safetensors seeds are made here with a handful of bytes of data. Rerun after changing it:
    python3 fuzz/make_corpus.py
"""
import base64
import json
import pathlib
import struct

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "fuzz" / "corpus"


def put(target, name, data):
    d = OUT / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())


def prompts():
    put("prompts_fuzz", "strata_prompt.jsonl",
        '{"id": 1, "prompt": "Hello", "max_new_tokens": 8, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "seed": 7}\n'
        '{"id": "b", "prompt": "World", "ignore_eos": true, "extra": 1}\n\n')
    put("prompts_fuzz", "strata_messages.jsonl",
        '{"id": "c", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi \\u00e9"}]}\r\n')
    put("prompts_fuzz", "openai_chat.jsonl",
        '{"custom_id": "req-1", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", "messages": '
        '[{"role": "user", "content": "Hi"}, {"role": "user", "content": [{"type": "text", "text": "there"}]}], '
        '"max_completion_tokens": 64, "top_k": -1, "n": 1, "stop": [], "logprobs": false, "stream": false}}\n')
    put("prompts_fuzz", "openai_completion.jsonl",
        '{"custom_id": "req-2", "method": "POST", "url": "/v1/completions", "body": {"model": "m", "prompt": '
        '["Once upon a time"], "max_tokens": 32, "temperature": 0.7, "seed": -1, "top_logprobs": 0, "logprobs": 0}}\n'
        '{"custom_id": "req-3", "url": "/v1/embeddings", "body": {"input": "x"}}\n')
    put("prompts_fuzz", "openai_errors.jsonl",
        '{"custom_id": "e1", "method": "GET", "url": "/v1/completions", "body": {"prompt": "x", "max_tokens": 0}}\n'
        '{"custom_id": "e2", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": '
        '[{"type": "image_url"}]}], "temperature": 3, "stream": true, "stop": "x"}}\n')
    put("prompts_fuzz", "openai_tool_calls.jsonl",
        '{"custom_id": "t1", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": ['
        '{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", '
        '"type": "function", "function": {"name": "get_weather", "arguments": "{\\"city\\": [1.5e3, -0, null]}"}}]}, '
        '{"role": "tool", "tool_call_id": "c1", "content": "22 C"}]}}\n'
        '{"custom_id": "t2", "url": "/v1/chat/completions", "body": {"messages": [{"role": "assistant", '
        '"tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}]}}\n')
    schema = ('{"type": "object", "properties": {"z": {"type": ["string", "null"]}, "a": {"anyOf": [{"$ref": '
              '"#/$defs/n"}, {"enum": [1, "x", true]}]}, "l": {"type": "array", "items": {"type": "integer"}}}, '
              '"required": ["z"], "$defs": {"n": {"type": "object", "properties": {"k": {"$ref": "#/$defs/n"}}}}}')
    put("prompts_fuzz", "structured_outputs.jsonl",
        '{"id": 1, "prompt": "x", "structured_outputs": {"choice": ["yes", "no"]}}\n'
        '{"id": 2, "prompt": "x", "guided_regex": "[a-z]{2,5}(\\\\.[0-9]+)?", "guided_decoding_backend": "xgrammar"}\n'
        '{"id": 3, "prompt": "x", "structured_outputs": {"json": {"type": "object"}, "disable_fallback": true}}\n'
        '{"id": 4, "prompt": "x", "guided_json": "{\\"type\\": \\"array\\"}"}\n')
    put("prompts_fuzz", "openai_response_format.jsonl",
        '{"custom_id": "j1", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "x"}], '
        '"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": ' + schema + '}}}}\n'
        '{"custom_id": "j2", "url": "/v1/completions", "body": {"prompt": "x", "response_format": '
        '{"type": "json_object"}}}\n'
        '{"custom_id": "j3", "url": "/v1/completions", "body": {"prompt": "x", "response_format": {"type": '
        '"json_schema", "json_schema": {"schema": {"type": "object", "properties": {"p": {"pattern": "a"}}}}}}}\n')
    put("prompts_fuzz", "reasoning_effort.jsonl",
        '{"id": 1, "messages": [{"role": "user", "content": "x"}], "reasoning_effort": "high"}\n'
        '{"id": 2, "prompt": "y", "reasoning_effort": null, "chat_template_kwargs": {"enable_thinking": false}}\n')
    put("prompts_fuzz", "openai_chat_template_kwargs.jsonl",
        '{"custom_id": "k", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "x"}], '
        '"chat_template_kwargs": {"enable_thinking": true, "reasoning_effort": "low", "x": 1}}}\n')
    put("prompts_fuzz", "openai_tools.jsonl",
        '{"custom_id": "t", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": '
        '[{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f", '
        '"parameters": {"z": 1, "a": [1e16, null]}}}], "tool_choice": "auto"}}\n'
        '{"custom_id": "u", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": '
        '[{"role": "user", "content": "x"}], "tools": [{"function": {}}], "tool_choice": {"type": "function"}}}\n')
    put("prompts_fuzz", "openai_tools_required.jsonl",
        '{"custom_id": "r", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "x"}], '
        '"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": '
        '{"i": {"$ref": "#/$defs/I"}, "l": {"type": "array", "items": {}, "minItems": 2, "maxItems": 3}}, '
        '"$defs": {"I": {"type": "integer"}}}}}, {"type": "function", "function": {"name": "g", "parameters": {'
        '"$defs": {"I": {"type": "string"}}}}}], "tool_choice": "required"}}\n')
    put("prompts_fuzz", "strata_tools.jsonl",
        '{"id": 1, "messages": [{"role": "user", "content": "x"}], "tools": [], "tool_choice": "none"}\n'
        '{"id": 2, "prompt": "y", "tools": [{"type": "function", "function": {"name": "g"}}]}\n')
    put("prompts_fuzz", "openai_embeddings.jsonl",
        '{"custom_id": "e1", "method": "POST", "url": "/v1/embeddings", "body": {"model": "m", "input": "Hello"}}\n'
        '{"custom_id": "e2", "url": "/v1/embeddings", "body": {"input": ["a", [1, 2, 3]], "dimensions": 8, '
        '"encoding_format": "base64", "normalize": false, "user": "u"}}\n'
        '{"custom_id": "e3", "url": "/v1/embeddings", "body": {"input": [5, 6], "max_tokens": 3}}\n'
        '{"custom_id": "e4", "url": "/v1/embeddings", "body": {"input": []}}\n')
    put("prompts_fuzz", "openai_score_rerank.jsonl",
        '{"custom_id": "s1", "url": "/v1/score", "body": {"text_1": "q", "text_2": ["a", "b"]}}\n'
        '{"custom_id": "s2", "url": "/v1/score", "body": {"text_1": ["q", "r"], "text_2": ["a", "b"], '
        '"truncate_prompt_tokens": 4}}\n'
        '{"custom_id": "r1", "url": "/v1/rerank", "body": {"query": "q", "documents": ["a", "b", "c"], "top_n": 2}}\n'
        '{"custom_id": "r2", "url": "/v1/rerank", "body": {"query": ["q"], "documents": []}}\n')
    put("prompts_fuzz", "strata_score_rerank.jsonl",
        '{"id": 1, "text_1": "q", "text_2": "a"}\n{"id": 2, "query": "q", "documents": ["a", "b"], "top_n": 0}\n')
    put("prompts_fuzz", "openai_classify.jsonl",
        '{"custom_id": "c1", "url": "/v1/classify", "body": {"input": ["good", "bad"], "use_activation": false}}\n'
        '{"custom_id": "c2", "url": "/v1/classify", "body": {"messages": [{"role": "user", "content": "hi"}], '
        '"add_generation_prompt": true, "softmax": true, "truncate_prompt_tokens": 8}}\n'
        '{"custom_id": "c3", "url": "/v1/classify", "body": {"input": [5, 6], "add_special_tokens": false}}\n')
    put("prompts_fuzz", "strata_classify.jsonl",
        '{"id": 1, "classify": "fine"}\n{"id": 2, "classify": true, "messages": [{"role": "user", "content": "x"}]}\n'
        '{"id": 3, "classify": [[1, 2], "y"], "use_activation": false}\n')
    put("prompts_fuzz", "strata_embeddings.jsonl",
        '{"id": 1, "input": "Hello", "dimensions": 4}\n{"id": 2, "input": ["a", "b"], "encoding_format": "float"}\n'
        '{"id": 3, "input": [[1], [2, 3]], "normalize": true, "temperature": 1}\n')
    put("prompts_fuzz", "strata_response_format.jsonl",
        '{"id": 1, "prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"schema": '
        + schema + '}}}\n{"id": 2, "prompt": "y", "response_format": {"type": "text"}}\n')


def yaml_files():
    for f in sorted((ROOT / "policies").glob("*.yaml"))[:6]:
        put("policy_fuzz", f.name, f.read_bytes())
    put("policy_fuzz", "flow_style.yaml",
        "{gpu_batch_size: 8, num_gpu_batches: 2, weights: {gpu: 50, cpu: 50}, kv_cache: {cpu: 100},\n"
        " activations: {gpu: 100}, overlap: false, cpu_attention: true, compress_weights: true,\n"
        " compress_kv_cache: {bits: 4, group_size: 64}, prefill_tokens: 512}\n")
    for f in sorted((ROOT / "policies" / "hardware").glob("*.yaml")):
        put("hardware_fuzz", f.name, f.read_bytes())


def safetensors():
    def st(header, data):
        h = json.dumps(header).encode()
        return struct.pack("<Q", len(h)) + h + data
    put("safetensors_fuzz", "two_tensors.safetensors",
        st({"__metadata__": {"format": "pt"},
            "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
            "b": {"dtype": "F16", "shape": [3], "data_offsets": [16, 22]}}, bytes(range(22))))
    put("safetensors_fuzz", "bf16_scalar.safetensors",
        st({"s": {"dtype": "BF16", "shape": [], "data_offsets": [0, 2]},
            "z": {"dtype": "F32", "shape": [0, 4], "data_offsets": [2, 2]}}, b"\x80\x3f"))
    put("safetensors_fuzz", "empty_header.safetensors", st({}, b""))


def packed():
    """One packed linear (64 inputs, 8 outputs, 4-bit, groups of 32) and a norm; the first byte
    picks packed_fuzz's format (4: bits 4, group 32)."""
    def st(tensors):
        header, data = {}, b""
        for name, (dtype, shape, raw) in tensors.items():
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
            data += raw
        h = json.dumps(header).encode()
        return struct.pack("<Q", len(h)) + h + data
    words = lambda n, seed: struct.pack(f"<{n}I", *[(seed * 2654435761 * (i + 1)) & 0xFFFFFFFF for i in range(n)])
    halves = lambda vals: struct.pack(f"<{len(vals)}e", *vals)
    linear = {"l.qweight": ("I32", [8, 8], words(64, 1)), "l.qzeros": ("I32", [2, 1], words(2, 2)),
              "l.scales": ("F16", [2, 8], halves([0.01 * (i + 1) for i in range(16)])),
              "norm.weight": ("F16", [8], halves([1.0] * 8))}
    consecutive = struct.pack("<64i", *[i // 32 for i in range(64)])
    permuted = struct.pack("<64i", *[(i * 7) % 2 for i in range(64)])
    put("packed_fuzz", "group32.bin", b"\x04" + st({**linear, "l.g_idx": ("I32", [64], consecutive)}))
    put("packed_fuzz", "act_order.bin", b"\x04" + st({**linear, "l.g_idx": ("I32", [64], permuted)}))
    put("packed_fuzz", "no_g_idx.bin", b"\x04" + st(linear))
    # AWQ (first byte 28: AWQ, group 32): qweight [in 64, out 8 / 8], packed along the output.
    awq = {**linear, "l.qweight": ("I32", [64, 1], words(64, 3))}
    put("packed_fuzz", "awq_group32.bin", b"\x1c" + st(awq))


def tokenizers():
    # Trimmed to the tokens below `keep` and the merges among them: small seeds fuzz faster.
    for src, keep in [("tests/fixtures/models/tiny-opt/tokenizer.json", 300),
                      ("tests/fixtures/models/tiny-llama3/tokenizer.json", 300),
                      ("tests/fixtures/tokenizer/llama3-style/tokenizer.json", 320),
                      # SentencePiece-style: ids 3..258 are the <0xXX> byte tokens
                      ("tests/fixtures/tokenizer/sp-normalizer/tokenizer.json", 340),
                      ("tests/fixtures/tokenizer/sp-metaspace/tokenizer.json", 340),
                      ("tests/fixtures/tokenizer/sp-metaspace-split/tokenizer.json", 340),
                      ("tests/fixtures/tokenizer/sp-gemma/tokenizer.json", 340)]:
        j = json.loads((ROOT / src).read_text())
        vocab = {t: i for t, i in j["model"]["vocab"].items() if i < keep}
        merges = []
        for m in j["model"]["merges"]:
            a, b = m if isinstance(m, list) else m.split(" ")
            if a in vocab and b in vocab and a + b in vocab:
                merges.append(m)
        j["model"]["vocab"] = vocab
        j["model"]["merges"] = merges
        j["added_tokens"] = [t for t in j.get("added_tokens", []) if t["id"] < keep]
        name = src.split("/")[-2] + ".json"
        put("tokenizer_fuzz", name, json.dumps(j, ensure_ascii=False))


def configs():
    for name in ["tiny-opt", "tiny-llama", "tiny-llama3", "tiny-qwen2", "tiny-qwen3", "tiny-llama-gptq", "tiny-gemma2",
                 "tiny-gemma3", "tiny-gemma3-mm", "tiny-gpt-oss", "tiny-gpt-oss-mxfp4", "tiny-phi4-mini", "tiny-glm4",
                 "tiny-granite", "tiny-olmo2", "tiny-olmo3"]:
        put("config_fuzz", name + ".json", (ROOT / "tests/fixtures/models" / name / "config.json").read_bytes())


def safetensors_indexes():
    put("safetensors_index_fuzz", "tiny-llama.json",
        (ROOT / "tests/fixtures/models/tiny-llama/model.safetensors.index.json").read_bytes())
    put("safetensors_index_fuzz", "two_shards.json", json.dumps(
        {"metadata": {"total_size": 20}, "weight_map": {"w": "a.safetensors", "v": "shards/b.safetensors"}}))


def bpe_files():
    # GPT-2-style vocab.json and merges.txt, joined at "\n----\n" as bpe_files_fuzz splits them,
    # from the byte-level fixture tokenizers trimmed like the tokenizer_fuzz seeds.
    for src, keep in [("tests/fixtures/models/tiny-opt/tokenizer.json", 300),
                      ("tests/fixtures/models/tiny-llama3/tokenizer.json", 300)]:
        j = json.loads((ROOT / src).read_text())
        vocab = {t: i for t, i in j["model"]["vocab"].items() if i < keep}
        vocab.setdefault("<|endoftext|>", keep)  # GPT-2's one special token lives in vocab.json
        merges = []
        for m in j["model"]["merges"]:
            a, b = m if isinstance(m, list) else m.split(" ")
            if a in vocab and b in vocab and a + b in vocab:
                merges.append(a + " " + b)
        name = src.split("/")[-2] + ".txt"
        put("bpe_files_fuzz", name, json.dumps(vocab, ensure_ascii=False) + "\n----\n#version: 0.2\n" +
            "\n".join(merges) + "\n")


def chat_templates():
    # Each recognized family's template (the Jinja2 fixture's, and SmolLM2's ChatML) with a
    # conversation after "\n----\n", one "role\tcontent" a line, as chat_template_fuzz splits them.
    cases = json.loads((ROOT / "tests/fixtures/chat/chat_cases.json").read_text())
    conversation = ("system\t You are terse. \nuser\tWhat is the capital of France?\n"
                    "assistant\tParis.\nuser\t \u3000And of Spain?\t\n")
    for name, t in cases["templates"].items():
        put("chat_template_fuzz", name + ".txt", t["source"] + "\n----\n" + conversation)
    smollm2 = json.loads((ROOT / "tests/fixtures/gguf/smollm2_hf.json").read_text())["chat_template"]
    put("chat_template_fuzz", "smollm2_chatml.txt", smollm2 + "\n----\nuser\tHi\nassistant\tHello!\ntool\t{}\n")
    harmony = json.loads((ROOT / "tests/fixtures/chat/harmony_cases.json").read_text())["source"]
    put("chat_template_fuzz", "gpt-oss-harmony.txt", harmony + "\n----\n" + conversation)
    # Tool definitions ("tools\tJSON" lines) for the templates that write them.
    tool_line = 'tools\t{"type": "function", "function": {"name": "f", "parameters": {"a": [1e16, {}], "b": null}}}\n'
    for name in ("qwen2.5", "qwen3", "llama3.1"):
        put("chat_template_fuzz", name + "-tools.txt", cases["templates"][name]["source"] + "\n----\n" + tool_line +
            "system\tBe brief.\nuser\tWeather?\n")


def jinja_templates():
    # The Jinja fixture's realistic chat templates (one conversation each) and a few feature cases,
    # as jinja_fuzz splits them: the template, "\n----\n", the variables as a JSON object.
    cases = json.loads((ROOT / "tests/fixtures/chat/jinja_cases.json").read_text())["cases"]
    seen = set()
    picks = {"whitespace": "minus both", "raw": "raw whitespace", "loop": "for loop variables",
             "namespace": "namespace in loop", "macro": "macro json schema", "call": "call block with args",
             "tojson": "tojson indent4 nested", "filters": "selectattr operators", "methods": "str split",
             "slices": "slices", "undefined": "undefined default", "repr": "nested repr"}
    for seed, name in picks.items():
        c = next(c for c in cases if c["name"] == name)
        put("jinja_fuzz", seed + ".txt", c["template"] + "\n----\n" + json.dumps(c["variables"]))
    for c in cases:
        template = c["name"].split(" ")[0]
        if template.endswith("-style") and "tools" in c["name"] and template not in seen:
            seen.add(template)
            put("jinja_fuzz", template + ".txt", c["template"] + "\n----\n" + json.dumps(c["variables"]))


def regex_patterns():
    # The regex fixture's patterns (tests/fixtures/json/pattern_masks.json), each with a text it
    # matches, as regex_fuzz splits them: the pattern, "\n----\n", the text.
    fixture = json.loads((ROOT / "tests/fixtures/json/pattern_masks.json").read_text())
    for i, entry in enumerate(e for e in fixture["patterns"] if e["kind"] == "regex"):
        prefixes = entry["masks"]["tiny-llama"]["cases"]
        text = max((base64.b64decode(c["prefix"]) for c in prefixes), key=len)
        put("regex_fuzz", f"pattern{i:02d}.txt", entry["pattern"].encode() + b"\n----\n" + text)


def sentencepiece_vocabs():
    # The SentencePiece fixture vocabularies as sentencepiece_vocab_fuzz reads them: a flag byte
    # (add_space_prefix), then "<type digit><score byte><token>" a line (scores by id, so the
    # first tokens merge first; <unk> 2, <s> </s> 3, <0xXX> 6), then text after "\n----\n".
    for src, keep in [("tests/fixtures/tokenizer/sp-normalizer/tokenizer.json", 400)]:
        j = json.loads((ROOT / src).read_text())
        tokens = sorted((i, t) for t, i in j["model"]["vocab"].items() if i < keep)
        lines = []
        for i, t in tokens:
            kind = 2 if t == "<unk>" else 3 if t in ("<s>", "</s>") else 6 if t.startswith("<0x") else 1
            lines.append(f"{kind}{chr(0x7e - min(i, 90) if kind == 1 else 0x30)}{t}")
        text = "\n----\nHello world! <s>[INST] caf\u00e9 \u4e16\u754c  12345</s>"
        put("sentencepiece_vocab_fuzz", "sp-normalizer.txt", "\x01" + "\n".join(lines) + text)
        put("sentencepiece_vocab_fuzz", "sp-normalizer-no-prefix.txt", "\x00" + "\n".join(lines[:120]) + text)


def gguf():
    for name in ["synth_align.gguf", "synth_meta.gguf", "synth_quants.gguf"]:
        put("gguf_fuzz", name, (ROOT / "tests" / "fixtures" / "gguf" / name).read_bytes())


if __name__ == "__main__":
    gguf()
    prompts()
    yaml_files()
    safetensors()
    packed()
    tokenizers()
    configs()
    safetensors_indexes()
    bpe_files()
    chat_templates()
    jinja_templates()
    regex_patterns()
    sentencepiece_vocabs()
