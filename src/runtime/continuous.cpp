#include "strata/runtime/continuous.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <memory>

#include "kv_rows.h"
#include "strata/core/error.h"
#include "strata/runtime/prompt_logprobs.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// A request admitted to the slots: its choices are seqs[slots[0..n)], the first one computing the
// prompt for all of them.
struct Live {
  const GenRequest* request = nullptr;
  size_t tag = 0;
  std::vector<int> slots;
  size_t computed = 0;    // prompt positions in the cache (copied or computed)
  bool prefilled = false;  // the prompt's last position is computed and sampled
  // A prompt that begins like an earlier one still computing waits for those rows to be stored,
  // then copies its first `wait_length` positions from `wait_for` (Batcher::resolve_waits).
  const Live* wait_for = nullptr;
  int wait_length = 0;
};

class Batcher {
public:
  Batcher(Transformer& model, const ContinuousOptions& o)
      : model_(model),
        be_(model.backend()),
        cfg_(model.config()),
        o_(o),
        kept_(o.gen.share_prefixes ? o.gen.kept_prefixes : nullptr),
        cache_(make_kv_cache(cfg_, be_, o.slots, o.capacity)),
        sampler_(be_, cfg_, size_t(o.slots)),
        scorer_(be_, cfg_.vocab_size),
        seqs_(size_t(o.slots)) {
    for (int s = o.slots - 1; s >= 0; --s) free_.push_back(s);
  }

  void run(const std::function<Admission()>& next,
           const std::function<void(size_t, std::vector<GenResult>)>& finished, GenStats& stats) {
    Admission waiting;  // the request next in line, when it needs more slots than are free
    bool drained = false;
    while (true) {
      while (!drained && !free_.empty()) {
        if (!waiting.request) {
          waiting = next();
          if (!waiting.request) {
            drained = true;
            break;
          }
          check(waiting);
        }
        if (size_t(waiting.request->n) > free_.size()) break;
        admit(waiting, stats);
        waiting = {};
      }
      report_finished(finished, stats);  // requests with nothing to generate
      if (live_.empty()) {
        if (drained) return;
        continue;
      }
      step(stats);
      report_finished(finished, stats);
    }
  }

private:
  // A request that could never be admitted fails at once rather than wait forever.
  void check(const Admission& a) const {
    const int n = a.request->n;
    if (n < 1) STRATA_FAIL("request " << a.tag << ": n must be at least 1, got " << n);
    if (n > o_.slots) STRATA_FAIL("request " << a.tag << ": n = " << n << " choices exceed the " << o_.slots << " slots");
  }

  void admit(const Admission& a, GenStats& stats) {
    const GenRequest& r = *a.request;
    auto live = std::make_unique<Live>();
    live->request = &r;
    live->tag = a.tag;
    for (int c = 0; c < r.n; ++c) {
      const int slot = free_.back();
      free_.pop_back();
      Sequence& s = seqs_[size_t(slot)];
      s = start_sequence(r, cfg_, slot, a.tag, c);
      if (int(r.prompt.size()) + std::max(s.max_new, 0) > o_.capacity)
        STRATA_FAIL("request " << a.tag << ": prompt " << r.prompt.size() << " + " << s.max_new
                               << " new tokens exceed the slots' " << o_.capacity << " positions");
      live->slots.push_back(slot);
    }
    stats.prompt_tokens += int64_t(r.prompt.size());
    if (seqs_[size_t(live->slots[0])].done) {
      live->prefilled = true;  // max_new 0: every choice is done already
    } else {
      live->computed = size_t(share_prompt_start(*live));
      stats.shared_prompt_tokens += int64_t(live->computed);
    }
    live_.push_back(std::move(live));
  }

  // The longest shareable beginning of the newcomer's prompt, from a live request's prompt or a
  // kept prefix. A live one's rows up to its `computed` are stored (every step so far has run):
  // copied now; beyond, while it still computes its prompt, the newcomer waits for them. Returns
  // the positions copied now.
  int share_prompt_start(Live& nl) {
    if (!o_.gen.share_prefixes || nl.request->prompt_logprobs >= 0) return 0;  // a scored prompt computes every row
    const std::vector<int32_t>& prompt = nl.request->prompt;
    int best = kept_ ? kv_rows::kept_length(*kept_, prompt, o_.gen.prefix_sharing) : 0;
    const Live* source = nullptr;
    for (const auto& l : live_) {
      const int n = shareable_length(l->request->prompt, prompt, o_.gen.prefix_sharing);
      if (n > best && (int(l->computed) >= n || !l->prefilled)) best = n, source = l.get();
    }
    if (!source) return kv_rows::copy_kept_prefix(be_, kept_, prompt, cache_, nl.slots[0], o_.gen.prefix_sharing);
    if (int(source->computed) >= best) {
      copy_from(*source, nl, best);
      return best;
    }
    nl.wait_for = source;
    nl.wait_length = best;
    return 0;
  }

  // Copies positions [0, length) of `from`'s prompt rows to `to`'s first slot, and keeps them:
  // the job's shared instruction outlives any one request.
  void copy_from(const Live& from, const Live& to, int length) {
    kv_rows::copy_prefix(be_, cache_, from.slots[0], cache_, to.slots[0], length);
    if (kept_) {
      const std::vector<int32_t>& prompt = to.request->prompt;
      kv_rows::keep(be_, cfg_, std::vector<int32_t>(prompt.begin(), prompt.begin() + length), cache_, to.slots[0],
                    *kept_);
    }
  }

  // After a step: the waiting prompts whose source has now stored the rows they share copy them.
  void resolve_waits(GenStats& stats) {
    for (const auto& l : live_) {
      if (!l->wait_for || int(l->wait_for->computed) < l->wait_length) continue;
      copy_from(*l->wait_for, *l, l->wait_length);
      l->computed = size_t(l->wait_length);
      stats.shared_prompt_tokens += l->wait_length;
      l->wait_for = nullptr;
    }
  }

  // One step: a token for every decoding slot, then prompt pieces of the admitted requests in
  // admission order, up to the prefill budget.
  void step(GenStats& stats) {
    const auto t0 = Clock::now();
    StepBatch batch;
    std::vector<Sequence*> rows, decoding;
    for (const auto& l : live_) {
      if (!l->prefilled) continue;
      for (int slot : l->slots) {
        Sequence& s = seqs_[size_t(slot)];
        if (s.done) continue;
        batch.tokens.push_back(s.next_token);
        batch.positions.push_back(s.length);
        batch.slots.push_back(slot);
        batch.logit_rows.push_back(int32_t(batch.tokens.size() - 1));
        rows.push_back(&s);
        decoding.push_back(&s);
      }
    }
    const int64_t budget = std::max<int64_t>(o_.gen.prefill_token_budget, 1);
    int64_t prompt_tokens = 0;
    std::vector<Live*> completed;  // prompts whose last position is in this step
    for (const auto& l : live_) {
      if (l->prefilled || l->wait_for) continue;
      const std::vector<int32_t>& prompt = l->request->prompt;
      const bool scored = l->request->prompt_logprobs >= 0;
      const size_t start = l->computed;
      const int32_t first_row = int32_t(batch.tokens.size());
      while (l->computed < prompt.size() && prompt_tokens < budget &&
             (!scored || scorer_.rows() + int64_t(l->computed - start) < scorer_.max_rows())) {
        batch.tokens.push_back(prompt[l->computed]);
        batch.positions.push_back(int32_t(l->computed));
        batch.slots.push_back(l->slots[0]);
        ++l->computed;
        ++prompt_tokens;
      }
      if (scored) scorer_.add(seqs_[size_t(l->slots[0])], first_row, int(start), int(l->computed));
      if (l->computed < prompt.size()) break;  // the budget is spent: later prompts wait their turn
      for (int slot : l->slots) {
        batch.logit_rows.push_back(int32_t(batch.tokens.size() - 1));
        rows.push_back(&seqs_[size_t(slot)]);
      }
      completed.push_back(l.get());
    }
    const int64_t sampled_rows = int64_t(batch.logit_rows.size());
    scorer_.append_rows(batch);  // after the sampled rows
    const Tensor logits = model_.forward(batch, cache_);
    if (!scorer_.empty()) scorer_.score(logits.rows(sampled_rows, scorer_.rows()));
    for (Sequence* s : decoding) ++s->length;
    for (Live* l : completed) {
      for (int slot : l->slots) seqs_[size_t(slot)].length = int(l->request->prompt.size());
      l->prefilled = true;
    }
    if (!rows.empty()) sampler_.sample(logits.rows(0, sampled_rows), rows);
    resolve_waits(stats);
    // The other choices start from the first one's prompt rows.
    for (Live* l : completed)
      for (size_t c = 1; c < l->slots.size(); ++c)
        kv_rows::copy_prefix(be_, cache_, l->slots[0], cache_, l->slots[c], int(l->request->prompt.size()));
    // A step that computes prompt pieces beside decode tokens: its time split by their shares.
    const double seconds = seconds_since(t0), prompt_share = double(prompt_tokens) / double(batch.tokens.size());
    stats.prefill_seconds += seconds * prompt_share;
    stats.decode_seconds += seconds * (1 - prompt_share);
    if (!decoding.empty()) {
      ++stats.decode_steps;
      stats.decode_slot_steps += o_.slots;
      stats.live_slot_steps += int64_t(decoding.size());
    }
  }

  // Hands each request whose choices are all done to `finished` and frees its slots.
  void report_finished(const std::function<void(size_t, std::vector<GenResult>)>& finished, GenStats& stats) {
    for (auto it = live_.begin(); it != live_.end();) {
      Live& l = **it;
      const bool done = l.prefilled && std::all_of(l.slots.begin(), l.slots.end(),
                                                   [&](int s) { return seqs_[size_t(s)].done; });
      if (!done) {
        ++it;
        continue;
      }
      std::vector<GenResult> results;
      for (int slot : l.slots) {
        Sequence& s = seqs_[size_t(slot)];
        stats.generated_tokens += int64_t(s.result.tokens.size());
        results.push_back(std::move(s.result));
        free_.push_back(slot);
      }
      for (size_t c = 1; c < results.size() && l.request->prompt_logprobs >= 0; ++c)
        results[c].prompt_logprobs = results[0].prompt_logprobs;  // the first choice scored the prompt
      const size_t tag = l.tag;
      it = live_.erase(it);
      finished(tag, std::move(results));
    }
  }

  Transformer& model_;
  Backend& be_;
  const ModelConfig& cfg_;
  const ContinuousOptions& o_;
  KeptPrefixes* kept_;
  KvCache cache_;
  StepSampler sampler_;
  PromptScorer scorer_;
  std::vector<Sequence> seqs_;
  std::vector<int> free_;     // free slots, the lowest last
  std::deque<std::unique_ptr<Live>> live_;  // in admission order
};

}  // namespace

void run_continuous(Transformer& model, const ContinuousOptions& options, const std::function<Admission()>& next,
                    const std::function<void(size_t tag, std::vector<GenResult> results)>& finished,
                    GenStats* stats) {
  if (options.slots < 1) STRATA_FAIL("continuous batching needs at least one slot, got " << options.slots);
  if (options.capacity < 1) STRATA_FAIL("continuous batching needs slots of at least one position, got " << options.capacity);
  GenStats local;
  const RoutingTotals routed_before = model.routing_totals();
  Batcher(model, options).run(next, finished, local);
  local.routing = model.routing_totals() - routed_before;
  if (stats) stats->add(local);
}

}  // namespace strata
