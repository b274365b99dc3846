// The canonical FP32 dot product of the SSM recurrences (S k, S (a . k), S q: one per state row),
// host and device. Float addition is not associative, so a sum's bits depend on its grouping; an
// Eigen product groups by the host's vector width and no GPU can reproduce it. This order is fixed
// instead, and it is the one a warp computes naturally, so the CPU emulator and the CUDA scan
// kernels (cuda/ssm/sequence_scan.cu) give the same bits:
//
//   1. 32 partial sums: lane l (l = 0..31) starts at +0.0f and adds the products x[j] * y[j] for
//      j = l, l + 32, l + 64, ... < n in increasing j; every product is rounded to float32, then
//      added (no fused multiply-add: the host build has no FMA, the CUDA build --fmad=false).
//   2. a fixed tree: for off = 16, 8, 4, 2, 1: acc[l] += acc[l + off] for l < off; the result is
//      acc[0]. A __shfl_xor_sync butterfly over the same offsets forms exactly these pairwise sums
//      (lane l adds lane l ^ off; addition is commutative, so both lanes of a pair hold the same
//      bits), and so does a reduce-scatter over the same offsets (cuda/ssm/state_tiles.cuh).
//
// Partial sums never become -0 (they start at +0 and IEEE round-to-nearest gives -0 only for
// (-0) + (-0)), so lanes without products contribute an exact +0.
#pragma once
#include "formats/host_device.h"

namespace replayssm::ssm {

inline constexpr int kCanonicalLanes = 32;

// Step 2 on 32 partial sums (acc is overwritten).
REPLAYSSM_HD float canonical_tree_sum(float* acc) {
  for (int off = kCanonicalLanes / 2; off > 0; off /= 2)
    for (int l = 0; l < off; ++l) acc[l] += acc[l + off];
  return acc[0];
}

// sum_j x[j] y[j], j < n, in the canonical order. The 32 partial sums are independent, so the
// full chunks vectorise on the host (32 accumulators) without changing a bit.
REPLAYSSM_HD float canonical_dot(const float* x, const float* y, int n) {
  float acc[kCanonicalLanes];
  for (int l = 0; l < kCanonicalLanes; ++l) acc[l] = 0.0f;
  int j0 = 0;
  for (; j0 + kCanonicalLanes <= n; j0 += kCanonicalLanes)
    for (int l = 0; l < kCanonicalLanes; ++l) acc[l] += x[j0 + l] * y[j0 + l];
  for (int l = 0; j0 + l < n; ++l) acc[l] += x[j0 + l] * y[j0 + l];
  return canonical_tree_sum(acc);
}

}  // namespace replayssm::ssm
