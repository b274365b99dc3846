// Element formats: hand-checked values from the format definitions (FORMATS.md), specials,
// signed zero, saturation, ties; monotone decoding; Philox known answers.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "formats/element_formats.h"
#include "formats/self_check.h"

using namespace replayssm::formats;

namespace {
uint32_t rtn(ElementFormat f, float x) { return encode_element(f, x); }
const float kNan = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();
}  // namespace

TEST_CASE("fp16 RTN: values, ties, overflow, subnormals, specials") {
  CHECK(rtn(ElementFormat::fp16, 1.0f) == 0x3C00u);
  CHECK(rtn(ElementFormat::fp16, 65504.0f) == 0x7BFFu);
  CHECK(rtn(ElementFormat::fp16, 65519.996f) == 0x7BFFu);
  CHECK(rtn(ElementFormat::fp16, 65520.0f) == 0x7C00u);       // tie between max and 2^16 -> even -> inf
  CHECK(rtn(ElementFormat::fp16, std::ldexp(1.0f, -24)) == 0x0001u);
  CHECK(rtn(ElementFormat::fp16, std::ldexp(1.0f, -25)) == 0x0000u);  // tie -> even (0)
  CHECK(rtn(ElementFormat::fp16, std::ldexp(3.0f, -25)) == 0x0002u);  // 1.5 ulp, tie -> even (2)
  CHECK(rtn(ElementFormat::fp16, 1.0f + std::ldexp(1.0f, -11)) == 0x3C00u);  // tie -> even
  CHECK(rtn(ElementFormat::fp16, 1.0f + std::ldexp(3.0f, -11)) == 0x3C02u);
  CHECK(rtn(ElementFormat::fp16, -0.0f) == 0x8000u);
  CHECK(rtn(ElementFormat::fp16, -std::ldexp(1.0f, -30)) == 0x8000u);  // underflow keeps the sign
  CHECK(rtn(ElementFormat::fp16, -kInf) == 0xFC00u);
  CHECK(rtn(ElementFormat::fp16, kNan) == 0x7FFFu);
  CHECK(rtn(ElementFormat::fp16, -kNan) == 0x7FFFu);
}

TEST_CASE("bf16 RTN: ties, overflow to inf, float32 subnormals") {
  CHECK(rtn(ElementFormat::bf16, 1.0f) == 0x3F80u);
  CHECK(rtn(ElementFormat::bf16, 1.0f + std::ldexp(1.0f, -8)) == 0x3F80u);  // tie -> even
  CHECK(rtn(ElementFormat::bf16, 1.0f + std::ldexp(3.0f, -8)) == 0x3F82u);
  CHECK(rtn(ElementFormat::bf16, std::numeric_limits<float>::max()) == 0x7F80u);
  CHECK(rtn(ElementFormat::bf16, std::ldexp(1.0f, -133)) == 0x0001u);  // smallest bf16 subnormal
  CHECK(rtn(ElementFormat::bf16, std::ldexp(1.0f, -149)) == 0x0000u);
  CHECK(rtn(ElementFormat::bf16, std::ldexp(3.0f, -134)) == 0x0002u);  // 1.5 ulp tie -> even
  CHECK(rtn(ElementFormat::bf16, -kNan) == 0x7FFFu);
  CHECK(decode_element(ElementFormat::bf16, 0x0001u) == std::ldexp(1.0f, -133));
}

TEST_CASE("e4m3 RTN: saturating, NaN canonical, subnormals") {
  CHECK(rtn(ElementFormat::e4m3, 448.0f) == 0x7Eu);
  CHECK(rtn(ElementFormat::e4m3, 464.0f) == 0x7Eu);
  CHECK(rtn(ElementFormat::e4m3, 1e30f) == 0x7Eu);
  CHECK(rtn(ElementFormat::e4m3, kInf) == 0x7Eu);
  CHECK(rtn(ElementFormat::e4m3, -kInf) == 0xFEu);
  CHECK(rtn(ElementFormat::e4m3, kNan) == 0x7Fu);
  CHECK(rtn(ElementFormat::e4m3, -kNan) == 0x7Fu);
  CHECK(rtn(ElementFormat::e4m3, std::ldexp(1.0f, -9)) == 0x01u);
  CHECK(rtn(ElementFormat::e4m3, std::ldexp(1.0f, -10)) == 0x00u);  // tie -> even
  CHECK(rtn(ElementFormat::e4m3, std::ldexp(1.5f, -10)) == 0x01u);
  CHECK(rtn(ElementFormat::e4m3, std::ldexp(1.0f, -6)) == 0x08u);   // smallest normal
  CHECK(rtn(ElementFormat::e4m3, -0.0f) == 0x80u);
  CHECK(decode_element(ElementFormat::e4m3, 0x7Eu) == 448.0f);
  CHECK(std::isnan(decode_element(ElementFormat::e4m3, 0x7Fu)));
}

TEST_CASE("e2m1 RTN: the tie table of FORMATS.md") {
  const std::pair<float, float> ties[] = {{0.25f, 0.0f}, {0.75f, 1.0f}, {1.25f, 1.0f}, {1.75f, 2.0f},
                                          {2.5f, 2.0f},  {3.5f, 4.0f},  {5.0f, 4.0f},  {5.01f, 6.0f},
                                          {6.0f, 6.0f},  {7.0f, 6.0f},  {1e38f, 6.0f}, {0.2499f, 0.0f}};
  for (auto [x, want] : ties) {
    CAPTURE(x);
    CHECK(decode_element(ElementFormat::e2m1, rtn(ElementFormat::e2m1, x)) == want);
    CHECK(decode_element(ElementFormat::e2m1, rtn(ElementFormat::e2m1, -x)) == -want);
  }
  CHECK(rtn(ElementFormat::e2m1, kNan) == 0x7u);   // NaN -> +6, as CUDA
  CHECK(rtn(ElementFormat::e2m1, -kNan) == 0x7u);
  CHECK(rtn(ElementFormat::e2m1, -kInf) == 0xFu);
  CHECK(rtn(ElementFormat::e2m1, -0.0f) == 0x8u);
}

TEST_CASE("decoding is strictly increasing over the non-negative finite codes") {
  for (ElementFormat f : {ElementFormat::fp16, ElementFormat::bf16, ElementFormat::e4m3, ElementFormat::e2m1}) {
    const SmallFloatSpec spec = small_float_spec(f);
    float prev = -1.0f;
    for (uint32_t c = 0; c <= spec.max_finite_code; ++c) {
      const float v = decode_element(f, c);
      REQUIRE(v > prev);
      prev = v;
    }
    CHECK(float_bits(prev) == spec.max_finite_float_bits);
  }
}

TEST_CASE("Philox4x32-10 matches the Random123 known-answer vectors") {
  const CheckResult r = check_philox_known_answers();
  INFO(r.detail);
  CHECK(r.passed);
}

TEST_CASE("every finite code survives decode -> encode (RTN and SR)") {
  const CheckResult r = check_code_round_trip();
  INFO(r.detail);
  CHECK(r.passed);
}
