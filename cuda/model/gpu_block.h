// The GPU twins of the CPU model's blocks (src/model/layers.h): each is built from its loaded CPU
// block (weights uploaded once, float32) and maps normalised hidden states x (N x hidden, on the
// device) to the block's output (N x hidden), which the caller adds to the residual stream, as
// model::Block::forward does on the CPU.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>

#include "device_memory.h"
#include "ssm/precision_policy.h"
#include "ssm/sequence_emulator.h"

namespace replayssm::cuda {

// How the non-recurrent matrix products are computed (issue 10 "compute precision"):
//   fp32    cuBLAS SGEMM: the reference semantics (default);
//   bf16x3  the FP32 activations split into hi + lo BF16 parts (weights are exact in BF16 for
//           BF16 checkpoints, else split too): three BF16 tensor-core products, FP32 accumulate;
//   bf16    activations and weights rounded to BF16, one tensor-core product, FP32 accumulate:
//           the regime serving engines run in (`--compute bf16`).
enum class GemmPrecision : uint8_t { fp32, bf16x3, bf16 };

// Shown every SSM layer's recurrence inputs (device pointers, ssm::LayerSequence layout) by the GPU
// SSM blocks just before the scan is launched on `stream`, for diagnostics: the twin of the CPU
// mixers' model::SequenceObserver. The inputs are complete once `stream` has reached this point.
using GpuSequenceObserver = std::function<void(const ssm::LayerSequence& device_seq, const ssm::PrecisionPolicy& policy,
                                               uint32_t layer, cudaStream_t stream)>;

struct GpuContext {
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;  // bound to `stream`
  GemmPrecision gemm = GemmPrecision::fp32;
  int layer_index = 0;                           // block index in the model (SR stream id)
  const ssm::PrecisionPolicy* policy = nullptr;  // SSM layers: how the state is stored/decoded
  const GpuSequenceObserver* observe = nullptr;  // optional
};

class GpuBlock {
 public:
  virtual ~GpuBlock() = default;
  // x: N x hidden (normalised input); out: N x hidden (dense views, ld = hidden). Scratch is the
  // block's own (grown on first use to N positions and kept).
  virtual void forward(ConstDeviceMatrix x, DeviceMatrix out, const GpuContext& ctx) const = 0;
  // Device bytes of scratch the forward over `positions` positions allocates (the memory plan).
  virtual int64_t scratch_bytes(int64_t positions) const = 0;
  // Device bytes of its uploaded weights.
  virtual int64_t weight_bytes() const = 0;
};

}  // namespace replayssm::cuda
