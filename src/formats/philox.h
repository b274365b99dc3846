// Philox4x32-10 counter-based generator (Salmon et al., "Parallel random numbers:
// as easy as 1, 2, 3", SC'11 — the Random123 definition), host and device.
//
// Stochastic rounding draws its random word from (seed, stream, element index)
// alone, so a CPU loop, a CUDA kernel of any launch shape and any thread count
// produce the same bits for the same element (FORMATS.md, "Stochastic rounding").
#pragma once
#include "formats/host_device.h"

namespace replayssm::formats {

struct Philox4x32Block {
  uint32_t word[4];
};

REPLAYSSM_HD void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
#if defined(__CUDA_ARCH__)
  lo = a * b;
  hi = __umulhi(a, b);
#else
  const uint64_t product = static_cast<uint64_t>(a) * b;
  lo = static_cast<uint32_t>(product);
  hi = static_cast<uint32_t>(product >> 32);
#endif
}

// Ten rounds, the key bumped between consecutive rounds (Random123 philox4x32_R(10, ...)).
REPLAYSSM_HD Philox4x32Block philox4x32_10(Philox4x32Block counter, uint32_t key0, uint32_t key1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  uint32_t* c = counter.word;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key0 += kWeyl0;
      key1 += kWeyl1;
    }
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(kMul0, c[0], hi0, lo0);
    philox_mulhilo(kMul1, c[2], hi1, lo1);
    const uint32_t n0 = hi1 ^ c[1] ^ key0, n2 = hi0 ^ c[3] ^ key1;
    c[0] = n0;
    c[1] = lo1;
    c[2] = n2;
    c[3] = lo0;
  }
  return counter;
}

// The stochastic-rounding random word of one element: counter = (index, stream) as
// four 32-bit words (low word first), key = seed; word 0 of the output block.
REPLAYSSM_HD uint32_t sr_random_word(uint64_t seed, uint64_t stream, uint64_t index) {
  Philox4x32Block counter{{static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
                           static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)}};
  return philox4x32_10(counter, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)).word[0];
}

}  // namespace replayssm::formats
