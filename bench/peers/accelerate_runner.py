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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import hf_peer  # noqa: E402

ENGINE = "accelerate"


def plan(case, policy, batch_size=None, gpu_mem_default="", cpu_mem_default="", decode_steps=None):
    """What one run does, as plain data: config, batch, memory caps (bytes; accelerate's
    max_memory keys: GPU 0 and "cpu"), decode steps run (0: all; fewer: decode projected). Caps
    absent from the case and the defaults: no key."""
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
    return {"config": hf_peer.opt_config_kwargs(case.model), "batch_size": batch_size or policy.block_size,
            "max_memory": max_memory, "prompt_len": case.prompt_len, "gen_len": case.gen_len,
            "decode_steps": decode_steps if decode_steps and decode_steps < case.gen_len - 1 else 0}


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
    with torch.no_grad():
        hf_peer.fill_random_(list(model.parameters()))
    model.tie_weights()
    model = dispatch_model(model, device_map=device_map, offload_dir=offload_dir)
    model.eval()
    return model, device_map


def run_plan(p, offload_dir):
    model, device_map = build_model(p, offload_dir)
    m, more = hf_peer.timed_generate(model, p)
    tiers = {}
    for where in device_map.values():
        key = "gpu" if isinstance(where, int) or str(where).startswith("cuda") else str(where)
        tiers[key] = tiers.get(key, 0) + 1
    return m, dict(more, device_map_modules=tiers)


def run_case(case, args):
    policy, policy_cmd = common.resolve_policy(case, args.strata, args.hardware)
    p = plan(case, policy, args.batch_size, args.default_gpu_mem, args.default_cpu_mem, args.decode_steps)
    command = shlex.join([sys.executable] + sys.argv)
    if args.dry_run:
        print({k: v for k, v in p.items()})
        return None
    offload = args.offload_dir or tempfile.mkdtemp(prefix="accelerate-offload-")
    extra = {"machine": common.machine(), "policy_source": policy_cmd or case.policy_path(),
             "batch_size": p["batch_size"], "max_memory": {str(k): v for k, v in p["max_memory"].items()},
             "projected": bool(p["decode_steps"]), "decode_steps_run": p["decode_steps"] or case.gen_len - 1}
    return hf_peer.run_line(case, ENGINE, policy, p, command, extra, lambda: run_plan(p, offload))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_case_arguments(ap)
    ap.add_argument("--batch-size", type=int, help="sequences per generate() (default: the policy's block)")
    ap.add_argument("--default-gpu-mem", default="", help="GPU cap for cases that give none")
    ap.add_argument("--default-cpu-mem", default="", help="CPU cap for cases that give none")
    ap.add_argument("--decode-steps", type=int, default=0,
                    help="run only the first N decode steps and project decode to gen_len (marked projected)")
    ap.add_argument("--offload-dir", help="accelerate's disk offload folder (default: a new temporary one)")
    args = ap.parse_args(argv)
    return common.run_cases(args, ENGINE, run_case)


if __name__ == "__main__":
    sys.exit(main())
