// The element-wise and row-wise ops of the GPU forward of Kimi Linear's blocks and of the mixture
// of experts (gpu_kimi_blocks.h), each with its CPU twin of the same signature (host Eigen views
// where the GPU op takes device views), as model_ops.h does for the other blocks. The CPU twins
// compute exactly what KdaMixer::forward (kda_mixer.cpp), MlaAttention::forward (mla_attention.cpp)
// and MixtureOfExperts::forward (moe.cpp) compute inline: the same float32 operations in the same
// order, sums of squares in double, so a GPU op and its twin differ only by the device's expf/logf
// (CUDA: 1-2 ulp) and the order of the double sums (rounded to float, this almost never shows).
//
// Views: any leading dimension. "In place allowed" names the outputs that may be an input itself.
// Shape mismatches throw std::invalid_argument.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "device_memory.h"
#if !defined(__CUDACC__)
#include <span>

#include "model/model_ops.h"  // ConstMatRef, MatRef
#endif

namespace replayssm::cuda {

// ---- Kimi Delta Attention -------------------------------------------------------------------------
// Per head of head_dim features: out = (x / sqrt(sum x^2 + 1e-6)) * scale, the sum in double and
// rounded to float before the 1e-6 (kda_mixer.cpp l2_normalise: a division, not a product with
// the reciprocal as in Gated DeltaNet; q: scale = dk^-1/2, k: scale = 1, which is exact). In place allowed.
void kda_l2_normalise_heads_gpu(ConstDeviceMatrix x, int head_dim, float scale, DeviceMatrix out,
                                cudaStream_t stream);

// KDA's channel-wise gates, H = a_log.size() heads of head_dim = decay.cols / H channels:
//   alpha(t, c) = exp(-exp(A_log[c / head_dim]) * softplus(decay(t, c) + dt_bias[c])),
//   softplus(g) = g > 20 ? g : log(1 + exp(g))   (KimiLinearForgetGate: log of 1 + exp, not log1p)
//   beta(t, h)  = sigmoid(b(t, h))                 (b: rows x H)
// dt_bias has decay.cols entries. In place (alpha = decay, beta = b) allowed.
void kda_gates_gpu(ConstDeviceMatrix decay, ConstDeviceMatrix b, const DeviceBuffer<float>& dt_bias,
                   const DeviceBuffer<float>& a_log, DeviceMatrix alpha, DeviceMatrix beta, cudaStream_t stream);

// KimiLinearRMSNormGated per head (norm before gate, sigmoid gate): out = ((o * inv) * w) *
// sigmoid(gate), inv = 1 / sqrt(float(sum o^2 / head_dim) + eps), heads of head_dim = weight.size()
// features, the same weight for every head. In place (out = o) allowed.
void kda_head_norm_gate_gpu(ConstDeviceMatrix o, ConstDeviceMatrix gate, const DeviceBuffer<float>& weight, float eps,
                            DeviceMatrix out, cudaStream_t stream);

// ---- multi-head latent attention ------------------------------------------------------------------
// The per-head keys and values of MlaAttention::forward (copies, exact): with qk = nope + rope,
//   k(t, h qk + i)        = kvb(t, h (nope + dv) + i)          i < nope
//   k(t, h qk + nope + i) = k_rope(t, i)                       i < rope (shared by the heads, unrotated)
//   v(t, h dv + j)        = kvb(t, h (nope + dv) + nope + j)   j < dv
// kvb: rows x heads (nope + dv); k_rope: rows x rope; k: rows x heads qk; v: rows x heads dv.
// Outputs must not overlap the inputs.
void mla_assemble_kv_gpu(ConstDeviceMatrix kvb, ConstDeviceMatrix k_rope, int heads, int nope, int dv, DeviceMatrix k,
                         DeviceMatrix v, cudaStream_t stream);

// ---- mixture of experts ---------------------------------------------------------------------------
// The routed sum of MixtureOfExperts::forward: for every row r of out and slot s = r top_k + j,
//   out(r, c) = (((0 + y(slot_row[s0], c) w[s0]) + y(slot_row[s1], c) w[s1]) + ...),  j = 0 .. top_k - 1
// each product rounded to float, then added in ascending j (the slots' ascending expert order):
// the CPU's contribution rows, then its sum. y holds the experts' outputs, one row per slot in any
// order (slot_row says which); slot_row and slot_weight have out.rows * top_k entries (GPU: device
// pointers, the row indices checked by the caller to lie in [0, y.rows); CPU: checked, refused with
// std::invalid_argument). out must not overlap y.
void moe_weighted_sum_gpu(ConstDeviceMatrix y, const int32_t* slot_row, const float* slot_weight, int top_k,
                          DeviceMatrix out, cudaStream_t stream);

// The shared expert's term: out = routed + shared * sigmoid(gate_logit(r, 0)) (Qwen3.5-MoE's
// shared_expert_gate), or out = routed + shared when gate_logit has no data (rows x 1 otherwise).
// The CPU scales the shared rows, then adds them to the routed output: the same two roundings.
// In place (out = routed or out = shared) allowed.
void moe_add_shared_gpu(ConstDeviceMatrix routed, ConstDeviceMatrix shared, ConstDeviceMatrix gate_logit,
                        DeviceMatrix out, cudaStream_t stream);

#if !defined(__CUDACC__)
// ---- the CPU twins, in the same order: host views, the same arithmetic (kimi_ops.cpp) --------------
void kda_l2_normalise_heads(ConstMatRef x, int head_dim, float scale, MatRef out);
void kda_gates(ConstMatRef decay, ConstMatRef b, const model::Vec& dt_bias, const model::Vec& a_log, MatRef alpha,
               MatRef beta);
void kda_head_norm_gate(ConstMatRef o, ConstMatRef gate, const model::Vec& weight, float eps, MatRef out);
void mla_assemble_kv(ConstMatRef kvb, ConstMatRef k_rope, int heads, int nope, int dv, MatRef k, MatRef v);
void moe_weighted_sum(ConstMatRef y, std::span<const int32_t> slot_row, std::span<const float> slot_weight, int top_k,
                      MatRef out);
// gate_logit with no columns: ungated.
void moe_add_shared(ConstMatRef routed, ConstMatRef shared, ConstMatRef gate_logit, MatRef out);
#endif

}  // namespace replayssm::cuda
