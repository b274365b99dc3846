// split_bf16x3 (bf16_split.h): the CPU twin of split_bf16x3_gpu, the same conversions in the same order.
#include "model/bf16_split.h"

namespace replayssm::cuda {

void split_bf16x3(Eigen::Ref<const model::Mat, 0, Eigen::OuterStride<>> x, __nv_bfloat16* p1, __nv_bfloat16* p2,
                  __nv_bfloat16* p3, int* not_bf16) {
  for (Eigen::Index t = 0; t < x.rows(); ++t)
    for (Eigen::Index c = 0; c < x.cols(); ++c) {
      const std::size_t i = static_cast<std::size_t>(t * x.cols() + c);
      const float v = x(t, c);
      const __nv_bfloat16 a = __float2bfloat16_rn(v);
      const float r1 = v - __bfloat162float(a);
      const __nv_bfloat16 b = __float2bfloat16_rn(r1);
      const float r2 = r1 - __bfloat162float(b);
      p1[i] = a;
      p2[i] = b;
      p3[i] = __float2bfloat16_rn(r2);
      if (not_bf16 && r1 != 0.0f) *not_bf16 = 1;
    }
}

}  // namespace replayssm::cuda
