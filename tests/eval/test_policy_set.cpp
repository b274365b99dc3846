// Policy lists (eval/policy_set.h): parsing into specs, the messages for malformed lists, and the
// expansion of specs over windows and seeds.
#include <doctest/doctest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "eval/policy_set.h"
#include "test_util.h"

using namespace replayssm;

namespace {

std::vector<std::string> names(const std::vector<ssm::PrecisionPolicy>& policies) {
  std::vector<std::string> out;
  for (const auto& p : policies) out.push_back(p.to_string());
  return out;
}

std::vector<ssm::PrecisionPolicy> expand(const std::string& list, const std::vector<int>& windows,
                                         const std::vector<uint64_t>& seeds) {
  return eval::expand_policies(eval::parse_policy_list(list), windows, seeds);
}

}  // namespace

TEST_CASE("the default set: the paper's nine configurations at L = 16") {
  const auto specs = eval::default_policy_specs();
  CHECK(specs.size() == 9);
  const auto defaults = eval::expand_policies(specs, {}, {});
  REQUIRE(defaults.size() == 9);
  CHECK(defaults[0].to_string() == "shared:fp16+sr@16");
  CHECK(defaults[5].to_string() == "shared:nvfp4+rtn@16");
  CHECK(defaults[8].to_string() == "split:nvfp4+rtn/fp8b128+sr@16");
}

TEST_CASE("a policy list parses into specs; ',seed=' belongs to the policy before it") {
  const auto specs = eval::parse_policy_list("conv:fp32, shared:nvfp4+sr@16,seed=3 ,split:nvfp4/fp16+sr");
  REQUIRE(specs.size() == 3);
  CHECK(specs[0].text == "conv:fp32");
  CHECK(specs[1].text == "shared:nvfp4+sr@16,seed=3");
  CHECK(specs[1].seed_given);
  CHECK(specs[1].window_given);
  CHECK(specs[1].policy.seed == 3);
  CHECK(specs[2].text == "split:nvfp4/fp16+sr");
  CHECK_FALSE(specs[2].window_given);
  CHECK_FALSE(specs[2].seed_given);
}

TEST_CASE("malformed policy lists are refused, saying what a list looks like") {
  // These used to give no policies at all, and the sweep silently ran the default set.
  for (const char* empty : {"", " ", " , ", ",,", "shared:nvfp4+sr,", ",shared:nvfp4+sr", "conv:fp32,,conv:fp16"}) {
    CAPTURE(empty);
    const std::string msg = test::error_of<std::invalid_argument>([&] { eval::parse_policy_list(empty); });
    CHECK((msg.find("empty policy list") != std::string::npos || msg.find("is empty") != std::string::npos));
    CHECK(msg.find("a policy list is P1,P2,...") != std::string::npos);
  }
  CHECK(test::error_of<std::invalid_argument>([] { eval::parse_policy_list("conv:fp32,,conv:fp16"); }).find("piece 2 is empty") !=
        std::string::npos);
  // An option first: it was glued to nothing and reported as "missing ':'".
  const std::string option_first = test::error_of<std::invalid_argument>([] { eval::parse_policy_list(",foo=1"); });
  CHECK(option_first.find("'foo=1' is an option, but no policy comes before it") != std::string::npos);
  CHECK(test::error_of<std::invalid_argument>([] { eval::parse_policy_list("seed=2,shared:nvfp4+sr"); })
            .find("'seed=2' is an option, but no policy comes before it") != std::string::npos);
  // An unknown option after a policy, a malformed policy.
  CHECK(test::error_of<std::invalid_argument>([] { eval::parse_policy_list("shared:nvfp4+sr,foo=1"); })
            .find("unknown option 'foo=1'") != std::string::npos);
  CHECK(test::error_of<std::invalid_argument>([] { eval::parse_policy_list("conv:fp32,shared:nvfp5+sr"); })
            .find("unknown number format 'nvfp5'") != std::string::npos);
  // A seed on a policy that rounds to nearest would only rename the configuration.
  const std::string rtn_seed = test::error_of<std::invalid_argument>([] { eval::parse_policy_list("shared:nvfp4+rtn@16,seed=2"); });
  CHECK(rtn_seed.find("'shared:nvfp4+rtn@16,seed=2' has ',seed='") != std::string::npos);
  CHECK(rtn_seed.find("uses no stochastic rounding") != std::string::npos);
  CHECK_THROWS_AS(eval::parse_policy_list("conv:fp32,seed=1"), std::invalid_argument);
}

TEST_CASE("expansion over windows and seeds sets the parsed value's fields") {
  const auto p = expand("shared:fp8+sr, shared:nvfp4+rtn, split:nvfp4/fp32@8, conv:fp16+sr, shared:fp16+sr@32,seed=9, "
                        "shared:fp8b128+sr@4",
                        {4, 16}, {0, 1});
  CHECK(names(p) == std::vector<std::string>{
                        "shared:fp8b128+sr@4", "shared:fp8b128+sr@4,seed=1", "shared:fp8b128+sr@16",
                        "shared:fp8b128+sr@16,seed=1", "shared:nvfp4+rtn@4", "shared:nvfp4+rtn@16",
                        "split:nvfp4+rtn/fp32@8", "conv:fp16+sr", "conv:fp16+sr,seed=1", "shared:fp16+sr@32,seed=9"});
  // A seed written as 0 is kept (not expanded), as is a window written as the default.
  CHECK(names(expand("shared:nvfp4+sr@16,seed=0", {4}, {5, 6})) == std::vector<std::string>{"shared:nvfp4+sr@16"});
  // A split policy with an SR read copy depends on the seed.
  CHECK(expand("split:nvfp4+sr/fp32@4", {}, {0, 2}).size() == 2);
  CHECK(eval::uses_stochastic_rounding(ssm::PrecisionPolicy::parse("split:nvfp4+sr/fp32@4")));
  CHECK_FALSE(eval::uses_stochastic_rounding(ssm::PrecisionPolicy::parse("split:nvfp4+rtn/fp32@4")));
}

TEST_CASE("windows and seeds: out of range or listed twice is refused") {
  CHECK(test::error_of<std::invalid_argument>([] { expand("shared:nvfp4+sr", {0}, {}); }).find("window 0 is outside [1, 1048576]") !=
        std::string::npos);
  CHECK(test::error_of<std::invalid_argument>([] { expand("shared:nvfp4+sr", {-4}, {}); }).find("window -4 is outside") !=
        std::string::npos);
  CHECK(test::error_of<std::invalid_argument>([] { expand("shared:nvfp4+sr", {ssm::kMaxWindow + 1}, {}); }).find("outside") !=
        std::string::npos);
  CHECK(expand("shared:nvfp4+sr", {ssm::kMaxWindow}, {}).at(0).window == ssm::kMaxWindow);
  CHECK(test::error_of<std::invalid_argument>([] { expand("shared:nvfp4+sr", {1, 1}, {}); }).find("window 1 is listed twice") !=
        std::string::npos);
  CHECK(test::error_of<std::invalid_argument>([] { expand("shared:nvfp4+sr", {}, {7, 7}); }).find("seed 7 is listed twice") !=
        std::string::npos);
  CHECK(eval::expand_policies({}, {4}, {}).empty());
}

TEST_CASE("policy_json: the fields a result file records") {
  const auto j = eval::policy_json(ssm::PrecisionPolicy::parse("split:nvfp4/fp16+sr@16,seed=2"));
  CHECK(j["policy"] == "split:nvfp4+rtn/fp16+sr@16,seed=2");
  CHECK(j["scheme"] == "split");
  CHECK(j["read"]["format"] == "nvfp4");
  CHECK(j["read"]["rounding"] == "rtn");
  CHECK(j["recur"]["rounding"] == "sr");
  CHECK(j["window"] == 16);
  CHECK(j["seed"] == 2);
  CHECK(j["stochastic_rounding"] == true);
  const auto c = eval::policy_json(ssm::PrecisionPolicy::parse("conv:fp32"));
  CHECK(c["recur"]["rounding"] == "none");
  CHECK_FALSE(c.contains("read"));
  CHECK(c["stochastic_rounding"] == false);
}
