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


def measure_from_stamps(t_start, stamps, batch, prompt_len):
    """stamps: the time after each generated token (the first ends prefill)."""
    if not stamps:
        raise ValueError("no token was generated")
    prefill = stamps[0] - t_start
    decode = stamps[-1] - stamps[0]
    return common.measure(batch * prompt_len, batch * len(stamps), batch, prefill, decode)


def timed_generate(model, p, **gen_kwargs):
    """Greedy generation of plan `p`'s prompts: a warm-up (prefill and one token), then the timed
    run, a stopping criterion stamping each step. Returns the measured figures and the peak GPU
    memory of the timed run."""
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
        model.generate(ids, max_new_tokens=p["gen_len"], min_new_tokens=p["gen_len"],
                       stopping_criteria=StoppingCriteriaList([Stamp()]), **gen)
    m = measure_from_stamps(t0, stamps, p["batch_size"], p["prompt_len"])
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
