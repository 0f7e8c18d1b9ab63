// The offloading engine's steps: the inputs and cache views of one (token, layer, unit) step, its
// compute (attention on the GPU or delegated to the CPU, prompt sharing, scoring), and the block
// schedule that orders steps and transfers (generate).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "engine_impl.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// One choice of one request, as placed in a GPU batch.
struct Choice {
  size_t request = 0;
  int choice = 0;
};

// Lays a block's choices out in its GPU batches, at most gbs each. A request's choices share one
// prefill only within a batch, so each request whose choices fit in one batch goes whole into the
// first batch with room for it (first fit, in request order: the job hands blocks sorted by prompt
// length, so batches stay near in length). Choices that fit no batch whole (a request of more than
// gbs, or room split by earlier requests) fill the free slots in batch order; those prefill once
// per batch they reach.
std::vector<std::vector<Choice>> pack_choices(const std::vector<GenRequest>& requests, int gbs, int ngb) {
  std::vector<std::vector<Choice>> batches(static_cast<size_t>(ngb));
  std::vector<size_t> unplaced;
  for (size_t r = 0; r < requests.size(); ++r) {
    const int n = requests[r].n;
    auto room = [&](const std::vector<Choice>& b) { return int(b.size()) + n <= gbs; };
    const auto it = std::find_if(batches.begin(), batches.end(), room);
    if (it == batches.end()) {
      unplaced.push_back(r);
      continue;
    }
    for (int c = 0; c < n; ++c) it->push_back({r, c});
  }
  size_t k = 0;
  for (size_t r : unplaced)
    for (int c = 0; c < requests[r].n; ++c) {
      while (int(batches[k].size()) == gbs) ++k;  // the caller checked that the block holds them all
      batches[k].push_back({r, c});
    }
  return batches;
}

}  // namespace

const LayerWeights& OffloadEngine::Impl::weights_for(int jj) {
  const int j = jj / 2, half = jj % 2;
  if (plan.half_tier(j, half) == Tier::Gpu) return resident[size_t(half)][size_t(j)];
  load_weights_async(jj);  // no-op when prefetched
  Held& h = w_held[size_t(jj)];
  if (!skipped("weights")) compute_after(h.ready);
  staged_weights = layer_views(kind(j).half_layout[half], w_gpu[half].data(h.gpu), be.device());
  return staged_weights;
}

const LayerWeights& OffloadEngine::Impl::dequantized_for(int i, int jj) {
  if (dequant_token == i && dequant_sub == jj) return dequantized;
  dequant_token = dequant_sub = -1;  // stale until the kernels below are enqueued
  dequantized = dequantized_views(weights_for(jj), kind(jj / 2).fp_half_layout[jj % 2], dequant_mem, be);
  dequant_token = i, dequant_sub = jj;
  return dequantized;
}

Tensor OffloadEngine::Impl::hidden_for(int i, int jj, int u, int64_t T) {
  BatchState& b = unit(i, u);
  if (b.mlp_written.valid()) {  // the MLP half before this sub-layer ran on the CPU
    if (!skipped("cpu experts output")) compute_after(b.mlp_written);
    b.mlp_written = Ticket();
  }
  const Home& home = act_home[size_t(b.batch)];
  char* p = nullptr;
  if (home.tier == Tier::Gpu) {
    p = home.ptr + b.act_offset;
  } else {
    Held& h = a_held[size_t(u)];
    if (jj == 0) {
      STRATA_CHECK(!h.valid, "internal: unit " << u << " holds a hidden state at sub-layer 0");
      h.valid = true;
      h.layer = 0;
      h.gpu = a_gpu.acquire();
      compute_after(a_gpu.free_after(h.gpu));  // the embedding writes it
    } else {
      load_act_async(i, jj, u);
      STRATA_CHECK(h.valid && h.layer == jj, "internal: hidden state of unit " << u << " for sub-layer " << jj << " missing");
      compute_after(h.ready);
    }
    p = a_gpu.data(h.gpu);
  }
  return Tensor(p, dt, be.device(), {T, cfg.hidden});
}

std::pair<Tensor, Tensor> OffloadEngine::Impl::cache_for(int i, int j, int u) {
  const BatchState& b = unit(i, u);
  const Home& home = cache_home[size_t(b.batch)][size_t(j)];
  char *k_ptr = home.ptr + size_t(b.first_slot) * slot_pitch(), *v_ptr = k_ptr + cache_half;
  if (home.tier != Tier::Gpu) {
    load_cache_async(i, j, u);
    Held& h = c_held[size_t(u)][size_t(j)];
    STRATA_CHECK(h.token == i, "internal: kv cache of layer " << j << " unit " << u << " loaded for token " << h.token
                                                              << ", needed for token " << i);
    compute_after(h.ready);
    compute_after(c_gpu.free_after(h.gpu));  // a prefill writes a slot no copy filled
    k_ptr = c_gpu.data(h.gpu);
    v_ptr = k_ptr + stage_half;
  }
  return {cache_view(k_ptr, b, be.device()), cache_view(v_ptr, b, be.device())};
}

Tensor OffloadEngine::Impl::cache_view(char* base, const BatchState& b, Device device) const {
  if (cache_quant)
    return Tensor::quantized(base, quant::dtype_of(*cache_quant), cache_quant->group_size, device,
                             {b.slots(), shape.capacity(), cfg.n_kv_heads, cfg.head_dim});
  return Tensor(base, dt, device, {b.slots(), shape.capacity(), cfg.n_kv_heads, cfg.head_dim});
}

Ticket OffloadEngine::Impl::attend_on_cpu(int i, int u, int j, const AttentionInputs& in, int buf) {
  AttentionBuffers& a = attn_buf[size_t(buf)];
  const BatchState& b = unit(i, u);
  const Home& home = cache_home[size_t(b.batch)][size_t(j)];
  const int64_t T = in.q.dim(0);
  // q, k and v cross after the compute that made them, into host buffers the CPU is done with.
  char *q_host = a.q, *k_host = a.k, *v_host = a.v, *o_host = a.o;
  const Tensor q = in.q, k = in.k, v = in.v;
  const Ticket copied = d2h->submit(
      "attention inputs", [=, this](const std::vector<Event>& events) {
        return enqueue_copy(be, CopyKind::DeviceToHost, events, [&] {
          be.copy_async(CopyKind::DeviceToHost, q_host, q.data, q.nbytes());
          be.copy_async(CopyKind::DeviceToHost, k_host, k.data, k.nbytes());
          be.copy_async(CopyKind::DeviceToHost, v_host, v.data, v.nbytes());
          bytes_gtoc += q.nbytes() + k.nbytes() + v.nbytes();
        });
      },
      {compute_done(), a.host_free});
  qkv_read = copied;
  // The cache it attends: its CPU home after the last stores into it, or a disk home's pinned
  // mirror after the disk lane read it. o is free once its last copy to the GPU is done.
  std::vector<Ticket> deps{a.o_read};
  if (!skipped("cpu attention inputs")) deps.push_back(copied);
  char* unit_base = home.ptr;
  if (home.tier == Tier::Disk) {
    load_cache_async(i, j, u);
    Held& h = c_held[size_t(u)][size_t(j)];
    STRATA_CHECK(h.valid && h.token == i, "internal: kv cache mirror of layer " << j << " unit " << u << " missing");
    deps.push_back(h.ready);
    if (!h.read) {  // nothing was stored to read (a served batch starting over): the mirror's last users
      const std::vector<Ticket>& free = c_pin.free_after(h.pin);
      deps.insert(deps.end(), free.begin(), free.end());
    }
    unit_base = c_pin.data(h.pin);
  } else {
    const std::vector<Ticket>& stored = c_stored[size_t(b.batch)][size_t(j)];
    deps.insert(deps.end(), stored.begin(), stored.end());
  }
  char* base = unit_base + size_t(b.first_slot) * slot_pitch();
  // What the task needs of the step, by value: the engine builds the unit's next step meanwhile.
  struct RowCopy {
    size_t dst, src, bytes;
  };
  std::vector<RowCopy> shared_rows;
  share_prompt_rows(b, base, base + cache_half, [&](char* d, const char* s, size_t n) {
    shared_rows.push_back({size_t(d - base), size_t(s - base), n});
  });
  // Serving: a newcomer's prompt beginning, copied from an earlier request's slot (ForwardOps does
  // this for attention on the GPU).
  for (const PrefixCopy& c : b.step.prefix_copies)
    for (const size_t half : {size_t(0), cache_half})
      shared_rows.push_back({half + size_t(c.dst) * slot_pitch(), half + size_t(c.src) * slot_pitch(),
                             size_t(c.length) * cache_row_bytes()});
  const Tensor ck = cache_view(base, b, Device::CPU), cv = cache_view(base + cache_half, b, Device::CPU);
  std::vector<int32_t> slots = b.step.slots, positions = b.step.positions;
  double bytes_read = 0;
  for (int32_t p : positions) bytes_read += double(p + 1) * 2.0 * double(cache_row_bytes());
  const Ticket attended = attn_lane->submit(
      "attention", [=, this](const std::vector<Event>& events) {
        wait_on_host(be, events);
        const auto t0 = Clock::now();
        auto host = [&](void* p, std::initializer_list<int64_t> dims) { return Tensor(p, dt, Device::CPU, dims); };
        const Tensor slots_t(const_cast<int32_t*>(slots.data()), DType::I32, Device::CPU, {T});
        const Tensor pos_t(const_cast<int32_t*>(positions.data()), DType::I32, Device::CPU, {T});
        cpu_attn->kv_store(host(k_host, {T, cfg.n_kv_heads, cfg.head_dim}),
                           host(v_host, {T, cfg.n_kv_heads, cfg.head_dim}), ck, cv, slots_t, pos_t);
        // After the step's own rows: a source may store the rows it lends in this very step.
        for (const RowCopy& c : shared_rows) std::memcpy(base + c.dst, base + c.src, c.bytes);
        cpu_attn->attention(host(q_host, {T, cfg.n_heads, cfg.head_dim}), ck, cv, slots_t, pos_t,
                            layer_attention(cfg, Tensor(), host_sinks(), j).spec,
                            host(o_host, {T, cfg.n_heads, cfg.head_dim}));
        cpu_attention_seconds += seconds_since(t0);
        cpu_attention_bytes += bytes_read;
        return Lane::Span{};
      },
      std::move(deps));
  a.host_free = attended;
  a.o_read = copy_flat(CopyKind::HostToDevice, a.out, a.o, size_t(T) * size_t(cfg.q_dim()) * esize, "attention output",
                       {attended, a.out_free});
  return a.o_read;
}

Ticket OffloadEngine::Impl::mlp_on_cpu(int i, int jj, int u, const Tensor& x, int64_t t0) {
  MlpBuffers& m = mlp_buf[size_t(mlp_turn)];
  mlp_turn ^= 1;
  const BatchState& b = unit(i, u);
  const int64_t T = x.dim(0);
  const size_t bytes = x.nbytes();
  char* rows = m.rows;
  const Ticket copied =
      copy_flat(CopyKind::DeviceToHost, rows, static_cast<const char*>(x.data), bytes, "experts input", {compute_done(), m.free});
  // What the task needs of the step, by value: the engine builds the next steps meanwhile.
  const StepBatch step = slice(b.step, t0, t0 + T);
  const int slots = b.slots();
  const LayerWeights* w = &cpu_mlp_weights[size_t(jj / 2)];
  const Ticket computed = attn_lane->submit(
      "experts", [=, this](const std::vector<Event>& events) {
        wait_on_host(be, events);
        const auto start = Clock::now();
        // The CPU backend computes in F32: fp16 rows are widened and narrowed around the half.
        Tensor xf(dt == DType::F32 ? static_cast<void*>(rows) : static_cast<void*>(mlp_f32), DType::F32, Device::CPU,
                  {T, cfg.hidden});
        if (dt != DType::F32) convert_elements(rows, dt, mlp_f32, DType::F32, size_t(T * cfg.hidden));
        cpu_mlp_ops->begin_step(step, slots, shape.capacity());
        cpu_mlp_ops->mlp_block(*w, xf);
        if (dt != DType::F32) convert_elements(mlp_f32, DType::F32, rows, dt, size_t(T * cfg.hidden));
        cpu_experts_seconds += seconds_since(start);
        return Lane::Span{};
      },
      {copied});
  m.free = copy_flat(CopyKind::HostToDevice, static_cast<char*>(x.data), rows, bytes, "experts output", {computed});
  return m.free;
}

void OffloadEngine::Impl::finish_delegated() {
  PendingOutput& p = pending_output;
  if (!p.valid) return;
  p.valid = false;
  AttentionBuffers& a = attn_buf[size_t(p.buf)];
  compute_after(p.out_ready);
  const auto host_start = Clock::now();
  Lane::Span span{be.record(Stream::Compute), Event()};
  const int64_t T = p.x.dim(0);
  ops.attention_output(p.w, p.x, Tensor(a.out, dt, be.device(), {T, cfg.n_heads, cfg.head_dim}));
  span.end = be.record(Stream::Compute);
  compute_lane->record_span(p.label, std::move(span), host_start, Clock::now());
  a.out_free = finished = output_done = compute_done();
  if (p.release_weights >= 0) release_weights(p.release_weights, {output_done});
}

std::vector<SharedPrefix> OffloadEngine::Impl::plan_unit_sharing(const BatchState& b) const {
  std::vector<const std::vector<int32_t>*> prompts(b.seqs.size(), nullptr);
  for (size_t s = 0; s < b.seqs.size() && opt.share_prefixes; ++s) {
    const Sequence& seq = *b.seqs[s];
    if (!seq.done && source_of[index_of(seq)] == index_of(seq) && seq.request->prompt_logprobs < 0)
      prompts[s] = &seq.request->prompt;
  }
  return plan_shared_prefixes(prompts, opt.prefix_sharing);
}

void OffloadEngine::Impl::build_step(int i, int u) {
  if (served) return build_served_step(i, u);
  BatchState& b = unit(i, u);
  const bool prefill = token(i, u) == 0;
  b.step = StepBatch();
  b.active.clear();
  b.sampled.clear();
  b.advancing.clear();
  b.prompt_done.clear();
  b.prompt_start.clear();
  b.scored.clear();
  b.shared = token(i, u) == 1 ? b.choice_copies : std::vector<std::pair<int, int>>();
  const std::vector<SharedPrefix> share = prefill ? plan_unit_sharing(b) : std::vector<SharedPrefix>();
  std::vector<size_t> order;  // slots; in prefill those computed whole first
  for (int pass = 0; pass < 2; ++pass)
    for (size_t s = 0; s < b.seqs.size(); ++s)
      if (prefill ? (share[s].source >= 0) == (pass == 1) : pass == 0) order.push_back(s);
  for (const size_t s : order) {
    Sequence& seq = *b.seqs[s];
    if (seq.done) continue;
    if (prefill && source_of[index_of(seq)] != index_of(seq)) continue;  // its source's prefill samples it
    if (prefill) {
      const std::vector<int32_t>& prompt = seq.request->prompt;
      const int start = share[s].length;
      if (start > 0) b.step.prefix_copies.push_back({share[s].source, int32_t(s), start});
      if (seq.request->prompt_logprobs >= 0)
        b.scored.push_back({&seq, int32_t(b.step.tokens.size()), 0, int(prompt.size())});
      for (size_t p = size_t(start); p < prompt.size(); ++p) {
        b.step.tokens.push_back(prompt[p]);
        b.step.positions.push_back(int32_t(p));
        b.step.slots.push_back(int32_t(s));
      }
      b.prompt_start.push_back(start);
    } else {
      b.step.tokens.push_back(seq.next_token);
      b.step.positions.push_back(seq.length);
      b.step.slots.push_back(int32_t(s));
    }
    b.step.logit_rows.push_back(int32_t(b.step.tokens.size() - 1));
    b.active.push_back(&seq);
    b.sampled.push_back(&seq);
    (prefill ? b.prompt_done : b.advancing).push_back(&seq);
    if (!prefill) continue;
    totals.prefill_tokens += int64_t(seq.request->prompt.size()) - b.prompt_start.back();
    shared_prompt_tokens += b.prompt_start.back();
    for (Sequence* f : followers[index_of(seq)]) {  // the same last prompt row, each its own sampler
      b.step.logit_rows.push_back(b.step.logit_rows.back());
      b.sampled.push_back(f);
      b.prompt_done.push_back(f);
    }
  }
}

namespace {

// The trace's name of a step: "t3 L7a B1" (token, layer, attention or MLP, GPU batch), and the
// first slot of a prefill unit ("t0 L0m B0 s4").
std::string step_label(int t, int j, bool attention, const BatchState& b) {
  std::string s = "t";  // appends only: GCC 12 warns (-Wrestrict, falsely) on "t" + std::to_string(t) here
  s += std::to_string(t);
  s += " L";
  s += std::to_string(j);
  s += attention ? "a B" : "m B";
  s += std::to_string(b.batch);
  if (t == 0) {
    s += " s";
    s += std::to_string(b.first_slot);
  }
  return s;
}

}  // namespace

bool OffloadEngine::Impl::compute(int i, int jj, int u) {
  BatchState& b = unit(i, u);
  const int j = jj / 2, t = token(i, u);
  const bool attention = jj % 2 == 0;
  const bool cpu = attention && delegated(t, j) && !b.active.empty();
  if (b.active.empty()) return false;
  const auto host_start = Clock::now();
  Lane::Span span{be.record(Stream::Compute), Event()};
  const int64_t T = int64_t(b.step.tokens.size());
  const bool cpu_mlp = !attention && experts_on_cpu(t, j);
  const LayerWeights& w = cpu_mlp ? cpu_mlp_weights[size_t(j)]
                          : weight_quant && T > be.fused_dequant_max_tokens() ? dequantized_for(i, jj)
                                                                               : weights_for(jj);
  const Tensor x = hidden_for(i, jj, u, T);
  Ticket mlp_written;  // cpu_mlp: the last piece's copy back (the copies back run in order)
  Tensor ck, cv;
  if (attention && !cpu) std::tie(ck, cv) = cache_for(i, j, u);
  if (attention && !cpu && !b.shared.empty())
    share_prompt_rows(b, static_cast<char*>(ck.data), static_cast<char*>(cv.data),
                      [this](char* d, const char* s, size_t n) { be.copy_on_device(d, s, n); });
  // Steps of at most the workspace's tokens: a group whose prompts outgrow it runs in pieces, in
  // order, so each piece finds the earlier pieces' keys in the cache.
  const int64_t step_max = ops.max_tokens();
  STRATA_CHECK(!cpu || T <= step_max, "internal: a delegated decode step of " << T << " tokens is split");
  if (cpu) compute_after(qkv_read);  // the workspace's q, k, v of the last delegated step have crossed
  for (int64_t t0 = 0; t0 < T; t0 += step_max) {
    const int64_t t1 = std::min(T, t0 + step_max);
    // (The CPU's half begins its own step: the GPU's indices would go unread.)
    if (!cpu_mlp) ops.begin_step(slice(b.step, t0, t1), b.slots(), shape.capacity());
    const Tensor xs = x.rows(t0, t1 - t0);
    if (!cpu && !cpu_mlp) {
      gpu_half(jj, w, xs, ck, cv, T <= step_max && b.step.prefix_copies.empty());
      continue;
    }
    if (jj == 0) ops.embed(globals, xs);
    if (cpu_mlp) {
      mlp_written = mlp_on_cpu(i, jj, u, xs, t0);
    } else {
      const int buf = attn_turn;
      attn_turn ^= 1;
      const AttentionInputs in = ops.attention_inputs(w, layer_attention(cfg, globals.inv_freq, globals.attn_sinks, j), xs);
      // The span ends before the attention: on the CPU backend it runs inline, timed by its own lane.
      span.end = be.record(Stream::Compute);
      compute_lane->record_span(step_label(t, j, attention, b), std::move(span), host_start, Clock::now());
      const Ticket out_ready = attend_on_cpu(i, u, j, in, buf);
      finish_delegated();  // the previous unit's, while the CPU attends to this one
      LayerWeights out_proj;  // views of the output projection: all the deferred half reads
      out_proj.o_w = w.o_w;
      out_proj.o_b = w.o_b;
      out_proj.post_attn_norm_w = w.post_attn_norm_w;  // Gemma's norm of the projection's output
      pending_output = {true, std::move(out_proj), xs, buf, out_ready, -1, step_label(t, j, attention, b) + " out"};
      return true;  // one piece: a delegated step is never split
    }
  }
  if (cpu_mlp && jj == 2 * L - 1) compute_after(mlp_written);  // the head reads it now
  else if (cpu_mlp) b.mlp_written = mlp_written;
  if (jj == 2 * L - 1) {
    if (!b.scored.empty()) score_prompts(b, x, T);
    for (Sequence* s : b.prompt_done) s->length = int(s->request->prompt.size());
    for (Sequence* s : b.advancing) ++s->length;
    if (!b.sampled.empty()) {  // serving, a step may carry only a piece of a prompt
      ops.select_logit_rows(b.step.logit_rows, T);
      const Tensor logits = ops.head(globals, x);
      sampler->sample(logits, b.sampled);  // the host waits for the tokens: stop and eos checks
    }
  }
  span.end = be.record(Stream::Compute);
  compute_lane->record_span(step_label(t, j, attention, b), std::move(span), host_start, Clock::now());
  // The hidden state's store (offloaded activations) waits for the CPU's result.
  finished = cpu_mlp && jj != 2 * L - 1 ? mlp_written : compute_done();
  return false;
}

// A graph's key holds what its capture fixes: which half (and whether it embeds first), the token
// count, the unit's rows and cache views, and the addresses of the half's weights: a resident
// layer's own, or a GPU buffer's, which every layer passing through that buffer shares (so one
// graph serves them all; the buffer's contents arrive before the replay, as before the launches).
// What a step changes (ids, positions, slots) is uploaded outside it by begin_step. Eager: a step
// in pieces or copying prompt rows between slots (their addresses vary), and a sparse layer's MLP
// routed on the host (it reads the router's logits mid-step; ForwardOps::routes_on_device).
void OffloadEngine::Impl::gpu_half(int jj, const LayerWeights& w, const Tensor& x, const Tensor& ck, const Tensor& cv,
                                   bool graphable) {
  const bool attention = jj % 2 == 0;
  auto work = [&] {
    if (jj == 0) ops.embed(globals, x);
    if (attention) ops.attention_block(w, layer_attention(cfg, globals.inv_freq, globals.attn_sinks, jj / 2), x, ck, cv);
    else ops.mlp_block(w, x);
    return Tensor();
  };
  if (!graphs.enabled() || !graphable || (!attention && w.sparse() && !ops.routes_on_device(w))) {
    work();
    return;
  }
  using G = StepGraphs;
  StepGraphs::Key key{jj == 0 ? 2 : attention ? 0 : 1, x.dim(0), G::address(x.data), G::address(ck.data),
                      G::address(cv.data)};
  // The half's tensors as its block lays them out (the stacked views start at their first part).
  for (const WeightSpec& spec : kind(jj / 2).half_layout[jj % 2].specs) key.push_back(G::address(layer_tensor(w, spec).data));
  // The cache's slots and capacity, the layer's window and RoPE row (Gemma's and SmolLM3's layers
  // differ), and its row of sinks (GPT-OSS: each layer its own, so its own graph).
  if (attention)
    key.insert(key.end(), {ck.dim(0), ck.dim(1), cfg.window_layer(jj / 2) ? 1 : 0, int64_t(cfg.rope_row(jj / 2)),
                           cfg.attn_sinks ? jj / 2 : -1});
  graphs.run(key, work);
}

void OffloadEngine::Impl::score_prompts(const BatchState& b, const Tensor& x, int64_t T) {
  const int64_t chunk = gbs;  // the workspace's logit rows
  if (!row_scorer) row_scorer = std::make_unique<RowScorer>(be);
  for (const BatchState::ScoredSpan& span : b.scored) {
    const std::vector<int32_t>& prompt = span.seq->request->prompt;
    const int last = std::min(span.to, int(prompt.size()) - 1);  // the last position predicts no prompt token
    for (int t0 = span.from; t0 < last; t0 += int(chunk)) {
      const int t1 = std::min(last, t0 + int(chunk));
      std::vector<int32_t> rows;
      for (int t = t0; t < t1; ++t) rows.push_back(span.first_row + (t - span.from));
      ops.select_logit_rows(rows, T);
      std::vector<StepLogprobs> got = row_scorer->score(ops.head(globals, x),
                                                        std::vector<int32_t>(prompt.begin() + t0 + 1, prompt.begin() + t1 + 1),
                                                        std::vector<int>(size_t(t1 - t0), span.seq->request->prompt_logprobs));
      std::move(got.begin(), got.end(), span.seq->result.prompt_logprobs.begin() + t0);
    }
  }
}

StepBatch OffloadEngine::Impl::slice(const StepBatch& s, int64_t t0, int64_t t1) {
  const bool whole = t0 == 0 && t1 == int64_t(s.tokens.size());
  STRATA_CHECK(whole || s.prefix_copies.empty(), "internal: a prefill unit sharing prefixes runs in pieces");
  StepBatch part;
  part.tokens.assign(s.tokens.begin() + t0, s.tokens.begin() + t1);
  part.positions.assign(s.positions.begin() + t0, s.positions.begin() + t1);
  part.slots.assign(s.slots.begin() + t0, s.slots.begin() + t1);
  if (whole) part.prefix_copies = s.prefix_copies;
  return part;
}

void OffloadEngine::Impl::step(int i, int jj, int u, int n_steps, bool has_prev, int pi, int pjj, int pu) {
  check_pending();
  const int subs = 2 * L;
  if (jj == 0) build_step(i, u);
  // A delegated attention step enqueues its inputs first and then the previous step's deferred
  // output projection; any other step finishes that first, here, so the weights, workspace and
  // hidden state it reads are the previous step's still.
  const bool front = jj % 2 == 0 && delegated(token(i, u), jj / 2) && !unit(i, u).active.empty();
  if (!front) finish_delegated();
  auto store_prev = [&] {  // after the previous step's work, its output projection included
    if (!has_prev) return;
    if (pjj % 2 == 0) store_cache(pi, pjj / 2, pu, finished);  // only attention touches the cache
    store_act(pi, pjj, pu, finished);
  };
  // Part u of the next sub-layer's weights: FlexGen loads them all at the first unit and waits
  // for them there, so a load longer than that unit's compute stalls it while the other units'
  // compute goes uncovered.
  // Not for an MLP half every unit of its super-step computes on the CPU (experts_on_cpu).
  const int wi = jj + 1 < subs ? i : i + 1;
  if (wi < n_steps && gpu_computes(wi, (jj + 1) % subs)) load_weights_async((jj + 1) % subs, u, n_units(i));
  // Before the loads: the next step may be this unit's, loading what it stored. Only a previous
  // delegated step of this sub-layer (another unit) stores after this step's compute, which
  // enqueues its output projection.
  const bool store_after = front && prev_deferred;
  if (!store_after) store_prev();
  int ni = i, njj = jj, nu = u + 1;
  if (nu == n_units(i)) nu = 0, ++njj;
  if (njj == subs) njj = 0, ++ni;
  // The next step's rows are this step's own when the block has one sub-layer and one unit;
  // they cannot be prefetched before this step stores them.
  if (ni < n_steps && !same_rows(i, u, jj, ni, nu, njj)) {
    if (njj % 2 == 0) load_cache_async(ni, njj / 2, nu);
    if (njj != 0) load_act_async(ni, njj, nu);
  }
  // Nothing waits here: stores wait on the device for the event after their step's work, and the
  // slots a step read are free after it.
  const bool deferred = compute(i, jj, u);
  if (store_after) store_prev();
  prev_deferred = deferred;
  if (u == n_units(i) - 1) {
    if (deferred) pending_output.release_weights = jj;  // its output projection reads them
    else release_weights(jj, {finished});
  }
}

void OffloadEngine::Impl::build_units(std::vector<Sequence>& seqs, const std::vector<size_t>& batch_begin) {
  auto prompt_bounds = [](BatchState& b) {
    b.pmin = b.seqs.empty() ? 0 : INT32_MAX;
    b.pmax = 0;
    for (Sequence* s : b.seqs) {
      b.pmin = std::min(b.pmin, int(s->request->prompt.size()));
      b.pmax = std::max(b.pmax, int(s->request->prompt.size()));
    }
  };
  decode_units.assign(size_t(ngb), {});
  std::vector<size_t> batch_of(seqs.size());
  for (int k = 0; k < ngb; ++k) {
    decode_units[size_t(k)].batch = k;
    for (size_t q = batch_begin[size_t(k)]; q < batch_begin[size_t(k) + 1]; ++q) {
      decode_units[size_t(k)].seqs.push_back(&seqs[q]);
      batch_of[q] = size_t(k);
    }
  }
  block_seqs = seqs.data();
  source_of.assign(seqs.size(), 0);
  followers.assign(seqs.size(), {});
  for (size_t q = 0; q < seqs.size(); ++q) {
    const size_t prev = q - 1, batch = batch_of[q];
    const bool follows = q > 0 && seqs[prev].request == seqs[q].request && batch_of[prev] == batch;
    source_of[q] = follows ? source_of[prev] : q;
    if (!follows) continue;
    followers[source_of[q]].push_back(&seqs[q]);
    decode_units[batch].choice_copies.push_back({seqs[q].slot, seqs[source_of[q]].slot});
  }
  prefill_units.clear();
  const int m = plan.prefill_seqs;
  for (BatchState& d : decode_units) {
    prompt_bounds(d);
    for (int s0 = 0; s0 < d.slots(); s0 += m) {
      BatchState p;
      p.batch = d.batch;
      p.first_slot = s0;
      p.act_offset = size_t(s0 / m) * plan.act_piece_bytes;
      p.seqs.assign(d.seqs.begin() + s0, d.seqs.begin() + std::min(s0 + m, d.slots()));
      prompt_bounds(p);
      prefill_units.push_back(std::move(p));
    }
  }
}

int OffloadEngine::Impl::build_step_units(int n_tokens) {
  const Policy& p = opt.policy;
  step_units.clear();
  if (n_tokens < 1) return 0;
  const int n_steps = p.start_steps() + n_tokens - 1;
  step_units.resize(size_t(n_steps));
  for (int k = 0; k < ngb; ++k) {
    const int first = p.start_step(k);
    for (BatchState& unit : prefill_units)
      if (unit.batch == k) step_units[size_t(first)].push_back({&unit, 0});
    for (int t = 1; t < n_tokens; ++t) step_units[size_t(first + t)].push_back({&decode_units[size_t(k)], t});
  }
  return n_steps;
}

std::vector<GenResult> OffloadEngine::Impl::generate(const std::vector<GenRequest>& requests, GenStats* stats) {
  // A request's n choices run as n sequences; those in one GPU batch share one prefill
  // (build_units), so pack_choices keeps each request's choices in one batch where it can.
  for (size_t r = 0; r < requests.size(); ++r)
    STRATA_CHECK(requests[r].n >= 1, "offload engine: request " << r << ": n must be at least 1, got " << requests[r].n);
  const size_t n_seqs = count_choices(requests);
  STRATA_CHECK(n_seqs <= size_t(gbs) * size_t(ngb),
               "offload engine: " << n_seqs << " sequences (choices) exceed the block of " << gbs * ngb);
  const std::vector<std::vector<Choice>> batches = pack_choices(requests, gbs, ngb);
  std::vector<size_t> first_choice(requests.size() + 1, 0);  // a choice's place in the results
  for (size_t r = 0; r < requests.size(); ++r) first_choice[r + 1] = first_choice[r] + size_t(requests[r].n);
  std::vector<Sequence> seqs;
  seqs.reserve(n_seqs);
  std::vector<size_t> batch_begin{0}, result_index;
  int n_tokens = 0;
  for (const std::vector<Choice>& batch : batches) {
    for (const Choice& ch : batch) {
      const GenRequest& req = requests[ch.request];
      seqs.push_back(start_sequence(req, cfg, int(seqs.size() - batch_begin.back()), ch.request, ch.choice));
      result_index.push_back(first_choice[ch.request] + size_t(ch.choice));
      STRATA_CHECK(int(req.prompt.size()) <= shape.prompt_len && seqs.back().max_new <= shape.gen_len,
                   "offload engine: request " << ch.request << " exceeds the planned shape (prompt "
                                              << shape.prompt_len << ", generation " << shape.gen_len << ")");
      n_tokens = std::max(n_tokens, seqs.back().max_new);
    }
    batch_begin.push_back(seqs.size());
  }
  build_units(seqs, batch_begin);
  const int n_steps = build_step_units(n_tokens);
  size_t units = 0;
  for (const std::vector<StepUnit>& step_list : step_units) units = std::max(units, step_list.size());
  reset_schedule_state(units);

  GenStats local;
  const RoutingTotals routed_before = routing_totals();
  const auto t_start = Clock::now();
  const std::array<double, 4> busy_at_start = lane_busy();
  bool has_prev = false;
  int pi = 0, pjj = 0, pu = 0;
  try {
    // A super-step in which some batch prefills counts as prefill (all of token 0 without a
    // staggered prefill), the others as decode steps.
    // The lanes' busy time lags their work by the spans still in flight (Lane): the last
    // super-step's share is counted once the lanes settle.
    std::array<double, 4> busy_before = busy_at_start;
    bool last_prefills = false;
    for (int i = 0; i < n_steps; ++i) {
      const auto t_step = Clock::now();
      const HostWaits waits_before = host_waits();
      const int64_t device_waits_before = this_thread_host_waits().count;
      const int64_t live = std::count_if(seqs.begin(), seqs.end(), [](const Sequence& s) { return !s.done; });
      for (int jj = 0; jj < 2 * L; ++jj)
        for (int u = 0; u < n_units(i); ++u) {
          step(i, jj, u, n_steps, has_prev, pi, pjj, pu);
          has_prev = true, pi = i, pjj = jj, pu = u;
        }
      const bool prefills = std::any_of(step_units[size_t(i)].begin(), step_units[size_t(i)].end(),
                                        [](const StepUnit& su) { return su.token == 0; });
      (prefills ? local.prefill_seconds : local.decode_seconds) += seconds_since(t_step);
      const HostWaits waits_after = host_waits();
      totals.host_waits += waits_after.count - waits_before.count;
      totals.host_wait_seconds += waits_after.seconds - waits_before.seconds;
      if (!prefills) {
        totals.decode_host_waits += waits_after.count - waits_before.count;
        totals.decode_device_waits += this_thread_host_waits().count - device_waits_before;
      }
      const std::array<double, 4> busy = lane_busy();
      if (prefills) {
        add_prefill_busy(busy_before, busy);
      } else {
        ++local.decode_steps;
        local.decode_slot_steps += int64_t(seqs.size());  // the block's slots, every one held to its end
        local.live_slot_steps += live;
      }
      busy_before = busy;
      last_prefills = prefills;
      if (std::all_of(seqs.begin(), seqs.end(), [](const Sequence& s) { return s.done; })) break;
    }
    wait_all(pending);  // a failed store fails the block
    settle_lanes();     // the last spans' busy time, which the last super-step's count missed
    if (last_prefills) add_prefill_busy(busy_before, lane_busy());
  } catch (...) {
    release_all();
    throw;
  }
  release_all();
  totals.schedule_seconds += seconds_since(t_start);

  std::vector<GenResult> results(seqs.size());
  for (size_t r = 0; r < seqs.size(); ++r) {
    if (source_of[r] != r) {
      if (seqs[r].request->prompt_logprobs >= 0) seqs[r].result.prompt_logprobs = seqs[source_of[r]].result.prompt_logprobs;
      continue;
    }
    local.prompt_tokens += int64_t(seqs[r].request->prompt.size());  // each source prefills
  }
  for (size_t r = 0; r < seqs.size(); ++r) {
    local.generated_tokens += int64_t(seqs[r].result.tokens.size());
    results[result_index[r]] = std::move(seqs[r].result);  // request order, then choice order
  }
  local.shared_prompt_tokens = shared_prompt_tokens;
  local.routing = routing_totals() - routed_before;
  for (GenStats* s : {&totals.gen, stats})
    if (s) s->add(local);
  return results;
}

void OffloadEngine::Impl::reset_schedule_state(size_t units) {
  dequant_token = dequant_sub = -1;  // super-step numbers restart with every block
  w_held.assign(size_t(2 * L), {});
  w_issued.assign(size_t(2 * L), 0);
  c_held.assign(units, std::vector<Held>(size_t(L)));
  c_stored.assign(size_t(ngb), std::vector<std::vector<Ticket>>(size_t(L)));
  a_held.assign(units, {});
  a_stored.assign(units, {});
  a_stored_layer.assign(units, -1);
  a_stored_token.assign(units, -1);
  sampler = std::make_unique<StepSampler>(be, cfg, size_t(gbs));
  shared_prompt_tokens = 0;
  pending.clear();
}

void OffloadEngine::Impl::release_all() {
  // Waits for a ticket and then for its device work, ignoring failures (unwinding after one, or
  // the block is over): nothing may still touch the slots when the next block takes them.
  auto finish = [this](const Ticket& t) {
    if (!t.valid()) return;
    try {
      be.wait_host(t.get());
    } catch (...) {
    }
  };
  for (const Ticket& t : pending) finish(t);
  pending.clear();
  for (const Ticket& t : a_stored) finish(t);
  for (const auto& row : c_stored)
    for (const auto& tickets : row)
      for (const Ticket& t : tickets) finish(t);
  for (size_t j = 0; j < w_held.size(); ++j) {
    finish(w_held[j].ready);
    release_weights(int(j), {});
  }
  for (auto& row : c_held)
    for (Held& h : row) {
      finish(h.ready);
      release_held(h, c_gpu, c_pin, {}, {});
      h = Held();
    }
  for (Held& h : a_held) {
    finish(h.ready);
    release_held(h, a_gpu, a_pin, {}, {});
    h = Held();
  }
  for (AttentionBuffers& a : attn_buf) {
    for (const Ticket* t : {&a.host_free, &a.o_read, &a.out_free}) finish(*t);
    a.host_free = a.o_read = a.out_free = Ticket();
  }
  finish(qkv_read);
  try {
    be.synchronize();  // the compute stream's last work on the slots
  } catch (...) {
  }
  // A block that failed may leave a delegated step's output projection pending: dropped, as its
  // block's results are.
  pending_output = PendingOutput();
  qkv_read = finished = output_done = Ticket();
  prev_deferred = false;
}

}  // namespace strata
