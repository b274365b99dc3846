// Kernels of cuda/model/model_ops.h. Built with --fmad=false --prec-div=true --ftz=false (no
// contraction, IEEE division and sqrt), so every product, sum, division and square root rounds as
// the CPU twin's does; only expf/log1pf differ from glibc (CUDA: 2 ulp).
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda_check.h"
#include "model/model_ops.h"

namespace replayssm::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = 4;  // row-wise kernels: one warp per (row, group)

__device__ __forceinline__ float silu_d(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoid_d(float x) { return 1.0f / (1.0f + expf(-x)); }
// torch.nn.functional.softplus (beta 1, threshold 20), as model::softplus.
__device__ __forceinline__ float softplus_d(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__device__ __forceinline__ double warp_sum(double s) {
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

unsigned blocks_for(int64_t elements) {
  const int64_t b = (elements + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > (int64_t{1} << 30) ? (int64_t{1} << 30) : b));
}

void check_same_shape(const char* what, int64_t r1, int64_t c1, int64_t r2, int64_t c2) {
  if (r1 != r2) throw_invalid_argument(what, "rows", static_cast<long>(r1), "expected", static_cast<long>(r2));
  if (c1 != c2) throw_invalid_argument(what, "cols", static_cast<long>(c1), "expected", static_cast<long>(c2));
}

// ---- elementwise kernels over rows x cols (grid-stride, 64-bit indices) ----------------------------
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

__global__ void gather_kernel(CView table, const int32_t* tokens, View out, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    out.data[r * out.ld + c] = table.data[int64_t{tokens[r]} * table.ld + c];
  }
}

// mode 0: out = (x inv) w; mode 1 (Mamba-2): g = x silu(z), out = (g inv) w; mode 2 (GDN):
// out = ((x inv) w) silu(z). inv = 1 / sqrt(float(ss / group) + eps), ss the double sum of squares
// (of g in mode 1). weight index: the column (full-width weight) or the index in the group.
__global__ void row_norm_kernel(CView x, CView z, View out, const float* weight, int64_t rows, int groups, int group,
                                float eps, int mode, bool plus_one, bool weight_per_group) {
  const int64_t warp = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= rows * groups) return;
  const int64_t r = warp / groups;
  const int64_t c0 = (warp % groups) * int64_t{group};
  const float* xr = x.data + r * x.ld + c0;
  const float* zr = mode != 0 ? z.data + r * z.ld + c0 : nullptr;
  float* outr = out.data + r * out.ld + c0;
  double ss = 0.0;
  for (int i = lane; i < group; i += 32) {
    const float v = mode == 1 ? xr[i] * silu_d(zr[i]) : xr[i];
    ss += static_cast<double>(v) * v;
  }
  ss = warp_sum(ss);
  const float mean = static_cast<float>(ss / group);
  const float inv = 1.0f / sqrtf(mean + eps);
  for (int i = lane; i < group; i += 32) {
    const float wi = weight[weight_per_group ? i : c0 + i];
    const float w = plus_one ? 1.0f + wi : wi;
    if (mode == 0) {
      outr[i] = (xr[i] * inv) * w;
    } else if (mode == 1) {
      const float g = xr[i] * silu_d(zr[i]);
      outr[i] = (g * inv) * w;
    } else {
      outr[i] = ((xr[i] * inv) * w) * silu_d(zr[i]);
    }
  }
}

// out = (x * rsqrt(sum x^2 + 1e-6)) * scale per head; inv = 1 / sqrt(float(ss) + 1e-6f).
__global__ void l2_kernel(CView x, View out, int64_t rows, int heads, int head_dim, float scale) {
  const int64_t warp = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= rows * heads) return;
  const int64_t r = warp / heads, c0 = (warp % heads) * int64_t{head_dim};
  const float* xr = x.data + r * x.ld + c0;
  float* outr = out.data + r * out.ld + c0;
  double ss = 0.0;
  for (int i = lane; i < head_dim; i += 32) ss += static_cast<double>(xr[i]) * xr[i];
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(static_cast<float>(ss) + 1e-6f);
  for (int i = lane; i < head_dim; i += 32) outr[i] = (xr[i] * inv) * scale;
}

// One thread per (t, c): the taps in the CPU's order (acc starts at 0, j = 0..K-1, skipping t - K + 1 + j < 0).
__global__ void conv_kernel(CView x, View out, const float* weight, const float* bias, int64_t rows, int64_t cols,
                            int k) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / cols, c = i % cols;
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int64_t src = t - (k - 1) + j;
      if (src < 0) continue;
      acc += weight[c * k + j] * x.data[src * x.ld + c];
    }
    out.data[t * out.ld + c] = silu_d(acc + (bias ? bias[c] : 0.0f));
  }
}

__device__ __forceinline__ float mamba2_dt(float raw, float dt_bias, double dt_min, double dt_max) {
  const double dt = static_cast<double>(softplus_d(raw + dt_bias));
  // std::clamp<double>(dt, dt_min, dt_max), then back to float.
  return static_cast<float>(dt < dt_min ? dt_min : (dt_max < dt ? dt_max : dt));
}

__global__ void mamba2_inputs_kernel(CView dt_raw, CView x, const float* dt_bias, const float* a_log, double dt_min,
                                     double dt_max, View alpha, View v, int64_t rows, int heads, int dv) {
  const int64_t width = int64_t{heads} * dv, n = rows * width;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / width, c = i % width;
    const int h = static_cast<int>(c / dv);
    const float dt = mamba2_dt(dt_raw.data[t * dt_raw.ld + h], dt_bias[h], dt_min, dt_max);
    v.data[t * v.ld + c] = x.data[t * x.ld + c] * dt;
    if (c % dv == 0) {
      const float a = -expf(a_log[h]);
      alpha.data[t * alpha.ld + h] = expf(dt * a);
    }
  }
}

__global__ void mamba2_skip_kernel(CView o, CView x, const float* d, View y, int64_t rows, int64_t cols, int dv) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / cols, c = i % cols;
    y.data[t * y.ld + c] = o.data[t * o.ld + c] + d[c / dv] * x.data[t * x.ld + c];
  }
}

__global__ void gdn_gates_kernel(CView b, CView a, const float* dt_bias, const float* a_log, View beta, View alpha,
                                 int64_t rows, int64_t heads) {
  const int64_t n = rows * heads;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / heads, h = i % heads;
    const float bv = b.data[t * b.ld + h], av = a.data[t * a.ld + h];
    const float a_neg = -expf(a_log[h]);
    beta.data[t * beta.ld + h] = sigmoid_d(bv);
    alpha.data[t * alpha.ld + h] = expf(a_neg * softplus_d(av + dt_bias[h]));
  }
}

// op 0: out = y * silu(x) (SwiGLU: x gate, y up); op 1: out = max(x, 0)^2; op 2: out = x + y; op 3: out = x + bias[c].
__global__ void pointwise_kernel(CView x, CView y, const float* bias, View out, int64_t rows, int64_t cols, int op) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / cols, c = i % cols;
    const float xv = x.data[t * x.ld + c];
    float r;
    if (op == 0) {
      r = y.data[t * y.ld + c] * silu_d(xv);
    } else if (op == 1) {
      const float m = xv > 0.0f ? xv : 0.0f;
      r = m * m;
    } else if (op == 2) {
      r = xv + y.data[t * y.ld + c];
    } else {
      r = xv + bias[c];
    }
    out.data[t * out.ld + c] = r;
  }
}

__global__ void split_kernel(CView x, __nv_bfloat16* hi, __nv_bfloat16* lo, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / cols, c = i % cols;
    const float v = x.data[t * x.ld + c];
    const __nv_bfloat16 h = __float2bfloat16_rn(v);
    hi[i] = h;
    if (lo) lo[i] = __float2bfloat16_rn(v - __bfloat162float(h));
  }
}

void launch_row_norm(const char* what, ConstDeviceMatrix x, ConstDeviceMatrix z, DeviceMatrix out, const float* weight,
                     int group, float eps, int mode, bool plus_one, bool weight_per_group, cudaStream_t stream) {
  check_same_shape(what, out.rows, out.cols, x.rows, x.cols);
  if (mode != 0) check_same_shape(what, z.rows, z.cols, x.rows, x.cols);
  if (group <= 0 || x.cols % group != 0) throw_invalid_argument(what, "group", group, "width", static_cast<long>(x.cols));
  const int64_t warps = x.rows * (x.cols / group);
  if (warps == 0) return;
  const int64_t blocks = (warps + kWarpsPerBlock - 1) / kWarpsPerBlock;
  row_norm_kernel<<<static_cast<unsigned>(blocks), 32 * kWarpsPerBlock, 0, stream>>>(
      c_of(x), mode != 0 ? c_of(z) : CView{nullptr, 0}, v_of(out), weight, x.rows, static_cast<int>(x.cols / group),
      group, eps, mode, plus_one, weight_per_group);
  REPLAYSSM_CUDA_CHECK_LAUNCH();
}

void launch_pointwise(const char* what, ConstDeviceMatrix x, ConstDeviceMatrix y, const float* bias, DeviceMatrix out,
                      int op, cudaStream_t stream) {
  check_same_shape(what, out.rows, out.cols, x.rows, x.cols);
  if (op == 0 || op == 2) check_same_shape(what, y.rows, y.cols, x.rows, x.cols);
  const int64_t n = x.rows * x.cols;
  if (n == 0) return;
  pointwise_kernel<<<blocks_for(n), kThreads, 0, stream>>>(c_of(x), (op == 0 || op == 2) ? c_of(y) : CView{nullptr, 0},
                                                           bias, v_of(out), x.rows, x.cols, op);
  REPLAYSSM_CUDA_CHECK_LAUNCH();
}

}  // namespace

void embedding_gather_gpu(ConstDeviceMatrix table, const int32_t* tokens, DeviceMatrix out, cudaStream_t stream) {
  if (out.cols != table.cols)
    throw_invalid_argument("embedding_gather_gpu: out width differs from the table's", "out.cols",
                           static_cast<long>(out.cols), "table.cols", static_cast<long>(table.cols));
  const int64_t n = out.rows * out.cols;
  if (n == 0) return;
  gather_kernel<<<blocks_for(n), kThreads, 0, stream>>>(c_of(table), tokens, v_of(out), out.rows, out.cols);
  REPLAYSSM_CUDA_CHECK_LAUNCH();
}

void rms_norm_rows_gpu(ConstDeviceMatrix x, DeviceMatrix out, const DeviceBuffer<float>& weight, float eps,
                       bool plus_one, int group, cudaStream_t stream) {
  if (static_cast<int64_t>(weight.size()) != x.cols)
    throw_invalid_argument("rms_norm_rows_gpu: weight length differs from the width", "weight",
                           static_cast<long>(weight.size()), "width", static_cast<long>(x.cols));
  launch_row_norm("rms_norm_rows_gpu: shapes differ", x, ConstDeviceMatrix{}, out, weight.data(), group, eps, 0,
                  plus_one, false, stream);
}

void gated_rms_norm_gpu(ConstDeviceMatrix y, ConstDeviceMatrix z, const DeviceBuffer<float>& weight, float eps,
                        int group, DeviceMatrix out, cudaStream_t stream) {
  if (static_cast<int64_t>(weight.size()) != y.cols)
    throw_invalid_argument("gated_rms_norm_gpu: weight length differs from the width", "weight",
                           static_cast<long>(weight.size()), "width", static_cast<long>(y.cols));
  launch_row_norm("gated_rms_norm_gpu: shapes differ", y, z, out, weight.data(), group, eps, 1, false, false, stream);
}

void head_norm_gate_gpu(ConstDeviceMatrix o, ConstDeviceMatrix z, const DeviceBuffer<float>& weight, float eps,
                        DeviceMatrix out, cudaStream_t stream) {
  launch_row_norm("head_norm_gate_gpu: shapes differ (or head_dim = weight length does not divide the width)", o, z,
                  out, weight.data(), static_cast<int>(weight.size()), eps, 2, false, true, stream);
}

void causal_conv1d_silu_gpu(ConstDeviceMatrix x, const DeviceBuffer<float>& weight, int kernel,
                            const DeviceBuffer<float>& bias, DeviceMatrix out, cudaStream_t stream) {
  check_same_shape("causal_conv1d_silu_gpu: out differs from x", out.rows, out.cols, x.rows, x.cols);
  if (kernel <= 0 || static_cast<int64_t>(weight.size()) != x.cols * kernel)
    throw_invalid_argument("causal_conv1d_silu_gpu: weight must be channels x kernel", "weight",
                           static_cast<long>(weight.size()), "kernel", kernel);
  if (bias.size() != 0 && static_cast<int64_t>(bias.size()) != x.cols)
    throw_invalid_argument("causal_conv1d_silu_gpu: bias must be empty or one per channel", "bias",
                           static_cast<long>(bias.size()), "channels", static_cast<long>(x.cols));
  // Overlap would let a thread read an input another thread has already overwritten.
  const char* xb = reinterpret_cast<const char*>(x.data);
  const char* ob = reinterpret_cast<const char*>(out.data);
  const int64_t x_end = x.rows ? ((x.rows - 1) * x.ld + x.cols) * 4 : 0, o_end = out.rows ? ((out.rows - 1) * out.ld + out.cols) * 4 : 0;
  if (x_end && o_end && xb < ob + o_end && ob < xb + x_end)
    throw_invalid_argument("causal_conv1d_silu_gpu: out overlaps x (the convolution reads earlier rows)");
  const int64_t n = x.rows * x.cols;
  if (n == 0) return;
  conv_kernel<<<blocks_for(n), kThreads, 0, stream>>>(c_of(x), v_of(out), weight.data(),
                                                      bias.size() ? bias.data() : nullptr, x.rows, x.cols, kernel);
  REPLAYSSM_CUDA_CHECK_LAUNCH();
}

void mamba2_inputs_gpu(ConstDeviceMatrix dt_raw, ConstDeviceMatrix x, const DeviceBuffer<float>& dt_bias,
                       const DeviceBuffer<float>& a_log, double dt_min, double dt_max, DeviceMatrix alpha,
                       DeviceMatrix v, cudaStream_t stream) {
  const int64_t heads = dt_raw.cols;
  if (heads <= 0 || x.cols % heads != 0)
    throw_invalid_argument("mamba2_inputs_gpu: heads (dt columns) must divide the width of x", "heads",
                           static_cast<long>(heads), "width", static_cast<long>(x.cols));
  if (static_cast<int64_t>(dt_bias.size()) != heads || static_cast<int64_t>(a_log.size()) != heads)
    throw_invalid_argument("mamba2_inputs_gpu: dt_bias and A_log need one value per head", "dt_bias",
                           static_cast<long>(dt_bias.size()), "A_log", static_cast<long>(a_log.size()));
  check_same_shape("mamba2_inputs_gpu: x rows differ from dt's", x.rows, 0, dt_raw.rows, 0);
  check_same_shape("mamba2_inputs_gpu: alpha must be rows x heads", alpha.rows, alpha.cols, dt_raw.rows, heads);
  check_same_shape("mamba2_inputs_gpu: v must have the shape of x", v.rows, v.cols, x.rows, x.cols);
  const int64_t n = x.rows * x.cols;
  if (n == 0) return;
  mamba2_inputs_kernel<<<blocks_for(n), kThreads, 0, stream>>>(c_of(dt_raw), c_of(x), dt_bias.data(), a_log.data(),
                                                               dt_min, dt_max, v_of(alpha), v_of(v), x.rows,
                                                               static_cast<int>(heads), static_cast<int>(x.cols / heads));
  REPLAYSSM_CUDA_CHECK_LAUNCH();
}

void mamba2_skip_gpu(ConstDeviceMatrix o, ConstDeviceMatrix x, const DeviceBuffer<float>& d_skip, DeviceMatrix y,
                     cudaStream_t stream) {
  const int64_t heads = static_cast<int64_t>(d_skip.size());
  if (heads <= 0 || o.cols % heads != 0)
    throw_invalid_argument("mamba2_skip_gpu: D (one per head) must divide the width", "heads",
                           static_cast<long>(heads), "width", static_cast<long>(o.cols));
  check_same_shape("mamba2_skip_gpu: x differs from o", x.rows, x.cols, o.rows, o.cols);
  check_same_shape("mamba2_skip_gpu: y differs from o", y.rows, y.cols, o.rows, o.cols);
  const int64_t n = o.rows * o.cols;
  if (n == 0) return;
  mamba2_skip_kernel<<<blocks_for(n), kThreads, 0, stream>>>(c_of(o), c_of(x), d_skip.data(), v_of(y), o.rows, o.cols,
                                                             static_cast<int>(o.cols / heads));
  REPLAYSSM_CUDA_CHECK_LAUNCH();
}

void l2_normalise_heads_gpu(ConstDeviceMatrix x, int head_dim, float scale, DeviceMatrix out, cudaStream_t stream) {
  check_same_shape("l2_normalise_heads_gpu: out differs from x", out.rows, out.cols, x.rows, x.cols);
  if (head_dim <= 0 || x.cols % head_dim != 0)
    throw_invalid_argument("l2_normalise_heads_gpu: head_dim must divide the width", "head_dim", head_dim, "width",
                           static_cast<long>(x.cols));
  const int64_t warps = x.rows * (x.cols / head_dim);
  if (warps == 0) return;
  l2_kernel<<<static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock), 32 * kWarpsPerBlock, 0, stream>>>(
      c_of(x), v_of(out), x.rows, static_cast<int>(x.cols / head_dim), head_dim, scale);
  REPLAYSSM_CUDA_CHECK_LAUNCH();
}

void gdn_gates_gpu(ConstDeviceMatrix b, ConstDeviceMatrix a, const DeviceBuffer<float>& dt_bias,
                   const DeviceBuffer<float>& a_log, DeviceMatrix beta, DeviceMatrix alpha, cudaStream_t stream) {
  check_same_shape("gdn_gates_gpu: a differs from b", a.rows, a.cols, b.rows, b.cols);
  check_same_shape("gdn_gates_gpu: beta differs from b", beta.rows, beta.cols, b.rows, b.cols);
  check_same_shape("gdn_gates_gpu: alpha differs from b", alpha.rows, alpha.cols, b.rows, b.cols);
  if (static_cast<int64_t>(dt_bias.size()) != b.cols || static_cast<int64_t>(a_log.size()) != b.cols)
    throw_invalid_argument("gdn_gates_gpu: dt_bias and A_log need one value per head (column)", "dt_bias",
                           static_cast<long>(dt_bias.size()), "heads", static_cast<long>(b.cols));
  const int64_t n = b.rows * b.cols;
  if (n == 0) return;
  gdn_gates_kernel<<<blocks_for(n), kThreads, 0, stream>>>(c_of(b), c_of(a), dt_bias.data(), a_log.data(), v_of(beta),
                                                           v_of(alpha), b.rows, b.cols);
  REPLAYSSM_CUDA_CHECK_LAUNCH();
}

void swiglu_gpu(ConstDeviceMatrix gate, ConstDeviceMatrix up, DeviceMatrix out, cudaStream_t stream) {
  launch_pointwise("swiglu_gpu: shapes differ", gate, up, nullptr, out, 0, stream);
}
void relu2_gpu(ConstDeviceMatrix x, DeviceMatrix out, cudaStream_t stream) {
  launch_pointwise("relu2_gpu: shapes differ", x, ConstDeviceMatrix{}, nullptr, out, 1, stream);
}
void residual_add_gpu(DeviceMatrix h, ConstDeviceMatrix delta, cudaStream_t stream) {
  launch_pointwise("residual_add_gpu: shapes differ", h, delta, nullptr, h, 2, stream);
}
void add_bias_gpu(DeviceMatrix y, const DeviceBuffer<float>& bias, cudaStream_t stream) {
  if (static_cast<int64_t>(bias.size()) != y.cols)
    throw_invalid_argument("add_bias_gpu: bias length differs from the width", "bias", static_cast<long>(bias.size()),
                           "width", static_cast<long>(y.cols));
  launch_pointwise("add_bias_gpu: shapes differ", y, ConstDeviceMatrix{}, bias.data(), y, 3, stream);
}

void split_bf16_gpu(ConstDeviceMatrix x, __nv_bfloat16* hi, __nv_bfloat16* lo, cudaStream_t stream) {
  const int64_t n = x.rows * x.cols;
  if (n == 0) return;
  split_kernel<<<blocks_for(n), kThreads, 0, stream>>>(c_of(x), hi, lo, x.rows, x.cols);
  REPLAYSSM_CUDA_CHECK_LAUNCH();
}

}  // namespace replayssm::cuda
