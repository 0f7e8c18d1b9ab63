#!/usr/bin/env python3
"""Two numbers of policies/hardware/t4-paper.yaml, derived from what FlexGen's own runs on that
machine (a GCP T4 with 208 GB of DRAM and a 1.5 TB SSD) did, rather than from rounded defaults.

1. disk_to_cpu_bw. The paper's text gives "about 2 GB/s"; its Table 8 breaks down the decode time
   of the OPT-175B run without overlap, one resource at a time:

       decode 11315 s = compute 1498 + weight reads 3047 + cache reads 7046

   The bytes behind those reads follow from the policy (bench_suite.py suite_175b_1x1: 32 x 8
   sequences, weights 0/50/50, cache on disk, CPU attention), the model and FlexGen's code:
   - cache: with --cpu-cache-compute, decode step i copies positions [0, s + i - 1) of K and V of
     every layer from the disk into the CPU workspace (flex_opt.py SelfAttention.load_cache,
     path 1); --debug fewer_batch times the first decode steps and multiplies their mean out to
     the n - 1 steps (utils.project_decode_latency), so each step reads about s positions;
   - weights: half of every layer's bytes on disk (--percent 0 50), read once per decode step, and
     the whole layer crossing PCIe; the PCIe share of "weight reads" is taken at the profile's
     12.89 GB/s (FlexGen's own fit), which leaves the disk as little of the time as the data allow.
   Both reads are a lower bound on the disk's rate: their times include FlexGen's copies.

2. cpu_mem. FlexGen's cost model plans with --cpu-mem 200 (GB), but its 4-bit OPT-175B run
   (suite_175b_1x1_comp: 48 x 3, everything on the CPU) held more than that in the 208 GB: the
   layers' 4-bit matrices and the 4-bit KV cache alone (FlexGen allocates s + n - 1 positions;
   4.5 bits per element: 4-bit codes, an fp16 minimum and scale per group of 64). The usable
   budget is taken as the 208 GB less 4 GB for the OS and the process.

Prints both; with --check PROFILE exits 1 unless the profile holds them as written (ctest
t4_paper_from_flexgen_runs).
Usage: scripts/t4_paper_from_flexgen_runs.py [--check policies/hardware/t4-paper.yaml]
"""
import re
import sys

# OPT-175B (facebook/opt-175b config): hidden 12288, 96 heads, 96 layers, MLP 4 x hidden, fp16.
HIDDEN, LAYERS, FP16 = 12288, 96, 2
LAYER_MATRIX = 12 * HIDDEN * HIDDEN                # q, k, v, out (4 h^2) and fc1, fc2 (8 h^2)
LAYER_PARAMS = LAYER_MATRIX + 13 * HIDDEN           # with their biases and two norms
GEN = 32
PCIE_BW = 12.89e9  # FlexGen's fitted cpu->gpu rate (t4-paper.yaml cpu_to_gpu_bw)

# Run 1: Table 8, OPT-175B, prompt 512, 32 x 8 sequences, weights half on disk; seconds of decode.
T8_PROMPT, T8_BLOCK, T8_WEIGHTS_ON_DISK = 512, 32 * 8, 0.5
T8_WEIGHT_READ_S, T8_CACHE_READ_S = 3047.0, 7046.0

# Run 2: Table 2's 4-bit OPT-175B, prompt 512, 48 x 3 sequences, all on the CPU.
C_PROMPT, C_BLOCK = 512, 48 * 3
BITS_PER_ELEMENT = 4 + 2 * 16 / 64  # group 64: codes, fp16 minimum and scale
DRAM, OS_AND_PROCESS = 208e9, 4e9


def disk_read():
    decode_steps = GEN - 1
    cache_bytes = decode_steps * T8_BLOCK * T8_PROMPT * LAYERS * 2 * HIDDEN * FP16
    layer_bytes = LAYERS * LAYER_PARAMS * FP16
    weight_bytes = decode_steps * T8_WEIGHTS_ON_DISK * layer_bytes
    pcie_s = decode_steps * layer_bytes / PCIE_BW
    weight_s = T8_WEIGHT_READ_S - pcie_s
    return {
        "cache": (cache_bytes, T8_CACHE_READ_S),
        "weights": (weight_bytes, weight_s, pcie_s),
        "rate": (cache_bytes + weight_bytes) / (T8_CACHE_READ_S + weight_s),
    }


def compressed_run_bytes():
    weights = LAYERS * LAYER_MATRIX * BITS_PER_ELEMENT / 8
    cache = LAYERS * 2 * C_BLOCK * (C_PROMPT + GEN - 1) * HIDDEN * BITS_PER_ELEMENT / 8
    return weights, cache


def derived():
    return {"disk_to_cpu_bw": round(disk_read()["rate"] / 1e9, 2), "cpu_mem": (DRAM - OS_AND_PROCESS) / 1e9}


def profile_value(path, key):
    """A field written as NGB or NGB/s, in GB."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = re.match(rf"\s*{key}:\s*([0-9.]+)\s*GB(/s)?\b", line)
            if m:
                return float(m.group(1))
    raise SystemExit(f"{path}: no {key} written in GB")


def main():
    args = sys.argv[1:]
    want = derived()
    if args[:1] == ["--check"] and len(args) == 2:
        ok = True
        for key, value in want.items():
            have = profile_value(args[1], key)
            print(f"{args[1]}: {key} {have} GB; FlexGen's runs give {value} GB")
            ok &= abs(have - value) < 0.005
        sys.exit(0 if ok else 1)
    d = disk_read()
    cb, cs = d["cache"]
    wb, ws, ps = d["weights"]
    print(f"Table 8, cache read in decode:   {cb / 1e12:.2f} TB in {cs:.0f} s = {cb / cs / 1e9:.2f} GB/s")
    print(f"Table 8, weights read from disk: {wb / 1e12:.2f} TB in {T8_WEIGHT_READ_S:.0f} - {ps:.0f} s of PCIe "
          f"= {wb / ws / 1e9:.2f} GB/s")
    print(f"disk_to_cpu_bw: {want['disk_to_cpu_bw']} GB/s (both reads together)")
    w, c = compressed_run_bytes()
    print(f"4-bit OPT-175B run: layer matrices {w / 1e9:.1f} GB + KV cache {c / 1e9:.1f} GB = {(w + c) / 1e9:.1f} GB "
          f"held in {DRAM / 1e9:.0f} GB of DRAM")
    print(f"cpu_mem: {want['cpu_mem']:.0f} GB ({DRAM / 1e9:.0f} GB less {OS_AND_PROCESS / 1e9:.0f} GB)")


if __name__ == "__main__":
    main()
