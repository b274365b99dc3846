// The set of configurations a sweep runs: policy specs expanded over windows and seeds
// (REPLAYSSM.md section 4 lists the paper's set).
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
std::vector<std::string> default_policy_specs();
inline constexpr int kDefaultWindow = 16;

// Splits "P1,P2,..." at commas, keeping ",seed=N" with the policy before it.
std::vector<std::string> split_policy_list(std::string_view text);

// Expands policy specs into configurations, in order, duplicates dropped:
//   a spec without '@' and a window-taking scheme (shared, split) is expanded over `windows`
//   (empty: {kDefaultWindow}); a spec with '@L' keeps its window;
//   a spec without ",seed=" that uses stochastic rounding is expanded over `seeds` (empty: {0});
//   RTN/FP32-only policies do not depend on the seed and run once (seed 0).
// Throws std::invalid_argument (from PrecisionPolicy::parse) on a malformed spec.
std::vector<ssm::PrecisionPolicy> expand_policies(const std::vector<std::string>& specs, const std::vector<int>& windows,
                                                  const std::vector<uint64_t>& seeds);
bool uses_stochastic_rounding(const ssm::PrecisionPolicy& p);
// {"policy", "scheme", "recur": {"format", "rounding"}, ["read": {...}], "window", "seed",
//  "stochastic_rounding"}
nlohmann::json policy_json(const ssm::PrecisionPolicy& p);

}  // namespace replayssm::eval
