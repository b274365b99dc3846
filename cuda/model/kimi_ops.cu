// Kernels of cuda/model/kimi_ops.h. Built with --fmad=false --prec-div=true --ftz=false (no
// contraction, IEEE division and sqrt), so every product, sum, division and square root rounds as
// the CPU twin's does; only expf/logf differ from glibc (CUDA: 1-2 ulp).
#include <cstdint>

#include "cuda_check.h"
#include "model/kimi_ops.h"

namespace replayssm::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = 4;  // row-wise kernels: one warp per (row, head)

__device__ __forceinline__ float sigmoid_d(float x) { return 1.0f / (1.0f + expf(-x)); }
// kda_mixer.cpp's kda_softplus: log(1 + exp(g)) written out, g itself above 20.
__device__ __forceinline__ float kda_softplus_d(float g) { return g > 20.0f ? g : logf(1.0f + expf(g)); }

__device__ __forceinline__ double warp_sum(double s) {
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

unsigned blocks_for(int64_t elements) {
  const int64_t b = (elements + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > (int64_t{1} << 30) ? (int64_t{1} << 30) : b));
}
unsigned warp_blocks_for(int64_t warps) { return static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock); }

void check_same_shape(const char* what, int64_t r1, int64_t c1, int64_t r2, int64_t c2) {
  if (r1 != r2) throw_invalid_argument(what, "rows", static_cast<long>(r1), "expected", static_cast<long>(r2));
  if (c1 != c2) throw_invalid_argument(what, "cols", static_cast<long>(c1), "expected", static_cast<long>(c2));
}

// [first, last) bytes a view touches.
struct View {
  float* data;
  int64_t ld;
};
struct CView {
  const float* data;
  int64_t ld;
};
View v_of(DeviceMatrix m) { return {m.data, m.ld}; }
CView c_of(ConstDeviceMatrix m) { return {m.data, m.ld}; }

// One warp per (row, head). mode 0 (l2): out = (x / norm) * scale, norm = sqrt(float(ss) + 1e-6f);
// mode 1 (gated norm): out = ((x inv) w[i]) sigmoid(gate), inv = 1 / sqrt(float(ss / d) + eps).
// ss: the double sum of squares of the head's x.
__global__ void head_kernel(CView x, CView gate, View out, const float* weight, int64_t rows, int heads, int d,
                            float scale, float eps, int mode) {
  const int64_t warp = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= rows * heads) return;
  const int64_t r = warp / heads, c0 = (warp % heads) * int64_t{d};
  const float* xr = x.data + r * x.ld + c0;
  float* outr = out.data + r * out.ld + c0;
  double ss = 0.0;
  for (int i = lane; i < d; i += 32) ss += static_cast<double>(xr[i]) * xr[i];
  ss = warp_sum(ss);
  if (mode == 0) {
    const float norm = sqrtf(static_cast<float>(ss) + 1e-6f);
    for (int i = lane; i < d; i += 32) outr[i] = (xr[i] / norm) * scale;
  } else {
    const float* gr = gate.data + r * gate.ld + c0;
    const float inv = 1.0f / sqrtf(static_cast<float>(ss / d) + eps);
    for (int i = lane; i < d; i += 32) outr[i] = ((xr[i] * inv) * weight[i]) * sigmoid_d(gr[i]);
  }
}

__global__ void kda_gates_kernel(CView decay, CView b, const float* dt_bias, const float* a_log, View alpha, View beta,
                                 int64_t rows, int heads, int d) {
  const int64_t width = int64_t{heads} * d, n = rows * width;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / width, c = i % width;
    const int h = static_cast<int>(c / d);
    const float rate = expf(a_log[h]);
    const float g = decay.data[t * decay.ld + c] + dt_bias[c];
    alpha.data[t * alpha.ld + c] = expf(-rate * kda_softplus_d(g));
    if (c % d == 0) beta.data[t * beta.ld + h] = sigmoid_d(b.data[t * b.ld + h]);
  }
}

__global__ void mla_kv_kernel(CView kvb, CView k_rope, View k, View v, int64_t rows, int heads, int nope, int rope,
                              int dv) {
  const int qk = nope + rope;
  const int64_t width = int64_t{heads} * (qk + dv), n = rows * width;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / width, c = i % width;
    if (c < int64_t{heads} * qk) {
      const int h = static_cast<int>(c / qk), j = static_cast<int>(c % qk);
      k.data[t * k.ld + c] = j < nope ? kvb.data[t * kvb.ld + int64_t{h} * (nope + dv) + j]
                                      : k_rope.data[t * k_rope.ld + (j - nope)];
    } else {
      const int64_t cv = c - int64_t{heads} * qk;
      const int h = static_cast<int>(cv / dv), j = static_cast<int>(cv % dv);
      v.data[t * v.ld + cv] = kvb.data[t * kvb.ld + int64_t{h} * (nope + dv) + nope + j];
    }
  }
}

// One thread per (row, column): the slots in ascending j, from 0.
__global__ void weighted_sum_kernel(CView y, const int32_t* slot_row, const float* slot_weight, int top_k, View out,
                                    int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    float acc = 0.0f;
    for (int j = 0; j < top_k; ++j) {
      const int64_t s = r * top_k + j;
      acc += y.data[int64_t{slot_row[s]} * y.ld + c] * slot_weight[s];
    }
    out.data[r * out.ld + c] = acc;
  }
}

__global__ void add_shared_kernel(CView routed, CView shared, CView gate, View out, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    const float sv = shared.data[r * shared.ld + c];
    const float term = gate.data ? sv * sigmoid_d(gate.data[r * gate.ld]) : sv;
    out.data[r * out.ld + c] = routed.data[r * routed.ld + c] + term;
  }
}

}  // namespace

void kda_l2_normalise_heads_gpu(ConstDeviceMatrix x, int head_dim, float scale, DeviceMatrix out,
                                cudaStream_t stream) {
  check_same_shape("kda_l2_normalise_heads_gpu: out differs from x", out.rows, out.cols, x.rows, x.cols);
  if (head_dim <= 0 || x.cols % head_dim != 0)
    throw_invalid_argument("kda_l2_normalise_heads_gpu: head_dim must divide the width", "head_dim", head_dim,
                           "width", static_cast<long>(x.cols));
  const int64_t warps = x.rows * (x.cols / head_dim);
  if (warps == 0) return;
  head_kernel<<<warp_blocks_for(warps), 32 * kWarpsPerBlock, 0, stream>>>(
      c_of(x), CView{nullptr, 0}, v_of(out), nullptr, x.rows, static_cast<int>(x.cols / head_dim), head_dim, scale,
      0.0f, 0);
  REPLAYSSM_CUDA_CHECK_LAUNCH();
}

void kda_gates_gpu(ConstDeviceMatrix decay, ConstDeviceMatrix b, const DeviceBuffer<float>& dt_bias,
                   const DeviceBuffer<float>& a_log, DeviceMatrix alpha, DeviceMatrix beta, cudaStream_t stream) {
  const int64_t heads = static_cast<int64_t>(a_log.size());
  if (heads <= 0 || decay.cols % heads != 0)
    throw_invalid_argument("kda_gates_gpu: the heads (A_log entries) must divide the decay width", "heads",
                           static_cast<long>(heads), "width", static_cast<long>(decay.cols));
  if (static_cast<int64_t>(dt_bias.size()) != decay.cols)
    throw_invalid_argument("kda_gates_gpu: dt_bias needs one value per decay channel", "dt_bias",
                           static_cast<long>(dt_bias.size()), "width", static_cast<long>(decay.cols));
  check_same_shape("kda_gates_gpu: b must be rows x heads", b.rows, b.cols, decay.rows, heads);
  check_same_shape("kda_gates_gpu: alpha must have the shape of decay", alpha.rows, alpha.cols, decay.rows,
                   decay.cols);
  check_same_shape("kda_gates_gpu: beta must be rows x heads", beta.rows, beta.cols, decay.rows, heads);
  const int64_t n = decay.rows * decay.cols;
  if (n == 0) return;
  kda_gates_kernel<<<blocks_for(n), kThreads, 0, stream>>>(c_of(decay), c_of(b), dt_bias.data(), a_log.data(),
                                                           v_of(alpha), v_of(beta), decay.rows,
                                                           static_cast<int>(heads),
                                                           static_cast<int>(decay.cols / heads));
  REPLAYSSM_CUDA_CHECK_LAUNCH();
}

void kda_head_norm_gate_gpu(ConstDeviceMatrix o, ConstDeviceMatrix gate, const DeviceBuffer<float>& weight, float eps,
                            DeviceMatrix out, cudaStream_t stream) {
  const int d = static_cast<int>(weight.size());
  check_same_shape("kda_head_norm_gate_gpu: gate differs from o", gate.rows, gate.cols, o.rows, o.cols);
  check_same_shape("kda_head_norm_gate_gpu: out differs from o", out.rows, out.cols, o.rows, o.cols);
  if (d <= 0 || o.cols % d != 0)
    throw_invalid_argument("kda_head_norm_gate_gpu: head_dim (the weight's length) must divide the width", "head_dim",
                           d, "width", static_cast<long>(o.cols));
  const int64_t warps = o.rows * (o.cols / d);
  if (warps == 0) return;
  head_kernel<<<warp_blocks_for(warps), 32 * kWarpsPerBlock, 0, stream>>>(
      c_of(o), c_of(gate), v_of(out), weight.data(), o.rows, static_cast<int>(o.cols / d), d, 1.0f, eps, 1);
  REPLAYSSM_CUDA_CHECK_LAUNCH();
}

void mla_assemble_kv_gpu(ConstDeviceMatrix kvb, ConstDeviceMatrix k_rope, int heads, int nope, int dv, DeviceMatrix k,
                         DeviceMatrix v, cudaStream_t stream) {
  if (heads <= 0 || nope <= 0 || dv <= 0)
    throw_invalid_argument("mla_assemble_kv_gpu: heads, nope and dv must be positive", "heads", heads, "dv", dv);
  const int64_t n = kvb.rows, rope = k_rope.cols;
  check_same_shape("mla_assemble_kv_gpu: kvb must be rows x heads (nope + dv)", kvb.rows, kvb.cols, n,
                   int64_t{heads} * (nope + dv));
  check_same_shape("mla_assemble_kv_gpu: k_rope rows differ from kvb's", k_rope.rows, 0, n, 0);
  check_same_shape("mla_assemble_kv_gpu: k must be rows x heads (nope + rope)", k.rows, k.cols, n,
                   int64_t{heads} * (nope + rope));
  check_same_shape("mla_assemble_kv_gpu: v must be rows x heads dv", v.rows, v.cols, n, int64_t{heads} * dv);
  if (views_overlap(k, kvb) || views_overlap(k, k_rope) || views_overlap(v, kvb) || views_overlap(v, k_rope) ||
      views_overlap(k, v))
    throw_invalid_argument("mla_assemble_kv_gpu: k and v must not overlap each other or the inputs");
  const int64_t total = n * int64_t{heads} * (nope + rope + dv);
  if (total == 0) return;
  mla_kv_kernel<<<blocks_for(total), kThreads, 0, stream>>>(c_of(kvb), c_of(k_rope), v_of(k), v_of(v), n, heads, nope,
                                                            static_cast<int>(rope), dv);
  REPLAYSSM_CUDA_CHECK_LAUNCH();
}

void moe_weighted_sum_gpu(ConstDeviceMatrix y, const int32_t* slot_row, const float* slot_weight, int top_k,
                          DeviceMatrix out, cudaStream_t stream) {
  if (top_k <= 0) throw_invalid_argument("moe_weighted_sum_gpu: top_k must be positive", "top_k", top_k);
  if (y.cols != out.cols)
    throw_invalid_argument("moe_weighted_sum_gpu: y and out differ in width", "y.cols", static_cast<long>(y.cols),
                           "out.cols", static_cast<long>(out.cols));
  if (views_overlap(y, out)) throw_invalid_argument("moe_weighted_sum_gpu: out overlaps y");
  const int64_t n = out.rows * out.cols;
  if (n == 0) return;
  if (!slot_row || !slot_weight) throw_invalid_argument("moe_weighted_sum_gpu: no slot rows or weights given");
  weighted_sum_kernel<<<blocks_for(n), kThreads, 0, stream>>>(c_of(y), slot_row, slot_weight, top_k, v_of(out),
                                                              out.rows, out.cols);
  REPLAYSSM_CUDA_CHECK_LAUNCH();
}

void moe_add_shared_gpu(ConstDeviceMatrix routed, ConstDeviceMatrix shared, ConstDeviceMatrix gate_logit,
                        DeviceMatrix out, cudaStream_t stream) {
  check_same_shape("moe_add_shared_gpu: shared differs from routed", shared.rows, shared.cols, routed.rows,
                   routed.cols);
  check_same_shape("moe_add_shared_gpu: out differs from routed", out.rows, out.cols, routed.rows, routed.cols);
  if (gate_logit.data)
    check_same_shape("moe_add_shared_gpu: gate_logit must be rows x 1", gate_logit.rows, gate_logit.cols, routed.rows,
                     1);
  const int64_t n = routed.rows * routed.cols;
  if (n == 0) return;
  add_shared_kernel<<<blocks_for(n), kThreads, 0, stream>>>(c_of(routed), c_of(shared),
                                                            gate_logit.data ? c_of(gate_logit) : CView{nullptr, 0},
                                                            v_of(out), routed.rows, routed.cols);
  REPLAYSSM_CUDA_CHECK_LAUNCH();
}

}  // namespace replayssm::cuda
