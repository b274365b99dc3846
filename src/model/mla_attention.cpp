// Multi-head latent attention of Kimi Linear, following transformers' KimiLinearAttention (eager
// path): low-rank query (optional) and key/value latents, no positional encoding, blockwise
// causal softmax so that memory stays O(N d).
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

#include "model/layers.h"

namespace replayssm::model {

// transformers' KimiLinearRMSNorm of the latents uses its constructor's default eps (1e-6),
// whatever rms_norm_eps says: MlaShape::lora_norm_eps.
MlaAttention::MlaAttention(WeightLoader& w, const std::string& p, const MlaShape& s, int hidden) : s_(s) {
  if (s.num_heads <= 0 || s.kv_lora_rank <= 0 || s.qk_nope_head_dim <= 0 || s.qk_rope_head_dim <= 0 ||
      s.v_head_dim <= 0 || s.q_lora_rank < 0)  // ModelConfig refuses these too
    throw std::invalid_argument(fmt::format(
        "{}: MLA heads {}, kv_lora_rank {}, qk_nope/rope/v head dims {}/{}/{} must be positive, q_lora_rank {} >= 0", p,
        s.num_heads, s.kv_lora_rank, s.qk_nope_head_dim, s.qk_rope_head_dim, s.v_head_dim, s.q_lora_rank));
  if (s.q_lora_rank == 0) {
    q_ = w.linear(p + ".q_proj", s.q_width(), hidden, false);
  } else {
    q_a_ = w.linear(p + ".q_a_proj", s.q_lora_rank, hidden, s.bias);
    q_a_norm_ = w.vector(p + ".q_a_layernorm.weight", s.q_lora_rank);
    q_b_ = w.linear(p + ".q_b_proj", s.q_width(), s.q_lora_rank, false);
  }
  kv_a_ = w.linear(p + ".kv_a_proj_with_mqa", s.kv_a_width(), hidden, s.bias);
  kv_a_norm_ = w.vector(p + ".kv_a_layernorm.weight", s.kv_lora_rank);
  kv_b_ = w.linear(p + ".kv_b_proj", s.kv_b_width(), s.kv_lora_rank, false);
  o_ = w.linear(p + ".o_proj", hidden, s.value_width(), s.bias);
}

void MlaAttention::forward(const Mat& x, Mat& out, const LayerContext& ctx) const {
  const int n = static_cast<int>(x.rows()), H = s_.num_heads;
  const int nope = s_.qk_nope_head_dim, rope = s_.qk_rope_head_dim, dv = s_.v_head_dim, qk = s_.qk_head_dim();
  const int rank = s_.kv_lora_rank;
  const float lora_eps = static_cast<float>(s_.lora_norm_eps);
  Mat q;
  if (s_.q_lora_rank == 0) {
    q_.apply(x, q, ctx.threads);
  } else {
    Mat qa;
    q_a_.apply(x, qa, ctx.threads);
    rms_norm_rows(qa, q_a_norm_, lora_eps, false, s_.q_lora_rank, ctx.threads);
    q_b_.apply(qa, q, ctx.threads);
  }
  // Latent [c | k_rope]; c is normalised and expanded to every head's [k_nope | v].
  Mat latent, kvb;
  kv_a_.apply(x, latent, ctx.threads);
  Mat c = latent.leftCols(rank);
  rms_norm_rows(c, kv_a_norm_, lora_eps, false, rank, ctx.threads);
  kv_b_.apply(c, kvb, ctx.threads);
  Mat k(n, static_cast<Eigen::Index>(H) * qk), v(n, static_cast<Eigen::Index>(H) * dv);
  for (int h = 0; h < H; ++h) {
    const Eigen::Index src = static_cast<Eigen::Index>(h) * (nope + dv);
    k.middleCols(static_cast<Eigen::Index>(h) * qk, nope) = kvb.middleCols(src, nope);
    k.middleCols(static_cast<Eigen::Index>(h) * qk + nope, rope) = latent.middleCols(rank, rope);  // shared, unrotated
    v.middleCols(static_cast<Eigen::Index>(h) * dv, dv) = kvb.middleCols(src + nope, dv);
  }
  const float scale = static_cast<float>(std::pow(static_cast<double>(qk), -0.5));
  const Mat att = causal_attention(q, k, v, {H, H, qk, dv}, scale, ScaleAt::scores, ctx.threads);
  o_.apply(att, out, ctx.threads);
}

}  // namespace replayssm::model
