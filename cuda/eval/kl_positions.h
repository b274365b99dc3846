// Per-position comparison of two next-token distributions on the GPU, the twin of
// eval::compare_positions (src/eval/kl_metrics.h): KL(p_ref || p_cfg), top-1 agreement, delta-p
// at the target and the non-finite bookkeeping, in double, from raw logits or log-prob rows (each
// row is renormalised in double first, so both give the same distribution). Only the per-position
// results come back to the host (issue 10 "KL on the GPU").
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <span>

#include "device_memory.h"
#include "eval/kl_metrics.h"

namespace replayssm::cuda {

// ref, cfg: rows x vocab device views (same shape); targets: `rows` device ints (-1: no target);
// out: `rows` host results. Synchronises `stream`. Throws std::invalid_argument on shape mismatch.
void compare_positions_gpu(ConstDeviceMatrix ref, ConstDeviceMatrix cfg, const int32_t* targets,
                           std::span<eval::PositionResult> out, cudaStream_t stream);

}  // namespace replayssm::cuda
