// The batch job's input: one JSON object per line,
//   {"id": ..., "prompt": "...", optional "max_new_tokens", "temperature", "top_p", "top_k", "seed"}
// The whole file is validated before any work starts, so bad input fails fast with file:line.
#pragma once
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "strata/model/chat_template.h"
#include "strata/runtime/sampler.h"

namespace strata {

struct PromptRecord {
  nlohmann::json id;        // a string or an integer, echoed in the output
  std::string id_key;       // id.dump(): unique key for duplicate checks and resume
  int line = 0;             // 1-based line in the input file
  std::string prompt;       // empty when messages are given
  std::vector<ChatMessage> messages;
  SamplingParams sampling;
};

// Reads and validates every line; throws strata::Error "FILE:LINE: reason" on the first bad one.
// Blank lines are skipped. Unknown keys are reported once each through `warn`.
std::vector<PromptRecord> read_prompts(const std::filesystem::path& file, const SamplingParams& defaults,
                                       const std::function<void(const std::string&)>& warn = {});

}  // namespace strata
