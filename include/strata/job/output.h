// The batch job's output. Lines go to OUT.partial, flushed after every batch; only a job that
// finished renames it to OUT, so a file named OUT is always complete. A rerun after a crash or
// Ctrl-C finds OUT.partial, keeps its complete lines, and skips the ids already answered.
#pragma once
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_set>
#include <vector>

#include "strata/job/prompts.h"

namespace strata {

class OutputWriter {
public:
  explicit OutputWriter(std::filesystem::path out);
  ~OutputWriter();
  OutputWriter(const OutputWriter&) = delete;
  OutputWriter& operator=(const OutputWriter&) = delete;

  // ids (as json dumps: "id", or "custom_id" for OpenAI lines) already present in a partial file
  // from an earlier run, error lines included
  const std::unordered_set<std::string>& done_ids() const { return done_; }
  void write(const nlohmann::json& line);
  void flush();   // pushes the lines to the disk (fflush + fsync); errors name the file
  void finish();  // flush, close, rename OUT.partial -> OUT

  std::filesystem::path partial_path() const { return partial_; }

private:
  std::filesystem::path out_, partial_;
  std::FILE* file_ = nullptr;
  std::unordered_set<std::string> done_;
};

// OpenAI batch output lines (docs/batch-format.md). Ids are derived from the custom_id, so a rerun
// or another shard writes the same ids for the same requests.
struct CompletionChoice {
  std::string text;
  std::string finish_reason;  // OpenAI's: "stop" (EOS or a stop string) or "length"
  nlohmann::json logprobs;    // null unless asked for; the endpoint's shape (job/answers.h)
};
struct Completion {
  std::vector<CompletionChoice> choices;  // indexed 0 .. n-1; empty: the one choice below
  std::string text;                       // the one choice, when `choices` is empty
  std::string finish_reason;
  int64_t prompt_tokens = 0, completion_tokens = 0;  // completion_tokens: all choices'
  std::string model;          // echoed: the request's body.model, else the model's name
  int64_t created = 0;        // Unix seconds
};
nlohmann::json openai_response_line(const PromptRecord& r, const Completion& c);
nlohmann::json openai_error_line(const PromptRecord& r, const ServeError& e);

}  // namespace strata
