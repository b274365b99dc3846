// One-head recurrences of REPLAYSSM.md sections 1-3 in float32 (like the kernels): the plain
// step, REPLAY, OUTPUTONLY and the GDN/KDA UT transform. Everything above this file (the
// conventional and ReplaySSM decoders, the sequence emulator) is built from these functions, so
// the same floating-point operations give the same bits wherever they are used.
//
// Conventions: state S in R^{dv x dk} (StateMatrix, row-major), o = S q, all three in the u-form
//   S_t = a_t S_{t-1} + u_t k_t^T                      mamba2: u_t = v_t
//                                                      gdn:    u_t = b_t (v_t - a_t S_{t-1} k_t)
//   S_t = S_{t-1} Diag(a_t) + u_t k_t^T                kda:    u_t = b_t (v_t - S_{t-1} (a_t . k_t))
// (the delta rule a S (I - b k k^T) + b v k^T rewritten, section 1). Cumulative decays
// g_{i:j} = a_i ... a_j (1 when i > j); for kda the channel-wise products G_{i:j} in R^dk.
// Window positions are 1-based in comments (as in the spec) and 0-based rows in code.
#pragma once
#include <string_view>

#include <Eigen/Core>

#include "ssm/sequence_emulator.h"
#include "ssm/ssm_types.h"
#include "ssm/state_quantizer.h"

namespace replayssm::ssm {

using RowMatrix = StateMatrix;  // record matrices: one record per row
using Vector = Eigen::VectorXf;

// "mamba2", "gdn", "kda"; throws std::invalid_argument otherwise.
Recurrence parse_recurrence(std::string_view text);


// One key head (k, q) and the value heads that share it (GQA; Mamba-2 n_groups).
struct HeadGroupShape {
  Recurrence kind = Recurrence::mamba2;
  int dk = 0, dv = 0, n_value_heads = 1;
};
// Throws std::invalid_argument unless dk, dv >= 1 and 1 <= n_value_heads <= 256.
void check_shape(const HeadGroupShape& shape);

// ---- the plain recurrence: one token, one head -------------------------------------------------

// Reusable temporaries (sized on first use; no allocation afterwards).
struct StepScratch {
  Vector x;   // dk: a . k (kda)
  Vector sx;  // dv: S k or S (a . k)
};

// The u-form correction of section 1: u = v (mamba2), b (v - a S k) (gdn), b (v - S (a . k)) (kda).
// `alpha` holds decay_width(kind, dk) values, `beta` is ignored for mamba2. S k and S (a . k) are
// canonical dot products per row (ssm/canonical_dot.h), so the CUDA scan reproduces them exactly.
void correction(Recurrence kind, const StateMatrix& S, const Vector& alpha, float beta, const Vector& v,
                const Vector& k, Vector& u, StepScratch& scratch);
// S <- a S + u k^T (mamba2, gdn) or S Diag(a) + u k^T (kda). Element-wise, no reductions:
// (a * s) + (u_i * k_c), resp. (s * a_c) + (u_i * k_c), each product rounded (no FMA).
void decay_and_add(Recurrence kind, StateMatrix& S, const Vector& alpha, const Vector& u, const Vector& k);
// Plain step (conventional decode, section 1): u from S_{t-1}, then S_t. Returns u in `u`.
void plain_step(Recurrence kind, StateMatrix& S, const Vector& alpha, float beta, const Vector& v, const Vector& k,
                Vector& u, StepScratch& scratch);
// o = S q, one canonical dot product per row (ssm/canonical_dot.h).
void state_output(const StateMatrix& S, const Vector& q, Vector& o);

// ---- a window of buffered records (section 2) ----------------------------------------------

// One value head's records in window order: row j is window position j + 1. K (the keys) belongs
// to the key head and is passed separately, shared by the value heads.
struct WindowRecords {
  RowMatrix alpha;  // capacity x decay_width
  Vector beta;      // capacity (delta rule; unused for mamba2)
  RowMatrix V;      // capacity x dv: raw values v_j
  RowMatrix U;      // capacity x dv: corrections u_j (mamba2: u_j = v_j, kept equal to V)
  void resize(Recurrence kind, int capacity, int dk, int dv);
};

struct ReplayScratch {
  StepScratch step;
  Vector a, u, v, k;  // one record, copied to owned storage so every path runs identical kernels
};

// REPLAY(S, B[1:n]) = g_n S + sum_j g_{j+1:n} u_j k_j^T (section 2), evaluated as the fold
// S <- a_j S + u_j k_j^T over j = 1..n: the same operations as n plain steps, so a replayed
// checkpoint equals a running state bit for bit. Records from window position recompute_from + 1
// on (0-based row recompute_from) get their correction recomputed from the raw (a, b, v, k) on
// this path and written to rec.U (Algorithm 4 line 2 for the current token; Algorithm 3's GDN
// flush, u_j^HP = b_j (v_j - a_j S_{j-1}^HP k_j), with recompute_from = 0). Mamba-2 ignores it.
void replay(Recurrence kind, StateMatrix& S, const RowMatrix& K, WindowRecords& rec, int n, int recompute_from,
            ReplayScratch& scratch);

// Dot products shared by the value heads of a key head (scalar decays only, section 2/3):
// KQ(j, s) = k_j . q_s (the K^T Q of OUTPUTONLY) and KK(j, s) = k_j . k_{h+s} (the K^T K_d of the
// UT transform), j over the n = h + T window rows.
struct KeyProducts {
  RowMatrix KQ, KK;
};
void key_products(const RowMatrix& K, int h, int T, const RowMatrix& Q, bool delta_rule, KeyProducts& out);

struct OutputOnlyScratch {
  RowMatrix Mq, Mk;  // n x T: decay-weighted, causally masked K^T Q and K^T K_d
  RowMatrix Y, Z;    // 2T x dk decayed queries/keys; 2T x dv = Y S_ckpt^T (one pass over S_ckpt)
  RowMatrix X;       // T x dv: right-hand side, then the drafts' corrections
  RowMatrix Lt;      // T x T: (I + A B_d)^T, unit lower triangular
  Vector w;          // dk: running channel-wise decay (kda)
};

// OUTPUTONLY(S_ckpt, B[1:h+T], Q) = S_ckpt Q D + U (W . (K^T Q))   (section 2, Algorithm 2 line 3)
// for the T query positions h+1..h+T of the window: D = diag(g_{h+1}, .., g_{h+T}),
// W_{js} = g_{j+1:h+s} for j <= h+s else 0. Rows 0..h-1 of rec.U must hold the committed
// corrections. Delta rule: the drafts' corrections (rows h..h+T-1 of rec.U) are solved first by
// the UT transform of section 3,
//   U_d (I + A B_d) = R B_d,   A_{rs} = g_{h+r+1:h+s} k_{h+r}^T k_{h+s} (r < s),
//   R = V_d - S_ckpt K_d D - U_c (W_c . (K_c^T K_d)),   (W_c)_{js} = g_{j+1:h+s},
// with one T x T unit-triangular solve, and written into rec.U. kda: the same with channel-wise
// decays, k_j^T G_{j+1:h+s} q in place of g_{j+1:h+s} k_j^T q and S_ckpt (G_{1:h+s} . q) in place
// of g_{h+s} S_ckpt q. `shared` must be given for scalar decays (key_products of the same K, h, T,
// Q) and is ignored for kda. O (T x dv, resized): row s is the output at window position h+s+1.
// For T = 1 and no buffered drafts this is the non-flush step o_t = g_h S_ckpt q_t +
// sum_j g_{j+1:h} u_j (k_j^T q_t).
void output_only(Recurrence kind, const StateMatrix& S_ckpt, const RowMatrix& K, WindowRecords& rec, int h, int T,
                 const RowMatrix& Q, const KeyProducts* shared, RowMatrix& O, OutputOnlyScratch& scratch);

}  // namespace replayssm::ssm
