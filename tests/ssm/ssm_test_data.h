// Shared by the tests/ssm suites: random head-group inputs (Boost.Random, fixed seeds), an
// independent float64 oracle of the three recurrences in their literal (delta-rule) form, runners
// for the decoders and the emulator, and error measures.
#pragma once
#include <boost/random/mersenne_twister.hpp>
#include <boost/random/normal_distribution.hpp>
#include <boost/random/uniform_real_distribution.hpp>
#include <cmath>
#include <cstdint>
#include <vector>

#include "ssm/decoder.h"
#include "ssm/sequence_emulator.h"
#include "test_util.h"

namespace replayssm::test {

// Inputs of one head group for n tokens, owned.
struct GroupData {
  ssm::HeadGroupShape shape;
  int n = 0;
  std::vector<float> q, k;                         // n x dk
  std::vector<std::vector<float>> alpha, beta, v;  // per value head: n (x dk for kda), n, n x dv

  ssm::HeadGroupSequence sequence() const {
    ssm::HeadGroupSequence s;
    s.kind = shape.kind;
    s.n_tokens = n;
    s.dk = shape.dk;
    s.dv = shape.dv;
    s.n_value_heads = shape.n_value_heads;
    s.q = q.data();
    s.k = k.data();
    for (int g = 0; g < shape.n_value_heads; ++g) {
      s.alpha.push_back(alpha[g].data());
      if (ssm::has_delta_rule(shape.kind)) s.beta.push_back(beta[g].data());
      s.v.push_back(v[g].data());
    }
    return s;
  }
};

// Decays uniform in [a_lo, a_hi) (per channel for kda); v ~ N(0, 1); k, q ~ N(0, 1/dk) for
// mamba2; for gdn/kda k is L2-normalised, q L2-normalised and scaled by 1/sqrt(dk) (the
// Qwen3.5 convention), b ~ U(0.05, 0.95). Never all zeros.
inline GroupData make_group_data(const ssm::HeadGroupShape& shape, int n, float a_lo, float a_hi, uint64_t seed) {
  boost::random::mt19937_64 rng(seed);
  boost::random::normal_distribution<float> normal(0.0f, 1.0f);
  boost::random::uniform_real_distribution<float> decay(a_lo, a_hi), beta(0.05f, 0.95f);
  GroupData d;
  d.shape = shape;
  d.n = n;
  const int dk = shape.dk, dv = shape.dv, G = shape.n_value_heads, w = ssm::decay_width(shape.kind, dk);
  const bool delta = ssm::has_delta_rule(shape.kind);
  d.q.resize(static_cast<std::size_t>(n) * dk);
  d.k.resize(static_cast<std::size_t>(n) * dk);
  for (int t = 0; t < n; ++t) {
    double nq = 0, nk = 0;
    float* q = &d.q[static_cast<std::size_t>(t) * dk];
    float* k = &d.k[static_cast<std::size_t>(t) * dk];
    for (int c = 0; c < dk; ++c) {
      q[c] = normal(rng);
      k[c] = normal(rng);
      nq += double(q[c]) * q[c];
      nk += double(k[c]) * k[c];
    }
    const double sq = delta ? 1.0 / (std::sqrt(nq) * std::sqrt(double(dk))) : 1.0 / std::sqrt(double(dk));
    const double sk = delta ? 1.0 / std::sqrt(nk) : 1.0 / std::sqrt(double(dk));
    for (int c = 0; c < dk; ++c) {
      q[c] = static_cast<float>(q[c] * sq);
      k[c] = static_cast<float>(k[c] * sk);
    }
  }
  d.alpha.assign(G, std::vector<float>(static_cast<std::size_t>(n) * w));
  d.v.assign(G, std::vector<float>(static_cast<std::size_t>(n) * dv));
  if (delta) d.beta.assign(G, std::vector<float>(static_cast<std::size_t>(n)));
  for (int g = 0; g < G; ++g) {
    for (auto& a : d.alpha[g]) a = decay(rng);
    for (auto& x : d.v[g]) x = normal(rng);
    if (delta)
      for (auto& b : d.beta[g]) b = beta(rng);
  }
  return d;
}

using Outputs = std::vector<std::vector<float>>;  // per value head: n x dv

inline Outputs make_outputs(const ssm::HeadGroupShape& s, int n) {
  return Outputs(static_cast<std::size_t>(s.n_value_heads), std::vector<float>(static_cast<std::size_t>(n) * s.dv));
}

// Float64 oracle: the recurrences exactly as REPLAYSSM.md section 1 writes them (delta rule in
// its original form, not the u-form the library uses).
inline std::vector<std::vector<double>> oracle_outputs(const GroupData& d) {
  const int dk = d.shape.dk, dv = d.shape.dv, G = d.shape.n_value_heads;
  const int w = ssm::decay_width(d.shape.kind, dk);
  std::vector<std::vector<double>> out(G, std::vector<double>(static_cast<std::size_t>(d.n) * dv));
  for (int g = 0; g < G; ++g) {
    std::vector<double> S(static_cast<std::size_t>(dv) * dk, 0.0), Sk(dv);
    for (int t = 0; t < d.n; ++t) {
      const float* k = &d.k[static_cast<std::size_t>(t) * dk];
      const float* q = &d.q[static_cast<std::size_t>(t) * dk];
      const float* a = &d.alpha[g][static_cast<std::size_t>(t) * w];
      const float* v = &d.v[g][static_cast<std::size_t>(t) * dv];
      switch (d.shape.kind) {
        case ssm::Recurrence::mamba2:  // S = a S + v k^T
          for (int i = 0; i < dv; ++i)
            for (int c = 0; c < dk; ++c) S[i * dk + c] = a[0] * S[i * dk + c] + double(v[i]) * k[c];
          break;
        case ssm::Recurrence::gdn: {  // S = a S (I - b k k^T) + b v k^T
          const double b = d.beta[g][t];
          for (int i = 0; i < dv; ++i) {
            double acc = 0;
            for (int c = 0; c < dk; ++c) acc += S[i * dk + c] * k[c];
            Sk[i] = acc;
          }
          for (int i = 0; i < dv; ++i)
            for (int c = 0; c < dk; ++c)
              S[i * dk + c] = a[0] * (S[i * dk + c] - b * Sk[i] * k[c]) + b * double(v[i]) * k[c];
          break;
        }
        case ssm::Recurrence::kda: {  // S = S Diag(a) (I - b k k^T) + b v k^T
          const double b = d.beta[g][t];
          for (int i = 0; i < dv; ++i)
            for (int c = 0; c < dk; ++c) S[i * dk + c] *= a[c];
          for (int i = 0; i < dv; ++i) {
            double acc = 0;
            for (int c = 0; c < dk; ++c) acc += S[i * dk + c] * k[c];
            Sk[i] = acc;
          }
          for (int i = 0; i < dv; ++i)
            for (int c = 0; c < dk; ++c) S[i * dk + c] += -b * Sk[i] * k[c] + b * double(v[i]) * k[c];
          break;
        }
      }
      for (int i = 0; i < dv; ++i) {
        double acc = 0;
        for (int c = 0; c < dk; ++c) acc += S[i * dk + c] * q[c];
        out[g][static_cast<std::size_t>(t) * dv + i] = acc;
      }
    }
  }
  return out;
}

// Runs a decoder's step() over all tokens.
inline Outputs run_steps(ssm::HeadGroupDecoder& dec, const GroupData& d) {
  const ssm::HeadGroupSequence seq = d.sequence();
  const int G = d.shape.n_value_heads, dv = d.shape.dv;
  Outputs out = make_outputs(d.shape, d.n);
  std::vector<float> o(static_cast<std::size_t>(G) * dv);
  for (int t = 0; t < d.n; ++t) {
    dec.step(ssm::token_of(seq, t), o.data());
    for (int g = 0; g < G; ++g)
      std::copy(o.begin() + g * dv, o.begin() + (g + 1) * dv, out[g].begin() + static_cast<std::ptrdiff_t>(t) * dv);
  }
  return out;
}

inline Outputs run_emulator(const GroupData& d, const ssm::PrecisionPolicy& p, ssm::HeadGroupId id = {},
                            const ssm::EmulatorOptions& options = {}) {
  Outputs out = make_outputs(d.shape, d.n);
  std::vector<float*> ptrs;
  for (auto& o : out) ptrs.push_back(o.data());
  ssm::emulate_sequence(d.sequence(), p, id, ptrs, options);
  return out;
}

// The run's relative error sqrt(sum |o - r|^2 / sum |r|^2) over tokens [t_begin, t_end) and
// every value head: a measurement printed in tables and compared between policies. Pass/fail
// checks use the comparison rule of test_util.h (compare_close with relative_to_rms).
template <class A, class B>
double run_error(const std::vector<std::vector<A>>& got, const std::vector<std::vector<B>>& ref, int dv,
                 int t_begin = 0, int t_end = -1) {
  double num = 0, den = 0;
  for (std::size_t g = 0; g < ref.size(); ++g) {
    const int n = static_cast<int>(ref[g].size()) / dv;
    const int end = t_end < 0 ? n : t_end;
    for (std::size_t i = static_cast<std::size_t>(t_begin) * dv; i < static_cast<std::size_t>(end) * dv; ++i) {
      const double r = ref[g][i], d = static_cast<double>(got[g][i]) - r;
      num += std::isfinite(d) ? d * d : INFINITY;
      den += r * r;
    }
  }
  return std::sqrt(num / den);
}

}  // namespace replayssm::test
