// The fused state quantizer equals formats::fake_quantize_matrix bit for bit (every format, both
// roundings, edge cases), and SR stream ids are distinct per field and range-checked.
#include <doctest/doctest.h>

#include <boost/random/mersenne_twister.hpp>
#include <boost/random/normal_distribution.hpp>
#include <cstring>
#include <limits>
#include <set>
#include <stdexcept>
#include <vector>

#include "ssm/state_quantizer.h"
#include "test_util.h"

using namespace replayssm::ssm;
using namespace replayssm::formats;

namespace {
bool bit_equal(const float* a, const float* b, std::size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }
}  // namespace

TEST_CASE("quantize_state is bit-identical to fake_quantize_matrix") {
  boost::random::mt19937_64 rng(replayssm::test::kBaseSeed + 400);
  boost::random::normal_distribution<float> normal(0.0f, 1.0f);
  const int dv = 6, dk = 256;
  for (StorageFormat f : kAllStorageFormats) {
    for (Rounding r : {Rounding::rtn, Rounding::sr}) {
      for (int variant = 0; variant < 6; ++variant) {
        StateMatrix S(dv, dk);
        const float scale = variant == 1 ? 1e-30f : variant == 2 ? 3e4f : 1.0f;
        for (int i = 0; i < S.size(); ++i) S.data()[i] = scale * normal(rng);
        if (variant == 3) S.row(1).setZero();                                  // all-zero blocks
        if (variant == 4) S(2, 17) = std::numeric_limits<float>::quiet_NaN();  // poisoned block
        if (variant == 5) S(0, 200) = -std::numeric_limits<float>::infinity();
        std::vector<float> ref(S.data(), S.data() + S.size());
        const SrKey key{77, 0x1234'5678'9ABCull + static_cast<uint64_t>(variant)};
        fake_quantize_matrix(ref.data(), dv, dk, f, r, key);
        quantize_state(S, StateFormat{f, r}, key);
        CAPTURE(to_string(f));
        CAPTURE(to_string(r));
        CAPTURE(variant);
        CHECK(bit_equal(S.data(), ref.data(), ref.size()));
      }
    }
  }
}

TEST_CASE("state formats check the block shape along dk") {
  CHECK_NOTHROW(check_state_format({StorageFormat::nvfp4, Rounding::rtn}, 24, 48));
  CHECK_THROWS_AS(check_state_format({StorageFormat::nvfp4, Rounding::rtn}, 24, 40), std::invalid_argument);
  CHECK_THROWS_AS(check_state_format({StorageFormat::fp8b128, Rounding::sr}, 24, 48), std::invalid_argument);
  CHECK_NOTHROW(check_state_format({StorageFormat::fp8b128, Rounding::sr}, 3, 128));
  CHECK_NOTHROW(check_state_format({StorageFormat::fp16, Rounding::sr}, 3, 7));
}

TEST_CASE("SR streams: one per (layer, key head, value head, copy, event), range-checked") {
  std::set<uint64_t> seen;
  int count = 0;
  for (uint32_t layer : {0u, 1u, 65535u})
    for (uint32_t key_head : {0u, 1u, 4095u})
      for (int g : {0, 1, 255})
        for (CheckpointCopy c : {CheckpointCopy::recur, CheckpointCopy::read})
          for (uint64_t e : {uint64_t{0}, uint64_t{1}, kMaxStreamEvents - 1}) {
            seen.insert(sr_stream({layer, key_head}, g, c, e));
            ++count;
          }
  CHECK(seen.size() == static_cast<std::size_t>(count));
  CHECK(sr_stream({3, 5}, 7, CheckpointCopy::read, 11) ==
        ((uint64_t{3} << 48) | (uint64_t{5} << 36) | (uint64_t{7} << 28) | (uint64_t{1} << 27) | 11));
  CHECK_THROWS_AS(sr_stream({65536, 0}, 0, CheckpointCopy::recur, 0), std::out_of_range);
  CHECK_THROWS_AS(sr_stream({0, 4096}, 0, CheckpointCopy::recur, 0), std::out_of_range);
  CHECK_THROWS_AS(sr_stream({0, 0}, 256, CheckpointCopy::recur, 0), std::out_of_range);
  CHECK_THROWS_AS(sr_stream({0, 0}, 0, CheckpointCopy::recur, kMaxStreamEvents), std::out_of_range);
}
