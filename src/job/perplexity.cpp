// Perplexity of a text: windowing and the NLL arithmetic (pure, unit-tested), the resident
// scorer over Transformer, and the driver behind `strata perplexity`.
#include "strata/job/perplexity.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <iterator>
#include <memory>

#include "strata/backend/backend.h"
#include "strata/core/error.h"
#include "strata/model/model_loader.h"
#include "strata/runtime/prompt_logprobs.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kDefaultContext = 512;
constexpr size_t kStepLogitBytes = size_t(128) << 20;  // logits of one step, as fp32 on the host

// Offset of the first byte that is not part of well-formed UTF-8, or npos.
size_t first_invalid_utf8(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned c = p[i];
    size_t len;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07;
    } else {
      return i;
    }
    if (i + len > n) return i;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    // Overlong forms, surrogates and code points past U+10FFFF are invalid too.
    static const uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return i;
    i += len;
  }
  return std::string::npos;
}

// "[strata] 3/12 windows, 1533 tokens scored, 812.4 tok/s, 1.9 s", at most every 0.2 s on a
// terminal and every 5 s in a log file, as `strata run` does.
class WindowProgress {
public:
  WindowProgress(std::ostream& log, bool enabled)
      : log_(log), enabled_(enabled), tty_(enabled && isatty(STDERR_FILENO)), t0_(Clock::now()) {}
  void update(int64_t done, int64_t total, int64_t tokens) {
    if (!enabled_) return;
    const double t = std::chrono::duration<double>(Clock::now() - t0_).count();
    if (done < total && t - last_ < (tty_ ? 0.2 : 5.0)) return;
    last_ = t;
    log_ << (tty_ ? "\r" : "") << "[strata] " << done << "/" << total << " windows, " << tokens << " tokens scored, "
         << std::fixed << std::setprecision(1) << (t > 0 ? double(tokens) / t : 0.0) << " tok/s, " << t << " s"
         << (tty_ ? "   " : "\n") << std::flush;
    if (tty_ && done == total) log_ << "\n";
  }

private:
  std::ostream& log_;
  bool enabled_, tty_;
  Clock::time_point t0_;
  double last_ = -1e9;
};

}  // namespace

std::vector<TokenWindow> split_windows(int64_t n_ids, int context) {
  if (context < 2) STRATA_FAIL("--context must be at least 2 tokens, got " << context);
  std::vector<TokenWindow> out;
  for (int64_t begin = 0; begin < n_ids; begin += context) {
    const int64_t size = std::min<int64_t>(context, n_ids - begin);
    if (size >= 2) out.push_back({begin, size});
  }
  return out;
}

double PerplexityResult::perplexity() const { return std::exp(mean_nll()); }

void PerplexityResult::add_window(const std::vector<double>& nlls) {
  double sum = 0;
  for (double v : nlls) sum += v;
  if (!std::isfinite(sum)) STRATA_FAIL("perplexity: window " << windows << " has a non-finite NLL");
  nll_sum += sum;
  tokens += int64_t(nlls.size());
  ++windows;
}

PerplexityResult perplexity_of(const std::vector<int32_t>& ids, int context, const WindowScorer& scorer,
                               const std::function<void(const PerplexityResult&, int64_t)>& progress) {
  if (ids.size() < 2) STRATA_FAIL("perplexity needs at least 2 tokens, got " << ids.size());
  const std::vector<TokenWindow> windows = split_windows(int64_t(ids.size()), context);
  PerplexityResult r;
  for (const TokenWindow& w : windows) {
    const std::vector<int32_t> window(ids.begin() + w.begin, ids.begin() + w.begin + w.size);
    const std::vector<double> nlls = scorer(window);
    STRATA_CHECK(int64_t(nlls.size()) == w.size - 1, "scorer returned " << nlls.size() << " NLLs for a window of "
                                                                        << w.size << " tokens (expected "
                                                                        << w.size - 1 << ")");
    r.add_window(nlls);
    if (progress) progress(r, int64_t(windows.size()));
  }
  return r;
}

WindowScorer resident_scorer(Transformer& model, int64_t max_step_tokens) {
  const int64_t vocab = model.config().vocab_size;
  if (max_step_tokens <= 0) max_step_tokens = std::max<int64_t>(1, int64_t(kStepLogitBytes / (size_t(vocab) * 4)));
  // The cache is made on the first window and remade only for a longer one.
  auto cache = std::make_shared<KvCache>();
  auto pool = std::make_shared<ThreadPool>(0);  // the rows' log-softmax, on every core
  // On a GPU the rows are reduced where they are and only their summaries cross (RowScorer).
  auto on_device = model.backend().samples_on_device() ? std::make_shared<RowScorer>(model.backend()) : nullptr;
  return [&model, vocab, max_step_tokens, cache, pool, on_device](const std::vector<int32_t>& window) {
    const int64_t n = int64_t(window.size());
    STRATA_CHECK(n >= 2, "a window needs at least 2 tokens, got " << n);
    STRATA_CHECK(n <= model.config().max_positions,
                 "window of " << n << " tokens exceeds the model's context of " << model.config().max_positions);
    if (cache->capacity < n) {
      cache->storage.reset();  // free the old cache before taking the larger one
      *cache = make_kv_cache(model.config(), model.backend(), 1, int(n));
    }
    std::vector<double> nlls;
    nlls.reserve(size_t(n - 1));
    std::vector<float> logits;
    // The last token predicts nothing and no later token reads its keys: it is never run.
    for (int64_t a = 0; a < n - 1; a += max_step_tokens) {
      const int64_t b = std::min(n - 1, a + max_step_tokens);
      StepBatch step;
      step.tokens.assign(window.begin() + a, window.begin() + b);
      for (int64_t t = a; t < b; ++t) {
        step.positions.push_back(int32_t(t));
        step.slots.push_back(0);
        step.logit_rows.push_back(int32_t(t - a));
      }
      const Tensor out = model.forward(step, *cache);
      const int64_t rows = b - a;
      if (on_device) {
        const std::vector<StepLogprobs> got = on_device->score(
            out, std::vector<int32_t>(window.begin() + a + 1, window.begin() + b + 1), std::vector<int>(size_t(rows), 0));
        for (const StepLogprobs& p : got) nlls.push_back(-p.sampled.logprob);
        continue;
      }
      logits.resize(size_t(rows * vocab));
      model.backend().copy_to_host_f32(out, logits.data());
      const std::vector<double> step_nlls = token_nlls(*pool, logits.data(), rows, vocab, window.data() + a + 1);
      nlls.insert(nlls.end(), step_nlls.begin(), step_nlls.end());
    }
    return nlls;
  };
}

std::string read_text_file(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) STRATA_FAIL(path.string() << ": text file not found");
  if (std::filesystem::is_directory(path, ec)) STRATA_FAIL(path.string() << ": is a directory, not a text file");
  std::ifstream in(path, std::ios::binary);
  if (!in) STRATA_FAIL(path.string() << ": cannot open the text file");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) STRATA_FAIL(path.string() << ": read error");
  if (text.empty()) STRATA_FAIL(path.string() << ": the text file is empty");
  const size_t bad = first_invalid_utf8(text);
  if (bad != std::string::npos) STRATA_FAIL(path.string() << ": not valid UTF-8 (byte offset " << bad << ")");
  return text;
}

PerplexityResult run_perplexity(const PerplexityOptions& opt, std::ostream& log) {
  if (opt.context != 0 && opt.context < 2) STRATA_FAIL("--context must be at least 2 tokens, got " << opt.context);
  const std::string text = read_text_file(opt.text);
  ModelBundle model = open_model(opt.model, {}, opt.lora);
  if (!model.tokenizer) STRATA_FAIL(model.config.name << ": the model has no tokenizer files");
  if (!model.load_note.empty() && opt.progress) log << model.load_note << "\n";
  const ModelConfig& cfg = model.config;
  if (!cfg.lm_head)
    STRATA_FAIL(opt.model << (cfg.num_labels > 0 ? ": a sequence classifier" : ": the checkpoint has no lm_head.weight "
                                                                             "(an embedding model)")
                          << ": it predicts no tokens to score");
  int context = opt.context;
  if (context == 0) context = std::min(kDefaultContext, cfg.max_positions);
  if (context > cfg.max_positions)
    STRATA_FAIL("--context " << context << " exceeds the model's context of " << cfg.max_positions << " tokens");

  // As Hugging Face's tokenizer(text, add_special_tokens=False): no BOS, even for models whose
  // tokenizer adds one by default (docs/perplexity.md).
  const std::vector<int32_t> ids = model.tokenizer->encode(text);
  if (ids.size() < 2)
    STRATA_FAIL(opt.text.string() << ": " << ids.size() << " token" << (ids.size() == 1 ? "" : "s")
                                  << "; perplexity needs at least 2");
  for (int32_t id : ids)
    if (id < 0 || id >= cfg.vocab_size)
      STRATA_FAIL(opt.text.string() << ": token id " << id << " outside the model's vocabulary of " << cfg.vocab_size
                                    << " (tokenizer does not match the model)");

  if (!opt.policy.empty()) return score_with_policy(model, opt, ids, context, log);

  std::unique_ptr<Backend> backend =
      make_backend(opt.device, opt.threads, gpu_activation_dtype(opt.dtype, cfg.checkpoint_dtype));
  log << "model " << cfg.name << " (" << cfg.n_layers << " layers, " << double(cfg.param_count()) / 1e9
      << " B parameters) on " << backend_label(*backend) << "; " << ids.size() << " tokens in windows of " << context << "\n";
  Transformer transformer(cfg, load_model_weights(cfg, *model.weights, *backend, opt.threads), *backend);
  model.weights.reset();  // the mapping is no longer needed once the weights are on the backend

  WindowProgress progress(log, opt.progress);
  return perplexity_of(ids, context, resident_scorer(transformer), [&](const PerplexityResult& r, int64_t total) {
    progress.update(r.windows, total, r.tokens);
  });
}

}  // namespace strata
