// CSV output (RFC 4180): fields separated by commas, one record per line. A text field is written
// quoted, with each inner quote doubled, so a label holding a comma, a quote or a line break stays one
// field for every CSV reader (Python's csv, pandas, spreadsheets). Numbers are written bare by the caller.
#pragma once
#include <string>
#include <string_view>

namespace replayssm::io {

// `field` as an RFC 4180 quoted field: "..." with every " doubled.
std::string csv_text(std::string_view field);

}  // namespace replayssm::io
