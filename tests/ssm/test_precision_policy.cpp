// PrecisionPolicy text form: canonical round trips, defaults, and error messages that quote the
// bad text and say what was expected.
#include <doctest/doctest.h>

#include <stdexcept>
#include <string>

#include "ssm/precision_policy.h"

using namespace replayssm::ssm;
using replayssm::formats::Rounding;
using replayssm::formats::StorageFormat;

namespace {
// The message of the std::invalid_argument thrown by parse(text) ("" if none).
std::string parse_error(const std::string& text) {
  try {
    PrecisionPolicy::parse(text);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}
void check_error(const std::string& text, const std::string& expected_fragment) {
  const std::string msg = parse_error(text);
  INFO("text: '" << text << "' message: " << msg);
  CHECK(msg.find("'" + text + "'") != std::string::npos);  // quotes the whole text
  CHECK(msg.find(expected_fragment) != std::string::npos);
}
}  // namespace

TEST_CASE("canonical policies round-trip through parse and to_string") {
  for (const char* text :
       {"conv:fp32", "conv:fp16+sr", "conv:nvfp4+rtn", "conv:fp8b128+sr", "conv:bf16+rtn", "shared:nvfp4+sr@16",
        "shared:fp32@16", "shared:fp16+sr@1", "shared:e4m3+rtn@64", "split:nvfp4+rtn/fp32@16",
        "split:nvfp4+rtn/fp16+sr@16", "split:fp8b128+rtn/fp8b128+sr@32", "split:fp32/fp32@4",
        "split:nvfp4+sr/fp16+rtn@8", "shared:nvfp4+sr@16,seed=42", "conv:fp16+sr,seed=18446744073709551615"}) {
    const PrecisionPolicy p = PrecisionPolicy::parse(text);
    CHECK(p.to_string() == text);
    CHECK(PrecisionPolicy::parse(p.to_string()) == p);
  }
}

TEST_CASE("parsed fields, defaults and aliases") {
  const PrecisionPolicy a = PrecisionPolicy::parse("split:nvfp4/fp16@16");
  CHECK(a.scheme == DecodeScheme::split);
  CHECK(a.read == StateFormat{StorageFormat::nvfp4, Rounding::rtn});   // read defaults to rtn
  CHECK(a.recur == StateFormat{StorageFormat::fp16, Rounding::sr});    // split recurrence defaults to sr
  CHECK(a.window == 16);
  CHECK(a.seed == 0);
  CHECK(a.to_string() == "split:nvfp4+rtn/fp16+sr@16");

  const PrecisionPolicy b = PrecisionPolicy::parse("shared:fp8@8,seed=7");  // fp8 = fp8b128
  CHECK(b.recur == StateFormat{StorageFormat::fp8b128, Rounding::rtn});
  CHECK(b.window == 8);
  CHECK(b.seed == 7);
  CHECK(b.to_string() == "shared:fp8b128+rtn@8,seed=7");

  const PrecisionPolicy c = PrecisionPolicy::parse("  conv:fp32@1 ");
  CHECK(c.scheme == DecodeScheme::conventional);
  CHECK(c.window == 1);  // conventional policies have window 1
  CHECK(c == PrecisionPolicy{});
  CHECK(PrecisionPolicy::parse("conv:nvfp4").recur.rounding == Rounding::rtn);
  CHECK(PrecisionPolicy::parse("split:nvfp4+rtn/fp32@16").recur == StateFormat{StorageFormat::fp32, Rounding::rtn});
  CHECK(PrecisionPolicy::parse("split:nvfp4/fp16+sr@16") == PrecisionPolicy::parse("split:nvfp4+rtn/fp16+sr@16"));

  CHECK(PrecisionPolicy::parse("conv:fp32").is_fp32_exact());
  CHECK(PrecisionPolicy::parse("shared:fp32@16").is_fp32_exact());
  CHECK(PrecisionPolicy::parse("split:fp32/fp32@16").is_fp32_exact());
  CHECK_FALSE(PrecisionPolicy::parse("split:nvfp4/fp32@16").is_fp32_exact());
  CHECK_FALSE(PrecisionPolicy::parse("shared:fp16+sr@16").is_fp32_exact());
}

TEST_CASE("malformed policies are rejected with messages that quote the text") {
  check_error("", "empty");
  check_error("fancy:fp32@16", "unknown scheme 'fancy'");
  check_error("nvfp4@16", "missing ':'");
  check_error("shared:fp5@16", "unknown number format 'fp5'");
  check_error("split:nvfp4/fp7+sr@16", "recurrence format");
  check_error("shared:nvfp4+sr", "missing window '@L'");
  check_error("split:nvfp4/fp32", "missing window '@L'");
  check_error("shared:nvfp4@0", "at least 1");
  check_error("shared:nvfp4@-3", "positive integer");
  check_error("shared:nvfp4@", "positive integer");
  check_error("shared:nvfp4@16x", "positive integer, got '16x'");
  check_error("shared:nvfp4@99999999999999999999", "positive integer");
  check_error("split:nvfp4@16", "split needs two formats");
  check_error("split:nvfp4/fp16/fp32@16", "exactly two formats");
  check_error("shared:nvfp4/fp32@16", "only split policies take two formats");
  check_error("conv:fp32+sr", "takes no rounding");
  check_error("split:nvfp4/fp32+rtn@16", "takes no rounding");
  check_error("shared:nvfp4+rz@16", "unknown rounding 'rz'");
  check_error("conv:fp16@16", "window 1");
  check_error("shared:nvfp4@16,seed=", "seed must be");
  check_error("shared:nvfp4@16,seed=-1", "seed must be");
  check_error("shared:nvfp4@16,seed=12ab", "seed must be");
  check_error("shared:nvfp4@16,seed=18446744073709551616", "seed must be");  // 2^64
  check_error("shared:nvfp4@16,seed=1,seed=2", "given twice");
  check_error("shared:nvfp4@16,window=3", "unknown option 'window=3'");
  check_error("shared:nvfp4@16,", "unknown option ''");
  check_error("shared:@16", "missing state format");
  check_error("split:/fp32@16", "missing read format");
}

TEST_CASE("policy specs: the same grammar with the window optional, and what was written") {
  const PolicySpec a = parse_policy_spec(" shared:nvfp4+sr ");
  CHECK(a.text == "shared:nvfp4+sr");
  CHECK(a.policy.scheme == DecodeScheme::shared);
  CHECK(a.policy.recur == StateFormat{StorageFormat::nvfp4, Rounding::sr});
  CHECK_FALSE(a.window_given);
  CHECK_FALSE(a.seed_given);
  const PolicySpec b = parse_policy_spec("split:nvfp4/fp16@8,seed=0");
  CHECK(b.window_given);
  CHECK(b.seed_given);  // written, even though it is the default value
  CHECK(b.policy == PrecisionPolicy::parse("split:nvfp4+rtn/fp16+sr@8"));
  CHECK_FALSE(parse_policy_spec("conv:fp16+sr").window_given);
  CHECK(parse_policy_spec("conv:fp16+sr").policy.window == 1);
  // Everything else is checked as by parse.
  CHECK_THROWS_WITH(parse_policy_spec("split:nvfp4@8"), doctest::Contains("split needs two formats"));
  CHECK_THROWS_WITH(parse_policy_spec("shared:nvfp4,seed=x"), doctest::Contains("seed must be"));
  CHECK_THROWS_WITH(parse_policy_spec("shared:nvfp4@0"), doctest::Contains("at least 1"));
  CHECK_THROWS_WITH(parse_policy_spec(""), doctest::Contains("empty"));
  // The window bound is the public kMaxWindow.
  CHECK(parse_policy_spec("shared:nvfp4@1048576").policy.window == kMaxWindow);
  CHECK_THROWS_WITH(parse_policy_spec("shared:nvfp4@1048577"), doctest::Contains("supported maximum 1048576"));
}

TEST_CASE("a policy without its window says so with an example of the same policy") {
  check_error("shared:fp16+sr,seed=3",
              "missing window '@L': shared policies need one, e.g. 'shared:fp16+sr@16,seed=3'");
  check_error("split:nvfp4/fp32", "e.g. 'split:nvfp4+rtn/fp32@16'");
}
