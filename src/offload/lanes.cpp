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

Lane::Lane(std::string name, bool threaded, Trace& trace)
    : name_(std::move(name)), trace_(trace), track_(trace.track(name_)), threaded_(threaded) {
  if (threaded_) thread_ = std::thread([this] { loop(); });
}

Lane::~Lane() {
  if (!threaded_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Ticket Lane::submit(std::string label, std::function<void()> fn, std::vector<Ticket> deps) {
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
  cv_.notify_one();
  return ticket;
}

void Lane::run(Task& task) {
  try {
    for (Ticket& d : task.deps) d.get();  // a failed dependency fails this task too
    const auto start = TraceClock::now();
    task.fn();
    const auto end = TraceClock::now();
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy_ += seconds(start, end);
    }
    trace_.record(track_, std::move(task.label), start, end);
    task.done.set_value();
  } catch (...) {
    task.done.set_exception(std::current_exception());
  }
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
    }
    run(task);
  }
}

double Lane::busy_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return busy_;
}

void wait_all(std::vector<Ticket>& tickets) {
  std::exception_ptr first;
  for (Ticket& t : tickets) {
    try {
      t.get();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  tickets.clear();
  if (first) std::rethrow_exception(first);
}

ScopedSpan::ScopedSpan(Trace& trace, int track, std::string name, double* busy)
    : trace_(trace), track_(track), name_(std::move(name)), busy_(busy), start_(TraceClock::now()) {}

ScopedSpan::~ScopedSpan() {
  const auto end = TraceClock::now();
  if (busy_) *busy_ += seconds(start_, end);
  trace_.record(track_, std::move(name_), start_, end);
}

}  // namespace strata
