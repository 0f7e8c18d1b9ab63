// The offloading engine (docs/design.md, "The runtime: the zig-zag block schedule"; FlexGen
// Algorithm 1). Weights, KV cache and hidden states live on the GPU, in pinned CPU memory or on
// disk as the placement plan says; for every generated token, every layer and every GPU batch of
// the block it loads the next layer's weights, stores the previous batch's cache and hidden state,
// loads the next batch's, and computes this batch, with the copies on their own lanes (CUDA copy
// streams, the disk thread) overlapping the compute. Prefill is the first pass of the same
// schedule.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "strata/backend/backend.h"
#include "strata/model/config.h"
#include "strata/model/weight_source.h"
#include "strata/offload/disk_store.h"
#include "strata/policy/placement.h"
#include "strata/policy/policy.h"
#include "strata/runtime/continuous.h"
#include "strata/runtime/generator.h"

namespace strata {

struct OffloadOptions {
  Policy policy;
  double gpu_budget = 0;  // bytes; 0: what the backend reports free
  double cpu_budget = 0;  // bytes; 0: the host's MemAvailable
  double disk_budget = 0; // bytes; 0: the free space of the offload directory
  std::filesystem::path offload_dir;  // empty: $TMPDIR or /tmp
  DiskIoMode disk_mode = DiskIoMode::Auto;
  bool trace = false;     // keep a timeline for write_trace()
  // Called after each layer is placed in its tier at start-up (layers done, layers in all).
  std::function<void(int, int)> on_layer_loaded;
  int cpu_threads = 0;    // threads of the CPU attention backend and of loading the weights (0: all cores)
  // Prompts of one prefill unit that begin alike compute the common beginning once (prefix_sharing.h).
  bool share_prefixes = true;
  PrefixSharingOptions prefix_sharing;
  // Fault injection for tests: the `fault_after`-th disk read or write of the schedule (counting
  // from 1; a unit's scattered cache rows are one) fails as a device error would. Also read from
  // STRATA_DISK_FAULT=read:N or write:N.
  DiskFault fault = DiskFault::None;
  int fault_after = 0;
};

struct LinkStats {
  uint64_t bytes = 0;
  double seconds = 0;  // busy time of the lane that moved them
  double gb_per_s() const { return seconds > 0 ? double(bytes) / seconds / 1e9 : 0; }
};

struct OffloadReport {
  GenStats gen;                  // prefill/decode seconds and token counts
  double schedule_seconds = 0;   // wall time inside the schedule
  double compute_busy = 0, h2d_busy = 0, d2h_busy = 0, disk_busy = 0;
  // The share of each lane's busy time that fell while the blocks' first token (prefill) ran;
  // the rest is decode. The cost model's calibration compares them with its prefill and decode
  // terms (docs/cost-model.md).
  double prefill_compute_busy = 0, prefill_h2d_busy = 0, prefill_d2h_busy = 0, prefill_disk_busy = 0;
  // Prompt tokens the prefill computed: a request's choices in one GPU batch count once, and the
  // positions a prompt copied from a shared prefix not at all.
  int64_t prefill_tokens = 0;
  // Attention delegated to the CPU (cpu_attention): the seconds its lane spent attending (the
  // kernel and the prompt rows a choice copies, not the copies of q, k, v and the output, which
  // run on the copy lanes), and the cache bytes it read (K and V at every position up to each
  // query's). Their ratio is the engine's rate, to set beside the profile's cpu_attention_bw.
  double cpu_attention_seconds = 0, cpu_attention_bytes = 0;
  // Experts computed on the CPU (policy cpu_experts): the seconds the CPU lane spent on MLP halves.
  double cpu_experts_seconds = 0;
  // Layer halves the GPU ran by replaying a captured graph (docs/offload.md, "Graphs").
  int64_t graph_replays = 0;
  // The waits of the thread that launches GPU work, for the device (sampled tokens, a delegated
  // attention's inputs) or for a lane (a disk read): all of them, their seconds, and those in
  // decode steps (the steady state; docs/offload.md, "Events"), of which for the device.
  int64_t host_waits = 0, decode_host_waits = 0, decode_device_waits = 0;
  double host_wait_seconds = 0;
  LinkStats disk_to_cpu, cpu_to_gpu, gpu_to_cpu, cpu_to_disk;
  TierBytes peak;                // reserved on each tier
  TierBytes used;                // carved out of the reservation by the schedule's buffers and homes
  std::string disk_io;           // the disk store's I/O path, when it has one
  // With compressed weights, the layers' matrices that kept the codes of the file (a GGUF's
  // Q4_0 ... Q5_K, WeightSource::read_codes) and those quantized at load.
  int weights_kept_codes = 0, weights_quantized = 0;
  // 1 when the wall time equals the busiest lane's (perfect overlap), 0 when it equals the sum.
  double overlap() const;
};

// What each tier may hold by default, and the check that a plan fits: an error names the tier,
// what the plan needs there (by tensor class) and the budget.
TierBytes default_budgets(Backend& backend, const OffloadOptions& options);
void check_plan_fits(const PlacementPlan& plan, const TierBytes& budgets, bool shared_host_memory);
// "compressed weights (4-bit, group 32): N matrices keep the file's codes, M quantized at load".
std::string describe_weight_codes(const OffloadReport& report, const Compression& compression);

class OffloadEngine {
public:
  // Plans, checks budgets, reserves every tier and loads the weights to their homes. `shape`
  // bounds the prompts and generation lengths of every block this engine will run.
  OffloadEngine(const ModelConfig& cfg, const WeightSource& weights, Backend& backend, const OffloadOptions& options,
                const PlanShape& shape);
  ~OffloadEngine();

  const PlacementPlan& plan() const;
  int block_size() const;
  // Generates for one block: at most block_size() sequences (a request with n choices counts n;
  // those in one GPU batch share one prefill of the prompt) within the planned shape.
  // Results as generate()'s in runtime/generator.h: one per choice, in order.
  std::vector<GenResult> generate(const std::vector<GenRequest>& requests, GenStats* stats = nullptr);
  // Continuous batching (docs/offload.md, "Continuous batching"): the block's gbs x ngb slots each
  // hold one live sequence, and a slot whose request has ended takes the next one from `next` (as
  // run_continuous in runtime/continuous.h: a null request ends the stream). A newcomer's prompt
  // is computed in the following steps of its GPU batch, in pieces beside the batch's decode
  // tokens within the plan's step of `step_tokens`. `finished(tag, results)` as each request
  // ends, results in choice order. Requests fit the planned shape, n <= the GPU batch size, and
  // no prompt scoring (perplexity runs blocks through generate()).
  void serve(const std::function<Admission()>& next, const std::function<void(size_t, std::vector<GenResult>)>& finished,
             GenStats* stats = nullptr);
  OffloadReport report() const;
  void write_trace(const std::filesystem::path& file) const;

  struct Impl;

private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
