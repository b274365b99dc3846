// The CPU twins of cuda/model/model_ops.h: the arithmetic of the CPU layers, written once more as
// standalone functions (the layers compute it inline): Mamba2Mixer::forward (mamba2_mixer.cpp),
// GatedDeltaNet::forward (gated_deltanet.cpp), Mlp::forward (attention.cpp), Linear::apply's bias
// and model::rms_norm_rows / causal_conv1d_silu (tensor_ops.cpp), which are called as they are.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "model/model_ops.h"

namespace replayssm::cuda {
namespace {
void check_shape(const char* what, Eigen::Index r1, Eigen::Index c1, Eigen::Index r2, Eigen::Index c2) {
  if (r1 != r2 || c1 != c2)
    throw std::invalid_argument(fmt::format("{}: shape {} x {}, expected {} x {}", what, r1, c1, r2, c2));
}
}  // namespace

void embedding_gather(ConstMatRef table, std::span<const int32_t> tokens, MatRef out) {
  check_shape("embedding_gather: out", out.rows(), out.cols(), static_cast<Eigen::Index>(tokens.size()), table.cols());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= table.rows())
      throw std::invalid_argument(fmt::format("embedding_gather: token {} at position {} is outside [0, {})",
                                              tokens[i], i, table.rows()));
    out.row(static_cast<Eigen::Index>(i)) = table.row(tokens[i]);
  }
}

void rms_norm_rows(ConstMatRef x, MatRef out, const model::Vec& weight, float eps, bool plus_one, int group) {
  check_shape("rms_norm_rows: out", out.rows(), out.cols(), x.rows(), x.cols());
  model::Mat m = x;
  model::rms_norm_rows(m, weight, eps, plus_one, group, 1);
  out = m;
}

void gated_rms_norm(ConstMatRef y, ConstMatRef z, const model::Vec& weight, float eps, int group, MatRef out) {
  check_shape("gated_rms_norm: z", z.rows(), z.cols(), y.rows(), y.cols());
  check_shape("gated_rms_norm: out", out.rows(), out.cols(), y.rows(), y.cols());
  // Mamba2Mixer::forward: y(t, i) *= silu(proj(t, i)), then rms_norm_rows over norm groups.
  model::Mat g = y;
  for (Eigen::Index t = 0; t < g.rows(); ++t)
    for (Eigen::Index i = 0; i < g.cols(); ++i) g(t, i) *= model::silu(z(t, i));
  model::rms_norm_rows(g, weight, eps, false, group, 1);
  out = g;
}

void head_norm_gate(ConstMatRef o, ConstMatRef z, const model::Vec& weight, float eps, MatRef out) {
  const int dv = static_cast<int>(weight.size());
  check_shape("head_norm_gate: z", z.rows(), z.cols(), o.rows(), o.cols());
  check_shape("head_norm_gate: out", out.rows(), out.cols(), o.rows(), o.cols());
  if (dv <= 0 || o.cols() % dv != 0)
    throw std::invalid_argument(fmt::format("head_norm_gate: head_dim {} must divide the width {}", dv, o.cols()));
  // GatedDeltaNet::forward: (o * rsqrt(mean o^2 + eps)) * w * silu(z) per head.
  model::Mat y(o.rows(), o.cols());
  for (Eigen::Index t = 0; t < o.rows(); ++t)
    for (Eigen::Index c0 = 0; c0 < o.cols(); c0 += dv) {
      double ss = 0.0;
      for (int i = 0; i < dv; ++i) ss += static_cast<double>(o(t, c0 + i)) * o(t, c0 + i);
      const float inv = 1.0f / std::sqrt(static_cast<float>(ss / dv) + eps);
      for (int i = 0; i < dv; ++i) y(t, c0 + i) = ((o(t, c0 + i) * inv) * weight[i]) * model::silu(z(t, c0 + i));
    }
  out = y;
}

void causal_conv1d_silu(ConstMatRef x, const model::Mat& weight, const model::Vec& bias, MatRef out) {
  check_shape("causal_conv1d_silu: out", out.rows(), out.cols(), x.rows(), x.cols());
  model::Mat m = x;
  model::causal_conv1d_silu(m, weight, bias, 1);
  out = m;
}

void mamba2_inputs(ConstMatRef dt_raw, ConstMatRef x, const model::Vec& dt_bias, const model::Vec& a_log,
                   double dt_min, double dt_max, MatRef alpha, MatRef v) {
  const Eigen::Index heads = dt_raw.cols();
  if (heads <= 0 || x.cols() % heads != 0 || dt_bias.size() != heads || a_log.size() != heads)
    throw std::invalid_argument(fmt::format("mamba2_inputs: {} heads, width {}, dt_bias {}, A_log {}", heads, x.cols(),
                                            dt_bias.size(), a_log.size()));
  check_shape("mamba2_inputs: alpha", alpha.rows(), alpha.cols(), dt_raw.rows(), heads);
  check_shape("mamba2_inputs: v", v.rows(), v.cols(), x.rows(), x.cols());
  const Eigen::Index dv = x.cols() / heads;
  // Mamba2Mixer::forward, per head h and token t.
  for (Eigen::Index h = 0; h < heads; ++h) {
    const float a = -std::exp(a_log[h]);
    for (Eigen::Index t = 0; t < x.rows(); ++t) {
      float dt = model::softplus(dt_raw(t, h) + dt_bias[h]);
      dt = static_cast<float>(std::clamp<double>(dt, dt_min, dt_max));
      alpha(t, h) = std::exp(dt * a);
      for (Eigen::Index i = 0; i < dv; ++i) v(t, h * dv + i) = x(t, h * dv + i) * dt;
    }
  }
}

void mamba2_skip(ConstMatRef o, ConstMatRef x, const model::Vec& d_skip, MatRef y) {
  const Eigen::Index heads = d_skip.size();
  if (heads <= 0 || o.cols() % heads != 0)
    throw std::invalid_argument(fmt::format("mamba2_skip: {} heads do not divide the width {}", heads, o.cols()));
  check_shape("mamba2_skip: x", x.rows(), x.cols(), o.rows(), o.cols());
  check_shape("mamba2_skip: y", y.rows(), y.cols(), o.rows(), o.cols());
  const Eigen::Index dv = o.cols() / heads;
  for (Eigen::Index t = 0; t < o.rows(); ++t)
    for (Eigen::Index c = 0; c < o.cols(); ++c) y(t, c) = o(t, c) + d_skip[c / dv] * x(t, c);
}

void l2_normalise_heads(ConstMatRef x, int head_dim, float scale, MatRef out) {
  check_shape("l2_normalise_heads: out", out.rows(), out.cols(), x.rows(), x.cols());
  if (head_dim <= 0 || x.cols() % head_dim != 0)
    throw std::invalid_argument(
        fmt::format("l2_normalise_heads: head_dim {} must divide the width {}", head_dim, x.cols()));
  // gated_deltanet.cpp's l2_normalise(x, d, 1.0f), then (q) * q_scale: ((x inv) 1) scale = (x inv) scale.
  model::Mat y(x.rows(), x.cols());
  for (Eigen::Index t = 0; t < x.rows(); ++t)
    for (Eigen::Index c0 = 0; c0 < x.cols(); c0 += head_dim) {
      double ss = 0.0;
      for (int i = 0; i < head_dim; ++i) ss += static_cast<double>(x(t, c0 + i)) * x(t, c0 + i);
      const float inv = 1.0f / std::sqrt(static_cast<float>(ss) + 1e-6f);
      for (int i = 0; i < head_dim; ++i) y(t, c0 + i) = ((x(t, c0 + i) * inv) * 1.0f) * scale;
    }
  out = y;
}

void gdn_gates(ConstMatRef b, ConstMatRef a, const model::Vec& dt_bias, const model::Vec& a_log, MatRef beta,
               MatRef alpha) {
  check_shape("gdn_gates: a", a.rows(), a.cols(), b.rows(), b.cols());
  check_shape("gdn_gates: beta", beta.rows(), beta.cols(), b.rows(), b.cols());
  check_shape("gdn_gates: alpha", alpha.rows(), alpha.cols(), b.rows(), b.cols());
  if (dt_bias.size() != b.cols() || a_log.size() != b.cols())
    throw std::invalid_argument(fmt::format("gdn_gates: {} heads, dt_bias {}, A_log {}", b.cols(), dt_bias.size(),
                                            a_log.size()));
  for (Eigen::Index h = 0; h < b.cols(); ++h) {
    const float a_neg = -std::exp(a_log[h]);
    for (Eigen::Index t = 0; t < b.rows(); ++t) {
      const float bv = b(t, h), av = a(t, h);
      beta(t, h) = model::sigmoid(bv);
      alpha(t, h) = std::exp(a_neg * model::softplus(av + dt_bias[h]));
    }
  }
}

void swiglu(ConstMatRef gate, ConstMatRef up, MatRef out) {
  check_shape("swiglu: up", up.rows(), up.cols(), gate.rows(), gate.cols());
  check_shape("swiglu: out", out.rows(), out.cols(), gate.rows(), gate.cols());
  // Mlp::forward: u.array() *= silu(g).
  for (Eigen::Index t = 0; t < gate.rows(); ++t)
    for (Eigen::Index c = 0; c < gate.cols(); ++c) out(t, c) = up(t, c) * model::silu(gate(t, c));
}

void relu2(ConstMatRef x, MatRef out) {
  check_shape("relu2: out", out.rows(), out.cols(), x.rows(), x.cols());
  out = x.array().max(0.0f).square().matrix();
}

void residual_add(MatRef h, ConstMatRef delta) {
  check_shape("residual_add: delta", delta.rows(), delta.cols(), h.rows(), h.cols());
  h += delta;
}

void add_bias(MatRef y, const model::Vec& bias) {
  if (bias.size() != y.cols())
    throw std::invalid_argument(fmt::format("add_bias: bias has {} entries, width {}", bias.size(), y.cols()));
  y.rowwise() += bias.transpose();
}

void split_bf16(ConstMatRef x, __nv_bfloat16* hi, __nv_bfloat16* lo) {
  for (Eigen::Index t = 0; t < x.rows(); ++t)
    for (Eigen::Index c = 0; c < x.cols(); ++c) {
      const std::size_t i = static_cast<std::size_t>(t * x.cols() + c);
      const __nv_bfloat16 h = __float2bfloat16_rn(x(t, c));
      hi[i] = h;
      if (lo) lo[i] = __float2bfloat16_rn(x(t, c) - __bfloat162float(h));
    }
}

}  // namespace replayssm::cuda
