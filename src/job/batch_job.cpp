#include "strata/job/batch_job.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <optional>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <fstream>
#include <sstream>

#include "strata/backend/backend.h"
#include "strata/core/error.h"
#include "strata/job/answers.h"
#include "strata/job/output.h"
#include "strata/job/prompts.h"
#include "strata/model/model_loader.h"
#include "strata/core/size.h"
#include "strata/offload/engine.h"
#include "strata/policy/search.h"
#include "strata/profile/profiler.h"
#include "strata/policy/policy.h"
#include "strata/runtime/generator.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

struct Tokenized {
  const PromptRecord* record;
  std::vector<int32_t> ids;
};

// The text to tokenize: the prompt itself, or the messages rendered with the model's chat template.
std::string render_prompt(const PromptRecord& r, const std::optional<ChatTemplate>& chat, const std::string& where) {
  if (r.messages.empty()) return r.prompt;
  if (!chat) throw Error(where + ": 'messages' given, but the model has no chat template; give 'prompt'");
  return chat->render(r.messages, /*add_generation_prompt=*/true);
}

// Tokenizes the job's requests. A strata line that cannot be served stops the job (FILE:LINE); an
// OpenAI request becomes an error answer instead, as do requests that arrived with one.
struct Prepared {
  std::vector<Tokenized> work;
  std::vector<std::pair<const PromptRecord*, ServeError>> errors;
};

Prepared tokenize_all(const std::vector<const PromptRecord*>& records, const ModelBundle& model,
                      const std::string& file) {
  Prepared out;
  out.work.reserve(records.size());
  const ModelConfig& cfg = model.config;
  std::optional<ChatTemplate> chat;  // parsed once; an unsupported template fails only if used
  const bool any_messages = std::any_of(records.begin(), records.end(),
                                        [](const PromptRecord* r) { return !r->messages.empty() && !r->error; });
  std::string no_chat = "'messages' given, but the model has no chat template; give 'prompt'";
  if (any_messages && !model.chat_template.empty()) {
    try {
      chat = ChatTemplate::parse(model.chat_template);
    } catch (const Error& e) {
      no_chat = std::string("'messages' given, but the model's chat template cannot be used: ") + e.what();
    }
  }
  for (const PromptRecord* rp : records) {
    const PromptRecord& r = *rp;
    if (r.error) {
      out.errors.emplace_back(&r, *r.error);
      continue;
    }
    const std::string where = file + ":" + std::to_string(r.line);
    const bool openai = r.format == InputFormat::OpenAIBatch;
    auto unservable = [&](const std::string& code, const std::string& why) {
      if (!openai) throw Error(where + ": " + why);
      out.errors.emplace_back(&r, ServeError{code, why});
    };
    if (!r.messages.empty() && !chat) {
      unservable("unsupported_model", no_chat);
      continue;
    }
    Tokenized t{&r, {}};
    if (model.add_bos) t.ids.push_back(cfg.bos_id);
    const std::vector<int32_t> ids = model.tokenizer->encode(render_prompt(r, chat, where));
    t.ids.insert(t.ids.end(), ids.begin(), ids.end());
    if (t.ids.empty()) {
      unservable("invalid_value", "the prompt has no tokens");
      continue;
    }
    for (int32_t id : t.ids)
      if (id < 0 || id >= cfg.vocab_size)
        throw Error(where + ": token id " + std::to_string(id) + " outside the model's vocabulary of " +
                    std::to_string(cfg.vocab_size) + " (tokenizer does not match the model)");
    if (int(t.ids.size()) >= cfg.max_positions) {
      unservable("context_length_exceeded", "prompt of " + std::to_string(t.ids.size()) +
                                                " tokens fills the model's context of " +
                                                std::to_string(cfg.max_positions));
      continue;
    }
    out.work.push_back(std::move(t));
  }
  return out;
}

class Progress {
public:
  Progress(std::ostream& log, bool enabled, int64_t total)
      : log_(log), enabled_(enabled), tty_(enabled && isatty(STDERR_FILENO)), total_(total), t0_(Clock::now()) {}
  void update(int64_t done, int64_t tokens, bool force = false) {
    if (!enabled_) return;
    const double t = std::chrono::duration<double>(Clock::now() - t0_).count();
    if (!force && t - last_ < (tty_ ? 0.2 : 5.0)) return;
    last_ = t;
    log_ << (tty_ ? "\r" : "") << "[strata] " << done << "/" << total_ << " prompts, " << tokens
         << " tokens generated, " << std::fixed << std::setprecision(1) << (t > 0 ? double(tokens) / t : 0.0)
         << " tok/s, " << t << " s" << (tty_ ? "   " : "\n") << std::flush;
  }
  void end() {
    if (enabled_ && tty_) log_ << "\n";
  }

private:
  std::ostream& log_;
  bool enabled_, tty_;
  int64_t total_;
  Clock::time_point t0_;
  double last_ = -1e9;
};

// Runs batches through either the resident generator or the offloading engine.
class Generator {
public:
  virtual ~Generator() = default;
  virtual size_t batch_size() const = 0;
  virtual std::vector<GenResult> run(const std::vector<GenRequest>& batch, GenStats& stats) = 0;
  virtual void finish(std::ostream&) {}
};

class ResidentGenerator final : public Generator {
public:
  ResidentGenerator(ModelBundle& model, const JobOptions& opt, std::ostream& log)
      : backend_(make_backend(opt.device, opt.threads)), batch_(size_t(opt.batch_size)) {
    log << "model " << model.config.name << " (" << model.config.n_layers << " layers, "
        << double(model.config.param_count()) / 1e9 << " B parameters) on " << backend_->name() << "\n";
    transformer_ = std::make_unique<Transformer>(model.config, load_model_weights(model.config, *model.weights, *backend_),
                                                 *backend_);
    options_.prefill_token_budget = opt.prefill_token_budget;
  }
  size_t batch_size() const override { return batch_; }
  std::vector<GenResult> run(const std::vector<GenRequest>& batch, GenStats& stats) override {
    return generate(*transformer_, batch, options_, &stats);
  }

private:
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Transformer> transformer_;
  GenOptions options_;
  size_t batch_;
};

void print_report(const OffloadReport& r, std::ostream& log) {
  auto gbps = [](const LinkStats& l) {
    std::ostringstream os;
    os << std::fixed << std::setprecision(3) << double(l.bytes) / 1e9 << " GB in " << l.seconds << " s ("
       << std::setprecision(2) << l.gb_per_s() << " GB/s)";
    return os.str();
  };
  const GenStats& g = r.gen;
  const double gen_s = g.prefill_seconds + g.decode_seconds;
  auto rate = [](double n, double s) { return s > 0 ? n / s : 0.0; };
  log << std::fixed << std::setprecision(2) << "report:\n"
      << "  throughput: prefill " << rate(double(g.prompt_tokens), g.prefill_seconds) << " prompt tok/s, decode "
      << rate(double(g.generated_tokens), g.decode_seconds) << " tok/s, total "
      << rate(double(g.generated_tokens), gen_s) << " generated tok/s (generated / (prefill + decode time))\n"
      << "  busy: compute " << r.compute_busy << " s, cpu->gpu " << r.h2d_busy << " s, gpu->cpu " << r.d2h_busy
      << " s, disk " << r.disk_busy << " s; schedule wall " << r.schedule_seconds << " s; overlap "
      << std::setprecision(0) << 100 * r.overlap() << "%\n"
      << "  disk->cpu: " << gbps(r.disk_to_cpu) << "\n  cpu->gpu:  " << gbps(r.cpu_to_gpu)
      << "\n  gpu->cpu:  " << gbps(r.gpu_to_cpu) << "\n  cpu->disk: " << gbps(r.cpu_to_disk) << "\n"
      << "  peak memory: gpu " << format_bytes(r.peak.gpu) << ", cpu (pinned) " << format_bytes(r.peak.cpu)
      << ", disk " << format_bytes(r.peak.disk) << (r.disk_io.empty() ? "" : " via " + r.disk_io)
      << " reserved; used " << format_bytes(r.used.gpu) << ", " << format_bytes(r.used.cpu) << ", "
      << format_bytes(r.used.disk) << "\n";
}

class OffloadGenerator final : public Generator {
public:
  OffloadGenerator(ModelBundle& model, const JobOptions& opt, const PlanShape& shape, size_t prompts, std::ostream& log)
      : backend_(make_backend(opt.device, opt.threads)), opt_(opt) {
    OffloadOptions o;
    if (!opt.gpu_mem.empty()) o.gpu_budget = double(parse_size(opt.gpu_mem, "--gpu-mem"));
    if (!opt.cpu_mem.empty()) o.cpu_budget = double(parse_size(opt.cpu_mem, "--cpu-mem"));
    if (!opt.disk_mem.empty()) o.disk_budget = double(parse_size(opt.disk_mem, "--disk-mem"));
    o.offload_dir = opt.offload_dir;
    o.policy = opt.policy == "auto" ? choose_policy(model.config, o, shape, prompts, log) : load_policy(opt.policy);
    if (opt.no_overlap) o.policy.overlap = false;
    if (opt.prefill_tokens_given) o.policy.prefill_tokens = int(std::min<int64_t>(opt.prefill_token_budget, 1 << 24));
    o.trace = !opt.trace.empty();
    o.cpu_threads = opt.threads;
    log << "model " << model.config.name << " (" << model.config.n_layers << " layers, "
        << double(model.config.param_count()) / 1e9 << " B parameters) on " << backend_->name() << ", policy "
        << opt.policy.string() << ": block " << o.policy.gpu_batch_size << " x " << o.policy.num_gpu_batches
        << ", prompt <= " << shape.prompt_len << ", generation <= " << shape.gen_len
        << ", prefill steps of <= " << o.policy.prefill_step_tokens() << " tokens"
        << (o.policy.overlap ? "" : ", no overlap") << "\n";
    const PlacementPlan plan = plan_placement(model.config, o.policy, shape, backend_->activation_dtype());
    if (opt.verbose || opt.report) log << "placement:\n" << describe_plan(plan, o.policy);
    // Placing a large model (reading it, writing its disk share) takes minutes: say how far it is.
    const auto t0 = Clock::now();
    double last = 0;
    const bool progress = opt.progress;
    o.on_layer_loaded = [&log, t0, &last, progress](int done, int total) {
      const double t = std::chrono::duration<double>(Clock::now() - t0).count();
      if (!progress || (t - last < 5.0 && done < total) || t < 2.0) return;
      last = t;
      log << "[strata] placing weights: " << done << "/" << total << " layers, " << std::fixed << std::setprecision(0)
          << t << " s\n";
    };
    engine_ = std::make_unique<OffloadEngine>(model.config, *model.weights, *backend_, o, shape);
  }
  size_t batch_size() const override { return size_t(engine_->block_size()); }
  std::vector<GenResult> run(const std::vector<GenRequest>& batch, GenStats& stats) override {
    return engine_->generate(batch, &stats);
  }
  // --policy auto: this machine's profile (measured once and cached), the tier budgets, and the
  // cost model's search for this job's longest prompt and generation.
  HardwareProfile machine_profile(std::ostream& log) {
    const std::filesystem::path path = default_hardware_profile_path();
    if (std::filesystem::exists(path)) return load_hardware_profile(path);
    log << "policy auto: no hardware profile at " << path.string() << "; profiling this machine once\n";
    ProfileOptions p;
    p.backend = backend_->device() == Device::CUDA ? "cuda" : "cpu";
    p.offload_dir = opt_.offload_dir;
    p.threads = opt_.threads;
    p.progress = [&log](const std::string& line) { log << "  " << line << "\n"; };
    const HardwareProfile hw = profile_machine(p);
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << hardware_profile_to_yaml(hw);
    log << "policy auto: wrote " << path.string() << "\n";
    return hw;
  }

  Policy choose_policy(const ModelConfig& cfg, const OffloadOptions& o, const PlanShape& shape, size_t prompts,
                       std::ostream& log) {
    const HardwareProfile hw = machine_profile(log);
    SearchOptions s;
    s.workload = {shape.prompt_len, std::max(shape.gen_len, 1)};
    s.budget = default_budgets(*backend_, o);
    if (backend_->device() == Device::CPU) {
      // The cost model counts fp16 bytes; the CPU backend keeps fp32, and its "gpu" and "cpu"
      // tiers share host memory: give each half of it, in fp16-equivalent bytes.
      const double host = std::min(s.budget.gpu, s.budget.cpu) / 2;
      s.budget.gpu = std::min(s.budget.gpu, host) / 2;
      s.budget.cpu = std::min(s.budget.cpu, host) / 2;
    }
    const SearchResult r = search_policy(cfg, hw, s);
    const Candidate& best = r.ranked.front();
    Policy chosen = best.policy;
    // A job smaller than the block: shrink the block to it (less memory, same schedule).
    if (prompts > 0 && prompts < size_t(chosen.block_size())) {
      chosen.gpu_batch_size = int(std::min<size_t>(size_t(chosen.gpu_batch_size), prompts));
      chosen.num_gpu_batches = int((prompts + size_t(chosen.gpu_batch_size) - 1) / size_t(chosen.gpu_batch_size));
    }
    log << "policy auto (" << hw.name << ", prompt " << s.workload.prompt_len << ", generation " << s.workload.gen_len
        << "): predicted " << std::fixed << std::setprecision(2) << best.prediction.throughput_tok_s
        << " tok/s, search " << std::setprecision(3) << r.seconds << " s\n"
        << (chosen.block_size() < best.policy.block_size() ? "(block shrunk to the job's " + std::to_string(prompts) + " prompts)\n" : "")
        << policy_to_yaml(chosen);
    return chosen;
  }

  void finish(std::ostream& log) override {
    if (opt_.report) print_report(engine_->report(), log);
    if (!opt_.trace.empty()) {
      engine_->write_trace(opt_.trace);
      log << "wrote trace " << opt_.trace.string() << "\n";
    }
  }

private:
  std::unique_ptr<Backend> backend_;
  const JobOptions& opt_;
  std::unique_ptr<OffloadEngine> engine_;
};

}  // namespace

JobSummary run_batch_job(const JobOptions& opt, std::ostream& log) {
  if (opt.batch_size < 1) STRATA_FAIL("--batch-size must be at least 1, got " << opt.batch_size);
  if (const std::string why = stop_strings_error(opt.stop); !why.empty()) STRATA_FAIL("--stop " << why);
  const auto wall0 = Clock::now();
  const Shard shard = opt.shard.empty() ? Shard{} : parse_shard(opt.shard);
  if (!opt.errors.empty() && std::filesystem::weakly_canonical(opt.errors) == std::filesystem::weakly_canonical(opt.out))
    STRATA_FAIL("--errors must name another file than --out (without --errors, error lines go to --out)");
  ModelBundle model = open_model(opt.model, opt.tokenizer);
  if (!model.tokenizer) STRATA_FAIL(opt.model << ": the model has no tokenizer files; pass --tokenizer DIR");

  // Validate and tokenize every line before touching the device or the output.
  const std::vector<PromptRecord> records =
      read_prompts(opt.prompts, opt.defaults, [&](const std::string& w) { log << "warning: " << w << "\n"; });
  const bool openai = !records.empty() && records.front().format == InputFormat::OpenAIBatch;
  if (!opt.errors.empty() && !records.empty() && !openai)
    STRATA_FAIL("--errors is for OpenAI batch files; " << opt.prompts.string() << " is in the strata format");
  std::vector<const PromptRecord*> mine;  // this shard's requests (all without --shard)
  for (const PromptRecord& r : records)
    if (in_shard(r, shard)) mine.push_back(&r);
  if (!opt.shard.empty())
    log << "shard " << opt.shard << ": " << mine.size() << " of " << records.size() << " requests\n";
  const Prepared prepared = tokenize_all(mine, model, opt.prompts.string());
  const std::vector<Tokenized>& all = prepared.work;

  // Load before touching the output, so a model that fails to load (or a policy that does not
  // fit) leaves no file behind.
  std::unique_ptr<Generator> gen;
  if (opt.policy.empty()) {
    gen = std::make_unique<ResidentGenerator>(model, opt, log);
  } else {
    PlanShape shape;  // the longest prompt and generation of the job bound every block
    for (const Tokenized& t : all) {
      shape.prompt_len = std::max(shape.prompt_len, int(t.ids.size()));
      shape.gen_len = std::max(shape.gen_len, std::min(t.record->sampling.max_new_tokens,
                                                       model.config.max_positions - int(t.ids.size())));
    }
    if (all.empty()) shape = {1, 1};
    size_t sequences = 0;  // a request's n choices are n sequences of the engine's block
    for (const Tokenized& t : all) sequences += size_t(t.record->n);
    gen = std::make_unique<OffloadGenerator>(model, opt, shape, sequences, log);
    for (const Tokenized& t : all)
      if (size_t(t.record->n) > gen->batch_size())
        STRATA_FAIL(opt.prompts.string() << ":" << t.record->line << ": n = " << t.record->n
                                         << " choices exceed the policy's block of " << gen->batch_size()
                                         << " sequences; a request's choices run in one block");
  }
  model.weights.reset();  // the mapping is no longer needed once the weights are in their tiers

  OutputWriter writer(opt.out);
  std::unique_ptr<OutputWriter> error_writer;  // --errors: a second resumable file
  if (!opt.errors.empty()) error_writer = std::make_unique<OutputWriter>(opt.errors);
  OutputWriter& errors_to = error_writer ? *error_writer : writer;
  auto done = [&](const PromptRecord& r) {
    return writer.done_ids().count(r.id_key) || (error_writer && error_writer->done_ids().count(r.id_key));
  };
  std::vector<const Tokenized*> todo;
  for (const Tokenized& t : all)
    if (!done(*t.record)) todo.push_back(&t);
  JobSummary sum;
  sum.prompts = int64_t(mine.size());
  sum.in_file = int64_t(records.size());
  for (const auto& [r, e] : prepared.errors)
    if (!done(*r)) {
      errors_to.write(openai_error_line(*r, e));
      ++sum.errors;
    }
  if (sum.errors > 0) {
    errors_to.flush();
    log << sum.errors << " request" << (sum.errors == 1 ? "" : "s") << " cannot be served: error lines in "
        << (error_writer ? opt.errors : opt.out).string() << "\n";
  }
  sum.resumed = int64_t(mine.size()) - int64_t(todo.size()) - sum.errors;
  if (sum.resumed > 0)
    log << "resuming " << writer.partial_path().string() << ": " << sum.resumed << " of " << mine.size()
        << " prompts already done\n";
  const int64_t created = int64_t(std::time(nullptr));

  GenStats stats;
  Progress progress(log, opt.progress, int64_t(todo.size()));
  const AnswerSettings answers{&*model.tokenizer, opt.stop, model.config.name, created};
  const size_t batch_size = gen->batch_size();
  for (size_t begin = 0, end = 0; begin < todo.size(); begin = end) {
    // Whole requests, up to batch_size sequences: a request's n choices stay in one batch.
    std::vector<GenRequest> batch;
    size_t seqs = 0;
    for (end = begin; end < todo.size() && (end == begin || seqs + size_t(todo[end]->record->n) <= batch_size); ++end) {
      batch.push_back(make_gen_request(*todo[end]->record, todo[end]->ids, answers));
      seqs += size_t(batch.back().n);
    }
    const std::vector<GenResult> results = gen->run(batch, stats);
    for (size_t i = begin, k = 0; i < end; k += size_t(batch[i - begin].n), ++i)
      writer.write(answer_line(*todo[i]->record, int64_t(todo[i]->ids.size()),
                               std::span(results).subspan(k, size_t(batch[i - begin].n)), answers));
    writer.flush();
    progress.update(int64_t(end), stats.generated_tokens, end == todo.size());
  }
  progress.end();
  writer.finish();
  if (error_writer) error_writer->finish();
  gen->finish(log);

  sum.prompt_tokens = stats.prompt_tokens;
  sum.generated_tokens = stats.generated_tokens;
  sum.prefill_seconds = stats.prefill_seconds;
  sum.decode_seconds = stats.decode_seconds;
  sum.wall_seconds = std::chrono::duration<double>(Clock::now() - wall0).count();
  auto rate = [](double n, double s) { return s > 0 ? n / s : 0.0; };
  const double gen_s = sum.prefill_seconds + sum.decode_seconds;
  log << std::fixed << std::setprecision(2) << "prompts: " << sum.prompts << " (" << sum.resumed << " resumed"
      << (sum.errors > 0 ? ", " + std::to_string(sum.errors) + " answered with an error" : std::string()) << ")"
      << (opt.shard.empty() ? std::string() : " in shard " + opt.shard + " of " + std::to_string(sum.in_file))
      << "\nprompt tokens: " << sum.prompt_tokens << ", generated tokens: " << sum.generated_tokens
      << "\nprefill: " << sum.prefill_seconds << " s, " << rate(double(sum.prompt_tokens), sum.prefill_seconds)
      << " tok/s\ndecode: " << sum.decode_seconds << " s, "
      << rate(double(sum.generated_tokens - (int64_t(todo.size()))), sum.decode_seconds)
      << " tok/s\ntotal: " << gen_s << " s, " << rate(double(sum.generated_tokens), gen_s)
      << " generated tok/s (wall " << sum.wall_seconds << " s)\nwrote " << opt.out.string() << "\n";
  return sum;
}

}  // namespace strata
