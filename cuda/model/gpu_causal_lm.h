// The teacher-forced forward of a loaded CausalLM on one GPU (issue 10): the weights of the CPU
// model uploaded once (float32), every layer run over all N positions on the device, the SSM
// layers' recurrences through the teacher-forced scan kernels (cuda/ssm/sequence_scan.h) under
// the layer's PrecisionPolicy, and the LM head on cuBLAS for any rows of final hidden states.
// The twin of model::CausalLM::final_hidden / lm_head (src/model/causal_lm.h).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "device_memory.h"
#include "model/causal_lm.h"
#include "model/gpu_block.h"

namespace replayssm::cuda {

// What a forward over `positions` positions holds on the device, in bytes.
// The GPU time of one final_hidden, measured with CUDA events when set_timing(true) (issue 10
// benchmark: "the time split (GEMMs, attention, scans, KL)"), in seconds; FLOPs counted from the shapes.
// Layer times are whole blocks (norm, block, residual add) including the GEMMs inside them, which
// are also counted apart, so e.g. the attention kernels' time is attention_layers - attention_gemm.
struct GpuForwardTiming {
  double total = 0;                                             // embedding gather to final norm
  double attention_layers = 0, ssm_layers = 0, mlp_layers = 0;  // token mixers by kind; MLP/MoE blocks
  double attention_gemm = 0, ssm_gemm = 0, mlp_gemm = 0;        // GpuLinear products inside them
  double gemm_flops = 0;         // 2 rows in out summed over the products (the FP32 product's count)
  double gemm_tensor_flops = 0;  // BF16 tensor-core FLOPs executed (bf16x3: 3 or 6 per product FLOP)
  double attention_flops = 0;    // causal QK^T and PV: heads N (N + 1) (dqk + dv) per attention layer
  int64_t gemm_calls = 0;
  double gemm() const { return attention_gemm + ssm_gemm + mlp_gemm; }
};

struct GpuMemoryPlan {
  int64_t weight_bytes = 0;      // every uploaded weight (float32, + BF16 parts when asked for)
  int64_t activation_bytes = 0;  // normalised copy and block output (N x hidden each), token ids; the
                                 // residual stream is final_hidden's `out`, the caller's
  int64_t scratch_bytes = 0;     // the shared block arena (the largest SSM mixer / MLP chunk: projections,
                                 // conv, scan inputs and outputs) + the largest BF16 split of a GEMM input
                                 // (bf16, bf16x3) + the attention blocks' own scratch
  int64_t state_bytes = 0;       // scan states (in registers/shared memory: 0 unless spilled to global)
  int64_t total() const { return weight_bytes + activation_bytes + scratch_bytes + state_bytes; }
};

class GpuCausalLM {
 public:
  // Uploads `cpu`'s weights (cpu must be load()ed, not inspect()ed). Throws std::runtime_error
  // "DIR: " + unsupported_reason(cpu) for anything without a GPU twin yet. Owns one stream and one
  // cuBLAS handle (CUBLAS_DEFAULT_MATH: no TF32) that every op of this model runs on.
  GpuCausalLM(const model::CausalLM& cpu, GemmPrecision gemm);
  ~GpuCausalLM();
  GpuCausalLM(const GpuCausalLM&) = delete;
  GpuCausalLM& operator=(const GpuCausalLM&) = delete;

  // "" when the GPU can run `cpu`, else why not (for --device auto/cuda): a model opened with
  // inspect() ("... load() it"); or, each ending "; use --device cpu", a block without a GPU twin
  // ("layer 3 (kda) has no GPU twin yet"; every kind the CPU loads has one: Mamba-2, Gated DeltaNet,
  // attention, MLP, MoE, KDA, MLA), SSM heads beyond the GPU scan's limits (dk, dv <= 256), experts
  // that, uploaded as float32, exceed the GPU's free memory (gpu_kimi_blocks.h GpuMixtureOfExperts).
  static std::string unsupported_reason(const model::CausalLM& cpu);

  int vocab_size() const;
  int hidden_size() const;
  GemmPrecision gemm_precision() const;
  GpuMemoryPlan memory_plan(int64_t positions) const;

  // Final-norm hidden states of every position (tokens.size() x hidden) into `out` (dense,
  // tokens.size() rows), every SSM layer under `policy`. Token ids outside [0, vocab) throw
  // std::invalid_argument naming the position. on_layer_done as for CausalLM::final_hidden.
  // `gemm` overrides the model's GEMM precision for this call (the --compute noise floor runs the
  // reference at FP32 compute on a model built for BF16; every weight keeps its FP32 copy).
  // `observe`, when given, sees every SSM layer's scan inputs (gpu_block.h GpuSequenceObserver).
  void final_hidden(std::span<const int32_t> tokens, const model::PolicyAssignment& policy, DeviceMatrix out,
                    const std::function<void(int layer, int n_layers, double seconds)>& on_layer_done = {},
                    std::optional<GemmPrecision> gemm = std::nullopt,
                    const GpuSequenceObserver* observe = nullptr) const;
  // Times every following final_hidden (CUDA events; final_hidden then waits for its work before
  // returning) and keeps the split for last_timing(); off by default.
  void set_timing(bool on);
  // The split of the last timed final_hidden (zeros before one).
  const GpuForwardTiming& last_timing() const;
  // logits = hidden_rows W_lm^T: rows x vocab (any ld), on the device, on stream() (not synchronised).
  void lm_logits(ConstDeviceMatrix hidden_rows, DeviceMatrix logits,
                 std::optional<GemmPrecision> gemm = std::nullopt) const;
  cudaStream_t stream() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace replayssm::cuda
