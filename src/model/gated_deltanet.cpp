// Gated DeltaNet, following transformers' Qwen3_5GatedDeltaNet (torch path).
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "model/layers.h"
#include "ssm/sequence_emulator.h"

namespace replayssm::model {

GatedDeltaNet::GatedDeltaNet(WeightLoader& w, const std::string& p, const GdnShape& s, int hidden) : s_(s) {
  if (s.num_k_heads <= 0 || s.num_v_heads % s.num_k_heads != 0)  // ModelConfig refuses this too
    throw std::invalid_argument(
        fmt::format("{}: num_k_heads {} must divide num_v_heads {}", p, s.num_k_heads, s.num_v_heads));
  in_qkv_ = w.linear(p + ".in_proj_qkv", s.conv_dim(), hidden, false);
  in_z_ = w.linear(p + ".in_proj_z", s.value_dim(), hidden, false);
  in_b_ = w.linear(p + ".in_proj_b", s.num_v_heads, hidden, false);
  in_a_ = w.linear(p + ".in_proj_a", s.num_v_heads, hidden, false);
  conv_w_ = w.conv_weight(p + ".conv1d.weight", s.conv_dim(), s.conv_kernel);
  dt_bias_ = w.vector(p + ".dt_bias", s.num_v_heads);
  a_log_ = w.vector(p + ".A_log", s.num_v_heads);
  norm_w_ = w.vector(p + ".norm.weight", s.dv);
  out_proj_ = w.linear(p + ".out_proj", hidden, s.value_dim(), false);
}

namespace {
// x * rsqrt(sum(x^2) + eps) (transformers' l2norm, FLA's convention), then * scale.
void l2_normalise(float* x, int d, float scale) {
  double ss = 0.0;
  for (int i = 0; i < d; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = 1.0f / std::sqrt(static_cast<float>(ss) + 1e-6f);
  for (int i = 0; i < d; ++i) x[i] = (x[i] * inv) * scale;
}
}  // namespace

void GatedDeltaNet::forward(const Mat& x, Mat& out, const LayerContext& ctx) const {
  const int n = static_cast<int>(x.rows());
  const int nk = s_.num_k_heads, nv = s_.num_v_heads, dk = s_.dk, dv = s_.dv, per_key = nv / nk;
  const int key_dim = s_.key_dim();

  Mat qkv, z, b, a;
  in_qkv_.apply(x, qkv, ctx.threads);
  causal_conv1d_silu(qkv, conv_w_, Vec(), ctx.threads);
  in_z_.apply(x, z, ctx.threads);
  in_b_.apply(x, b, ctx.threads);
  in_a_.apply(x, a, ctx.threads);

  const float q_scale = static_cast<float>(std::pow(static_cast<double>(dk), -0.5));
  Mat y(n, s_.value_dim());
  // Head groups in parallel; the emulator splits a group's value heads over the threads left.
  ssm::EmulatorOptions emu;
  emu.max_threads = std::max(1, resolve_threads(ctx.threads) / nk);
  parallel_for(nk, ctx.threads, [&](int kh) {
    std::vector<float> q(static_cast<std::size_t>(n) * dk), k(q.size());
    std::vector<std::vector<float>> alpha(per_key, std::vector<float>(n)), beta(per_key, std::vector<float>(n));
    std::vector<std::vector<float>> v(per_key, std::vector<float>(static_cast<std::size_t>(n) * dv));
    std::vector<std::vector<float>> o(per_key, std::vector<float>(static_cast<std::size_t>(n) * dv));
    for (int t = 0; t < n; ++t) {
      float* qt = q.data() + static_cast<std::size_t>(t) * dk;
      float* kt = k.data() + static_cast<std::size_t>(t) * dk;
      for (int i = 0; i < dk; ++i) {
        qt[i] = qkv(t, kh * dk + i);
        kt[i] = qkv(t, key_dim + kh * dk + i);
      }
      l2_normalise(qt, dk, 1.0f);
      for (int i = 0; i < dk; ++i) qt[i] *= q_scale;
      l2_normalise(kt, dk, 1.0f);
    }
    for (int j = 0; j < per_key; ++j) {
      const int h = kh * per_key + j;
      const float a_neg = -std::exp(a_log_[h]);
      for (int t = 0; t < n; ++t) {
        beta[j][t] = sigmoid(b(t, h));
        alpha[j][t] = std::exp(a_neg * softplus(a(t, h) + dt_bias_[h]));
        for (int i = 0; i < dv; ++i) v[j][static_cast<std::size_t>(t) * dv + i] = qkv(t, 2 * key_dim + h * dv + i);
      }
    }
    ssm::HeadGroupSequence seq;
    seq.kind = ssm::Recurrence::gdn;
    seq.n_tokens = n;
    seq.dk = dk;
    seq.dv = dv;
    seq.n_value_heads = per_key;
    seq.q = q.data();
    seq.k = k.data();
    std::vector<float*> outs;
    for (int j = 0; j < per_key; ++j) {
      seq.alpha.push_back(alpha[j].data());
      seq.beta.push_back(beta[j].data());
      seq.v.push_back(v[j].data());
      outs.push_back(o[j].data());
    }
    const ssm::HeadGroupId id{static_cast<uint32_t>(ctx.layer_index), static_cast<uint32_t>(kh)};
    if (ctx.observe) (*ctx.observe)(seq, id);
    ssm::emulate_sequence(seq, *ctx.policy, id, outs, emu);
    // Per-head gated RMSNorm, norm before gate: (o * rsqrt(mean o^2 + eps)) * w * silu(z).
    for (int j = 0; j < per_key; ++j) {
      const int h = kh * per_key + j;
      for (int t = 0; t < n; ++t) {
        const float* ot = o[j].data() + static_cast<std::size_t>(t) * dv;
        double ss = 0.0;
        for (int i = 0; i < dv; ++i) ss += static_cast<double>(ot[i]) * ot[i];
        const float inv = 1.0f / std::sqrt(static_cast<float>(ss / dv) + static_cast<float>(s_.norm_eps));
        for (int i = 0; i < dv; ++i) y(t, h * dv + i) = ((ot[i] * inv) * norm_w_[i]) * silu(z(t, h * dv + i));
      }
    }
  });
  out_proj_.apply(y, out, ctx.threads);
}

}  // namespace replayssm::model
