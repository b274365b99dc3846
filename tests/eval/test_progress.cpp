#include <doctest/doctest.h>

#include <sstream>

#include "eval/progress.h"

using namespace replayssm::eval;

TEST_CASE("human-readable counts, durations and length labels") {
  CHECK(human_count(950) == "950");
  CHECK(human_count(12345) == "12.3K");
  CHECK(human_count(4.56e6) == "4.56M");
  CHECK(human_duration(45) == "45s");
  CHECK(human_duration(185) == "3m05s");
  CHECK(human_duration(7620) == "2h07m");
  CHECK(human_duration(std::nan("")) == "?");
  CHECK(length_label(1024) == "1K");
  CHECK(length_label(131072) == "128K");
  CHECK(length_label(1000) == "1000");
}

TEST_CASE("progress without a terminal: periodic plain lines with rate and ETA") {
  double t = 0;
  std::ostringstream out;
  ProgressBar::Options o;
  o.interactive = false;
  o.line_interval_s = 10;
  ProgressBar bar(out, 1000, o, [&t] { return t; });
  bar.set_status("book 1/2 a | shared:nvfp4+sr@16 | forward");
  t = 5;
  bar.advance(100);  // within the interval: no line
  CHECK(out.str().empty());
  t = 10;
  bar.advance(100);  // 200 tokens in 10 s: 20 tok/s, 800 left: ETA 40 s
  const std::string s = out.str();
  CHECK(s.find("[progress]  20% 200/1K tok") != std::string::npos);
  CHECK(s.find("20 tok/s") != std::string::npos);
  CHECK(s.find("ETA 40s") != std::string::npos);
  CHECK(s.find("shared:nvfp4+sr@16") != std::string::npos);
  CHECK(s.find('\r') == std::string::npos);
  bar.message("a note");
  t = 20;
  bar.advance(800);
  bar.finish();
  const std::string f = out.str();
  CHECK(f.find("a note\n") != std::string::npos);
  CHECK(f.find("100% 1K/1K tok") != std::string::npos);
  CHECK(f.back() == '\n');
}

TEST_CASE("progress on a terminal: one line redrawn in place, cut to the width") {
  double t = 0;
  std::ostringstream out;
  ProgressBar::Options o;
  o.interactive = true;
  o.width = 60;
  o.redraw_interval_s = 0;
  ProgressBar bar(out, 100, o, [&t] { return t; });
  t = 1;
  bar.advance(50);
  bar.set_status("a very long status text that will not fit in sixty columns at all");
  const std::string s = out.str();
  CHECK(s.find("\r\033[K[##########..........]  50%") != std::string::npos);
  CHECK(s.find('\n') == std::string::npos);
  std::size_t last = s.rfind('\r');
  CHECK(s.size() - last - 4 <= 59);
  bar.finish();
  CHECK(out.str().back() == '\n');
}

TEST_CASE("summary table: the paper's length columns when available, non-finite counts") {
  const auto edges = length_bucket_edges(131072);
  KlStats a(edges), b(edges);
  PositionResult r;
  r.kl = 0.004;
  r.top1_agree = true;
  r.has_target = true;
  for (int64_t p : {0, 20000, 70000, 131071}) a.add(p, r);
  r.kl = 0.13;
  b.add(0, r);
  PositionResult bad;
  bad.finite = false;
  bad.kl = NAN;
  b.add(100000, bad);
  const std::string t = format_summary_table({{"split:nvfp4+rtn/fp32@16", a}, {"shared:nvfp4+sr@16", b}});
  CHECK(t.find("KL@<=1K") != std::string::npos);
  CHECK(t.find("KL@16K") != std::string::npos);  // shown even where a bucket is empty ("-")
  CHECK(t.find("KL@64K") != std::string::npos);
  CHECK(t.find("KL@128K") != std::string::npos);
  CHECK(t.find("split:nvfp4+rtn/fp32@16") != std::string::npos);
  CHECK(t.find("0.004") != std::string::npos);
  CHECK(t.find("1 (50%)") != std::string::npos);
  const std::string short_run = format_summary_table({{"x", KlStats(length_bucket_edges(300))}});
  CHECK(short_run.find("KL@300") != std::string::npos);
}

TEST_CASE("summary table: non-finite shares are plain percentages, 100% only when every position is") {
  const auto edges = length_bucket_edges(1000);
  const auto share = [&](int64_t nonfinite, int64_t positions) {
    KlStats s(edges);
    s.positions = positions;
    s.nonfinite_positions = nonfinite;
    s.finite_positions = positions - nonfinite;
    const std::string t = format_summary_table({{"p", s}});
    const std::size_t open = t.find('(', t.find("\np "));
    return t.substr(open, t.find(')', open) - open + 1);
  };
  CHECK(share(1000, 1000) == "(100%)");  // was "1e+02%"
  CHECK(share(2, 3) == "(66.7%)");
  CHECK(share(1, 2) == "(50%)");
  CHECK(share(1, 1000) == "(0.1%)");
  CHECK(share(1, 1000000) == "(<0.01%)");
  CHECK(share(999999, 1000000) == "(>99.9%)");
  CHECK(share(123, 1000000) == "(0.0123%)");
}
