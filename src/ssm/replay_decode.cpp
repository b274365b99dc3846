#include "ssm/replay_decode.h"

#include <algorithm>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

namespace replayssm::ssm {

namespace {
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
}

// ---- RecordRing ------------------------------------------------------------------------------

RecordRing::RecordRing(const HeadGroupShape& shape, int capacity) : shape_(shape), capacity_(capacity) {
  if (capacity < 1) throw std::invalid_argument(fmt::format("ring capacity must be >= 1, got {}", capacity));
  const std::size_t G = static_cast<std::size_t>(shape.n_value_heads);
  const int w = decay_width(shape.kind, shape.dk);
  state_.assign(static_cast<std::size_t>(capacity), SlotState::free);
  k_ = RowMatrix::Constant(capacity, shape.dk, kNaN);
  alpha_.assign(G, RowMatrix::Constant(capacity, w, kNaN));
  beta_.assign(G, Vector::Constant(capacity, kNaN));
  v_.assign(G, RowMatrix::Constant(capacity, shape.dv, kNaN));
  u_.assign(G, RowMatrix::Constant(capacity, shape.dv, kNaN));
  stats_.capacity = capacity;
}

void RecordRing::write(int p, const GroupToken& x, SlotState as) {
  if (p < 0 || p >= capacity_)
    throw std::logic_error(fmt::format("record ring: window position {} beyond capacity {}", p + 1, capacity_));
  const int s = slot(p);
  SlotState& st = state_[static_cast<std::size_t>(s)];
  if (st != SlotState::free)
    throw std::logic_error(fmt::format(
        "record ring: writing window position {} would overwrite a live {} record (slot {} of {})", p + 1,
        st == SlotState::committed ? "committed, unflushed" : "draft", s, capacity_));
  ++live_;
  st = as;
  const int w = decay_width(shape_.kind, shape_.dk);
  k_.row(s) = Eigen::Map<const Eigen::RowVectorXf>(x.k, shape_.dk);
  for (int g = 0; g < shape_.n_value_heads; ++g) {
    alpha_[g].row(s) = Eigen::Map<const Eigen::RowVectorXf>(x.alpha[g], w);
    beta_[g](s) = has_delta_rule(shape_.kind) ? x.beta[g] : 0.0f;
    v_[g].row(s) = Eigen::Map<const Eigen::RowVectorXf>(x.v[g], shape_.dv);
    u_[g].row(s).setConstant(kNaN);  // not known until the step that computes it
  }
  ++stats_.records_written;
  stats_.max_live = std::max(stats_.max_live, live_);
}

void RecordRing::set_u(int p, int g, const Eigen::Ref<const Eigen::RowVectorXf>& u) { u_[g].row(slot(p)) = u; }

void RecordRing::commit(int p, int count) {
  for (int i = p; i < p + count; ++i) {
    SlotState& st = state_[static_cast<std::size_t>(slot(i))];
    if (st != SlotState::draft) throw std::logic_error("record ring: committing a position that holds no draft");
    st = SlotState::committed;
  }
}

void RecordRing::poison(int p) {
  const int s = slot(p);
  SlotState& st = state_[static_cast<std::size_t>(s)];
  if (st != SlotState::free) --live_;
  st = SlotState::free;
  k_.row(s).setConstant(kNaN);
  for (int g = 0; g < shape_.n_value_heads; ++g) {
    alpha_[g].row(s).setConstant(kNaN);
    beta_[g](s) = kNaN;
    v_[g].row(s).setConstant(kNaN);
    u_[g].row(s).setConstant(kNaN);
  }
}

void RecordRing::release(int p, int count) {
  for (int i = p; i < p + count; ++i) {
    if (state_at(i) != SlotState::draft) throw std::logic_error("record ring: releasing a position that holds no draft");
    poison(i);
    ++stats_.records_rejected;
  }
}

void RecordRing::drop_front(int count) {
  for (int i = 0; i < count; ++i) {
    if (state_at(i) != SlotState::committed)
      throw std::logic_error("record ring: flushing a position that holds no committed record");
    poison(i);
    ++stats_.records_flushed;
  }
  start_ = (start_ + count) % capacity_;
}

void RecordRing::gather(int n, RowMatrix& K, std::vector<WindowRecords>& recs) const {
  for (int p = 0; p < n; ++p) {
    const int s = slot(p);
    K.row(p) = k_.row(s);
    for (int g = 0; g < shape_.n_value_heads; ++g) {
      WindowRecords& r = recs[static_cast<std::size_t>(g)];
      r.alpha.row(p) = alpha_[g].row(s);
      r.beta(p) = beta_[g](s);
      r.V.row(p) = v_[g].row(s);
      r.U.row(p) = u_[g].row(s);
    }
  }
}

// ---- ReplayDecoderBase -----------------------------------------------------------------------

namespace {
int ring_capacity_for(const PrecisionPolicy& policy, const ReplayDecoderOptions& o) {
  if (o.max_draft < 1) throw std::invalid_argument(fmt::format("max_draft must be >= 1, got {}", o.max_draft));
  if (policy.window < 1) throw std::invalid_argument(fmt::format("window L must be >= 1, got {}", policy.window));
  if (o.ring_capacity > 0) return o.ring_capacity;
  return std::max(policy.window, o.max_draft) + o.max_draft;
}
}  // namespace

ReplayDecoderBase::ReplayDecoderBase(const HeadGroupShape& shape, const PrecisionPolicy& policy, HeadGroupId id,
                                     const ReplayDecoderOptions& options)
    : shape_(shape),
      policy_(policy),
      id_(id),
      options_(options),
      ring_((check_shape(shape), shape), ring_capacity_for(policy, options)) {
  check_state_format(policy.recur, shape.dv, shape.dk);
  if (split()) check_state_format(policy.read, shape.dv, shape.dk);
  if (policy.skip.mode != CheckpointSkip::Mode::off && options.max_draft > 1)
    throw std::invalid_argument(fmt::format(
        "ReplayDecoder: policy {} skips checkpoint reads (appendix F), which the literal decoders implement for "
        "standard decode only (max_draft must be 1)",
        policy.to_string()));
  const std::size_t G = static_cast<std::size_t>(shape.n_value_heads);
  recur_.assign(G, StateMatrix::Zero(shape.dv, shape.dk));
  if (split()) read_.assign(G, StateMatrix::Zero(shape.dv, shape.dk));
  recur_residual_.assign(G, error_feedback_residual(policy.recur, shape.dv, shape.dk));
  if (split()) read_residual_.assign(G, error_feedback_residual(policy.read, shape.dv, shape.dk));
  const int C = ring_.capacity();
  K_.resize(C, shape.dk);
  Q_.resize(options.max_draft, shape.dk);
  recs_.resize(G);
  for (auto& r : recs_) r.resize(shape.kind, C, shape.dk, shape.dv);
  S_.resize(shape.dv, shape.dk);
}

const StateMatrix& ReplayDecoderBase::checkpoint_for(int g, bool flush) const {
  return (split() && !flush) ? read_[static_cast<std::size_t>(g)] : recur_[static_cast<std::size_t>(g)];
}

void ReplayDecoderBase::write_checkpoints(int g, const StateMatrix& S) {
  const uint64_t event = static_cast<uint64_t>(flushes_);
  if (split()) {  // Algorithm 3: S_ckpt^LP <- Q_LP(S) (RTN), S_ckpt^HP <- Q_HP(S)
    StateMatrix& lp = read_[static_cast<std::size_t>(g)];
    lp = S;
    quantize_state(lp, policy_.read, policy_.seed, id_, g, CheckpointCopy::read, event,
                   read_residual_[static_cast<std::size_t>(g)]);
  }
  StateMatrix& ckpt = recur_[static_cast<std::size_t>(g)];
  ckpt = S;
  quantize_state(ckpt, policy_.recur, policy_.seed, id_, g, CheckpointCopy::recur, event,
                 recur_residual_[static_cast<std::size_t>(g)]);
}

void ReplayDecoderBase::step(const GroupToken& x, float* out) {
  check_token(shape_, x);
  if (pending_ > 0) throw std::logic_error("ReplayDecoder::step: drafts await commit()");
  const int G = shape_.n_value_heads, dv = shape_.dv;
  const bool delta = has_delta_rule(shape_.kind);
  const int h = h_;
  ring_.write(h, x, RecordRing::SlotState::committed);  // B[h+1] <- x
  const int n = h + 1;                                  // h <- h + 1
  const bool flush = n >= policy_.window;               // h == L (h > L only after a verify commit)
  if (flush && static_cast<uint64_t>(flushes_) >= kMaxStreamEvents)
    throw std::out_of_range("ReplayDecoder: more flushes than the SR stream numbering holds");
  ring_.gather(n, K_, recs_);
  q_ = Eigen::Map<const Vector>(x.q, shape_.dk);
  const bool output_only_step = !flush && options_.non_flush == NonFlushForm::output_only;
  if (output_only_step) {
    Q_.row(0) = q_.transpose();
    if (!has_channel_decay(shape_.kind)) key_products(K_, h, 1, Q_, delta, products_);  // once per key head
  }
  for (int g = 0; g < G; ++g) {
    WindowRecords& rec = recs_[static_cast<std::size_t>(g)];
    float* o = out + static_cast<std::ptrdiff_t>(g) * dv;
    if (skips_checkpoint_read(rec, n, flush)) {
      // Appendix F: gamma_h below what the copy read can resolve, so the read is skipped and the state
      // is the window's own contribution, W = REPLAY(0, B[1:h]), every correction recomputed from W
      // (as the sequence emulator steps it); a flush writes Q(W), a pure write.
      S_.setZero();
      replay(shape_.kind, S_, K_, rec, n, 0, rs_);
      state_output(S_, q_, o_);
      Eigen::Map<Vector>(o, dv) = o_;
      if (flush) write_checkpoints(g, S_);
      if (!flush && delta) ring_.set_u(h, g, rec.U.row(h));  // later steps of this window skip too (gamma falls)
      continue;
    }
    if (output_only_step) {
      // o_t = g_h S_ckpt q_t + sum_j g_{j+1:h} u_j (k_j^T q_t); GDN/KDA: u_t by the T = 1 UT form.
      output_only(shape_.kind, checkpoint_for(g, false), K_, rec, h, 1, Q_, &products_, O_, oo_);
      Eigen::Map<Eigen::RowVectorXf>(o, dv) = O_.row(0);
    } else {
      // S = REPLAY(S_ckpt, B[1:h]); GDN: u = b (v - a S k); S <- a S + u k^T; o = S q.
      // Split flush: every u_j recomputed on the HP path (recompute_from = 0).
      S_ = checkpoint_for(g, flush);
      const int recompute_from = (flush && split()) ? 0 : h;
      replay(shape_.kind, S_, K_, rec, n, recompute_from, rs_);
      state_output(S_, q_, o_);
      Eigen::Map<Vector>(o, dv) = o_;
      if (flush) write_checkpoints(g, S_);  // S_ckpt <- S (write to memory)
    }
    if (!flush && delta) ring_.set_u(h, g, rec.U.row(h));
  }
  if (flush) {  // B <- empty; h <- 0
    ++flushes_;
    ring_.drop_front(n);
    h_ = 0;
  } else {
    h_ = n;
  }
  ++tokens_;
}

bool ReplayDecoderBase::skips_checkpoint_read(const WindowRecords& rec, int n, bool flush) {
  if (policy_.skip.mode == CheckpointSkip::Mode::off) return false;
  // gamma over the window's records in token order, float32, the largest channel for KDA: the
  // emulator's running product (sequence_emulator.cpp skip_read), recomputed from the records.
  gamma_ = rec.alpha.row(0).transpose();
  for (int j = 1; j < n; ++j) gamma_ = gamma_.cwiseProduct(rec.alpha.row(j).transpose());
  const StateFormat& copy = (flush || !split()) ? policy_.recur : policy_.read;
  return gamma_.maxCoeff() < policy_.skip.threshold_for(copy);
}

void ReplayDecoderBase::verify(std::span<const GroupToken> drafts, float* out) {
  if (pending_ > 0) throw std::logic_error("ReplayDecoder::verify: the previous drafts await commit()");
  const int T = static_cast<int>(drafts.size());
  if (T < 1 || T > options_.max_draft)
    throw std::invalid_argument(
        fmt::format("ReplayDecoder::verify: T = {} drafts, expected 1..{} (max_draft)", T, options_.max_draft));
  for (const GroupToken& x : drafts) check_token(shape_, x);
  const int G = shape_.n_value_heads, dv = shape_.dv;
  const bool delta = has_delta_rule(shape_.kind);
  const int h = h_;
  for (int s = 0; s < T; ++s) ring_.write(h + s, drafts[s], RecordRing::SlotState::draft);  // B[h+1:h+T] <- X
  const int n = h + T;
  const bool flush = h + T > policy_.window;  // Algorithm 2 line 4 (Algorithm 3: pi = HP)
  const bool fold = flush && h > 0;          // nothing to fold when h = 0: no write
  if (fold && static_cast<uint64_t>(flushes_) >= kMaxStreamEvents)
    throw std::out_of_range("ReplayDecoder: more flushes than the SR stream numbering holds");
  ring_.gather(n, K_, recs_);
  for (int s = 0; s < T; ++s) Q_.row(s) = Eigen::Map<const Eigen::RowVectorXf>(drafts[s].q, shape_.dk);
  if (!has_channel_decay(shape_.kind)) key_products(K_, h, T, Q_, delta, products_);  // shared by the group
  for (int g = 0; g < G; ++g) {
    WindowRecords& rec = recs_[static_cast<std::size_t>(g)];
    const StateMatrix& S_ckpt = checkpoint_for(g, flush);
    if (fold) {
      // S <- REPLAY(S, B[1:h]) from the loaded checkpoint. Split GDN/KDA: u_j^HP recomputed
      // (rec.U rows 0..h-1 now hold them, so the outputs below use the HP corrections too).
      S_ = S_ckpt;
      replay(shape_.kind, S_, K_, rec, h, (split() && delta) ? 0 : h, rs_);
    }
    output_only(shape_.kind, S_ckpt, K_, rec, h, T, Q_, &products_, O_, oo_);  // O <- OUTPUTONLY(S, B[1:h+T], Q)
    for (int s = 0; s < T; ++s) {
      Eigen::Map<Eigen::RowVectorXf>(out + (static_cast<std::ptrdiff_t>(s) * G + g) * dv, dv) = O_.row(s);
      if (delta) ring_.set_u(h + s, g, rec.U.row(h + s));
    }
    if (fold) write_checkpoints(g, S_);  // after OUTPUTONLY read the old checkpoint
  }
  if (fold) {  // drop B[1:h]; h <- 0
    ++flushes_;
    ring_.drop_front(h);
    h_ = 0;
  }
  pending_ = T;
}

void ReplayDecoderBase::commit(int accepted) {
  if (pending_ == 0) throw std::logic_error("ReplayDecoder::commit: no drafts to commit");
  if (accepted < 1 || accepted > pending_)
    throw std::invalid_argument(
        fmt::format("ReplayDecoder::commit: accepted length {} outside [1, {}]", accepted, pending_));
  ring_.commit(h_, accepted);
  ring_.release(h_ + accepted, pending_ - accepted);  // rejected: left past h, overwritten next call
  h_ += accepted;
  tokens_ += accepted;
  pending_ = 0;
}

// ---- the two schemes -------------------------------------------------------------------------

namespace {
const PrecisionPolicy& require_scheme(const PrecisionPolicy& p, DecodeScheme s, const char* who) {
  if (p.scheme != s)
    throw std::invalid_argument(fmt::format("{} needs a {} policy, got '{}'", who,
                                            s == DecodeScheme::shared ? "shared" : "split", p.to_string()));
  return p;
}
}  // namespace

ReplayDecoder::ReplayDecoder(const HeadGroupShape& shape, const PrecisionPolicy& policy, HeadGroupId id,
                             const ReplayDecoderOptions& options)
    : ReplayDecoderBase(shape, require_scheme(policy, DecodeScheme::shared, "ReplayDecoder"), id, options) {}

SplitPrecisionReplayDecoder::SplitPrecisionReplayDecoder(const HeadGroupShape& shape, const PrecisionPolicy& policy,
                                                         HeadGroupId id, const ReplayDecoderOptions& options)
    : ReplayDecoderBase(shape, require_scheme(policy, DecodeScheme::split, "SplitPrecisionReplayDecoder"), id,
                        options) {}

std::unique_ptr<HeadGroupDecoder> make_decoder(const HeadGroupShape& shape, const PrecisionPolicy& policy,
                                               HeadGroupId id, const ReplayDecoderOptions& options) {
  switch (policy.scheme) {
    case DecodeScheme::conventional: return std::make_unique<ConventionalDecoder>(shape, policy, id);
    case DecodeScheme::shared: return std::make_unique<ReplayDecoder>(shape, policy, id, options);
    case DecodeScheme::split: return std::make_unique<SplitPrecisionReplayDecoder>(shape, policy, id, options);
  }
  throw std::invalid_argument("make_decoder: unknown scheme");
}

}  // namespace replayssm::ssm
