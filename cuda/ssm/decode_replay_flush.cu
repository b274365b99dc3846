// ReplaySSM standard decode, the flush step: S = REPLAY(S_ckpt^recur, B[1:h+1]) on chip, the output S q,
// the recurrence copy written (RTN or SR) and, split, the read (LP) copy (REPLAYSSM.md sections 2-4).
#include "ssm/decode_replay.cuh"
#include "ssm/mma_tf32.cuh"

namespace replayssm::cuda {

using formats::StorageFormat;
using namespace detail;
using namespace decode_detail;

namespace {

// ---- flush: S = REPLAY(S_ckpt^recur, B[1:h+1]) on chip (h + 1 = L, or more after a verification commit), o = S q, write the recur copy (RTN, SR or ef) and the read (LP) copy (RTN or ef).
// Appendix F: a head whose gamma is below the recur copy's threshold folds from zero instead (a pure
// write). This kernel also serves GDN heads that skip their read at a non-flush step: REPLAY(0,
// B[1:h+1]) with every u recomputed from zero, o = S q, no checkpoint written.
// Each warp owns kFlushRows consecutive row slots (x in registers) and the window is folded as a
// small GEMM, S <- gamma S + V' K with V'[r][p] = w_p v_p[r] staged in shared memory: per record a
// lane reads its key columns once (16 bytes) and the row coefficients as broadcasts.
constexpr int kFlushRows = kFoldRows;

template <int DK>
struct FlushRows {
  using T = Tile<StorageFormat::fp32, DK>;
  static constexpr int P = T::P, LPR = T::LPR, RW = T::RW, G = kFlushRows;
  static constexpr int kRowsPerGroup = kWarps * G * RW;  // rows of one head per group
  __device__ static int row(int group, int warp, int j, int lane) { return ((group * kWarps + warp) * G + j) * RW + lane / LPR; }
};

template <int DK>
__device__ __forceinline__ void zero_flush_rows(float (*x)[FlushRows<DK>::P][4]) {
#pragma unroll
  for (int j = 0; j < FlushRows<DK>::G; ++j)
#pragma unroll
    for (int p = 0; p < FlushRows<DK>::P; ++p) x[j][p][0] = x[j][p][1] = x[j][p][2] = x[j][p][3] = 0.0f;
}

template <StorageFormat RecurF, int DK>
__device__ __forceinline__ void load_flush_rows(const HeadView& recur_view, int dv, int group, float (*x)[FlushRows<DK>::P][4]) {
  using FR = FlushRows<DK>;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int j = 0; j < FR::G; ++j) {
    const int row = FR::row(group, warp, j, lane);
#pragma unroll
    for (int p = 0; p < FR::P; ++p) {
      if (row < dv) load4<RecurF, DK>(recur_view, row, FR::T::col(lane, p), x[j][p]);
      else x[j][p][0] = x[j][p][1] = x[j][p][2] = x[j][p][3] = 0.0f;
    }
  }
}

// ---- The fold on the tensor cores (dk = 128) ----
// S <- gamma S + V'^T K for one warp's kFoldRows rows (eq. 5 summed over the window) as m16n8k8
// TF32 products, 8 records per product: M = 16 state columns, N = the warp's 8 rows, K = 8 records.
// A = the keys (bf16 values, exact in TF32), B = the row coefficients w_r v_r[row] as tf32 hi + lo
// (two products), the accumulators start at gamma S. Each product is exact in fp32; only the order of
// the sums differs from the CUDA-core fold. Nsight Compute had that fold's FMAs and shared-memory
// loads at about a third of the flush kernel's instructions: per 8 records a lane issued 256 FMAs
// and 24 loads, here 16 mma and 8 loads.
// The mma layout: M index i of m-tile m stands for column 4 (i mod 8) + 32 (m / 2) + 2 (m mod 2) +
// i / 8, so lane (g = lane / 4, t = lane % 4) holds rows 2t and 2t + 1 at the 16 columns
// 4g + 32 c + e (c, e = 0..3): acc[m] = {(2t, col), (2t + 1, col), (2t, col + 1), (2t + 1, col + 1)}
// with col = 4g + 32 (m / 2) + 2 (m mod 2) (mma_tf32's table). A lane's columns come in four 16-byte
// pieces, and the eight lanes of a row cover 128 contiguous bytes per piece: the checkpoint's loads
// and stores stay coalesced in this layout. The warp's buffer (sh.fold) holds rows in the order
// 0, 2, 4, 6, 1, 3, 5, 7 at a stride of dk + 8 floats, so that the eight lanes of a 16-byte access
// phase hit distinct banks whether they read a row piece (checkpoint layout) or a column piece (mma
// layout). A CPU re-enactment of the map: experiments/bench/decode_2026-12-04/call4_flush_grid/next/.
// Measured (H200, 2026-12-04, experiments/bench/decode_2026-12-04/call5_flush_mma/): Mamba-2's flush
// step gains; GDN's plain instances did not (within +-1%) and ptxas spilled more in them, but its
// error-feedback / appendix-F instances spill less (78 B against 214 B) and their flush gained 9%.
template <ssm::Recurrence K, StorageFormat RecurF, int DK, bool kExtras>
constexpr bool flush_fold_on_tensor_cores() {
  return flush_fold_buffer(DK) && (K == ssm::Recurrence::mamba2 || kExtras);
}

// The plain flush (Mamba-2, or GDN with its cached u) from an FP32 checkpoint streams its rows through
// the warp buffers with cp.async (flush_rows_pipelined) when there is no read copy: a kernel instance
// of its own (kStreamed), chosen at launch. Elsewhere the rows pass through registers. (In one
// instance with both paths ptxas spilled 160-184 B.)
template <ssm::Recurrence K, StorageFormat RecurF, int DK, bool kExtras>
constexpr bool flush_rows_streamed() {
  return RecurF == StorageFormat::fp32 && flush_fold_buffer(DK) && !kExtras;
}

__device__ __forceinline__ int fold_slot(int row) { return (row % 2) * 4 + row / 2; }  // the buffer's row order

// acc = gamma x the warp's rows in the buffer, read in the mma layout.
template <int DK>
__device__ __forceinline__ void fold_accumulators_from_buffer(const float* buf, float gamma, float (&acc)[kMmaTiles][4]) {
  constexpr int KS = flush_key_stride(DK);
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int c = 0; c < kMmaTiles / 2; ++c) {
    const float4 r0 = *reinterpret_cast<const float4*>(buf + fold_slot(2 * t) * KS + 4 * g + 32 * c);
    const float4 r1 = *reinterpret_cast<const float4*>(buf + fold_slot(2 * t + 1) * KS + 4 * g + 32 * c);
    acc[2 * c][0] = gamma * r0.x, acc[2 * c][1] = gamma * r1.x, acc[2 * c][2] = gamma * r0.y, acc[2 * c][3] = gamma * r1.y;
    acc[2 * c + 1][0] = gamma * r0.z, acc[2 * c + 1][1] = gamma * r1.z, acc[2 * c + 1][2] = gamma * r0.w,
                   acc[2 * c + 1][3] = gamma * r1.w;
  }
}

// dot[odd] = row 2t + odd of the warp's tile (mma layout) times `vec` (dk floats in shared memory): the
// lane's 16 columns, then the sum over the 8 lanes (g) that hold the row. Every lane gets both sums.
__device__ __forceinline__ void fold_row_dots(const float (&acc)[kMmaTiles][4], const float* vec, float (&dot)[2]) {
  const int g = threadIdx.x % 32 / 4;
  dot[0] = dot[1] = 0.0f;
#pragma unroll
  for (int c = 0; c < kMmaTiles / 2; ++c) {
    const float4 v4 = *reinterpret_cast<const float4*>(vec + 4 * g + 32 * c);
#pragma unroll
    for (int odd = 0; odd < 2; ++odd) {
      const float4 s4 = fold_piece(acc, c, odd);
      dot[odd] = fmaf(s4.w, v4.w, fmaf(s4.z, v4.z, fmaf(s4.y, v4.y, fmaf(s4.x, v4.x, dot[odd]))));
    }
  }
#pragma unroll
  for (int mask = 4; mask < 32; mask *= 2)
#pragma unroll
    for (int odd = 0; odd < 2; ++odd) dot[odd] += __shfl_xor_sync(kFullMask, dot[odd], mask);
}

// The fold for rows held in registers in the checkpoint layout (x[j]: row j, columns 4 lane .. + 3):
// through the warp's buffer into the mma layout and back.
template <int DK>
__device__ __forceinline__ void fold_window_mma(float (*x)[FlushRows<DK>::P][4], float gamma, const ReplayShared& sh,
                                                const float* vals, int dv, int row0, int staged) {
  static_assert(DK == 128 && FlushRows<DK>::P == 1 && FlushRows<DK>::RW == 1 && kFlushRows == 8,
                "the mma fold's map is written for dk = 128: 8 rows x 128 columns per warp");
  constexpr int KS = flush_key_stride(DK);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, t = lane % 4, g = lane / 4;
  float* const buf = sh.fold + static_cast<std::size_t>(warp) * kFoldRows * KS;
  __syncwarp();  // the previous group's reads of buf are done
#pragma unroll
  for (int j = 0; j < 8; ++j)
    *reinterpret_cast<float4*>(buf + fold_slot(j) * KS + 4 * lane) = make_float4(x[j][0][0], x[j][0][1], x[j][0][2], x[j][0][3]);
  __syncwarp();
  float acc[kMmaTiles][4];
  fold_accumulators_from_buffer<DK>(buf, gamma, acc);
  fold_records_mma<flush_key_stride(DK)>(acc, sh.keys, [&](int p, int row) { return vals[p * dv + row]; }, dv, row0, staged);
  __syncwarp();
#pragma unroll
  for (int c = 0; c < kMmaTiles / 2; ++c)
#pragma unroll
    for (int odd = 0; odd < 2; ++odd)
      *reinterpret_cast<float4*>(buf + fold_slot(2 * t + odd) * KS + 4 * g + 32 * c) = fold_piece(acc, c, odd);
  __syncwarp();
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float4 v = *reinterpret_cast<const float4*>(buf + fold_slot(j) * KS + 4 * lane);
    x[j][0][0] = v.x, x[j][0][1] = v.y, x[j][0][2] = v.z, x[j][0][3] = v.w;
  }
}

// Starts loading the warp's tile of 8 rows from `rows` (an FP32 checkpoint, dk columns per row) into its
// buffer; rows at or past `valid` are zero-filled instead of read.
template <int DK>
__device__ __forceinline__ void prefetch_fold_tile(const float* rows, int valid, float* buf) {
  constexpr int KS = flush_key_stride(DK);
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < 8; ++j)
    copy_async16(buf + fold_slot(j) * KS + 4 * lane, rows + static_cast<std::size_t>(j < valid ? j : 0) * DK + 4 * lane, j < valid);
  copy_async_commit();
}

// The streamed flush's tiles (flush_rows_streamed): warp w's first tile, and the one after a tile.
// Mamba-2 walks the block's heads' rows as one (NH dv) x dk matrix (they are adjacent in memory; the
// launcher streams only when dv % 8 == 0, so no tile spans two heads): warp w takes rows 8w, 8w + 64,
// ... At dv = 80 that is 4 tiles per warp where row groups per head took 6, half of them with 6 of 8
// warps idle (Nano's flush step 581 -> 541 us, experiments/bench/decode_2026-12-04/call5_flush_mma/
// call4_tiles/). GDN keeps row groups per head (group, head): with the same walk its streamed instance
// spilled 32 B (12 B this way) and its flush step took 5% longer (dv = 128: the same tiles).
struct FlushTile {
  int n, row0;  // head, first row
};
template <ssm::Recurrence K, int DK>
__device__ __forceinline__ bool flush_tile_at(const BlockGeometry& bg, int i, FlushTile& tile) {
  const int warp = threadIdx.x / 32, dv = bg.dv;
  if constexpr (K == ssm::Recurrence::mamba2) {
    const int tile0 = kFoldRows * (warp + kWarps * i);
    tile.n = tile0 / dv;
    tile.row0 = tile0 - tile.n * dv;
    return tile0 < bg.NH * dv;
  } else {
    const int groups = (dv + FlushRows<DK>::kRowsPerGroup - 1) / FlushRows<DK>::kRowsPerGroup;
    tile.n = i / groups;
    tile.row0 = FlushRows<DK>::row(i - tile.n * groups, warp, 0, 0);
    return i < bg.NH * groups;
  }
}
// The rows of `tile` in the block's FP32 checkpoint and how many of them are rows of the head. (Taken
// from the kernel parameters each time: a pointer kept live across the block cost ptxas spills.)
template <int DK>
__device__ __forceinline__ const float* flush_tile_rows(const ReplayArgs& A, const BlockGeometry& bg, const FlushTile& tile,
                                                        int& valid) {
  const int dv = bg.dv;
  const float* const block_rows =
      reinterpret_cast<const float*>(head_view(A.recur, static_cast<std::size_t>(bg.b) * bg.H + bg.head0, dv, DK).payload);
  valid = max(0, min(kFoldRows, dv - tile.row0));
  // A tile past the head's rows (GDN's row groups at dv % 64 != 0) reads nothing: any valid address.
  return valid > 0 ? block_rows + (static_cast<std::size_t>(tile.n) * dv + tile.row0) * DK : block_rows;
}

// The warp's tile i of the streamed flush (rows row0 .. row0 + 7 of head n), already loading into its
// buffer. Waits for it, starts loading tile i + 1, folds, then (GDN) the current token, the output and
// the stores, in the mma layout (rows past dv: zero, not stored).
template <ssm::Recurrence K, int DK>
__device__ __forceinline__ void flush_tile(const ReplayArgs& A, const BlockGeometry& bg, const WindowState& win,
                                           const ReplayShared& sh, float* buf, int i, int n,
                                           int row0, int staged) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4, dv = bg.dv;
  const std::size_t hb = static_cast<std::size_t>(bg.b) * bg.H + bg.head0 + n;
  copy_async_wait_all();
  __syncwarp();
  float acc[kMmaTiles][4];
  fold_accumulators_from_buffer<DK>(buf, sh.gamma[n], acc);
  __syncwarp();  // every lane has read the buffer: the next tile may overwrite it
  FlushTile next;
  if (flush_tile_at<K, DK>(bg, i + 1, next)) {
    int valid = 0;
    const float* const rows = flush_tile_rows<DK>(A, bg, next, valid);
    prefetch_fold_tile<DK>(rows, valid, buf);
  }
  // The records as the ring stores them (stage_window_records: Mamba-2 bf16 v, GDN fp32 u, [p][NH dv]), each
  // weighted here: w_p v_p[row], the same single product the weighted staging stored.
  fold_records_mma<flush_key_stride(DK)>(
      acc, sh.keys,
      [&](int p, int row) {
        const int at = (p * bg.NH + n) * dv + row;
        const float w = sh.w[n * sh.stride + p];
        if constexpr (K == ssm::Recurrence::mamba2) return w * __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(sh.vals)[at]);
        else return w * sh.vals[at];
      },
      dv, row0, staged);
  if constexpr (K == ssm::Recurrence::gdn) {
    // The current token: u = beta (v - a S k), S <- a S + u k^T, u kept in the ring (as replay_flush_head).
    const float* const k_s = sh.query + DK;
    float sk[2];
    fold_row_dots(acc, k_s, sk);
    const float a_t = A.in.alpha[hb], beta_t = A.in.beta[hb];
    float u_row[2];
#pragma unroll
    for (int odd = 0; odd < 2; ++odd) {
      const int row = row0 + 2 * t + odd;
      const float vr = row < dv ? __bfloat162float(A.in.v[hb * dv + row]) : 0.0f;
      u_row[odd] = beta_t * (vr - a_t * sk[odd]);
      if (g == 0 && row < dv) A.rec.u[(ring_slot(A.rec, bg.b, win, win.h) * bg.H + bg.head0 + n) * dv + row] = u_row[odd];
    }
#pragma unroll
    for (int c = 0; c < kMmaTiles / 2; ++c) {
      const float4 k4 = *reinterpret_cast<const float4*>(k_s + 4 * g + 32 * c);
      // acc[2c] holds columns +0, +1 of piece c, acc[2c + 1] columns +2, +3; index odd + 2 * (column parity).
      const float kc[4] = {k4.x, k4.y, k4.z, k4.w};
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          acc[2 * c + half][e] = fmaf(a_t, acc[2 * c + half][e], u_row[e % 2] * kc[2 * half + e / 2]);
    }
  }
  float o[2];  // o = S q
  fold_row_dots(acc, sh.query, o);
  const HeadView view = head_view(A.recur, hb, dv, DK);
#pragma unroll
  for (int odd = 0; odd < 2; ++odd) {
    const int row = row0 + 2 * t + odd;
    if (row >= dv) continue;
    if (g == 0) A.in.out[hb * dv + row] = o[odd];
#pragma unroll
    for (int c = 0; c < kMmaTiles / 2; ++c) {
      const float4 s4 = fold_piece(acc, c, odd);
      const float piece[4] = {s4.x, s4.y, s4.z, s4.w};
      store_piece<StorageFormat::fp32, DK>(view, row, 4 * g + 32 * c, piece, formats::RoundingMode::nearest_even, 0, 0);
    }
  }
}

// The flush of the block's NH heads with the rows streamed: the next tile's rows load (cp.async into
// the warp's buffer) while this one folds, writes its output and stores its rows, so a warp keeps 4 KB
// of loads in flight across its compute instead of waiting at each head's load. The first tile's loads
// were issued before the window was staged (replay_flush_block). sh.query holds q_t and, for GDN, k_t.
template <ssm::Recurrence K, int DK>
__device__ void flush_rows_pipelined(const ReplayArgs& A, const BlockGeometry& bg, const WindowState& win, const ReplayShared& sh,
                                     int staged) {
  float* const buf = sh.fold + static_cast<std::size_t>(threadIdx.x / 32) * kFoldRows * flush_key_stride(DK);
  FlushTile tile;
  for (int i = 0; flush_tile_at<K, DK>(bg, i, tile); ++i) flush_tile<K, DK>(A, bg, win, sh, buf, i, tile.n, tile.row0, staged);
}

// Flush of value head n of the block. Mamba-2 and shared GDN fold the staged records as a rank-
// `staged` update (GDN: the cached u, then the current token as a conventional step); split GDN
// recomputes every u on the recur (HP) path from the raw records (Algorithm 3 for GDN). `x` holds the
// head's first row group on entry (the caller issued those loads early). `from_zero` (appendix F):
// the checkpoint is not read, x starts at zero and GDN recomputes every u from there. `write`: a
// flush (write the copies); else a skipped GDN non-flush read (output and the current u only).
template <ssm::Recurrence K, StorageFormat RecurF, int DK, bool kExtras>
__device__ void replay_flush_head(const ReplayArgs& A, const BlockGeometry& bg, int n, const WindowState& win,
                                  const ReplayShared& sh, int staged, const float (*kv)[4], const float (*qv)[4],
                                  float (*x)[FlushRows<DK>::P][4], bool from_zero, bool write) {
  using FR = FlushRows<DK>;
  constexpr int P = FR::P, LPR = FR::LPR, G = FR::G, E = 4;
  const int L = sh.stride, h0 = win.h, dv = bg.dv;  // h0: window position of the current token
  const int head = bg.head0 + n, vh = bg.vh0 + n;
  const std::size_t hb = static_cast<std::size_t>(bg.b) * bg.H + head;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const HeadView recur_view = head_view(A.recur, hb, dv, DK);
  const HeadView read_view = A.split ? head_view(A.read, hb, dv, DK) : HeadView{};
  const bool recompute_u = K == ssm::Recurrence::gdn && (A.split || (kExtras && from_zero));
  const float* vals = sh.vals + static_cast<std::size_t>(n) * L * dv;  // [p][dv]
  float* const recur_residual = kExtras && A.recur_ef ? head_residual(A.recur, hb, dv, DK) : nullptr;
  float* const read_residual = kExtras && A.split ? head_residual(A.read, hb, dv, DK) : nullptr;
  const float a_t = A.in.alpha[hb];
  const float beta_t = K == ssm::Recurrence::gdn ? A.in.beta[hb] : 0.0f;
  const float gamma = sh.gamma[n];
  const uint64_t recur_stream = sr_stream_device(bg.b, bg.g, vh, 0, win.flushes);
  const bool need_amax = write && A.split && A.read.format == StorageFormat::nvfp4;
  float local_amax = 0.0f;
  const int groups = (dv + FR::kRowsPerGroup - 1) / FR::kRowsPerGroup;
  for (int group = 0; group < groups; ++group) {
    if (group > 0) {
      if (kExtras && from_zero) zero_flush_rows<DK>(x);
      else load_flush_rows<RecurF, DK>(recur_view, dv, group, x);
    }
    int rows[G];
#pragma unroll
    for (int j = 0; j < G; ++j) rows[j] = FR::row(group, warp, j, lane);
    if (!recompute_u && flush_fold_on_tensor_cores<K, RecurF, DK, kExtras>()) {
      if constexpr (flush_fold_on_tensor_cores<K, RecurF, DK, kExtras>()) fold_window_mma<DK>(x, gamma, sh, vals, dv, rows[0], staged);
    } else if (!recompute_u) {
#pragma unroll
      for (int j = 0; j < G; ++j)
#pragma unroll
        for (int p = 0; p < P; ++p)
#pragma unroll
          for (int e = 0; e < E; ++e) x[j][p][e] *= gamma;
      // The G rows of a lane are consecutive when RW == 1: their coefficients are 16-byte loads.
      const bool vector_coefs = FR::RW == 1 && dv % 4 == 0 && rows[G - 1] < dv;
      for (int r = 0; r < staged; ++r) {
        float k[P][E];
#pragma unroll
        for (int p = 0; p < P; ++p) {
          const float4 k4 = *reinterpret_cast<const float4*>(sh.keys + r * flush_key_stride(DK) + FR::T::col(lane, p));
          k[p][0] = k4.x, k[p][1] = k4.y, k[p][2] = k4.z, k[p][3] = k4.w;
        }
        float c[G];  // w_r v_r[row]
        if (vector_coefs) {
#pragma unroll
          for (int i = 0; i < G / 4; ++i) {
            const float4 c4 = reinterpret_cast<const float4*>(vals + r * dv + rows[0])[i];
            c[4 * i] = c4.x, c[4 * i + 1] = c4.y, c[4 * i + 2] = c4.z, c[4 * i + 3] = c4.w;
          }
        } else {
#pragma unroll
          for (int j = 0; j < G; ++j) c[j] = rows[j] < dv ? vals[r * dv + rows[j]] : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < G; ++j)
#pragma unroll
          for (int p = 0; p < P; ++p)
#pragma unroll
            for (int e = 0; e < E; ++e) x[j][p][e] = fmaf(c[j], k[p][e], x[j][p][e]);
      }
    } else {
      // GDN split: u_r^HP = b_r (v_r - a_r S_{r-1} k_r), sequentially from the recur (HP) checkpoint.
      for (int r = 0; r < staged; ++r) {
        float k[P][E];
#pragma unroll
        for (int p = 0; p < P; ++p) {
          const float4 k4 = *reinterpret_cast<const float4*>(sh.keys + r * flush_key_stride(DK) + FR::T::col(lane, p));
          k[p][0] = k4.x, k[p][1] = k4.y, k[p][2] = k4.z, k[p][3] = k4.w;
        }
        float sk[G];
#pragma unroll
        for (int j = 0; j < G; ++j) {
          sk[j] = 0.0f;
#pragma unroll
          for (int p = 0; p < P; ++p) sk[j] = dot_acc<E>(x[j][p], k[p], sk[j]);
        }
        row_sums_all<LPR, G>(sk);
        const float ar = sh.a[n * L + r], br = sh.beta[n * L + r];
#pragma unroll
        for (int j = 0; j < G; ++j) {
          const float u = rows[j] < dv ? br * (vals[r * dv + rows[j]] - ar * sk[j]) : 0.0f;
#pragma unroll
          for (int p = 0; p < P; ++p)
#pragma unroll
            for (int e = 0; e < E; ++e) x[j][p][e] = fmaf(ar, x[j][p][e], u * k[p][e]);
        }
      }
    }
    if constexpr (K == ssm::Recurrence::gdn) {  // the current token, as a conventional GDN step from S_{t-1}
      float sk[G];
#pragma unroll
      for (int j = 0; j < G; ++j) {
        sk[j] = 0.0f;
#pragma unroll
        for (int p = 0; p < P; ++p) sk[j] = dot_acc<E>(x[j][p], kv[p], sk[j]);
      }
      row_sums_all<LPR, G>(sk);
#pragma unroll
      for (int j = 0; j < G; ++j) {
        const bool valid = rows[j] < dv;
        const float vr = valid ? __bfloat162float(A.in.v[hb * dv + rows[j]]) : 0.0f;
        const float u = beta_t * (vr - a_t * sk[j]);
#pragma unroll
        for (int p = 0; p < P; ++p)
#pragma unroll
          for (int e = 0; e < E; ++e) x[j][p][e] = fmaf(a_t, x[j][p][e], u * kv[p][e]);
        if (valid && lane % LPR == 0) A.rec.u[(ring_slot(A.rec, bg.b, win, h0) * bg.H + head) * dv + rows[j]] = u;
      }
    }
    float o[G];
#pragma unroll
    for (int j = 0; j < G; ++j) {
      o[j] = 0.0f;
#pragma unroll
      for (int p = 0; p < P; ++p) o[j] = dot_acc<E>(x[j][p], qv[p], o[j]);
    }
    {
      const float sum = row_sum_scatter<LPR, G>(o);
      const int row = FR::row(group, warp, scatter_index<LPR, G>(lane), lane);
      if (lane % (LPR / G) == 0 && row < dv) A.in.out[hb * dv + row] = sum;
    }
    if (kExtras && !write) continue;
#pragma unroll
    for (int j = 0; j < G; ++j) {
      const bool valid = rows[j] < dv;
      if (valid) {
#pragma unroll
        for (int p = 0; p < P; ++p) {
          const int col = FR::T::col(lane, p);
          if constexpr (kExtras && RecurF != StorageFormat::fp32) {
            if (recur_residual) store_piece_ef<RecurF, DK>(recur_view, rows[j], col, x[j][p], recur_residual);
            else store_piece<RecurF, DK>(recur_view, rows[j], col, x[j][p], A.recur_mode, A.seed, recur_stream);
          } else {
            store_piece<RecurF, DK>(recur_view, rows[j], col, x[j][p], A.recur_mode, A.seed, recur_stream);
          }
          if (need_amax) {
            // The tensor amax of the LP copy's input: S, or S + E with error feedback (as the CPU takes it).
            float e4[E];
            if constexpr (kExtras) load_residual4<DK>(read_residual, rows[j], col, e4);
#pragma unroll
            for (int e = 0; e < E; ++e) {
              const float ax = fabsf(kExtras && read_residual ? __fadd_rn(x[j][p][e], e4[e]) : x[j][p][e]);
              if (ax < INFINITY && ax > local_amax) local_amax = ax;
            }
          }
        }
      }
      if (A.split && !need_amax)
        store_read_row<DK, P, LPR>(read_view, A.read.format, rows[j], lane, x[j], valid, {}, read_residual);
    }
  }
  if (need_amax) {
    // NVFP4 LP copy: tensor scale from the block-wide amax, then re-read the recur rows this block
    // just wrote (fp32, L2-resident) and quantize them.
    using T = Tile<StorageFormat::fp32, DK>;
    const float amax = block_max(local_amax, sh.scratch);
    const formats::Nvfp4TensorScale ts = formats::nvfp4_tensor_scale(amax);
    if (threadIdx.x == 0) *read_view.tensor_scale_out = ts.decode;
    __syncthreads();
    const int iterations = (dv + kWarps * T::RW - 1) / (kWarps * T::RW);
    for (int it = 0; it < iterations; ++it) {
      const int row = (it * kWarps + warp) * T::RW + T::row_in_iteration(lane);
      const bool valid = row < dv;
      float y[P][E];
#pragma unroll
      for (int p = 0; p < P; ++p) {
        if (valid) load4<RecurF, DK>(recur_view, row, T::col(lane, p), y[p]);
        else for (int e = 0; e < E; ++e) y[p][e] = 0.0f;
      }
      store_read_row<DK, P, LPR>(read_view, StorageFormat::nvfp4, row, lane, y, valid, ts, read_residual);
    }
  }
}

// Record vectors staged as 16-byte chunks (decode_replay.cuh) in the plain Mamba-2 instances at dk >= 128.
// Elsewhere ptxas spilled at this kernel's 80-register bound (sm_90): GDN 212 B at dk = 128, Mamba-2
// 24 B at dk = 64 and 94 B with error feedback (fp16 recur copy).
template <ssm::Recurrence K, int DK, bool kExtras>
constexpr bool chunked_flush_records() { return K == ssm::Recurrence::mamba2 && DK >= 128 && !kExtras; }

// `flush`: the sequence's window is full (fold, output, write). Else (GDN with skip_read only) the
// block serves the heads whose non-flush read is skipped, and returns at once if there are none.
// kStreamed: the launcher chose flush_rows_pipelined (every block that gets here flushes, no read copy).
template <ssm::Recurrence K, StorageFormat RecurF, int DK, bool kExtras, bool kStreamed>
__device__ void replay_flush_block(const ReplayArgs& A, const BlockGeometry& bg, const WindowState& win, const ReplayShared& sh,
                                   bool flush) {
  using FR = FlushRows<DK>;
  const int h0 = win.h, dv = bg.dv;  // the current token is window position h0 (h0 + 1 >= L when flushing)
  const int lane = threadIdx.x % 32;
  const float threshold = flush ? A.skip_flush : A.skip_read;
  const bool skip_on = kExtras && threshold > 0.0f;
  // Appendix F: the decisions come first, so that no skipped checkpoint row is loaded.
  if (skip_on) stage_skip_flags(A, bg, win, sh, h0, threshold);
  auto skipped = [&](int n) { return skip_on && sh.skip[n] != 0.0f; };
  if (!flush) {
    bool any = false;
    for (int n = 0; n < bg.NH; ++n) any = any || skipped(n);
    if (!any) return;  // block-uniform: the flags are in shared memory
  }
  const bool recompute_u = K == ssm::Recurrence::gdn && A.split;
  const int staged = K == ssm::Recurrence::mamba2 ? h0 + 1 : h0;  // Mamba-2 folds the current token too
  const __nv_bfloat16* k_t = A.in.k + (static_cast<std::size_t>(bg.b) * bg.G + bg.g) * DK;
  float kv[FR::P][4], qv[FR::P][4];
  load_lane_vector<4, FR::P, FR::LPR>(k_t, lane, kv);
  load_lane_vector<4, FR::P, FR::LPR>(A.in.q + (static_cast<std::size_t>(bg.b) * bg.G + bg.g) * DK, lane, qv);
  // The first head's first row group does not depend on the records: issue its loads first.
  static_assert(!kStreamed || flush_rows_streamed<K, RecurF, DK, kExtras>(), "no streamed flush for this instance");
  float x[FR::G][FR::P][4];
  if constexpr (kStreamed) {
    FlushTile first;
    if (flush_tile_at<K, DK>(bg, 0, first)) {
      int valid = 0;
      const float* const rows = flush_tile_rows<DK>(A, bg, first, valid);
      prefetch_fold_tile<DK>(rows, valid, sh.fold + static_cast<std::size_t>(threadIdx.x / 32) * kFoldRows * flush_key_stride(DK));
    }
    // The window's records as stored, by cp.async (no registers, no barrier on the decay weights first):
    // flush_tile weights them at use.
    stage_window_records<K>(A, bg, win, sh.vals, h0, staged);
    if (threadIdx.x < DK) {  // q_t, and k_t after it (GDN's current token)
      const bool key = threadIdx.x >= DK / 2;
      const int i = threadIdx.x % (DK / 2);
      const __nv_bfloat16* v = (key ? A.in.k : A.in.q) + (static_cast<std::size_t>(bg.b) * bg.G + bg.g) * DK;
      reinterpret_cast<float2*>(sh.query + (key ? DK : 0))[i] = __bfloat1622float2(reinterpret_cast<const __nv_bfloat162*>(v)[i]);
    }
  } else if (skipped(0) || !flush) {
    zero_flush_rows<DK>(x);
  } else {
    load_flush_rows<RecurF, DK>(head_view(A.recur, static_cast<std::size_t>(bg.b) * bg.H + bg.head0, dv, DK), dv, 0, x);
  }
  // Stage the window once for the NH heads: keys, record vectors, decays and their weights.
  copy_unrolled<4>(
      staged * DK / 2,
      [&](int i) {  // two columns per element
        const int p = 2 * i / DK, c = 2 * i % DK;
        const __nv_bfloat16* kp = p == h0 ? k_t : A.rec.k + (ring_slot(A.rec, bg.b, win, p) * bg.G + bg.g) * DK;
        return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(kp + c));
      },
      [&](int i, float2 x) {
        const int p = 2 * i / DK, c = 2 * i % DK;
        *reinterpret_cast<float2*>(sh.keys + p * flush_key_stride(DK) + c) = x;
      });
  stage_decay_weights(A, bg, win, sh, h0, staged, K == ssm::Recurrence::gdn);
  if constexpr (kStreamed) {
    copy_async_wait_all();  // this thread's record pieces; the barrier publishes everyone's
  } else {
    __syncthreads();  // weights ready: the record vectors are staged as V'[p][r] = w_p v_p[r]
    stage_record_vectors<K, chunked_flush_records<K, DK, kExtras>()>(A, bg, win, sh.vals, sh.stride, h0, staged, recompute_u,
                                                                    recompute_u ? nullptr : sh.w, skip_on ? sh.skip : nullptr);
  }
  __syncthreads();
  if constexpr (kStreamed) {
    flush_rows_pipelined<K, DK>(A, bg, win, sh, staged);
  } else {
    for (int n = 0; n < bg.NH; ++n) {
      if (!flush && !skipped(n)) continue;  // the non-flush kernel serves this head
      if (n > 0) {
        if (skipped(n)) zero_flush_rows<DK>(x);
        else load_flush_rows<RecurF, DK>(head_view(A.recur, static_cast<std::size_t>(bg.b) * bg.H + bg.head0 + n, dv, DK), dv, 0, x);
      }
      replay_flush_head<K, RecurF, DK, kExtras>(A, bg, n, win, sh, staged, kv, qv, x, skipped(n), flush);
    }
  }
}

template <int DK>
constexpr int flush_min_blocks() { return DK == 256 ? 2 : 3; }

// kExtras: error feedback or appendix F skipping in use (a separate instantiation, so that the
// plain kernel keeps its register allocation: measured with ptxas, one kernel for both spilled).
// kStreamed: the plain flush with streamed rows (flush_rows_streamed), likewise an instance of its own.
// kListed: the grid's rows are ReplayConfig::flush_list's sequences, also an instance of its own: its sequence
// index is loaded, where the plain kernel's is blockIdx.y, which ptxas rematerialises instead of keeping a
// register. One kernel for both spilled more (GDN's streamed FP32 flush 16 -> 36 B), and GDN's FP32 flush
// step took 1.14x main's time, with a list or without (H100, 2026-12-06, decode_2026-12-06/session25/).
template <ssm::Recurrence K, StorageFormat RecurF, int DK, bool kExtras, bool kStreamed, bool kListed>
__global__ void __launch_bounds__(kThreads, flush_min_blocks<DK>()) replay_flush_kernel(ReplayArgs A) {
  extern __shared__ float smem[];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // The non-flush kernel touches only non-flushing sequences (and reads the current window-state
  // copy, which this kernel does not write): let it launch as soon as every block here has started.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  const BlockGeometry bg = kListed ? block_geometry(A.shape, A.heads_per_block, flush_block_sequence(A))
                                   : block_geometry(A.shape, A.heads_per_block);
  const WindowState win = current_window(A.rec, bg.b);
  const bool flush = win.h + 1 >= A.window;  // h == L after appending; more after a verification commit
  // The launcher sizes `stage` for every h a commit can leave; more would overrun shared memory. A listed
  // sequence must flush (ReplayConfig::flush_list).
  if ((flush && win.h + 1 > A.stage) || (kListed && !flush)) __trap();
  // The non-flush kernel writes the next window state of the sequences that do not flush.
  if (flush && blockIdx.x == 0 && threadIdx.x == 0) write_next_window(A.rec, bg.b, next_window(win, true, A.rec.capacity));
  // GDN heads that skip their non-flush read (appendix F) recompute every u from zero: a fold, so
  // this kernel serves them (the non-flush kernel appends the record and serves the other heads).
  const bool gdn_skipped_reads = kExtras && K == ssm::Recurrence::gdn && !flush && A.skip_read > 0.0f;
  if (flush || gdn_skipped_reads) {
    const ReplayShared sh = carve_shared(smem, A.stage, DK, bg.dv, bg.NH, true, false);
    if (flush) append_record(A, bg, win, DK, K == ssm::Recurrence::gdn);
    replay_flush_block<K, RecurF, DK, kExtras, kStreamed>(A, bg, win, sh, flush);
  }
  step_block_done(A.rec, bg.b, step_blocks_of(A, flush));  // this kernel's and the non-flush kernel's blocks
}

}  // namespace

void decode_detail::launch_replay_flush(ssm::Recurrence kind, StorageFormat recur, const ReplayArgs& A, dim3 grid,
                                        cudaStream_t stream) {
  check_step_blocks(A, grid, true);
  const std::size_t smem = sizeof(float) * replay_shared_floats(A.stage, A.shape.dk, A.shape.dv, A.heads_per_block, true, false);
  with_kind(kind, [&](auto K) {
    with_dk(A.shape.dk, [&](auto DK) {
      // Launched first, as a plain launch; the non-flush kernel follows as its programmatic
      // dependent (decode_replay.cu). The listed instance where the launcher passes a flush list.
      auto launch = [&](auto F, auto kExtras, auto kStreamed) {
        if (A.flush_list)
          launch_replay_kernel(replay_flush_kernel<K(), F(), DK(), kExtras(), kStreamed(), true>, A, grid, smem, false, stream);
        else
          launch_replay_kernel(replay_flush_kernel<K(), F(), DK(), kExtras(), kStreamed(), false>, A, grid, smem, false, stream);
      };
      using Fp32 = std::integral_constant<StorageFormat, StorageFormat::fp32>;
      using Fp16 = std::integral_constant<StorageFormat, StorageFormat::fp16>;
      const bool extras = A.recur_ef || A.read.residual != nullptr || A.skip_read > 0.0f || A.skip_flush > 0.0f;
      if (recur == StorageFormat::fp32) {
        if (extras) {
          launch(Fp32{}, std::true_type{}, std::false_type{});
        } else if constexpr (flush_rows_streamed<K(), StorageFormat::fp32, DK(), false>()) {
          // dv % 8: flush_rows_pipelined's 8-row tiles must not span two heads.
          if (!A.split && A.shape.dv % kFoldRows == 0) launch(Fp32{}, std::false_type{}, std::true_type{});
          else launch(Fp32{}, std::false_type{}, std::false_type{});
        } else {
          launch(Fp32{}, std::false_type{}, std::false_type{});
        }
      } else if (recur == StorageFormat::fp16) {
        if (extras) launch(Fp16{}, std::true_type{}, std::false_type{});
        else launch(Fp16{}, std::false_type{}, std::false_type{});
      }
      else throw std::invalid_argument("the recurrence checkpoint is fp32 or fp16");
    });
  });
}

}  // namespace replayssm::cuda
