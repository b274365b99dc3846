// The set of configurations a sweep runs: policy lists parsed into specs, then expanded over
// windows and seeds (REPLAYSSM.md section 4 lists the paper's set).
//
// Policy list grammar (whitespace around each entry is ignored):
//   list   := entry (',' entry)*
//   entry  := spec (',' option)*          spec: ssm::parse_policy_spec, e.g. shared:nvfp4+sr or split:nvfp4/fp32@8
//   option := 'seed=' N                  an entry piece holding '=' and no ':' is an option of the spec before it
// e.g. "conv:fp32, shared:nvfp4+sr@16,seed=3, split:nvfp4/fp16+sr".
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ssm/precision_policy.h"

namespace replayssm::eval {

// ---- configurations ----------------------------------------------------------------------------

// The paper's configurations (REPLAYSSM.md section 4), without windows: shared fp16+sr,
// fp8b128+sr, nvfp4+sr and their RTN variants; split nvfp4/fp32, nvfp4/fp16+sr, nvfp4/fp8b128+sr.
std::vector<ssm::PolicySpec> default_policy_specs();
inline constexpr int kDefaultWindow = 16;

// Parses a policy list. Throws std::invalid_argument quoting the list and saying what was expected
// on an empty list or entry ("a,,b"), an option with no policy before it (",seed=1"), a malformed
// policy, or ",seed=N" on a policy without stochastic rounding (the seed would change nothing but
// the configuration's name).
std::vector<ssm::PolicySpec> parse_policy_list(std::string_view text);

// Expands specs into configurations, in order, duplicates dropped:
//   a shared/split spec without '@L' is expanded over `windows` (empty: {kDefaultWindow}); a spec
//   with '@L' keeps its window; conventional decode is window 1;
//   a spec without ",seed=" that uses stochastic rounding is expanded over `seeds` (empty: {0});
//   RTN/FP32-only policies do not depend on the seed and run once (seed 0).
// No specs give no configurations (run_kl_sweep refuses that). Throws std::invalid_argument on a
// window outside [1, ssm::kMaxWindow], or a window or seed listed twice.
std::vector<ssm::PrecisionPolicy> expand_policies(const std::vector<ssm::PolicySpec>& specs,
                                                  const std::vector<int>& windows, const std::vector<uint64_t>& seeds);
bool uses_stochastic_rounding(const ssm::PrecisionPolicy& p);
// {"policy", "scheme", "recur": {"format", "rounding"}, ["read": {...}], "window", "seed",
//  "stochastic_rounding", "error_feedback"}
nlohmann::json policy_json(const ssm::PrecisionPolicy& p);

}  // namespace replayssm::eval
