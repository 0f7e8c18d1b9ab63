// `strata perplexity --policy`: scoring through the offloading engine (src/offload/), which runs
// a model that does not fit one device, with the policy's placement and compression. The windows
// are independent sequences, so the engine scores a whole block of them per pass over the weights:
// each window is a prompt whose prompt_logprobs are asked, and its prefill's last sub-layer computes
// the log-probability of every position (OffloadEngine, score_prompts).
#include <algorithm>

#include "strata/backend/backend.h"
#include "strata/core/error.h"
#include "strata/core/size.h"
#include "strata/job/perplexity.h"
#include "strata/model/model_loader.h"
#include "strata/offload/engine.h"
#include "strata/policy/policy.h"

namespace strata {

PerplexityResult score_with_policy(ModelBundle& model, const PerplexityOptions& opt, const std::vector<int32_t>& ids,
                                   int context, std::ostream& log) {
  if (opt.policy == "auto")
    STRATA_FAIL("perplexity --policy auto: give a policy file (strata policy --out writes one for this machine)");
  const std::vector<TokenWindow> windows = split_windows(int64_t(ids.size()), context);
  OffloadOptions o;
  o.policy = load_policy(opt.policy);
  if (!opt.gpu_mem.empty()) o.gpu_budget = double(parse_size(opt.gpu_mem, "--gpu-mem"));
  if (!opt.cpu_mem.empty()) o.cpu_budget = double(parse_size(opt.cpu_mem, "--cpu-mem"));
  if (!opt.disk_mem.empty()) o.disk_budget = double(parse_size(opt.disk_mem, "--disk-mem"));
  o.offload_dir = opt.offload_dir;
  o.cpu_threads = opt.threads;
  std::unique_ptr<Backend> backend =
      make_backend(opt.device, opt.threads, gpu_activation_dtype(opt.dtype, model.config.checkpoint_dtype));
  int64_t longest = 0;
  for (const TokenWindow& w : windows) longest = std::max(longest, w.size);
  const PlanShape shape{int(longest), 1};  // each window generates one token, which is not scored
  log << "model " << model.config.name << " on " << backend_label(*backend) << ", policy " << opt.policy.string() << ": block "
      << o.policy.gpu_batch_size << " x " << o.policy.num_gpu_batches << "; " << ids.size() << " tokens in "
      << windows.size() << " windows of " << context << "\n";
  OffloadEngine engine(model.config, *model.weights, *backend, o, shape);
  if (o.policy.compress_weights) log << describe_weight_codes(engine.report(), *o.policy.compress_weights) << "\n";

  PerplexityResult r;
  const size_t block = size_t(engine.block_size());
  for (size_t first = 0; first < windows.size(); first += block) {
    std::vector<GenRequest> reqs;
    for (size_t k = first; k < std::min(windows.size(), first + block); ++k) {
      GenRequest q;
      q.prompt.assign(ids.begin() + windows[k].begin, ids.begin() + windows[k].begin + windows[k].size);
      q.sampling.max_new_tokens = 1;
      q.sampling.ignore_eos = true;
      q.prompt_logprobs = 0;
      reqs.push_back(std::move(q));
    }
    for (const GenResult& g : engine.generate(reqs)) {
      std::vector<double> nlls;
      for (const StepLogprobs& p : g.prompt_logprobs) nlls.push_back(-p.sampled.logprob);
      r.add_window(nlls);
    }
    if (opt.progress)
      log << "[strata] " << r.windows << "/" << windows.size() << " windows, " << r.tokens << " tokens scored\n";
  }
  return r;
}

}  // namespace strata
