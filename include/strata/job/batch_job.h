// `strata run`: prompts.jsonl -> check every line (pass 1) -> read and tokenize a window ahead
// (thread) -> slots refilled as answers finish (continuous batching; --no-refill or --policy:
// length-aware blocks) -> generate, or embed (this thread) -> detokenize and write (thread) ->
// out.jsonl, in the strata line format or OpenAI's batch format (docs/batch-format.md), optionally
// one shard of it. Memory holds a window of requests, not the file.
#pragma once
#include <filesystem>
#include <iosfwd>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "strata/job/blocks.h"
#include "strata/job/prompts.h"
#include "strata/model/config.h"
#include "strata/runtime/sampler.h"

namespace strata {

struct JobOptions {
  std::string model;                       // directory, .gguf, or dummy:PRESET
  std::filesystem::path tokenizer;         // optional tokenizer directory override
  std::filesystem::path lora;              // optional PEFT LoRA adapter merged at load (model/lora.h)
  // --lora NAME=DIR: OpenAI requests whose body.model names another model get model_not_found.
  std::string lora_name;
  // --hf-overrides: a JSON object whose keys replace config.json's (vLLM's option; open_model).
  std::string hf_overrides;
  std::filesystem::path prompts, out;
  std::filesystem::path errors;            // OpenAI format: error lines go here instead of `out`
  std::string shard;                       // "i/N": only the requests whose id hashes to i mod N
  std::string device = "auto";             // cpu, cuda, auto
  std::string dtype = "auto";  // the GPU's activations: auto (the checkpoint's), fp16, bf16
  int batch_size = 32;                     // sequences generated together (continuous batching: slots)
  // Continuous batching (resident generator): a finished answer's slot takes the next request at
  // once. false (--no-refill): blocks, each slot waiting for its block's longest answer.
  bool refill = true;
  int threads = 0;                         // CPU threads (0: all cores)
  int64_t prefill_token_budget = 4096;     // tokens per prefill step
  bool prefill_tokens_given = false;       // --prefill-tokens given: it also overrides a policy's
  SamplingParams defaults;                 // for fields a prompt line leaves out
  // --generation-config auto (true): the model's recommended sampling settings
  // (RecommendedSampling: generation_config.json, GGUF general.sampling.*) replace those
  // defaults whose flag was not given, as vLLM and llama.cpp take them; none (false): Strata's.
  bool model_sampling = true;
  std::set<std::string> defaults_given;    // sampling flags given, by field name ("temperature")
  std::vector<std::string> stop;           // --stop: stop strings for lines that give no "stop"
  // --response-format / --json-schema: for lines that give no response_format (json_object: one
  // JSON document each; JsonSchema: a document of json_schema, the schema's text).
  ResponseFormat response_format = ResponseFormat::Text;
  std::string json_schema;
  std::string pattern;  // --regex (Regex) or --choice (Choice: the strings as a JSON array)
  // --reasoning-effort: for lines that give no reasoning_effort (GPT-OSS's template; "" its default).
  std::string reasoning_effort;
  // --no-thinking: enable_thinking false for lines that do not set it (Qwen3 answers without reasoning).
  bool no_thinking = false;
  // --chat-template: a Jinja chat template file used instead of the model's (vLLM's option); empty:
  // the model's.
  std::filesystem::path chat_template;
  // --tool-call-parser (vLLM's names): how answers with tools are read for calls. "auto": the chat
  // template's (tool_call_format); "hermes", "llama3_json" or "none" (answers read as text).
  std::string tool_call_parser = "auto";
  bool progress = true;                    // progress line on the log stream
  bool ordered = false;                    // write in input order (a reorder buffer of one window)
  int window = 0;                          // requests read ahead and grouped by length; 0: max(8 blocks, 4096)
  bool share_prefixes = true;              // prompts that begin alike compute the beginning once
  // Embeddings requests: --pooling (last, mean, cls; empty: the model's modules.json or GGUF
  // pooling_type, else last) and --normalize / --no-normalize (unset: the model's Normalize
  // module; with no pooling config, normalized), each overriding the model's.
  std::string pooling;
  std::optional<bool> normalize;

  // Offloading (strata run --policy): the engine replaces the resident generator when set.
  std::filesystem::path policy;            // policy YAML; empty: everything resident, --batch-size batches
  bool allow_compression = false;          // --policy auto may pick 4-bit weights and/or KV cache
  std::string gpu_mem, cpu_mem, disk_mem;  // tier budgets ("16GiB"); empty: what the machine has free
  std::filesystem::path offload_dir;       // disk tier files; empty: ~/.cache/strata/offload
  bool no_overlap = false;                 // run the schedule's steps one after another (ablations)
  bool verbose = false;                    // print the realized placement before starting
  bool report = false;                     // print throughput, stream busy time, link bytes, peaks
  std::filesystem::path trace;             // Chrome trace-event JSON of the schedule
};

struct JobSummary {
  int64_t prompts = 0, resumed = 0, prompt_tokens = 0, generated_tokens = 0;
  int64_t shared_prompt_tokens = 0;        // prompt tokens copied from a shared prefix, not computed
  int64_t errors = 0;                      // requests answered with an error line (this run)
  int64_t in_file = 0;                     // requests in the file (prompts: this shard's)
  double prefill_seconds = 0, decode_seconds = 0, wall_seconds = 0;
  double scan_seconds = 0;                 // pass 1: checking every line
  double first_answer_seconds = -1;        // from the start until the first line was flushed
  int64_t blocks = 0;                      // blocks run through the generator
  Padding padding;                         // of the blocks run (length-aware)
  Padding padding_input_order;             // of the same windows cut in input order (FlexGen)
  int64_t window = 0, window_peak = 0;     // the window's size, the most requests it held
  int64_t reorder_peak = 0;                // --ordered: the most lines held back
  bool refilled = false;                   // continuous batching ran (else blocks)
  double occupancy = 0;                    // share of slots that decoded a live sequence per decode step
  // Embeddings requests: their inputs, the tokens those held, and the time spent embedding them.
  int64_t embedded_inputs = 0, embedded_tokens = 0;
  double embed_seconds = 0;
  // Requests asking for prompt logprobs (echo with logprobs, prompt_logprobs) and the prompt
  // positions scored for them (this run).
  int64_t scored_prompts = 0, scored_positions = 0;
};

// Takes each of the model's recommended settings into `defaults` unless its field (temperature,
// top_p, top_k, min_p, repetition_penalty, max_new_tokens) is in `given`; returns "field value"
// for each taken, for the job's log.
std::vector<std::string> take_recommended_sampling(SamplingParams& defaults, const RecommendedSampling& model,
                                                   const std::set<std::string>& given);

// Runs the whole job; progress and the final summary go to `log`. Throws strata::Error on bad
// input (before any generation) and on failures (finished batches stay in OUT.partial).
JobSummary run_batch_job(const JobOptions& options, std::ostream& log);

}  // namespace strata
