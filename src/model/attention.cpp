// Causal attention: NemotronHAttention and Qwen3_5Attention (transformers, eager path), with the
// softmax computed blockwise online so that memory stays O(N d).
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

#include "model/layers.h"

namespace replayssm::model {

Attention::Attention(WeightLoader& w, const std::string& p, const AttentionShape& s, int hidden) : s_(s) {
  if (s.num_kv_heads <= 0 || s.num_heads % s.num_kv_heads != 0 || s.rotary_dim % 2 != 0 || s.rotary_dim > s.head_dim)
    throw std::invalid_argument(fmt::format(
        "{}: num_kv_heads {} must divide num_heads {}; rotary_dim {} must be even and at most head_dim {}", p,
        s.num_kv_heads, s.num_heads, s.rotary_dim, s.head_dim));
  const int hd = s.head_dim;
  q_ = w.linear(p + ".q_proj", s.q_proj_width(), hidden, s.bias);
  k_ = w.linear(p + ".k_proj", s.kv_width(), hidden, s.bias);
  v_ = w.linear(p + ".v_proj", s.kv_width(), hidden, s.bias);
  o_ = w.linear(p + ".o_proj", hidden, s.attention_width(), s.bias);
  if (s.qk_norm) {
    q_norm_ = w.vector(p + ".q_norm.weight", hd);
    k_norm_ = w.vector(p + ".k_norm.weight", hd);
  }
  // inv_freq[i] = 1 / theta^(2i / rotary_dim), in float32 like transformers' default RoPE.
  for (int i = 0; i < s.rotary_dim / 2; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(s.rotary_dim);
    inv_freq_.push_back(1.0f / std::pow(static_cast<float>(s.rope_theta), e));
  }
}

Mat causal_attention(const Mat& q, const Mat& k, const Mat& v, const AttentionHeads& heads, float scale,
                     ScaleAt scale_at, int threads, int block) {
  const int n = static_cast<int>(q.rows());
  const int num_heads = heads.num_heads, dqk = heads.dqk, dv = heads.dv;
  const int per_kv = num_heads / heads.num_kv_heads;
  const int n_blocks = (n + block - 1) / block;
  Mat out(n, static_cast<Eigen::Index>(num_heads) * dv);
  // Costliest query blocks (the last ones) first for load balance.
  parallel_for(n_blocks * num_heads, threads, [&](int task) {
    const int qb = n_blocks - 1 - task / num_heads, h = task % num_heads, kvh = h / per_kv;
    const int r0 = qb * block, rows = std::min(block, n - r0);
    Mat qblk = q.block(r0, static_cast<Eigen::Index>(h) * dqk, rows, dqk);
    if (scale_at == ScaleAt::query) qblk *= scale;
    Mat acc = Mat::Zero(rows, dv);
    std::vector<float> m(rows, -std::numeric_limits<float>::infinity()), l(rows, 0.0f);
    Mat s;
    for (int kb = 0; kb <= qb; ++kb) {
      const int c0 = kb * block, cols = std::min(block, n - c0);
      s.noalias() = qblk * k.block(c0, static_cast<Eigen::Index>(kvh) * dqk, cols, dqk).transpose();
      if (scale_at == ScaleAt::scores) s *= scale;
      for (int i = 0; i < rows; ++i) {
        const int last = std::min(cols - 1, r0 + i - c0);  // causal: key position <= query position
        float mx = m[i];
        for (int j = 0; j <= last; ++j) mx = std::max(mx, s(i, j));
        const float corr = std::exp(m[i] - mx);
        float sum = 0.0f;
        for (int j = 0; j < cols; ++j) {
          const float p = j <= last ? std::exp(s(i, j) - mx) : 0.0f;
          s(i, j) = p;
          sum += p;
        }
        l[i] = l[i] * corr + sum;
        acc.row(i) *= corr;
        m[i] = mx;
      }
      acc.noalias() += s * v.block(c0, static_cast<Eigen::Index>(kvh) * dv, cols, dv);
    }
    for (int i = 0; i < rows; ++i) out.block(r0 + i, static_cast<Eigen::Index>(h) * dv, 1, dv) = acc.row(i) / l[i];
  });
  return out;
}

void Attention::forward(const Mat& x, Mat& out, const LayerContext& ctx) const {
  const int n = static_cast<int>(x.rows()), hd = s_.head_dim, H = s_.num_heads, Hkv = s_.num_kv_heads;
  Mat qg, q, k, v, gate;
  q_.apply(x, qg, ctx.threads);
  k_.apply(x, k, ctx.threads);
  v_.apply(x, v, ctx.threads);
  if (s_.output_gate) {
    // q_proj output per head: [query (hd) | gate (hd)].
    q.resize(n, static_cast<Eigen::Index>(H) * hd);
    gate.resize(n, static_cast<Eigen::Index>(H) * hd);
    for (int h = 0; h < H; ++h) {
      q.middleCols(static_cast<Eigen::Index>(h) * hd, hd) = qg.middleCols(static_cast<Eigen::Index>(2 * h) * hd, hd);
      gate.middleCols(static_cast<Eigen::Index>(h) * hd, hd) =
          qg.middleCols(static_cast<Eigen::Index>(2 * h + 1) * hd, hd);
    }
    qg.resize(0, 0);
  } else {
    q.swap(qg);
  }
  if (s_.qk_norm) {
    rms_norm_rows(q, q_norm_.replicate(H, 1), static_cast<float>(s_.norm_eps), true, hd, ctx.threads);
    rms_norm_rows(k, k_norm_.replicate(Hkv, 1), static_cast<float>(s_.norm_eps), true, hd, ctx.threads);
  }
  if (s_.rotary_dim > 0) {
    const int half = s_.rotary_dim / 2;
    const int blocks = std::max(1, std::min(n, 8 * resolve_threads(ctx.threads)));
    parallel_for(blocks, ctx.threads, [&](int b) {
      std::vector<float> c(half), sn(half);
      for (int t = n * b / blocks; t < n * (b + 1) / blocks; ++t) {
        for (int i = 0; i < half; ++i) {
          const float f = static_cast<float>(t) * inv_freq_[i];
          c[i] = std::cos(f);
          sn[i] = std::sin(f);
        }
        auto rotate = [&](float* x0) {
          for (int i = 0; i < half; ++i) {
            const float x1 = x0[i], x2 = x0[i + half];
            x0[i] = x1 * c[i] + (-x2) * sn[i];
            x0[i + half] = x2 * c[i] + x1 * sn[i];
          }
        };
        for (int h = 0; h < H; ++h) rotate(q.data() + static_cast<Eigen::Index>(t) * q.cols() + h * hd);
        for (int h = 0; h < Hkv; ++h) rotate(k.data() + static_cast<Eigen::Index>(t) * k.cols() + h * hd);
      }
    });
  }
  const float scale = static_cast<float>(std::pow(static_cast<double>(hd), -0.5));
  Mat att = causal_attention(q, k, v, {H, Hkv, hd, hd}, scale, ScaleAt::query, ctx.threads);
  if (s_.output_gate) att.array() *= gate.array().unaryExpr([](float g) { return sigmoid(g); });
  o_.apply(att, out, ctx.threads);
}

Mlp::Mlp(WeightLoader& w, const std::string& p, const MlpShape& s, int hidden) : s_(s) {
  if (s.activation == MlpActivation::swiglu) gate_ = w.linear(p + ".gate_proj", s.intermediate_size, hidden, s.bias);
  up_ = w.linear(p + ".up_proj", s.intermediate_size, hidden, s.bias);
  down_ = w.linear(p + ".down_proj", hidden, s.intermediate_size, s.bias);
}

void Mlp::forward(const Mat& x, Mat& out, const LayerContext& ctx) const {
  Mat u;
  up_.apply(x, u, ctx.threads);
  if (s_.activation == MlpActivation::swiglu) {
    Mat g;
    gate_.apply(x, g, ctx.threads);
    u.array() *= g.array().unaryExpr([](float a) { return silu(a); });
  } else {
    u = u.array().max(0.0f).square().matrix();
  }
  down_.apply(u, out, ctx.threads);
}

}  // namespace replayssm::model
