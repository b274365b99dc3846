// The kernel behind compare_positions_gpu (kl_positions.h), declared without Eigen so that nvcc
// compiles only the header-only terms of src/eval/kl_terms.h.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "eval/kl_terms.h"

namespace replayssm::cuda::detail {

// One block per row: both passes of eval::kl over row i of ref and cfg (row-major, leading
// dimensions ld_ref and ld_cfg) into out[i] (device memory), on `stream`. Unchecked: the caller
// validates shapes; targets are copied into out[i].target and their values read only when
// 0 <= target < vocab.
void launch_kl_row_sums(const float* ref, int64_t ld_ref, const float* cfg, int64_t ld_cfg, int32_t rows,
                        int32_t vocab, const int32_t* targets, eval::kl::RowSums* out, cudaStream_t stream);

}  // namespace replayssm::cuda::detail
