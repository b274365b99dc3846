// The second table printed at the end of a KL sweep (after progress.h's per-length means): each
// configuration's uncertainty and distribution, in the form llama.cpp's `llama-perplexity
// --kl-divergence` users know — mean KL +- standard error, the spreads over books and SR seeds,
// p99 of the per-position KL, RMS delta-p, top-1 agreement +- SE, the perplexity ratio +- SE.
#pragma once
#include <string>
#include <vector>

#include "eval/progress.h"

namespace replayssm::eval {

// Rows: the aggregates (KlStats::se, the spreads and pct set, as CellStore::merge or
// read_results_summary give them). At most 120 columns for names up to 34 characters (longer
// ones are cut with '~'); '-' where a value is not defined.
std::string format_statistics_table(const std::vector<SummaryRow>& rows);

}  // namespace replayssm::eval
