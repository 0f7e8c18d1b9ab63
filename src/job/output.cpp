#include "strata/job/output.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "strata/core/error.h"

namespace strata {
namespace fs = std::filesystem;

namespace {

// Keeps the complete, parseable lines of an earlier partial file and returns their ids; a line cut
// short by a crash is dropped (the file is truncated to the end of the last good line).
std::unordered_set<std::string> recover_partial(const fs::path& partial) {
  std::unordered_set<std::string> ids;
  std::ifstream in(partial, std::ios::binary);
  std::string line;
  uint64_t good_end = 0, pos = 0;
  while (std::getline(in, line)) {
    const bool complete = !in.eof();  // getline hit '\n'
    pos += line.size() + (complete ? 1 : 0);
    if (!complete) break;
    try {
      auto j = nlohmann::json::parse(line);
      if (!j.is_object()) break;
      if (j.contains("custom_id")) ids.insert(j["custom_id"].dump());  // OpenAI batch output
      else if (j.contains("id")) ids.insert(j["id"].dump());
      else break;
      good_end = pos;
    } catch (const nlohmann::json::exception&) {
      break;
    }
  }
  in.close();
  std::error_code ec;
  fs::resize_file(partial, good_end, ec);
  if (ec) STRATA_FAIL("cannot truncate " << partial.string() << ": " << ec.message());
  return ids;
}

}  // namespace

OutputWriter::OutputWriter(fs::path out) : out_(std::move(out)), partial_(out_.string() + ".partial") {
  if (fs::exists(partial_)) done_ = recover_partial(partial_);
  file_ = std::fopen(partial_.c_str(), "ab");
  if (!file_) STRATA_FAIL("cannot open " << partial_.string() << " for writing: " << std::strerror(errno));
}

OutputWriter::~OutputWriter() {
  if (file_) std::fclose(file_);  // an unfinished job leaves OUT.partial for a rerun to resume
}

void OutputWriter::write(const nlohmann::json& line) {
  const std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  if (std::fwrite(text.data(), 1, text.size(), file_) != text.size())
    STRATA_FAIL("writing " << partial_.string() << " failed: " << std::strerror(errno));
}

void OutputWriter::flush() {
  if (std::fflush(file_) != 0 || ::fsync(fileno(file_)) != 0)
    STRATA_FAIL("writing " << partial_.string() << " failed: " << std::strerror(errno));
}

void OutputWriter::finish() {
  flush();
  std::fclose(file_);
  file_ = nullptr;
  std::error_code ec;
  fs::rename(partial_, out_, ec);
  if (ec) STRATA_FAIL("cannot rename " << partial_.string() << " to " << out_.string() << ": " << ec.message());
}

namespace {
std::string hex_id(const PromptRecord& r) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(fnv1a64(id_text(r.id))));
  return buf;
}
}  // namespace

nlohmann::json openai_response_line(const PromptRecord& r, const Completion& c) {
  using json = nlohmann::json;
  const bool chat = r.endpoint == Endpoint::ChatCompletions;
  const std::string hex = hex_id(r);
  json choices = json::array();
  const std::vector<CompletionChoice> one = {{c.text, c.finish_reason, nullptr}};
  const std::vector<CompletionChoice>& list = c.choices.empty() ? one : c.choices;
  for (size_t i = 0; i < list.size(); ++i) {
    json choice = {{"index", i}, {"logprobs", list[i].logprobs}, {"finish_reason", list[i].finish_reason}};
    if (chat) choice["message"] = {{"role", "assistant"}, {"content", list[i].text}};
    else choice["text"] = list[i].text;
    choices.push_back(std::move(choice));
  }
  const json body = {{"id", (chat ? "chatcmpl-" : "cmpl-") + hex},
                     {"object", chat ? "chat.completion" : "text_completion"},
                     {"created", c.created},
                     {"model", c.model},
                     {"choices", std::move(choices)},
                     {"usage",
                      {{"prompt_tokens", c.prompt_tokens},
                       {"completion_tokens", c.completion_tokens},
                       {"total_tokens", c.prompt_tokens + c.completion_tokens}}}};
  return {{"id", "batch_req_" + hex},
          {"custom_id", r.id},
          {"response", {{"status_code", 200}, {"request_id", "req_" + hex}, {"body", body}}},
          {"error", nullptr}};
}

nlohmann::json openai_error_line(const PromptRecord& r, const ServeError& e) {
  return {{"id", "batch_req_" + hex_id(r)},
          {"custom_id", r.id},
          {"response", nullptr},
          {"error", {{"code", e.code}, {"message", e.message}}}};
}

}  // namespace strata
