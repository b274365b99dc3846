#include "ssm/conventional_decode.h"

#include <stdexcept>

#include <fmt/format.h>

namespace replayssm::ssm {

ConventionalDecoder::ConventionalDecoder(const HeadGroupShape& shape, const PrecisionPolicy& policy, HeadGroupId id)
    : shape_(shape), policy_(policy), id_(id) {
  check_shape(shape);
  if (policy.scheme != DecodeScheme::conventional)
    throw std::invalid_argument(
        fmt::format("ConventionalDecoder needs a conventional policy, got '{}'", policy.to_string()));
  check_state_format(policy.recur, shape.dv, shape.dk);
  state_.assign(static_cast<std::size_t>(shape.n_value_heads), StateMatrix::Zero(shape.dv, shape.dk));
  residual_.assign(static_cast<std::size_t>(shape.n_value_heads),
                   error_feedback_residual(policy.recur, shape.dv, shape.dk));
}

void ConventionalDecoder::step(const GroupToken& x, float* out) {
  check_token(shape_, x);
  if (static_cast<uint64_t>(steps_) >= kMaxStreamEvents)
    throw std::out_of_range("ConventionalDecoder: more steps than the SR stream numbering holds");
  const int w = decay_width(shape_.kind, shape_.dk);
  k_ = Eigen::Map<const Vector>(x.k, shape_.dk);
  q_ = Eigen::Map<const Vector>(x.q, shape_.dk);
  for (int g = 0; g < shape_.n_value_heads; ++g) {
    StateMatrix& S = state_[static_cast<std::size_t>(g)];
    a_ = Eigen::Map<const Vector>(x.alpha[g], w);
    v_ = Eigen::Map<const Vector>(x.v[g], shape_.dv);
    const float beta = has_delta_rule(shape_.kind) ? x.beta[g] : 0.0f;
    plain_step(shape_.kind, S, a_, beta, v_, k_, u_, scratch_);  // read S_{t-1}, update
    state_output(S, q_, o_);                                     // o_t = S_t q_t (float32 state)
    Eigen::Map<Vector>(out + static_cast<std::ptrdiff_t>(g) * shape_.dv, shape_.dv) = o_;
    quantize_state(S, policy_.recur, policy_.seed, id_, g, CheckpointCopy::recur, static_cast<uint64_t>(steps_),
                   residual_[static_cast<std::size_t>(g)]);  // write S_t back in its format
  }
  ++steps_;
}

}  // namespace replayssm::ssm
