// Three BF16 parts of float32 values, for GpuLinear's bf16x3 products (linear_gpu.h; issue 10: "splitting
// only the FP32 activations into two or three BF16 parts gives FP32-accurate products on the tensor cores").
//   p1 = bf16(x), p2 = bf16(x - p1), p3 = bf16(x - p1 - p2), each round-to-nearest-even; the
//   differences are exact in float32 (x - p1 drops p1's leading bits).
// x = p1 + p2 + p3 exactly for 2^-110 <= |x| < 0x1.ffp127 (BF16's largest value plus half an ulp): p1
// holds x's leading 8 significant bits, |x - p1| <= 2^-8 2^e (x in [2^e, 2^(e+1))) is a multiple of
// x's ulp 2^(e-23), so it has at most 16 significant bits, p2 takes 8 of them, and the rest
// (|.| <= 2^(e-16), a multiple of 2^(e-23): at most 8 bits) is exactly p3. Below 2^-110 the parts'
// bits fall under BF16's subnormal grid (2^-133): |x - p1 - p2 - p3| <= 2^-134. Zero gives three zeros;
// larger |x| (and Inf, NaN) make p1 infinite or NaN, as bf16(x) alone would.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "device_memory.h"
#if !defined(__CUDACC__)
#include "model/tensor_ops.h"
#endif

namespace replayssm::cuda {

// x (rows x cols, any ld) into p1, p2, p3 (each rows x cols, dense, ld = cols). When `not_bf16` is
// not null (a device int), it is set to 1 if some x is not a BF16 value (p2 != 0), left alone otherwise.
void split_bf16x3_gpu(ConstDeviceMatrix x, __nv_bfloat16* p1, __nv_bfloat16* p2, __nv_bfloat16* p3, int* not_bf16,
                      cudaStream_t stream);

#if !defined(__CUDACC__)
// The CPU twin: host matrix, host parts and flag, the same conversions.
void split_bf16x3(Eigen::Ref<const model::Mat, 0, Eigen::OuterStride<>> x, __nv_bfloat16* p1, __nv_bfloat16* p2,
                  __nv_bfloat16* p3, int* not_bf16);
#endif

}  // namespace replayssm::cuda
