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

}  // namespace replayssm::cuda::decode_detail
