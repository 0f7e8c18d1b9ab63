// `strata perplexity`: a text's perplexity under a model. The token ids are cut into
// non-overlapping windows, each scored alone from a fresh cache; perplexity is
// exp(sum of the windows' next-token NLLs / number of predictions) (docs/perplexity.md).
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

#include "strata/runtime/sampler.h"
#include "strata/runtime/transformer.h"

namespace strata {

struct ModelBundle;

// Scores one window of n >= 2 ids: element t is -log p(window[t + 1] | window[0..t]), t = 0 .. n-2.
using WindowScorer = std::function<std::vector<double>(const std::vector<int32_t>& window)>;

// A window [begin, begin + size) of the text's ids.
struct TokenWindow {
  int64_t begin = 0, size = 0;
};

// Non-overlapping windows of `context` ids over n ids, in order; the last one may be shorter and
// is kept when it has at least 2 ids (a window of one id predicts nothing). Throws strata::Error
// when context < 2.
std::vector<TokenWindow> split_windows(int64_t n_ids, int context);

struct PerplexityResult {
  double nll_sum = 0;   // natural log
  int64_t tokens = 0;   // predictions scored: the sum over windows of (window size - 1)
  int64_t windows = 0;
  double mean_nll() const { return tokens > 0 ? nll_sum / double(tokens) : 0.0; }
  double perplexity() const;  // exp(mean_nll())

  // Adds one window's per-token NLLs (non-finite values are an error naming the window).
  void add_window(const std::vector<double>& nlls);
};

// token_nll (runtime/sampler.h) scores one logits row.

// Splits `ids` with split_windows and scores each window with `scorer`; `progress(so_far,
// total_windows)` is called after each window. Throws strata::Error when `ids` has fewer than 2
// ids, or when the scorer returns the wrong number of NLLs.
PerplexityResult perplexity_of(const std::vector<int32_t>& ids, int context, const WindowScorer& scorer,
                               const std::function<void(const PerplexityResult& so_far, int64_t total_windows)>&
                                   progress = nullptr);

// Scores windows with the resident Transformer: one KV cache slot, reused from position 0 for
// every window (attention reads only positions <= its own, so the old entries are never seen and
// each window starts fresh). A window runs in steps of at most `max_step_tokens` tokens (0: as
// many as keep the step's logits [tokens, vocab] under 128 MiB) over its first n - 1 tokens (the
// last predicts nothing), each step asking for the logits of all its tokens; they are copied to
// the host and reduced there in double. The model must outlive the scorer.
WindowScorer resident_scorer(Transformer& model, int64_t max_step_tokens = 0);

struct PerplexityOptions {
  std::string model;                 // directory, .gguf, or dummy:PRESET (empty: the default model)
  std::filesystem::path lora;        // optional PEFT LoRA adapter merged at load (model/lora.h)
  std::filesystem::path text;        // UTF-8 text file
  std::filesystem::path policy;      // empty: resident on --device; else the offloading engine
  std::string device = "auto";       // cpu, cuda, auto
  std::string dtype = "auto";  // the GPU's activations: auto (the checkpoint's), fp16, bf16
  int context = 0;                   // window size in tokens; 0: min(512, the model's context)
  int threads = 0;                   // CPU threads (0: all cores)
  bool progress = true;              // progress line on the log stream
  // --policy only: tier budgets (empty: what each tier has free) and the disk tier's directory.
  std::string gpu_mem, cpu_mem, disk_mem;
  std::filesystem::path offload_dir;
};

// Reads and tokenizes the text (the model's tokenizer, no special tokens added), scores it and
// returns the result; the model line and the progress go to `log`. Throws strata::Error naming
// the file or option on a missing, empty or non-UTF-8 text, a text of fewer than 2 tokens, or a
// context < 2 or beyond the model's.
PerplexityResult run_perplexity(const PerplexityOptions& options, std::ostream& log);

// Reads a text file whole; throws strata::Error naming the file when it is missing, unreadable,
// empty, or not valid UTF-8 (naming the byte offset).
std::string read_text_file(const std::filesystem::path& path);

// --policy: scores `ids` in windows of `context` tokens (split_windows) through the offloading
// engine under options.policy (placement and compression), as perplexity_of does with the
// resident scorer, and returns the totals. Defined in src/job/perplexity_policy.cpp: a block of
// windows per pass over the weights.
PerplexityResult score_with_policy(ModelBundle& model, const PerplexityOptions& options,
                                   const std::vector<int32_t>& ids, int context, std::ostream& log);

}  // namespace strata
