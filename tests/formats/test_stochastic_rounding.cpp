// Stochastic rounding: determinism per seed, independence from thread count, only the two
// neighbours are returned, P(round away from zero) equals the fractional distance, unbiased.
// Statistical bounds are 5 binomial standard deviations (false-failure rate < 1e-6 per check).
#include <doctest/doctest.h>

#include <algorithm>
#include <boost/random/mersenne_twister.hpp>
#include <boost/random/normal_distribution.hpp>
#include <boost/random/uniform_real_distribution.hpp>
#include <cmath>
#include <thread>
#include <vector>

#include "formats/philox.h"
#include "formats/quantized_matrix.h"
#include "test_util.h"

using namespace replayssm::formats;

namespace {

constexpr ElementFormat kElementFormats[] = {ElementFormat::fp16, ElementFormat::bf16, ElementFormat::e4m3,
                                             ElementFormat::e2m1};

// Representable non-negative finite values of f, from decoding every code (independent of encode).
std::vector<double> representable_magnitudes(ElementFormat f) {
  std::vector<double> v;
  for (uint32_t c = 0; c <= small_float_spec(f).max_finite_code; ++c) v.push_back(decode_element(f, c));
  return v;
}

struct Neighbours {
  double lo, hi;
};

Neighbours neighbours_of(const std::vector<double>& table, double magnitude) {
  auto it = std::upper_bound(table.begin(), table.end(), magnitude);
  return {*(it - 1), it == table.end() ? *(it - 1) : *it};
}

}  // namespace

TEST_CASE("SR returns only the two neighbours, and exact values unchanged") {
  boost::random::mt19937_64 rng(replayssm::test::kBaseSeed + 1);
  for (ElementFormat f : kElementFormats) {
    const auto table = representable_magnitudes(f);
    const double max = table.back();
    boost::random::uniform_real_distribution<double> logmag(std::log(table[1]) - 3, std::log(max));
    for (int i = 0; i < 200000; ++i) {
      const float x = static_cast<float>((i % 2 ? -1 : 1) * std::exp(logmag(rng)));
      if (std::fabs(x) > max) continue;
      const float y = round_to_element(f, x, RoundingMode::stochastic, static_cast<uint32_t>(rng()));
      const Neighbours n = neighbours_of(table, std::fabs(static_cast<double>(x)));
      const double ay = std::fabs(static_cast<double>(y));
      const bool exact = n.lo == std::fabs(static_cast<double>(x));
      REQUIRE_MESSAGE((ay == n.lo || (!exact && ay == n.hi)), "x=" << x << " y=" << y);
      REQUIRE(std::signbit(y) == std::signbit(x));
    }
  }
}

TEST_CASE("SR: P(round away from zero) equals the fractional distance; mean error -> 0") {
  constexpr int kDraws = 400000;
  boost::random::mt19937_64 rng(replayssm::test::kBaseSeed + 2);
  for (ElementFormat f : kElementFormats) {
    const auto table = representable_magnitudes(f);
    // Points between neighbours at chosen fractions, in normal and subnormal ranges.
    for (double frac : {0.5, 1.0 / 3.0, 0.01, 0.99, 0.125}) {
      for (std::size_t lo_index : {std::size_t{1}, table.size() / 2, table.size() - 2}) {
        const double lo = table[lo_index], hi = table[lo_index + 1];
        const float x = static_cast<float>(lo + frac * (hi - lo));
        const double true_frac = (static_cast<double>(x) - lo) / (hi - lo);  // x is rounded to float32
        const uint64_t stream = rng();
        int ups = 0;
        double err_sum = 0;
        for (int i = 0; i < kDraws; ++i) {
          const float y = round_to_element(f, x, RoundingMode::stochastic, sr_random_word(99, stream, i));
          ups += (y == static_cast<float>(hi));
          err_sum += static_cast<double>(y) - static_cast<double>(x);
        }
        const double p = static_cast<double>(ups) / kDraws;
        const double sigma = std::sqrt(std::max(true_frac * (1 - true_frac), 1e-12) / kDraws);
        CAPTURE(frac);
        CAPTURE(lo);
        CHECK(std::fabs(p - true_frac) <= 5 * sigma + 1e-9);
        // Mean error: (p_hat - frac)(hi - lo) exactly, so the same 5-sigma bound scaled by the gap.
        CHECK(std::fabs(err_sum / kDraws) <= (5 * sigma + 1e-9) * (hi - lo));
      }
    }
  }
}

TEST_CASE("SR is deterministic per (seed, stream) and changes with either") {
  boost::random::mt19937_64 rng(replayssm::test::kBaseSeed + 3);
  boost::random::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(64 * 256);
  for (auto& v : x) v = normal(rng);
  for (StorageFormat f : {StorageFormat::fp16, StorageFormat::bf16, StorageFormat::fp8b128, StorageFormat::nvfp4}) {
    const auto a = quantize_matrix(x.data(), 64, 256, f, Rounding::sr, {7, 3});
    const auto b = quantize_matrix(x.data(), 64, 256, f, Rounding::sr, {7, 3});
    const auto c = quantize_matrix(x.data(), 64, 256, f, Rounding::sr, {8, 3});
    const auto d = quantize_matrix(x.data(), 64, 256, f, Rounding::sr, {7, 4});
    CHECK(a.payload == b.payload);
    CHECK(a.payload != c.payload);
    CHECK(a.payload != d.payload);
  }
}

TEST_CASE("SR codes do not depend on the number of threads") {
  boost::random::mt19937_64 rng(replayssm::test::kBaseSeed + 4);
  boost::random::normal_distribution<float> normal(0.0f, 3.0f);
  const std::size_t rows = 96, cols = 512;
  std::vector<float> x(rows * cols);
  for (auto& v : x) v = normal(rng);
  const SrKey key{0x123456789abcull, 42};
  for (StorageFormat f : {StorageFormat::fp16, StorageFormat::e4m3, StorageFormat::nvfp4}) {
    const auto serial = quantize_matrix(x.data(), rows, cols, f, Rounding::sr, key);
    for (unsigned threads : {2u, 3u, 7u}) {
      // Rows split among threads; each thread quantizes its rows as separate elements with the
      // global element index (what a kernel does).
      std::vector<uint32_t> codes(rows * cols);
      std::vector<std::thread> pool;
      for (unsigned t = 0; t < threads; ++t)
        pool.emplace_back([&, t] {
          for (std::size_t r = t; r < rows; r += threads) {
            if (f == StorageFormat::nvfp4) continue;  // needs the tensor amax: checked below
            const ElementFormat ef = f == StorageFormat::fp16 ? ElementFormat::fp16 : ElementFormat::e4m3;
            for (std::size_t c = 0; c < cols; ++c) {
              const std::size_t i = r * cols + c;
              codes[i] = encode_element(ef, x[i], RoundingMode::stochastic, sr_random_word(key.seed, key.stream, i));
            }
          }
        });
      for (auto& th : pool) th.join();
      if (f == StorageFormat::nvfp4) {
        // Whole-tensor API called on row slices with the same global indices cannot share the
        // tensor scale, so compare per-element encoding with the serial scales instead.
        const Nvfp4TensorScale ts{1.0f / serial.tensor_scale, serial.tensor_scale};
        for (std::size_t i = 0; i < rows * cols; ++i) {
          const float enc = nvfp4_element_encode_scale(serial.block_scale_codes[i / 16], ts);
          codes[i] = encode_element(ElementFormat::e2m1, x[i] * enc, RoundingMode::stochastic,
                                    sr_random_word(key.seed, key.stream, i));
        }
      }
      std::size_t differ = 0;
      for (std::size_t i = 0; i < rows * cols; ++i) differ += codes[i] != serial.element_code(i);
      CAPTURE(threads);
      CHECK(differ == 0);
    }
  }
}
