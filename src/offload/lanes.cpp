#include "strata/offload/lanes.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "strata/core/error.h"

namespace strata {
namespace {
double seconds(TraceClock::time_point a, TraceClock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
}  // namespace

int Trace::track(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  tracks_.push_back(name);
  return int(tracks_.size()) - 1;
}

void Trace::record(int track, std::string name, TraceClock::time_point start, TraceClock::time_point end) {
  if (!enabled_) return;
  const double s = seconds(origin_, start) * 1e6, d = seconds(start, end) * 1e6;
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back({track, std::move(name), s, d});
}

void Trace::write(const std::filesystem::path& file) const {
  nlohmann::json events = nlohmann::json::array();
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t t = 0; t < tracks_.size(); ++t)
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 1}, {"tid", t}, {"args", {{"name", tracks_[t]}}}});
  for (const Event& e : events_)
    events.push_back({{"name", e.name}, {"ph", "X"}, {"pid", 1}, {"tid", e.track}, {"ts", e.start_us}, {"dur", e.dur_us}});
  std::ofstream out(file);
  if (!out) STRATA_FAIL("cannot write trace file " << file.string());
  out << nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() << "\n";
  if (!out) STRATA_FAIL("error writing trace file " << file.string());
}

Ticket ready_ticket(Event e) {
  std::promise<Event> p;
  p.set_value(std::move(e));
  return p.get_future().share();
}

Lane::Lane(std::string name, bool threaded, Trace& trace, Backend* device, SpanTiming timing)
    : name_(std::move(name)),
      trace_(trace),
      track_(trace.track(name_)),
      threaded_(threaded),
      timed_apart_(threaded || timing == SpanTiming::Apart),
      device_(device) {
  if (threaded_) thread_ = std::thread([this] { loop(); });
  if (timed_apart_) timer_ = std::thread([this] { time_spans(); });
}

Lane::~Lane() {
  if (threaded_) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  if (!timed_apart_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    lane_done_ = true;
  }
  timed_cv_.notify_all();
  timer_.join();
}

Ticket Lane::submit(std::string label, Fn fn, std::vector<Ticket> deps) {
  Task task{std::move(label), std::move(fn), std::move(deps), {}};
  Ticket ticket = task.done.get_future().share();
  if (!threaded_) {
    run(task);
    return ticket;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_all();
  return ticket;
}

void Lane::add_busy(std::string label, TraceClock::time_point start, TraceClock::time_point end) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    busy_ += seconds(start, end);
  }
  trace_.record(track_, std::move(label), start, end);
}

void Lane::run(Task& task) {
  Span span;
  TraceClock::time_point start, end;
  try {
    std::vector<Event> deps;
    deps.reserve(task.deps.size());
    for (Ticket& d : task.deps)
      if (d.valid()) deps.push_back(d.get());  // a failed dependency fails this task too
    start = TraceClock::now();
    span = task.fn(deps);
    end = TraceClock::now();
    task.done.set_value(span.end);
  } catch (...) {
    task.done.set_exception(std::current_exception());
    return;
  }
  try {
    record_span(std::move(task.label), std::move(span), start, end);
  } catch (...) {
    // A failed copy reaches its ticket's holders through their own waits; timing it is moot.
  }
}

void Lane::record_span(std::string label, Span span, TraceClock::time_point host_start, TraceClock::time_point host_end) {
  if (span.end.empty()) {
    add_busy(std::move(label), host_start, host_end);
  } else if (!timed_apart_) {
    Timed t{std::move(label), std::move(span)};
    time(t);
  } else {
    {
      std::lock_guard<std::mutex> lock(mu_);
      timing_.push_back({std::move(label), std::move(span)});
    }
    timed_cv_.notify_all();
  }
}

void Lane::time(Timed& t) {
  STRATA_CHECK(device_ != nullptr, "internal: lane " << name_ << " enqueued device work without a backend");
  device_->wait_host(t.span.start);
  const auto start = TraceClock::now();
  device_->wait_host(t.span.end);
  add_busy(std::move(t.label), start, TraceClock::now());
}

void Lane::loop() {
  while (true) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
      ++running_;
    }
    run(task);
    {
      std::lock_guard<std::mutex> lock(mu_);
      --running_;
    }
    timed_cv_.notify_all();
  }
}

void Lane::time_spans() {
  while (true) {
    Timed t;
    {
      std::unique_lock<std::mutex> lock(mu_);
      timed_cv_.wait(lock, [&] { return !timing_.empty() || lane_done_; });
      if (timing_.empty()) return;  // stopping, and the lane has enqueued its last span
      t = std::move(timing_.front());
      timing_.pop_front();
      ++timing_busy_;
    }
    try {
      time(t);
    } catch (...) {
      // A failed copy reaches its ticket's holders through the stream's next error; timing it is moot.
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      --timing_busy_;
    }
    timed_cv_.notify_all();
  }
}

void Lane::settle() {
  if (!timed_apart_) return;
  std::unique_lock<std::mutex> lock(mu_);
  timed_cv_.wait(lock, [&] { return queue_.empty() && running_ == 0 && timing_.empty() && timing_busy_ == 0; });
}

double Lane::busy_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return busy_;
}

void wait_all(std::vector<Ticket>& tickets) {
  std::exception_ptr first;
  for (Ticket& t : tickets) {
    if (!t.valid()) continue;
    try {
      t.get();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  tickets.clear();
  if (first) std::rethrow_exception(first);
}

}  // namespace strata
