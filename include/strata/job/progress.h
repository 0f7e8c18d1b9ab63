// The batch job's progress line on stderr: requests done/total, generated tokens, tok/s and an
// ETA from the planned blocks. On a terminal it rewrites itself (\r) five times a second;
// otherwise (a log file) it prints a line every few seconds.
#pragma once
#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <string>

namespace strata {

struct ProgressState {
  int64_t done = 0, total = 0;                  // requests answered this run / to answer
  int64_t tokens = 0;                           // generated so far
  int64_t blocks_done = 0, blocks_planned = 0;  // planned: cut so far + the rest at full blocks
};

// "1200/10000 requests, 4800 tokens, 950.0 tok/s, 5.1 s, ETA 37 s" (ETA once a block is done).
std::string progress_line(const ProgressState& s, double seconds);

class Progress {
public:
  Progress(std::ostream& log, bool enabled);
  // Prints at most every 0.2 s on a terminal (one line, redrawn), every 5 s otherwise; `force`
  // prints now, except a line that would repeat the last one printed to a file or pipe.
  void update(const ProgressState& s, bool force = false);
  void end();

private:
  std::ostream& log_;
  bool enabled_, tty_;
  std::chrono::steady_clock::time_point t0_;
  double last_ = -1e9;
  bool printed_ = false;
  int64_t printed_done_ = -1, printed_tokens_ = -1;  // the state of the last line printed
};

}  // namespace strata
