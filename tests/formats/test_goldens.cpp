// Block-scaled containers and element formats, RTN and SR, against the golden file made by an
// independent implementation (scripts/make_format_goldens.py: numpy + ml_dtypes, TE recipe).
#include <doctest/doctest.h>

#include "formats/self_check.h"
#include "test_util.h"

using namespace replayssm::formats;

TEST_CASE("golden file: codes, scales and decoded values bit-equal") {
  const auto results = check_golden_file(replayssm::test::source_path("data/goldens/formats_v1.json"));
  REQUIRE(results.size() >= 20);
  int nvfp4 = 0, fp8 = 0, sr = 0;
  for (const auto& r : results) {
    INFO(r.name << ": " << r.detail);
    CHECK(r.passed);
    nvfp4 += r.name.find("nvfp4") != std::string::npos;
    fp8 += r.name.find("fp8b128") != std::string::npos;
    sr += r.name.find(" sr ") != std::string::npos;
  }
  CHECK(nvfp4 >= 4);
  CHECK(fp8 >= 4);
  CHECK(sr >= 4);
}

TEST_CASE("a malformed golden file is a clear error") {
  CHECK_THROWS_WITH(check_golden_file("/nonexistent/formats_v1.json"), doctest::Contains("cannot open golden file"));
}
