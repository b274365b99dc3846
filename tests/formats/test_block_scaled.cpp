// Block-scaled containers: documented edge cases and error bounds (the bit-exact check against
// an independent implementation is test_goldens.cpp).
#include <doctest/doctest.h>

#include <boost/random/mersenne_twister.hpp>
#include <boost/random/normal_distribution.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include "formats/quantized_matrix.h"
#include "test_util.h"

using namespace replayssm::formats;

namespace {
std::vector<float> dequantized(const QuantizedMatrix& q) {
  std::vector<float> y(q.size());
  dequantize_matrix(q, y.data());
  return y;
}
std::vector<float> random_matrix(std::size_t n, float scale, uint64_t seed) {
  boost::random::mt19937_64 rng(seed);
  boost::random::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> x(n);
  for (auto& v : x) v = normal(rng);
  return x;
}
}  // namespace

TEST_CASE("all-zero matrix: zeros back, guarded scales, no NaN") {
  std::vector<float> x(4 * 256, 0.0f);
  const auto nv = quantize_matrix(x.data(), 4, 256, StorageFormat::nvfp4, Rounding::rtn);
  CHECK(nv.tensor_scale == 1.0f);
  for (float v : dequantized(nv)) CHECK(float_bits(v) == 0u);
  const auto f8 = quantize_matrix(x.data(), 4, 256, StorageFormat::fp8b128, Rounding::sr, {1, 2});
  for (float s : f8.block_scales) CHECK(s == 1.0f);
  for (float v : dequantized(f8)) CHECK(float_bits(v) == 0u);
}

TEST_CASE("negative zero survives both containers") {
  auto x = random_matrix(2 * 128, 1.0f, replayssm::test::kBaseSeed + 10);
  x[5] = -0.0f;
  for (StorageFormat f : {StorageFormat::nvfp4, StorageFormat::fp8b128}) {
    const auto y = dequantized(quantize_matrix(x.data(), 2, 128, f, Rounding::rtn));
    CHECK(float_bits(y[5]) == 0x80000000u);
  }
}

TEST_CASE("a non-finite element poisons its block only") {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    auto x = random_matrix(2 * 256, 1.0f, replayssm::test::kBaseSeed + 11);
    auto clean = x;
    x[130] = bad;  // block 8 of nvfp4, block 1 of fp8b128
    for (StorageFormat f : {StorageFormat::nvfp4, StorageFormat::fp8b128}) {
      const int bs = block_size(f);
      const auto y = dequantized(quantize_matrix(x.data(), 2, 256, f, Rounding::rtn));
      clean[130] = 0.0f;  // same finite amax elsewhere as long as |x[130]| was not the max
      const auto y_clean = dequantized(quantize_matrix(clean.data(), 2, 256, f, Rounding::rtn));
      for (std::size_t i = 0; i < y.size(); ++i) {
        if (static_cast<int>(i) / bs == 130 / bs) {
          CHECK(std::isnan(y[i]));
        } else if (f == StorageFormat::fp8b128) {
          CHECK(y[i] == y_clean[i]);
        } else {
          CHECK(std::isfinite(y[i]));
        }
      }
    }
  }
}

TEST_CASE("RTN error bounds relative to the block amax") {
  for (float scale : {1e-30f, 1e-3f, 1.0f, 1e3f, 1e30f}) {
    const std::size_t rows = 8, cols = 256;
    const auto x = random_matrix(rows * cols, scale, replayssm::test::kBaseSeed + 12);
    const auto nv = dequantized(quantize_matrix(x.data(), rows, cols, StorageFormat::nvfp4, Rounding::rtn));
    const auto f8 = dequantized(quantize_matrix(x.data(), rows, cols, StorageFormat::fp8b128, Rounding::rtn));
    for (std::size_t b = 0; b < rows * cols / 16; ++b) {
      float amax = 0;
      for (int j = 0; j < 16; ++j) amax = std::max(amax, std::fabs(x[b * 16 + j]));
      for (int j = 0; j < 16; ++j) {
        // E2M1's widest gap is 2 (4..6): half of it is amax/6 at the block scale, which E4M3
        // rounding of the scale can stretch by at most 1 + 2^-4.
        CHECK(std::fabs(nv[b * 16 + j] - x[b * 16 + j]) <= amax / 6.0f * 1.0625f * 1.0001f);
      }
    }
    for (std::size_t i = 0; i < x.size(); ++i) {
      // E4M3 keeps 3 mantissa bits: relative error <= 2^-4 for normals; subnormals (below amax*2^-15)
      // have absolute error <= half the smallest step at this block scale.
      float amax = 0;
      for (int j = 0; j < 128; ++j) amax = std::max(amax, std::fabs(x[(i / 128) * 128 + j]));
      const float bound = std::max(std::fabs(x[i]) * 0.0625f, amax / 448.0f * std::ldexp(1.0f, -10)) * 1.0001f;
      CHECK(std::fabs(f8[i] - x[i]) <= bound);
    }
  }
}

TEST_CASE("shape not a multiple of the block size is a clear error") {
  std::vector<float> x(3 * 40, 1.0f);
  CHECK_THROWS_WITH_AS(quantize_matrix(x.data(), 3, 40, StorageFormat::nvfp4, Rounding::rtn),
                       doctest::Contains("multiple of 16"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(quantize_matrix(x.data(), 3, 40, StorageFormat::fp8b128, Rounding::rtn),
                       doctest::Contains("multiple of 128"), std::invalid_argument);
}

TEST_CASE("storage bytes count codes and scales") {
  CHECK(storage_bytes(StorageFormat::fp32, 64, 128) == 32768);
  CHECK(storage_bytes(StorageFormat::fp16, 64, 128) == 16384);
  CHECK(storage_bytes(StorageFormat::fp8b128, 64, 128) == 8192 + 64 * 4);
  CHECK(storage_bytes(StorageFormat::nvfp4, 64, 128) == 4096 + 512 + 4);
}

TEST_CASE("format and rounding names parse, bad names name the choices") {
  CHECK(parse_storage_format("nvfp4") == StorageFormat::nvfp4);
  CHECK(parse_storage_format("fp8") == StorageFormat::fp8b128);
  CHECK_THROWS_WITH_AS(parse_storage_format("fp6"), doctest::Contains("expected one of"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_rounding("up"), doctest::Contains("expected rtn, sr or ef"), std::invalid_argument);
}
