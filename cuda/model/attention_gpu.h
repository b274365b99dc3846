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

// q: N x (H dqk), k: N x (Hkv dqk), v: N x (Hkv dv), out: N x (H dv), all device views (any ld
// >= cols; out must not overlap the inputs). Query head h reads key/value head h / (H / Hkv);
// `scale` applied where `scale_at` says (model::ScaleAt). 1 <= dqk, dv <= 256, any GQA ratio,
// N < 2^31. FP32 throughout (no TF32), tiled with an online softmax: O(N d) memory, never N x N.
// Deterministic: every output element is computed by one thread in a fixed order.
void causal_attention_gpu(ConstDeviceMatrix q, ConstDeviceMatrix k, ConstDeviceMatrix v,
                          const model::AttentionHeads& heads, float scale, model::ScaleAt scale_at, DeviceMatrix out,
                          cudaStream_t stream);

// Scratch (grown to the longest N seen, kept): q_proj's output, over which the attention output
// and then the gated output are written (no separate attention buffer), k, v, and the RoPE
// cos/sin table (computed on the host exactly as the CPU computes it). GpuLinear's own BF16
// scratch, if any, is not counted here. Copies share weights and scratch (one stream at a time).
class GpuAttention final : public GpuBlock {
 public:
  explicit GpuAttention(const model::Attention& cpu);
  void forward(ConstDeviceMatrix x, DeviceMatrix out, const GpuContext& ctx) const override;
  int64_t scratch_bytes(int64_t positions) const override;
  int64_t weight_bytes() const override;

  // The steps of forward between the projections, on projected inputs (N rows each, any ld):
  // qg = q_proj x (per head [query | gate] with Qwen3.5's output gate), k = k_proj x,
  // v = v_proj x. Applies the q/k RMSNorm and RoPE in place, attends, and gates; on return the
  // attention output (N x num_heads * head_dim) is qg.columns(0, num_heads * head_dim), which
  // forward passes to o_proj. (The GPU tests drive it with the CPU's projections.)
  void attend_projected(DeviceMatrix qg, DeviceMatrix k, ConstDeviceMatrix v, cudaStream_t stream) const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace replayssm::cuda
