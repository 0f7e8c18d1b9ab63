// The offloading engine's internals, shared by its translation units: engine.cpp (setup and the
// public API), engine_transfers.cpp (moving weights, cache and hidden states between tiers on the
// lanes) and engine_steps.cpp (what each step computes, and the block schedule). Not a public
// header: include/strata/offload/engine.h is.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/core/error.h"
#include "strata/core/thread_pool.h"
#include "strata/offload/engine.h"
#include "strata/offload/lanes.h"
#include "strata/offload/tiers.h"
#include "strata/runtime/continuous.h"
#include "strata/runtime/forward_ops.h"
#include "strata/runtime/model_weights.h"
#include "strata/runtime/prefix_sharing.h"
#include "strata/runtime/prompt_logprobs.h"
#include "strata/runtime/sequence.h"
#include "strata/runtime/step_graphs.h"

namespace strata {
namespace engine_detail {

constexpr size_t kPage = DiskStore::kAlign;

// Where a tensor lives when it is not being computed on.
struct Home {
  Tier tier = Tier::Gpu;
  char* ptr = nullptr;     // GPU or pinned memory
  size_t disk_offset = 0;  // in the disk store
};

// A unit brought into staging: its GPU slot (and pinned slot, for disk homes) and when it is ready.
struct Held {
  bool valid = false;
  int gpu = -1, pin = -1;
  Ticket ready;
  int layer = -1;  // activations: the layer whose input this is
  int token = -1;  // kv cache: the token it was loaded for
  // kv cache on disk: the pinned mirror was read from the home. When not (nothing stored yet),
  // whatever writes the mirror first waits for the slot's last users itself.
  bool read = false;
};


// A strided piece of a cache tensor: positions [begin, end) of every slot.
struct SlotRange {
  int begin = 0, end = 0;
  bool empty() const { return end <= begin; }
};

// The sequences one step of the schedule computes: in decode a whole GPU batch, in prefill a
// group of its sequences (plan.prefill_seqs of them), so that the GPU holds one group's
// intermediates, cache rows and hidden state rather than the whole batch's.
struct BatchState {
  int batch = 0;                // the GPU batch: its cache and hidden-state homes
  int first_slot = 0;           // its sequences' cache slots are [first_slot, first_slot + seqs.size())
  size_t act_offset = 0;        // its piece of the batch's hidden-state home (bytes)
  std::vector<Sequence*> seqs;  // index = cache slot - first_slot
  int pmin = 0, pmax = 0;       // shortest and longest prompt
  StepBatch step;               // this token's step; slots are relative to first_slot
  int step_built = -1;          // serving: the token step `step` was built for
  std::vector<Sequence*> active;   // the sequences the step computes
  std::vector<int> prompt_start;   // prefill: [active] its first computed position (copied before it)
  // Prompt positions the step scores (GenRequest::prompt_logprobs): seq's [from, to), on the step's
  // rows from first_row on.
  struct ScoredSpan {
    Sequence* seq = nullptr;
    int32_t first_row = 0;
    int from = 0, to = 0;
  };
  std::vector<ScoredSpan> scored;
  std::vector<Sequence*> sampled;  // the sequences of its logit rows: active ones, and in prefill their followers
  // After the step: the sequences one position longer (decode tokens), and those whose prompt is
  // now whole in the cache (their length becomes the prompt's).
  std::vector<Sequence*> advancing, prompt_done;
  // Decode units: (slot, source slot) of each choice that copies its source's prompt rows at token 1.
  std::vector<std::pair<int, int>> choice_copies;
  // This step's such copies, before it attends: choice_copies at token 1; when serving, the
  // choices whose source finished its prompt in the step before.
  std::vector<std::pair<int, int>> shared;
  // Its hidden state's copy back from an MLP half computed on the CPU (experts_on_cpu): the next
  // sub-layer's compute waits for it.
  Ticket mlp_written;
  int slots() const { return int(seqs.size()); }
};

// Continuous batching (OffloadEngine::serve): a request admitted to slots of one GPU batch. Its
// first choice computes the prompt, in pieces within the step's token budget; the others copy
// those rows in the step after the last piece.
struct ServedRequest {
  const GenRequest* request = nullptr;
  size_t tag = 0;
  int batch = 0;
  std::vector<int> slots;  // in the batch, first choice first
  size_t computed = 0;     // prompt positions in the cache (copied or computed)
  bool prefilled = false;  // the prompt's last piece is in a step built so far
};

struct ServeState {
  std::function<Admission()> next;
  Admission waiting;  // next in line, when no batch has room for its n choices
  bool drained = false;
  std::vector<Sequence> seqs;                  // [batch * gbs + slot]
  std::vector<int> valid;                      // [batch * gbs + slot]: positions stored (or being stored)
  std::vector<std::vector<int>> free;          // [batch]: free slots, the lowest last
  std::deque<std::unique_ptr<ServedRequest>> live;  // in admission order
  std::vector<std::vector<std::pair<int, int>>> copies_next;  // [batch]: choice copies for the next step
  int64_t step_prompt_tokens = 0, step_decode_tokens = 0;   // this super-step's, over its batches
};

// Enqueues `copy` on the copy stream of `kind`, after `deps` on the device; its span on the stream.
Lane::Span enqueue_copy(Backend& be, CopyKind kind, const std::vector<Event>& deps, const std::function<void()>& copy);

// A host task's wait (disk I/O, CPU attention): the host cannot touch pinned memory until the
// copies before it end.
void wait_on_host(Backend& be, const std::vector<Event>& deps);

// A unit in one super-step of the schedule, at its GPU batch's token (0: prefill).
struct StepUnit {
  BatchState* state = nullptr;
  int token = 0;
};

}  // namespace engine_detail

using engine_detail::BatchState;
using engine_detail::enqueue_copy;
using engine_detail::wait_on_host;
using engine_detail::Held;
using engine_detail::Home;
using engine_detail::kPage;
using engine_detail::ServedRequest;
using engine_detail::ServeState;
using engine_detail::SlotRange;
using engine_detail::StepUnit;

struct OffloadEngine::Impl {
  ModelConfig cfg;
  Backend& be;
  OffloadOptions opt;
  PlanShape shape;
  PlacementPlan plan;
  DType dt;
  size_t esize;
  int L, gbs, ngb;

  // Tiers.
  Buffer gpu_mem;
  char* pinned_mem = nullptr;
  std::unique_ptr<DiskStore> disk;
  Region gpu, cpu;
  SlotPool w_gpu[2], w_pin[2];  // [half]: one slot each for a layer's attention and MLP tensors
  SlotPool c_gpu, c_pin, a_gpu, a_pin;
  DiskIoStats disk_at_start;

  // Homes.
  // A layer's block by kind (placement.h, layer_kinds): one for a model whose layers are alike,
  // the dense and the sparse kind for dense MLPs among experts (Qwen3-MoE's mlp_only_layers).
  struct LayerKind {
    HalvedLayout halves;         // attention tensors, then MLP tensors, each half page-aligned
    BlockLayout half_layout[2];  // each half's tensors, offsets from the half's start
    // Compressed weights, for steps too long for the fused linear: a half-layer dequantized once
    // per (token, sub-layer) and shared by all units of the block.
    BlockLayout fp_half_layout[2];
  };
  std::vector<LayerKind> kinds;
  const LayerKind& kind(int layer) const { return kinds[layer_kind(cfg, layer)]; }
  size_t half_bytes(int layer, int half) const {
    const HalvedLayout& h = kind(layer).halves;
    return half ? h.mlp_bytes : h.attn_bytes;
  }
  size_t largest_half(int half) const {
    size_t most = 0;
    for (const LayerKind& k : kinds) most = std::max(most, half ? k.halves.mlp_bytes : k.halves.attn_bytes);
    return most;
  }
  std::optional<quant::QuantSpec> weight_quant, cache_quant;  // the policy's compression
  char* dequant_mem = nullptr;
  LayerWeights dequantized;
  int dequant_token = -1, dequant_sub = -1;
  ModelWeights globals;  // embeddings, final norm, head, inv_freq and sinks; layers unused
  // The host copy of the sinks (GPT-OSS) as a table for attention delegated to the CPU.
  Tensor host_sinks() const {
    if (globals.attn_sinks_host.empty()) return Tensor();
    return Tensor(const_cast<float*>(globals.attn_sinks_host.data()), DType::F32, Device::CPU,
                  {cfg.n_layers, cfg.n_heads});
  }
  std::vector<std::array<Home, 2>> weight_home;       // [layer][half]: each half has its own home
  std::array<std::vector<LayerWeights>, 2> resident;  // [half][layer]: views of GPU-homed halves
  LayerWeights staged_weights;                // views of the layer being computed from a GPU buffer
  std::vector<std::vector<Home>> cache_home;  // [batch][layer]
  std::vector<Home> act_home;                 // [batch]
  size_t cache_half = 0;                      // bytes of K (or V) of one unit at home
  size_t cache_row = 0;                       // bytes of one position's K (or V), all kv heads
  size_t stage_half = 0;                      // bytes of K (or V) of a GPU cache staging slot

  // CPU attention: a pipeline stage on its own lane (docs/offload.md, "CPU attention"). Two sets of
  // buffers, taken in turn by the delegated steps, so one unit's q, k and v cross while the CPU
  // attends to the previous unit's: pinned q, k, v and output, and the output's GPU buffer.
  std::unique_ptr<Backend> cpu_backend_owned;
  Backend* cpu_attn = nullptr;
  struct AttentionBuffers {
    char *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;  // pinned
    char* out = nullptr;                                           // GPU
    Ticket host_free;  // the CPU's last attention over q, k, v (and its write of o)
    Ticket o_read;     // the copy of o to the GPU
    Ticket out_free;   // the compute that read out
  };
  std::array<AttentionBuffers, 2> attn_buf;
  int attn_turn = 0;
  Ticket qkv_read;  // the copy of the workspace's last q, k, v to the host
  // The attention block of a delegated step whose output projection is still to run: it runs
  // after the next unit's attention inputs (or before any other compute), so the GPU works while
  // the CPU attends (finish_delegated).
  struct PendingOutput {
    bool valid = false;
    LayerWeights w;           // the output projection's views
    Tensor x;                 // the unit's hidden state
    int buf = 0;              // attn_buf's
    Ticket out_ready;         // the output's copy to the GPU
    int release_weights = -1;  // the sub-layer whose weights to release after it (its last unit's)
    std::string label;        // the trace's
  } pending_output;
  Ticket finished;         // the compute stream's event after the last work of a step, done or deferred
  Ticket output_done;      // ... after the last deferred output projection
  bool prev_deferred = false;  // the previous step's output projection was deferred
  std::atomic<double> cpu_attention_seconds{0}, cpu_attention_bytes{0};  // OffloadReport's
  int64_t shared_prompt_tokens = 0;  // this block's prompt tokens copied from a shared prefix

  // Experts computed where they live (policy cpu_experts; docs/moe.md): a layer homed on the CPU
  // tier runs its MLP half (router and experts) on the CPU over its pinned home, on the CPU
  // attention lane; the hidden state crosses to the host and back instead of the half's weights.
  // Two pinned buffers of hidden rows, taken in turn, each free after its copy back.
  std::unique_ptr<ForwardOps> cpu_mlp_ops;  // on cpu_attn's backend, its workspace in pinned memory
  std::vector<LayerWeights> cpu_mlp_weights;  // [layer]: views of the MLP half at its CPU home
  struct MlpBuffers {
    char* rows = nullptr;  // pinned, the activation dtype
    Ticket free;           // its last copy back to the GPU
  };
  std::array<MlpBuffers, 2> mlp_buf;
  int mlp_turn = 0;
  char* mlp_f32 = nullptr;  // the rows widened to F32 for the CPU backend (only when dt is F16)
  std::atomic<double> cpu_experts_seconds{0};
  // A dense MLP among experts always moves: computing it on the CPU would read all of it there.
  bool experts_on_cpu(int t, int j) const {
    return cpu_mlp_ops && opt.policy.cpu_experts(t == 0) && plan.expert_tier[size_t(j)] == Tier::Cpu &&
           cfg.sparse_layer(j);
  }
  // Whether some unit of super-step i computes sub-layer jj on the GPU, so its weights move.
  bool gpu_computes(int i, int jj) const {
    if (jj % 2 == 0 || !cpu_mlp_ops) return true;
    for (int u = 0; u < n_units(i); ++u)
      if (!experts_on_cpu(token(i, u), jj / 2)) return true;
    return false;
  }
  // The routing of both ForwardOps (the GPU's and the CPU's).
  RoutingTotals routing_totals() const {
    return cpu_mlp_ops ? ops.routing_totals() + cpu_mlp_ops->routing_totals() : ops.routing_totals();
  }

  // Schedule.
  ForwardOps ops;
  // A half's GPU work replayed from a graph where its addresses and token count came before
  // (STRATA_CUDA_GRAPHS=0 turns it off); OffloadReport::graph_replays counts the replays.
  StepGraphs graphs;
  Trace trace;
  // The compute lane only times the compute stream's spans (the engine's thread enqueues them).
  std::unique_ptr<Lane> compute_lane, h2d, d2h, disk_lane, attn_lane;
  std::vector<Ticket> pending;  // tickets nobody waits for (stores): checked for failures as they resolve
  HostWaits waits;              // the engine thread's waits for the device and its lanes (OffloadReport's)
  // Test switches (STRATA_TEST_POISON_RELEASED, STRATA_TEST_SKIP_EVENT_WAIT; docs/offload.md, "Events"):
  // fill a released GPU slot with 0xFF after its last users; skip one event wait, to prove the
  // asynchronous tests can fail.
  bool poison_released = false;
  std::string skip_event_wait;
  std::atomic<uint64_t> bytes_dtoc{0}, bytes_ctog{0}, bytes_gtoc{0}, bytes_ctod{0};
  OffloadReport totals;
  CodesTally weight_codes;  // how the compressed layers were made at load
  int disk_ops_left = 0;  // fault injection countdown (disk thread only)

  // Per block, or per serve() call.
  std::unique_ptr<ServeState> served;                   // while serving (continuous batching)
  std::vector<BatchState> prefill_units, decode_units;  // the steps' sequence groups
  std::vector<std::vector<StepUnit>> step_units;        // [super-step]: what it computes, in order
  std::vector<Held> w_held;                 // [sub-layer]: 2 j for layer j's attention, 2 j + 1 its MLP
  std::vector<size_t> w_issued;             // [sub-layer]: bytes of its weight load issued so far
  std::vector<std::vector<Held>> c_held;    // [unit][layer]
  std::vector<std::vector<std::vector<Ticket>>> c_stored;  // [batch][layer]: stores a reload waits for
  std::vector<Held> a_held;                 // [unit]
  std::vector<Ticket> a_stored;             // [unit]: store of its hidden state
  std::vector<int> a_stored_layer;          // [unit]: the sub-layer whose output is at home ...
  std::vector<int> a_stored_token;          // [unit]: ... and the token it is for
  std::unique_ptr<StepSampler> sampler;
  // A request's choices in one GPU batch share the prefill of the first of them, their source.
  const Sequence* block_seqs = nullptr;
  std::vector<size_t> source_of;                // [sequence]: itself when it prefills
  std::vector<std::vector<Sequence*>> followers;  // [sequence]: the choices copying its prompt rows
  size_t index_of(const Sequence& s) const { return size_t(&s - block_seqs); }

  Impl(const ModelConfig& c, Backend& b, const OffloadOptions& o, const PlanShape& s)
      : cfg(c), be(b), opt(o), shape(s), dt(b.activation_dtype()), esize(dtype_size(dt)), L(c.n_layers),
        gbs(o.policy.gpu_batch_size), ngb(o.policy.num_gpu_batches), ops(cfg, b),
        graphs(b, cuda_graphs_allowed(), size_t(4 * L * ngb + 64)), trace(o.trace) {
    weight_quant = quant_spec(o.policy.compress_weights);
    cache_quant = quant_spec(o.policy.compress_kv_cache);
    cache_row = cache_quant ? size_t(cfg.n_kv_heads) * quant::row_bytes(*cache_quant, cfg.head_dim)
                            : size_t(cfg.kv_dim()) * esize;
  }

  ~Impl() {
    // Lanes first: they may still touch the regions; then the device's queued work.
    h2d.reset();
    d2h.reset();
    disk_lane.reset();
    attn_lane.reset();
    compute_lane.reset();
    try {
      be.synchronize();
    } catch (...) {  // a destructor must not throw; the failure was reported where it happened
    }
    if (pinned_mem) be.free_host(pinned_mem);
  }

  // ---------------------------------------------------------------- setup
  void reserve();

  Home place(Tier tier, size_t bytes, const char* what);

  void load_weights(const WeightSource& src);

  void place_cache_and_activations();

  // Called on the disk thread before each I/O of the schedule.
  void before_disk_io(bool write) {
    if (opt.fault == DiskFault::None || (opt.fault == DiskFault::DiskFull) != write) return;
    if (--disk_ops_left == 0) disk->inject_fault(opt.fault);
  }

  void start_lanes();
  // The CPU backend that delegated work (attention, experts) runs on: the engine's own on the CPU
  // backend, else one made for it.
  void use_cpu_backend();

  // ---------------------------------------------------------------- events
  // The event a ticket resolves to; counts the engine thread's wait when the lane has not got
  // there yet (a disk read still running, or the lane behind).
  Event await(const Ticket& t);
  // The compute stream's next work waits for `t` (on the device: the host goes on).
  void compute_after(const Ticket& t);
  void compute_after(const std::vector<Ticket>& ts) {
    for (const Ticket& t : ts) compute_after(t);
  }
  // The compute stream's event after the work enqueued so far.
  Ticket compute_done() { return ready_ticket(be.record(Stream::Compute)); }
  // True when the test switch STRATA_TEST_SKIP_EVENT_WAIT names this wait (start_lanes notes it on stderr).
  bool skipped(const char* wait) const { return !skip_event_wait.empty() && skip_event_wait == wait; }
  // Returns a held unit's slots to their pools, each free once its last users' tickets have
  // resolved and their events are done. A GPU slot is poisoned then under STRATA_TEST_POISON_RELEASED.
  void release_held(const Held& h, SlotPool& gpu_pool, SlotPool& pinned_pool, const std::vector<Ticket>& gpu_after,
                    const std::vector<Ticket>& pinned_after);
  void release_slot(SlotPool& pool, int slot, std::vector<Ticket> after, bool device);
  // Checks the pending tickets that have resolved; a failed store is reported here.
  void check_pending();

  // ---------------------------------------------------------------- transfers
  // Copies rows of every slot of a cache tensor between a home and a GPU slot.
  size_t cache_row_bytes() const { return cache_row; }
  size_t slot_pitch() const { return size_t(shape.capacity()) * cache_row_bytes(); }

  // The GPU staging slot holds the unit's slots from its first; the host unit is the whole batch's.
  Ticket copy_cache(CopyKind kind, char* gpu_unit, char* host_unit, SlotRange r, const BatchState& b,
                    std::vector<Ticket> deps);

  // Disk I/O of the pages covering positions `r` of the unit's slots of a cache unit.
  Ticket disk_cache_io(bool write, size_t disk_offset, char* pinned_unit, SlotRange r, const BatchState& b,
                       std::vector<Ticket> deps);

  Ticket disk_io(bool write, size_t disk_offset, char* pinned, size_t bytes, const char* what, std::vector<Ticket> deps);

  Ticket copy_flat(CopyKind kind, char* dst, const char* src, size_t bytes, const char* what, std::vector<Ticket> deps);

  // ---------------------------------------------------------------- units
  // Super-step i computes, in each sub-layer, units(i): the prefill units of the GPU batches that
  // start in it and the decode units of those started before, each at its own token.
  // Serving, every super-step i computes each GPU batch's unit at "token" i + 1: all decode-like.
  BatchState& unit(int i, int u) { return served ? decode_units[size_t(u)] : *step_units[size_t(i)][size_t(u)].state; }
  const BatchState& unit(int i, int u) const {
    return served ? decode_units[size_t(u)] : *step_units[size_t(i)][size_t(u)].state;
  }
  int token(int i, int u) const { return served ? i + 1 : step_units[size_t(i)][size_t(u)].token; }
  int n_units(int i) const { return served ? ngb : int(step_units[size_t(i)].size()); }

  // Cache entries that exist before the unit's token t, those its step reads in `layer`.
  SlotRange load_range(int i, int u, int layer) const;
  SlotRange store_range(int i, int u) const;  // cache entries token t writes (union over slots)
  // Decode attention on the CPU where the cache lives off the GPU: in place on the CPU tier, over
  // its pinned mirror for disk homes. The cache never crosses to the GPU then.
  // `t` is the unit's token: 0 in prefill.
  bool delegated(int t, int j) const {
    return opt.policy.cpu_attention && t > 0 && plan.cache_tier[size_t(j)] != Tier::Gpu;
  }
  bool cache_moves(int t, int j) const { return plan.cache_tier[size_t(j)] != Tier::Gpu && !delegated(t, j); }
  bool mirrored(int t, int j) const { return delegated(t, j) && plan.cache_tier[size_t(j)] == Tier::Disk; }

  // Loads sub-layer jj's weights (half jj % 2 of layer jj / 2: 0 attention, 1 MLP) up to the end
  // of part `part` of `parts` (disk -> pinned -> GPU; the first call takes the buffers). The step
  // of unit u of sub-layer jj - 1 issues part u of n_units, so a sub-layer's load is spread over
  // the steps of the units before it and each waits only for its share (docs/offload.md, "One
  // step"). Returns the new part's ticket, invalid when nothing was issued; w_held[jj].ready
  // always covers every part issued (each part waits for the one before).
  Ticket load_weights_async(int jj, int part = 0, int parts = 1);

  // The GPU buffer is free after `readers` (the compute that used it), the pinned one after the
  // load's copies.
  void release_weights(int jj, const std::vector<Ticket>& readers);

  // Brings unit u's cache of layer j to where token i uses it: a GPU staging slot (through a
  // pinned mirror for disk homes), or, when the CPU attends to a disk home, the mirror alone.
  void load_cache_async(int i, int j, int u);

  // Moves the entries token i wrote back home (after `computed`, the step that wrote them) and
  // releases the unit's slots after the store.
  void store_cache(int i, int j, int u, const Ticket& computed);

  size_t act_bytes(int i, int u) const { return unit(i, u).step.tokens.size() * size_t(cfg.hidden) * esize; }

  // Loads unit u's hidden state (the input of sub-layer jj) into a staging slot, after its store.
  void load_act_async(int i, int jj, int u);

  void store_act(int i, int jj, int u, const Ticket& computed);

  // ---------------------------------------------------------------- compute
  // Sub-layer jj's weights on the GPU; a staged half has only that half's tensors.
  const LayerWeights& weights_for(int jj);

  // Sub-layer jj's compressed weights dequantized, once for token i's pass over the block.
  const LayerWeights& dequantized_for(int i, int jj);

  Tensor hidden_for(int i, int jj, int u, int64_t T);

  // The unit's slots of layer j's cache on the GPU: a view of its home, or its staging slot.
  std::pair<Tensor, Tensor> cache_for(int i, int j, int u);

  // The unit's slots of a cache tensor at `base`, as stored (quantized rows when compressed).
  Tensor cache_view(char* base, const BatchState& b, Device device) const;

  // Attention on the CPU over the cache in pinned memory (its home, or a disk home's mirror): q, k,
  // v cross to the host on the gpu->cpu lane, the CPU attention lane attends, the output crosses
  // back on the cpu->gpu lane; returns the output's ticket. Nothing here waits on the host.
  Ticket attend_on_cpu(int i, int u, int j, const AttentionInputs& in, int buf);
  // Enqueues the pending delegated step's output projection, if any.
  void finish_delegated();
  // Sub-layer jj's MLP half for rows x of unit u's step (tokens [t0, t0 + rows)) on the CPU: x
  // crosses to the host, the CPU lane computes x += MLP(x) over the half's CPU home, x crosses
  // back. Returns the copy back's ticket. Nothing here waits on the host.
  Ticket mlp_on_cpu(int i, int jj, int u, const Tensor& x, int64_t t0);

  // Token 1, before attending: copies each follower's prompt keys and values from its source's
  // slot, in the unit's cache rows wherever they are (K at k_base, V at v_base, slots a pitch apart).
  template <typename Copy>
  void share_prompt_rows(const BatchState& b, char* k_base, char* v_base, Copy copy) const {
    for (const auto& [dst, src] : b.shared) {
      const size_t bytes = b.seqs[size_t(dst)]->request->prompt.size() * cache_row_bytes();
      for (char* base : {k_base, v_base})
        copy(base + size_t(dst) * slot_pitch(), base + size_t(src) * slot_pitch(), bytes);
    }
  }

  // Which prompts of a prefill unit share a beginning (indices are the unit's slots). Prompts that
  // are scored whole (perplexity) and choices that copy their source's rows take no part.
  std::vector<SharedPrefix> plan_unit_sharing(const BatchState& b) const;

  // In prefill, the prompts computed whole go first and those sharing a beginning after them, each
  // copying its source's rows in the step (PrefixCopy).
  void build_step(int i, int u);

  // Sub-layer jj (layer jj / 2's attention block when even, its MLP block when odd) for unit u;
  // true when its output projection is deferred (a delegated attention: finish_delegated).
  bool compute(int i, int jj, int u);
  // A half the GPU computes from `w` over the unit's rows x (and the cache views, for attention),
  // sub-layer 0 embedding first; through `graphs` where `graphable` (docs/offload.md, "Graphs").
  void gpu_half(int jj, const LayerWeights& w, const Tensor& x, const Tensor& ck, const Tensor& cv, bool graphable);

  // Prefill's last sub-layer: the next-token NLL of every prompt position of the unit's sequences
  // that asked for it, through the head a workspace's worth of rows at a time (host reduction).
  void score_prompts(const BatchState& b, const Tensor& x, int64_t T);
  std::unique_ptr<RowScorer> row_scorer;  // score_prompts' rows, made on first use

  // Tokens [t0, t1) of a step, without logit rows (compute() selects them over the whole step).
  // Only a unit of one prompt runs in pieces (a unit of several fits a step: PrefillSteps), and
  // one prompt shares with no other, so prefix copies come with whole steps only.
  static StepBatch slice(const StepBatch& s, int64_t t0, int64_t t1);

  // ---------------------------------------------------------------- the schedule
  // Whether two units hold some of the same cache and hidden-state rows at one sub-layer.
  bool same_rows(int i, int u, int jj, int ni, int nu, int njj) const {
    const BatchState &a = unit(i, u), &b = unit(ni, nu);
    return jj == njj && a.batch == b.batch && a.first_slot < b.first_slot + b.slots() &&
           b.first_slot < a.first_slot + a.slots();
  }

  // One step of Algorithm 1: prefetch the next sub-layer's weights, store the previous step's
  // cache and hidden state, load the next step's, compute this one, then wait for all of it. A
  // step is (super-step i, sub-layer jj, unit u): the sub-layers are each layer's attention block
  // and its MLP block (FlexGen's "layers"), so a layer's weights stream half by half; the units
  // are, in prefill, groups of a GPU batch's sequences, in decode the GPU batches. Without a
  // staggered prefill super-step i is token i of every batch.
  void step(int i, int jj, int u, int n_steps, bool has_prev, int pi, int pjj, int pu);

  // Groups the block's sequences into the decode units (one per GPU batch) and the prefill units
  // (plan.prefill_seqs consecutive sequences of one batch each). `seqs` lists the batches' sequences
  // in turn, batch k's at [batch_begin[k], batch_begin[k + 1]), slot by slot. A request's choices in
  // one batch follow the first of them, their source: only it prefills, they copy its prompt rows at
  // token 1 within the batch's cache home (or its staging slot), which no other batch's schedule touches.
  void build_units(std::vector<Sequence>& seqs, const std::vector<size_t>& batch_begin);

  // The block's super-steps: GPU batch k prefills in super-step policy.start_step(k) (0 for all
  // without a staggered prefill) and decodes its n_tokens - 1 tokens in the super-steps after.
  // Each super-step lists its units in batch order, each at its batch's own token. Returns the
  // number of super-steps.
  int build_step_units(int n_tokens);

  std::vector<GenResult> generate(const std::vector<GenRequest>& requests, GenStats* stats);

  // The per-block (or per-serve) state of the schedule: held units, stores, the sampler.
  void reset_schedule_state(size_t units);

  // Continuous batching (engine_serve.cpp).
  void serve(const std::function<Admission()>& next, const std::function<void(size_t, std::vector<GenResult>)>& finished,
             GenStats* stats);
  // Fills batch k's free slots with waiting requests, in order.
  void admit(int k, GenStats& stats);
  // Serving: batch u's step of super-step i, decode tokens first, then prompt pieces in admission
  // order within the step's token budget.
  void build_served_step(int i, int u);
  // The longest beginning of `l`'s prompt that an earlier request of its batch shares; `ready`:
  // those rows are stored, so it copies them now (else it waits for them).
  std::pair<int, int> share_source(const ServedRequest& l, bool& ready) const;
  // Hands each request whose choices have all ended to `finished` and frees its slots.
  void report_served(const std::function<void(size_t, std::vector<GenResult>)>& finished, GenStats& stats);

  // Busy seconds so far of the compute, cpu->gpu, gpu->cpu and disk lanes; after settle_lanes(),
  // of everything enqueued.
  std::array<double, 4> lane_busy() const {  // (the CPU attention lane is reported apart)
    return {compute_lane->busy_seconds(), h2d->busy_seconds(), d2h->busy_seconds(), disk_lane->busy_seconds()};
  }
  void add_prefill_busy(const std::array<double, 4>& before, const std::array<double, 4>& after) {
    totals.prefill_compute_busy += after[0] - before[0];
    totals.prefill_h2d_busy += after[1] - before[1];
    totals.prefill_d2h_busy += after[2] - before[2];
    totals.prefill_disk_busy += after[3] - before[3];
  }
  // The engine thread's waits so far: for the device (the backend's count) and for its lanes.
  HostWaits host_waits() const {
    HostWaits w = this_thread_host_waits();
    w.count += waits.count;
    w.seconds += waits.seconds;
    return w;
  }
  void settle_lanes() {
    for (Lane* l : {compute_lane.get(), h2d.get(), d2h.get(), disk_lane.get(), attn_lane.get()}) l->settle();
  }

  // Waits for anything in flight and frees every slot (units prefetched for a token that never
  // ran, or held when an error stopped the block).
  void release_all();
};

}  // namespace strata
