// How a warp walks a dv x dk state matrix: each lane owns pieces of E consecutive elements (one
// 16-byte load), LPR lanes cover a row of dk, so a warp covers RW = 32/LPR rows per iteration and
// a 256-thread block covers the head. Row-dot products reduce over the LPR lanes of a row.
// Formats are decoded on the fly with CUDA's exact conversions (checked against ours on every code):
//   fp32 E=4, fp16/bf16 E=8, fp8b128 E=16 (one scale per 128 = per row chunk), nvfp4 E=32 (two block
//   scales per piece; the block scale and the tensor scale are applied to partial dot products, not
//   per element — the same value up to fp32 summation order).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "formats/block_scaled.h"
#include "ssm/decode_kernels.h"

namespace replayssm::cuda::detail {

using formats::StorageFormat;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFullMask = 0xFFFFFFFFu;

// The two E4M3 codes in bytes 2 half, 2 half + 1 of `word` as an f16x2 (CUDA's exact conversion). On sm_89+
// the half is picked in PTX, not by a shift: ptxas then converts straight from the register's upper half
// (F2FP.F16.E4M3.UNPACK_B R.H1), one instruction a pair where `word >> 16` took two (SASS, sm_90, CUDA 13.0).
template <int kHalf>
__device__ __forceinline__ uint32_t e4m3x2_to_half2_bits(uint32_t word) {
  static_assert(kHalf == 0 || kHalf == 1, "a 32-bit word holds two code pairs");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t h;
  if constexpr (kHalf == 0)
    asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, lo;\n}" : "=r"(h) : "r"(word));
  else
    asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, hi;\n}" : "=r"(h) : "r"(word));
  return h;
#else
  const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word >> (16 * kHalf)), __NV_E4M3);
  return static_cast<uint32_t>(r.x) | (static_cast<uint32_t>(r.y) << 16);
#endif
}
__device__ __forceinline__ float2 half2_bits_to_float2(uint32_t bits) {
  return __half22float2(*reinterpret_cast<const __half2*>(&bits));
}

template <StorageFormat F>
struct FormatTraits;
template <>
struct FormatTraits<StorageFormat::fp32> {
  static constexpr int kElementsPerPiece = 4;
};
template <>
struct FormatTraits<StorageFormat::fp16> {
  static constexpr int kElementsPerPiece = 8;
};
template <>
struct FormatTraits<StorageFormat::bf16> {
  static constexpr int kElementsPerPiece = 8;
};
template <>
struct FormatTraits<StorageFormat::fp8b128> {
  static constexpr int kElementsPerPiece = 16;
};
template <>
struct FormatTraits<StorageFormat::nvfp4> {
  static constexpr int kElementsPerPiece = 32;
};

// Lane geometry for a format and a head dimension DK (a power of two, 64..256).
template <StorageFormat F, int DK>
struct Tile {
  static constexpr int E = FormatTraits<F>::kElementsPerPiece;
  static constexpr int kPiecesPerRow = DK / E;
  static constexpr int LPR = kPiecesPerRow < 32 ? kPiecesPerRow : 32;  // lanes per row
  static constexpr int P = kPiecesPerRow / LPR;                        // pieces per lane
  static constexpr int RW = 32 / LPR;                                  // rows per warp iteration
  static_assert(DK % E == 0 && LPR >= 1 && P >= 1, "unsupported head dimension for this format");
  __device__ static int row_in_iteration(int lane) { return lane / LPR; }
  // First column of piece p of this lane.
  __device__ static int col(int lane, int p) { return ((lane % LPR) + p * LPR) * E; }
};

// Sum over the LPR lanes that share a row (all of them get the sum).
template <int LPR>
__device__ __forceinline__ float row_sum(float x) {
#pragma unroll
  for (int off = LPR / 2; off > 0; off /= 2) x += __shfl_xor_sync(kFullMask, x, off);
  return x;
}
template <int LPR>
__device__ __forceinline__ float row_max(float x) {
#pragma unroll
  for (int off = LPR / 2; off > 0; off /= 2) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, off));
  return x;
}

__device__ __forceinline__ void load_bf16x4(const __nv_bfloat16* p, float* out) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
  out[0] = a.x;
  out[1] = a.y;
  out[2] = b.x;
  out[3] = b.y;
}

__host__ __device__ __forceinline__ int storage_element_bits(StorageFormat f) {
  switch (f) {
    case StorageFormat::fp32: return 32;
    case StorageFormat::fp16:
    case StorageFormat::bf16: return 16;
    case StorageFormat::e4m3:
    case StorageFormat::fp8b128: return 8;
    default: return 4;
  }
}

// One head's copy of the state in one format.
struct HeadView {
  uint8_t* payload;
  uint8_t* scale_codes;
  float* block_scales;
  float tensor_scale;
  float* tensor_scale_out;
};

__device__ __forceinline__ HeadView head_view(const DeviceState& s, std::size_t head, int dv, int dk) {
  const std::size_t n = static_cast<std::size_t>(dv) * dk;
  HeadView v;
  v.payload = s.payload + head * (n * storage_element_bits(s.format) / 8);
  v.scale_codes = s.scale_codes ? s.scale_codes + head * (n / formats::kNvfp4BlockSize) : nullptr;
  v.block_scales = s.block_scales ? s.block_scales + head * (n / formats::kFp8BlockSize) : nullptr;
  v.tensor_scale_out = s.tensor_scales ? s.tensor_scales + head : nullptr;
  v.tensor_scale = s.tensor_scales ? s.tensor_scales[head] : 1.0f;
  return v;
}

// Eight E2M1 codes (one 32-bit word, element 2i in the low nibble of byte i) as floats scaled by
// 2^-6, in element order. Each code becomes an E4M3 byte s 00ee m00 (exponent bias 7 against
// E2M1's 1, subnormals included: 2^-6 x (m / 2)), so the hardware e4m3x2 -> f16x2 conversion
// decodes two elements per instruction: 7 integer operations (3 shifts, 4 LOP3 in sm_90 SASS) and 4
// conversions for 8 elements.
__device__ __forceinline__ void e2m1x8_to_float_scaled(uint32_t word, float* out) {
  const uint32_t even = ((word << 4) & 0x80808080u) | ((word << 2) & 0x1C1C1C1Cu);  // elements 0, 2, 4, 6
  const uint32_t odd = (word & 0x80808080u) | ((word >> 2) & 0x1C1C1C1Cu);         // elements 1, 3, 5, 7
  const float2 fe0 = half2_bits_to_float2(e4m3x2_to_half2_bits<0>(even)), fo0 = half2_bits_to_float2(e4m3x2_to_half2_bits<0>(odd));
  const float2 fe1 = half2_bits_to_float2(e4m3x2_to_half2_bits<1>(even)), fo1 = half2_bits_to_float2(e4m3x2_to_half2_bits<1>(odd));
  out[0] = fe0.x, out[1] = fo0.x, out[2] = fe0.y, out[3] = fo0.y;
  out[4] = fe1.x, out[5] = fo1.x, out[6] = fe1.y, out[7] = fo1.y;
}

// One piece as loaded from memory, not yet decoded: 16 payload bytes in every format, plus the
// piece's scale data (fp8b128: its block scale; nvfp4: its two E4M3 block-scale codes). Loading and
// decoding are separate so a kernel can issue the loads of a whole batch (or of the next batch)
// before it needs the values: the DRAM latency then overlaps other work.
struct RawPiece {
  uint4 bits;
  uint32_t aux;  // fp8b128: the block scale's float bits; nvfp4: two scale codes
};

template <StorageFormat F, int DK>
__device__ __forceinline__ RawPiece load_raw_piece(const HeadView& h, int row, int col) {
  constexpr int kBits = F == StorageFormat::fp32 ? 32 : F == StorageFormat::fp16 || F == StorageFormat::bf16 ? 16
                        : F == StorageFormat::fp8b128                                            ? 8
                                                                                                 : 4;
  const std::size_t i = static_cast<std::size_t>(row) * DK + col;
  RawPiece r;
  r.bits = *reinterpret_cast<const uint4*>(h.payload + i * kBits / 8);
  r.aux = 0;
  if constexpr (F == StorageFormat::fp8b128) r.aux = __float_as_uint(h.block_scales[i / formats::kFp8BlockSize]);
  if constexpr (F == StorageFormat::nvfp4) r.aux = *reinterpret_cast<const uint16_t*>(h.scale_codes + i / formats::kNvfp4BlockSize);
  return r;
}

// Partial dot products of one loaded piece with NV vectors given for the lane's columns
// (vec[v][e]), added to acc[v]. `tensor_scale` is the head's NVFP4 tensor scale (else unused).
template <StorageFormat F, int NV>
__device__ __forceinline__ void dot_raw_piece(const RawPiece& r, float tensor_scale,
                                              const float (*vec)[FormatTraits<F>::kElementsPerPiece], float* acc) {
  const uint32_t w[4] = {r.bits.x, r.bits.y, r.bits.z, r.bits.w};
  if constexpr (F == StorageFormat::nvfp4) {
    const uint32_t sc = r.aux;
#pragma unroll
    for (int blk = 0; blk < 2; ++blk) {
      const __half_raw sr = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(sc >> (8 * blk)), __NV_E4M3);
      float sb = __half2float(*reinterpret_cast<const __half*>(&sr));
      if ((sc >> (8 * blk) & 0xFFu) == formats::kE4m3NanCode) sb = __int_as_float(0x7FC00000);
      float part[NV];
#pragma unroll
      for (int v = 0; v < NV; ++v) part[v] = 0.0f;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        float f[8];  // 2^-6 x the element values: exact, and the partial sums are exactly 2^-6 x
        e2m1x8_to_float_scaled(w[2 * blk + j], f);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int e = 16 * blk + 8 * j + i;
#pragma unroll
          for (int v = 0; v < NV; ++v) part[v] = fmaf(f[i], vec[v][e], part[v]);
        }
      }
      // (sb * tensor_scale) * 64 undoes the 2^-6 exactly: the same products as unscaled decoding.
#pragma unroll
      for (int v = 0; v < NV; ++v) acc[v] = fmaf(part[v], (sb * tensor_scale) * 64.0f, acc[v]);
    }
  } else if constexpr (F == StorageFormat::fp8b128) {
    // The block scale is common to the piece: multiply the partial sum once.
    const float s = __uint_as_float(r.aux);
    float part[NV];
#pragma unroll
    for (int v = 0; v < NV; ++v) part[v] = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f[2] = {half2_bits_to_float2(e4m3x2_to_half2_bits<0>(w[j])), half2_bits_to_float2(e4m3x2_to_half2_bits<1>(w[j]))};
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int e = 4 * j + 2 * half;
#pragma unroll
        for (int v = 0; v < NV; ++v) part[v] = fmaf(f[half].y, vec[v][e + 1], fmaf(f[half].x, vec[v][e], part[v]));
      }
    }
#pragma unroll
    for (int v = 0; v < NV; ++v) acc[v] = fmaf(part[v], s, acc[v]);
  } else if constexpr (F == StorageFormat::fp32) {
#pragma unroll
    for (int e = 0; e < 4; ++e)
#pragma unroll
      for (int v = 0; v < NV; ++v) acc[v] = fmaf(__uint_as_float(w[e]), vec[v][e], acc[v]);
  } else {  // fp16 / bf16
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float2 f;
      if constexpr (F == StorageFormat::fp16)
        f = __half22float2(*reinterpret_cast<const __half2*>(&w[j]));
      else
        f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[j]));
#pragma unroll
      for (int v = 0; v < NV; ++v) acc[v] = fmaf(f.y, vec[v][2 * j + 1], fmaf(f.x, vec[v][2 * j], acc[v]));
    }
  }
}

// Sums N values per lane (N a power of two, N <= LPR) over the LPR lanes of a row with N - 1 +
// log2(LPR / N) shuffles instead of N log2(LPR): each exchange step sends half of the remaining
// values to the partner lane and keeps the other half (a reduce-scatter). Afterwards every lane
// holds the full row sum of value scatter_index<LPR, N>(lane). The steps are template recursion so
// that every index is a compile-time constant (a runtime-indexed register array becomes selects).
template <int N, int OFF>
__device__ __forceinline__ float scatter_steps(float* buf, int lane) {
  if constexpr (N > 1) {
    constexpr int H = N / 2;
    const bool upper = (lane & OFF) != 0;
#pragma unroll
    for (int i = 0; i < H; ++i) {
      const float send = upper ? buf[i] : buf[i + H];
      const float keep = upper ? buf[i + H] : buf[i];
      buf[i] = keep + __shfl_xor_sync(kFullMask, send, OFF);
    }
    return scatter_steps<H, OFF / 2>(buf, lane);
  } else if constexpr (OFF > 0) {
    buf[0] += __shfl_xor_sync(kFullMask, buf[0], OFF);
    return scatter_steps<1, OFF / 2>(buf, lane);
  } else {
    return buf[0];
  }
}
template <int LPR, int N>
__device__ __forceinline__ float row_sum_scatter(const float (&x)[N]) {
  static_assert(N >= 1 && N <= LPR && (N & (N - 1)) == 0 && (LPR & (LPR - 1)) == 0, "N, LPR powers of two, N <= LPR");
  float buf[N];
#pragma unroll
  for (int i = 0; i < N; ++i) buf[i] = x[i];
  return scatter_steps<N, LPR / 2>(buf, threadIdx.x % 32);
}
// Which of the N values row_sum_scatter left in this lane: the step with offset OFF and n values
// kept the upper half (n / 2 added to the index) in lanes with that bit set.
template <int N, int OFF>
__device__ __forceinline__ int scatter_index_steps(int lane) {
  if constexpr (N > 1) return ((lane & OFF) ? N / 2 : 0) + scatter_index_steps<N / 2, OFF / 2>(lane);
  else return 0;
}
template <int LPR, int N>
__device__ __forceinline__ int scatter_index(int lane) {
  return scatter_index_steps<N, LPR / 2>(lane);
}
// The lane (offset within its row's LPR lanes, low bits zero) that row_sum_scatter leaves value i in.
template <int N, int OFF>
__device__ __forceinline__ int scatter_lane_steps(int i) {
  if constexpr (N > 1) return ((i & (N / 2)) ? OFF : 0) + scatter_lane_steps<N / 2, OFF / 2>(i);
  else return 0;
}
template <int LPR, int N>
__device__ __forceinline__ int scatter_lane(int i) {
  return scatter_lane_steps<N, LPR / 2>(i);
}
// All N row sums in every lane of the row (reduce-scatter, then one broadcast per value).
template <int LPR, int N>
__device__ __forceinline__ void row_sums_all(float (&x)[N]) {
  const float mine = row_sum_scatter<LPR, N>(x);
  const int base = (threadIdx.x % 32) / LPR * LPR;
#pragma unroll
  for (int i = 0; i < N; ++i) x[i] = __shfl_sync(kFullMask, mine, base + scatter_lane<LPR, N>(i));
}

// Exclusive suffix products of a warp's decays: for a[0..n) (n <= 64, lane l holds a[l] and
// a[l + 32]) returns w[p] = prod_{l > p} a[l] in (lo, hi) for p = lane, lane + 32, and the full
// product gamma = prod a. Used for the decay weights of the window's records (eq. 5 / Algorithm 1).
struct SuffixProducts {
  float lo, hi, gamma;
};
__device__ __forceinline__ SuffixProducts warp_suffix_products(float a_lo, float a_hi) {
  const int lane = threadIdx.x % 32;
  float in_lo = a_lo, in_hi = a_hi;  // inclusive suffix products within each half
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {
    const float lo = __shfl_down_sync(kFullMask, in_lo, off), hi = __shfl_down_sync(kFullMask, in_hi, off);
    if (lane + off < 32) in_lo *= lo, in_hi *= hi;
  }
  const float total_hi = __shfl_sync(kFullMask, in_hi, 0);
  in_lo *= total_hi;
  SuffixProducts r;
  const float next_lo = __shfl_down_sync(kFullMask, in_lo, 1), next_hi = __shfl_down_sync(kFullMask, in_hi, 1);
  r.lo = lane < 31 ? next_lo : total_hi;
  r.hi = lane < 31 ? next_hi : 1.0f;
  r.gamma = __shfl_sync(kFullMask, in_lo, 0);
  return r;
}

}  // namespace replayssm::cuda::detail
