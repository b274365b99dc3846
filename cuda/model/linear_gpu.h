// y = x W^T (+ b) on the GPU, the twin of model::Linear::apply (src/model/tensor_ops.h), on cuBLAS
// in the precision the context asks for (GemmPrecision, gpu_block.h).
#pragma once
#include <cstdint>
#include <memory>

#include "device_memory.h"
#include "model/gpu_block.h"
#include "model/tensor_ops.h"

namespace replayssm::cuda {

class GpuLinear {
 public:
  GpuLinear() = default;
  // Uploads the float32 weight (out x in) and bias; the BF16 parts the bf16/bf16x3 paths need are
  // made on first use of that precision.
  explicit GpuLinear(const model::Linear& cpu);
  int in_features() const { return in_; }
  int out_features() const { return out_; }
  // x: rows x in (any ld), y: rows x out (any ld). Throws std::invalid_argument on shape mismatch.
  void apply(ConstDeviceMatrix x, DeviceMatrix y, const GpuContext& ctx) const;
  int64_t weight_bytes() const;

 private:
  int in_ = 0, out_ = 0;
  DeviceBuffer<float> weight_, bias_;
  struct Bf16Parts;  // lazily made BF16 copies (hi, lo) of the weight and scratch for x's parts
  mutable std::shared_ptr<Bf16Parts> bf16_;
};

}  // namespace replayssm::cuda
