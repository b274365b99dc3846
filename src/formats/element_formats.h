// Element formats FP16, BF16, FP8 E4M3 ("fn", saturating) and FP4 E2M1, host and device.
//
// Definitions: ../shared/spec/FORMATS.md. Round-to-nearest-even codes equal CUDA's host
// conversion routines on all 2^32 float32 inputs (tests/formats/test_exhaustive_vs_cuda.cpp):
//   FP16  __float2half_rn          overflow -> ±inf, any NaN -> 0x7FFF
//   BF16  __float2bfloat16_rn      overflow -> ±inf, any NaN -> 0x7FFF
//   E4M3  __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)
//                                  |x| beyond 448 and ±inf -> ±448, any NaN -> 0x7F
//   E2M1  __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest)
//                                  |x| beyond 6 and ±inf -> ±6, NaN -> +6 (0x7)
// Every format keeps the sign of zero, including values that underflow to zero.
//
// Stochastic rounding (the toolkit's own definition, FORMATS.md): for |y| <= max finite and
// y not representable, with lo/hi the neighbours toward/away from zero,
//   result = hi  iff  r + floor(frac * 2^32) >= 2^32,   frac = (|y|-|lo|)/(|hi|-|lo|),
// r the element's 32-bit Philox word. That is "add 32 random bits below the kept bits and
// truncate": P(hi) = frac exactly whenever at most 32 bits are discarded (every normal
// result of every format here), and within 2^-32 of frac for deep-underflow inputs.
// |y| > max finite, ±inf and NaN are rounded exactly as RTN (saturation and specials).
#pragma once
#include "formats/host_device.h"

namespace replayssm::formats {

enum class ElementFormat : uint8_t { fp16, bf16, e4m3, e2m1 };

// Parameters of a binary floating-point format with subnormals and no implicit specials
// other than those named by the flags.
struct SmallFloatSpec {
  int mantissa_bits;
  int exponent_bias;
  int total_bits;
  uint32_t max_finite_code;        // magnitude code of the largest finite value
  uint32_t max_finite_float_bits;  // that value as float32 bits
  bool saturating;                 // overflow -> ±max (else ±inf)
  uint32_t inf_code;               // magnitude code of infinity (non-saturating formats)
};

REPLAYSSM_HD SmallFloatSpec small_float_spec(ElementFormat f) {
  switch (f) {
    case ElementFormat::fp16: return {10, 15, 16, 0x7BFFu, 0x477FE000u, false, 0x7C00u};
    case ElementFormat::bf16: return {7, 127, 16, 0x7F7Fu, 0x7F7F0000u, false, 0x7F80u};
    case ElementFormat::e4m3: return {3, 7, 8, 0x7Eu, 0x43E00000u, true, 0u};
    case ElementFormat::e2m1: default: return {1, 1, 4, 0x7u, 0x40C00000u, true, 0u};
  }
}

// Code of a NaN input: CUDA's canonical choice per format (see header comment).
REPLAYSSM_HD uint32_t nan_code(ElementFormat f) {
  switch (f) {
    case ElementFormat::fp16: return 0x7FFFu;
    case ElementFormat::bf16: return 0x7FFFu;
    case ElementFormat::e4m3: return 0x7Fu;  // CUDA's float path canonicalises NaN first
    case ElementFormat::e2m1: default: return 0x7u;
  }
}

enum class RoundingMode : uint8_t { nearest_even, stochastic };

// Magnitude code of the finite float32 |x| (bits `abs_bits`), before any overflow handling.
// Returns a code possibly above max_finite_code when |x| overflows the format.
REPLAYSSM_HD uint32_t round_finite_magnitude(uint32_t abs_bits, const SmallFloatSpec& spec,
                                             RoundingMode mode, uint32_t random_word) {
  const int exp_field = static_cast<int>(abs_bits >> 23);
  const uint32_t fraction = abs_bits & 0x7FFFFFu;
  const int exponent = exp_field == 0 ? -126 : exp_field - 127;
  const int min_normal_exponent = 1 - spec.exponent_bias;
  uint64_t scaled;  // target code followed by `shift` discarded bits
  int shift;
  if (exp_field != 0 && exponent >= min_normal_exponent) {
    // Normal in the target: re-bias the exponent field in place; a round-up carry out of
    // the mantissa increments the exponent, which is exactly the next code.
    scaled = (static_cast<uint64_t>(exponent + spec.exponent_bias) << 23) | fraction;
    shift = 23 - spec.mantissa_bits;
  } else {
    // Subnormal in the target: quantum 2^(emin - M); value = significand * 2^(exponent-23).
    scaled = exp_field == 0 ? fraction : (fraction | 0x800000u);
    shift = 23 - spec.mantissa_bits + (min_normal_exponent - exponent);
  }
  if (shift >= 64) return 0u;  // far below half the smallest subnormal (and below 2^-32 of it)
  const uint64_t kept = scaled >> shift;
  const uint64_t discarded = scaled & ((uint64_t{1} << shift) - 1u);
  if (mode == RoundingMode::nearest_even) {
    const uint64_t half = uint64_t{1} << (shift - 1);
    const bool up = discarded > half || (discarded == half && (kept & 1u));
    return static_cast<uint32_t>(kept + (up ? 1u : 0u));
  }
  // Stochastic: the discarded fraction as a 32-bit fixed-point number, plus r, carries out
  // with probability frac.
  const uint64_t frac32 = shift <= 32 ? (discarded << (32 - shift)) : (discarded >> (shift - 32));
  const bool up = (frac32 + random_word) >> 32;
  return static_cast<uint32_t>(kept + (up ? 1u : 0u));
}

// Encode float32 -> element code. `random_word` is ignored for nearest_even.
REPLAYSSM_HD uint32_t encode_element(ElementFormat f, float x, RoundingMode mode = RoundingMode::nearest_even,
                                     uint32_t random_word = 0u) {
  const SmallFloatSpec spec = small_float_spec(f);
  const uint32_t bits = float_bits(x);
  const uint32_t sign_bit = bits >> 31;
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  const uint32_t sign_code = sign_bit << (spec.total_bits - 1);
  if (abs_bits > kFloatInfBits) return nan_code(f);
  const uint32_t overflow_code = spec.saturating ? spec.max_finite_code : spec.inf_code;
  if (abs_bits == kFloatInfBits) return sign_code | overflow_code;
  // Beyond the largest finite value stochastic rounding has no upper neighbour: round as RTN.
  if (mode == RoundingMode::stochastic && abs_bits > spec.max_finite_float_bits)
    mode = RoundingMode::nearest_even;
  uint32_t magnitude = round_finite_magnitude(abs_bits, spec, mode, random_word);
  if (magnitude > spec.max_finite_code) magnitude = overflow_code;
  return sign_code | magnitude;
}

// Decode element code -> float32 (exact).
REPLAYSSM_HD float decode_element(ElementFormat f, uint32_t code) {
  if (f == ElementFormat::bf16) return bits_float((code & 0xFFFFu) << 16);
  const SmallFloatSpec spec = small_float_spec(f);
  const uint32_t sign_bit = (code >> (spec.total_bits - 1)) & 1u;
  const uint32_t magnitude = code & ((1u << (spec.total_bits - 1)) - 1u);
  const uint32_t exp_field = magnitude >> spec.mantissa_bits;
  const uint32_t mantissa = magnitude & ((1u << spec.mantissa_bits) - 1u);
  uint32_t out;
  if (f == ElementFormat::fp16 && exp_field == 0x1Fu) {
    out = mantissa ? kFloatQuietNanBits | (mantissa << 13) : kFloatInfBits;
  } else if (f == ElementFormat::e4m3 && magnitude == 0x7Fu) {
    out = kFloatQuietNanBits;
  } else if (exp_field == 0) {
    // Subnormal: mantissa * 2^(1 - bias - M), exact in float32 for every format here.
    const float scale = bits_float(static_cast<uint32_t>(127 + 1 - spec.exponent_bias - spec.mantissa_bits) << 23);
    out = float_bits(static_cast<float>(mantissa) * scale);
  } else {
    out = ((exp_field - spec.exponent_bias + 127u) << 23) | (mantissa << (23 - spec.mantissa_bits));
  }
  return bits_float(out | (sign_bit << 31));
}

// Round-trip helper: the value the format stores for x.
REPLAYSSM_HD float round_to_element(ElementFormat f, float x, RoundingMode mode = RoundingMode::nearest_even,
                                   uint32_t random_word = 0u) {
  return decode_element(f, encode_element(f, x, mode, random_word));
}

}  // namespace replayssm::formats
