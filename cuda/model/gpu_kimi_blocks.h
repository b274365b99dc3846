// GPU twins of Kimi Linear's token mixers and of the mixture-of-experts layer (src/model/layers.h,
// model/moe.h), as GpuBlocks: built from the loaded CPU block (weights uploaded once, float32),
// forward over all positions on the device in the CPU's order of operations (kimi_ops.h and
// model_ops.h name each op's CPU twin).
//   GpuKdaMixer          model::KdaMixer: one GEMM for q, k, v, f_a, g_a and b (weights stacked);
//                        conv + SiLU on [q | k | v]; q, k L2-normalised (q scaled by dk^-1/2);
//                        f_b, g_b; channel-wise alpha, beta; the KDA scan (emulate_layer_sequence_gpu,
//                        each head its own key head: SR streams of HeadGroupId{layer, head}, as the
//                        CPU's per-head emulate_sequence calls); per-head gated RMSNorm; o_proj
//   GpuMlaAttention      model::MlaAttention: one GEMM for q (or q_a) and kv_a; the latents' RMSNorms;
//                        q_b, kv_b; per-head keys [k_nope | k_rope] and values; causal_attention_gpu
//                        (ScaleAt::scores, qk_head_dim^-1/2, no positional encoding); o_proj
//   GpuMixtureOfExperts  model::MixtureOfExperts: the shared expert (GpuMlp) first, into `out`; router
//                        logits by GEMM; the routing on the host by model::route (the CPU's own
//                        function, from the downloaded FP32 logits); the latent projection; the
//                        routed rows gathered expert by expert; each expert's MLP by GEMMs on its
//                        rows; the weighted sum per row in ascending expert order; fc2_latent; the
//                        (gated) shared expert's term added.
// Routing: the GPU's router logits differ from the CPU's by the GEMMs' FP32 summation order (~1e-7
// relative), so an expert choice can differ only where two choice scores tie to that precision;
// everything after the logits is the CPU's selection code. One host synchronisation per forward.
//
// Scratch: the blocks share the model's ScratchArena (gpu_blocks.h); a block made without one owns
// its own. GpuMixtureOfExperts also holds its routing indices (3 x rows x top_k 32-bit values on
// the device and on the host).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "device_memory.h"
#include "model/gpu_block.h"
#include "model/gpu_blocks.h"
#include "model/layers.h"
#include "model/linear_gpu.h"
#include "model/moe.h"

namespace replayssm::cuda {

class GpuKdaMixer final : public GpuBlock {
 public:
  explicit GpuKdaMixer(const model::KdaMixer& cpu, GemmPrecision precision = GemmPrecision::fp32,
                       ScratchArena arena = nullptr);
  void forward(ConstDeviceMatrix x, DeviceMatrix out, const GpuContext& ctx) const override;
  int64_t scratch_bytes(int64_t positions) const override;
  int64_t weight_bytes() const override;
  // Floats of the shared arena a forward over `positions` positions uses.
  int64_t arena_floats(int64_t positions) const;

 private:
  model::KdaShape s_;
  GemmPrecision precision_;
  GpuLinear in_proj_;  // [q | k | v | f_a | g_a | b]
  GpuLinear f_b_, g_b_, o_proj_;
  DeviceBuffer<float> conv_w_, no_bias_, dt_bias_, a_log_, norm_w_;
  ScratchArena arena_;
};

class GpuMlaAttention final : public GpuBlock {
 public:
  explicit GpuMlaAttention(const model::MlaAttention& cpu, GemmPrecision precision = GemmPrecision::fp32,
                           ScratchArena arena = nullptr);
  void forward(ConstDeviceMatrix x, DeviceMatrix out, const GpuContext& ctx) const override;
  int64_t scratch_bytes(int64_t positions) const override;
  int64_t weight_bytes() const override;
  int64_t arena_floats(int64_t positions) const;

 private:
  int first_width() const;  // columns of in_proj_'s output: q (or q_a) then the latent [c | k_rope]
  model::MlaShape s_;
  GemmPrecision precision_;
  GpuLinear in_proj_;  // [q | kv_a] or [q_a | kv_a]
  GpuLinear q_b_, kv_b_, o_proj_;
  DeviceBuffer<float> q_a_norm_, kv_a_norm_;
  ScratchArena arena_;
};

// Device memory of the experts: every expert of the layer uploaded as float32 (quantized
// checkpoints dequantized by StoredMatrix::fetch, as the CPU reads them):
//   4 B x n_experts x (3 for SwiGLU, 2 for relu^2) x expert_intermediate x (latent_size or hidden)
// (expert_weight_bytes), plus their BF16 parts under bf16 / bf16x3 GEMMs; GpuCausalLM refuses a
// model whose experts would not fit the GPU (unsupported_reason).
class GpuMixtureOfExperts final : public GpuBlock {
 public:
  explicit GpuMixtureOfExperts(const model::MixtureOfExperts& cpu, GemmPrecision precision = GemmPrecision::fp32,
                               ScratchArena arena = nullptr);
  void forward(ConstDeviceMatrix x, DeviceMatrix out, const GpuContext& ctx) const override;
  int64_t scratch_bytes(int64_t positions) const override;
  int64_t weight_bytes() const override;
  int64_t arena_floats(int64_t positions) const;
  // The formula above, from the shape alone (nothing uploaded).
  static int64_t expert_weight_bytes(const model::MoeShape& s, int hidden);
  // The routing of the rows of x (device, N x hidden) the forward would use: router logits on the
  // GPU, model::route on the host. For tests (the expert choices against the CPU's route_rows).
  model::Routing route(ConstDeviceMatrix x, const GpuContext& ctx) const;

 private:
  struct Expert {
    GpuLinear up;    // SwiGLU: [gate | up] stacked (2 I x in); relu^2: up (I x in)
    GpuLinear down;  // in x I
  };
  model::Routing route_into(ConstDeviceMatrix x, DeviceMatrix logits, const GpuContext& ctx) const;
  model::MoeShape s_;
  int hidden_ = 0;
  GemmPrecision precision_;
  GpuLinear router_, shared_gate_, latent_in_, latent_out_;
  model::Vec correction_bias_;  // host: model::route reads it
  std::vector<Expert> experts_;
  std::unique_ptr<GpuMlp> shared_;
  ScratchArena arena_;
  // Routing of the last forward: per slot (row * top_k + j) the row of the gathered inputs that
  // holds it and its weight; per gathered row the input row it reads (host copies kept until the
  // next forward, as their uploads are asynchronous).
  mutable std::vector<float> host_logits_;
  mutable std::vector<int32_t> host_slot_row_, host_source_row_;
  mutable DeviceBuffer<int32_t> slot_row_, source_row_;
  mutable DeviceBuffer<float> slot_weight_;
  mutable std::vector<float> host_slot_weight_;
};

}  // namespace replayssm::cuda
