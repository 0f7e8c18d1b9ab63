// Hardware profiles and policies that the cost-model, calibration and search tests build on.
#pragma once
#include "strata/policy/policy.h"
#include "strata/profile/hardware.h"

namespace strata::test {

// A made-up machine of round figures: a 16 GB GPU whose GEMMs saturate near 2048 tokens, 64 GB of
// host memory behind a 12 GB/s link each way, and a 2 GB/s disk.
inline HardwareProfile gpu16_machine() {
  HardwareProfile hw;
  hw.name = "test";
  hw.gpu_mem = 16e9;
  hw.cpu_mem = 64e9;
  hw.disk_mem = 1e12;
  hw.cpu_to_gpu_bw = 12e9;
  hw.gpu_to_cpu_bw = 12e9;
  hw.disk_to_cpu_bw = 2e9;
  hw.cpu_to_disk_bw = 1e9;
  hw.gpu_gemm = {{1, 0.3e12}, {16, 4e12}, {256, 18e12}, {2048, 20e12}};
  hw.gpu_attention_bw = 250e9;
  hw.cpu_attention_bw = 12e9;
  hw.cpu_flops = 1e12;
  hw.gpu_dequant_bw = 25e9;
  return hw;
}

// A block of `ngb` GPU batches of `gbs` sequences, weights, KV cache and activations split as given.
inline Policy policy_of(int gbs, int ngb, TierSplit w, TierSplit c, TierSplit h, bool cpu_attention = false,
                        bool overlap = true) {
  Policy p;
  p.gpu_batch_size = gbs;
  p.num_gpu_batches = ngb;
  p.weights = w;
  p.kv_cache = c;
  p.activations = h;
  p.cpu_attention = cpu_attention;
  p.overlap = overlap;
  return p;
}

}  // namespace strata::test
