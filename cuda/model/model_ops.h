// The element-wise and row-wise ops of the GPU forward (issue 10), each with its CPU twin of the same
// signature (host Eigen views where the GPU op takes device views). The CPU twins compute exactly
// what the CPU layers compute inline (src/model/tensor_ops.cpp, mamba2_mixer.cpp, gated_deltanet.cpp,
// attention.cpp's Mlp): the same float32 operations in the same order, sums of squares in double, so
// a GPU op and its twin differ only by the device's exp/log1p (CUDA's expf: 2 ulp) and the order of
// the double sums (rounded to float, this almost never shows). The GPU tests compare the two.
//
// Views: any leading dimension (a column block of a wider activation is passed without a copy). An
// `out` may be the input itself where the comment says "in place allowed"; the convolution may not.
// Weights on the device are DeviceBuffers so their lengths are checked; an empty bias means none,
// as model::Vec() does on the CPU. Shape mismatches throw std::invalid_argument.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "device_memory.h"
// The CPU twins (Eigen, C++20) are hidden from nvcc, which compiles the kernels as C++17.
#if !defined(__CUDACC__)
#define REPLAYSSM_CPU_TWINS 1
#include <span>

#include "model/tensor_ops.h"
#endif

namespace replayssm::cuda {

// ---- embedding ---------------------------------------------------------------------------------
// out.row(i) = table.row(tokens[i]). GPU: `tokens` are device ints that the caller has checked to
// lie in [0, table.rows) (GpuCausalLM checks them on the host). CPU: throws std::invalid_argument
// for an id outside the table.
void embedding_gather_gpu(ConstDeviceMatrix table, const int32_t* tokens, DeviceMatrix out, cudaStream_t stream);

// ---- RMSNorms ----------------------------------------------------------------------------------
// model::rms_norm_rows out of place: out = x * rsqrt(mean_group(x^2) + eps) * (w or 1 + w), over
// groups of `group` consecutive features; weight has x.cols entries. In place allowed.
void rms_norm_rows_gpu(ConstDeviceMatrix x, DeviceMatrix out, const DeviceBuffer<float>& weight, float eps,
                       bool plus_one, int group, cudaStream_t stream);

// Mamba-2's gated RMSNorm, gate first (norm_before_gate = False): g = y * silu(z), then
// out = g * rsqrt(mean_group(g^2) + eps) * w over groups of `group`; weight has y.cols entries.
// In place (out = y) allowed.
void gated_rms_norm_gpu(ConstDeviceMatrix y, ConstDeviceMatrix z, const DeviceBuffer<float>& weight, float eps,
                        int group, DeviceMatrix out, cudaStream_t stream);

// Gated DeltaNet's per-head norm, norm before gate: out = ((o * rsqrt(mean_head(o^2) + eps)) * w) *
// silu(z), heads of head_dim = weight.size() features, the same weight for every head. In place allowed.
void head_norm_gate_gpu(ConstDeviceMatrix o, ConstDeviceMatrix z, const DeviceBuffer<float>& weight, float eps,
                        DeviceMatrix out, cudaStream_t stream);

// ---- causal depthwise conv1d + SiLU --------------------------------------------------------------
// model::causal_conv1d_silu out of place: out(t, c) = silu(sum_j w(c, j) x(t - K + 1 + j, c) + b(c)),
// zero before t = 0. weight: channels x K row-major (channels = x.cols); bias: channels or empty.
// out must not overlap x.
void causal_conv1d_silu_gpu(ConstDeviceMatrix x, const DeviceBuffer<float>& weight, int kernel,
                            const DeviceBuffer<float>& bias, DeviceMatrix out, cudaStream_t stream);

// ---- Mamba-2 ------------------------------------------------------------------------------------
// Inputs of the recurrence (Mamba2Mixer::forward): per value head h of H = dt_raw.cols,
// dt = clamp(softplus(dt_raw + dt_bias[h]), dt_min, dt_max) (clamped in double, as the CPU does),
// alpha(t, h) = exp(dt * -exp(A_log[h])), v(t, h dv + i) = x(t, h dv + i) * dt; dv = x.cols / H.
void mamba2_inputs_gpu(ConstDeviceMatrix dt_raw, ConstDeviceMatrix x, const DeviceBuffer<float>& dt_bias,
                       const DeviceBuffer<float>& a_log, double dt_min, double dt_max, DeviceMatrix alpha,
                       DeviceMatrix v, cudaStream_t stream);
// The D skip: y(t, h dv + i) = o(t, h dv + i) + D[h] x(t, h dv + i), H = d_skip.size(). In place (y = o) allowed.
void mamba2_skip_gpu(ConstDeviceMatrix o, ConstDeviceMatrix x, const DeviceBuffer<float>& d_skip, DeviceMatrix y,
                     cudaStream_t stream);

// ---- Gated DeltaNet -----------------------------------------------------------------------------
// Per head of head_dim features: out = (x * rsqrt(sum x^2 + 1e-6)) * scale (transformers' l2norm;
// q: scale = dk^-1/2, k: scale = 1). In place allowed.
void l2_normalise_heads_gpu(ConstDeviceMatrix x, int head_dim, float scale, DeviceMatrix out, cudaStream_t stream);
// beta = sigmoid(b), alpha = exp(-exp(A_log[h]) softplus(a + dt_bias[h])), per value head h (column).
// In place (beta = b, alpha = a) allowed.
void gdn_gates_gpu(ConstDeviceMatrix b, ConstDeviceMatrix a, const DeviceBuffer<float>& dt_bias,
                   const DeviceBuffer<float>& a_log, DeviceMatrix beta, DeviceMatrix alpha, cudaStream_t stream);

// ---- MLP activations, residual, bias ----------------------------------------------------------------
// SwiGLU: out = up * silu(gate). In place (out = up) allowed.
void swiglu_gpu(ConstDeviceMatrix gate, ConstDeviceMatrix up, DeviceMatrix out, cudaStream_t stream);
// relu^2: out = max(x, 0)^2. In place allowed.
void relu2_gpu(ConstDeviceMatrix x, DeviceMatrix out, cudaStream_t stream);
// h += delta (the residual stream).
void residual_add_gpu(DeviceMatrix h, ConstDeviceMatrix delta, cudaStream_t stream);
// y.row(r) += bias (model::Linear::apply's bias), bias has y.cols entries.
void add_bias_gpu(DeviceMatrix y, const DeviceBuffer<float>& bias, cudaStream_t stream);

// ---- BF16 parts of float32 values (GpuLinear's bf16 and bf16x3 products) ----------------------------
// hi = bf16(x) and, when lo is not null, lo = bf16(x - hi) (x - hi is exact in float32), both
// round-to-nearest-even, written densely (rows x cols, ld = cols). x = hi + lo + r, |r| <= 2^-16 |x|.
void split_bf16_gpu(ConstDeviceMatrix x, __nv_bfloat16* hi, __nv_bfloat16* lo, cudaStream_t stream);

#if REPLAYSSM_CPU_TWINS
// ---- the CPU twins, in the same order: host views, the same arithmetic (model_ops.cpp) -------------
using model::MatRef;  // Eigen::Ref<Mat, 0, OuterStride<>>: a row-major matrix or a column block of one
using ConstMatRef = Eigen::Ref<const model::Mat, 0, Eigen::OuterStride<>>;
void embedding_gather(ConstMatRef table, std::span<const int32_t> tokens, MatRef out);
void rms_norm_rows(ConstMatRef x, MatRef out, const model::Vec& weight, float eps, bool plus_one, int group);
void gated_rms_norm(ConstMatRef y, ConstMatRef z, const model::Vec& weight, float eps, int group, MatRef out);
void head_norm_gate(ConstMatRef o, ConstMatRef z, const model::Vec& weight, float eps, MatRef out);
void causal_conv1d_silu(ConstMatRef x, const model::Mat& weight, const model::Vec& bias, MatRef out);
void mamba2_inputs(ConstMatRef dt_raw, ConstMatRef x, const model::Vec& dt_bias, const model::Vec& a_log,
                   double dt_min, double dt_max, MatRef alpha, MatRef v);
void mamba2_skip(ConstMatRef o, ConstMatRef x, const model::Vec& d_skip, MatRef y);
void l2_normalise_heads(ConstMatRef x, int head_dim, float scale, MatRef out);
void gdn_gates(ConstMatRef b, ConstMatRef a, const model::Vec& dt_bias, const model::Vec& a_log, MatRef beta,
               MatRef alpha);
void swiglu(ConstMatRef gate, ConstMatRef up, MatRef out);
void relu2(ConstMatRef x, MatRef out);
void residual_add(MatRef h, ConstMatRef delta);
void add_bias(MatRef y, const model::Vec& bias);
void split_bf16(ConstMatRef x, __nv_bfloat16* hi, __nv_bfloat16* lo);
#endif

}  // namespace replayssm::cuda
