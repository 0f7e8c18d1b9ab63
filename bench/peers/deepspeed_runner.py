#!/usr/bin/env python3
"""Runs DeepSpeed ZeRO-Inference (ZeRO stage 3 with parameter offload, FlexGen's "DeepSpeed"
baseline) on a Strata bench case: the same OPT shape with random fp16 weights (nothing is
downloaded), the same prompts and timing as accelerate_runner.py, and appends its figures to
OUT/peers.jsonl.

    python3 bench/peers/deepspeed_runner.py --suite paper-table2 --case opt-30b-512 --out bench-out --offload-dir /nvme/ds

Placement: ZeRO-Inference offloads all of the weights or none, so the case's policy maps to
`offload_param.device`: "nvme" (--offload-dir) when it puts any weights on disk, "cpu" when any
on the CPU, no offload when all are on the GPU. The KV cache stays on the GPU. Batch: the
policy's block, or --batch-size. One process, one GPU (the distributed environment is set here,
no `deepspeed` launcher needed).
"""
import argparse
import os
import shlex
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import accelerate_runner  # noqa: E402  (its plan)
import common  # noqa: E402
import hf_peer  # noqa: E402

ENGINE = "deepspeed"


def offload_device(policy):
    if policy.weights.get("disk", 0) > 0:
        return "nvme"
    if policy.weights.get("cpu", 0) > 0:
        return "cpu"
    return "none"


def ds_config(hidden, batch, device, nvme_path=None):
    """ZeRO stage 3 for inference, after DeepSpeed's own ZeRO-Inference example
    (DeepSpeedExamples inference/huggingface/zero_inference): buckets of two hidden x hidden."""
    zero = {"stage": 3, "stage3_prefetch_bucket_size": 2 * hidden * hidden,
            "stage3_param_persistence_threshold": hidden, "stage3_max_live_parameters": 2 * hidden * hidden}
    if device == "cpu":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    elif device == "nvme":
        if not nvme_path:
            raise common.CaseError("weights on disk: ZeRO-Inference's nvme offload needs --offload-dir")
        zero["offload_param"] = {"device": "nvme", "nvme_path": nvme_path, "pin_memory": True, "buffer_count": 5,
                                 "buffer_size": 2 * hidden * hidden * 4}
    return {"fp16": {"enabled": True}, "bf16": {"enabled": False}, "zero_optimization": zero,
            "train_batch_size": batch, "train_micro_batch_size_per_gpu": batch, "steps_per_print": 2000,
            "wall_clock_breakdown": False}


def plan(case, policy, batch_size=None, offload_dir=None):
    p = accelerate_runner.plan(case, policy, batch_size)
    device = offload_device(policy)
    p["offload"] = device
    p["ds_config"] = ds_config(p["config"]["hidden_size"], p["batch_size"], device,
                               offload_dir if device == "nvme" else None)
    del p["max_memory"]  # ZeRO places by the config, not by caps
    return p


def run_plan(p):
    import torch
    import deepspeed
    from transformers import OPTConfig, OPTForCausalLM
    from transformers.integrations import HfDeepSpeedConfig

    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                       ("MASTER_PORT", "29517")):
        os.environ.setdefault(key, value)
    keep = HfDeepSpeedConfig(p["ds_config"])  # noqa: F841  (must live while the model is built: zero.Init)
    model = OPTForCausalLM._from_config(OPTConfig(**p["config"]), torch_dtype=torch.float16)
    engine = deepspeed.initialize(model=model, config_params=p["ds_config"])[0]
    engine.module.eval()
    model = engine.module
    return hf_peer.timed_generate(model, p, synced_gpus=False)


def run_case(case, args):
    policy, policy_cmd = common.resolve_policy(case, args.strata, args.hardware)
    offload = args.offload_dir or (tempfile.mkdtemp(prefix="ds-offload-") if offload_device(policy) == "nvme" else None)
    p = plan(case, policy, args.batch_size, offload)
    command = shlex.join([sys.executable] + sys.argv)
    if args.dry_run:
        print(p)
        return None
    extra = {"machine": common.machine(), "policy_source": policy_cmd or case.policy_path(),
             "batch_size": p["batch_size"], "offload_param": p["offload"]}
    return hf_peer.run_line(case, ENGINE, policy, p, command, extra, lambda: run_plan(p))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_case_arguments(ap)
    ap.add_argument("--batch-size", type=int, help="sequences per generate() (default: the policy's block)")
    ap.add_argument("--offload-dir", help="nvme_path for weights on disk (default: a new temporary directory)")
    args = ap.parse_args(argv)
    return common.run_cases(args, ENGINE, run_case)


if __name__ == "__main__":
    sys.exit(main())
