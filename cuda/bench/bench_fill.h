// Device-side helpers of the benchmarks: random fills (never zeros: zeros can run faster than real data) and
// the hold kernel that keeps the GPU busy while the host queues the timed work.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace replayssm::cuda {
// Uniform in [lo, hi) from Philox words keyed by (seed, index).
void fill_uniform(float* p, std::size_t n, float lo, float hi, uint64_t seed, cudaStream_t stream = nullptr);
void fill_uniform_bf16(__nv_bfloat16* p, std::size_t n, float lo, float hi, uint64_t seed, cudaStream_t stream = nullptr);

// One thread that spins until *release != 0 (host-mapped memory the host writes) or `timeout_ns` of the GPU's
// global timer have passed, then sets *timed_out to 1 if it was the timeout. Queued before a timed region, it
// keeps the stream busy while the host launches the timed work, so the region's events measure the GPU's work
// and not the host's launch calls (nvbench's blocking kernel does the same).
void launch_hold(const volatile int* release, int* timed_out, uint64_t timeout_ns, cudaStream_t stream = nullptr);
}  // namespace replayssm::cuda
