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
  // Error feedback (+ef) of a copy: its modes are round-to-nearest and its residual lives here
  // (device, [value head][dv][dk], zeroed before the launch); null: that copy does not use ef.
  float* residual_recur = nullptr;
  float* residual_read = nullptr;
  // Appendix F skipping (,skip=): a non-flush step skips its read when gamma_h < threshold_read
  // (the copy it reads: split the read copy, shared the recur copy), a flush when gamma_L <
  // threshold_flush (the recur copy). skip_counts: null, or [value head][4] int64 (SkipCounts order).
  bool skip = false;
  float skip_threshold_read = 0.0f, skip_threshold_flush = 0.0f;
  int64_t* skip_counts = nullptr;
};

// One launch for all value heads (validated arguments, 1 <= dk, dv <= 256, n_tokens >= 1).
void launch_sequence_scan(const ScanKernelArgs& args, cudaStream_t stream);

}  // namespace replayssm::cuda::detail
