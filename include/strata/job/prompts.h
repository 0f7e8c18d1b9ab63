// The batch job's input, one JSON object per line, in one of two formats (docs/batch-format.md):
//   strata:       {"id": ..., "prompt" | "messages", optional "max_new_tokens", "temperature", ...}
//   OpenAI batch: {"custom_id", "method": "POST", "url": "/v1/chat/completions" | "/v1/completions",
//                  "body": {"model", "messages" | "prompt", "max_tokens", "temperature", ...}}
// A file holds one format, told by its first line. The whole file is validated before any work
// starts, so bad input fails fast with FILE:LINE. An OpenAI line that is well formed but cannot be
// served (a value out of range, a feature not implemented) is kept with its error, to be answered
// with an error line while the rest of the job proceeds.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "strata/model/chat_template.h"
#include "strata/runtime/sampler.h"

namespace strata {

enum class InputFormat : uint8_t { Strata, OpenAIBatch };
enum class Endpoint : uint8_t { None, ChatCompletions, Completions };  // None: the strata format

// Why a well-formed request is not served: OpenAI-style code ("invalid_value", ...) and message.
struct ServeError {
  std::string code, message;
};

struct PromptRecord {
  nlohmann::json id;        // strata: "id" (string or integer); OpenAI: "custom_id" (string)
  std::string id_key;       // id.dump(): unique key for duplicate checks and resume
  int line = 0;             // 1-based line in the input file
  std::string prompt;       // empty when messages are given
  std::vector<ChatMessage> messages;
  SamplingParams sampling;
  InputFormat format = InputFormat::Strata;
  Endpoint endpoint = Endpoint::None;
  std::string model;                 // OpenAI body.model, echoed in the response ("" if absent)
  std::optional<ServeError> error;   // OpenAI only: answer with this error instead of generating
};

// Reads and validates every line; throws strata::Error "FILE:LINE: reason" on the first malformed
// one, a duplicate id, or a line in the other format than the first line's. Blank lines are
// skipped. Unknown keys are reported once each (per name) through `warn`.
std::vector<PromptRecord> read_prompts(const std::filesystem::path& file, const SamplingParams& defaults,
                                       const std::function<void(const std::string&)>& warn = {});
// The same from a stream (tests, the fuzz target); `source` stands for FILE in the messages.
std::vector<PromptRecord> read_prompts(std::istream& in, const std::string& source, const SamplingParams& defaults,
                                       const std::function<void(const std::string&)>& warn = {});

// --shard i/N: a request belongs to shard fnv1a64(id_text(id)) % N.
struct Shard {
  uint64_t index = 0, count = 1;
};
Shard parse_shard(const std::string& text);  // "i/N", 0 <= i < N; throws strata::Error
uint64_t fnv1a64(std::string_view bytes);
// The id's UTF-8 string form: a string id as is (no quotes), an integer in decimal.
std::string id_text(const nlohmann::json& id);
inline bool in_shard(const PromptRecord& r, const Shard& s) { return fnv1a64(id_text(r.id)) % s.count == s.index; }

}  // namespace strata
