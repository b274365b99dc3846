// split_bf16x3_gpu (bf16_split.h): one thread per element, grid-stride.
#include "model/bf16_split.h"

#include <algorithm>

#include "cuda_check.h"

namespace replayssm::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void split3_kernel(const float* x, int64_t ld, int64_t rows, int64_t cols, __nv_bfloat16* p1,
                              __nv_bfloat16* p2, __nv_bfloat16* p3, int* not_bf16) {
  const int64_t n = rows * cols;
  bool inexact = false;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / cols, c = i % cols;
    const float v = x[t * ld + c];
    const __nv_bfloat16 a = __float2bfloat16_rn(v);
    const float r1 = v - __bfloat162float(a);  // exact (bf16_split.h)
    const __nv_bfloat16 b = __float2bfloat16_rn(r1);
    const float r2 = r1 - __bfloat162float(b);  // exact
    p1[i] = a;
    p2[i] = b;
    p3[i] = __float2bfloat16_rn(r2);
    inexact = inexact || r1 != 0.0f;
  }
  if (not_bf16 && inexact) *not_bf16 = 1;  // a benign race: every writer writes 1
}

}  // namespace

void split_bf16x3_gpu(ConstDeviceMatrix x, __nv_bfloat16* p1, __nv_bfloat16* p2, __nv_bfloat16* p3, int* not_bf16,
                      cudaStream_t stream) {
  const int64_t n = x.rows * x.cols;
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 65535 * 8);
  split3_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(x.data, x.ld, x.rows, x.cols, p1, p2, p3,
                                                                      not_bf16);
  REPLAYSSM_CUDA_CHECK_LAUNCH();
}

}  // namespace replayssm::cuda
