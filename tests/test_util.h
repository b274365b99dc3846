// Shared helpers for the doctest suites.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string>

namespace replayssm::test {

// The repository root: $REPLAYSSM_SOURCE_DIR when set (binaries carried to another machine),
// else the source directory this build was configured from.
inline std::string source_path(const std::string& relative) {
  const char* env = std::getenv("REPLAYSSM_SOURCE_DIR");
  return std::string(env && *env ? env : REPLAYSSM_SOURCE_DIR) + "/" + relative;
}

// A suite that cannot run on this machine says why on stderr and exits 77 (ctest: SKIPPED).
[[noreturn]] inline void skip_suite(const std::string& why) {
  std::cerr << "SKIPPED: " << why << std::endl;
  std::exit(77);
}

// Fixed base seed, recorded in the log; each case derives its own so inputs are fresh per case.
inline constexpr uint64_t kBaseSeed = 20261130;

}  // namespace replayssm::test
