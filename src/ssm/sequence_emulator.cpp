// The teacher-forced emulator: O(1) (conventional, shared) or O(2) (split) state passes per
// token and value head, no allocation inside the token loop. Value heads are independent here
// (the K^T Q sharing of the literal decoders has no counterpart when states are kept running),
// so each worker thread runs whole value heads through the whole sequence.
#include "ssm/sequence_emulator.h"

#include <algorithm>
#include <exception>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "ssm/recurrence.h"
#include "ssm/state_quantizer.h"

namespace replayssm::ssm {

namespace {

// The policy's conditions on a sequence of n_tokens with dv x dk states (shared by both entry points).
void check_policy_for_sequence(const char* who, const PrecisionPolicy& policy, int n_tokens, int dv, int dk) {
  if (policy.window < 1) throw std::invalid_argument(fmt::format("{}: window L = {} < 1", who, policy.window));
  if (policy.scheme == DecodeScheme::conventional && policy.window != 1)
    throw std::invalid_argument(fmt::format("{}: conventional decode is window 1, got {}", who, policy.window));
  if (policy.scheme == DecodeScheme::conventional && policy.skip.mode != CheckpointSkip::Mode::off)
    throw std::invalid_argument(fmt::format("{}: conventional decode has no checkpoint read to skip", who));
  if (policy.skip.mode == CheckpointSkip::Mode::fixed && !(policy.skip.threshold > 0.0f && policy.skip.threshold < 1.0f))
    throw std::invalid_argument(
        fmt::format("{}: skip threshold {} is outside (0, 1)", who, policy.skip.threshold));
  check_state_format(policy.recur, dv, dk);
  if (policy.scheme == DecodeScheme::split) check_state_format(policy.read, dv, dk);
  const uint64_t events = quantization_events(policy, n_tokens);
  if (events > kMaxStreamEvents)
    throw std::invalid_argument(
        fmt::format("{}: {} quantization events exceed the SR stream's {}", who, events, kMaxStreamEvents));
}

void validate(const HeadGroupSequence& in, const PrecisionPolicy& policy, const std::vector<float*>& out) {
  check_shape({in.kind, in.dk, in.dv, in.n_value_heads});
  const std::size_t G = static_cast<std::size_t>(in.n_value_heads);
  if (in.n_tokens < 0) throw std::invalid_argument(fmt::format("emulate_sequence: n_tokens = {} < 0", in.n_tokens));
  if (in.n_tokens > 0 && (in.q == nullptr || in.k == nullptr))
    throw std::invalid_argument("emulate_sequence: q and k must be given");
  if (in.alpha.size() != G || in.v.size() != G)
    throw std::invalid_argument(fmt::format("emulate_sequence: {} value heads but {} alpha and {} v pointers", G,
                                            in.alpha.size(), in.v.size()));
  if (has_delta_rule(in.kind) ? in.beta.size() != G : !in.beta.empty())
    throw std::invalid_argument(fmt::format("emulate_sequence: {} takes {} beta pointers, got {}",
                                            to_string(in.kind), has_delta_rule(in.kind) ? G : 0, in.beta.size()));
  if (out.size() != G)
    throw std::invalid_argument(fmt::format("emulate_sequence: {} value heads but {} outputs", G, out.size()));
  for (std::size_t g = 0; g < G; ++g)
    if (in.n_tokens > 0 && (in.alpha[g] == nullptr || in.v[g] == nullptr || out[g] == nullptr ||
                            (has_delta_rule(in.kind) && in.beta[g] == nullptr)))
      throw std::invalid_argument(fmt::format("emulate_sequence: null pointer for value head {}", g));
  check_policy_for_sequence("emulate_sequence", policy, in.n_tokens, in.dv, in.dk);
}

// Tasks 0..n-1, task g on worker g % threads (the calling thread alone when threads <= 1); the
// first exception of a worker is rethrown after all have joined.
void run_tasks(int n, int threads, const std::function<void(int)>& task) {
  if (threads <= 1) {
    for (int g = 0; g < n; ++g) task(g);
    return;
  }
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(threads));
  for (int i = 0; i < threads; ++i) {
    pool.emplace_back([&, i] {
      try {
        for (int g = i; g < n; g += threads) task(g);
      } catch (...) {
        errors[static_cast<std::size_t>(i)] = std::current_exception();
      }
    });
  }
  for (auto& th : pool) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// One value head through the whole sequence.
class HeadEmulator {
 public:
  HeadEmulator(const HeadGroupSequence& in, const PrecisionPolicy& policy, HeadGroupId id, int g, float* out,
               const EmulatorOptions& options)
      : in_(in), policy_(policy), id_(id), g_(g), out_(out), options_(options) {
    const int w = decay_width(in.kind, in.dk);
    S_ = StateMatrix::Zero(in.dv, in.dk);
    if (policy.scheme == DecodeScheme::split) S_recur_ = StateMatrix::Zero(in.dv, in.dk);
    E_recur_ = error_feedback_residual(policy.recur, in.dv, in.dk);
    if (policy.scheme == DecodeScheme::split) E_read_ = error_feedback_residual(policy.read, in.dv, in.dk);
    if (policy.skip.mode != CheckpointSkip::Mode::off) {
      W_ = StateMatrix::Zero(in.dv, in.dk);
      gamma_ = Vector::Ones(w);
    }
    a_.resize(w);
    v_.resize(in.dv);
    k_.resize(in.dk);
    q_.resize(in.dk);
    u_.resize(in.dv);
    o_.resize(in.dv);
  }

  void run() {
    const int L = policy_.window, w = decay_width(in_.kind, in_.dk);
    const bool delta = has_delta_rule(in_.kind);
    int h = 0;
    uint64_t event = 0;
    for (int t = 0; t < in_.n_tokens; ++t) {
      k_ = Eigen::Map<const Vector>(in_.k + static_cast<std::ptrdiff_t>(t) * in_.dk, in_.dk);
      q_ = Eigen::Map<const Vector>(in_.q + static_cast<std::ptrdiff_t>(t) * in_.dk, in_.dk);
      a_ = Eigen::Map<const Vector>(in_.alpha[g_] + static_cast<std::ptrdiff_t>(t) * w, w);
      v_ = Eigen::Map<const Vector>(in_.v[g_] + static_cast<std::ptrdiff_t>(t) * in_.dv, in_.dv);
      const float beta = delta ? in_.beta[g_][t] : 0.0f;
      switch (policy_.scheme) {
        case DecodeScheme::conventional:
          plain_step(in_.kind, S_, a_, beta, v_, k_, u_, scratch_);
          state_output(S_, q_, o_);
          quantize_state(S_, policy_.recur, policy_.seed, id_, g_, CheckpointCopy::recur, event, E_recur_);
          notify(t, S_, nullptr);
          ++event;
          break;
        case DecodeScheme::shared: {
          plain_step(in_.kind, S_, a_, beta, v_, k_, u_, scratch_);  // S_run (GDN: u from S_run)
          const bool flush = ++h == L;
          const bool skip = skip_read(beta, flush, policy_.recur, policy_.recur);
          state_output(skip ? W_ : S_, q_, o_);
          if (flush) {  // the checkpoint is Q(S_run) (skipped: Q(W)); the next window starts from it
            if (skip) S_ = W_;
            quantize_state(S_, policy_.recur, policy_.seed, id_, g_, CheckpointCopy::recur, event, E_recur_);
            notify(t, S_, nullptr);
            ++event;
            h = 0;
            start_window();
          }
          break;
        }
        case DecodeScheme::split:
          if (++h < L) {  // non-flush: output from the LP running state; the HP one keeps pace
            plain_step(in_.kind, S_, a_, beta, v_, k_, u_, scratch_);
            const bool skip = skip_read(beta, false, policy_.read, policy_.recur);
            state_output(skip ? W_ : S_, q_, o_);
            plain_step(in_.kind, S_recur_, a_, beta, v_, k_, u_, scratch_);
          } else {  // flush: output and both new checkpoints from the recur (HP) running state
            plain_step(in_.kind, S_recur_, a_, beta, v_, k_, u_, scratch_);
            if (skip_read(beta, true, policy_.read, policy_.recur)) S_recur_ = W_;  // a pure write
            state_output(S_recur_, q_, o_);
            S_ = S_recur_;
            quantize_state(S_, policy_.read, policy_.seed, id_, g_, CheckpointCopy::read, event, E_read_);
            quantize_state(S_recur_, policy_.recur, policy_.seed, id_, g_, CheckpointCopy::recur, event, E_recur_);
            notify(t, S_recur_, &S_);
            ++event;
            h = 0;
            start_window();
          }
          break;
      }
      Eigen::Map<Vector>(out_ + static_cast<std::ptrdiff_t>(t) * in_.dv, in_.dv) = o_;
    }
    if (skipping() && options_.on_skip_counts) options_.on_skip_counts(g_, counts_);
  }

 private:
  bool skipping() const { return policy_.skip.mode != CheckpointSkip::Mode::off; }

  // Appendix F: steps W = REPLAY(0, B[1:h]) and gamma_h by this token, then says whether this
  // step skips the checkpoint read: non-flush steps read `read` (split: the LP copy), flushes
  // `recur`. Counts the decision. False, and nothing stepped, without ',skip='.
  bool skip_read(float beta, bool flush, const StateFormat& read, const StateFormat& recur) {
    if (!skipping()) return false;
    plain_step(in_.kind, W_, a_, beta, v_, k_, u_, scratch_);  // GDN/KDA: u from W
    gamma_ = gamma_.cwiseProduct(a_);                          // float32, in token order
    const float threshold = policy_.skip.threshold_for(flush ? recur : read);
    const bool skip = gamma_.maxCoeff() < threshold;
    (flush ? counts_.flushes : counts_.steps) += 1;
    (flush ? counts_.flushes_skipped : counts_.steps_skipped) += skip;
    return skip;
  }

  void start_window() {
    if (!skipping()) return;
    W_.setZero();
    gamma_.setOnes();
  }

  void notify(int t, const StateMatrix& recur, const StateMatrix* read) {
    if (options_.on_checkpoint) options_.on_checkpoint(g_, t, recur.data(), read ? read->data() : nullptr);
  }

  const HeadGroupSequence& in_;
  const PrecisionPolicy& policy_;
  HeadGroupId id_;
  int g_;
  float* out_;
  const EmulatorOptions& options_;
  StateMatrix S_;     // conventional: the stored state; shared: S_run; split: the LP running state
  StateMatrix S_recur_;  // split: the recur (HP) running state
  StateMatrix E_recur_, E_read_;  // error-feedback residuals of the two copies (empty unless +ef)
  StateMatrix W_;                 // ,skip=: REPLAY(0, B[1:h]), the window's own contribution
  Vector gamma_;                  // ,skip=: the window's decay so far, per decay channel
  SkipCounts counts_;
  Vector a_, v_, k_, q_, u_, o_;
  StepScratch scratch_;
};

}  // namespace

uint64_t quantization_events(const PrecisionPolicy& policy, int n_tokens) {
  if (n_tokens <= 0) return 0;
  return policy.scheme == DecodeScheme::conventional || policy.window < 1
             ? static_cast<uint64_t>(n_tokens)
             : static_cast<uint64_t>(n_tokens / policy.window);
}

void emulate_sequence(const HeadGroupSequence& in, const PrecisionPolicy& policy, HeadGroupId id,
                      const std::vector<float*>& out) {
  emulate_sequence(in, policy, id, out, EmulatorOptions{});
}

void emulate_sequence(const HeadGroupSequence& in, const PrecisionPolicy& policy, HeadGroupId id,
                      const std::vector<float*>& out, const EmulatorOptions& options) {
  validate(in, policy, out);
  sr_stream(id, 0, CheckpointCopy::recur, 0);  // range-checks layer and key head up front
  const int G = in.n_value_heads;
  auto run_head = [&](int g) { HeadEmulator(in, policy, id, g, out[static_cast<std::size_t>(g)], options).run(); };

  // Threads only where the work pays for them (~1M state element updates per head group).
  const double work = static_cast<double>(in.n_tokens) * in.dk * in.dv * G;
  int threads = options.max_threads > 0 ? options.max_threads
                                        : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = std::min(threads, G);
  if (options.on_checkpoint || options.on_skip_counts || work < 1e6) threads = 1;
  run_tasks(G, threads, run_head);
}

// ---- one whole layer ----------------------------------------------------------------------------

void check_layer_sequence(const LayerSequence& seq, const PrecisionPolicy& policy, uint32_t layer) {
  const char* who = "emulate_layer_sequence";
  if (seq.n_key_heads < 1 || seq.n_value_heads < 1 || seq.n_value_heads % seq.n_key_heads != 0)
    throw std::invalid_argument(fmt::format("{}: {} value heads are not a positive multiple of {} key heads", who,
                                            seq.n_value_heads, seq.n_key_heads));
  const int G = seq.n_value_heads / seq.n_key_heads;
  check_shape({seq.kind, seq.dk, seq.dv, G});
  if (seq.n_tokens < 0) throw std::invalid_argument(fmt::format("{}: n_tokens = {} < 0", who, seq.n_tokens));
  check_policy_for_sequence(who, policy, seq.n_tokens, seq.dv, seq.dk);
  // The SR stream fields of the last key head (std::out_of_range, as sr_stream throws).
  sr_stream(HeadGroupId{layer, static_cast<uint32_t>(seq.n_key_heads - 1)}, G - 1, CheckpointCopy::recur, 0);
  const bool delta = has_delta_rule(seq.kind);
  if (!delta && seq.beta != nullptr)
    throw std::invalid_argument(fmt::format("{}: mamba2 takes no beta (pass nullptr)", who));
  if (seq.n_tokens == 0) return;
  const int64_t H = seq.n_value_heads, w = decay_width(seq.kind, seq.dk);
  struct Operand {
    const char* name;
    const void* ptr;
    int64_t ld, width;
  };
  const Operand operands[] = {{"q", seq.q, seq.ld_q, int64_t{seq.n_key_heads} * seq.dk},
                              {"k", seq.k, seq.ld_k, int64_t{seq.n_key_heads} * seq.dk},
                              {"alpha", seq.alpha, seq.ld_alpha, H * w},
                              {"beta", delta ? seq.beta : nullptr, seq.ld_beta, delta ? H : 0},
                              {"v", seq.v, seq.ld_v, H * seq.dv},
                              {"out", seq.out, seq.ld_out, H * seq.dv}};
  for (const Operand& o : operands) {
    if (o.width == 0) continue;  // mamba2's beta
    if (o.ptr == nullptr) throw std::invalid_argument(fmt::format("{}: {} must be given", who, o.name));
    if (o.ld < o.width)
      throw std::invalid_argument(fmt::format("{}: ld_{} = {} is below the row width {} (heads x head width)", who,
                                              o.name, o.ld, o.width));
  }
}

void emulate_layer_sequence(const LayerSequence& seq, const PrecisionPolicy& policy, uint32_t layer,
                            const EmulatorOptions& options) {
  check_layer_sequence(seq, policy, layer);
  if (seq.n_tokens == 0) return;
  const int n = seq.n_tokens, dk = seq.dk, dv = seq.dv, G = seq.n_value_heads / seq.n_key_heads;
  const int w = decay_width(seq.kind, dk);
  const bool delta = has_delta_rule(seq.kind);
  const std::size_t N = static_cast<std::size_t>(n);

  // One key head group: gather its inputs into the contiguous arrays of HeadGroupSequence, run the
  // group's emulator, scatter the outputs back (value head h = key_head * G + g).
  auto run_group = [&](int key_head) {
    std::vector<float> q(N * dk), k(N * dk);
    std::vector<std::vector<float>> alpha(G, std::vector<float>(N * w)), v(G, std::vector<float>(N * dv)),
        out(G, std::vector<float>(N * dv)), beta(delta ? G : 0, std::vector<float>(N));
    for (std::size_t t = 0; t < N; ++t) {
      const int64_t ti = static_cast<int64_t>(t);
      std::copy_n(seq.q + ti * seq.ld_q + int64_t{key_head} * dk, dk, q.begin() + t * dk);
      std::copy_n(seq.k + ti * seq.ld_k + int64_t{key_head} * dk, dk, k.begin() + t * dk);
      for (int g = 0; g < G; ++g) {
        const int64_t h = int64_t{key_head} * G + g;
        std::copy_n(seq.alpha + ti * seq.ld_alpha + h * w, w, alpha[g].begin() + t * w);
        std::copy_n(seq.v + ti * seq.ld_v + h * dv, dv, v[g].begin() + t * dv);
        if (delta) beta[g][t] = seq.beta[ti * seq.ld_beta + h];
      }
    }
    HeadGroupSequence in;
    in.kind = seq.kind;
    in.n_tokens = n;
    in.dk = dk;
    in.dv = dv;
    in.n_value_heads = G;
    in.q = q.data();
    in.k = k.data();
    std::vector<float*> outs;
    for (int g = 0; g < G; ++g) {
      in.alpha.push_back(alpha[g].data());
      in.v.push_back(v[g].data());
      if (delta) in.beta.push_back(beta[g].data());
      outs.push_back(out[g].data());
    }
    EmulatorOptions group_options;
    group_options.max_threads = 1;  // the threads run whole groups
    if (options.on_checkpoint)
      group_options.on_checkpoint = [&](int g, int64_t token, const float* recur, const float* read) {
        options.on_checkpoint(key_head * G + g, token, recur, read);
      };
    if (options.on_skip_counts)
      group_options.on_skip_counts = [&](int g, const SkipCounts& c) { options.on_skip_counts(key_head * G + g, c); };
    emulate_sequence(in, policy, HeadGroupId{layer, static_cast<uint32_t>(key_head)}, outs, group_options);
    for (std::size_t t = 0; t < N; ++t)
      for (int g = 0; g < G; ++g)
        std::copy_n(out[g].begin() + t * dv, dv,
                    seq.out + static_cast<int64_t>(t) * seq.ld_out + (int64_t{key_head} * G + g) * dv);
  };

  const int groups = seq.n_key_heads;
  int threads = options.max_threads > 0 ? options.max_threads
                                        : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = std::min(threads, groups);
  const double work = static_cast<double>(n) * dk * dv * seq.n_value_heads;
  if (options.on_checkpoint || options.on_skip_counts || work < 1e6) threads = 1;
  run_tasks(groups, threads, run_group);
}

}  // namespace replayssm::ssm
