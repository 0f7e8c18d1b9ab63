// The batch job's input as a stream (docs/batch-format.md "Streaming"): pass 1 checks every line
// (JSON, fields, duplicate ids) keeping only counts and 64-bit id fingerprints; pass 2 rereads
// the file one record at a time. Memory does not hold the file, only what a window of it needs.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <string>

#include "strata/job/prompts.h"

namespace strata {

struct PromptScan {
  std::optional<InputFormat> format;  // the first line's; nullopt for a file without requests
  int64_t requests = 0;               // non-blank lines
  int lines = 0;                      // lines read
  double seconds = 0;
};

// Pass 1: parses every line with PromptLineParser and refuses the file ("FILE:LINE: reason") on
// the first malformed line or repeated id, as read_prompts does, without keeping the records:
// `each` sees every record (in file order) and may throw to refuse it too. Duplicates are found
// by sorting 64-bit fingerprints of the ids (8 bytes a request, freed on return); a repeated
// fingerprint is confirmed by rereading the file, so a hash collision refuses nothing. Lines are
// parsed in batches on `threads` threads (0: one a core), merged in file order.
PromptScan scan_prompts(const std::filesystem::path& file, const SamplingParams& defaults,
                        const std::function<void(const std::string&)>& warn,
                        const std::function<void(const PromptRecord&)>& each = {}, int threads = 0);

// Pass 2: the records again, one at a time, in file order (no warnings: pass 1 gave them).
class PromptReader {
public:
  PromptReader(const std::filesystem::path& file, const SamplingParams& defaults);
  std::optional<PromptRecord> next();  // nullopt at the end of the file

private:
  std::string file_;
  std::ifstream in_;
  PromptLineParser parser_;
  std::string text_;
  int line_ = 0;
};

// A queue of at most `capacity` items between two threads. push() waits while it is full and
// returns false once the queue is closed; pop() waits while it is empty and returns nullopt once
// it is closed and drained.
template <class T>
class BoundedQueue {
public:
  explicit BoundedQueue(size_t capacity) : capacity_(capacity < 1 ? 1 : capacity) {}
  bool push(T item) {
    std::unique_lock<std::mutex> lock(mu_);
    not_full_.wait(lock, [&] { return closed_ || items_.size() < capacity_; });
    if (closed_) return false;
    items_.push_back(std::move(item));
    not_empty_.notify_one();
    return true;
  }
  std::optional<T> pop() {
    std::unique_lock<std::mutex> lock(mu_);
    not_empty_.wait(lock, [&] { return closed_ || !items_.empty(); });
    if (items_.empty()) return std::nullopt;
    T item = std::move(items_.front());
    items_.pop_front();
    not_full_.notify_one();
    return item;
  }
  // The producer is done: pop() drains what is left, then returns nullopt.
  void close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    not_empty_.notify_all();
    not_full_.notify_all();
  }
  // The consumer gives up: drops what is queued and wakes a waiting producer.
  void abandon() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    items_.clear();
    not_empty_.notify_all();
    not_full_.notify_all();
  }
  size_t capacity() const { return capacity_; }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return items_.size();
  }

private:
  std::mutex mu_;
  std::condition_variable not_full_, not_empty_;
  std::deque<T> items_;
  size_t capacity_;
  bool closed_ = false;
};

}  // namespace strata
