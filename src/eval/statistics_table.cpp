#include "eval/statistics_table.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace replayssm::eval {

namespace {

// "v" alone when the error is not defined, else "v±e"; both in `digits` / 2 significant digits.
std::string with_error(double v, double e, const char* value_format) {
  if (std::isnan(v)) return "-";
  std::string s = fmt::format(fmt::runtime(value_format), v);
  if (!std::isnan(e)) s += fmt::format("±{:.2g}", e);
  return s;
}

std::string plain(double v) { return std::isnan(v) ? std::string("-") : fmt::format("{:.3g}", v); }

}  // namespace

std::string format_statistics_table(const std::vector<SummaryRow>& rows) {
  if (rows.empty()) return "";
  std::size_t name_w = 13;
  for (const auto& r : rows) name_w = std::max(name_w, r.policy.size());
  name_w = std::min<std::size_t>(name_w, 34);
  // Percentiles::kLevels: index 2 is p99.
  static_assert(Percentiles::kLevels[2] == 99.0);
  std::string out = fmt::format("{:<{}} {:>16} {:>8} {:>8} {:>8} {:>8} {:>14} {:>17}\n", "configuration", name_w,
                                "mean KL ± SE", "± books", "± seeds", "p99 KL", "RMS dp", "top-1 ± SE", "PPL ratio ± SE");
  // "±" is two bytes in UTF-8 but one column: rule under the visible width.
  out += std::string(name_w + 1 + 16 + 4 * 9 + 15 + 18, '-') + "\n";
  for (const auto& r : rows) {
    const KlStats& s = r.stats;
    std::string name = r.policy;
    if (name.size() > name_w) name = name.substr(0, name_w - 1) + "~";
    const std::string mean = with_error(s.mean_kl(), s.se.mean_kl, "{:.3g}");
    const std::string top1 = with_error(s.top1(), s.se.top1, "{:.4f}");
    const std::string ppl = with_error(s.ppl_ratio(), s.se.ppl_ratio, "{:.5f}");
    // fmt pads by code points, so "±" counts as one column.
    out += fmt::format("{:<{}} {:>16} {:>8} {:>8} {:>8} {:>8} {:>14} {:>17}\n", name, name_w, mean,
                       plain(s.mean_kl_book_se), plain(s.mean_kl_seed_se), plain(s.pct.value[2]),
                       plain(s.rms_delta_p()), top1, ppl);
  }
  const std::vector<int64_t> lengths = bootstrap_block_lengths(rows.front().stats.edges);
  if (lengths.empty()) return out;
  out += fmt::format(
      "± SE: block bootstrap over positions (blocks of {} to {} tokens, {} resamples, seed {:#x});\n"
      "± books: sd of the per-book means / sqrt(books); ± seeds: the same over the SR seeds of one policy (-: one seed).\n"
      "p99 KL: 99th percentile of the per-position KL; RMS dp: sqrt(mean (p_cfg - p_ref)^2) of the true next token;\n"
      "PPL ratio: PPL(config) / PPL(reference). Per bucket and per book: the result file (docs/KL_SWEEP.md).\n",
      *std::min_element(lengths.begin(), lengths.end()), *std::max_element(lengths.begin(), lengths.end()),
      kBootstrapResamples, kBootstrapSeed);
  return out;
}

}  // namespace replayssm::eval
