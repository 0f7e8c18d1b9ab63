// Continuous batching in the offloading engine (docs/offload.md, "Continuous batching"): the
// block's slots are served as a steady state. Each super-step runs the zig-zag schedule of
// engine_steps.cpp over one unit per GPU batch; a unit's step carries a token for each of its
// decoding slots and then pieces of its newcomers' prompts, within the plan's step of
// `step_tokens` (the workspace, the hidden-state buffers and the CPU attention's buffers hold
// that much), so the GPU's working set is the plan's. When a request's last choice ends, its
// slots take the next requests at the following super-step.
#include <algorithm>
#include <chrono>
#include <utility>

#include "engine_impl.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

void OffloadEngine::Impl::admit(int k, GenStats& stats) {
  ServeState& s = *served;
  std::vector<int>& free = s.free[size_t(k)];
  while (!free.empty()) {
    if (!s.waiting.request) {
      if (s.drained) return;
      s.waiting = s.next();
      if (!s.waiting.request) {
        s.drained = true;
        return;
      }
      const GenRequest& r = *s.waiting.request;
      STRATA_CHECK(r.n >= 1, "request " << s.waiting.tag << ": n must be at least 1, got " << r.n);
      STRATA_CHECK(r.n <= gbs, "request " << s.waiting.tag << ": n = " << r.n << " choices exceed the GPU batch of "
                                          << gbs << "; its choices decode in one GPU batch");
    }
    const GenRequest& r = *s.waiting.request;
    if (size_t(r.n) > free.size()) return;  // it waits for a batch with room; those behind it too
    auto l = std::make_unique<ServedRequest>();
    l->request = &r;
    l->tag = s.waiting.tag;
    l->batch = k;
    for (int c = 0; c < r.n; ++c) {
      const int slot = free.back();
      free.pop_back();
      Sequence& seq = s.seqs[size_t(k) * size_t(gbs) + size_t(slot)];
      seq = start_sequence(r, cfg, slot, s.waiting.tag, c);
      STRATA_CHECK(int(r.prompt.size()) <= shape.prompt_len && seq.max_new <= shape.gen_len,
                   "offload engine: request " << s.waiting.tag << " exceeds the planned shape (prompt "
                                              << shape.prompt_len << ", generation " << shape.gen_len << ")");
      s.valid[size_t(k) * size_t(gbs) + size_t(slot)] = 0;
      l->slots.push_back(slot);
    }
    stats.prompt_tokens += int64_t(r.prompt.size());
    // max_new 0: every choice is done already; it is reported without a step.
    if (s.seqs[size_t(k) * size_t(gbs) + size_t(l->slots[0])].done) l->prefilled = true;
    s.live.push_back(std::move(l));
    s.waiting = {};
  }
}

std::pair<int, int> OffloadEngine::Impl::share_source(const ServedRequest& l, bool& ready) const {
  ready = false;
  if (!opt.share_prefixes || l.request->prompt_logprobs >= 0) return {-1, 0};  // a scored prompt computes every row
  const std::vector<int32_t>& prompt = l.request->prompt;
  const int* valid = served->valid.data() + size_t(l.batch) * size_t(gbs);
  int best = 0;
  const ServedRequest* source = nullptr;
  for (const auto& other : served->live) {
    if (other.get() == &l) break;  // earlier requests only: a source never waits for its follower
    if (other->batch != l.batch) continue;
    const int n = shareable_length(other->request->prompt, prompt, opt.prefix_sharing);
    if (n > best) best = n, source = other.get();
  }
  if (!source) return {-1, 0};
  ready = valid[source->slots[0]] >= best;
  return {source->slots[0], best};
}

void OffloadEngine::Impl::build_served_step(int i, int u) {
  ServeState& s = *served;
  BatchState& b = unit(i, u);
  b.step = StepBatch();
  b.step_built = i;
  b.active.clear();
  b.sampled.clear();
  b.advancing.clear();
  b.prompt_done.clear();
  b.scored.clear();
  b.shared = std::move(s.copies_next[size_t(b.batch)]);
  s.copies_next[size_t(b.batch)].clear();
  int* valid = s.valid.data() + size_t(b.batch) * size_t(gbs);
  auto add_token = [&](int32_t token, int position, int slot) {
    b.step.tokens.push_back(token);
    b.step.positions.push_back(position);
    b.step.slots.push_back(slot);
    valid[slot] = std::max(valid[slot], position + 1);
  };
  for (const auto& [dst, src] : b.shared) valid[dst] = int(b.seqs[size_t(src)]->request->prompt.size());
  // Decode tokens first: every live sequence past its prompt.
  for (const auto& l : s.live) {
    if (l->batch != b.batch || !l->prefilled) continue;
    for (int slot : l->slots) {
      Sequence& seq = *b.seqs[size_t(slot)];
      if (seq.done) continue;
      add_token(seq.next_token, seq.length, slot);
      b.step.logit_rows.push_back(int32_t(b.step.tokens.size() - 1));
      b.active.push_back(&seq);
      b.sampled.push_back(&seq);
      b.advancing.push_back(&seq);
    }
  }
  const int64_t decode_tokens = int64_t(b.step.tokens.size());
  // Then the newcomers' prompts in admission order, within the step's tokens.
  int64_t budget = plan.step_tokens - decode_tokens;
  for (const auto& l : s.live) {
    if (l->batch != b.batch || l->prefilled) continue;
    if (budget <= 0) break;
    const std::vector<int32_t>& prompt = l->request->prompt;
    Sequence& first = *b.seqs[size_t(l->slots[0])];
    if (l->computed == 0) {  // its beginning may be another request's: copy those rows, or wait for them
      bool ready = false;
      const auto [source, length] = share_source(*l, ready);
      if (source >= 0 && !ready) continue;  // that request computes them in this or a later step
      if (source >= 0) {
        b.step.prefix_copies.push_back({source, l->slots[0], length});
        valid[l->slots[0]] = length;
        l->computed = size_t(length);
        shared_prompt_tokens += length;
      }
    }
    const size_t start = l->computed;
    const int32_t first_row = int32_t(b.step.tokens.size());
    while (l->computed < prompt.size() && budget > 0) {
      add_token(prompt[l->computed], int(l->computed), l->slots[0]);
      ++l->computed;
      --budget;
    }
    if (l->request->prompt_logprobs >= 0) b.scored.push_back({&first, first_row, int(start), int(l->computed)});
    totals.prefill_tokens += int64_t(l->computed - start);
    b.active.push_back(&first);
    if (l->computed < prompt.size()) break;  // the budget is spent: later prompts wait their turn
    l->prefilled = true;
    for (size_t c = 0; c < l->slots.size(); ++c) {  // the last prompt row, each choice its own sampler
      Sequence& seq = *b.seqs[size_t(l->slots[c])];
      b.step.logit_rows.push_back(int32_t(b.step.tokens.size() - 1));
      b.sampled.push_back(&seq);
      b.prompt_done.push_back(&seq);
      if (c > 0) s.copies_next[size_t(b.batch)].push_back({l->slots[c], l->slots[0]});
    }
  }
  s.step_decode_tokens += decode_tokens;
  s.step_prompt_tokens += int64_t(b.step.tokens.size()) - decode_tokens;
}

void OffloadEngine::Impl::report_served(const std::function<void(size_t, std::vector<GenResult>)>& finished,
                                        GenStats& stats) {
  ServeState& s = *served;
  for (auto it = s.live.begin(); it != s.live.end();) {
    ServedRequest& l = **it;
    Sequence* seqs = s.seqs.data() + size_t(l.batch) * size_t(gbs);
    const bool done = l.prefilled && std::all_of(l.slots.begin(), l.slots.end(),
                                                 [&](int slot) { return seqs[slot].done; });
    if (!done) {
      ++it;
      continue;
    }
    std::vector<GenResult> results;
    for (int slot : l.slots) {
      stats.generated_tokens += int64_t(seqs[slot].result.tokens.size());
      results.push_back(std::move(seqs[slot].result));
      s.free[size_t(l.batch)].push_back(slot);
    }
    for (size_t c = 1; c < results.size() && l.request->prompt_logprobs >= 0; ++c)
      results[c].prompt_logprobs = results[0].prompt_logprobs;  // the first choice scored the prompt
    // The lowest free slot last, taken first: newcomers fill a batch from its first slot.
    std::sort(s.free[size_t(l.batch)].rbegin(), s.free[size_t(l.batch)].rend());
    // Choices that ended with their first token never copy the prompt rows: a newcomer gets the slot.
    std::erase_if(s.copies_next[size_t(l.batch)], [&](const std::pair<int, int>& c) {
      return std::find(l.slots.begin(), l.slots.end(), c.first) != l.slots.end();
    });
    const size_t tag = l.tag;
    it = s.live.erase(it);
    finished(tag, std::move(results));
  }
}

void OffloadEngine::Impl::serve(const std::function<Admission()>& next,
                                const std::function<void(size_t, std::vector<GenResult>)>& finished, GenStats* stats) {
  served = std::make_unique<ServeState>();
  ServeState& s = *served;
  s.next = next;
  s.seqs.resize(size_t(gbs) * size_t(ngb));
  s.valid.assign(s.seqs.size(), 0);
  s.free.assign(size_t(ngb), {});
  for (std::vector<int>& f : s.free)
    for (int slot = gbs - 1; slot >= 0; --slot) f.push_back(slot);
  s.copies_next.assign(size_t(ngb), {});
  decode_units.assign(size_t(ngb), {});
  for (int k = 0; k < ngb; ++k) {
    BatchState& b = decode_units[size_t(k)];
    b.batch = k;
    for (int slot = 0; slot < gbs; ++slot) b.seqs.push_back(&s.seqs[size_t(k) * size_t(gbs) + size_t(slot)]);
  }
  block_seqs = s.seqs.data();
  source_of.clear();
  followers.clear();
  reset_schedule_state(size_t(ngb));

  GenStats local;
  const RoutingTotals routed_before = routing_totals();
  const auto t_start = Clock::now();
  bool has_prev = false;
  int pi = 0, pjj = 0, pu = 0;
  try {
    report_served(finished, local);
    for (int i = 0;;) {  // i counts the super-steps run: a prefetch for i + 1 finds it next
      for (int k = 0; k < ngb; ++k) admit(k, local);
      report_served(finished, local);  // requests with nothing to generate
      if (s.live.empty()) {
        if (s.drained) break;
        continue;
      }
      const auto t_step = Clock::now();
      const HostWaits waits_before = host_waits();
      const std::array<double, 4> busy_before = lane_busy();
      s.step_prompt_tokens = s.step_decode_tokens = 0;
      // Each step prefetches for the super-step after it (n_steps = i + 2): when the stream has
      // ended, release_all() drops what was prefetched.
      for (int jj = 0; jj < 2 * L; ++jj)
        for (int u = 0; u < ngb; ++u) {
          step(i, jj, u, i + 2, has_prev, pi, pjj, pu);
          has_prev = true, pi = i, pjj = jj, pu = u;
        }
      ++i;
      // A step that computes prompt pieces beside decode tokens: its time split by their shares.
      const double seconds = seconds_since(t_step);
      const double tokens = double(s.step_prompt_tokens + s.step_decode_tokens);
      STRATA_CHECK(tokens > 0, "internal: a served super-step computed no token");
      const double prompt_share = double(s.step_prompt_tokens) / tokens;
      local.prefill_seconds += seconds * prompt_share;
      local.decode_seconds += seconds * (1 - prompt_share);
      const std::array<double, 4> busy = lane_busy();
      std::array<double, 4> prefill_end = busy_before;
      for (size_t lane = 0; lane < busy.size(); ++lane) prefill_end[lane] += (busy[lane] - busy_before[lane]) * prompt_share;
      add_prefill_busy(busy_before, prefill_end);
      const HostWaits waits_after = host_waits();
      totals.host_waits += waits_after.count - waits_before.count;
      totals.host_wait_seconds += waits_after.seconds - waits_before.seconds;
      if (s.step_decode_tokens > 0) {
        ++local.decode_steps;
        local.decode_slot_steps += int64_t(gbs) * ngb;
        local.live_slot_steps += s.step_decode_tokens;
        totals.decode_host_waits += waits_after.count - waits_before.count;
      }
      report_served(finished, local);
    }
    wait_all(pending);  // a failed store fails the stream
    settle_lanes();
  } catch (...) {
    release_all();
    served.reset();
    throw;
  }
  release_all();
  served.reset();
  totals.schedule_seconds += seconds_since(t_start);
  local.shared_prompt_tokens = shared_prompt_tokens;
  local.routing = routing_totals() - routed_before;
  for (GenStats* g : {&totals.gen, stats})
    if (g) g->add(local);
}

}  // namespace strata
