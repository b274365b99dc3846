// A small but real TeacherForcedModel for the KL-sweep tests: token embedding -> one Mamba-2 head
// group (one key head, G value heads) run through ssm::emulate_sequence under the policy -> output
// projection with a residual -> RMS norm -> linear LM head -> log_softmax. Weights are random
// (Boost.Random, fixed seed). The recurrence is the only place the policy enters, exactly as in a
// real hybrid model, so low-precision state changes the distributions and an overflowing state
// (large values under fp16+rtn) turns them into NaN.
//
// Test hooks: forward_calls() counts final_hidden calls (resume must skip finished work), and
// fail_after_forwards(k) makes the (k+1)-th final_hidden throw, like a run killed mid-sweep.
#pragma once
#include <boost/random/mersenne_twister.hpp>
#include <boost/random/normal_distribution.hpp>
#include <boost/random/uniform_real_distribution.hpp>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "model/teacher_forced_model.h"
#include "io/text_source.h"
#include "ssm/sequence_emulator.h"

namespace replayssm::test {

class TinySsmModel final : public model::TeacherForcedModel {
 public:
  struct Shape {
    int vocab = 48, hidden = 24, dk = 128, dv = 16, value_heads = 2;
    float v_scale = 1.0f;                  // scales v: large values overflow fp16 states
    float decay_lo = 0.90f, decay_hi = 0.999f;  // per-token decays drawn from an input-dependent gate
    uint64_t seed = 7;
  };

  explicit TinySsmModel(Shape s) : s_(s) {
    boost::random::mt19937_64 rng(s.seed);
    boost::random::normal_distribution<float> normal(0.0f, 1.0f);
    const auto fill = [&](std::vector<float>& w, std::size_t n, float scale) {
      w.resize(n);
      for (auto& x : w) x = scale * normal(rng);
    };
    const auto d = static_cast<std::size_t>(s.hidden), V = static_cast<std::size_t>(s.vocab),
               dk = static_cast<std::size_t>(s.dk), dv = static_cast<std::size_t>(s.dv),
               G = static_cast<std::size_t>(s.value_heads);
    fill(embed_, V * d, 1.0f);
    fill(wq_, dk * d, 1.0f / std::sqrt(float(d * dk)));
    fill(wk_, dk * d, 1.0f / std::sqrt(float(d * dk)));
    fill(wv_, G * dv * d, 1.0f / std::sqrt(float(d)));
    fill(wa_, G * d, 1.0f / std::sqrt(float(d)));
    fill(wo_, d * G * dv, 1.0f / std::sqrt(float(G * dv)));
    fill(lm_, V * d, 2.0f / std::sqrt(float(d)));
    std::string bytes;
    for (const auto* w : {&embed_, &wq_, &wk_, &wv_, &wa_, &wo_, &lm_})
      bytes.append(reinterpret_cast<const char*>(w->data()), w->size() * sizeof(float));
    bytes += fmt::format("{} {} {} {}", s.v_scale, s.decay_lo, s.decay_hi, s.seed);
    hash_ = io::hex64(io::fnv1a64(bytes));
  }

  int vocab_size() const override { return s_.vocab; }
  int hidden_size() const override { return s_.hidden; }
  std::string description() const override {
    return fmt::format("tiny mamba2 test model (vocab {}, hidden {}, dk {}, dv {}, {} value heads)", s_.vocab,
                       s_.hidden, s_.dk, s_.dv, s_.value_heads);
  }
  std::string content_hash() const override { return hash_; }

  model::RowMatrixXf final_hidden(std::span<const int32_t> tokens, const ssm::PrecisionPolicy& policy) override {
    if (fail_after_ >= 0 && forward_calls_ >= fail_after_)
      throw std::runtime_error("simulated interruption of the sweep");
    ++forward_calls_;
    const int n = static_cast<int>(tokens.size()), d = s_.hidden, dk = s_.dk, dv = s_.dv, G = s_.value_heads;
    std::vector<float> x(static_cast<std::size_t>(n) * d), q(static_cast<std::size_t>(n) * dk),
        k(static_cast<std::size_t>(n) * dk);
    std::vector<std::vector<float>> alpha(G, std::vector<float>(n)), v(G, std::vector<float>(static_cast<std::size_t>(n) * dv));
    for (int t = 0; t < n; ++t) {
      const int32_t tok = tokens[static_cast<std::size_t>(t)];
      if (tok < 0 || tok >= s_.vocab) throw std::invalid_argument(fmt::format("token {} outside the vocabulary", tok));
      const float* e = &embed_[static_cast<std::size_t>(tok) * d];
      std::memcpy(&x[static_cast<std::size_t>(t) * d], e, sizeof(float) * static_cast<std::size_t>(d));
      matvec(wq_, e, dk, d, &q[static_cast<std::size_t>(t) * dk]);
      matvec(wk_, e, dk, d, &k[static_cast<std::size_t>(t) * dk]);
      for (int g = 0; g < G; ++g) {
        matvec(&wv_[static_cast<std::size_t>(g) * dv * d], e, dv, d, &v[g][static_cast<std::size_t>(t) * dv]);
        for (int j = 0; j < dv; ++j) v[g][static_cast<std::size_t>(t) * dv + j] *= s_.v_scale;
        float a = 0;
        for (int i = 0; i < d; ++i) a += wa_[static_cast<std::size_t>(g) * d + i] * e[i];
        const float gate = 1.0f / (1.0f + std::exp(-a));
        alpha[g][static_cast<std::size_t>(t)] = s_.decay_lo + (s_.decay_hi - s_.decay_lo) * gate;
      }
    }
    ssm::HeadGroupSequence seq;
    seq.kind = ssm::Recurrence::mamba2;
    seq.n_tokens = n;
    seq.dk = dk;
    seq.dv = dv;
    seq.n_value_heads = G;
    seq.q = q.data();
    seq.k = k.data();
    std::vector<std::vector<float>> out(G, std::vector<float>(static_cast<std::size_t>(n) * dv));
    std::vector<float*> outp;
    for (int g = 0; g < G; ++g) {
      seq.alpha.push_back(alpha[g].data());
      seq.v.push_back(v[g].data());
      outp.push_back(out[g].data());
    }
    ssm::emulate_sequence(seq, policy, ssm::HeadGroupId{0, 0}, outp);

    model::RowMatrixXf h(n, d);
    std::vector<float> cat(static_cast<std::size_t>(G) * dv);
    for (int t = 0; t < n; ++t) {
      for (int g = 0; g < G; ++g)
        for (int j = 0; j < dv; ++j)
          cat[static_cast<std::size_t>(g) * dv + j] = out[g][static_cast<std::size_t>(t) * dv + j] / s_.v_scale;
      std::vector<float> y(static_cast<std::size_t>(d));
      matvec(wo_, cat.data(), d, G * dv, y.data());
      double ss = 0;
      for (int i = 0; i < d; ++i) {
        y[static_cast<std::size_t>(i)] += x[static_cast<std::size_t>(t) * d + i];
        ss += double(y[static_cast<std::size_t>(i)]) * y[static_cast<std::size_t>(i)];
      }
      const float inv = static_cast<float>(1.0 / std::sqrt(ss / d + 1e-6));
      for (int i = 0; i < d; ++i) h(t, i) = y[static_cast<std::size_t>(i)] * inv;
    }
    return h;
  }

  model::RowMatrixXf log_probs(const Eigen::Ref<const model::RowMatrixXf>& hidden_rows) override {
    ++log_probs_calls_;
    const int V = s_.vocab, d = s_.hidden;
    if (hidden_rows.cols() != d) throw std::invalid_argument("log_probs: wrong hidden width");
    model::RowMatrixXf lp(hidden_rows.rows(), V);
    for (Eigen::Index r = 0; r < hidden_rows.rows(); ++r) {
      float m = -INFINITY;
      for (int v = 0; v < V; ++v) {
        float z = 0;
        for (int i = 0; i < d; ++i) z += lm_[static_cast<std::size_t>(v) * d + i] * hidden_rows(r, i);
        lp(r, v) = z;
        m = std::max(m, z);
      }
      if (!std::isfinite(m)) {  // NaN/Inf hidden state: log_softmax is NaN, as in a real framework
        for (int v = 0; v < V; ++v) lp(r, v) = NAN;
        continue;
      }
      double s = 0;
      for (int v = 0; v < V; ++v) s += std::exp(double(lp(r, v)) - m);
      const float lse = m + static_cast<float>(std::log(s));
      for (int v = 0; v < V; ++v) lp(r, v) -= lse;
    }
    return lp;
  }

  int forward_calls() const { return forward_calls_; }
  int log_probs_calls() const { return log_probs_calls_; }
  void fail_after_forwards(int k) { fail_after_ = k; }
  void reset_counters() {
    forward_calls_ = 0;
    log_probs_calls_ = 0;
    fail_after_ = -1;
  }

 private:
  static void matvec(const std::vector<float>& w, const float* x, int rows, int cols, float* y) {
    matvec(w.data(), x, rows, cols, y);
  }
  static void matvec(const float* w, const float* x, int rows, int cols, float* y) {
    for (int r = 0; r < rows; ++r) {
      float s = 0;
      for (int c = 0; c < cols; ++c) s += w[static_cast<std::size_t>(r) * cols + c] * x[c];
      y[r] = s;
    }
  }

  Shape s_;
  std::vector<float> embed_, wq_, wk_, wv_, wa_, wo_, lm_;
  std::string hash_;
  int forward_calls_ = 0, log_probs_calls_ = 0, fail_after_ = -1;
};

}  // namespace replayssm::test
