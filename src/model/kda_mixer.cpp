// Kimi Delta Attention, following transformers' KimiLinearDeltaAttention (torch path), with the
// recurrence run by ssm::emulate_sequence (Recurrence::kda) under the layer's precision policy.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "model/layers.h"
#include "ssm/sequence_emulator.h"

namespace replayssm::model {

namespace {

// The name a tensor has in this checkpoint: the published layout or transformers' in-memory one.
// Both present leaves open which one the checkpoint means.
std::string spelling(const WeightLoader& w, const std::string& published, const std::string& in_memory) {
  if (w.contains(published) && w.contains(in_memory))
    throw std::runtime_error(
        fmt::format("{}: tensors '{}' and '{}' are both present: expected one of the two spellings of the same weight",
                    w.files_description(), published, in_memory));
  return w.contains(in_memory) ? in_memory : published;
}

// The prefix of a bias-free linear layer, spelt as in spelling().
std::string linear_spelling(const WeightLoader& w, const std::string& published, const std::string& in_memory) {
  const std::string weight = ".weight";
  const std::string name = spelling(w, published + weight, in_memory + weight);
  return name.substr(0, name.size() - weight.size());
}

// x / sqrt(sum(x^2) + 1e-6) (transformers' KDA l2norm: sqrt and a division, like FLA's kernel).
void l2_normalise(float* x, int d) {
  double ss = 0.0;
  for (int i = 0; i < d; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float norm = std::sqrt(static_cast<float>(ss) + 1e-6f);
  for (int i = 0; i < d; ++i) x[i] = x[i] / norm;
}

// KimiLinearForgetGate's softplus: log(1 + exp(g)) written out, g itself above 20.
float kda_softplus(float g) { return g > 20.0f ? g : std::log(1.0f + std::exp(g)); }

}  // namespace

KdaMixer::KdaMixer(WeightLoader& w, const std::string& p, const KdaShape& s, int hidden) : s_(s) {
  if (s.num_heads <= 0 || s.head_dim <= 0 || s.conv_kernel <= 0)  // ModelConfig refuses these too
    throw std::invalid_argument(fmt::format("{}: KDA heads {}, head_dim {} and conv kernel {} must be positive", p,
                                            s.num_heads, s.head_dim, s.conv_kernel));
  const int qkv = s.qkv_dim(), hd = s.head_dim;
  q_ = w.linear(p + ".q_proj", qkv, hidden, false);
  k_ = w.linear(p + ".k_proj", qkv, hidden, false);
  v_ = w.linear(p + ".v_proj", qkv, hidden, false);
  // One depthwise conv over [q | k | v]: stored whole (transformers) or as three (published).
  const std::string whole = p + ".conv1d.weight";
  const std::vector<std::string> parts = {p + ".q_conv1d.weight", p + ".k_conv1d.weight", p + ".v_conv1d.weight"};
  if (w.contains(whole)) {
    for (const std::string& part : parts)
      if (w.contains(part))
        throw std::runtime_error(fmt::format(
            "{}: tensors '{}' and '{}' are both present: expected the whole convolution or its q/k/v parts, not both",
            w.files_description(), whole, part));
    conv_w_ = w.conv_weight(whole, s.conv_dim(), s.conv_kernel);
  } else {
    if (!w.shapes_only()) conv_w_.resize(s.conv_dim(), s.conv_kernel);
    for (int i = 0; i < 3; ++i) {
      const Mat part = w.conv_weight(parts[i], qkv, s.conv_kernel);
      if (!w.shapes_only()) conv_w_.middleRows(static_cast<Eigen::Index>(i) * qkv, qkv) = part;
    }
  }
  const std::string gate = p + ".forget_gate";
  f_a_ = w.linear(linear_spelling(w, p + ".f_a_proj", gate + ".f_a_proj"), hd, hidden, false);
  f_b_ = w.linear(linear_spelling(w, p + ".f_b_proj", gate + ".f_b_proj"), qkv, hd, false);
  dt_bias_ = w.vector(spelling(w, p + ".dt_bias", gate + ".dt_bias"), qkv);
  a_log_ = w.flat(spelling(w, p + ".A_log", gate + ".A_log"), {1, 1, s.num_heads, 1});
  b_ = w.linear(p + ".b_proj", s.num_heads, hidden, false);
  g_a_ = w.linear(p + ".g_a_proj", hd, hidden, false);
  g_b_ = w.linear(p + ".g_b_proj", qkv, hd, false);
  norm_w_ = w.vector(p + ".o_norm.weight", hd);
  o_ = w.linear(p + ".o_proj", hidden, qkv, false);
}

void KdaMixer::forward(const Mat& x, Mat& out, const LayerContext& ctx) const {
  const int n = static_cast<int>(x.rows()), heads = s_.num_heads, d = s_.head_dim, qkv = s_.qkv_dim();

  Mat mixed(n, 3 * static_cast<Eigen::Index>(qkv)), part;
  for (int i = 0; i < 3; ++i) {
    (i == 0 ? q_ : i == 1 ? k_ : v_).apply(x, part, ctx.threads);
    mixed.middleCols(static_cast<Eigen::Index>(i) * qkv, qkv) = part;
  }
  causal_conv1d_silu(mixed, conv_w_, Vec(), ctx.threads);

  Mat decay, beta_in, g_low, gate;
  f_a_.apply(x, part, ctx.threads);
  f_b_.apply(part, decay, ctx.threads);  // then log-decay, channel by channel
  b_.apply(x, beta_in, ctx.threads);
  g_a_.apply(x, g_low, ctx.threads);
  g_b_.apply(g_low, gate, ctx.threads);

  const float q_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  const float eps = static_cast<float>(s_.norm_eps);
  Mat y(n, qkv);
  // Heads in parallel (each is its own key head); the emulator gets the threads left over.
  ssm::EmulatorOptions emu;
  emu.max_threads = std::max(1, resolve_threads(ctx.threads) / heads);
  parallel_for(heads, ctx.threads, [&](int h) {
    const std::size_t nd = static_cast<std::size_t>(n) * d;
    std::vector<float> q(nd), k(nd), v(nd), alpha(nd), beta(n), o(nd);
    const float rate = std::exp(a_log_[h]);
    for (int t = 0; t < n; ++t) {
      float* qt = q.data() + static_cast<std::size_t>(t) * d;
      float* kt = k.data() + static_cast<std::size_t>(t) * d;
      float* at = alpha.data() + static_cast<std::size_t>(t) * d;
      for (int i = 0; i < d; ++i) {
        const int c = h * d + i;
        qt[i] = mixed(t, c);
        kt[i] = mixed(t, qkv + c);
        v[static_cast<std::size_t>(t) * d + i] = mixed(t, 2 * qkv + c);
        at[i] = std::exp(-rate * kda_softplus(decay(t, c) + dt_bias_[c]));
      }
      l2_normalise(qt, d);
      for (int i = 0; i < d; ++i) qt[i] *= q_scale;
      l2_normalise(kt, d);
      beta[t] = sigmoid(beta_in(t, h));
    }
    ssm::HeadGroupSequence seq;
    seq.kind = ssm::Recurrence::kda;
    seq.n_tokens = n;
    seq.dk = d;
    seq.dv = d;
    seq.n_value_heads = 1;
    seq.q = q.data();
    seq.k = k.data();
    seq.alpha = {alpha.data()};
    seq.beta = {beta.data()};
    seq.v = {v.data()};
    const ssm::HeadGroupId id{static_cast<uint32_t>(ctx.layer_index), static_cast<uint32_t>(h)};
    if (ctx.observe) (*ctx.observe)(seq, id);
    ssm::emulate_sequence(seq, *ctx.policy, id, {o.data()}, emu);
    // KimiLinearRMSNormGated: (o * rsqrt(mean o^2 + eps)) * w * sigmoid(gate), per head.
    for (int t = 0; t < n; ++t) {
      const float* ot = o.data() + static_cast<std::size_t>(t) * d;
      double ss = 0.0;
      for (int i = 0; i < d; ++i) ss += static_cast<double>(ot[i]) * ot[i];
      const float inv = 1.0f / std::sqrt(static_cast<float>(ss / d) + eps);
      for (int i = 0; i < d; ++i) y(t, h * d + i) = ((ot[i] * inv) * norm_w_[i]) * sigmoid(gate(t, h * d + i));
    }
  });
  o_.apply(y, out, ctx.threads);
}

}  // namespace replayssm::model
