// Self-checks of the number formats, shared by `replayssm formats` and the test suite:
//   - Philox4x32-10 against the Random123 known-answer vectors;
//   - every finite code of every element format survives decode -> encode unchanged (RTN and SR);
//   - the golden file written by scripts/make_format_goldens.py (numpy + ml_dtypes, an independent
//     implementation of the same definitions) matches code for code, scale for scale, bit for bit.
#pragma once
#include <string>
#include <vector>

namespace replayssm::formats {

struct CheckResult {
  std::string name;
  bool passed = false;
  std::string detail;  // counts on success, the first mismatches on failure
};

CheckResult check_philox_known_answers();
CheckResult check_code_round_trip();
// One result per golden case. Throws std::runtime_error if the file is missing or malformed
// (naming the file, the case and the field).
std::vector<CheckResult> check_golden_file(const std::string& path);

}  // namespace replayssm::formats
