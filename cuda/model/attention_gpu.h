// Causal attention on the GPU, the twin of the CPU's (src/model/attention.cpp, layers.h):
//   causal_attention_gpu  tiled, online softmax, O(N d) memory, GQA: the twin of model::causal_attention
//   GpuAttention          the whole block (Nemotron-H and Qwen3.5 attention: projections, Qwen3.5's
//                         output gate, (1+w) q/k RMSNorm per head and partial RoPE), the twin of
//                         model::Attention::forward.
#pragma once
#include <memory>

#include "device_memory.h"
#include "model/gpu_block.h"
#include "model/layers.h"
#include "model/linear_gpu.h"

namespace replayssm::cuda {

// q: N x (H dqk), k: N x (Hkv dqk), v: N x (Hkv dv), out: N x (H dv), all device views. Query head
// h reads key/value head h / (H / Hkv); `scale` applied where `scale_at` says (model::ScaleAt).
void causal_attention_gpu(ConstDeviceMatrix q, ConstDeviceMatrix k, ConstDeviceMatrix v,
                          const model::AttentionHeads& heads, float scale, model::ScaleAt scale_at, DeviceMatrix out,
                          cudaStream_t stream);

class GpuAttention final : public GpuBlock {
 public:
  explicit GpuAttention(const model::Attention& cpu);
  void forward(ConstDeviceMatrix x, DeviceMatrix out, const GpuContext& ctx) const override;
  int64_t scratch_bytes(int64_t positions) const override;
  int64_t weight_bytes() const override;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace replayssm::cuda
