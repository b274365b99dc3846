// y = x W^T (+ b) on the GPU, the twin of model::Linear::apply (src/model/tensor_ops.h), on cuBLAS
// in the precision the context asks for (GemmPrecision, gpu_block.h):
//   fp32    cublasSgemm; the handle must be in CUBLAS_DEFAULT_MATH or CUBLAS_PEDANTIC_MATH (apply
//           refuses a TF32 or emulation mode): SIMT FP32 products, no TF32. GpuCausalLM sets
//           CUBLAS_DEFAULT_MATH.
//   bf16    cublasGemmEx, BF16 x and W, FP32 accumulate (CUBLAS_COMPUTE_32F): one tensor-core product.
//   bf16x3  x = x_hi + x_lo + r_x and W = W_hi + W_lo + r_W (model_ops.h split_bf16: |r| <= 2^-16 |.|),
//           y = x_hi W_hi^T + x_hi W_lo^T + x_lo W_hi^T, three BF16 GEMMs accumulated in FP32 (beta = 1);
//           the W_lo product is skipped when W is exact in BF16 (BF16 checkpoints: W_lo = 0, r_W = 0).
//           Error bound per output, a = sum_k |x_k| |W_k|, u = 2^-8 (BF16's unit roundoff): the
//           dropped terms x_lo W_lo, x_hi r_W, x_lo r_W, r_x W give |y - xW^T| <= 3 u^2 (1 + u)^2 a, plus
//           the FP32 accumulation (~k 2^-24 a); with W exact in BF16 only r_x W is dropped: u^2 a. So
//           about 16 significant bits, not FP32's 24 (a three-part split of x would be needed for
//           that): the tests print the measured error against SGEMM.
// Row-major views of any leading dimension: a row-major y = x W^T is the column-major product
// y^T = W x^T, which is what cuBLAS is asked for (W as the transposed operand, no copies).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <memory>

#include "device_memory.h"
#include "model/gpu_block.h"
#include "model/tensor_ops.h"

namespace replayssm::cuda {

class GpuLinear {
 public:
  GpuLinear() = default;
  // Uploads the float32 weight (out x in) and bias. The BF16 parts of the weight are made now when
  // `precision` is bf16 or bf16x3, else on first use of that precision.
  explicit GpuLinear(const model::Linear& cpu, GemmPrecision precision = GemmPrecision::fp32);
  GpuLinear(const model::Mat& weight, const model::Vec& bias, GemmPrecision precision = GemmPrecision::fp32);
  int in_features() const { return in_; }
  int out_features() const { return out_; }
  // x: rows x in (any ld), y: rows x out (any ld), not overlapping x. Throws std::invalid_argument on
  // shape mismatch, std::logic_error for a handle in a TF32 or emulation math mode (fp32).
  void apply(ConstDeviceMatrix x, DeviceMatrix y, const GpuContext& ctx) const;
  // Bytes of the uploaded weight and bias, plus the BF16 parts made so far.
  int64_t weight_bytes() const;
  // Device bytes apply() allocates (stream-ordered, freed when it returns) for `rows` rows under
  // `precision`: the BF16 parts of x, split in blocks of at most kSplitRows rows. 0 for fp32.
  int64_t scratch_bytes(int64_t rows, GemmPrecision precision) const;
  // The float32 weight on the device (out x in): the embedding table of a tied LM head.
  ConstDeviceMatrix weight() const { return {weight_.data(), out_, in_, in_}; }

  static constexpr int64_t kSplitRows = 4096;

 private:
  void make_bf16_parts() const;
  int in_ = 0, out_ = 0;
  DeviceBuffer<float> weight_, bias_;
  struct Bf16Parts {
    DeviceBuffer<__nv_bfloat16> hi, lo;  // lo empty when the weight is exact in BF16
  };
  mutable std::shared_ptr<Bf16Parts> bf16_;
};

}  // namespace replayssm::cuda
