// Small helpers every GPU block (gpu_blocks.cpp, gpu_kimi_blocks.cpp) uses for its scratch and
// its input checks.
#pragma once
#include <cstdint>
#include <memory>
#include <stdexcept>

#include <fmt/format.h>

#include "device_memory.h"
#include "model/gpu_blocks.h"

namespace replayssm::cuda::block_scratch {

// The model's shared arena, or a block's own when it is built alone (tests).
inline ScratchArena own_if_null(ScratchArena a) { return a ? a : std::make_shared<DeviceBuffer<float>>(); }

inline void check_io(const char* block, ConstDeviceMatrix x, DeviceMatrix out, int hidden) {
  if (x.cols != hidden || out.cols != hidden || out.rows != x.rows)
    throw std::invalid_argument(fmt::format("{}::forward: x is {} x {}, out {} x {}; expected N x {} both", block,
                                            x.rows, x.cols, out.rows, out.cols, hidden));
}

// Carves consecutive dense matrices out of the arena.
struct Carver {
  float* next;
  DeviceMatrix take(int64_t rows, int64_t cols) {
    DeviceMatrix m{next, rows, cols, cols};
    next += rows * cols;
    return m;
  }
};

}  // namespace replayssm::cuda::block_scratch
