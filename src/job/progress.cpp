#include "strata/job/progress.h"

#include <unistd.h>

#include <cmath>
#include <iomanip>
#include <ostream>
#include <sstream>

namespace strata {
namespace {

std::string duration_text(double s) {
  const int64_t t = int64_t(std::llround(s));
  std::ostringstream os;
  if (t >= 3600) os << t / 3600 << "h" << std::setw(2) << std::setfill('0') << (t % 3600) / 60 << "m";
  else if (t >= 60) os << t / 60 << "m" << std::setw(2) << std::setfill('0') << t % 60 << "s";
  else os << t << " s";
  return os.str();
}

}  // namespace

std::string progress_line(const ProgressState& s, double seconds) {
  std::ostringstream os;
  os << s.done << "/" << s.total << " requests, " << s.tokens << " tokens, " << std::fixed << std::setprecision(1)
     << (seconds > 0 ? double(s.tokens) / seconds : 0.0) << " tok/s, " << seconds << " s";
  if (s.blocks_done > 0 && s.blocks_planned >= s.blocks_done)
    os << ", ETA " << duration_text(seconds / double(s.blocks_done) * double(s.blocks_planned - s.blocks_done));
  return os.str();
}

Progress::Progress(std::ostream& log, bool enabled)
    : log_(log), enabled_(enabled), tty_(enabled && isatty(STDERR_FILENO)), t0_(std::chrono::steady_clock::now()) {}

void Progress::update(const ProgressState& s, bool force) {
  if (!enabled_) return;
  const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  if (!force && t - last_ < (tty_ ? 0.2 : 5.0)) return;
  if (force && !tty_ && s.done == printed_done_ && s.tokens == printed_tokens_) return;  // no news for a log
  last_ = t;
  printed_ = true;
  printed_done_ = s.done;
  printed_tokens_ = s.tokens;
  log_ << (tty_ ? "\r" : "") << "[strata] " << progress_line(s, t) << (tty_ ? "   " : "\n") << std::flush;
}

void Progress::end() {
  if (enabled_ && tty_ && printed_) log_ << "\n";
}

}  // namespace strata
