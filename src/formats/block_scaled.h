// Block-scaled containers, per-block arithmetic shared by host and device:
//
// NVFP4 — 16 consecutive elements per block, E2M1 codes, an unsigned E4M3 scale per block and
// one FP32 scale per tensor, computed exactly as NVIDIA Transformer Engine does
// (transformer_engine/common/cast/nvfp4/core_nvfp4.cuh; FORMATS.md "NVFP4"). We follow TE's
// multiply-by-reciprocal form, not ModelOpt's division.
//
// FP8 block-128 — E4M3 codes, one FP32 scale s = amax/448 per 128 consecutive elements; s == 0
// (all-zero block, or amax so small that amax/448 underflows) is replaced by s = 1; the
// reciprocal is clamped to FLT_MAX so subnormal scales never produce inf*0 = NaN.
//
// Non-finite inputs (toolkit rule, both containers): a block holding any NaN or ±inf is
// "poisoned": its scale is NaN (E4M3 code 0x7F for NVFP4, float NaN for FP8 block-128), its
// element codes are 0 and every element decodes to NaN. An overflowed state stays visibly
// non-finite instead of becoming a finite number. Finite blocks are unaffected: NVFP4's
// tensor amax is taken over finite elements only.
//
// All scale arithmetic is single float32 multiplies/divides (no add, so no FMA contraction);
// never build these paths with fast-math (1/x must be IEEE).
#pragma once
#include "formats/element_formats.h"

namespace replayssm::formats {

inline constexpr int kNvfp4BlockSize = 16;
inline constexpr int kFp8BlockSize = 128;
inline constexpr uint32_t kE4m3NanCode = 0x7Fu;

REPLAYSSM_HD float fmin_no_nan(float a, float b) { return a < b ? a : b; }

// Max |x| over finite elements and whether any element is non-finite.
struct BlockAmax {
  float amax = 0.0f;
  bool has_nonfinite = false;
};

REPLAYSSM_HD void accumulate_amax(BlockAmax& acc, float x) {
  const uint32_t abs_bits = float_bits(x) & 0x7FFFFFFFu;
  if (abs_bits >= kFloatInfBits) {
    acc.has_nonfinite = true;
    return;
  }
  const float ax = bits_float(abs_bits);
  if (ax > acc.amax) acc.amax = ax;
}

// ---- NVFP4 ---------------------------------------------------------------------------------

struct Nvfp4TensorScale {
  float encode;  // S_enc = 448*6/global_amax, clamped; 1 when amax is 0
  float decode;  // S_dec = 1/S_enc, the stored FP32 per-tensor scale
};

REPLAYSSM_HD Nvfp4TensorScale nvfp4_tensor_scale(float global_finite_amax) {
  float s_enc = 2688.0f / global_finite_amax;  // 448 * 6; inf when amax == 0, fixed below
  s_enc = fmin_no_nan(s_enc, bits_float(kFloatMaxBits));
  if (global_finite_amax == 0.0f || s_enc == 0.0f) s_enc = 1.0f;
  return {s_enc, 1.0f / s_enc};
}

// E4M3 code of the block's decode scale, S_dec_b = e4m3_rn_satfinite(amax_b * (S_enc * 1/6)).
REPLAYSSM_HD uint32_t nvfp4_block_scale_code(float block_amax, const Nvfp4TensorScale& ts) {
  const float one_sixth = 1.0f / 6.0f;
  const float s_enc_over_6 = ts.encode * one_sixth;
  return encode_element(ElementFormat::e4m3, block_amax * s_enc_over_6);
}

// Multiplier applied to elements before E2M1 rounding: min(1 / (S_dec_b * S_dec), FLT_MAX).
REPLAYSSM_HD float nvfp4_element_encode_scale(uint32_t block_scale_code, const Nvfp4TensorScale& ts) {
  const float block_decode = decode_element(ElementFormat::e4m3, block_scale_code);
  return fmin_no_nan(1.0f / (block_decode * ts.decode), bits_float(kFloatMaxBits));
}

REPLAYSSM_HD float nvfp4_decode_element(uint32_t e2m1_code, uint32_t block_scale_code, float tensor_decode_scale) {
  if (block_scale_code == kE4m3NanCode) return bits_float(kFloatQuietNanBits);
  return decode_element(ElementFormat::e2m1, e2m1_code) * decode_element(ElementFormat::e4m3, block_scale_code) *
         tensor_decode_scale;
}

// ---- FP8 block-128 -------------------------------------------------------------------------

REPLAYSSM_HD float fp8b128_block_scale(const BlockAmax& a) {
  if (a.has_nonfinite) return bits_float(kFloatQuietNanBits);
  float s = a.amax / 448.0f;
  if (s == 0.0f) s = 1.0f;  // all-zero block (or underflow): any scale decodes zeros exactly
  return s;
}

REPLAYSSM_HD float fp8b128_element_encode_scale(float block_scale) {
  return fmin_no_nan(1.0f / block_scale, bits_float(kFloatMaxBits));
}

REPLAYSSM_HD float fp8b128_decode_element(uint32_t e4m3_code, float block_scale) {
  return decode_element(ElementFormat::e4m3, e4m3_code) * block_scale;
}

}  // namespace replayssm::formats
