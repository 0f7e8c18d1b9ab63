#include "strata/job/output.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <utility>

#include "strata/core/error.h"

namespace strata {
namespace fs = std::filesystem;

namespace {

// Keeps the complete, parseable lines of an earlier partial file and returns their ids; a line cut
// short by a crash or a full disk (no '\n', or JSON that does not parse) is dropped with everything
// after it: the file is truncated to the end of the last good line, whose size lands in `size`.
std::unordered_set<std::string> recover_partial(const fs::path& partial, uint64_t& size) {
  std::unordered_set<std::string> ids;
  std::ifstream in(partial, std::ios::binary);
  if (!in) STRATA_FAIL("cannot read " << partial.string() << " to resume from it: " << std::strerror(errno));
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
  // A read error must not pass for the end of the file: truncating there would drop good lines.
  if (in.bad()) STRATA_FAIL("cannot read " << partial.string() << " to resume from it");
  in.close();
  std::error_code ec;
  fs::resize_file(partial, good_end, ec);
  if (ec) STRATA_FAIL("cannot truncate " << partial.string() << ": " << ec.message());
  size = good_end;
  return ids;
}

class FileSink final : public OutputSink {
public:
  explicit FileSink(const fs::path& path) : fd_(::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644)) {
    if (fd_ < 0) STRATA_FAIL("cannot open " << path.string() << " for writing: " << std::strerror(errno));
  }
  ~FileSink() override { ::close(fd_); }
  ssize_t write(const char* data, size_t n) override { return ::write(fd_, data, n); }
  int sync() override { return ::fsync(fd_); }
  int truncate(uint64_t size) override { return ::ftruncate(fd_, off_t(size)); }

private:
  int fd_;
};

OutputSinkFactory& sink_factory() {
  static OutputSinkFactory factory;
  return factory;
}

constexpr size_t kPushBytes = 1 << 20;  // write() hands the buffer over past this many bytes

}  // namespace

std::unique_ptr<OutputSink> open_output_file(const fs::path& partial) { return std::make_unique<FileSink>(partial); }

OutputSinkFactory set_output_sink_factory(OutputSinkFactory factory) {
  std::swap(sink_factory(), factory);
  return factory;
}

OutputWriter::OutputWriter(fs::path out) : out_(std::move(out)), partial_(out_.string() + ".partial") {
  if (fs::exists(partial_)) done_ = recover_partial(partial_, written_);
  synced_ = written_;
  sink_ = sink_factory() ? sink_factory()(partial_) : open_output_file(partial_);
}

OutputWriter::~OutputWriter() {
  // An unfinished job (an exception elsewhere) keeps its complete lines in OUT.partial for a rerun.
  if (sink_ && !failed_ && !buffer_.empty()) {
    try {
      push(false);
    } catch (const Error&) {
    }
  }
}

// Drops what follows the first `keep` bytes (a torn line, or lines fsync did not confirm) so the
// file holds complete lines only, then reports the failure. A full disk still allows truncating.
void OutputWriter::fail(int err, uint64_t keep) {
  failed_ = true;
  buffer_.clear();
  const bool no_space = err == ENOSPC || err == EDQUOT;
  const bool trimmed = sink_->truncate(keep) == 0;
  STRATA_FAIL(partial_.string() << ": " << std::strerror(err) << "; finished lines are kept, "
                                << (no_space ? "free space and rerun to resume" : "rerun to resume")
                                << (trimmed ? "" : " (the torn last line is dropped then)"));
}

void OutputWriter::push(bool sync) {
  if (failed_) STRATA_FAIL(partial_.string() << ": an earlier write failed; rerun to resume");
  size_t done = 0;
  while (done < buffer_.size()) {
    const ssize_t n = sink_->write(buffer_.data() + done, buffer_.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;  // write(2) never takes 0 of a non-empty buffer
      // Keep the lines that reached the file whole: up to the last '\n' among the bytes taken.
      const size_t nl = done == 0 ? std::string::npos : buffer_.rfind('\n', done - 1);
      fail(err, written_ + (nl == std::string::npos ? 0 : nl + 1));
    }
    done += size_t(n);
  }
  written_ += buffer_.size();
  buffer_.clear();
  if (sync && synced_ != written_) {
    if (sink_->sync() != 0) fail(errno, synced_);  // unconfirmed lines may be lost or zeroed: drop them
    synced_ = written_;
  }
}

void OutputWriter::write(const nlohmann::json& line) {
  if (failed_) STRATA_FAIL(partial_.string() << ": an earlier write failed; rerun to resume");
  buffer_ += line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  buffer_ += '\n';
  if (buffer_.size() >= kPushBytes) push(false);
}

void OutputWriter::flush() { push(true); }

void OutputWriter::finish() {
  flush();
  sink_.reset();  // closes the file
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
