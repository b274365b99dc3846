// Device-side random fills for benchmarks (never zeros: zeros can run faster than real data).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace replayssm::cuda {
// Uniform in [lo, hi) from Philox words keyed by (seed, index).
void fill_uniform(float* p, std::size_t n, float lo, float hi, uint64_t seed, cudaStream_t stream = nullptr);
void fill_uniform_bf16(__nv_bfloat16* p, std::size_t n, float lo, float hi, uint64_t seed, cudaStream_t stream = nullptr);
}  // namespace replayssm::cuda
