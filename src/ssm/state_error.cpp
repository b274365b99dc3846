#include "ssm/state_error.h"

#include <cmath>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

#include "ssm/state_quantizer.h"

namespace replayssm::ssm {

namespace {

struct Moments {  // sums over elements of x and x^2
  double sum = 0.0, sum2 = 0.0;
  int64_t n = 0;
  void add(double x) {
    sum += x;
    sum2 += x * x;
    ++n;
  }
  double mean() const { return n ? sum / static_cast<double>(n) : 0.0; }
  double ms() const { return n ? sum2 / static_cast<double>(n) : 0.0; }
  double var() const { return n ? ms() - mean() * mean() : 0.0; }
};

// sigma^2 / (1 - g2) + (b / (1 - g1))^2, +inf where a window does not decay at all.
double accumulated(double var, double bias, double g1, double g2) {
  if (g1 >= 1.0 || g2 >= 1.0) return var + bias * bias > 0 ? std::numeric_limits<double>::infinity() : 0.0;
  return var / (1.0 - g2) + (bias / (1.0 - g1)) * (bias / (1.0 - g1));
}
double coherent(double var, double bias, double g1) {
  if (g1 >= 1.0) return var + bias * bias > 0 ? std::numeric_limits<double>::infinity() : 0.0;
  return (var + bias * bias) / ((1.0 - g1) * (1.0 - g1));
}

}  // namespace

void check_state_error_policy(const PrecisionPolicy& policy) {
  if (policy.scheme == DecodeScheme::conventional)
    throw std::invalid_argument(fmt::format("state error: policy {} is conventional; give a shared or split policy "
                                            "(the stored checkpoint's error is measured at flushes)",
                                            policy.to_string()));
  if (policy.is_fp32_exact())
    throw std::invalid_argument(fmt::format("state error: policy {} stores FP32: there is no error to measure",
                                            policy.to_string()));
  if (policy.uses_rounding(formats::Rounding::ef))
    throw std::invalid_argument(fmt::format(
        "state error: policy {} rounds by error feedback (+ef), which the appendix C.6 model (one RTN or SR rounding "
        "of the exact state per flush) does not describe; use +rtn or +sr",
        policy.to_string()));
  if (policy.skip.mode != CheckpointSkip::Mode::off)
    throw std::invalid_argument(fmt::format(
        "state error: policy {} skips checkpoint reads (appendix F), which the appendix C.6 model does not describe; "
        "drop ',skip='",
        policy.to_string()));
}

std::vector<HeadStateError> measure_state_error(const HeadGroupSequence& seq, const PrecisionPolicy& policy,
                                                HeadGroupId id) {
  check_state_error_policy(policy);
  const int L = policy.window, G = seq.n_value_heads;
  const int64_t n = seq.n_tokens, events = n / L;
  if (events < 2)
    throw std::invalid_argument(fmt::format("state error: {} tokens hold {} flushes of window {}; at least 2 needed", n,
                                            events, L));
  const std::size_t size = static_cast<std::size_t>(seq.dv) * static_cast<std::size_t>(seq.dk);
  const bool split = policy.scheme == DecodeScheme::split;
  const StateFormat& read_format = split ? policy.read : policy.recur;

  // The exact states at the flush tokens (e + 1) L - 1.
  std::vector<std::vector<float>> ref(static_cast<std::size_t>(G), std::vector<float>(static_cast<std::size_t>(events) * size));
  std::vector<std::vector<float>> outs(static_cast<std::size_t>(G), std::vector<float>(static_cast<std::size_t>(n) * seq.dv));
  std::vector<float*> out_ptrs;
  for (auto& o : outs) out_ptrs.push_back(o.data());
  EmulatorOptions options;
  options.max_threads = 1;
  options.on_checkpoint = [&](int j, int64_t token, const float* state, const float*) {
    if ((token + 1) % L != 0 || (token + 1) / L > events) return;
    const std::size_t e = static_cast<std::size_t>((token + 1) / L - 1);
    std::copy(state, state + size, ref[static_cast<std::size_t>(j)].begin() + static_cast<std::ptrdiff_t>(e * size));
  };
  emulate_sequence(seq, PrecisionPolicy::parse("conv:fp32"), id, out_ptrs, options);

  std::vector<HeadStateError> result(static_cast<std::size_t>(G));
  std::vector<Moments> d_read(static_cast<std::size_t>(G)), d_recur(static_cast<std::size_t>(G)),
      state(static_cast<std::size_t>(G));
  StateMatrix rounded(seq.dv, seq.dk);
  // gamma_e per head over each window [e L, (e + 1) L) that ends at flush e (KDA: every channel).
  // KDA decays column c of S (S Diag(a)), so its error D carries column by column, each with its own
  // gamma: the model is applied per column and averaged. (With gamma averaged over the channels
  // first, 1 / (1 - E[gamma^2]) is below the mean of 1 / (1 - E[gamma_c^2]) (Jensen), and the model
  // under-predicts a head whose few slow channels hold most of the error.)
  const int width = seq.kind == Recurrence::kda ? seq.dk : 1;
  const auto column = [&](std::size_t i) { return width == 1 ? 0 : static_cast<int>(i % static_cast<std::size_t>(seq.dk)); };
  // One rounding's moments per head and decay column.
  std::vector<std::vector<Moments>> r_read(static_cast<std::size_t>(G), std::vector<Moments>(static_cast<std::size_t>(width))),
      r_recur = r_read;
  std::vector<std::vector<double>> gamma(static_cast<std::size_t>(G));
  for (int j = 0; j < G; ++j) {
    const float* a = seq.alpha[static_cast<std::size_t>(j)];
    auto& gj = gamma[static_cast<std::size_t>(j)];
    gj.resize(static_cast<std::size_t>(events * width));
    for (int64_t e = 0; e < events; ++e)
      for (int c = 0; c < width; ++c) {
        double log_gamma = 0.0;
        for (int64_t t = e * L; t < (e + 1) * L; ++t) log_gamma += std::log(static_cast<double>(a[t * width + c]));
        gj[static_cast<std::size_t>(e * width + c)] = std::exp(log_gamma);
      }
  }
  // The realized rounding errors of the recur copy (Mamba-2: D is carried exactly by gamma).
  const bool realized = seq.kind == Recurrence::mamba2;
  std::vector<std::vector<double>> previous_d(static_cast<std::size_t>(G), std::vector<double>(size, 0.0));
  std::vector<Moments> r_real(static_cast<std::size_t>(G));
  std::vector<double> cross(static_cast<std::size_t>(G), 0.0);
  options.on_checkpoint = [&](int j, int64_t token, const float* recur, const float* read) {
    const int64_t e = (token + 1) / L - 1;
    const auto ju = static_cast<std::size_t>(j);
    const float* S = ref[ju].data() + static_cast<std::size_t>(e) * size;
    const float* stored = read ? read : recur;
    if (e >= events / 2) {
      ++result[ju].steady_events;
      for (std::size_t i = 0; i < size; ++i) {
        d_read[ju].add(static_cast<double>(stored[i]) - S[i]);
        d_recur[ju].add(static_cast<double>(recur[i]) - S[i]);
        state[ju].add(S[i]);
      }
    }
    ++result[ju].events;
    if (realized) {
      const double g = gamma[ju][static_cast<std::size_t>(e)];
      std::vector<double>& prev = previous_d[ju];
      for (std::size_t i = 0; i < size; ++i) {
        const double d = static_cast<double>(recur[i]) - S[i];
        if (e >= events / 2 && e > 0) {
          const double r = d - g * prev[i];
          r_real[ju].add(r);
          cross[ju] += g * prev[i] * r;
        }
        prev[i] = d;
      }
    }
    if (e < events / 2) return;
    // One rounding of the exact state, on the stream the policy's own rounding used at this flush.
    const auto round_once = [&](const StateFormat& f, CheckpointCopy copy, std::vector<Moments>& m) {
      if (f.format == formats::StorageFormat::fp32) return;
      rounded = Eigen::Map<const StateMatrix>(S, seq.dv, seq.dk);
      quantize_state(rounded, f, policy.seed, id, j, copy, static_cast<uint64_t>(e));
      for (std::size_t i = 0; i < size; ++i)
        m[static_cast<std::size_t>(column(i))].add(static_cast<double>(rounded.data()[i]) - S[i]);
    };
    round_once(read_format, split ? CheckpointCopy::read : CheckpointCopy::recur, r_read[ju]);
    if (split) round_once(policy.recur, CheckpointCopy::recur, r_recur[ju]);
  };
  emulate_sequence(seq, policy, id, out_ptrs, options);

  for (int j = 0; j < G; ++j) {
    const auto ju = static_cast<std::size_t>(j);
    HeadStateError& h = result[ju];
    h.value_head = static_cast<int>(id.key_head) * G + j;
    Moments g;
    std::vector<Moments> g_column(static_cast<std::size_t>(width));
    for (std::size_t i = 0; i < gamma[ju].size(); ++i) {
      g.add(gamma[ju][i]);
      g_column[i % static_cast<std::size_t>(width)].add(gamma[ju][i]);
    }
    h.mean_gamma = g.mean();
    h.mean_gamma2 = g.ms();
    h.state_ms = state[ju].ms();
    h.measured_ms = d_read[ju].ms();
    h.measured_bias = d_read[ju].mean();
    h.recur_measured_ms = d_recur[ju].ms();
    Moments read_all, recur_all;  // the head's one-rounding moments over all its elements
    for (int c = 0; c < width; ++c) {
      const Moments& a = r_read[ju][static_cast<std::size_t>(c)];
      const Moments& b = r_recur[ju][static_cast<std::size_t>(c)];
      read_all.sum += a.sum, read_all.sum2 += a.sum2, read_all.n += a.n;
      recur_all.sum += b.sum, recur_all.sum2 += b.sum2, recur_all.n += b.n;
    }
    h.rounding_bias = read_all.mean();
    h.rounding_var = read_all.var();
    h.recur_rounding_bias = recur_all.mean();
    h.recur_rounding_var = recur_all.var();
    // The accumulated and coherent terms of one rounding `m` per column, averaged over the columns
    // (one column, the whole head, for Mamba-2 and GDN).
    const auto per_column = [&](const std::vector<Moments>& m, bool coherent_bound) {
      double sum = 0.0;
      for (int c = 0; c < width; ++c) {
        const Moments& r = m[static_cast<std::size_t>(c)];
        const Moments& gc = g_column[static_cast<std::size_t>(c)];
        sum += coherent_bound ? coherent(r.var(), r.mean(), gc.mean()) : accumulated(r.var(), r.mean(), gc.mean(), gc.ms());
      }
      return sum / width;
    };
    if (realized) {
      h.realized_bias = r_real[ju].mean();
      h.realized_var = r_real[ju].var();
      h.realized_cross = r_real[ju].n ? cross[ju] / static_cast<double>(r_real[ju].n) : 0.0;
      // split: the read copy's one rounding on top of the recur copy's carried error
      h.realized_predicted_ms = accumulated(h.realized_var, h.realized_bias, h.mean_gamma, h.mean_gamma2) +
                                (split ? h.rounding_var + h.rounding_bias * h.rounding_bias : 0.0);
    } else {
      h.realized_bias = h.realized_var = h.realized_cross = h.realized_predicted_ms =
          std::numeric_limits<double>::quiet_NaN();
    }
    if (split) {
      const double one = h.rounding_var + h.rounding_bias * h.rounding_bias;
      h.predicted_ms = one + per_column(r_recur[ju], false);
      h.coherent_ms = one + per_column(r_recur[ju], true);
    } else {
      h.predicted_ms = per_column(r_read[ju], false);
      h.coherent_ms = per_column(r_read[ju], true);
    }
    // The model with gamma averaged over the head's channels (= predicted_ms for Mamba-2 and GDN).
    h.channel_mean_predicted_ms =
        (split ? h.rounding_var + h.rounding_bias * h.rounding_bias : 0.0) +
        (split ? accumulated(h.recur_rounding_var, h.recur_rounding_bias, h.mean_gamma, h.mean_gamma2)
               : accumulated(h.rounding_var, h.rounding_bias, h.mean_gamma, h.mean_gamma2));
  }
  return result;
}

}  // namespace replayssm::ssm
