// Console feedback for long sweeps: a progress bar with rate and ETA (redrawn in place on a
// terminal, periodic plain lines otherwise, e.g. when stderr goes to a log file) and the
// one-screen summary table printed at the end of a KL sweep.
#pragma once
#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "eval/kl_metrics.h"

namespace replayssm::eval {

bool stderr_is_terminal();
int terminal_width(int fallback = 100);  // columns of stderr's terminal

std::string human_count(double n);        // 950, 12.3K, 4.56M, 7.89G
std::string human_duration(double seconds);  // 45s, 3m05s, 2h07m, 3d04h; "?" when not finite
std::string length_label(int64_t n);      // 1024 -> "1K", 131072 -> "128K", 1000 -> "1000"

class ProgressBar {
 public:
  struct Options {
    bool interactive = false;        // redraw one line in place (a terminal)
    double line_interval_s = 30.0;   // non-interactive: at most one line per interval
    double redraw_interval_s = 0.1;  // interactive: at most one redraw per interval
    int width = 0;                   // interactive line width; 0: the terminal's
    std::string unit = "tok";
  };
  // total: units of work (tokens). clock: seconds, monotonic (default std::chrono::steady_clock).
  ProgressBar(std::ostream& out, int64_t total, Options options, std::function<double()> clock = {});
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // What is being done now ("book 2/4 10321 | shared:nvfp4+sr@16 | forward"); shown at once.
  void set_status(std::string status);
  void advance(int64_t units);
  // Prints a log line above the bar (interactive: clears the bar first, then redraws it).
  void message(const std::string& text);
  // Final state: a last line with the totals, ending in a newline. Idempotent.
  void finish();

  // The text of the current progress line (without control characters).
  std::string line() const;
  int64_t done() const { return done_; }

 private:
  void draw(bool force);

  std::ostream& out_;
  int64_t total_, done_ = 0;
  Options opt_;
  std::function<double()> clock_;
  double start_, last_draw_;
  std::string status_;
  bool finished_ = false, drawn_ = false;
};

// One row of the end-of-sweep summary.
struct SummaryRow {
  std::string policy;
  KlStats stats;
};
// The table: configuration, mean KL in up to 4 length buckets (the paper's 1K/16K/64K/N when the
// run is long enough, else spread over the run), overall mean, top-1 agreement, mean delta-p of
// the true token, non-finite positions. Width about 100 columns.
std::string format_summary_table(const std::vector<SummaryRow>& rows);

}  // namespace replayssm::eval
