// The per-(head, row) epilogue of a verification step (Algorithm 2's OUTPUTONLY over B[1:h+T]), shared by
// the shared-FP32 kernel (decode_verify.cu) and the split-precision one (decode_verify_split.cu): they
// differ only in where a draft's value and beta come from, where its correction u goes, and how the
// coefficient rows are loaded, which the caller passes in.
#pragma once
#include <cstddef>

namespace replayssm::cuda::decode_detail {

// One thread's row `idx` (head nn, row r) of a verification block. GDN (kDelta) solves the drafts'
// corrections by forward substitution of U_d (I + A B_d) = R B_d, then every draft output
// O = S Q D + U (W o K^T Q) folds the records. The committed records (p < h) run outermost: a record's
// value is read once for the 2T sums and its coefficients (coef_q, coef_k: a row of TD per record) are
// broadcasts. Each sum still takes its terms in the order of the positions, with the same products, so the
// results are those of a loop over the drafts outermost, bit for bit.
//   s_vals [NH][NP][dv] record values; s_cq, s_ck [NH][NP][TD] coefficients w_{p,s} (k_p . q_s),
//   w_{p,s} (k_p . k_s); s_d [NH][TD] decay factors; s_rows [2 TD][rows_total] S q_s (then S k_s).
//   kVectorCoefficients: the coefficient rows are 16-byte aligned (TD % 4 == 0) and loaded as float4.
//   draft_correction(s, sk): draft s's u from its sum S_{s-1} k_s; store_correction(s, u); store_output(s, o).
template <int TD, bool kDelta, bool kVectorCoefficients, class DraftCorrection, class StoreCorrection, class StoreOutput>
__device__ __forceinline__ void verify_row_epilogue(int idx, int nn, int r, int dv, int h, int NP, int rows_total,
                                                    const float* s_vals, const float* s_cq, const float* s_ck,
                                                    const float* s_d, const float* s_rows,
                                                    DraftCorrection&& draft_correction,
                                                    StoreCorrection&& store_correction, StoreOutput&& store_output) {
  const float* const vn = s_vals + static_cast<std::size_t>(nn) * NP * dv + r;  // record p's value: vn[p dv]
  const float* const coef_q = s_cq + nn * NP * TD;
  const float* const coef_k = s_ck + nn * NP * TD;
  float o[TD], sk[kDelta ? TD : 1];
#pragma unroll
  for (int s = 0; s < TD; ++s) {
    o[s] = s_d[nn * TD + s] * s_rows[s * rows_total + idx];
    if constexpr (kDelta) sk[s] = s_d[nn * TD + s] * s_rows[(TD + s) * rows_total + idx];
  }
  // The committed records (p < h), every draft's sums at once.
  const auto coefficients = [&](const float* table, int p, float (&c)[TD]) {
    if constexpr (kVectorCoefficients) {
      static_assert(TD % 4 == 0, "float4 coefficient rows need TD % 4 == 0");
#pragma unroll
      for (int s4 = 0; s4 < TD; s4 += 4) {
        const float4 c4 = *reinterpret_cast<const float4*>(table + p * TD + s4);
        c[s4] = c4.x, c[s4 + 1] = c4.y, c[s4 + 2] = c4.z, c[s4 + 3] = c4.w;
      }
    } else {
#pragma unroll
      for (int s = 0; s < TD; ++s) c[s] = table[p * TD + s];
    }
  };
#pragma unroll 2
  for (int p = 0; p < h; ++p) {
    const float x = vn[static_cast<std::size_t>(p) * dv];
    float c[TD];
    coefficients(coef_q, p, c);
#pragma unroll
    for (int s = 0; s < TD; ++s) o[s] = fmaf(c[s], x, o[s]);
    if constexpr (kDelta) {
      coefficients(coef_k, p, c);
#pragma unroll
      for (int s = 0; s < TD; ++s) sk[s] = fmaf(c[s], x, sk[s]);
    }
  }
  if constexpr (kDelta) {
    // The drafts' corrections in order (u_d[s] needs u_d[j < s]), then their terms of the outputs.
    float u_d[TD];
#pragma unroll
    for (int s = 0; s < TD; ++s) {
#pragma unroll
      for (int j = 0; j < s; ++j) sk[s] = fmaf(coef_k[(h + j) * TD + s], u_d[j], sk[s]);
      u_d[s] = draft_correction(s, sk[s]);
    }
#pragma unroll
    for (int s = 0; s < TD; ++s)
#pragma unroll
      for (int j = 0; j <= s; ++j) o[s] = fmaf(coef_q[(h + j) * TD + s], u_d[j], o[s]);
#pragma unroll
    for (int s = 0; s < TD; ++s) store_correction(s, u_d[s]);
  } else {
    // Mamba-2: draft j's record (its v, staged at h + j) enters the outputs of drafts s >= j.
#pragma unroll
    for (int j = 0; j < TD; ++j) {
      const float x = vn[static_cast<std::size_t>(h + j) * dv];
#pragma unroll
      for (int s = j; s < TD; ++s) o[s] = fmaf(coef_q[(h + j) * TD + s], x, o[s]);
    }
  }
#pragma unroll
  for (int s = 0; s < TD; ++s) store_output(s, o[s]);
}

}  // namespace replayssm::cuda::decode_detail
