// The bit layout of a stochastic-rounding stream id (documented in ssm/state_quantizer.h), host
// and device, C++17: the CPU emulator (ssm::sr_stream, which range-checks the fields first) and the
// CUDA scan kernels (cuda/ssm/sequence_scan.cu) build the id with this one function.
#pragma once
#include <cstdint>

#include "formats/host_device.h"

namespace replayssm::ssm {

inline constexpr int kStreamLayerBits = 16, kStreamKeyHeadBits = 12, kStreamValueHeadBits = 8,
                     kStreamEventBits = 27;
inline constexpr uint64_t kMaxStreamEvents = uint64_t{1} << kStreamEventBits;

// Fields must already be in range (layer < 2^16, key_head < 2^12, value_head < 2^8, copy < 2,
// event < 2^27); nothing is checked here.
REPLAYSSM_HD uint64_t pack_sr_stream(uint32_t layer, uint32_t key_head, uint32_t value_head, uint32_t copy,
                                     uint64_t event) {
  return (uint64_t{layer} << 48) | (uint64_t{key_head} << 36) | (uint64_t{value_head} << 28) |
         (uint64_t{copy} << 27) | event;
}

}  // namespace replayssm::ssm
