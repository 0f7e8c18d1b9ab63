// The batch job's output. Lines go to OUT.partial, flushed after every batch; only a job that
// finished renames it to OUT, so a file named OUT is always complete. A rerun after a crash or
// Ctrl-C finds OUT.partial, keeps its complete lines, and skips the ids already answered. A write
// that fails (a full disk, a quota, an I/O error) throws, naming the file and the cause, and leaves
// OUT.partial holding only complete lines, so a rerun once space is freed resumes from there.
#pragma once
#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "strata/job/id_set.h"
#include "strata/job/prompts.h"

namespace strata {

// Where an OutputWriter's bytes go: OUT.partial opened for appending. The calls mirror the system
// calls they stand for, errors included (-1 with errno set), so a test can put a sink in between
// that fails as a full disk does (a short write, then ENOSPC) and check what the writer keeps.
class OutputSink {
public:
  virtual ~OutputSink() = default;
  virtual ssize_t write(const char* data, size_t n) = 0;  // write(2): bytes taken, maybe fewer than n
  virtual int sync() = 0;                                 // fsync(2)
  virtual int truncate(uint64_t size) = 0;                // ftruncate(2)
};
// Opens `partial` for appending, creating it; throws strata::Error naming it.
using OutputSinkFactory = std::function<std::unique_ptr<OutputSink>(const std::filesystem::path& partial)>;
std::unique_ptr<OutputSink> open_output_file(const std::filesystem::path& partial);
// Test seam: OutputWriters constructed from now on open their file through `factory` (an empty
// one restores open_output_file). Returns the factory it replaces. Not for concurrent use.
OutputSinkFactory set_output_sink_factory(OutputSinkFactory factory);

class OutputWriter {
public:
  explicit OutputWriter(std::filesystem::path out);
  ~OutputWriter();  // pushes complete lines still buffered (best effort); never creates OUT
  OutputWriter(const OutputWriter&) = delete;
  OutputWriter& operator=(const OutputWriter&) = delete;

  // ids (their keys, PromptRecord::id_key: the dump of "custom_id", else of "id") already present
  // in a partial file from an earlier run, error lines included
  const IdSet& done_ids() const { return done_; }
  void write(const nlohmann::json& line);  // buffered; pushed to the file by flush (or past 1 MiB)
  void flush();   // pushes the lines to the disk (write + fsync); errors name the file
  void finish();  // flush, close, rename OUT.partial -> OUT

  std::filesystem::path partial_path() const { return partial_; }

private:
  void push(bool sync);
  [[noreturn]] void fail(int err, uint64_t keep);

  std::filesystem::path out_, partial_;
  std::unique_ptr<OutputSink> sink_;
  std::string buffer_;     // complete lines not yet handed to the sink
  uint64_t written_ = 0;   // the file's size: complete lines only, all handed to the sink
  uint64_t synced_ = 0;    // ... of which fsync has confirmed this many bytes
  bool failed_ = false;    // a write failed: the writer takes no more lines
  IdSet done_;
};

// The id key of one line of an output file, as resume reads it: the dump of its top-level
// "custom_id" (OpenAI lines), else of its "id"; nullopt when the line does not count (not JSON, not
// an object, neither key). Parses with SAX events, keeping no value but those two.
std::optional<std::string> output_line_id_key(std::string_view line);

// OpenAI batch output lines (docs/batch-format.md). Ids are derived from the custom_id, so a rerun
// or another shard writes the same ids for the same requests.
struct CompletionChoice {
  std::string text;
  std::string finish_reason;  // OpenAI's: "stop" (EOS or a stop string) or "length"
  nlohmann::json logprobs;    // null unless asked for; the endpoint's shape (job/answers.h)
  // A reasoning answer's reasoning (GPT-OSS, Qwen3; job/reasoning.h): a chat message's
  // "reasoning_content".
  std::optional<std::string> reasoning = std::nullopt;
  // The answer's tool calls (job/tool_calls.h), OpenAI's message.tool_calls; null when it called
  // none. With calls, `text` is the text before them and an empty one is a null content.
  nlohmann::json tool_calls = nullptr;
  // vLLM's prompt_logprobs (job/answers.h); null unless asked for. A completion choice carries it;
  // chat writes the first choice's at the response's top level, as vLLM does.
  nlohmann::json prompt_logprobs = nullptr;
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
// The 16 hex digits a request's OpenAI ids end in ("batch_req_" + hex), from its custom_id.
std::string openai_request_hex(const PromptRecord& r);
// The batch output line answering r with a response body (status 200).
nlohmann::json openai_batch_line(const PromptRecord& r, nlohmann::json body);
nlohmann::json openai_error_line(const PromptRecord& r, const ServeError& e);
// The one line answering a completions request with several prompts (PromptRecord::prompts), from
// the lines answering each prompt, in prompt order: the first error line where a prompt failed,
// else the first line with every line's choices (prompt i's choice j at index i * n + j) and the
// usage summed, as OpenAI and vLLM answer.
nlohmann::json join_prompt_lines(std::vector<nlohmann::json> lines);

}  // namespace strata
