// The kernels of the GPU attention block (cuda/model/attention_gpu.h), on raw device pointers:
// the launchers check nothing (causal_attention_gpu and GpuAttention validate shapes first);
// they are declared here so that the GPU tests can drive each step on its own.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace replayssm::cuda::attention_kernels {

// Head j of an operand occupies columns [j * head_stride, j * head_stride + width) of a row-major
// matrix with leading dimension ld (width = dqk for q and k, dv for v and out).
struct CausalAttentionArgs {
  const float* q = nullptr;
  int64_t ldq = 0, q_head_stride = 0;
  const float* k = nullptr;
  int64_t ldk = 0, k_head_stride = 0;
  const float* v = nullptr;
  int64_t ldv = 0, v_head_stride = 0;
  float* out = nullptr;
  int64_t ldo = 0, o_head_stride = 0;
  int64_t positions = 0;
  int num_heads = 1, num_kv_heads = 1, dqk = 0, dv = 0;
  float scale = 1.0f;
  bool scale_at_scores = false;  // model::ScaleAt::scores; else the query is scaled (ScaleAt::query)
};

// Causal softmax attention, the semantics of model::causal_attention: query tiles of 64
// positions, key/value tiles of 64 streamed through shared memory with an online softmax.
// Requires 1 <= dqk, dv <= 256 and num_kv_heads | num_heads. `out` may be `q` itself when both
// have the same layout (ld, head stride) and dv == dqk: each query tile reads its own q before
// it writes its output, and no other tile reads it.
void launch_causal_attention(const CausalAttentionArgs& args, cudaStream_t stream);

// In place, for every row t < rows and head j < num_heads, on x = data + t ld + j head_stride
// (head_dim floats), the steps of model::Attention::forward before the attention:
//   norm_weight != nullptr: x = (x * (1 / sqrt(mean(x^2) + eps))) * (1 + w)  (rms_norm_rows,
//     plus_one, the sum of squares in double as on the CPU);
//   rotary_dim > 0: x[i], x[i + rotary_dim / 2] rotated by rope_cos/rope_sin[t (rotary_dim / 2) + i]
//     for i < rotary_dim / 2 (rotate_half: x1 c - x2 s, x2 c + x1 s).
// head_dim <= 256.
void launch_qk_norm_rope(float* data, int64_t rows, int64_t ld, int num_heads, int64_t head_stride, int head_dim,
                         const float* norm_weight, float eps, const float* rope_cos, const float* rope_sin,
                         int rotary_dim, cudaStream_t stream);

// Qwen3.5's output gate, in place on q_proj's layout (per row, head h: [attention output | gate],
// head_dim each): row[h hd + d] = row[2h hd + d] * sigmoid(row[(2h + 1) hd + d]), so the gated
// output ends up dense in the first num_heads * head_dim columns of each row.
void launch_output_gate_compact(float* data, int64_t rows, int64_t ld, int num_heads, int head_dim,
                                cudaStream_t stream);

}  // namespace replayssm::cuda::attention_kernels
