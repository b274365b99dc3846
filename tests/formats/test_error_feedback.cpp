// Error feedback (Rounding::ef, formats/quantized_matrix.h) against a float64 oracle: the first
// quantization is RTN, every residual is exactly what was dropped, and over repeated quantizations
// of one matrix the running sum of what was stored tracks the running sum of what was meant to
// within one residual (the sigma-delta property that makes ef worth studying), where RTN's error
// grows with the count. The functions that take an element rounding refuse ef.
#include <doctest/doctest.h>

#include <boost/random/mersenne_twister.hpp>
#include <boost/random/normal_distribution.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "formats/quantized_matrix.h"
#include "test_util.h"

using namespace replayssm;
using formats::Rounding;
using formats::StorageFormat;

namespace {

constexpr StorageFormat kLowFormats[] = {StorageFormat::fp16, StorageFormat::bf16, StorageFormat::e4m3,
                                         StorageFormat::e2m1, StorageFormat::fp8b128, StorageFormat::nvfp4};

// rows x cols values ~ N(0, scale^2), fresh per seed.
std::vector<float> random_matrix(std::size_t rows, std::size_t cols, float scale, uint64_t seed) {
  boost::random::mt19937_64 rng(seed);
  boost::random::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> x(rows * cols);
  for (float& v : x) v = normal(rng);
  return x;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// e2m1 without a scale holds only |x| <= 6: keep its inputs in range.
float scale_for(StorageFormat f) { return f == StorageFormat::e2m1 ? 1.5f : 3.0f; }

}  // namespace

TEST_CASE("error feedback: the first quantization is RTN and the residual is exactly what it dropped") {
  uint64_t seed = test::kBaseSeed * 1000 + 900;
  for (StorageFormat f : kLowFormats) {
    CAPTURE(formats::to_string(f));
    const std::size_t rows = 4, cols = 256;
    const std::vector<float> x = random_matrix(rows, cols, scale_for(f), ++seed);
    std::vector<float> rtn = x, ef = x, residual(x.size(), 0.0f);
    formats::fake_quantize_matrix(rtn.data(), rows, cols, f, Rounding::rtn);
    formats::fake_quantize_with_error_feedback(ef.data(), residual.data(), rows, cols, f);
    CHECK(same_bits(ef, rtn));
    int inexact = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      CHECK(static_cast<double>(residual[i]) == static_cast<double>(x[i]) - static_cast<double>(ef[i]));
      inexact += residual[i] != 0.0f;
    }
    CHECK(inexact > 0);  // the inputs are not already on the grid: the test would say nothing
  }
}

TEST_CASE("error feedback: the running sum of stored values tracks n x to within one residual (float64 oracle)") {
  // y_k = fl(x + r_{k-1}), q_k = Q(y_k), r_k = y_k - q_k, so sum_k q_k = n x - r_n + sum_k delta_k with
  // delta_k the float32 rounding of the addition: |sum q_k - n x + r_n| <= n ulp(y) / 2. RTN's sum
  // error is n |x - Q(x)|, n times one rounding.
  uint64_t seed = test::kBaseSeed * 1000 + 920;
  const int n = 256;
  std::printf("\n[error feedback] %d quantizations of one matrix: max |mean stored - x| / max |x - RTN(x)|\n", n);
  for (StorageFormat f : kLowFormats) {
    CAPTURE(formats::to_string(f));
    const std::size_t rows = 2, cols = 128;
    const std::vector<float> x = random_matrix(rows, cols, scale_for(f), ++seed);
    std::vector<float> rtn = x;
    formats::fake_quantize_matrix(rtn.data(), rows, cols, f, Rounding::rtn);
    std::vector<float> residual(x.size(), 0.0f);
    std::vector<double> sum(x.size(), 0.0);
    double max_y = 0.0;
    for (int k = 0; k < n; ++k) {
      std::vector<float> v = x;
      for (std::size_t i = 0; i < x.size(); ++i) max_y = std::max(max_y, std::fabs(double(x[i]) + residual[i]));
      formats::fake_quantize_with_error_feedback(v.data(), residual.data(), rows, cols, f);
      for (std::size_t i = 0; i < x.size(); ++i) sum[i] += v[i];
    }
    const double slack = n * std::ldexp(max_y, -24);  // n half-ulps of float32 at the largest y
    double worst_ef = 0.0, worst_rtn = 0.0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double drift = sum[i] - n * double(x[i]) + residual[i];
      CHECK(std::fabs(drift) <= slack);
      worst_ef = std::max(worst_ef, std::fabs(sum[i] / n - x[i]));
      worst_rtn = std::max(worst_rtn, std::fabs(double(rtn[i]) - x[i]));
    }
    std::printf("  %-8s %.3e / %.3e\n", std::string(formats::to_string(f)).c_str(), worst_ef, worst_rtn);
    CHECK(worst_rtn > 0.0);
    CHECK(worst_ef <= worst_rtn * 4.0 / n + slack / n);  // one residual (<= 2 roundings' worth) spread over n
  }
}

TEST_CASE("error feedback: fp32 is stored exactly; rounding 'ef' is parsed and printed; element-rounding paths refuse it") {
  std::vector<float> x = random_matrix(1, 16, 1.0f, test::kBaseSeed * 1000 + 940), residual(16, 0.25f);
  const std::vector<float> x0 = x, r0 = residual;
  formats::fake_quantize_with_error_feedback(x.data(), residual.data(), 1, 16, StorageFormat::fp32);
  CHECK(same_bits(x, x0));
  CHECK(same_bits(residual, r0));
  CHECK(formats::parse_rounding("ef") == Rounding::ef);
  CHECK(formats::to_string(Rounding::ef) == "ef");
  CHECK(test::error_of<std::invalid_argument>([] { (void)formats::parse_rounding("feedback"); })
            .find("rtn, sr or ef") != std::string::npos);
  const std::string why =
      test::error_of<std::invalid_argument>([] { (void)formats::element_rounding_mode(Rounding::ef); });
  CHECK(why.find("error feedback") != std::string::npos);
  CHECK(test::error_of<std::invalid_argument>([&] {
          (void)formats::quantize_matrix(x.data(), 1, 16, StorageFormat::nvfp4, Rounding::ef);
        }).find("residual") != std::string::npos);
  CHECK(test::error_of<std::invalid_argument>([&] {
          formats::fake_quantize_matrix(x.data(), 1, 16, StorageFormat::fp16, Rounding::ef);
        }).find("residual") != std::string::npos);
  // A block format checks its shape before touching anything.
  std::vector<float> y(24, 1.0f), r(24, 0.0f);
  CHECK(test::error_of<std::invalid_argument>([&] {
          formats::fake_quantize_with_error_feedback(y.data(), r.data(), 1, 24, StorageFormat::nvfp4);
        }) != "(no error)");
}
