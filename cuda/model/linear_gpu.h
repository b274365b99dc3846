// y = x W^T (+ b) on the GPU, the twin of model::Linear::apply (src/model/tensor_ops.h), on cuBLAS
// in the precision the context asks for (GemmPrecision, gpu_block.h):
//   fp32    cublasSgemm; the handle must be in CUBLAS_DEFAULT_MATH or CUBLAS_PEDANTIC_MATH (apply
//           refuses a TF32 or emulation mode): SIMT FP32 products, no TF32. GpuCausalLM sets
//           CUBLAS_DEFAULT_MATH.
//   bf16    cublasGemmEx, BF16 x and W, FP32 accumulate (CUBLAS_COMPUTE_32F): one tensor-core product.
//   bf16x3  FP32-accurate products on the tensor cores. x = x1 + x2 + x3 (bf16_split.h: three BF16
//           parts, exact for 2^-110 <= |x| < 0x1.ffp127) and likewise W = W1 + W2 + W3 (made once).
//           BF16 weights (BF16 checkpoints: W2 = W3 = 0): y = x3 W1^T + x2 W1^T + x1 W1^T, three
//           BF16 GEMMs, FP32 accumulate, smallest first (beta = 1). Every BF16 x BF16 product is
//           exact in FP32, so nothing is dropped: the error is that of FP32 accumulation, as for SGEMM
//           (worst case ~k 2^-24 a, a = sum_k |x_k| |W_k|), in the tensor cores' summation order, plus
//           the two beta = 1 additions (2^-24 |y| each). Other weights: six products, (x1 W3 + x2 W2 + x3 W1) +
//           (x1 W2 + x2 W1) + x1 W1; the dropped x2 W3 + x3 W2 + x3 W3 are <= (2 u^3 + u^4) a with
//           u = 2^-8 (BF16's unit roundoff), i.e. <= 2^-23 a, again FP32's level. The tests compare
//           the error with SGEMM's, both against a float64 product.
// Row-major views of any leading dimension: a row-major y = x W^T is the column-major product
// y^T = W x^T, which is what cuBLAS is asked for (W as the transposed operand, no copies).
//
// Timing (the GPU sweep's per-pass split, issue 10 benchmark): while a GemmTally is installed on the
// calling thread (ScopedGemmTally), every apply records its work on ctx.stream as one interval of
// the tally's category and adds its FLOP counts.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <memory>

#include "device_memory.h"
#include "model/gpu_block.h"
#include "model/gpu_timing.h"
#include "model/tensor_ops.h"

namespace replayssm::cuda {

struct GemmTally {
  GpuIntervals* intervals = nullptr;  // not null: each apply is timed under `category`
  int category = 0;
  double flops = 0;         // 2 rows in out per apply: the product's FLOPs, whatever the precision
  double tensor_flops = 0;  // BF16 tensor-core FLOPs executed (bf16: 1x, bf16x3: 3x or 6x the product's)
  int64_t calls = 0;
};

// Installs `tally` for GpuLinear::apply calls on this thread for its lifetime (restoring the one
// before). The tally must outlive it.
class ScopedGemmTally {
 public:
  explicit ScopedGemmTally(GemmTally* tally);
  ~ScopedGemmTally();
  ScopedGemmTally(const ScopedGemmTally&) = delete;
  ScopedGemmTally& operator=(const ScopedGemmTally&) = delete;

 private:
  GemmTally* previous_;
};

class GpuLinear {
 public:
  GpuLinear() = default;
  // Uploads the float32 weight (out x in) and bias. The BF16 parts of the weight are made now (on
  // the device) when `precision` is bf16 or bf16x3, else on first use of such a precision.
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
  // `precision`: the BF16 parts of x (1 for bf16, 3 for bf16x3), split in blocks of at most
  // kSplitRows rows. 0 for fp32.
  int64_t scratch_bytes(int64_t rows, GemmPrecision precision) const;
  // Whether every weight is a BF16 value (bf16x3 then needs 3 products, else 6); makes the parts.
  bool weight_is_bf16() const;
  // The float32 weight on the device (out x in): the embedding table of a tied LM head.
  ConstDeviceMatrix weight() const { return {weight_.data(), out_, in_, in_}; }

  static constexpr int64_t kSplitRows = 4096;

 private:
  void make_bf16_parts() const;
  int in_ = 0, out_ = 0;
  DeviceBuffer<float> weight_, bias_;
  struct Bf16Parts {
    DeviceBuffer<__nv_bfloat16> w1, w2, w3;  // w2, w3 empty when the weight is exact in BF16
  };
  mutable std::shared_ptr<Bf16Parts> bf16_;
};

}  // namespace replayssm::cuda
