// The per-element arithmetic of the KL comparison (kl_metrics.h), one definition compiled by g++
// for eval::compare_positions and by nvcc for cuda::compare_positions_gpu: the CPU and the GPU
// rows differ only in the order in which these terms are summed. No Eigen here (nvcc includes it).
//
// A row pair is read twice. Pass 1 (scan_element): the maxima and first-index argmaxes of both
// rows and the non-finite bookkeeping. Pass 2 (sum_element): with w = exp(r - max r) (the
// unnormalised p_ref) and d = r - c, the sums of w, w e, w f(e), exp(c - anchor), where
//   e = d - s0,  s0 = max r - anchor,  f(e) = expm1(-e) + e >= 0.
// The anchor is cfg's value at ref's argmax, so s0 = d there and e = 0 at the reference's top
// token (for near-identical rows e is then of the size of the differences, not of their offset).
// With W = sum w, A = sum w e, F = sum w f(e), G = sum exp(c - anchor) (Gw over w > 0, G0 over
// w = 0): KL = A/W + log(G/W) exactly, and G/W = 1 + v with v = (F - A + G0)/W, so
//   KL = F/W + G0/W + (log1p(v) - v),
// non-negative sums plus a term of order v^2: no cancellation of O(1) log-normalisers, so a KL of
// 1e-10 keeps ~15 digits (sum_v p (log p - log q) evaluated directly kept ~3.5: 3e-4 relative
// error at KL 5e-11, vocab 248320, against a 113-bit evaluation). The formulas that
// turn these sums into a PositionResult live in kl_metrics.cpp (finish_position).
#pragma once
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "formats/host_device.h"

namespace replayssm::eval::kl {

// e within [-kSeriesLimit, kSeriesLimit]: f(e) from its Taylor series (expm1(-e) + e would lose
// log2(2/|e|) bits to cancellation); outside, from exp(c - anchor) - w + w e, which loses at most
// log2(2/kSeriesLimit) = 4 bits.
inline constexpr double kSeriesLimit = 0.125;
// The anchor is cfg's max instead when cfg at ref's argmax is more than this below it, so that no
// exp(c - anchor) (<= e^512) and no sum of 2^31 of them can overflow.
inline constexpr double kMaxAnchorGap = 512.0;

// Pass 1 state of a row pair or of a part of it. POD (no initialisers): lives in shared memory.
struct ScanState {
  float ref_max, cfg_max;    // over reference values that are not NaN/+Inf, over finite cfg values
  int32_t ref_arg, cfg_arg;  // first index of the max; -1 while no value above -Inf was seen
  int64_t nonfinite;         // NaN/+-Inf entries of the configuration row
  int32_t ref_bad, cfg_bad;  // a NaN or +Inf entry was seen (1) in the reference / configuration row
};

// Pass 2 state. Sums over entries with w > 0 unless noted.
struct SumState {
  double w_sum;      // W = sum w
  double e_sum;      // A = sum w e            (entries with cfg > -Inf)
  double f_sum;      // F = sum w f(e) >= 0    (entries with cfg > -Inf)
  double cfg_ref;    // Gw = sum exp(c - anchor) = sum w exp(-e)
  double cfg_rest;   // G0 = sum exp(c - anchor) over entries with w = 0 (ref probability 0)
  int32_t cfg_zero;  // 1: some entry has w > 0 and cfg = -Inf (KL = +Inf)
};

// What the comparison needs of one row pair: both passes' states and the target's two values.
// The GPU writes one per row; finish_position turns it into a PositionResult.
struct RowSums {
  ScanState scan;
  SumState sums;
  double anchor;              // valid when scan_valid(scan)
  int32_t target;             // as given; values are read only when 0 <= target < vocab
  float ref_target, cfg_target;
};

REPLAYSSM_HD float positive_infinity_f() { return formats::bits_float(formats::kFloatInfBits); }

REPLAYSSM_HD ScanState scan_init() {
  ScanState s;
  s.ref_max = s.cfg_max = -positive_infinity_f();
  s.ref_arg = s.cfg_arg = -1;
  s.nonfinite = 0;
  s.ref_bad = s.cfg_bad = 0;
  return s;
}

// Element i of both rows; within one state, i must increase (first index wins ties).
REPLAYSSM_HD void scan_element(ScanState& s, int32_t i, float r, float c) {
  if (!(r <= FLT_MAX)) {  // NaN or +Inf; -Inf is a valid log-probability (p = 0)
    s.ref_bad = 1;
  } else if (r > s.ref_max) {
    s.ref_max = r;
    s.ref_arg = i;
  }
  if (!(c <= FLT_MAX && c >= -FLT_MAX)) {
    ++s.nonfinite;
    if (!(c <= FLT_MAX)) s.cfg_bad = 1;
  } else if (c > s.cfg_max) {
    s.cfg_max = c;
    s.cfg_arg = i;
  }
}

// Merges b into a (disjoint index sets, any order): larger max wins, ties go to the lower index.
REPLAYSSM_HD void merge_arg(float& max_a, int32_t& arg_a, float max_b, int32_t arg_b) {
  if (arg_b < 0) return;
  if (arg_a < 0 || max_b > max_a || (max_b == max_a && arg_b < arg_a)) {
    max_a = max_b;
    arg_a = arg_b;
  }
}
REPLAYSSM_HD void scan_merge(ScanState& a, const ScanState& b) {
  merge_arg(a.ref_max, a.ref_arg, b.ref_max, b.ref_arg);
  merge_arg(a.cfg_max, a.cfg_arg, b.cfg_max, b.cfg_arg);
  a.nonfinite += b.nonfinite;
  a.ref_bad |= b.ref_bad;
  a.cfg_bad |= b.cfg_bad;
}

// Pass 2 runs only for rows without NaN/+Inf whose maxima exist; the others are non-finite.
REPLAYSSM_HD bool scan_valid(const ScanState& s) {
  return !s.ref_bad && !s.cfg_bad && s.ref_arg >= 0 && s.cfg_arg >= 0;
}

// cfg_at_ref_arg: the configuration's value at scan.ref_arg.
REPLAYSSM_HD double choose_anchor(const ScanState& s, float cfg_at_ref_arg) {
  const double c = cfg_at_ref_arg, m = s.cfg_max;
  return (c >= -static_cast<double>(FLT_MAX) && m - c <= kMaxAnchorGap) ? c : m;
}

REPLAYSSM_HD SumState sum_init() {
  SumState s;
  s.w_sum = s.e_sum = s.f_sum = s.cfg_ref = s.cfg_rest = 0.0;
  s.cfg_zero = 0;
  return s;
}

// f(e) / e^2 = sum_{k>=2} (-e)^(k-2) / k!, to e^9/11! (truncation < 4e-18 relative for |e| <= 1/8).
// Plain multiply-adds: bit-identical on the host and on the device (both compile without FMA
// contraction).
REPLAYSSM_HD double f_series_over_e2(double e) {
  double q = -1.0 / 39916800.0;
  q = q * e + 1.0 / 3628800.0;
  q = q * e - 1.0 / 362880.0;
  q = q * e + 1.0 / 40320.0;
  q = q * e - 1.0 / 5040.0;
  q = q * e + 1.0 / 720.0;
  q = q * e - 1.0 / 120.0;
  q = q * e + 1.0 / 24.0;
  q = q * e - 1.0 / 6.0;
  q = q * e + 0.5;
  return q;
}

// Element of pass 2. ref_max = scan.ref_max; shift = ref_max - anchor. Both rows hold no NaN/+Inf.
REPLAYSSM_HD void sum_element(SumState& s, double ref_max, double anchor, double shift, float r, float c) {
  const double rd = r, cd = c;
  const double w = exp(rd - ref_max);
  const bool cfg_positive = cd >= -static_cast<double>(FLT_MAX);
  if (w == 0.0) {  // p_ref = 0 (log p_ref = -Inf or exp underflow): no KL term
    if (cfg_positive) s.cfg_rest += exp(cd - anchor);
    return;
  }
  s.w_sum += w;
  if (!cfg_positive) {
    s.cfg_zero = 1;
    return;
  }
  const double e = (rd - cd) - shift;
  s.e_sum += w * e;
  if (e >= -kSeriesLimit && e <= kSeriesLimit) {
    const double fe = e * e * f_series_over_e2(e);
    s.f_sum += w * fe;
    s.cfg_ref += w * ((1.0 - e) + fe);  // w exp(-e) = w (1 - e + f(e))
  } else {
    const double g = exp(cd - anchor);  // = w exp(-e)
    s.f_sum += (g - w) + w * e;
    s.cfg_ref += g;
  }
}

REPLAYSSM_HD void sum_merge(SumState& a, const SumState& b) {
  a.w_sum += b.w_sum;
  a.e_sum += b.e_sum;
  a.f_sum += b.f_sum;
  a.cfg_ref += b.cfg_ref;
  a.cfg_rest += b.cfg_rest;
  a.cfg_zero |= b.cfg_zero;
}

}  // namespace replayssm::eval::kl
