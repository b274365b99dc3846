// Mamba-2 mixer, following transformers' Mamba2Mixer / NemotronHMamba2Mixer (torch path).
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "model/layers.h"
#include "ssm/sequence_emulator.h"

namespace replayssm::model {

Mamba2Mixer::Mamba2Mixer(WeightLoader& w, const std::string& p, const Mamba2Shape& s, int hidden) : s_(s) {
  // ModelConfig refuses these; a shape built by hand must not leave heads uncomputed either.
  if (s.n_groups <= 0 || s.num_heads % s.n_groups != 0 || s.norm_group_size <= 0 ||
      s.intermediate() % s.norm_group_size != 0)
    throw std::invalid_argument(fmt::format("{}: n_groups {} must divide num_heads {}, norm group {} the width {}", p,
                                            s.n_groups, s.num_heads, s.norm_group_size, s.intermediate()));
  in_proj_ = w.linear(p + ".in_proj", s.in_proj_width(), hidden, s.proj_bias);
  conv_w_ = w.conv_weight(p + ".conv1d.weight", s.conv_dim(), s.conv_kernel);
  if (s.conv_bias) conv_b_ = w.vector(p + ".conv1d.bias", s.conv_dim());
  dt_bias_ = w.vector(p + ".dt_bias", s.num_heads);
  a_log_ = w.vector(p + ".A_log", s.num_heads);
  d_ = w.vector(p + ".D", s.num_heads);
  norm_w_ = w.vector(p + ".norm.weight", s.intermediate());
  out_proj_ = w.linear(p + ".out_proj", hidden, s.intermediate(), s.proj_bias);
}

void Mamba2Mixer::forward(const Mat& x, Mat& out, const LayerContext& ctx) const {
  const int n = static_cast<int>(x.rows());
  const int inter = s_.intermediate(), conv_dim = s_.conv_dim(), heads = s_.num_heads;
  const int dv = s_.head_dim, dk = s_.state_size, groups = s_.n_groups, per_group = heads / groups;

  Mat proj;
  in_proj_.apply(x, proj, ctx.threads);
  auto xbc = proj.middleCols(inter, conv_dim);  // [x | B | C], convolved in place
  causal_conv1d_silu(xbc, conv_w_, conv_b_, ctx.threads);

  Mat y(n, inter);
  // Head groups in parallel; the emulator splits a group's value heads over the threads left.
  ssm::EmulatorOptions emu;
  emu.max_threads = std::max(1, resolve_threads(ctx.threads) / groups);
  parallel_for(groups, ctx.threads, [&](int g) {
    std::vector<float> q(static_cast<std::size_t>(n) * dk), k(q.size());
    std::vector<std::vector<float>> alpha(per_group, std::vector<float>(n));
    std::vector<std::vector<float>> v(per_group, std::vector<float>(static_cast<std::size_t>(n) * dv));
    std::vector<std::vector<float>> o(per_group, std::vector<float>(static_cast<std::size_t>(n) * dv));
    const int b_col = inter + g * dk, c_col = inter + groups * dk + g * dk;
    for (int t = 0; t < n; ++t)
      for (int i = 0; i < dk; ++i) {
        k[static_cast<std::size_t>(t) * dk + i] = xbc(t, b_col + i);
        q[static_cast<std::size_t>(t) * dk + i] = xbc(t, c_col + i);
      }
    for (int j = 0; j < per_group; ++j) {
      const int h = g * per_group + j;
      const float a = -std::exp(a_log_[h]);
      for (int t = 0; t < n; ++t) {
        float dt = softplus(proj(t, inter + conv_dim + h) + dt_bias_[h]);
        dt = static_cast<float>(std::clamp<double>(dt, s_.dt_min, s_.dt_max));
        alpha[j][t] = std::exp(dt * a);
        for (int i = 0; i < dv; ++i) v[j][static_cast<std::size_t>(t) * dv + i] = xbc(t, h * dv + i) * dt;
      }
    }
    ssm::HeadGroupSequence seq;
    seq.kind = ssm::Recurrence::mamba2;
    seq.n_tokens = n;
    seq.dk = dk;
    seq.dv = dv;
    seq.n_value_heads = per_group;
    seq.q = q.data();
    seq.k = k.data();
    std::vector<float*> outs;
    for (int j = 0; j < per_group; ++j) {
      seq.alpha.push_back(alpha[j].data());
      seq.v.push_back(v[j].data());
      outs.push_back(o[j].data());
    }
    const ssm::HeadGroupId id{static_cast<uint32_t>(ctx.layer_index), static_cast<uint32_t>(g)};
    if (ctx.observe) (*ctx.observe)(seq, id);
    ssm::emulate_sequence(seq, *ctx.policy, id, outs, emu);
    for (int j = 0; j < per_group; ++j) {
      const int h = g * per_group + j;
      for (int t = 0; t < n; ++t)
        for (int i = 0; i < dv; ++i)
          y(t, h * dv + i) = o[j][static_cast<std::size_t>(t) * dv + i] + d_[h] * xbc(t, h * dv + i);
    }
  });

  // Gated RMSNorm, gate first (norm_before_gate = False): y * silu(z), then RMS over groups.
  const int blocks = std::max(1, std::min(n, 8 * resolve_threads(ctx.threads)));
  parallel_for(blocks, ctx.threads, [&](int b) {
    for (int t = n * b / blocks; t < n * (b + 1) / blocks; ++t)
      for (int i = 0; i < inter; ++i) y(t, i) *= silu(proj(t, i));
  });
  proj.resize(0, 0);
  rms_norm_rows(y, norm_w_, static_cast<float>(s_.norm_eps), false, s_.norm_group_size, ctx.threads);
  out_proj_.apply(y, out, ctx.threads);
}

}  // namespace replayssm::model
