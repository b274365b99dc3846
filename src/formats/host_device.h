// Host/device portability for the number-format headers.
// The same source is compiled by g++ (CPU reference) and nvcc (kernels), which is
// how the toolkit keeps CPU and GPU quantizers bit-identical: one definition.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define REPLAYSSM_HD __host__ __device__ __forceinline__
#else
#define REPLAYSSM_HD inline
#endif

namespace replayssm::formats {

REPLAYSSM_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  __builtin_memcpy(&u, &f, sizeof u);
  return u;
#endif
}

REPLAYSSM_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// IEEE float32 constants written as bits so host and device agree exactly.
inline constexpr uint32_t kFloatMaxBits = 0x7F7FFFFFu;  // FLT_MAX
inline constexpr uint32_t kFloatInfBits = 0x7F800000u;
inline constexpr uint32_t kFloatQuietNanBits = 0x7FC00000u;

REPLAYSSM_HD bool is_finite_bits(uint32_t u) { return (u & 0x7FFFFFFFu) < kFloatInfBits; }

}  // namespace replayssm::formats
