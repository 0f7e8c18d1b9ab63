"""What the two Hugging Face transformers peers (accelerate_runner.py, deepspeed_runner.py) share:
Strata's OPT shapes as an OPTConfig, Strata bench's prompts, the timed generate() and the result
line of a run. torch and transformers are imported only by the functions that run a model."""
import time

import common


def opt_config_kwargs(model):
    """transformers.OPTConfig arguments for Strata's preset (src/model/config.cpp, opt_preset)."""
    name = common.hf_model_name(model).split("/")[1]
    hidden, layers, heads = common.OPT_PRESETS[name]
    return {"hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
            "ffn_dim": 4 * hidden, "vocab_size": 50272, "max_position_embeddings": 2048,
            "word_embed_proj_dim": hidden, "do_layer_norm_before": True, "torch_dtype": "float16",
            "enable_bias": True, "pad_token_id": 1, "bos_token_id": 2, "eos_token_id": 2}


def synthetic_prompts(count, length, vocab):
    """Strata bench's prompts (src/job/bench.cpp, synthetic_requests): the same token ids."""
    return [[(7919 * (t + 1) + 104729 * i) % vocab for t in range(length)] for i in range(count)]


def measure_from_stamps(t_start, stamps, batch, prompt_len, gen_len=None):
    """stamps: the time after each generated token (the first ends prefill). With gen_len beyond
    the tokens stamped, decode is projected to gen_len from the mean step, as `strata bench`
    projects a case with decode_steps (and FlexGen's fewer_batch mode)."""
    if not stamps:
        raise ValueError("no token was generated")
    prefill = stamps[0] - t_start
    decode = stamps[-1] - stamps[0]
    tokens = len(stamps)
    if gen_len is not None and gen_len > tokens:
        if tokens < 2:
            raise ValueError("a projected decode needs at least one decode step")
        decode = decode / (tokens - 1) * (gen_len - 1)
        tokens = gen_len
    return common.measure(batch * prompt_len, batch * tokens, batch, prefill, decode)


def fill_random_(tensors, pool_elements=1 << 24, seed=0):
    """Fills fp16 weights with N(0, 0.02) values at memory speed: one random pool, tiled. Drawing
    tens of billions of normals on the CPU takes minutes, and a timing run needs no more than
    values of the right scale."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    pool = torch.randn(pool_elements, generator=gen, dtype=torch.float32).mul_(0.02)
    pools = {}
    for t in tensors:
        flat = t.view(-1)
        if t.dtype not in pools:
            pools[t.dtype] = pool.to(t.dtype)
        src = pools[t.dtype]
        for start in range(0, flat.numel(), src.numel()):
            n = min(src.numel(), flat.numel() - start)
            flat[start:start + n].copy_(src[:n])


def generated_tokens(p):
    """Tokens the timed run generates: all of gen_len, or the first token and p["decode_steps"]."""
    steps = p.get("decode_steps") or 0
    return 1 + steps if 0 < steps < p["gen_len"] - 1 else p["gen_len"]


def timed_generate(model, p, **gen_kwargs):
    """Greedy generation of plan `p`'s prompts: a warm-up (prefill and one token), then the timed
    run, a stopping criterion stamping each step. With p["decode_steps"] below gen_len - 1 only
    that many decode steps run and decode is projected. Returns the measured figures and the peak
    GPU memory of the timed run."""
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    ids = torch.tensor(synthetic_prompts(p["batch_size"], p["prompt_len"], p["config"]["vocab_size"]),
                       device="cuda:0")
    stamps = []

    class Stamp(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            torch.cuda.synchronize()
            stamps.append(time.perf_counter())
            return False

    gen = dict(do_sample=False, use_cache=True, pad_token_id=p["config"]["pad_token_id"], **gen_kwargs)
    with torch.no_grad():
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, **gen)  # warm-up: prefill and one token
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        stamps.clear()
        t0 = time.perf_counter()
        run_tokens = generated_tokens(p)
        model.generate(ids, max_new_tokens=run_tokens, min_new_tokens=run_tokens,
                       stopping_criteria=StoppingCriteriaList([Stamp()]), **gen)
    m = measure_from_stamps(t0, stamps, p["batch_size"], p["prompt_len"], p["gen_len"])
    return m, {"peak_memory": {"gpu": float(torch.cuda.max_memory_allocated())}}


def run_line(case, engine, policy, p, command, extra, run):
    """The peers.jsonl line of `run()` -> (measured, more fields): its figures, or its own failure
    (e.g. CUDA out of memory) as the status. The peer runs the whole block as one batch: the line
    records it as one GPU batch of that size."""
    try:
        m, more = run()
    except Exception as e:  # the peer's own failure is a result
        msg = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        return common.result_line(case, engine, policy, status=f"failed: {msg}", command=command, extra=extra)
    extra.update(more)
    line = common.result_line(case, engine, policy, measured=m, command=command, extra=extra)
    line["gpu_batch_size"], line["num_gpu_batches"] = p["batch_size"], 1
    return line
