// GPU twins of the CPU model's SSM mixers and MLP (src/model/layers.h), as GpuBlocks: built from the
// loaded CPU block (weights uploaded once, float32), forward over all positions on the device in
// the CPU's order of operations (model_ops.h names each op's CPU twin), the recurrence through
// emulate_layer_sequence_gpu (cuda/ssm/sequence_scan.h) under ctx.policy, SR streams of ctx.layer_index.
//   GpuMamba2Mixer    model::Mamba2Mixer: in_proj -> [z | xBC | dt]; conv + SiLU on xBC; dt, alpha,
//                     v = dt x; scan (k = B, q = C per group); y = o + D x; gated RMSNorm; out_proj
//   GpuGatedDeltaNet  model::GatedDeltaNet: one GEMM for in_proj_qkv, _z, _b, _a (their weights
//                     stacked); conv + SiLU on qkv; q, k L2-normalised (q scaled); beta, alpha; scan;
//                     per-head norm then silu(z) gate; out_proj
//   GpuMlp            model::Mlp: SwiGLU (gate and up stacked in one GEMM) or relu^2
// Scratch: the blocks of one model run one after another on one stream, so they share one arena
// (a DeviceBuffer grown to the largest block's need); a block made without one owns its own.
#pragma once
#include <memory>

#include "device_memory.h"
#include "model/gpu_block.h"
#include "model/layers.h"
#include "model/linear_gpu.h"

namespace replayssm::cuda {

using ScratchArena = std::shared_ptr<DeviceBuffer<float>>;

class GpuMamba2Mixer final : public GpuBlock {
 public:
  explicit GpuMamba2Mixer(const model::Mamba2Mixer& cpu, GemmPrecision precision = GemmPrecision::fp32,
                          ScratchArena arena = nullptr);
  void forward(ConstDeviceMatrix x, DeviceMatrix out, const GpuContext& ctx) const override;
  int64_t scratch_bytes(int64_t positions) const override;
  int64_t weight_bytes() const override;
  // Floats of the shared arena a forward over `positions` positions uses.
  int64_t arena_floats(int64_t positions) const;

 private:
  model::Mamba2Shape s_;
  GemmPrecision precision_;
  GpuLinear in_proj_, out_proj_;
  DeviceBuffer<float> conv_w_, conv_b_, dt_bias_, a_log_, d_, norm_w_;
  ScratchArena arena_;
};

class GpuGatedDeltaNet final : public GpuBlock {
 public:
  explicit GpuGatedDeltaNet(const model::GatedDeltaNet& cpu, GemmPrecision precision = GemmPrecision::fp32,
                            ScratchArena arena = nullptr);
  void forward(ConstDeviceMatrix x, DeviceMatrix out, const GpuContext& ctx) const override;
  int64_t scratch_bytes(int64_t positions) const override;
  int64_t weight_bytes() const override;
  int64_t arena_floats(int64_t positions) const;

 private:
  model::GdnShape s_;
  GemmPrecision precision_;
  GpuLinear in_proj_, out_proj_;  // in_proj_: [qkv | z | b | a]
  DeviceBuffer<float> conv_w_, no_bias_, dt_bias_, a_log_, norm_w_;
  ScratchArena arena_;
};

class GpuMlp final : public GpuBlock {
 public:
  explicit GpuMlp(const model::Mlp& cpu, GemmPrecision precision = GemmPrecision::fp32, ScratchArena arena = nullptr);
  void forward(ConstDeviceMatrix x, DeviceMatrix out, const GpuContext& ctx) const override;
  int64_t scratch_bytes(int64_t positions) const override;
  int64_t weight_bytes() const override;
  int64_t arena_floats(int64_t positions) const;

 private:
  model::MlpShape s_;
  GemmPrecision precision_;
  GpuLinear up_, down_;  // swiglu: up_ is [gate | up]
  ScratchArena arena_;
};

}  // namespace replayssm::cuda
