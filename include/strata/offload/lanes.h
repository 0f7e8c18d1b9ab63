// The schedule's workers: one thread per copy direction and one for the disk, each running its
// tasks in submission order (a CUDA stream's semantics, on the host). A task may wait on tickets
// of other lanes before it starts (a disk read before its host-to-device copy); that wait is not
// counted as busy time. With overlap off, tasks run inline on the submitting thread, so the same
// steps happen one after another. Every task's interval can go to a Chrome trace.
#pragma once
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace strata {

using Ticket = std::shared_future<void>;
using TraceClock = std::chrono::steady_clock;

// Collects complete events ("ph": "X") per named track; thread-safe; writes trace-event JSON
// that Perfetto and chrome://tracing open.
class Trace {
public:
  explicit Trace(bool enabled) : enabled_(enabled), origin_(TraceClock::now()) {}
  bool enabled() const { return enabled_; }
  int track(const std::string& name);  // returns a track id (a "tid")
  void record(int track, std::string name, TraceClock::time_point start, TraceClock::time_point end);
  void write(const std::filesystem::path& file) const;

private:
  struct Event {
    int track;
    std::string name;
    double start_us, dur_us;
  };
  bool enabled_;
  TraceClock::time_point origin_;
  mutable std::mutex mu_;
  std::vector<std::string> tracks_;
  std::vector<Event> events_;
};

class Lane {
public:
  Lane(std::string name, bool threaded, Trace& trace);
  ~Lane();  // finishes the queued tasks
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;

  // Runs `fn` after `deps` are ready; an exception from a dependency or from `fn` is delivered
  // through the returned ticket.
  Ticket submit(std::string label, std::function<void()> fn, std::vector<Ticket> deps = {});
  double busy_seconds() const;
  const std::string& name() const { return name_; }

private:
  struct Task {
    std::string label;
    std::function<void()> fn;
    std::vector<Ticket> deps;
    std::promise<void> done;
  };
  void run(Task& task);
  void loop();

  std::string name_;
  Trace& trace_;
  int track_;
  bool threaded_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool stopping_ = false;
  double busy_ = 0;
  std::thread thread_;
};

// Waits for every ticket, then rethrows the first failure (so no task is left running on
// buffers the caller is about to release).
void wait_all(std::vector<Ticket>& tickets);

// Times a piece of work on the calling thread as one trace event of `track`; adds to `busy`.
class ScopedSpan {
public:
  ScopedSpan(Trace& trace, int track, std::string name, double* busy = nullptr);
  ~ScopedSpan();

private:
  Trace& trace_;
  int track_;
  std::string name_;
  double* busy_;
  TraceClock::time_point start_;
};

}  // namespace strata
