// The CPU twins of cuda/model/kimi_ops.h: the arithmetic KdaMixer::forward (kda_mixer.cpp),
// MlaAttention::forward (mla_attention.cpp) and MixtureOfExperts::forward (moe.cpp) compute inline,
// written once more as standalone functions.
#include "model/kimi_ops.h"

#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

namespace replayssm::cuda {
namespace {
void check_shape(const char* what, Eigen::Index r1, Eigen::Index c1, Eigen::Index r2, Eigen::Index c2) {
  if (r1 != r2 || c1 != c2)
    throw std::invalid_argument(fmt::format("{}: shape {} x {}, expected {} x {}", what, r1, c1, r2, c2));
}
// kda_mixer.cpp's kda_softplus.
float kda_softplus(float g) { return g > 20.0f ? g : std::log(1.0f + std::exp(g)); }
}  // namespace

void kda_l2_normalise_heads(ConstMatRef x, int head_dim, float scale, MatRef out) {
  check_shape("kda_l2_normalise_heads: out", out.rows(), out.cols(), x.rows(), x.cols());
  if (head_dim <= 0 || x.cols() % head_dim != 0)
    throw std::invalid_argument(
        fmt::format("kda_l2_normalise_heads: head_dim {} must divide the width {}", head_dim, x.cols()));
  // kda_mixer.cpp: l2_normalise(x, d) (x[i] / norm), then q[i] *= q_scale.
  model::Mat y(x.rows(), x.cols());
  for (Eigen::Index t = 0; t < x.rows(); ++t)
    for (Eigen::Index c0 = 0; c0 < x.cols(); c0 += head_dim) {
      double ss = 0.0;
      for (int i = 0; i < head_dim; ++i) ss += static_cast<double>(x(t, c0 + i)) * x(t, c0 + i);
      const float norm = std::sqrt(static_cast<float>(ss) + 1e-6f);
      for (int i = 0; i < head_dim; ++i) y(t, c0 + i) = (x(t, c0 + i) / norm) * scale;
    }
  out = y;
}

void kda_gates(ConstMatRef decay, ConstMatRef b, const model::Vec& dt_bias, const model::Vec& a_log, MatRef alpha,
               MatRef beta) {
  const Eigen::Index heads = a_log.size();
  if (heads <= 0 || decay.cols() % heads != 0 || b.cols() != heads || dt_bias.size() != decay.cols())
    throw std::invalid_argument(fmt::format("kda_gates: {} heads (A_log), decay width {}, b width {}, dt_bias {}",
                                            heads, decay.cols(), b.cols(), dt_bias.size()));
  check_shape("kda_gates: b", b.rows(), b.cols(), decay.rows(), heads);
  check_shape("kda_gates: alpha", alpha.rows(), alpha.cols(), decay.rows(), decay.cols());
  check_shape("kda_gates: beta", beta.rows(), beta.cols(), decay.rows(), heads);
  const Eigen::Index d = decay.cols() / heads;
  // KdaMixer::forward, per head h and token t.
  for (Eigen::Index h = 0; h < heads; ++h) {
    const float rate = std::exp(a_log[h]);
    for (Eigen::Index t = 0; t < decay.rows(); ++t) {
      for (Eigen::Index i = 0; i < d; ++i) {
        const Eigen::Index c = h * d + i;
        alpha(t, c) = std::exp(-rate * kda_softplus(decay(t, c) + dt_bias[c]));
      }
      beta(t, h) = model::sigmoid(b(t, h));
    }
  }
}

void kda_head_norm_gate(ConstMatRef o, ConstMatRef gate, const model::Vec& weight, float eps, MatRef out) {
  const int d = static_cast<int>(weight.size());
  check_shape("kda_head_norm_gate: gate", gate.rows(), gate.cols(), o.rows(), o.cols());
  check_shape("kda_head_norm_gate: out", out.rows(), out.cols(), o.rows(), o.cols());
  if (d <= 0 || o.cols() % d != 0)
    throw std::invalid_argument(fmt::format("kda_head_norm_gate: head_dim {} must divide the width {}", d, o.cols()));
  // KdaMixer::forward: ((o * inv) * w) * sigmoid(gate) per head.
  model::Mat y(o.rows(), o.cols());
  for (Eigen::Index t = 0; t < o.rows(); ++t)
    for (Eigen::Index c0 = 0; c0 < o.cols(); c0 += d) {
      double ss = 0.0;
      for (int i = 0; i < d; ++i) ss += static_cast<double>(o(t, c0 + i)) * o(t, c0 + i);
      const float inv = 1.0f / std::sqrt(static_cast<float>(ss / d) + eps);
      for (int i = 0; i < d; ++i) y(t, c0 + i) = ((o(t, c0 + i) * inv) * weight[i]) * model::sigmoid(gate(t, c0 + i));
    }
  out = y;
}

void mla_assemble_kv(ConstMatRef kvb, ConstMatRef k_rope, int heads, int nope, int dv, MatRef k, MatRef v) {
  if (heads <= 0 || nope <= 0 || dv <= 0)
    throw std::invalid_argument(fmt::format("mla_assemble_kv: heads {}, nope {}, dv {} must be positive", heads, nope, dv));
  const Eigen::Index n = kvb.rows(), rope = k_rope.cols(), qk = nope + rope;
  check_shape("mla_assemble_kv: kvb", kvb.rows(), kvb.cols(), n, Eigen::Index{heads} * (nope + dv));
  check_shape("mla_assemble_kv: k_rope", k_rope.rows(), k_rope.cols(), n, rope);
  check_shape("mla_assemble_kv: k", k.rows(), k.cols(), n, heads * qk);
  check_shape("mla_assemble_kv: v", v.rows(), v.cols(), n, Eigen::Index{heads} * dv);
  // MlaAttention::forward's column copies.
  for (int h = 0; h < heads; ++h) {
    const Eigen::Index src = Eigen::Index{h} * (nope + dv);
    k.middleCols(h * qk, nope) = kvb.middleCols(src, nope);
    k.middleCols(h * qk + nope, rope) = k_rope;
    v.middleCols(Eigen::Index{h} * dv, dv) = kvb.middleCols(src + nope, dv);
  }
}

void moe_weighted_sum(ConstMatRef y, std::span<const int32_t> slot_row, std::span<const float> slot_weight, int top_k,
                      MatRef out) {
  const std::size_t slots = static_cast<std::size_t>(out.rows()) * static_cast<std::size_t>(top_k > 0 ? top_k : 0);
  if (top_k <= 0 || slot_row.size() != slots || slot_weight.size() != slots)
    throw std::invalid_argument(fmt::format("moe_weighted_sum: top_k {}, {} slot rows and {} weights for {} rows "
                                            "(expected top_k >= 1 and rows x top_k of each)",
                                            top_k, slot_row.size(), slot_weight.size(), out.rows()));
  if (y.cols() != out.cols())
    throw std::invalid_argument(fmt::format("moe_weighted_sum: y has {} columns, out {}", y.cols(), out.cols()));
  for (std::size_t s = 0; s < slots; ++s)
    if (slot_row[s] < 0 || slot_row[s] >= y.rows())
      throw std::invalid_argument(
          fmt::format("moe_weighted_sum: slot {} reads row {} of y, which has {} rows", s, slot_row[s], y.rows()));
  // MixtureOfExperts::forward: contribution.row(slot) = y.row(i) * weight[slot]; then
  // routed = 0, routed.row(row) += contribution.row(row * k + j) for j ascending.
  for (Eigen::Index r = 0; r < out.rows(); ++r)
    for (Eigen::Index c = 0; c < out.cols(); ++c) {
      float acc = 0.0f;
      for (int j = 0; j < top_k; ++j) {
        const std::size_t s = static_cast<std::size_t>(r) * top_k + j;
        acc += y(slot_row[s], c) * slot_weight[s];
      }
      out(r, c) = acc;
    }
}

void moe_add_shared(ConstMatRef routed, ConstMatRef shared, ConstMatRef gate_logit, MatRef out) {
  check_shape("moe_add_shared: shared", shared.rows(), shared.cols(), routed.rows(), routed.cols());
  check_shape("moe_add_shared: out", out.rows(), out.cols(), routed.rows(), routed.cols());
  const bool gated = gate_logit.cols() != 0;
  if (gated) check_shape("moe_add_shared: gate_logit", gate_logit.rows(), gate_logit.cols(), routed.rows(), 1);
  // MixtureOfExperts::forward: shared.row(row) *= sigmoid(gate(row, 0)); out += shared.
  for (Eigen::Index r = 0; r < routed.rows(); ++r) {
    const float s = gated ? model::sigmoid(gate_logit(r, 0)) : 1.0f;
    for (Eigen::Index c = 0; c < routed.cols(); ++c) {
      const float term = gated ? shared(r, c) * s : shared(r, c);
      out(r, c) = routed(r, c) + term;
    }
  }
}

}  // namespace replayssm::cuda
