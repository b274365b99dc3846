#include "bench/bench_fill.h"

#include "cuda_check.h"
#include "formats/philox.h"

namespace replayssm::cuda {
namespace {
__device__ float uniform_at(uint64_t seed, uint64_t i, float lo, float hi) {
  const uint32_t r = formats::sr_random_word(seed, 0x5EEDull, i);
  return lo + (hi - lo) * (static_cast<float>(r >> 8) * (1.0f / 16777216.0f));
}
__global__ void fill_kernel(float* p, std::size_t n, float lo, float hi, uint64_t seed) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    p[i] = uniform_at(seed, i, lo, hi);
}
__global__ void fill_bf16_kernel(__nv_bfloat16* p, std::size_t n, float lo, float hi, uint64_t seed) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16(uniform_at(seed, i, lo, hi));
}
__global__ void hold_kernel(const volatile int* release, int* timed_out, uint64_t timeout_ns) {
  uint64_t start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  while (*release == 0) {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start > timeout_ns) {
      *timed_out = 1;
      return;
    }
    __nanosleep(256);
  }
}
}  // namespace

void launch_hold(const volatile int* release, int* timed_out, uint64_t timeout_ns, cudaStream_t stream) {
  hold_kernel<<<1, 1, 0, stream>>>(release, timed_out, timeout_ns);
  REPLAYSSM_CUDA_CHECK_LAUNCH();
}

void fill_uniform(float* p, std::size_t n, float lo, float hi, uint64_t seed, cudaStream_t stream) {
  fill_kernel<<<2048, 256, 0, stream>>>(p, n, lo, hi, seed);
  REPLAYSSM_CUDA_CHECK_LAUNCH();
}
void fill_uniform_bf16(__nv_bfloat16* p, std::size_t n, float lo, float hi, uint64_t seed, cudaStream_t stream) {
  fill_bf16_kernel<<<2048, 256, 0, stream>>>(p, n, lo, hi, seed);
  REPLAYSSM_CUDA_CHECK_LAUNCH();
}
}  // namespace replayssm::cuda
