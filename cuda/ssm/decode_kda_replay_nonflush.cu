// ReplaySSM standard decode for KDA, the non-flush step: the output-only form from the read checkpoint
// (LP when split, else the recur copy) and the window's records; decode_kda_replay.cu launches it after the
// flush kernel, as its programmatic dependent.
#include "ssm/decode_kda.cuh"

namespace replayssm::cuda {

using formats::StorageFormat;
using namespace detail;
using namespace decode_detail;

namespace {

// ---- non-flush step --------------------------------------------------------------------------
// Shared memory, in floats from the block's base, the cp.async targets 16-byte aligned: scratch
// [kWarps], then either the output-only form's kw [L][DK] (weighted keys), decays [L][DK], y [3 DK]
// (G . q_t and G . k_t, piece-interleaved: see kda_y_index), u [L][dv], c1 [L], c2 [L], rows1 [dv],
// rows2 [dv] and keys [L][DK] (bf16, as stored), or (appendix F, a skipped read; only when skipping
// is on) the raw records' keys [L][DK], decays [L][DK], v [L][dv], betas [L].
struct KdaNonflushLayout {
  std::size_t kw, al, y, vals, c1, c2, rows1, rows2, keys, total;
};
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

// kListed: with a flush list, an instance of its own, which also does the window-state duties
// (nonflush_window_duties). The plain instance leaves every next window state to the flush kernel, which covers
// every sequence without a list, and is main's kernel as it was: with the duties ptxas chose 75-80 registers at
// dk = 128 instead of 64 (3 blocks per SM instead of 4). The listed instance asks for 4 blocks per SM there.
constexpr int kListedMinBlocks128 = 4;
template <StorageFormat R, int DK, bool kListed>
__global__ void __launch_bounds__(kThreads, kListed && DK == 128 ? kListedMinBlocks128 : 0) kda_nonflush_kernel(ReplayArgs A) {
  if constexpr (kListed) {
    const int b = blockIdx.y;
    const WindowState win = current_window(A.rec, b);
    const bool flush = win.h + 1 >= A.window;  // the flush kernel's sequence
    nonflush_window_duties(A, b, win, flush);
    if (!flush) kda_nonflush_body<R, DK>(A);
    step_block_done(A.rec, b, step_blocks_of(A, flush));
  } else {
    kda_nonflush_body<R, DK>(A);
    step_block_done(A.rec, blockIdx.y, 2 * gridDim.x);  // both kernels cover every sequence
  }
}

}  // namespace

void decode_detail::launch_kda_nonflush(StorageFormat read, const ReplayArgs& A, dim3 grid, cudaStream_t stream) {
  check_step_blocks(A, grid, false);
  const std::size_t smem = sizeof(float) * kda_nonflush_layout(A.window, A.shape.dk, A.shape.dv, A.skip_read > 0.0f).total;
  with_dk(A.shape.dk, [&](auto DK) {
    auto nonflush = [&](auto R) {  // the listed instance where the launcher passes a flush list
      const bool programmatic = flush_kernel_launched(A);
      if (A.flush_list) launch_replay_kernel(kda_nonflush_kernel<R(), DK(), true>, A, grid, smem, programmatic, stream);
      else launch_replay_kernel(kda_nonflush_kernel<R(), DK(), false>, A, grid, smem, programmatic, stream);
    };
    using SF = StorageFormat;
    switch (read) {
      case SF::fp32: nonflush(std::integral_constant<SF, SF::fp32>{}); break;
      case SF::fp16: nonflush(std::integral_constant<SF, SF::fp16>{}); break;
      case SF::bf16: nonflush(std::integral_constant<SF, SF::bf16>{}); break;
      case SF::fp8b128:
        if constexpr (DK() >= 128) nonflush(std::integral_constant<SF, SF::fp8b128>{});
        break;
      default: nonflush(std::integral_constant<SF, SF::nvfp4>{}); break;
    }
  });
}

}  // namespace replayssm::cuda
