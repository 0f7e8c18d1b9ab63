#include "strata/job/output.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/core/error.h"

namespace strata {
namespace fs = std::filesystem;

namespace {

// SAX events of one output line, keeping only the values of the top-level "custom_id" and "id"
// (as json, for a dump byte-identical to the DOM's: a nested value is rebuilt, a repeated key's
// last value wins, as json::parse does). The long "completion" or "text" strings are never stored.
class IdCapture {
public:
  using json = nlohmann::json;
  bool null() { return value(nullptr); }
  bool boolean(bool v) { return value(v); }
  bool number_integer(json::number_integer_t v) { return value(v); }
  bool number_unsigned(json::number_unsigned_t v) { return value(v); }
  bool number_float(json::number_float_t v, const json::string_t&) { return value(v); }
  bool string(json::string_t& v) { return value(v); }
  bool binary(json::binary_t&) { return true; }  // never in JSON text
  bool start_object(std::size_t) { return open(json::value_t::object); }
  bool start_array(std::size_t) { return open(json::value_t::array); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(json::string_t& k) {
    if (!stack_.empty()) key_ = k;  // inside a captured object
    else if (depth_ == 1) target_ = k == "custom_id" ? &custom_id_ : k == "id" ? &id_ : nullptr;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const json::exception&) { return false; }

  // After a successful parse: the key, or nullopt when the object has neither field.
  std::optional<std::string> id_key() const {
    if (custom_id_) return custom_id_->dump();  // OpenAI batch output
    if (id_) return id_->dump();
    return std::nullopt;
  }

private:
  // Where a value at the current position goes: into the captured container being built, into a
  // top-level field's slot, or nowhere.
  json* place(json&& v) {
    if (!stack_.empty()) {
      json& parent = *stack_.back();
      if (parent.is_array()) {
        parent.push_back(std::move(v));
        return &parent.back();  // stable while open: nothing is added to the parent meanwhile
      }
      return &(parent[key_] = std::move(v));
    }
    if (depth_ == 1 && target_) {
      std::optional<json>& slot = *std::exchange(target_, nullptr);
      slot = std::move(v);
      return &*slot;
    }
    return nullptr;
  }
  template <class V>
  bool value(V&& v) {
    if (depth_ == 0) return false;  // the line is not an object: it does not count
    if (!stack_.empty() || (depth_ == 1 && target_)) place(json(std::forward<V>(v)));
    return true;
  }
  bool open(json::value_t type) {
    if (depth_ == 0) {
      if (type != json::value_t::object) return false;
    } else if (!stack_.empty() || (depth_ == 1 && target_)) {
      stack_.push_back(place(json(type)));
    }
    ++depth_;
    return true;
  }
  bool close() {
    --depth_;
    if (!stack_.empty()) stack_.pop_back();
    return true;
  }

  int depth_ = 0;                          // containers open around the current event
  std::optional<json>* target_ = nullptr;  // the field whose value comes next (after its key)
  std::optional<json> custom_id_, id_;
  std::vector<json*> stack_;               // the captured value's open containers
  std::string key_;                        // the key of the next value inside a captured object
};

// Keeps the complete, parseable lines of an earlier partial file and returns their ids; a line cut
// short by a crash or a full disk (no '\n', or JSON that does not parse) is dropped with everything
// after it: the file is truncated to the end of the last good line, whose size lands in `size`.
IdSet recover_partial(const fs::path& partial, uint64_t& size) {
  std::vector<IdSet::Hash> ids;
  std::ifstream in(partial, std::ios::binary);
  if (!in) STRATA_FAIL("cannot read " << partial.string() << " to resume from it: " << std::strerror(errno));
  std::string line;
  uint64_t good_end = 0, pos = 0;
  while (std::getline(in, line)) {
    const bool complete = !in.eof();  // getline hit '\n'
    pos += line.size() + (complete ? 1 : 0);
    if (!complete) break;
    const std::optional<std::string> key = output_line_id_key(line);
    if (!key) break;
    ids.push_back(IdSet::hash(*key));
    good_end = pos;
  }
  // A read error must not pass for the end of the file: truncating there would drop good lines.
  if (in.bad()) STRATA_FAIL("cannot read " << partial.string() << " to resume from it");
  in.close();
  std::error_code ec;
  fs::resize_file(partial, good_end, ec);
  if (ec) STRATA_FAIL("cannot truncate " << partial.string() << ": " << ec.message());
  size = good_end;
  return IdSet(std::move(ids));
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

std::optional<std::string> output_line_id_key(std::string_view line) {
  IdCapture capture;
  try {
    // The whole line is parsed, not just up to the id: a line torn mid-way (zeros after a crash)
    // that still ends in '\n' must not count as answered.
    if (!nlohmann::json::sax_parse(line, &capture)) return std::nullopt;
    return capture.id_key();
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

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

std::string openai_request_hex(const PromptRecord& r) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(fnv1a64(id_text(r.id))));
  return buf;
}

nlohmann::json openai_batch_line(const PromptRecord& r, nlohmann::json body) {
  const std::string hex = openai_request_hex(r);
  return {{"id", "batch_req_" + hex},
          {"custom_id", r.id},
          {"response", {{"status_code", 200}, {"request_id", "req_" + hex}, {"body", std::move(body)}}},
          {"error", nullptr}};
}

nlohmann::json openai_response_line(const PromptRecord& r, const Completion& c) {
  using json = nlohmann::json;
  const bool chat = r.endpoint == Endpoint::ChatCompletions;
  const std::string hex = openai_request_hex(r);
  json choices = json::array();
  const std::vector<CompletionChoice> one = {{c.text, c.finish_reason, nullptr}};
  const std::vector<CompletionChoice>& list = c.choices.empty() ? one : c.choices;
  for (size_t i = 0; i < list.size(); ++i) {
    json choice = {{"index", i}, {"logprobs", list[i].logprobs}, {"finish_reason", list[i].finish_reason}};
    if (chat) {
      const bool called = !list[i].tool_calls.is_null();
      choice["message"] = {{"role", "assistant"},
                           {"content", called && list[i].text.empty() ? json(nullptr) : json(list[i].text)}};
      if (list[i].reasoning) choice["message"]["reasoning_content"] = *list[i].reasoning;
      if (called) choice["message"]["tool_calls"] = list[i].tool_calls;
    } else {
      choice["text"] = list[i].text;
      if (!list[i].prompt_logprobs.is_null()) choice["prompt_logprobs"] = list[i].prompt_logprobs;
    }
    choices.push_back(std::move(choice));
  }
  json body = {{"id", (chat ? "chatcmpl-" : "cmpl-") + hex},
                     {"object", chat ? "chat.completion" : "text_completion"},
                     {"created", c.created},
                     {"model", c.model},
                     {"choices", std::move(choices)},
                     {"usage",
                      {{"prompt_tokens", c.prompt_tokens},
                       {"completion_tokens", c.completion_tokens},
                       {"total_tokens", c.prompt_tokens + c.completion_tokens}}}};
  if (chat && !list.empty() && !list[0].prompt_logprobs.is_null()) body["prompt_logprobs"] = list[0].prompt_logprobs;
  return openai_batch_line(r, body);
}

nlohmann::json join_prompt_lines(std::vector<nlohmann::json> lines) {
  STRATA_CHECK(!lines.empty(), "join_prompt_lines: no lines");
  for (nlohmann::json& line : lines)
    if (!line["error"].is_null()) return std::move(line);
  nlohmann::json joined = std::move(lines[0]);
  nlohmann::json& body = joined["response"]["body"];
  nlohmann::json& usage = body["usage"];
  for (size_t i = 1; i < lines.size(); ++i) {
    const nlohmann::json& more = lines[i]["response"]["body"];
    const size_t offset = body["choices"].size();
    for (nlohmann::json choice : more["choices"]) {
      choice["index"] = offset + choice["index"].get<size_t>();
      body["choices"].push_back(std::move(choice));
    }
    for (const char* key : {"prompt_tokens", "completion_tokens", "total_tokens"})
      usage[key] = usage[key].get<int64_t>() + more["usage"][key].get<int64_t>();
  }
  return joined;
}

nlohmann::json openai_error_line(const PromptRecord& r, const ServeError& e) {
  return {{"id", "batch_req_" + openai_request_hex(r)},
          {"custom_id", r.id},
          {"response", nullptr},
          {"error", {{"code", e.code}, {"message", e.message}}}};
}

}  // namespace strata
