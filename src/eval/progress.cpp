#include "eval/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include <fmt/format.h>

namespace replayssm::eval {

bool stderr_is_terminal() { return ::isatty(STDERR_FILENO) == 1; }

int terminal_width(int fallback) {
  struct winsize ws {};
  if (::ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 20) return ws.ws_col;
  return fallback;
}

std::string human_count(double n) {
  if (!std::isfinite(n)) return "?";
  const double a = std::fabs(n);
  if (a < 1e3) return fmt::format("{:.0f}", n);
  if (a < 1e6) return fmt::format("{:.3g}K", n / 1e3);
  if (a < 1e9) return fmt::format("{:.3g}M", n / 1e6);
  return fmt::format("{:.3g}G", n / 1e9);
}

std::string human_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const auto t = static_cast<int64_t>(std::llround(s));
  if (t < 60) return fmt::format("{}s", t);
  if (t < 3600) return fmt::format("{}m{:02}s", t / 60, t % 60);
  if (t < 86400) return fmt::format("{}h{:02}m", t / 3600, (t % 3600) / 60);
  return fmt::format("{}d{:02}h", t / 86400, (t % 86400) / 3600);
}

std::string length_label(int64_t n) {
  if (n >= 1024 * 1024 && n % (1024 * 1024) == 0) return fmt::format("{}M", n / (1024 * 1024));
  if (n >= 1024 && n % 1024 == 0) return fmt::format("{}K", n / 1024);
  return fmt::format("{}", n);
}

ProgressBar::ProgressBar(std::ostream& out, int64_t total, Options options, std::function<double()> clock)
    : out_(out), total_(std::max<int64_t>(total, 0)), opt_(std::move(options)), clock_(std::move(clock)) {
  if (!clock_) {
    clock_ = [] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    };
  }
  start_ = clock_();
  last_draw_ = start_;
}

ProgressBar::~ProgressBar() {
  if (drawn_ && opt_.interactive && !finished_) out_ << "\n" << std::flush;
}

std::string ProgressBar::line() const {
  const double elapsed = clock_() - start_;
  const double frac = total_ > 0 ? static_cast<double>(done_) / static_cast<double>(total_) : 1.0;
  const double rate = elapsed > 0 ? static_cast<double>(done_) / elapsed : 0.0;
  const double eta = rate > 0 ? static_cast<double>(total_ - done_) / rate : std::nan("");
  // Most useful first: a terminal narrower than the line cuts the end.
  std::string s = fmt::format("{:3.0f}% {}/{} {} | {} {}/s", 100.0 * frac, human_count(double(done_)),
                              human_count(double(total_)), opt_.unit, human_count(rate), opt_.unit);
  if (!finished_) s += fmt::format(" | ETA {}", done_ > 0 ? human_duration(eta) : std::string("?"));
  if (!status_.empty()) s += " | " + status_;
  s += fmt::format(" | {} elapsed", human_duration(elapsed));
  return s;
}

void ProgressBar::draw(bool force) {
  const double now = clock_();
  if (opt_.interactive) {
    if (!force && now - last_draw_ < opt_.redraw_interval_s) return;
    const int width = opt_.width > 0 ? opt_.width : terminal_width();
    const double frac = total_ > 0 ? static_cast<double>(done_) / static_cast<double>(total_) : 1.0;
    const int bar = 20;
    const int filled = std::clamp(static_cast<int>(frac * bar), 0, bar);
    std::string text;
    text.reserve(256);
    text.push_back('[');
    text.append(static_cast<std::size_t>(filled), '#');
    text.append(static_cast<std::size_t>(bar - filled), '.');
    text.append("] ");
    text.append(line());
    if (static_cast<int>(text.size()) > width - 1) text.resize(static_cast<std::size_t>(std::max(0, width - 1)));
    out_ << "\r\033[K" << text << std::flush;
  } else {
    if (!force && now - last_draw_ < opt_.line_interval_s) return;
    out_ << "[progress] " << line() << "\n" << std::flush;
  }
  drawn_ = true;
  last_draw_ = now;
}

void ProgressBar::set_status(std::string status) {
  status_ = std::move(status);
  if (opt_.interactive) draw(true);
  else draw(false);
}

void ProgressBar::advance(int64_t units) {
  done_ = std::min(total_, done_ + std::max<int64_t>(units, 0));
  draw(false);
}

void ProgressBar::message(const std::string& text) {
  if (opt_.interactive && drawn_) out_ << "\r\033[K";
  out_ << text << "\n";
  if (opt_.interactive && drawn_ && !finished_) draw(true);
  out_ << std::flush;
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  status_.clear();
  if (opt_.interactive) {
    draw(true);
    out_ << "\n" << std::flush;
  } else {
    draw(true);
  }
}

namespace {

std::string fmt_kl(double v) {
  if (std::isnan(v)) return "-";
  if (v == 0.0) return "0";
  return fmt::format("{:.3g}", v);
}

// part / whole as a percentage in at most 3 significant digits and never in exponent notation;
// only the whole is "100%" and only nothing is "0%".
std::string percent_of(int64_t part, int64_t whole) {
  if (whole <= 0) return "-";
  if (part >= whole) return "100%";
  const double p = 100.0 * static_cast<double>(part) / static_cast<double>(whole);
  if (p < 0.01) return part > 0 ? "<0.01%" : "0%";
  if (p >= 99.95) return ">99.9%";
  return fmt::format("{:.3g}%", p);
}

std::vector<std::size_t> summary_buckets(const std::vector<int64_t>& edges) {
  const std::size_t K = edges.empty() ? 0 : edges.size() - 1;
  std::vector<std::size_t> pick;
  if (K == 0) return pick;
  // The paper's table 11 columns (1K, 16K, 64K, N) when the run reaches them.
  for (int64_t want : {int64_t{1024}, int64_t{16384}, int64_t{65536}})
    for (std::size_t k = 0; k < K; ++k)
      if (edges[k + 1] == want) pick.push_back(k);
  if (pick.empty() || pick.back() != K - 1) pick.push_back(K - 1);
  if (pick.size() >= 4) return pick;
  pick.clear();
  const std::size_t m = std::min<std::size_t>(K, 4);
  for (std::size_t i = 0; i < m; ++i) {
    const std::size_t k = m == 1 ? K - 1 : (i * (K - 1) + (m - 1) / 2) / (m - 1);
    if (pick.empty() || pick.back() != k) pick.push_back(k);
  }
  return pick;
}

}  // namespace

std::string format_summary_table(const std::vector<SummaryRow>& rows) {
  if (rows.empty()) return "(no configurations)\n";
  const std::vector<int64_t>& edges = rows.front().stats.edges;
  const std::vector<std::size_t> cols = summary_buckets(edges);
  std::size_t name_w = 13;
  for (const auto& r : rows) name_w = std::max(name_w, r.policy.size());
  name_w = std::min<std::size_t>(name_w, 40);

  std::string out = fmt::format("{:<{}}", "configuration", name_w);
  for (std::size_t k : cols) {
    const std::string label = k == 0 ? "<=" + length_label(edges[1]) : length_label(edges[k + 1]);
    out += fmt::format(" {:>9}", "KL@" + label);
  }
  out += fmt::format(" {:>9} {:>7} {:>10} {:>11}\n", "mean KL", "top-1", "mean dp", "non-finite");
  out += std::string(out.size() - 1, '-') + "\n";
  for (const auto& r : rows) {
    std::string name = r.policy;
    if (name.size() > name_w) name = name.substr(0, name_w - 1) + "~";
    out += fmt::format("{:<{}}", name, name_w);
    const auto means = r.stats.bucket_mean();
    for (std::size_t k : cols) out += fmt::format(" {:>9}", k < means.size() ? fmt_kl(means[k]) : "-");
    const double top1 = r.stats.top1();
    const std::string nonfinite =
        r.stats.nonfinite_positions == 0
            ? "0"
            : fmt::format("{} ({})", human_count(double(r.stats.nonfinite_positions)),
                          percent_of(r.stats.nonfinite_positions, r.stats.positions));
    out += fmt::format(" {:>9} {:>7} {:>10} {:>11}\n", fmt_kl(r.stats.mean_kl()),
                       std::isnan(top1) ? std::string("-") : fmt::format("{:.4f}", top1),
                       std::isnan(r.stats.mean_delta_p()) ? std::string("-") : fmt::format("{:+.2e}", r.stats.mean_delta_p()),
                       nonfinite);
  }
  out += fmt::format("KL@X: mean KL over positions whose length (tokens seen) lies in the bucket ending at X; "
                     "non-finite positions are excluded from every mean.\n");
  return out;
}

}  // namespace replayssm::eval
