#include "ssm/recurrence.h"

#include <stdexcept>

#include <Eigen/Dense>
#include <fmt/format.h>

#include "ssm/canonical_dot.h"

namespace replayssm::ssm {

Recurrence parse_recurrence(std::string_view text) {
  for (Recurrence r : {Recurrence::mamba2, Recurrence::gdn, Recurrence::kda})
    if (text == to_string(r)) return r;
  throw std::invalid_argument(fmt::format("unknown recurrence '{}': expected mamba2, gdn or kda", text));
}

void check_shape(const HeadGroupShape& shape) {
  if (shape.dk < 1 || shape.dv < 1)
    throw std::invalid_argument(fmt::format("head dims must be positive, got dk={} dv={}", shape.dk, shape.dv));
  if (shape.n_value_heads < 1 || shape.n_value_heads > (1 << kStreamValueHeadBits))
    throw std::invalid_argument(fmt::format("value heads per key head must be in [1, {}], got {}",
                                            1 << kStreamValueHeadBits, shape.n_value_heads));
}

// ---- plain recurrence ------------------------------------------------------------------------

// S k, S (a . k) and S q take one canonical dot product per row (ssm/canonical_dot.h): the order the
// CUDA scan kernels reproduce, independent of the host's vector width. Element-wise operations
// are written out in the order the kernels use (no contraction on either side).
namespace {
void canonical_rows_times(const StateMatrix& S, const float* x, Vector& out) {
  const int rows = static_cast<int>(S.rows()), cols = static_cast<int>(S.cols());
  out.resize(rows);
  for (int i = 0; i < rows; ++i) out(i) = canonical_dot(S.data() + static_cast<std::ptrdiff_t>(i) * cols, x, cols);
}
}  // namespace

void correction(Recurrence kind, const StateMatrix& S, const Vector& alpha, float beta, const Vector& v,
                const Vector& k, Vector& u, StepScratch& scratch) {
  const Eigen::Index dv = S.rows();
  switch (kind) {
    case Recurrence::mamba2: u = v; return;
    case Recurrence::gdn: {
      canonical_rows_times(S, k.data(), scratch.sx);  // S_{t-1} k_t
      const float a = alpha(0);
      u.resize(dv);
      for (Eigen::Index i = 0; i < dv; ++i) u(i) = beta * (v(i) - a * scratch.sx(i));  // u = b (v - a S k)
      return;
    }
    case Recurrence::kda: {
      const Eigen::Index dk = S.cols();
      scratch.x.resize(dk);
      for (Eigen::Index c = 0; c < dk; ++c) scratch.x(c) = alpha(c) * k(c);  // a_t . k_t
      canonical_rows_times(S, scratch.x.data(), scratch.sx);                  // S_{t-1} Diag(a_t) k_t
      u.resize(dv);
      for (Eigen::Index i = 0; i < dv; ++i) u(i) = beta * (v(i) - scratch.sx(i));  // u = b (v - S (a . k))
      return;
    }
  }
}

void decay_and_add(Recurrence kind, StateMatrix& S, const Vector& alpha, const Vector& u, const Vector& k) {
  const Eigen::Index rows = S.rows(), cols = S.cols();
  const float* kk = k.data();
  if (kind == Recurrence::kda) {
    const float* a = alpha.data();
    for (Eigen::Index i = 0; i < rows; ++i) {
      float* s = S.data() + i * cols;
      const float ui = u(i);
      for (Eigen::Index c = 0; c < cols; ++c) s[c] = s[c] * a[c] + ui * kk[c];  // S Diag(a) + u k^T
    }
  } else {
    const float a = alpha(0);
    for (Eigen::Index i = 0; i < rows; ++i) {
      float* s = S.data() + i * cols;
      const float ui = u(i);
      for (Eigen::Index c = 0; c < cols; ++c) s[c] = a * s[c] + ui * kk[c];  // a S + u k^T
    }
  }
}

void plain_step(Recurrence kind, StateMatrix& S, const Vector& alpha, float beta, const Vector& v, const Vector& k,
                Vector& u, StepScratch& scratch) {
  correction(kind, S, alpha, beta, v, k, u, scratch);
  decay_and_add(kind, S, alpha, u, k);
}

void state_output(const StateMatrix& S, const Vector& q, Vector& o) { canonical_rows_times(S, q.data(), o); }

// ---- window of records -------------------------------------------------------------------------

void WindowRecords::resize(Recurrence kind, int capacity, int dk, int dv) {
  alpha.resize(capacity, decay_width(kind, dk));
  beta.resize(capacity);
  V.resize(capacity, dv);
  U.resize(capacity, dv);
}

namespace {
// The corrections OUTPUTONLY and REPLAY multiply: u_j, which for Mamba-2 is v_j itself.
const RowMatrix& corrections(Recurrence kind, const WindowRecords& rec) {
  return kind == Recurrence::mamba2 ? rec.V : rec.U;
}
}  // namespace

void replay(Recurrence kind, StateMatrix& S, const RowMatrix& K, WindowRecords& rec, int n, int recompute_from,
            ReplayScratch& sc) {
  const bool delta = has_delta_rule(kind);
  for (int j = 0; j < n; ++j) {
    sc.a = rec.alpha.row(j).transpose();
    sc.k = K.row(j).transpose();
    if (delta && j >= recompute_from) {
      sc.v = rec.V.row(j).transpose();
      correction(kind, S, sc.a, rec.beta(j), sc.v, sc.k, sc.u, sc.step);
      rec.U.row(j) = sc.u.transpose();
    } else {
      sc.u = corrections(kind, rec).row(j).transpose();
    }
    decay_and_add(kind, S, sc.a, sc.u, sc.k);
  }
}

void key_products(const RowMatrix& K, int h, int T, const RowMatrix& Q, bool delta_rule, KeyProducts& out) {
  const int n = h + T;
  out.KQ.noalias() = K.topRows(n) * Q.topRows(T).transpose();                           // K^T Q
  if (delta_rule) out.KK.noalias() = K.topRows(n) * K.middleRows(h, T).transpose();  // K^T K_d
}

void output_only(Recurrence kind, const StateMatrix& S_ckpt, const RowMatrix& K, WindowRecords& rec, int h, int T,
                 const RowMatrix& Q, const KeyProducts* shared, RowMatrix& O, OutputOnlyScratch& sc) {
  const int n = h + T;
  const Eigen::Index dk = K.cols();
  const bool delta = has_delta_rule(kind);
  if (!has_channel_decay(kind) && shared == nullptr)
    throw std::invalid_argument("output_only: scalar decays need the key head's shared K^T Q products");
  sc.Mq.setZero(n, T);
  if (delta) sc.Mk.setZero(n, T);
  sc.Y.resize(delta ? 2 * T : T, dk);

  // Decay weights, walking back from each query position t = h+s+1: w = g_{j+1:t} before
  // multiplying in a_j, and g_{1:t} = D_s at the end (kda: the channel-wise G, folded into
  // the dot products since it differs per channel).
  for (int s = 0; s < T; ++s) {
    const int t = h + s + 1;
    if (!has_channel_decay(kind)) {
      float w = 1.0f;
      for (int j = t; j >= 1; --j) {
        sc.Mq(j - 1, s) = w * shared->KQ(j - 1, s);                 // (W . K^T Q)_{js}
        if (delta && j < t) sc.Mk(j - 1, s) = w * shared->KK(j - 1, s);  // (W . K^T K_d)_{js}, j < t
        w *= rec.alpha(j - 1, 0);
      }
      sc.Y.row(s) = w * Q.row(s);                   // D_s q_s
      if (delta) sc.Y.row(T + s) = w * K.row(t - 1);  // D_s k_{h+s}
    } else {
      sc.w.setOnes(dk);
      for (int j = t; j >= 1; --j) {
        sc.Mq(j - 1, s) = K.row(j - 1).cwiseProduct(sc.w.transpose()).dot(Q.row(s));
        if (delta && j < t) sc.Mk(j - 1, s) = K.row(j - 1).cwiseProduct(sc.w.transpose()).dot(K.row(t - 1));
        sc.w = sc.w.cwiseProduct(rec.alpha.row(j - 1).transpose());
      }
      sc.Y.row(s) = Q.row(s).cwiseProduct(sc.w.transpose());
      if (delta) sc.Y.row(T + s) = K.row(t - 1).cwiseProduct(sc.w.transpose());
    }
  }
  // S_ckpt Q D and S_ckpt K_d D in one pass over the checkpoint.
  sc.Z.noalias() = sc.Y * S_ckpt.transpose();

  if (delta) {
    // UT transform (section 3). Rows: X = B_d R^T with R = V_d - S_ckpt K_d D - U_c (W_c . K_c^T K_d).
    sc.X = rec.V.middleRows(h, T) - sc.Z.bottomRows(T);
    if (h > 0) sc.X.noalias() -= sc.Mk.topRows(h).transpose() * rec.U.topRows(h);
    for (int s = 0; s < T; ++s) sc.X.row(s) *= rec.beta(h + s);
    // U_d (I + A B_d) = R B_d  <=>  (I + B_d A^T) U_d^T = B_d R^T: unit lower triangular,
    // entry (s, r) = b_{h+s} A_{rs} = b_{h+s} g_{h+r+1:h+s} k_{h+r}^T k_{h+s} for r < s.
    sc.Lt.setZero(T, T);
    for (int s = 0; s < T; ++s)
      for (int r = 0; r < s; ++r) sc.Lt(s, r) = rec.beta(h + s) * sc.Mk(h + r, s);
    sc.Lt.triangularView<Eigen::UnitLower>().solveInPlace(sc.X);
    rec.U.middleRows(h, T) = sc.X;
  }
  // O = S_ckpt Q D + U (W . K^T Q), as rows.
  O = sc.Z.topRows(T);
  O.noalias() += sc.Mq.transpose() * corrections(kind, rec).topRows(n);
}

}  // namespace replayssm::ssm
