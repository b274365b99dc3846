// Internal: the C++17 interface between the scan launcher (sequence_scan.cpp, host C++20, which
// validates and translates the PrecisionPolicy) and the kernels (sequence_scan.cu).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "formats/quantized_matrix.h"
#include "ssm/ssm_types.h"

namespace replayssm::cuda::detail {

enum class ScanScheme : uint8_t { conventional, shared, split };

struct ScanKernelArgs {
  ssm::Recurrence kind = ssm::Recurrence::mamba2;
  ScanScheme scheme = ScanScheme::conventional;
  formats::StorageFormat recur_format = formats::StorageFormat::fp32, read_format = formats::StorageFormat::fp32;
  formats::RoundingMode recur_mode = formats::RoundingMode::nearest_even, read_mode = formats::RoundingMode::nearest_even;
  uint64_t seed = 0;
  uint32_t layer = 0;
  int n_tokens = 0, dk = 0, dv = 0, n_value_heads = 0, heads_per_group = 1, window = 1;
  const float* q = nullptr;
  const float* k = nullptr;
  const float* alpha = nullptr;
  const float* beta = nullptr;
  const float* v = nullptr;
  float* out = nullptr;
  int64_t ld_q = 0, ld_k = 0, ld_alpha = 0, ld_beta = 0, ld_v = 0, ld_out = 0;
  float* checkpoint_recur = nullptr;  // ScanCheckpoints layout, or null
  float* checkpoint_read = nullptr;
  int64_t checkpoint_events = 0;
};

// One launch for all value heads (validated arguments, 1 <= dk, dv <= 256, n_tokens >= 1).
void launch_sequence_scan(const ScanKernelArgs& args, cudaStream_t stream);

}  // namespace replayssm::cuda::detail
