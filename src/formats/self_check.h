// Self-checks of the number formats, shared by `replayssm formats` and the test suite:
//   - Philox4x32-10 against the Random123 known-answer vectors;
//   - every finite code of every element format survives decode -> encode unchanged (RTN and SR);
//   - the golden file written by scripts/make_format_goldens.py (numpy + ml_dtypes, an independent
//     implementation of the same definitions) matches code for code, scale for scale, bit for bit.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "formats/quantized_matrix.h"

namespace replayssm::formats {

struct CheckResult {
  std::string name;
  bool passed = false;
  std::string detail;  // counts on success, the first mismatches on failure
};

CheckResult check_philox_known_answers();
CheckResult check_code_round_trip();
// Anything with quantize_matrix's signature: the CPU reference or a GPU launcher.
using MatrixQuantizer =
    std::function<QuantizedMatrix(const float*, std::size_t, std::size_t, StorageFormat, Rounding, SrKey)>;

// One result per golden case. Throws std::runtime_error if the file is missing or malformed
// (naming the file, the case and the field).
std::vector<CheckResult> check_golden_file(const std::string& path, const MatrixQuantizer& quantizer = quantize_matrix);

}  // namespace replayssm::formats
