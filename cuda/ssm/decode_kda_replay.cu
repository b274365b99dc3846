// ReplaySSM standard decode for KDA (Algorithm 4 with channel-wise decays; Algorithm 3 with a separate
// low-precision read checkpoint): the non-flush kernel (output-only form from the read checkpoint)
// and the flush kernel (REPLAY from the recur checkpoint, writing it and, split, the LP copy), launched
// over the same grid of (value head, sequence) blocks, the flush kernel first and the non-flush kernel
// as its programmatic dependent, as decode_replay.cu does for Mamba-2 and GDN. Window bookkeeping
// (WindowState, ring slots, the flush test h + 1 >= L) is the same as theirs, so commit_step and verify_step share the ring. Both kernels also implement error
// feedback on the copies they write (+ef) and appendix F's decay-based checkpoint-read skipping.
#include "ssm/decode_kda.cuh"

namespace replayssm::cuda {

using formats::StorageFormat;
using namespace detail;
using namespace decode_detail;

namespace {

// ---- what both kernels share -----------------------------------------------------------------
// Appendix F: gamma of window positions 0..last (the current token's decay included), the float32
// product of the decay vectors in token order starting at position 0, largest over the key channels,
// exactly as ssm::ReplayDecoderBase::skips_checkpoint_read forms it (gamma = a_0, then gamma *= a_j
// for j = 1..last), so that the skip decision is bit-identical to the CPU decoders'. One thread per
// channel multiplies sequentially, then a block max (exact). Whole block (block_max synchronises).
template <int DK, class AlphaAt>
__device__ __forceinline__ float kda_window_gamma(int last, AlphaAt&& alpha, float* scratch) {
  float m = 0.0f;
  for (int c = threadIdx.x; c < DK; c += kThreads) {
    float g = alpha(0)[c];
    for (int p = 1; p <= last; ++p) g *= alpha(p)[c];
    m = fmaxf(m, g);
  }
  return block_max(m, scratch);
}

// The raw records of window positions 0..h0 of the block's value head, staged for kda_replay_row:
// keys [h0+1][DK] (fp32), decays [h0+1][DK], v [h0+1][dv] (fp32), betas [h0+1]. Position h0 is the
// current token, read from the step's inputs (key_at / alpha_at return those for p == h0).
template <int DK, class KeyAt, class AlphaAt>
__device__ __forceinline__ void kda_stage_raw_records(const ReplayArgs& A, const KdaBlock& kb, const WindowState& win,
                                                      int h0, KeyAt&& key_at, AlphaAt&& alpha_at, float* keys,
                                                      float* alphas, float* vals, float* betas) {
  const int dv = kb.dv;
  for (int i = threadIdx.x; i < (h0 + 1) * DK; i += kThreads) {
    const int p = i / DK, c = i % DK;
    keys[i] = __bfloat162float(key_at(p)[c]);
    alphas[i] = alpha_at(p)[c];
  }
  for (int i = threadIdx.x; i < (h0 + 1) * dv; i += kThreads) {
    const int p = i / dv, r = i % dv;
    vals[i] = __bfloat162float(p == h0 ? A.in.v[kb.hb * dv + r]
                                       : A.rec.v[(ring_slot(A.rec, kb.b, win, p) * kb.H + kb.head) * dv + r]);
  }
  for (int p = threadIdx.x; p <= h0; p += kThreads)
    betas[p] = p == h0 ? A.in.beta[kb.hb] : A.rec.beta[ring_slot(A.rec, kb.b, win, p) * kb.H + kb.head];
}

// REPLAY of window positions 0..h0 on one state row, held in the lane's pieces x (fp32 tile
// geometry), with every u recomputed sequentially from the staged raw records (ssm::replay with
// recompute_from = 0, the element-wise operations of ssm::correction and ssm::decay_and_add):
//   u_j = b_j (v_j - x (a_j . k_j)),  x <- x Diag(a_j) + u_j k_j^T.
// Returns u_{h0} (every lane of the row holds it). Uniform per warp: the row sums shuffle.
template <int DK>
__device__ __forceinline__ float kda_replay_row(float (*x)[4], int h0, int row, bool valid, int dv, const float* keys,
                                                const float* alphas, const float* vals, const float* betas, int lane) {
  using T = Tile<StorageFormat::fp32, DK>;
  constexpr int E = 4, P = T::P, LPR = T::LPR;
  float u = 0.0f;
  for (int j = 0; j <= h0; ++j) {
    float a4[P][E], k4[P][E], ak[P][E];
    load_lane_f32<P, LPR>(alphas + static_cast<std::size_t>(j) * DK, lane, a4);
    load_lane_f32<P, LPR>(keys + static_cast<std::size_t>(j) * DK, lane, k4);
    float sk = 0.0f;
#pragma unroll
    for (int p = 0; p < P; ++p) {
#pragma unroll
      for (int e = 0; e < E; ++e) ak[p][e] = a4[p][e] * k4[p][e];
      sk = dot_acc<E>(x[p], ak[p], sk);
    }
    sk = row_sum<LPR>(sk);
    u = betas[j] * ((valid ? vals[static_cast<std::size_t>(j) * dv + row] : 0.0f) - sk);
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
      for (int e = 0; e < E; ++e) x[p][e] = x[p][e] * a4[p][e] + u * k4[p][e];
  }
  return u;
}

// ---- non-flush step --------------------------------------------------------------------------
// Shared memory, in floats from the block's base, the cp.async targets 16-byte aligned: scratch
// [kWarps], then either the output-only form's kw [L][DK] (weighted keys), decays [L][DK], y [3 DK]
// (G . q_t and G . k_t, piece-interleaved: see kda_y_index), u [L][dv], c1 [L], c2 [L], rows1 [dv],
// rows2 [dv] and keys [L][DK] (bf16, as stored), or (appendix F, a skipped read; only when skipping
// is on) the raw records' keys [L][DK], decays [L][DK], v [L][dv], betas [L].
struct KdaNonflushLayout {
  std::size_t kw, al, y, vals, c1, c2, rows1, rows2, keys, total;
};
__host__ __device__ constexpr std::size_t round_up4(std::size_t n) { return (n + 3) / 4 * 4; }
__host__ __device__ constexpr KdaNonflushLayout kda_nonflush_layout(int L, int DK, int dv, bool skipping) {
  KdaNonflushLayout o{};
  const std::size_t l = static_cast<std::size_t>(L);
  o.kw = round_up4(kWarps);
  o.al = o.kw + l * DK;
  o.y = o.al + l * DK;
  o.vals = o.y + 3 * static_cast<std::size_t>(DK);
  o.c1 = o.vals + round_up4(l * dv);
  o.c2 = o.c1 + l;
  o.rows1 = o.c2 + l;
  o.rows2 = o.rows1 + dv;
  o.keys = round_up4(o.rows2 + dv);
  o.total = o.keys + l * DK / 2;
  const std::size_t raw = o.kw + 2 * l * DK + l * dv + l;  // kda_nonflush_skipped's layout
  if (skipping && raw > o.total) o.total = raw;
  return o;
}

// Appendix F, a non-flush step of one value head whose gamma is below the read copy's threshold
// (ssm::ReplayDecoderBase::step, the skipped branch): the read checkpoint is not read at all;
// S = REPLAY(0, B[1:h0+1]) with every u recomputed from the zero state, o = S q_t, and the
// recomputed u of the current token goes to the ring (ring_.set_u(h, g, rec.U.row(h))).
// `base`: the block's shared memory after the scratch.
template <int DK, class KeyAt, class AlphaAt>
__device__ __forceinline__ void kda_nonflush_skipped(const ReplayArgs& A, const KdaBlock& kb, const WindowState& win,
                                                     int h0, std::size_t slot_t, float* base, KeyAt&& key_at,
                                                     AlphaAt&& alpha_at) {
  using T = Tile<StorageFormat::fp32, DK>;
  constexpr int E = 4, P = T::P, LPR = T::LPR, RW = T::RW;
  const int L = A.window, dv = kb.dv;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float* keys = base;                                        // [L][DK]
  float* alphas = keys + static_cast<std::size_t>(L) * DK;   // [L][DK]
  float* vals = alphas + static_cast<std::size_t>(L) * DK;   // [L][dv]
  float* betas = vals + static_cast<std::size_t>(L) * dv;    // [L]
  kda_stage_raw_records<DK>(A, kb, win, h0, key_at, alpha_at, keys, alphas, vals, betas);
  __syncthreads();
  float qv[P][E];
  load_lane_vector<E, P, LPR>(A.in.q + (static_cast<std::size_t>(kb.b) * kb.G + kb.g) * DK, lane, qv);
  const int iterations = (dv + kWarps * RW - 1) / (kWarps * RW);
  for (int it = 0; it < iterations; ++it) {  // uniform per warp: the row sums shuffle
    const int row = (it * kWarps + warp) * RW + T::row_in_iteration(lane);
    const bool valid = row < dv;
    float x[P][E] = {};  // the zero state
    const float u = kda_replay_row<DK>(x, h0, row, valid, dv, keys, alphas, vals, betas, lane);
    float o = 0.0f;
#pragma unroll
    for (int p = 0; p < P; ++p) o = dot_acc<E>(x[p], qv[p], o);
    o = row_sum<LPR>(o);
    if (valid && lane % LPR == 0) {
      A.in.out[kb.hb * dv + row] = o;
      A.rec.u[(slot_t * kb.H + kb.head) * dv + row] = u;
    }
  }
}

// Loads (not yet decoded) of row iterations [it0, it0 + kBatch) of the non-flush checkpoint stream.
// A plain function, not a lambda: a closure holding these arrays put them in local memory.
template <StorageFormat R, int DK, int kBatch, int P>
__device__ __forceinline__ void kda_load_checkpoint_batch(const HeadView rv, int dv, int iterations, int it0,
                                                          RawPiece (&raw)[kBatch][P]) {
  using T = Tile<R, DK>;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int j = 0; j < kBatch; ++j) {
    const int row = ((it0 + j) * kWarps + warp) * T::RW + T::row_in_iteration(lane);
    const bool valid = it0 + j < iterations && row < dv;
#pragma unroll
    for (int p = 0; p < P; ++p) raw[j][p] = valid ? load_raw_piece<R, DK>(rv, row, T::col(lane, p)) : RawPiece{};
  }
}

// Where G . q_t (v = 0) and G . k_t (v = 1) keep column c in shared memory: per state piece of E
// columns, its E values of G . q_t, then its E of G . k_t, then 4 floats of padding, so that
// dot_raw_piece can read a lane's piece as vec[v][e] straight from shared memory and the lanes of a
// row, reading different pieces, fall on different banks. At most 3 DK floats.
template <int E>
__device__ __forceinline__ int kda_y_index(int c, int v) {
  return (c / E) * (2 * E + 4) + v * E + c % E;
}

// Non-flush step of one value head, the output-only form with T = 1 (REPLAYSSM.md sections 2-3,
// ssm::output_only for kda): with t = h0 the current window position and the channel-wise weights
// W_p = prod_{l=p+1}^{t} a_l, G = prod_{l=0}^{t} a_l (the current decay included),
//   S_{t-1} (a_t . k_t) = S_ckpt (G . k_t) + sum_{p<t} u_p ((W_p . k_p) . k_t)
//   u_t = b_t (v_t - S_{t-1} (a_t . k_t))
//   o_t = S_ckpt (G . q_t) + sum_{p<=t} u_p ((W_p . k_p) . q_t)
// One streaming read of the read checkpoint (LP when split, else the recur copy) gives both S_ckpt
// products; no state is materialised. u_t goes to the ring for later steps. The records go global ->
// shared by cp.async, all issued at the block's start, and the checkpoint stream's first batch right
// after them; every later batch is issued before the previous one is consumed, as
// decode_replay_nonflush.cu does. (Element-wise record loops, each waited on in turn, were the KDA
// non-flush step's largest fixed cost: Kimi Linear, B = 256, 213.7 -> 187.9 us, experiments/bench/
// decode_2026-12-05/session15. Staging the whole head in shared memory as well was slower, 253.9 us:
// only two blocks then fit an SM.)
template <StorageFormat R, int DK>
__device__ __forceinline__ void kda_nonflush_body(const ReplayArgs& A) {
  extern __shared__ float smem[];
  const KdaBlock kb = kda_block(A.shape);
  const WindowState win = current_window(A.rec, kb.b);
  if (win.h + 1 >= A.window) return;  // the flush kernel's sequence
  const int L = A.window, h0 = win.h, dv = kb.dv;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const bool skip_on = A.skip_read > 0.0f;
  const KdaNonflushLayout lay = kda_nonflush_layout(L, DK, dv, skip_on);
  float* scratch = smem;                       // [kWarps]
  float* kw = smem + lay.kw;                   // [L][DK] weighted keys
  float* al = smem + lay.al;                   // [L][DK] staged decays
  float* y = smem + lay.y;                     // [3 DK] G . q_t, G . k_t (kda_y_index)
  float* vals = smem + lay.vals;               // [L][dv] cached u_p
  float* c1 = smem + lay.c1;                   // [L] (W_p . k_p) . q_t
  float* c2 = smem + lay.c2;                   // [L] (W_p . k_p) . k_t
  float* rows1 = smem + lay.rows1;             // [dv] S_ckpt (G . q_t)
  float* rows2 = smem + lay.rows2;             // [dv] S_ckpt (G . k_t)
  __nv_bfloat16* keys = reinterpret_cast<__nv_bfloat16*>(smem + lay.keys);  // [L][DK] staged keys
  const __nv_bfloat16* k_t = A.in.k + (static_cast<std::size_t>(kb.b) * kb.G + kb.g) * DK;
  const __nv_bfloat16* q_t = A.in.q + (static_cast<std::size_t>(kb.b) * kb.G + kb.g) * DK;
  const float* a_t = kda_step_alpha(A.in.alpha, kb.hb, DK);
  const std::size_t slot_t = ring_slot(A.rec, kb.b, win, h0);
  auto key_at = [&](int p) { return p == h0 ? k_t : A.rec.k + (ring_slot(A.rec, kb.b, win, p) * kb.G + kb.g) * DK; };
  auto alpha_at = [&](int p) -> const float* {
    return p == h0 ? a_t : kda_record_alpha(A.rec, ring_slot(A.rec, kb.b, win, p), kb.H, kb.head, DK);
  };

  using T = Tile<R, DK>;
  constexpr int E = T::E, P = T::P, LPR = T::LPR, RW = T::RW;
  constexpr int kBatch = R == StorageFormat::nvfp4 ? 2 : 4;  // row iterations whose loads are issued together
  // By value: a reference chosen at run time between two kernel-parameter members would have to
  // live in local memory.
  const DeviceState read_state = A.split ? A.read : A.recur;
  const HeadView rv = head_view(read_state, kb.hb, dv, DK);
  const int iterations = (dv + kWarps * RW - 1) / (kWarps * RW);

  // B[h+1] <- (a, b, v, k) (u below, once known).
  kda_write_record<DK>(A.rec, slot_t, kb.H, kb.G, kb.head, kb.g, kb.vh == 0, dv, k_t, A.in.v + kb.hb * dv, a_t,
                       A.in.beta[kb.hb]);
  // Appendix F against the threshold of the copy this step reads (block-uniform: one value head);
  // decided before any checkpoint load, so a skipped read loads nothing.
  if (skip_on && kda_window_gamma<DK>(h0, alpha_at, scratch) < A.skip_read) {
    kda_nonflush_skipped<DK>(A, kb, win, h0, slot_t, kw, key_at, alpha_at);
    return;
  }

  // Every load of the block, issued before any is waited on: the records (the cached corrections, the
  // keys and the decays), then the first batch of the read checkpoint.
  const auto aligned = [](const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0; };
  if (dv % 4 == 0 && aligned(A.rec.u)) {
    const int per_position = dv / 4;
    for (int i = threadIdx.x; i < h0 * per_position; i += kThreads) {
      const int p = i / per_position, piece = i - p * per_position;
      copy_async16(vals + static_cast<std::size_t>(p) * dv + piece * 4,
                   A.rec.u + (ring_slot(A.rec, kb.b, win, p) * kb.H + kb.head) * dv + piece * 4, true);
    }
  } else {
    for (int i = threadIdx.x; i < h0 * dv; i += kThreads) {
      const int p = i / dv, r = i % dv;
      vals[i] = A.rec.u[(ring_slot(A.rec, kb.b, win, p) * kb.H + kb.head) * dv + r];
    }
  }
  kda_stage_keys_decays_async<DK>(h0, key_at, alpha_at, keys, al,
                                  aligned(A.rec.k) && aligned(A.in.k) && aligned(A.rec.alpha) && aligned(A.in.alpha));
  copy_async_commit();
  RawPiece raw[kBatch][P];
  kda_load_checkpoint_batch<R, DK>(rv, dv, iterations, 0, raw);
  copy_async_wait_all();  // this thread's records; the barrier publishes everyone's
  __syncthreads();

  // Record phase: the weighted keys and G (one thread per channel), then the key products.
  kda_weighted_keys<DK>(h0, keys, al, kw, [&](int c, float gc) {
    y[kda_y_index<E>(c, 0)] = __bfloat162float(q_t[c]) * gc;  // the Y rows of ssm::output_only: q . G, k . G
    y[kda_y_index<E>(c, 1)] = __bfloat162float(k_t[c]) * gc;
  });
  __syncthreads();
  for (int p = warp; p <= h0; p += kWarps) {  // key products, one warp per position
    const float s1 = warp_dot_f32_bf16<DK>(kw + static_cast<std::size_t>(p) * DK, q_t, lane);
    const float s2 = warp_dot_f32_bf16<DK>(kw + static_cast<std::size_t>(p) * DK, k_t, lane);
    if (lane == 0) {
      c1[p] = s1;
      if (p < h0) c2[p] = s2;
    }
  }
  // The read checkpoint's rows: rows1 = S_ckpt (G . q_t), rows2 = S_ckpt (G . k_t). Pieces of 16 or
  // 32 columns (fp8b128, nvfp4) read the lane's slices of G . q_t and G . k_t from shared memory
  // inside the product: held in registers they took 64 of them for NVFP4 and halved the blocks per
  // SM, and a KDA block streams only one head (two NVFP4 row iterations), so nothing is re-read much.
  {
    constexpr bool kVecsInShared = E >= 16;
    float vecs[kVecsInShared ? 1 : P][2][E];
    if constexpr (!kVecsInShared) {
#pragma unroll
      for (int p = 0; p < P; ++p)
#pragma unroll
        for (int e = 0; e < E; ++e) {
          vecs[p][0][e] = y[kda_y_index<E>(T::col(lane, p) + e, 0)];
          vecs[p][1][e] = y[kda_y_index<E>(T::col(lane, p) + e, 1)];
        }
    }
    auto piece_vecs = [&](int p) -> const float(*)[E] {
      if constexpr (kVecsInShared) return reinterpret_cast<const float(*)[E]>(y + kda_y_index<E>(T::col(lane, p), 0));
      else return vecs[p];
    };
    for (int it0 = 0; it0 < iterations; it0 += kBatch) {  // uniform per warp: the row sums shuffle
      RawPiece cur[kBatch][P];
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
#pragma unroll
        for (int p = 0; p < P; ++p) cur[j][p] = raw[j][p];
      if (it0 + kBatch < iterations) kda_load_checkpoint_batch<R, DK>(rv, dv, iterations, it0 + kBatch, raw);
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int row = ((it0 + j) * kWarps + warp) * RW + T::row_in_iteration(lane);
        float acc[2] = {0.0f, 0.0f};
#pragma unroll
        for (int p = 0; p < P; ++p) dot_raw_piece<R, 2>(cur[j][p], rv.tensor_scale, piece_vecs(p), acc);
        const float s1 = row_sum<LPR>(acc[0]), s2 = row_sum<LPR>(acc[1]);
        if (it0 + j < iterations && row < dv && lane % LPR == 0) rows1[row] = s1, rows2[row] = s2;
      }
    }
  }
  __syncthreads();

  // One thread per row: u_t, then the output.
  const float beta_t = A.in.beta[kb.hb];
  for (int r = threadIdx.x; r < dv; r += kThreads) {
    float sk = rows2[r], o = rows1[r];
    for (int p = 0; p < h0; ++p) {
      const float up = vals[static_cast<std::size_t>(p) * dv + r];
      sk = fmaf(c2[p], up, sk);
      o = fmaf(c1[p], up, o);
    }
    const float u = beta_t * (__bfloat162float(A.in.v[kb.hb * dv + r]) - sk);
    A.in.out[kb.hb * dv + r] = fmaf(c1[h0], u, o);
    A.rec.u[(slot_t * kb.H + kb.head) * dv + r] = u;
  }
}

template <StorageFormat R, int DK>
__global__ void __launch_bounds__(kThreads) kda_nonflush_kernel(ReplayArgs A) {
  kda_nonflush_body<R, DK>(A);
  step_block_done(A.rec, blockIdx.y, 2 * gridDim.x);  // every block, every path: the device-side parity (decode_kernels.h)
}

// ---- flush step ------------------------------------------------------------------------------
// Shared memory (floats): scratch [kWarps], keys [S][DK], decays [S][DK], G [DK], vals [S][dv],
// betas [S]; S = the launch's `stage`. The closed form stages the keys and decays and turns the keys
// into weighted keys in place; the raw layout (u recomputed from the raw records) serves split
// flushes and, when skipping is on, skipped flushes of shared ones.
std::size_t flush_shared_floats(int S, int DK, int dv) {
  return kWarps + 2 * static_cast<std::size_t>(S) * DK + DK + static_cast<std::size_t>(S) * dv + S;
}

// Flush of one value head (h0 + 1 >= L; more than L records only after a verification commit):
// S = REPLAY(S_ckpt^recur, B[1:h0+1]), o = S q, then the recur copy (RTN, SR or ef) and, split, the
// read (LP, RTN or ef) copy are written. Rows are independent; each lane group holds one row in
// registers.
//   shared: the cached u_p of the committed records in the closed form of section 2 with
//           channel-wise weights, S_{t-1} Diag(a_t) = S_ckpt Diag(G) + sum_{p<t} u_p (W_p . k_p)^T
//           (W_p, G up to and including a_t), then the current token: u_t = b_t (v_t - S_{t-1}
//           Diag(a_t) k_t), S_t = S_{t-1} Diag(a_t) + u_t k_t^T (Algorithm 4 lines 1-4);
//   split:  every u_p recomputed on the recur (HP) path from the raw records, sequentially from
//           S_ckpt^HP (REPLAYSSM.md section 4: u_j^HP = b_j (v_j - S_{j-1}^HP (a_j . k_j))), with the
//           element-wise operations of ssm::correction / ssm::decay_and_add;
//   skipped (appendix F, gamma of the h0 + 1 records below the recur copy's threshold; shared or
//           split): the recur checkpoint is not read, S = REPLAY(0, B[1:h0+1]) with every u
//           recomputed from the zero state, and both copies are written from it (a pure write).
// Error feedback (ssm::ReplayDecoderBase::write_checkpoints, quantize_state with a residual): each
// copy that has a residual stores Q_rtn(S + E) and keeps E <- (S + E) - Q_rtn(S + E).
template <StorageFormat F, int DK>
__device__ __forceinline__ void kda_flush_body(const ReplayArgs& A) {
  extern __shared__ float smem[];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // The non-flush kernel touches only non-flushing sequences (and reads the current window-state
  // copy, which this kernel does not write): let it launch as soon as every block here has started.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  const KdaBlock kb = kda_block(A.shape);
  const WindowState win = current_window(A.rec, kb.b);
  const bool flush = win.h + 1 >= A.window;  // h == L after appending; more after a verification commit
  // The launcher sizes `stage` for every h a commit can leave; more would overrun shared memory.
  if (flush && win.h + 1 > A.stage) __trap();
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    WindowState next = win;
    if (flush) {  // the h + 1 records are folded: position h + 1 becomes position 0
      next.h = 0;
      next.start = (win.start + win.h + 1) % A.rec.capacity;
      next.flushes = win.flushes + 1;
    } else {
      next.h = win.h + 1;
    }
    write_next_window(A.rec, kb.b, next);
  }
  if (!flush) return;
  // The current record is not appended to the ring: the flush drops all h0 + 1 records.
  const int h0 = win.h, S = A.stage, dv = kb.dv;
  const bool split = A.split;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float* scratch = smem;                                        // [kWarps]
  float* keys = scratch + kWarps;                               // [S][DK]
  float* alphas = keys + static_cast<std::size_t>(S) * DK;      // [S][DK]
  float* gdec = alphas + static_cast<std::size_t>(S) * DK;      // [DK] (closed form)
  float* vals = gdec + DK;                                      // [S][dv]
  float* betas = vals + static_cast<std::size_t>(S) * dv;       // [S] (raw layout)
  const __nv_bfloat16* k_t = A.in.k + (static_cast<std::size_t>(kb.b) * kb.G + kb.g) * DK;
  const __nv_bfloat16* q_t = A.in.q + (static_cast<std::size_t>(kb.b) * kb.G + kb.g) * DK;
  const float* a_t = kda_step_alpha(A.in.alpha, kb.hb, DK);
  const float beta_t = A.in.beta[kb.hb];
  auto slot_of = [&](int p) { return ring_slot(A.rec, kb.b, win, p); };
  auto key_at = [&](int p) { return p == h0 ? k_t : A.rec.k + (slot_of(p) * kb.G + kb.g) * DK; };
  auto alpha_at = [&](int p) -> const float* {
    return p == h0 ? a_t : kda_record_alpha(A.rec, slot_of(p), kb.H, kb.head, DK);
  };
  // Appendix F against the recur copy's threshold (block-uniform: one value head per block).
  const bool skip = A.skip_flush > 0.0f && kda_window_gamma<DK>(h0, alpha_at, scratch) < A.skip_flush;
  const bool recompute = split || skip;  // every u recomputed from the raw records
  if (!recompute) {
    for (int i = threadIdx.x; i < h0 * dv; i += kThreads) {
      const int p = i / dv, r = i % dv;
      vals[i] = A.rec.u[(slot_of(p) * kb.H + kb.head) * dv + r];
    }
    kda_stage_keys_decays<DK>(h0, key_at, alpha_at, keys, alphas);
    kda_weighted_keys<DK>(h0, keys, alphas, keys, [&](int c, float gc) { gdec[c] = gc; });
  } else {
    kda_stage_raw_records<DK>(A, kb, win, h0, key_at, alpha_at, keys, alphas, vals, betas);
  }
  __syncthreads();

  using T = Tile<StorageFormat::fp32, DK>;
  constexpr int E = 4, P = T::P, LPR = T::LPR, RW = T::RW;
  float kv[P][E], qv[P][E], gv[P][E];
  load_lane_vector<E, P, LPR>(k_t, lane, kv);
  load_lane_vector<E, P, LPR>(q_t, lane, qv);
  if (!recompute) load_lane_f32<P, LPR>(gdec, lane, gv);
  const HeadView recur_view = head_view(A.recur, kb.hb, dv, DK);
  const HeadView read_view = split ? head_view(A.read, kb.hb, dv, DK) : HeadView{};
  float* const recur_residual = head_residual(A.recur, kb.hb, dv, DK);  // set exactly with ef (make_replay_args)
  float* const read_residual = split ? head_residual(A.read, kb.hb, dv, DK) : nullptr;
  const uint64_t recur_stream = sr_stream_device(kb.b, kb.g, kb.vh, 0, win.flushes);
  const bool need_amax = split && A.read.format == StorageFormat::nvfp4;
  float local_amax = 0.0f;
  const int iterations = (dv + kWarps * RW - 1) / (kWarps * RW);
  // The next two iterations' rows are loaded before this one is folded (rows are independent, and
  // each is written only by the lanes that read it): their DRAM latency overlaps the folds.
  auto load_row = [&](int it, float (*x)[E]) {
    const int row = (it * kWarps + warp) * RW + T::row_in_iteration(lane);
#pragma unroll
    for (int p = 0; p < P; ++p) {
      if (it < iterations && row < dv && !skip) load4<F, DK>(recur_view, row, T::col(lane, p), x[p]);
      else x[p][0] = x[p][1] = x[p][2] = x[p][3] = 0.0f;
    }
  };
  float next_x[P][E], after_x[P][E];
  load_row(0, next_x);
  load_row(1, after_x);
  for (int it = 0; it < iterations; ++it) {  // uniform per warp: the row sums shuffle
    const int row = (it * kWarps + warp) * RW + T::row_in_iteration(lane);
    const bool valid = row < dv;
    float x[P][E];
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
      for (int e = 0; e < E; ++e) x[p][e] = next_x[p][e], next_x[p][e] = after_x[p][e];
    load_row(it + 2, after_x);
    if (!recompute) {
#pragma unroll
      for (int p = 0; p < P; ++p)
#pragma unroll
        for (int e = 0; e < E; ++e) x[p][e] *= gv[p][e];
      for (int j = 0; j < h0; ++j) {
        const float c = valid ? vals[static_cast<std::size_t>(j) * dv + row] : 0.0f;
#pragma unroll
        for (int p = 0; p < P; ++p) {
          const float4 k4 = *reinterpret_cast<const float4*>(keys + static_cast<std::size_t>(j) * DK + T::col(lane, p));
          x[p][0] = fmaf(c, k4.x, x[p][0]);
          x[p][1] = fmaf(c, k4.y, x[p][1]);
          x[p][2] = fmaf(c, k4.z, x[p][2]);
          x[p][3] = fmaf(c, k4.w, x[p][3]);
        }
      }
      float sk = 0.0f;  // x = S_{t-1} Diag(a_t): x . k_t = S_{t-1} (a_t . k_t)
#pragma unroll
      for (int p = 0; p < P; ++p) sk = dot_acc<E>(x[p], kv[p], sk);
      sk = row_sum<LPR>(sk);
      const float u = beta_t * ((valid ? __bfloat162float(A.in.v[kb.hb * dv + row]) : 0.0f) - sk);
#pragma unroll
      for (int p = 0; p < P; ++p)
#pragma unroll
        for (int e = 0; e < E; ++e) x[p][e] = x[p][e] + u * kv[p][e];
    } else {
      kda_replay_row<DK>(x, h0, row, valid, dv, keys, alphas, vals, betas, lane);
    }
    float o = 0.0f;
#pragma unroll
    for (int p = 0; p < P; ++p) o = dot_acc<E>(x[p], qv[p], o);
    o = row_sum<LPR>(o);
    if (valid) {
      if (lane % LPR == 0) A.in.out[kb.hb * dv + row] = o;
#pragma unroll
      for (int p = 0; p < P; ++p) {
        const int col = T::col(lane, p);
        if constexpr (F == StorageFormat::fp16) {
          if (recur_residual != nullptr) store_piece_ef<F, DK>(recur_view, row, col, x[p], recur_residual);
          else store_piece<F, DK>(recur_view, row, col, x[p], A.recur_mode, A.seed, recur_stream);
        } else {
          store_piece<F, DK>(recur_view, row, col, x[p], A.recur_mode, A.seed, recur_stream);
        }
        if (need_amax) {
          // The tensor amax of the value the LP write quantizes: y = S + E_read with ef.
          float y[E];
          load_residual4<DK>(read_residual, row, col, y);
#pragma unroll
          for (int e = 0; e < E; ++e) {
            const float ax = fabsf(read_residual != nullptr ? __fadd_rn(x[p][e], y[e]) : x[p][e]);
            if (ax < INFINITY && ax > local_amax) local_amax = ax;
          }
        }
      }
    }
    if (split && !need_amax) store_read_row<DK, P, LPR>(read_view, A.read.format, row, lane, x, valid, {}, read_residual);
  }
  if (need_amax) {
    // NVFP4 LP copy: the tensor scale needs the head's amax first; then re-read the recur rows this
    // block just wrote (fp32, the launcher requires it) and quantize them, adding the same residual.
    const float amax = block_max(local_amax, scratch);
    const formats::Nvfp4TensorScale ts = formats::nvfp4_tensor_scale(amax);
    if (threadIdx.x == 0) *read_view.tensor_scale_out = ts.decode;
    __syncthreads();
    for (int it = 0; it < iterations; ++it) {
      const int row = (it * kWarps + warp) * RW + T::row_in_iteration(lane);
      const bool valid = row < dv;
      float y[P][E];
#pragma unroll
      for (int p = 0; p < P; ++p) {
        if (valid) load4<F, DK>(recur_view, row, T::col(lane, p), y[p]);
        else y[p][0] = y[p][1] = y[p][2] = y[p][3] = 0.0f;
      }
      store_read_row<DK, P, LPR>(read_view, StorageFormat::nvfp4, row, lane, y, valid, ts, read_residual);
    }
  }
}

template <StorageFormat F, int DK>
__global__ void __launch_bounds__(kThreads) kda_flush_kernel(ReplayArgs A) {
  kda_flush_body<F, DK>(A);
  step_block_done(A.rec, blockIdx.y, 2 * gridDim.x);  // every block, every path: the device-side parity (decode_kernels.h)
}

}  // namespace

void kda_detail::replay_step(const DecodeShape& shape, const StepInputs& in, const ReplayConfig& config,
                             DeviceRecords& records, cudaStream_t stream) {
  check_shape(shape);
  check_kda_inputs(in, config.heads_per_block);
  check_kda_records(records);
  if (config.window < 1 || config.window > kMaxWindow)
    throw_invalid_argument("kda replay decode supports 1 <= L <= 64 (ReplayConfig::window)", "L", config.window);
  if (records.max_drafts < 0) throw_invalid_argument("record ring: max_drafts must be >= 0", "max_drafts", records.max_drafts);
  // A ring that serves verification (max_drafts = T > 0) can hold up to max(L, T) committed records
  // when a standard step comes: that flush folds max(L, T) + 1 of them.
  const int stage = records.max_drafts > 0 ? std::max(config.window, records.max_drafts) + 1 : config.window;
  if (stage > kMaxWindow)
    throw_invalid_argument("kda replay decode after verification supports max(L, T) + 1 <= 64", "L", config.window, "T",
                           records.max_drafts);
  const int min_capacity = records.max_drafts > 0 ? std::max(config.window, records.max_drafts) + records.max_drafts : config.window;
  if (records.capacity < min_capacity)
    throw_invalid_argument("record ring needs capacity L, or max(L, T) + T with max_drafts = T (DeviceRecords::capacity)",
                           "capacity", records.capacity, "needed", min_capacity);
  if (config.recur.payload == nullptr) throw std::invalid_argument("kda replay decode: ReplayConfig::recur.payload is required");
  if (config.recur.format != StorageFormat::fp32 && config.recur.format != StorageFormat::fp16)
    throw std::invalid_argument("kda replay decode: ReplayConfig::recur.format (the recurrence checkpoint) must be fp32 or fp16");
  const StorageFormat read = config.split() ? config.read.format : config.recur.format;
  if (read != StorageFormat::fp32 && read != StorageFormat::fp16 && read != StorageFormat::bf16 &&
      read != StorageFormat::fp8b128 && read != StorageFormat::nvfp4)
    throw std::invalid_argument("kda replay decode: ReplayConfig::read.format must be fp32, fp16, bf16, fp8b128 or nvfp4");
  if (read == StorageFormat::fp8b128 && shape.dk % 128)
    throw_invalid_argument("kda replay decode: an fp8b128 read checkpoint needs dk % 128 == 0", "dk", shape.dk);
  // The NVFP4 LP copy needs the tensor amax before encoding; the flush re-reads the rows from the
  // recur checkpoint it just wrote, which holds S itself only when the recur copy is fp32.
  if (config.split() && read == StorageFormat::nvfp4 && config.recur.format != StorageFormat::fp32)
    throw std::invalid_argument("kda replay decode: an NVFP4 read checkpoint needs an fp32 recurrence checkpoint");
  const ReplayArgs A = make_replay_args(shape, in, config, records, 1, stage);
  const dim3 grid(shape.value_heads, shape.batch);
  const std::size_t nonflush_smem =
      sizeof(float) * kda_nonflush_layout(config.window, shape.dk, shape.dv, A.skip_read > 0.0f).total;
  const std::size_t flush_smem = sizeof(float) * flush_shared_floats(stage, shape.dk, shape.dv);
  with_dk(shape.dk, [&](auto DK) {
    // The flush kernel first, as a plain launch; the non-flush kernel follows as its programmatic
    // dependent, so its blocks start while the flush kernel's last ones still run (the two touch
    // disjoint sequences; decode_replay.cu says why this order).
    auto flush = [&](auto kernel) { launch_replay_kernel(kernel, A, grid, flush_smem, false, stream); };
    if (config.recur.format == StorageFormat::fp32) flush(kda_flush_kernel<StorageFormat::fp32, DK()>);
    else flush(kda_flush_kernel<StorageFormat::fp16, DK()>);
    auto nonflush = [&](auto kernel) { launch_replay_kernel(kernel, A, grid, nonflush_smem, true, stream); };
    switch (read) {
      case StorageFormat::fp32: nonflush(kda_nonflush_kernel<StorageFormat::fp32, DK()>); break;
      case StorageFormat::fp16: nonflush(kda_nonflush_kernel<StorageFormat::fp16, DK()>); break;
      case StorageFormat::bf16: nonflush(kda_nonflush_kernel<StorageFormat::bf16, DK()>); break;
      case StorageFormat::fp8b128:
        if constexpr (DK() >= 128) nonflush(kda_nonflush_kernel<StorageFormat::fp8b128, DK()>);
        break;
      default: nonflush(kda_nonflush_kernel<StorageFormat::nvfp4, DK()>); break;
    }
  });
  REPLAYSSM_CUDA_CHECK_LAUNCH();
  advance_host_parity(records);
}

}  // namespace replayssm::cuda
