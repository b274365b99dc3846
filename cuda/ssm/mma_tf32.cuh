// m16n8k8 TF32 tensor-core products with two-term operands, shared by the verification stream
// (decode_verify.cu) and the flush fold of the standard step (decode_replay_flush.cu).
#pragma once
#include <cstdint>

namespace replayssm::cuda::decode_detail {

// tf32(x) rounds to nearest (ties away), so x - tf32(x) is exact in fp32 and
// tf32(x) + tf32(x - tf32(x)) is x to 2^-22.
__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

// d += A B for one m16n8k8 TF32 tile (A: the lane's four registers, row-major; B: its two, col-major).
// PTX ISA, "Matrix Fragments for mma.m16n8k8" (.tf32), with g = lane / 4, t = lane % 4 and (row, col):
//   A: a0 = (g, t), a1 = (g + 8, t), a2 = (g, t + 4), a3 = (g + 8, t + 4)
//   B: b0 = (t, g), b1 = (t + 4, g)
//   D: d0 = (g, 2t), d1 = (g, 2t + 1), d2 = (g + 8, 2t), d3 = (g + 8, 2t + 1)
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- The fold on the tensor cores: its layout is described at decode_replay_flush.cu's
// flush_fold_on_tensor_cores. acc[m] = {(2t, col), (2t + 1, col), (2t, col + 1), (2t + 1, col + 1)}, col =
// 4g + 32 (m / 2) + 2 (m mod 2), for the warp's 8 rows and dk = 128.
constexpr int kMmaTiles = 8;  // m-tiles of dk = 128 columns

// The lane's piece c of row 2t + odd in the mma layout: columns 4g + 32c .. + 3.
__device__ __forceinline__ float4 fold_piece(const float (&acc)[kMmaTiles][4], int c, int odd) {
  return make_float4(acc[2 * c][odd], acc[2 * c][2 + odd], acc[2 * c + 1][odd], acc[2 * c + 1][2 + odd]);
}

// acc += the staged records' rank-`staged` update for the warp's rows row0 .. row0 + 7 of one head:
// coef(p, row) = w_p v_p[row], the coefficient of record p for a row of the head (row < dv). Record p's
// key (fp32 values of bf16 keys) is at keys + p KS.
template <int KS, class Coefficient>
__device__ __forceinline__ void fold_records_mma(float (&acc)[kMmaTiles][4], const float* keys, Coefficient&& coef, int dv,
                                                 int row0, int staged) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const bool row_valid = row0 + g < dv;  // rows past dv: zero coefficients (their x is zero and not stored)
  for (int r0 = 0; r0 < staged; r0 += 8) {
    const int ra = r0 + t, rb = r0 + t + 4;  // the lane's records: K index t and t + 4
    const bool va = ra < staged, vb = rb < staged;
    const float ca = va && row_valid ? coef(ra, row0 + g) : 0.0f;
    const float cb = vb && row_valid ? coef(rb, row0 + g) : 0.0f;
    const uint32_t ca_hi = to_tf32(ca), cb_hi = to_tf32(cb);
    const uint32_t ca_lo = to_tf32(ca - __uint_as_float(ca_hi)), cb_lo = to_tf32(cb - __uint_as_float(cb_hi));
#pragma unroll
    for (int c = 0; c < kMmaTiles / 2; ++c) {
      // Records past `staged` (the last chunk's padding) read as zero: that shared memory is not written.
      const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      const float4 ka = va ? *reinterpret_cast<const float4*>(keys + ra * KS + 4 * g + 32 * c) : zero;
      const float4 kb = vb ? *reinterpret_cast<const float4*>(keys + rb * KS + 4 * g + 32 * c) : zero;
      const uint32_t a_even[4] = {__float_as_uint(ka.x), __float_as_uint(ka.y), __float_as_uint(kb.x), __float_as_uint(kb.y)};
      const uint32_t a_odd[4] = {__float_as_uint(ka.z), __float_as_uint(ka.w), __float_as_uint(kb.z), __float_as_uint(kb.w)};
      mma_tf32(acc[2 * c], a_even, ca_hi, cb_hi);
      mma_tf32(acc[2 * c], a_even, ca_lo, cb_lo);
      mma_tf32(acc[2 * c + 1], a_odd, ca_hi, cb_hi);
      mma_tf32(acc[2 * c + 1], a_odd, ca_lo, cb_lo);
    }
  }
}

}  // namespace replayssm::cuda::decode_detail
