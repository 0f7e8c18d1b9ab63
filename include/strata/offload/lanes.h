// The schedule's workers: one thread per copy direction and one for the disk, each running its
// tasks in submission order (a CUDA stream's semantics, on the host). A task starts after the
// tickets it depends on have resolved (a disk read before its host-to-device copy); that wait is
// not counted as busy time. A ticket resolves to an Event. A copy task enqueues its copy on its
// copy stream, ordered after its dependencies' events by the device (Backend::wait), and resolves
// at once to the event after the copy; a disk task waits for its dependencies' events on the host
// (Backend::wait_host), does its I/O and resolves to an empty Event. So a lane never waits for the
// device before it enqueues, and whoever holds a ticket orders itself after the work with no host
// wait. A copy's busy time is measured by a timing thread that waits for the copy's start and end
// events after the lane has moved on. With overlap off, tasks run inline on the submitting thread,
// so the same steps happen one after another (SpanTiming says who times their device spans). Every task's interval can go to a Chrome trace.
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

#include "strata/backend/backend.h"

namespace strata {

// A lane task's result: the Event after its device work (empty for host work, done when it resolves).
using Ticket = std::shared_future<Event>;
// A ticket already resolved to `e` (the compute stream's work, for the lanes to order after).
Ticket ready_ticket(Event e = Event());
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

// Who waits for a device span's events to time it when the lane's tasks run inline (overlap
// off): the submitting thread (Inline: the copies then finish before the schedule goes on, as
// FlexGen's overlap off has them) or the timing thread (Apart: for the compute stream, which is
// in order by itself, so inline timing would only make the engine wait for every half-layer's
// kernels). A threaded lane always times apart.
enum class SpanTiming { Inline, Apart };

class Lane {
public:
  // `device`: the backend whose streams the lane's tasks enqueue on (waited for by the timing thread).
  Lane(std::string name, bool threaded, Trace& trace, Backend* device = nullptr,
       SpanTiming timing = SpanTiming::Inline);
  ~Lane();  // finishes the queued tasks
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;

  // The device work a task enqueued: its copy runs from `start` to `end` on its stream. Both empty
  // for work done on the host.
  struct Span {
    Event start, end;
  };
  // A task: given its dependencies' events, does or enqueues its work.
  using Fn = std::function<Span(const std::vector<Event>& deps)>;
  // Runs `fn` after `deps` have resolved; the ticket resolves to the span's end. An exception from
  // a dependency or from `fn` is delivered through the returned ticket.
  Ticket submit(std::string label, Fn fn, std::vector<Ticket> deps = {});
  // Times work the caller did or enqueued itself (the compute stream's), like a task's: a device
  // span by the timing thread, host work (an empty span) as [host_start, host_end].
  void record_span(std::string label, Span span, TraceClock::time_point host_start, TraceClock::time_point host_end);
  // Seconds of work done so far: host tasks, and the device spans the timing thread has seen end.
  double busy_seconds() const;
  // Waits until every span enqueued so far has been timed (busy_seconds is then complete).
  void settle();
  const std::string& name() const { return name_; }

private:
  struct Task {
    std::string label;
    Fn fn;
    std::vector<Ticket> deps;
    std::promise<Event> done;
  };
  struct Timed {
    std::string label;
    Span span;
  };
  void run(Task& task);
  void loop();
  void time_spans();
  void time(Timed& t);
  void add_busy(std::string label, TraceClock::time_point start, TraceClock::time_point end);

  std::string name_;
  Trace& trace_;
  int track_;
  bool threaded_;
  bool timed_apart_;  // device spans timed by timer_ (threaded, or SpanTiming::Apart)
  Backend* device_;
  mutable std::mutex mu_;
  std::condition_variable cv_, timed_cv_;
  std::deque<Task> queue_;
  std::deque<Timed> timing_;  // device spans not yet timed
  int running_ = 0;           // tasks the lane thread has taken and not finished
  int timing_busy_ = 0;       // spans the timing thread is waiting on
  bool stopping_ = false, lane_done_ = false;
  double busy_ = 0;
  std::thread thread_, timer_;
};

// Waits for every ticket, then rethrows the first failure (so no task is left running on
// buffers the caller is about to release).
void wait_all(std::vector<Ticket>& tickets);

}  // namespace strata
