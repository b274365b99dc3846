// The NVFP4 checkpoint read on the tensor cores: S q (and, for GDN, S k) of an NVFP4 read copy as m16n8k16
// products, for the non-flush step (decode_replay_nonflush.cu); and GDN's FP8-b128 read the same way.
//
// Why: on the CUDA cores every element costs a conversion to fp32 and a fused multiply-add, so the
// NVFP4 read ran issue-bound, not at its byte count (Nsight Compute, 2026-12-04,
// experiments/bench/decode_2026-12-04/README.md section 2). Here the decode yields f16 operands at 1
// conversion per 2 elements, and one mma instruction takes 8 elements of two rows. The same walk for
// FP16 / FP8-b128 reads was measured slower on the H200 (2026-12-04, B = 256: FP16 1.10-1.35x, FP8
// 1.02-1.04x the CUDA-core read's time): with 16-byte pieces of rows g and g + 8 per unit it keeps fewer
// loads in flight than the CUDA-core walk, and those reads are not issue-bound enough to gain
// (experiments/bench/decode_2026-12-04/session11/). So only NVFP4 takes it, and GDN's FP8-b128 read since
// 2026-12-06: on the H100 its tensor-core read at 4 blocks per SM (64 registers, the FP8 codes as f16 pairs,
// the block scales staged in shared memory) took 0.87-0.94x the CUDA-core read's time on Qwen3.5-4B and
// Qwen3.5-122B at B = 64-256, Mamba-2's 0.97-0.99x; at 3 blocks per SM both were slower (Nsight Compute:
// 14-24% fewer instructions, but each block's serial phases then stall the SM; decode_2026-12-06/session23/).
//
// Exactness. A (16 rows x 16 k) holds E2M1 x E4M3 block scale, exact in f16 (<= 6 significant bits,
// 2^-10 .. 2688). B holds each vector times 2^s (s from its largest magnitude, so that it lies in
// [2^14, 2^15)) split in two f16 columns, hi = f16(x 2^s) and lo = f16(x 2^s - hi): bf16 values need 8
// significant bits, so hi alone is exact for every element down to 2^-29 of the largest and hi + lo to
// 2^-39 of it (what lies below contributes less than 2^-39 of the largest term, far under fp32
// rounding). Each product is exact in fp32; the sums are fp32 in another order than the CPU's, as in
// every kernel here. The fp32 factors 2^-s and the tensor scale multiply the row sums.
//
// Layout (PTX ISA, "Matrix Fragments for mma.m16n8k16", g = lane / 4, t = lane % 4):
//   A: a0a1 = (g, 2t..2t+1), a2a3 = (g + 8, 2t..), a4a5 = (g, 2t + 8..), a6a7 = (g + 8, 2t + 8..)
//   B: b0b1 = (2t..2t+1, g), b2b3 = (2t + 8.., g);  D: d0d1 = (g, 2t..2t+1), d2d3 = (g + 8, 2t..)
// The order of k inside a product is free as long as A and B agree, so each lane feeds its own 16-byte
// pieces (rows g and g + 8 of a 16-row tile, columns slab * 4E + t * E .. + E) in the order its decode
// produces them, and holds B for exactly those columns. Two layouts of B's 8 columns:
//  - shared columns (GDN): 0 = q hi, 1 = q lo, 2 = k hi, 3 = k lo, 4..7 zero. A holds e2m1 x block
//    scale (one f16 multiply per pair), so lane t = 0 ends with (S q)[g], (S q)[g + 8] as d0 + d1,
//    d2 + d3, and lane t = 1 the same for S k: no shuffles.
//  - lane columns (Mamba-2): column 2t' (hi) and 2t' + 1 (lo) hold q only where k is one of lane t''s
//    columns, so each lane's D is the product of its own pieces: d0 + d1 (rows g) and d2 + d3 (g + 8)
//    per 16-element block. A holds the bare codes (e2m1 x 2^-6); each block sum takes its block scale in
//    fp32 and two shuffles add the 4 lanes. This saves the 32 f16 multiplies of a unit, a quarter of
//    its decode (static SASS, 2026-12-05); GDN would need 16 columns, two products per k step.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "ssm/decode_replay.cuh"
#include "ssm/state_tiles.cuh"

namespace replayssm::cuda::decode_detail {

using formats::StorageFormat;
using namespace detail;

// The recurrence, format and head dimension the tensor-core read serves (dv % 16 == 0 is checked at run
// time): NVFP4 for Mamba-2 and GDN, FP8-b128 for GDN.
template <ssm::Recurrence K, StorageFormat R, int DK>
__host__ __device__ constexpr bool mma_read_applies() {
  return DK == 128 && K != ssm::Recurrence::kda &&
         (R == StorageFormat::nvfp4 || (R == StorageFormat::fp8b128 && K == ssm::Recurrence::gdn));
}

// d += A B, m16n8k16, f16 operands, fp32 accumulators.
__device__ __forceinline__ void mma_f16_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                              uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Element (within its piece) of half `half` of the piece's decoded pair `pair`. NVFP4 (32-element pieces):
// the decode yields per 32-bit word the pairs (0, 2), (1, 3), (4, 6), (5, 7) (e2m1x8_to_half2_scaled);
// FP8 (16-element pieces): pair i is elements 2i, 2i + 1 (fp8_piece_pairs).
template <StorageFormat R>
__device__ __forceinline__ constexpr int piece_element(int pair, int half) {
  if constexpr (R == StorageFormat::fp8b128) return 2 * pair + half;
  return 8 * (pair / 4) + (pair % 2) + 4 * ((pair % 4) / 2) + 2 * half;
}

// Eight E2M1 codes as four f16x2 pairs of the values times 2^-6 (the E4M3 re-coding of
// e2m1x8_to_float_scaled in state_tiles.cuh), in the order piece_element<nvfp4> names.
__device__ __forceinline__ void e2m1x8_to_half2_scaled(uint32_t word, uint32_t* out) {
  const uint32_t even = ((word << 4) & 0x80808080u) | ((word << 2) & 0x1C1C1C1Cu);  // elements 0, 2, 4, 6
  const uint32_t odd = (word & 0x80808080u) | ((word >> 2) & 0x1C1C1C1Cu);         // elements 1, 3, 5, 7
  out[0] = e4m3x2_to_half2_bits<0>(even), out[1] = e4m3x2_to_half2_bits<0>(odd);
  out[2] = e4m3x2_to_half2_bits<1>(even), out[3] = e4m3x2_to_half2_bits<1>(odd);
}

__device__ __forceinline__ uint32_t hmul2_bits(uint32_t x, __half2 s) {
  __half2 h = *reinterpret_cast<const __half2*>(&x);
  h = __hmul2(h, s);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// A loaded NVFP4 piece (32 elements, two 16-element blocks: words 0-1 and 2-3) as the 16 f16 pairs A
// takes. The block scales times 2^6 (exact in f16, <= 448 * 64) undo the decode's 2^-6: each value is
// e2m1 x block scale, exact. Both scale codes in one conversion; the E4M3 NaN code converts to an f16 NaN
// and stays NaN (as formats::nvfp4_decode_element), with no test of its own (the per-code test, the x 64 and
// the broadcasts took 12 instructions a piece; sm_90 SASS, 2026-12-07).
__device__ __forceinline__ void nvfp4_piece_pairs(const RawPiece& r, uint32_t (&pairs)[16]) {
  const uint32_t w[4] = {r.bits.x, r.bits.y, r.bits.z, r.bits.w};
  const uint32_t codes = e4m3x2_to_half2_bits<0>(r.aux);
  const __half2 scales = __hmul2(*reinterpret_cast<const __half2*>(&codes), __float2half2_rn(64.0f));
#pragma unroll
  for (int blk = 0; blk < 2; ++blk) {
    const __half2 s2 = blk == 0 ? __low2half2(scales) : __high2half2(scales);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      uint32_t* out = &pairs[8 * blk + 4 * j];
      e2m1x8_to_half2_scaled(w[2 * blk + j], out);
#pragma unroll
      for (int i = 0; i < 4; ++i) out[i] = hmul2_bits(out[i], s2);
    }
  }
}

// A loaded FP8 (E4M3) piece, 16 elements, as the 8 f16 pairs A takes: E4M3 values are exact in f16
// (2^-9 .. 448), one conversion per pair; the row's block scale multiplies the row sum.
__device__ __forceinline__ void fp8_piece_pairs(const uint4& bits, uint32_t (&pairs)[8]) {
  const uint32_t w[4] = {bits.x, bits.y, bits.z, bits.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) pairs[2 * j] = e4m3x2_to_half2_bits<0>(w[j]), pairs[2 * j + 1] = e4m3x2_to_half2_bits<1>(w[j]);
}

// A loaded NVFP4 piece as the 16 f16 pairs of its bare codes (e2m1 x 2^-6, exact), for the lane-column
// layout; nvfp4_block_scales gives the factors that follow the products.
__device__ __forceinline__ void nvfp4_piece_codes(const RawPiece& r, uint32_t (&pairs)[16]) {
  const uint32_t w[4] = {r.bits.x, r.bits.y, r.bits.z, r.bits.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) e2m1x8_to_half2_scaled(w[i], &pairs[4 * i]);
}

// The piece's two block scales (one conversion for both codes; the E4M3 NaN code gives NaN, as
// formats::nvfp4_decode_element). The 2^6 that undoes the codes' 2^-6 is not applied here: the caller folds
// it into the tile's factor, once a tile (an exact power of two either way: the same sums, bit for bit). Per
// code, the test, the conversion and the x 64 took 6 instructions (sm_90 SASS, 2026-12-07).
__device__ __forceinline__ float2 nvfp4_block_scales(uint32_t aux) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t h;  // the codes are the low 16 bits (RawPiece::aux); a 16-bit operand spares ptxas a mask
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(static_cast<unsigned short>(aux)));
  return half2_bits_to_float2(h);
#else
  return half2_bits_to_float2(e4m3x2_to_half2_bits<0>(aux));
#endif
}

// 2^s for a bf16 vector of length DK (whole warp; every lane gets it): its largest magnitude times 2^s
// lies in [2^14, 2^15). Zero or infinite vectors keep s = 0 (fmaxf skips NaNs; NaN and Inf reach the
// sums as they should). Returns s.
template <int DK>
__device__ __forceinline__ int mma_vector_exponent(const __nv_bfloat16* v) {
  const int lane = threadIdx.x % 32;
  float amax = 0.0f;
#pragma unroll
  for (int c = 4 * lane; c < DK; c += 128) {
    float x[4];
    load_bf16x4(v + c, x);
#pragma unroll
    for (int i = 0; i < 4; ++i) amax = fmaxf(amax, fabsf(x[i]));
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, off));
  if (!(amax > 0.0f && amax < INFINITY)) return 0;
  return max(-126, min(126, 14 - (((__float_as_int(amax) >> 23) & 0xFF) - 127)));
}
__device__ __forceinline__ float pow2(int e) { return __int_as_float((127 + e) << 23); }  // |e| <= 126

// The B fragments of every lane, for every product of a row (DK / 16 products, 2 registers each: entry
// 2m, 2m + 1 of product m), written to table[lane][kMmaBStride] by the whole block (no barrier here: the
// caller syncs before load_mma_b). Built once per block rather than by every warp (Nsight Compute,
// 2026-12-04: per warp it took ~300 of a block's ~1,900 instructions per warp). `k` may be nullptr
// (shared columns, Mamba-2's old layout: columns 2, 3 zero); lanes g >= 4 hold zeros. kLaneColumns: the
// lane-column layout (q only; lane (g, t) holds q where g / 2 == t). `sq`, `sk`: the vectors' exponents
// (mma_vector_exponent).
template <int DK, bool kLaneColumns, StorageFormat R = StorageFormat::nvfp4>
__device__ __forceinline__ void build_mma_b_table(const __nv_bfloat16* q, const __nv_bfloat16* k, int sq, int sk,
                                                  uint32_t* table) {
  constexpr int E = FormatTraits<R>::kElementsPerPiece, kPerLane = DK / 8;
  for (int e = threadIdx.x; e < 32 * kPerLane; e += kThreads) {
    const int lane = e / kPerLane, P = e % kPerLane, g = lane / 4, t = lane % 4;
    const __nv_bfloat16* vec = kLaneColumns ? (g / 2 == t ? q : nullptr) : g < 2 ? q : g < 4 ? k : nullptr;
    const int s = P / (E / 2), i = P % (E / 2), col = s * 4 * E + t * E;
    const float x0 = vec ? __bfloat162float(vec[col + piece_element<R>(i, 0)]) : 0.0f;
    const float x1 = vec ? __bfloat162float(vec[col + piece_element<R>(i, 1)]) : 0.0f;
    const float scale = pow2(kLaneColumns || g < 2 ? sq : sk);
    const float y0 = x0 * scale, y1 = x1 * scale;
    const __half2 hi = __floats2half2_rn(y0, y1);
    const __half2 h = g % 2 == 1 ? __floats2half2_rn(y0 - __low2float(hi), y1 - __high2float(hi)) : hi;
    table[lane * kMmaBStride + P] = *reinterpret_cast<const uint32_t*>(&h);
  }
}

// The lane's row of the table, and the factor its d0 + d1, d2 + d3 sums take: D column 2t holds the
// vector of lanes g = 2t (shared columns; t = 0: q, t = 1: k), or q (lane columns), scaled by 2^s.
template <int DK, bool kLaneColumns>
__device__ __forceinline__ float load_mma_b(const uint32_t* table, int sq, int sk, uint32_t (&b)[DK / 8]) {
  static_assert(DK / 8 <= kMmaBStride && DK % 32 == 0, "B table row");
  const int lane = threadIdx.x % 32, t = lane % 4;
#pragma unroll
  for (int i = 0; i < DK / 8; i += 4) {
    const uint4 v = *reinterpret_cast<const uint4*>(table + lane * kMmaBStride + i);
    b[i] = v.x, b[i + 1] = v.y, b[i + 2] = v.z, b[i + 3] = v.w;
  }
  return pow2(kLaneColumns || t == 0 ? -sq : -sk);
}

// One (tile, slab) unit's loads: the lane's pieces of rows g and g + 8.
struct MmaReadUnit {
  RawPiece row_g, row_g8;
};
// Where a read's per-row or per-tile scales are staged: right after the B table (carve_shared leaves the B table
// last); the launch adds their room (fp8_row_scale_floats, nvfp4_tile_scale_floats) to the block's shared memory.
__device__ __forceinline__ float* after_b_table(const ReplayShared& sh) { return reinterpret_cast<float*>(sh.mma_b + 32 * kMmaBStride); }
// The NVFP4 tensor scale of each of the block's 16-row tiles (tiles never straddle heads), staged after the B
// table once a block, 1 for skipped heads: the loop then reads one float a tile where
// loading it beside the tile took the head's index, a 64-bit address and a global load (about 12 instructions
// a tile, sm_90 SASS, 2026-12-07). The launch adds their room (nvfp4_tile_scale_floats).
__host__ __device__ constexpr std::size_t nvfp4_tile_scale_floats(int dv, int NH) { return static_cast<std::size_t>(NH) * dv / 16; }
__device__ __forceinline__ float* nvfp4_tile_scales(const ReplayShared& sh) { return after_b_table(sh); }
// A float of shared memory by its 32-bit shared-window address, taken once before a loop: inside the read
// loop ptxas rebuilt a generic pointer's shared address every tile (about 20 instructions, sm_90 SASS).
// Volatile: it must stay after the barrier that publishes what it reads.
__device__ __forceinline__ float load_shared_f32(uint32_t address) {
  float x;
  asm volatile("ld.shared.f32 %0, [%1];" : "=f"(x) : "r"(address));
  return x;
}
__device__ __forceinline__ float load_global_f32(const float* p) {
  float x;
  asm volatile("ld.global.f32 %0, [%1];" : "=f"(x) : "l"(p));
  return x;
}
__device__ __forceinline__ void store_shared_f32(uint32_t address, float x) {
  asm volatile("st.shared.f32 [%0], %1;" ::"r"(address), "f"(x) : "memory");
}
__device__ __forceinline__ uint32_t shared_address(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// The FP8-b128 read at dk = 128 (one block scale per row, staged in shared memory): a unit is one 16-row
// tile, the lane's 16-byte pieces of rows g and g + 8 in both 64-column slabs (columns slab * 64 + t * 16 ..
// + 16).
struct Fp8MmaUnit {
  uint4 row_g[2], row_g8[2];
};
// The rows' block scales, staged after the B table (after_b_table).
__host__ __device__ constexpr std::size_t fp8_row_scale_floats(int dv, int NH) { return static_cast<std::size_t>(NH) * dv; }
__device__ __forceinline__ float* fp8_row_scales(const ReplayShared& sh) { return after_b_table(sh); }
struct Fp8MmaCursor {
  const uint8_t* payload;
};
template <int DK>
__device__ __forceinline__ Fp8MmaCursor fp8_mma_cursor(const HeadView& rv) {
  static_assert(DK == formats::kFp8BlockSize, "one FP8 block scale per row");
  constexpr int E = FormatTraits<StorageFormat::fp8b128>::kElementsPerPiece;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, row = warp * 16 + lane / 4;
  return {rv.payload + row * DK + (lane % 4) * E};
}
// Loads of local tile `local_tile` of this warp; zeros for tiles past the block's rows and for heads whose
// read is skipped (appendix F). Tiles never straddle heads (dv % 16 == 0).
template <int DK>
__device__ __forceinline__ Fp8MmaUnit load_fp8_mma_unit(const Fp8MmaCursor& c, const SmallDiv& head_of_row, int tiles,
                                                        int local_tile, const float* skipped) {
  constexpr int kSlab = 4 * FormatTraits<StorageFormat::fp8b128>::kElementsPerPiece;
  const int tile = local_tile * kWarps + threadIdx.x / 32;
  Fp8MmaUnit u{};
  bool valid = tile < tiles;
  if (valid && skipped) valid = skipped[head_of_row(tile * 16)] == 0.0f;
  if (valid) {
    const int rows = local_tile * kWarps * 16;
    const uint8_t* p = c.payload + rows * DK;
    u.row_g[0] = *reinterpret_cast<const uint4*>(p);
    u.row_g[1] = *reinterpret_cast<const uint4*>(p + kSlab);
    u.row_g8[0] = *reinterpret_cast<const uint4*>(p + 8 * DK);
    u.row_g8[1] = *reinterpret_cast<const uint4*>(p + 8 * DK + kSlab);
  }
  return u;
}

}  // namespace replayssm::cuda::decode_detail
