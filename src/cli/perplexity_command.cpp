// `strata perplexity`: the perplexity of a text file under a model (src/job/perplexity.cpp).
#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "strata/job/perplexity.h"

namespace strata::cli {

void add_perplexity_command(CLI::App& app) {
  auto opt = std::make_shared<PerplexityOptions>();
  auto json = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("perplexity", "perplexity of a UTF-8 text file, in non-overlapping windows");
  cmd->add_option("--model", opt->model,
                  "model directory, .gguf file, or dummy:PRESET (default: SmolLM2-135M-Instruct from the cache)");
  cmd->add_option("--lora", opt->lora, "PEFT LoRA adapter directory, merged into the model's weights as they load");
  cmd->add_option("--text", opt->text, "UTF-8 text file to score (tokenized whole, no special tokens)")->required();
  cmd->add_option("--context", opt->context,
                  "window size in tokens; each window is scored from a fresh cache (default: 512, or the model's "
                  "context if smaller)");
  cmd->add_option("--device", opt->device, "cpu, cuda or auto (cuda when a GPU is present)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str();
  cmd->add_option("--dtype", opt->dtype,
                  "GPU activations and weights: auto (bf16 for a bf16 checkpoint on sm_80 and newer, else fp16), "
                  "fp16 or bf16; the cpu backend computes in fp32")
      ->check(CLI::IsMember({"auto", "fp16", "bf16"}))
      ->capture_default_str();
  cmd->add_option("--threads", opt->threads, "CPU threads: the cpu backend, CPU attention under --policy and loading the weights (0: all cores)")->capture_default_str();
  cmd->add_option("--policy", opt->policy,
                  "placement policy YAML (policies/): score through the offloading engine, with the policy's "
                  "placement and compression, as strata run --policy")
      ->check(CLI::ExistingFile | CLI::IsMember({"auto"}));
  cmd->add_option("--gpu-mem", opt->gpu_mem, "with --policy: GPU tier budget, e.g. 16GiB (default: free device memory)");
  cmd->add_option("--cpu-mem", opt->cpu_mem, "with --policy: pinned CPU tier budget (default: available memory)");
  cmd->add_option("--disk-mem", opt->disk_mem, "with --policy: disk tier budget (default: the offload dir's free space)");
  cmd->add_option("--offload-dir", opt->offload_dir, "with --policy: directory for the disk tier");
  cmd->add_flag("--json", *json, "print one JSON line {\"perplexity\", \"tokens\", \"windows\"}");
  cmd->add_flag("!--no-progress", opt->progress, "no progress line");
  cmd->callback([opt, json] {
    const PerplexityResult r = run_perplexity(*opt, std::cerr);
    if (*json) {
      std::cout << nlohmann::json{{"perplexity", r.perplexity()}, {"tokens", r.tokens}, {"windows", r.windows}}.dump()
                << "\n";
    } else {
      char ppl[64];
      std::snprintf(ppl, sizeof ppl, "%.4f", r.perplexity());
      std::cout << "perplexity: " << ppl << " (" << r.tokens << " token" << (r.tokens == 1 ? "" : "s") << ", "
                << r.windows << " window" << (r.windows == 1 ? "" : "s") << ")\n";
    }
  });
}

}  // namespace strata::cli
