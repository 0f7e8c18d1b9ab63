#!/usr/bin/env python3
"""Runs Hugging Face transformers + accelerate offloading (device_map="auto" under max_memory caps,
FlexGen's "Accelerate" baseline) on a Strata bench case: the same OPT shape with random fp16
weights built from the config (nothing is downloaded), prompts of exactly prompt_len tokens, and
appends its figures to OUT/peers.jsonl.

    python3 bench/peers/accelerate_runner.py --suite paper-table2 --case opt-6.7b-512 --out bench-out

Batch: the case policy's block (gpu_batch_size x num_gpu_batches sequences) in one generate()
call, or --batch-size. Placement: accelerate's own, whole decoder layers on the GPU up to the
case's gpu_mem cap, then the CPU up to cpu_mem, the rest on disk (--offload-dir); weights only,
the KV cache stays on the GPU. Timing: a stopping criterion stamps each step; prefill is up to
the first token, decode the rest (the definitions of `strata bench`).
"""
import argparse
import os
import shlex
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

ENGINE = "accelerate"


def opt_config_kwargs(model):
    """transformers.OPTConfig arguments for Strata's preset (src/model/config.cpp, opt_preset)."""
    name = common.hf_model_name(model).split("/")[1]
    hidden, layers, heads = common.OPT_PRESETS[name]
    return {"hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
            "ffn_dim": 4 * hidden, "vocab_size": 50272, "max_position_embeddings": 2048,
            "word_embed_proj_dim": hidden, "do_layer_norm_before": True, "torch_dtype": "float16",
            "enable_bias": True, "pad_token_id": 1, "bos_token_id": 2, "eos_token_id": 2}


def plan(case, policy, batch_size=None, gpu_mem_default="", cpu_mem_default=""):
    """What one run does, as plain data: config, batch, memory caps (bytes; accelerate's
    max_memory keys: GPU 0 and "cpu"). Caps absent from the case and the defaults: no key."""
    if case.prompt_len + case.gen_len > 2048:
        raise common.CaseError(f"case {case.name}: OPT has 2048 positions, the case needs "
                               f"{case.prompt_len + case.gen_len}")
    max_memory = {}
    gpu = case.gpu_mem or gpu_mem_default
    cpu = case.cpu_mem or cpu_mem_default
    if gpu:
        max_memory[0] = common.parse_size(gpu)
    if cpu:
        max_memory["cpu"] = common.parse_size(cpu)
    return {"config": opt_config_kwargs(case.model), "batch_size": batch_size or policy.block_size,
            "max_memory": max_memory, "prompt_len": case.prompt_len, "gen_len": case.gen_len}


def synthetic_prompts(count, length, vocab):
    """Strata bench's prompts (src/job/bench.cpp, synthetic_requests): the same token ids."""
    return [[(7919 * (t + 1) + 104729 * i) % vocab for t in range(length)] for i in range(count)]


def measure_from_stamps(t_start, stamps, batch, prompt_len):
    """stamps: the time after each generated token (the first ends prefill)."""
    if not stamps:
        raise ValueError("no token was generated")
    prefill = stamps[0] - t_start
    decode = stamps[-1] - stamps[0]
    return common.measure(batch * prompt_len, batch * len(stamps), batch, prefill, decode)


def build_model(p, offload_dir):
    """The model dispatched as from_pretrained(device_map="auto", max_memory=...) would, with
    random weights: built empty, device map inferred under the caps, filled on the CPU, then
    dispatched (CPU-mapped layers stream to the GPU per forward, disk-mapped ones from offload_dir)."""
    import torch
    from accelerate import dispatch_model, infer_auto_device_map, init_empty_weights
    from transformers import OPTConfig, OPTForCausalLM

    config = OPTConfig(**p["config"])
    with init_empty_weights():  # fp16 from the start: an fp32 model of OPT-30B would not fit the host
        model = OPTForCausalLM._from_config(config, torch_dtype=torch.float16)
    model.tie_weights()
    kwargs = {"no_split_module_classes": ["OPTDecoderLayer"], "dtype": torch.float16}
    if p["max_memory"]:
        kwargs["max_memory"] = dict(p["max_memory"])
    device_map = infer_auto_device_map(model, **kwargs)
    model = model.to_empty(device="cpu")
    with torch.no_grad():  # one fp32 tensor at a time: CPU kernels for fp16 random fills vary by torch version
        for t in model.parameters():
            t.copy_(torch.randn(t.shape, dtype=torch.float32).mul_(0.02))
    model.tie_weights()
    model = dispatch_model(model, device_map=device_map, offload_dir=offload_dir)
    model.eval()
    return model, device_map


def run_plan(p, offload_dir):
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    model, device_map = build_model(p, offload_dir)
    ids = torch.tensor(synthetic_prompts(p["batch_size"], p["prompt_len"], p["config"]["vocab_size"]),
                       device="cuda:0")
    stamps = []

    class Stamp(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            torch.cuda.synchronize()
            stamps.append(time.perf_counter())
            return False

    gen = dict(do_sample=False, use_cache=True, pad_token_id=p["config"]["pad_token_id"])
    with torch.no_grad():
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, **gen)  # warm-up: prefill and one token
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        stamps.clear()
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=p["gen_len"], min_new_tokens=p["gen_len"],
                       stopping_criteria=StoppingCriteriaList([Stamp()]), **gen)
    m = measure_from_stamps(t0, stamps, p["batch_size"], p["prompt_len"])
    tiers = {}
    for where in device_map.values():
        key = "gpu" if isinstance(where, int) or str(where).startswith("cuda") else str(where)
        tiers[key] = tiers.get(key, 0) + 1
    return m, {"peak_memory": {"gpu": float(torch.cuda.max_memory_allocated())}, "device_map_modules": tiers}


def run_case(case, args):
    policy, policy_cmd = common.resolve_policy(case, args.strata, args.hardware)
    p = plan(case, policy, args.batch_size, args.default_gpu_mem, args.default_cpu_mem)
    command = shlex.join([sys.executable] + sys.argv)
    if args.dry_run:
        print({k: v for k, v in p.items()})
        return None
    offload = args.offload_dir or tempfile.mkdtemp(prefix="accelerate-offload-")
    extra = {"machine": common.machine(), "policy_source": policy_cmd or case.policy_path(),
             "batch_size": p["batch_size"], "max_memory": {str(k): v for k, v in p["max_memory"].items()}}
    try:
        m, more = run_plan(p, offload)
    except Exception as e:  # the peer's own failure (e.g. CUDA out of memory) is a result
        msg = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        return common.result_line(case, ENGINE, policy, status=f"failed: {msg}", command=command, extra=extra)
    extra.update(more)
    line = common.result_line(case, ENGINE, policy, measured=m, command=command, extra=extra)
    # accelerate runs the whole block as one batch: record it as one GPU batch of that size.
    line["gpu_batch_size"], line["num_gpu_batches"] = p["batch_size"], 1
    return line


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_case_arguments(ap)
    ap.add_argument("--batch-size", type=int, help="sequences per generate() (default: the policy's block)")
    ap.add_argument("--default-gpu-mem", default="", help="GPU cap for cases that give none")
    ap.add_argument("--default-cpu-mem", default="", help="CPU cap for cases that give none")
    ap.add_argument("--offload-dir", help="accelerate's disk offload folder (default: a new temporary one)")
    args = ap.parse_args(argv)
    return common.run_cases(args, ENGINE, run_case)


if __name__ == "__main__":
    sys.exit(main())
