#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <tuple>

#include "commands.h"
#include "strata/backend/backend.h"
#include "strata/core/error.h"
#include "strata/job/batch_job.h"
#include "strata/runtime/json_schema.h"
#include "strata/runtime/regex_rules.h"

namespace strata::cli {

namespace {

// --json-schema's file as the schema's text, its keys in the order written; refused here, before
// any work, when Strata cannot hold answers to it.
// --lora's value: NAME=DIR (a name without '/' before the first '='), else DIR alone.
std::pair<std::string, std::filesystem::path> lora_argument(const std::string& value) {
  const size_t eq = value.find('=');
  if (eq == std::string::npos || eq == 0 || value.substr(0, eq).find('/') != std::string::npos) return {"", value};
  return {value.substr(0, eq), value.substr(eq + 1)};
}

std::string read_json_schema_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::ordered_json schema;
  try {
    schema = nlohmann::ordered_json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    STRATA_FAIL(path << ": invalid JSON: " << e.what());
  }
  try {
    compile_json_schema(schema);
  } catch (const JsonSchemaError& e) {
    STRATA_FAIL(path << ": " << e.what());
  }
  return schema.dump();
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto opt = std::make_shared<JobOptions>();
  CLI::App* cmd = app.add_subcommand("run", "generate completions for a JSONL file of prompts");
  cmd->add_option("--model", opt->model,
                  "model directory, .gguf file, or dummy:PRESET (default: SmolLM2-135M-Instruct from the cache)");
  cmd->add_option("-i,--prompts", opt->prompts,
                  "input JSONL: {\"id\", \"prompt\", optional sampling fields}, or OpenAI batch requests "
                  "{\"custom_id\", \"method\", \"url\", \"body\"} (docs/batch-format.md)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("-o,--out", opt->out, "output JSONL (written as OUT.partial until the job finishes)")->required();
  cmd->add_option("--errors", opt->errors,
                  "OpenAI batch input: write the error lines of requests that cannot be served here, not to --out");
  cmd->add_option("--shard", opt->shard,
                  "i/N: run only the requests whose id hashes to i mod N (FNV-1a 64; docs/scale-out.md)");
  cmd->add_option("--tokenizer", opt->tokenizer, "tokenizer directory replacing the model's own");
  auto lora = std::make_shared<std::string>();
  cmd->add_option("--lora", *lora,
                  "PEFT LoRA adapter directory (adapter_config.json, adapter_model.safetensors), merged into the "
                  "model's weights as they load; NAME=DIR, as vLLM's --lora-modules: OpenAI requests whose "
                  "body.model is not NAME get model_not_found");
  cmd->add_option("--hf-overrides", opt->hf_overrides,
                  "JSON object whose keys replace the model directory's config.json's, as vLLM's option: the "
                  "original Qwen3-Reranker as a cross-encoder is '{\"architectures\": "
                  "[\"Qwen3ForSequenceClassification\"], \"classifier_from_token\": [\"no\", \"yes\"], "
                  "\"is_original_qwen3_reranker\": true}' (docs/batch-format.md \"Cross-encoders\")");
  cmd->add_option("--device", opt->device, "cpu, cuda or auto (cuda when a GPU is present)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str();
  cmd->add_option("--dtype", opt->dtype,
                  "GPU activations and weights: auto (bf16 for a bf16 checkpoint on sm_80 and newer, else fp16), "
                  "fp16 or bf16; the cpu backend computes in fp32")
      ->check(CLI::IsMember({"auto", "fp16", "bf16"}))
      ->capture_default_str();
  cmd->add_option("--batch-size", opt->batch_size, "sequences generated together")->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--threads", opt->threads, "CPU threads: the cpu backend, CPU attention under --policy, loading the weights and checking the input (0: all cores)")->capture_default_str();
  // The flags a model's recommended sampling settings do not replace when given.
  std::map<std::string, CLI::Option*> sampling_flags;
  auto* prefill = cmd->add_option("--prefill-tokens", opt->prefill_token_budget,
                                  "tokens per prefill step (under --policy: the policy's prefill_tokens, else 1024)")
                       ->check(CLI::PositiveNumber)
                       ->capture_default_str();
  sampling_flags["max_new_tokens"] = cmd->add_option("--max-new-tokens", opt->defaults.max_new_tokens, "default when a line gives none")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sampling_flags["temperature"] = cmd->add_option("--temperature", opt->defaults.temperature, "default temperature (0: greedy; see --generation-config)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sampling_flags["top_p"] = cmd->add_option("--top-p", opt->defaults.top_p, "default nucleus mass")->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  sampling_flags["top_k"] = cmd->add_option("--top-k", opt->defaults.top_k, "default top-k (0: off)")->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sampling_flags["min_p"] = cmd->add_option("--min-p", opt->defaults.min_p, "default min-p (0: off)")->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  sampling_flags["repetition_penalty"] = cmd->add_option("--repetition-penalty", opt->defaults.repetition_penalty,
                  "default repetition penalty over the prompt's and the answer's tokens (1: off)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--frequency-penalty", opt->defaults.frequency_penalty,
                  "default frequency penalty over the answer's tokens (0: off)")
      ->check(CLI::Range(-2.0, 2.0))
      ->capture_default_str();
  cmd->add_option("--presence-penalty", opt->defaults.presence_penalty,
                  "default presence penalty over the answer's tokens (0: off)")
      ->check(CLI::Range(-2.0, 2.0))
      ->capture_default_str();
  cmd->add_option("--min-tokens", opt->defaults.min_tokens,
                  "default min_tokens: EOS, stop ids and stop strings are held back until an answer is this long "
                  "(at most its line's max tokens)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--seed", opt->defaults.seed, "default seed")->capture_default_str();
  auto generation_config = std::make_shared<std::string>("auto");
  cmd->add_option("--generation-config", *generation_config,
                  "auto: the sampling settings the model recommends (generation_config.json's temperature, top_p, "
                  "top_k, min_p, repetition_penalty, max_new_tokens; a GGUF's general.sampling.*) replace the "
                  "defaults above whose flag is not given, as vLLM and llama.cpp take them; none: Strata's defaults")
      ->check(CLI::IsMember({"auto", "none"}))
      ->capture_default_str();
  cmd->add_flag("--ignore-eos", opt->defaults.ignore_eos, "generate max_new_tokens even past EOS (benchmarks)");
  cmd->add_option("--stop", opt->stop,
                  "stop string for lines that give no \"stop\" (repeat for up to 4): a completion ends at its "
                  "first match, which is cut from the text")
      ->allow_extra_args(false);
  const std::map<std::string, ResponseFormat> formats = {{"text", ResponseFormat::Text},
                                                          {"json_object", ResponseFormat::JsonObject}};
  cmd->add_option("--response-format", opt->response_format,
                  "for lines that give no response_format: text, or json_object (each answer one JSON object or "
                  "array, ending at its closing bracket)")
      ->transform(CLI::CheckedTransformer(formats, CLI::ignore_case))
      ->default_str("text");
  auto* schema = cmd->add_option("--json-schema", opt->json_schema,
                                 "JSON schema file for lines that give no response_format: each answer a document of "
                                 "it (docs/batch-format.md, \"JSON answers\")")
                     ->check(CLI::ExistingFile);
  auto* regex = cmd->add_option("--regex", opt->pattern,
                                "for lines that give no response_format or structured outputs: each answer a text the "
                                "regex matches whole (vLLM's structured_outputs regex)");
  auto choices = std::make_shared<std::vector<std::string>>();
  auto* choice = cmd->add_option("--choice", *choices,
                                 "for lines that give no response_format or structured outputs: each answer one of "
                                 "these strings (repeat the flag; vLLM's structured_outputs choice)")
                     ->allow_extra_args(false);
  cmd->add_option("--reasoning-effort", opt->reasoning_effort,
                  "for lines that give no reasoning_effort: low, medium or high, what GPT-OSS's chat template writes "
                  "in its system message (default: the template's, medium)")
      ->check(CLI::IsMember({"low", "medium", "high"}));
  cmd->add_flag("--no-thinking", opt->no_thinking,
                "for lines whose chat_template_kwargs do not set enable_thinking: false, so that Qwen3 answers "
                "without reasoning (its template closes an empty <think> block)");
  cmd->add_option("--chat-template", opt->chat_template,
                  "Jinja chat template file to render messages with instead of the model's (a known family's is "
                  "recognized, any other interpreted; docs/batch-format.md \"Chat templates\"); for a "
                  "cross-encoder, the score template its pairs are rendered with (roles query and document)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--tool-call-parser", opt->tool_call_parser,
                  "how answers to requests with tools are read for calls, as vLLM's option: auto (the chat "
                  "template's: Qwen's and <tool_call> templates hermes, Llama 3.1's llama3_json), hermes, "
                  "llama3_json, or none (answers as text)")
      ->check(CLI::IsMember({"auto", "hermes", "llama3_json", "none"}))
      ->default_str("auto");
  cmd->add_option("--pooling", opt->pooling,
                  "for embeddings requests ('input' lines, /v1/embeddings): last (the last token's state), mean, or "
                  "cls (the first token's) (default: the model's modules.json or GGUF pooling_type, else last)")
      ->check(CLI::IsMember({"last", "mean", "cls"}));
  auto normalized = std::make_shared<bool>(true);
  auto* normalize = cmd->add_flag("--normalize,!--no-normalize", *normalized,
                                  "for embeddings requests: divide each vector by its L2 norm, or not (default: as "
                                  "the model's modules.json says; without one, normalized)");
  cmd->add_flag("!--no-progress", opt->progress, "no progress line");
  cmd->add_flag("!--no-refill", opt->refill,
                "generate in blocks whose slots all wait for the block's longest answer (default: a finished "
                "answer's slot takes the next request at once, under --policy too)");
  cmd->add_flag("--ordered", opt->ordered,
                "write answers in input order (default: completion order; holds back at most one window)");
  cmd->add_option("--window", opt->window,
                  "requests read and tokenized ahead, grouped by length into blocks (0: max(8 blocks, 4096))")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_flag("!--no-prefix-sharing", opt->share_prefixes,
                "compute every prompt whole (default: prompts that begin alike, e.g. with one instruction, "
                "compute the common beginning once; under --policy within each prefill step)");
  cmd->add_option("--policy", opt->policy,
                  "placement policy YAML (policies/), or auto (searched with the cost model for this machine's "
                  "cached profile); offloads weights, KV cache and activations; its block replaces --batch-size")
      ->check(CLI::ExistingFile | CLI::IsMember({"auto"}));
  cmd->add_flag("--compress", opt->allow_compression,
                "with --policy auto: also consider 4-bit weights and KV cache (group 64) and the weights' own codes "
                "(GPTQ/AWQ, GGUF, MXFP4), as strata policy --compress");
  cmd->add_option("--gpu-mem", opt->gpu_mem, "GPU tier budget, e.g. 16GiB (default: free device memory)");
  cmd->add_option("--cpu-mem", opt->cpu_mem, "pinned CPU tier budget, e.g. 64GiB (default: available memory)");
  cmd->add_option("--disk-mem", opt->disk_mem, "disk tier budget (default: free space of the offload dir)");
  cmd->add_option("--offload-dir", opt->offload_dir, "directory for the disk tier (default: ~/.cache/strata/offload)");
  cmd->add_flag("--no-overlap", opt->no_overlap, "run loads, stores and compute one after another (ablation)");
  cmd->add_flag("--verbose", opt->verbose, "print the realized placement before starting");
  cmd->add_flag("--report", opt->report, "print throughput, stream busy times, bytes per link and peak memory");
  cmd->add_option("--trace", opt->trace, "write a Chrome trace-event timeline (Perfetto) of the schedule");
  cmd->callback([opt, prefill, schema, regex, choice, choices, lora, sampling_flags, generation_config, normalize,
                 normalized] {
    if (normalize->count() > 0) opt->normalize = *normalized;
    std::tie(opt->lora_name, opt->lora) = lora_argument(*lora);
    opt->prefill_tokens_given = prefill->count() > 0;
    opt->model_sampling = *generation_config == "auto";
    for (const auto& [field, flag] : sampling_flags)
      if (flag->count() > 0) opt->defaults_given.insert(field);
    if (schema->count() > 0) {
      if (opt->response_format != ResponseFormat::Text)
        STRATA_FAIL("give --json-schema or --response-format json_object, not both");
      opt->json_schema = read_json_schema_file(opt->json_schema);
      opt->response_format = ResponseFormat::JsonSchema;
    }
    if (int(regex->count() > 0) + int(choice->count() > 0) + int(opt->response_format != ResponseFormat::Text) > 1)
      STRATA_FAIL("give one of --response-format, --json-schema, --regex and --choice");
    if (regex->count() > 0) {
      try {
        compile_regex(opt->pattern);
      } catch (const RegexError& e) {
        STRATA_FAIL("--regex: " << e.what());
      }
      opt->response_format = ResponseFormat::Regex;
    } else if (choice->count() > 0) {
      opt->pattern = nlohmann::json(*choices).dump();
      opt->response_format = ResponseFormat::Choice;
    }
    run_batch_job(*opt, std::cerr);
  });
}

}  // namespace strata::cli
