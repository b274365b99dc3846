// Per-position comparison of two next-token distributions on the GPU, the twin of
// eval::compare_positions (src/eval/kl_metrics.h): KL(p_ref || p_cfg), top-1 agreement, delta-p
// and the log-probabilities log p_ref, log p_cfg of the target (the perplexity ratio's terms), and
// the non-finite bookkeeping, in double, from raw logits or log-prob rows (each row is renormalised
// in double first, so both give the same distribution). Only the per-position results come back to
// the host (issue 10 "KL on the GPU"): the row sums and the target's two values, from which
// eval::finish_position evaluates every field with the CPU's own formulas.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <span>

#include "device_memory.h"
#include "eval/kl_metrics.h"

namespace replayssm::cuda {

// ref, cfg: rows x vocab device views (same shape, leading dimensions may differ); targets: `rows`
// device ints (< 0: no target); out: `rows` host results. Synchronises `stream`. One 256-thread
// block per row reads both rows twice (maxima, then the double sums of src/eval/kl_terms.h); the
// final formulas run on the host (eval::finish_position), so results equal the CPU twin's up to the
// order of the double sums (~1e-15 relative) and repeat bit for bit from run to run.
// Throws std::invalid_argument on a shape mismatch (naming both shapes), out.size() != rows, a
// vocabulary outside [1, 2^31), ld < vocab, null pointers, or a target >= vocab (out untouched).
void compare_positions_gpu(ConstDeviceMatrix ref, ConstDeviceMatrix cfg, const int32_t* targets,
                           std::span<eval::PositionResult> out, cudaStream_t stream);

}  // namespace replayssm::cuda
