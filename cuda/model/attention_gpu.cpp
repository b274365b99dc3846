// Host side of the GPU attention (attention_gpu.h): argument checks, the block's weights and
// scratch, the RoPE table, and the order of the steps of model::Attention::forward.
#include "model/attention_gpu.h"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "model/attention_kernels.h"

namespace replayssm::cuda {

namespace {

constexpr int kMaxHeadDim = 256;  // the kernels' limit on dqk, dv and head_dim

void check_view(const ConstDeviceMatrix& m, const char* name, int64_t rows, int64_t cols) {
  if (m.rows != rows || m.cols != cols)
    throw std::invalid_argument(
        fmt::format("causal_attention_gpu: {} is {} x {}, expected {} x {}", name, m.rows, m.cols, rows, cols));
  if (m.ld < m.cols)
    throw std::invalid_argument(fmt::format("causal_attention_gpu: {} has ld {} < cols {}", name, m.ld, m.cols));
  if (rows > 0 && cols > 0 && m.data == nullptr)
    throw std::invalid_argument(fmt::format("causal_attention_gpu: {} has no data", name));
}

}  // namespace

void causal_attention_gpu(ConstDeviceMatrix q, ConstDeviceMatrix k, ConstDeviceMatrix v,
                          const model::AttentionHeads& heads, float scale, model::ScaleAt scale_at, DeviceMatrix out,
                          cudaStream_t stream) {
  const int H = heads.num_heads, Hkv = heads.num_kv_heads;
  if (H < 1 || Hkv < 1 || H % Hkv != 0)
    throw std::invalid_argument(fmt::format(
        "causal_attention_gpu: num_kv_heads {} must be >= 1 and divide num_heads {}", Hkv, H));
  if (heads.dqk < 1 || heads.dqk > kMaxHeadDim || heads.dv < 1 || heads.dv > kMaxHeadDim)
    throw std::invalid_argument(
        fmt::format("causal_attention_gpu: dqk {} and dv {} must be in [1, {}]", heads.dqk, heads.dv, kMaxHeadDim));
  if (!std::isfinite(scale)) throw std::invalid_argument(fmt::format("causal_attention_gpu: scale {} is not finite", scale));
  const int64_t n = q.rows;
  if (n < 0 || n > 0x7fffffff)
    throw std::invalid_argument(fmt::format("causal_attention_gpu: {} positions, expected 0 to 2^31 - 1", n));
  check_view(q, "q", n, int64_t{H} * heads.dqk);
  check_view(k, "k", n, int64_t{Hkv} * heads.dqk);
  check_view(v, "v", n, int64_t{Hkv} * heads.dv);
  check_view(out, "out", n, int64_t{H} * heads.dv);
  for (const auto& [in, name] : {std::pair{q, "q"}, std::pair{k, "k"}, std::pair{v, "v"}})
    if (views_overlap(in, out)) throw std::invalid_argument(fmt::format("causal_attention_gpu: out overlaps {}", name));
  attention_kernels::CausalAttentionArgs a;
  a.q = q.data, a.ldq = q.ld, a.q_head_stride = heads.dqk;
  a.k = k.data, a.ldk = k.ld, a.k_head_stride = heads.dqk;
  a.v = v.data, a.ldv = v.ld, a.v_head_stride = heads.dv;
  a.out = out.data, a.ldo = out.ld, a.o_head_stride = heads.dv;
  a.positions = n;
  a.num_heads = H, a.num_kv_heads = Hkv, a.dqk = heads.dqk, a.dv = heads.dv;
  a.scale = scale;
  a.scale_at_scores = scale_at == model::ScaleAt::scores;
  attention_kernels::launch_causal_attention(a, stream);
}

struct GpuAttention::Impl {
  model::AttentionShape shape;
  GpuLinear q_proj, k_proj, v_proj, o_proj;
  DeviceBuffer<float> q_norm, k_norm;  // empty without qk_norm
  std::vector<float> inv_freq;
  float scale = 1.0f;
  // Scratch, grown to the longest sequence seen: q_proj's output (the attention output and the
  // gated output are written over it), k, v, and the RoPE table of positions [0, rope_positions).
  DeviceBuffer<float> qg, k, v, rope_cos, rope_sin;
  int64_t rope_positions = 0;

  int q_head_stride() const { return shape.output_gate ? 2 * shape.head_dim : shape.head_dim; }

  // cos/sin of t * inv_freq[i] computed on the host exactly as Attention::forward computes them
  // (float product, std::cos/std::sin of a float), so the rotation matches it bit for bit.
  void grow_rope_table(int64_t positions, cudaStream_t stream) {
    if (positions <= rope_positions) return;
    const int half = shape.rotary_dim / 2;
    std::vector<float> c(static_cast<std::size_t>(positions * half)), s(c.size());
    for (int64_t t = 0; t < positions; ++t)
      for (int i = 0; i < half; ++i) {
        const float f = static_cast<float>(t) * inv_freq[static_cast<std::size_t>(i)];
        c[static_cast<std::size_t>(t * half + i)] = std::cos(f);
        s[static_cast<std::size_t>(t * half + i)] = std::sin(f);
      }
    rope_cos.upload(c, stream);  // pageable source: the copy is staged before upload returns
    rope_sin.upload(s, stream);
    rope_positions = positions;
  }
};

GpuAttention::GpuAttention(const model::Attention& cpu) : impl_(std::make_shared<Impl>()) {
  Impl& m = *impl_;
  m.shape = cpu.shape();
  const model::AttentionShape& s = m.shape;
  if (s.head_dim < 1 || s.head_dim > kMaxHeadDim)
    throw std::invalid_argument(fmt::format("GpuAttention: head_dim {} is outside [1, {}]", s.head_dim, kMaxHeadDim));
  if (s.rotary_dim > 0 && cpu.inv_freq().size() != static_cast<std::size_t>(s.rotary_dim / 2))
    throw std::invalid_argument(fmt::format("GpuAttention: {} inverse frequencies for rotary_dim {}",
                                            cpu.inv_freq().size(), s.rotary_dim));
  m.q_proj = GpuLinear(cpu.q_proj());
  m.k_proj = GpuLinear(cpu.k_proj());
  m.v_proj = GpuLinear(cpu.v_proj());
  m.o_proj = GpuLinear(cpu.o_proj());
  if (s.qk_norm) {
    m.q_norm.upload(cpu.q_norm().data(), static_cast<std::size_t>(cpu.q_norm().size()));
    m.k_norm.upload(cpu.k_norm().data(), static_cast<std::size_t>(cpu.k_norm().size()));
  }
  m.inv_freq = cpu.inv_freq();
  // Attention::forward: scale = head_dim^-1/2 computed in double, applied to q (ScaleAt::query).
  m.scale = static_cast<float>(std::pow(static_cast<double>(s.head_dim), -0.5));
  // The uploads ran on the default stream: done before a kernel on another stream reads them.
  REPLAYSSM_CUDA_CHECK(cudaDeviceSynchronize());
}

void GpuAttention::attend_projected(DeviceMatrix qg, DeviceMatrix k, ConstDeviceMatrix v, cudaStream_t stream) const {
  Impl& m = *impl_;
  const model::AttentionShape& s = m.shape;
  const int64_t n = qg.rows;
  auto check = [&](const ConstDeviceMatrix& x, const char* name, int64_t cols) {
    if (x.rows != n || x.cols != cols || x.ld < x.cols || (n > 0 && x.data == nullptr))
      throw std::invalid_argument(fmt::format("GpuAttention: {} is {} x {} (ld {}), expected {} x {}", name, x.rows,
                                              x.cols, x.ld, n, cols));
  };
  check(qg, "q_proj output", s.q_proj_width());
  check(k, "k", s.kv_width());
  check(v, "v", s.kv_width());
  if (n == 0) return;
  if (n > 0x7fffffff) throw std::invalid_argument(fmt::format("GpuAttention: {} positions, expected < 2^31", n));
  const int hd = s.head_dim;
  if (s.qk_norm || s.rotary_dim > 0) {
    if (s.rotary_dim > 0) m.grow_rope_table(n, stream);
    const float eps = static_cast<float>(s.norm_eps);
    const float* rc = s.rotary_dim > 0 ? m.rope_cos.data() : nullptr;
    const float* rs = s.rotary_dim > 0 ? m.rope_sin.data() : nullptr;
    attention_kernels::launch_qk_norm_rope(qg.data, n, qg.ld, s.num_heads, m.q_head_stride(), hd,
                                           s.qk_norm ? m.q_norm.data() : nullptr, eps, rc, rs, s.rotary_dim, stream);
    attention_kernels::launch_qk_norm_rope(k.data, n, k.ld, s.num_kv_heads, hd, hd,
                                           s.qk_norm ? m.k_norm.data() : nullptr, eps, rc, rs, s.rotary_dim, stream);
  }
  // The attention output of head h overwrites its query (same columns): see launch_causal_attention.
  attention_kernels::CausalAttentionArgs a;
  a.q = qg.data, a.ldq = qg.ld, a.q_head_stride = m.q_head_stride();
  a.k = k.data, a.ldk = k.ld, a.k_head_stride = hd;
  a.v = v.data, a.ldv = v.ld, a.v_head_stride = hd;
  a.out = qg.data, a.ldo = qg.ld, a.o_head_stride = m.q_head_stride();
  a.positions = n;
  a.num_heads = s.num_heads, a.num_kv_heads = s.num_kv_heads, a.dqk = hd, a.dv = hd;
  a.scale = m.scale;
  a.scale_at_scores = false;
  attention_kernels::launch_causal_attention(a, stream);
  if (s.output_gate) attention_kernels::launch_output_gate_compact(qg.data, n, qg.ld, s.num_heads, hd, stream);
}

void GpuAttention::forward(ConstDeviceMatrix x, DeviceMatrix out, const GpuContext& ctx) const {
  Impl& m = *impl_;
  const model::AttentionShape& s = m.shape;
  const int hidden = m.q_proj.in_features();
  const int64_t n = x.rows;
  if (x.cols != hidden || out.rows != n || out.cols != m.o_proj.out_features())
    throw std::invalid_argument(fmt::format("GpuAttention::forward: x is {} x {}, out {} x {}; expected N x {} each",
                                            x.rows, x.cols, out.rows, out.cols, hidden));
  if (n == 0) return;
  const int qw = s.q_proj_width(), kvw = s.kv_width();
  m.qg.resize(static_cast<std::size_t>(n * qw));
  m.k.resize(static_cast<std::size_t>(n * kvw));
  m.v.resize(static_cast<std::size_t>(n * kvw));
  const DeviceMatrix qg{m.qg.data(), n, qw, qw}, k{m.k.data(), n, kvw, kvw}, v{m.v.data(), n, kvw, kvw};
  m.q_proj.apply(x, qg, ctx);
  m.k_proj.apply(x, k, ctx);
  m.v_proj.apply(x, v, ctx);
  attend_projected(qg, k, v, ctx.stream);
  m.o_proj.apply(ConstDeviceMatrix(qg.data, n, s.attention_width(), qw), out, ctx);
}

int64_t GpuAttention::scratch_bytes(int64_t positions) const {
  const model::AttentionShape& s = impl_->shape;
  const int64_t floats_per_position = int64_t{s.q_proj_width()} + 2 * int64_t{s.kv_width()} + s.rotary_dim;
  return positions * floats_per_position * static_cast<int64_t>(sizeof(float));
}

int64_t GpuAttention::weight_bytes() const {
  const Impl& m = *impl_;
  return m.q_proj.weight_bytes() + m.k_proj.weight_bytes() + m.v_proj.weight_bytes() + m.o_proj.weight_bytes() +
         static_cast<int64_t>(m.q_norm.bytes() + m.k_norm.bytes());
}

}  // namespace replayssm::cuda
