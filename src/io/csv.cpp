#include "io/csv.h"

namespace replayssm::io {

std::string csv_text(std::string_view field) {
  std::string quoted;
  quoted.reserve(field.size() + 2);
  quoted += '"';
  for (char c : field) {
    if (c == '"') quoted += '"';  // RFC 4180 2.7: a quote inside a quoted field is escaped by another
    quoted += c;
  }
  quoted += '"';
  return quoted;
}

}  // namespace replayssm::io
