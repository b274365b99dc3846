// Function-level checks of recurrence.h against float64 evaluations written here:
// the plain step, REPLAY (fold) against its closed form, and OUTPUTONLY with the GDN/KDA UT
// transform against sequential decoding over the drafts.
#include <doctest/doctest.h>

#include <boost/random/mersenne_twister.hpp>
#include <boost/random/normal_distribution.hpp>
#include <boost/random/uniform_real_distribution.hpp>
#include <cmath>
#include <cstdio>
#include <vector>

#include "ssm/recurrence.h"
#include "test_util.h"

using namespace replayssm::ssm;
using replayssm::test::kBaseSeed;

namespace {

using MatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using VecD = Eigen::VectorXd;

// A window of n records for one value head with random inputs, plus T queries.
struct Window {
  Recurrence kind;
  int dk, dv, h, T;
  StateMatrix S0;
  RowMatrix K, Q;
  WindowRecords rec;
};

Window make_window(Recurrence kind, int dk, int dv, int h, int T, float a_lo, float a_hi, uint64_t seed) {
  boost::random::mt19937_64 rng(seed);
  boost::random::normal_distribution<float> normal(0.0f, 1.0f);
  boost::random::uniform_real_distribution<float> decay(a_lo, a_hi), beta(0.05f, 0.95f);
  Window w{kind, dk, dv, h, T, StateMatrix(dv, dk), RowMatrix(h + T, dk), RowMatrix(T, dk), {}};
  for (int i = 0; i < w.S0.size(); ++i) w.S0.data()[i] = 0.3f * normal(rng);
  for (int j = 0; j < h + T; ++j) {
    for (int c = 0; c < dk; ++c) w.K(j, c) = normal(rng);
    w.K.row(j).normalize();
  }
  for (int s = 0; s < T; ++s) {
    for (int c = 0; c < dk; ++c) w.Q(s, c) = normal(rng);
    w.Q.row(s) /= w.Q.row(s).norm() * std::sqrt(float(dk));
  }
  w.rec.resize(kind, h + T, dk, dv);
  for (int j = 0; j < h + T; ++j) {
    for (int c = 0; c < w.rec.alpha.cols(); ++c) w.rec.alpha(j, c) = decay(rng);
    w.rec.beta(j) = beta(rng);
    for (int i = 0; i < dv; ++i) w.rec.V(j, i) = normal(rng);
  }
  w.rec.U.setConstant(NAN);
  return w;
}

// float64 sequential decoding from S0 through all h + T records in the literal delta-rule form.
// Fills u (h + T rows: u_j = b_j (v_j - S_{j-1} (a_j . k_j)), mamba2 v_j) and the T outputs at
// window positions h+1..h+T.
void sequential_f64(const Window& w, MatD& u, MatD& out) {
  MatD S = w.S0.cast<double>();
  u.resize(w.h + w.T, w.dv);
  out.resize(w.T, w.dv);
  for (int j = 0; j < w.h + w.T; ++j) {
    const VecD k = w.K.row(j).transpose().cast<double>();
    const VecD v = w.rec.V.row(j).transpose().cast<double>();
    VecD a(w.dk);
    for (int c = 0; c < w.dk; ++c) a(c) = w.rec.alpha(j, w.kind == Recurrence::kda ? c : 0);
    const double b = w.rec.beta(j);
    const MatD SD = S * a.asDiagonal();  // S_{j-1} Diag(a_j)
    if (w.kind == Recurrence::mamba2) {
      u.row(j) = v.transpose();
      S = SD + v * k.transpose();
    } else {
      u.row(j) = (b * (v - SD * k)).transpose();
      S = SD * (MatD::Identity(w.dk, w.dk) - b * k * k.transpose()) + b * v * k.transpose();
    }
    if (j >= w.h) out.row(j - w.h) = (S * w.Q.row(j - w.h).transpose().cast<double>()).transpose();
  }
}

double rel(const MatD& got, const MatD& ref) { return (got - ref).norm() / ref.norm(); }

}  // namespace

TEST_CASE("plain step: the u-form equals the literal delta rule (float64 reference)") {
  uint64_t seed = kBaseSeed * 1000 + 200;
  for (Recurrence kind : {Recurrence::mamba2, Recurrence::gdn, Recurrence::kda}) {
    Window w = make_window(kind, 32, 16, 0, 1, 0.5f, 1.0f, ++seed);
    MatD u_ref, o_ref;
    sequential_f64(w, u_ref, o_ref);
    StateMatrix S = w.S0;
    Vector a = w.rec.alpha.row(0).transpose(), v = w.rec.V.row(0).transpose(), k = w.K.row(0).transpose(), u, o;
    StepScratch sc;
    plain_step(kind, S, a, w.rec.beta(0), v, k, u, sc);
    state_output(S, w.Q.row(0).transpose(), o);
    CAPTURE(to_string(kind));
    CHECK(rel(u.transpose().cast<double>(), u_ref.row(0)) < 1e-6);
    CHECK(rel(o.transpose().cast<double>(), o_ref.row(0)) < 1e-6);
  }
}

TEST_CASE("REPLAY: the fold equals the closed form g_h S + sum_j g_{j+1:h} u_j k_j^T") {
  uint64_t seed = kBaseSeed * 1000 + 210;
  for (Recurrence kind : {Recurrence::mamba2, Recurrence::gdn, Recurrence::kda}) {
    for (int h : {1, 7, 64}) {
      Window w = make_window(kind, 32, 16, h, 0, 0.9f, 1.0f, ++seed);
      // Corrections given (any values: REPLAY is linear in them).
      boost::random::mt19937_64 rng(++seed);
      boost::random::normal_distribution<float> normal(0.0f, 1.0f);
      for (int j = 0; j < h; ++j)
        for (int i = 0; i < w.dv; ++i) w.rec.U(j, i) = normal(rng);
      StateMatrix S = w.S0;
      ReplayScratch rs;
      replay(kind, S, w.K, w.rec, h, /*recompute_from=*/h, rs);
      // Closed form with channel-wise cumulative decays G_{j+1:h} (scalar: all channels equal).
      const RowMatrix& Uc = kind == Recurrence::mamba2 ? w.rec.V : w.rec.U;
      auto decay_from = [&](int first) {  // G_{first+1:h} in 1-based terms = prod over rows first..h-1
        VecD g = VecD::Ones(w.dk);
        for (int j = first; j < h; ++j)
          for (int c = 0; c < w.dk; ++c) g(c) *= w.rec.alpha(j, kind == Recurrence::kda ? c : 0);
        return g;
      };
      MatD ref = w.S0.cast<double>() * decay_from(0).asDiagonal();
      for (int j = 0; j < h; ++j) {
        const VecD kg = w.K.row(j).transpose().cast<double>().cwiseProduct(decay_from(j + 1));
        ref += Uc.row(j).transpose().cast<double>() * kg.transpose();
      }
      CAPTURE(to_string(kind));
      CAPTURE(h);
      CHECK(rel(S.cast<double>(), ref) < 1e-5);
    }
  }
}

TEST_CASE("OUTPUTONLY + UT transform equal sequential decoding over the drafts (float64)") {
  uint64_t seed = kBaseSeed * 1000 + 220;
  double worst_u = 0, worst_o = 0;
  for (Recurrence kind : {Recurrence::mamba2, Recurrence::gdn, Recurrence::kda}) {
    for (int h : {0, 1, 5, 16, 64}) {
      for (int T : {1, 2, 4, 8}) {
        for (float a_lo : {0.3f, 0.999f}) {
          Window w = make_window(kind, 48, 24, h, T, a_lo, a_lo < 0.5f ? 0.7f : 1.0f, ++seed);
          MatD u_ref, o_ref;
          sequential_f64(w, u_ref, o_ref);
          // The committed corrections are known (cached) before verification.
          if (h > 0) w.rec.U.topRows(h) = u_ref.topRows(h).cast<float>();
          KeyProducts kp;
          key_products(w.K, h, T, w.Q, has_delta_rule(kind), kp);
          RowMatrix O;
          OutputOnlyScratch sc;
          output_only(kind, w.S0, w.K, w.rec, h, T, w.Q, &kp, O, sc);
          CAPTURE(to_string(kind));
          CAPTURE(h);
          CAPTURE(T);
          CAPTURE(a_lo);
          const double eo = rel(O.cast<double>(), o_ref);
          CHECK(eo < 1e-5);
          worst_o = std::max(worst_o, eo);
          if (has_delta_rule(kind)) {
            const double eu = rel(w.rec.U.middleRows(h, T).cast<double>(), u_ref.middleRows(h, T));
            CHECK(eu < 1e-5);  // U_d from one unit-triangular solve = sequential corrections
            worst_u = std::max(worst_u, eu);
          }
        }
      }
    }
  }
  std::printf("\n[UT transform] vs float64 sequential: drafts' corrections %.2e, outputs %.2e (relative, Frobenius)\n",
              worst_u, worst_o);
}
