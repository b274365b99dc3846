// ReplaySSM standard decode for KDA, the flush step: REPLAY from the recur checkpoint, writing it and,
// split, the LP copy; decode_kda_replay.cu launches it first, as a plain launch.
#include "ssm/decode_kda.cuh"

namespace replayssm::cuda {

using formats::StorageFormat;
using namespace detail;
using namespace decode_detail;

namespace {

// ---- flush step ------------------------------------------------------------------------------
// Shared memory (floats): scratch [kWarps], keys [S][DK], decays [S][DK], G [DK], vals [S][dv],
// betas [S], then, 16-byte aligned, keys [S][DK] in bf16 (the closed form's cp.async target); S = the
// launch's `stage`. The closed form stages the bf16 keys and the decays and turns them into weighted keys
// (fp32); the raw layout (u recomputed from the raw records) serves split flushes and, when skipping is
// on, skipped flushes of shared ones.
__host__ __device__ constexpr std::size_t flush_keys16_offset_floats(int S, int DK, int dv) {
  return round_up4(kWarps + 2 * static_cast<std::size_t>(S) * DK + DK + static_cast<std::size_t>(S) * dv + S);
}
std::size_t flush_shared_floats(int S, int DK, int dv) {
  return flush_keys16_offset_floats(S, DK, dv) + static_cast<std::size_t>(S) * DK / 2;
}

// Flush of one value head (h0 + 1 >= L; more than L records only after a verification commit):
// S = REPLAY(S_ckpt^recur, B[1:h0+1]), o = S q, then the recur copy (RTN, SR or ef) and, split, the
// read (LP, RTN or ef) copy are written. Rows are independent; each lane group holds RB rows (closed
// form) or one row (recomputed corrections) in registers.
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
template <StorageFormat F, int DK, int RB, int AHEAD>
__device__ __forceinline__ void kda_flush_body(const ReplayArgs& A, int b, const WindowState& win) {
  extern __shared__ float smem[];
  const KdaBlock kb = kda_block(A.shape, b);
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

  using T = Tile<StorageFormat::fp32, DK>;
  constexpr int E = 4, P = T::P, LPR = T::LPR, RW = T::RW;
  const HeadView recur_view = head_view(A.recur, kb.hb, dv, DK);
  float* const recur_residual = head_residual(A.recur, kb.hb, dv, DK);  // set exactly with ef (make_replay_args)
  const uint64_t recur_stream = sr_stream_device(kb.b, kb.g, kb.vh, 0, win.flushes);
  // One row's recur store (RTN, SR, or ef for an fp16 copy with a residual).
  auto store_recur = [&](int row, int col, const float* x) {
    if constexpr (F == StorageFormat::fp16) {
      if (recur_residual != nullptr) store_piece_ef<F, DK>(recur_view, row, col, x, recur_residual);
      else store_piece<F, DK>(recur_view, row, col, x, A.recur_mode, A.seed, recur_stream);
    } else {
      store_piece<F, DK>(recur_view, row, col, x, A.recur_mode, A.seed, recur_stream);
    }
  };
  if (!recompute) {
    // The closed form. Each lane group holds RB adjacent rows, so one shared-memory load of a weighted
    // key serves RB rows' FMAs: at RB = 1 the fold reads 4 bytes of shared memory per FMA, and on Kimi
    // Linear at B = 256 (15 records, 8,192 heads of 128 x 128) that is ~62 MB per SM per step, about
    // 0.25 ms at 128 B per clock, as long as the DRAM stream. The rows' arithmetic is unchanged, element
    // by element and in the same order (x G, then fmaf over the records, then the current token), so
    // the outputs and checkpoints are those of one row per lane group. AHEAD iterations' rows are in
    // flight while one is folded; the first ones are issued before the records are staged.
    constexpr int kRowsPerIteration = kWarps * RW * RB;
    const int iterations = (dv + kRowsPerIteration - 1) / kRowsPerIteration;
    const int group_row0 = (warp * RW + T::row_in_iteration(lane)) * RB;  // + it * kRowsPerIteration
    auto load_rows = [&](int it, float (*x)[P][E]) {
      const int row0 = it * kRowsPerIteration + group_row0;
#pragma unroll
      for (int r = 0; r < RB; ++r)
#pragma unroll
        for (int p = 0; p < P; ++p) {
          if (it < iterations && row0 + r < dv) load4<F, DK>(recur_view, row0 + r, T::col(lane, p), x[r][p]);
          else x[r][p][0] = x[r][p][1] = x[r][p][2] = x[r][p][3] = 0.0f;
        }
    };
    float ahead[AHEAD][RB][P][E];
#pragma unroll
    for (int a = 0; a < AHEAD; ++a) load_rows(a, ahead[a]);
    // The cached corrections, keys (bf16, as stored) and decays by cp.async, all in flight at once.
    __nv_bfloat16* keys16 = reinterpret_cast<__nv_bfloat16*>(smem + flush_keys16_offset_floats(S, DK, dv));
    const auto aligned = [](const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0; };
    if (dv % 4 == 0 && aligned(A.rec.u)) {
      const int per_position = dv / 4;
      for (int i = threadIdx.x; i < h0 * per_position; i += kThreads) {
        const int p = i / per_position, piece = i - p * per_position;
        copy_async16(vals + static_cast<std::size_t>(p) * dv + piece * 4,
                     A.rec.u + (slot_of(p) * kb.H + kb.head) * dv + piece * 4, true);
      }
    } else {
      for (int i = threadIdx.x; i < h0 * dv; i += kThreads) {
        const int p = i / dv, r = i % dv;
        vals[i] = A.rec.u[(slot_of(p) * kb.H + kb.head) * dv + r];
      }
    }
    kda_stage_keys_decays_async<DK>(h0, key_at, alpha_at, keys16, alphas,
                                    aligned(A.rec.k) && aligned(A.in.k) && aligned(A.rec.alpha) && aligned(A.in.alpha));
    copy_async_commit();
    copy_async_wait_all();  // this thread's copies; the barrier publishes everyone's
    __syncthreads();
    kda_weighted_keys<DK>(h0, keys16, alphas, keys, [&](int c, float gc) { gdec[c] = gc; });
    __syncthreads();
    float kv[P][E], qv[P][E], gv[P][E];
    load_lane_vector<E, P, LPR>(k_t, lane, kv);
    load_lane_vector<E, P, LPR>(q_t, lane, qv);
    load_lane_f32<P, LPR>(gdec, lane, gv);
    // The group's RB corrections of record j in one load where dv % RB == 0 (then a group's rows are all
    // valid or all past dv), else one by one.
    const bool vector_c = dv % RB == 0;
    for (int it = 0; it < iterations; ++it) {  // uniform per warp: the row sums shuffle
      const int row0 = it * kRowsPerIteration + group_row0;
      float x[RB][P][E];
#pragma unroll
      for (int r = 0; r < RB; ++r)
#pragma unroll
        for (int p = 0; p < P; ++p)
#pragma unroll
          for (int e = 0; e < E; ++e) x[r][p][e] = ahead[0][r][p][e];
#pragma unroll
      for (int a = 0; a + 1 < AHEAD; ++a)
#pragma unroll
        for (int r = 0; r < RB; ++r)
#pragma unroll
          for (int p = 0; p < P; ++p)
#pragma unroll
            for (int e = 0; e < E; ++e) ahead[a][r][p][e] = ahead[a + 1][r][p][e];
      load_rows(it + AHEAD, ahead[AHEAD - 1]);
#pragma unroll
      for (int r = 0; r < RB; ++r)
#pragma unroll
        for (int p = 0; p < P; ++p)
#pragma unroll
          for (int e = 0; e < E; ++e) x[r][p][e] *= gv[p][e];
      // The fold over the records, with the group's corrections of record j from `load_c` (two loops, one
      // per loader, so that the choice is not made per record).
      auto fold = [&](auto&& load_c) {
        for (int j = 0; j < h0; ++j) {
          float c[RB];
          load_c(vals + static_cast<std::size_t>(j) * dv, c);
#pragma unroll
          for (int p = 0; p < P; ++p) {
            const float4 k4 = *reinterpret_cast<const float4*>(keys + static_cast<std::size_t>(j) * DK + T::col(lane, p));
#pragma unroll
            for (int r = 0; r < RB; ++r) {
              x[r][p][0] = fmaf(c[r], k4.x, x[r][p][0]);
              x[r][p][1] = fmaf(c[r], k4.y, x[r][p][1]);
              x[r][p][2] = fmaf(c[r], k4.z, x[r][p][2]);
              x[r][p][3] = fmaf(c[r], k4.w, x[r][p][3]);
            }
          }
        }
      };
      if (vector_c && RB > 1) {
        // dv % RB == 0: the group's rows are all valid or all past dv, and a group past dv keeps its zeros
        // (it stores nothing).
        if (row0 < dv)
          fold([&](const float* vals_j, float (&c)[RB]) {
            if constexpr (RB == 4) {
              const float4 c4 = *reinterpret_cast<const float4*>(vals_j + row0);
              c[0] = c4.x, c[1] = c4.y, c[2] = c4.z, c[3] = c4.w;
            } else if constexpr (RB == 2) {
              const float2 c2 = *reinterpret_cast<const float2*>(vals_j + row0);
              c[0] = c2.x, c[1] = c2.y;
            } else {
#pragma unroll
              for (int r = 0; r < RB; ++r) c[r] = vals_j[row0 + r];
            }
          });
      } else {
        fold([&](const float* vals_j, float (&c)[RB]) {
#pragma unroll
          for (int r = 0; r < RB; ++r) c[r] = row0 + r < dv ? vals_j[row0 + r] : 0.0f;
        });
      }
#pragma unroll
      for (int r = 0; r < RB; ++r) {
        const int row = row0 + r;
        const bool valid = row < dv;
        float sk = 0.0f;  // x = S_{t-1} Diag(a_t): x . k_t = S_{t-1} (a_t . k_t)
#pragma unroll
        for (int p = 0; p < P; ++p) sk = dot_acc<E>(x[r][p], kv[p], sk);
        sk = row_sum<LPR>(sk);
        const float u = beta_t * ((valid ? __bfloat162float(A.in.v[kb.hb * dv + row]) : 0.0f) - sk);
#pragma unroll
        for (int p = 0; p < P; ++p)
#pragma unroll
          for (int e = 0; e < E; ++e) x[r][p][e] = x[r][p][e] + u * kv[p][e];
        float o = 0.0f;
#pragma unroll
        for (int p = 0; p < P; ++p) o = dot_acc<E>(x[r][p], qv[p], o);
        o = row_sum<LPR>(o);
        if (valid) {
          if (lane % LPR == 0) A.in.out[kb.hb * dv + row] = o;
#pragma unroll
          for (int p = 0; p < P; ++p) store_recur(row, T::col(lane, p), x[r][p]);
        }
      }
    }
    return;
  }

  // Recomputed corrections (split, or skipped): one row per lane group.
  const int iterations = (dv + kWarps * RW - 1) / (kWarps * RW);
  // The next two iterations' rows are loaded before this one is folded (rows are independent, and
  // each is written only by the lanes that read it): their DRAM latency overlaps the folds. The first
  // two are issued before the records are staged, whose loads they do not wait on.
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
  kda_stage_raw_records<DK>(A, kb, win, h0, key_at, alpha_at, keys, alphas, vals, betas);
  __syncthreads();

  float qv[P][E];
  load_lane_vector<E, P, LPR>(q_t, lane, qv);
  const HeadView read_view = split ? head_view(A.read, kb.hb, dv, DK) : HeadView{};
  float* const read_residual = split ? head_residual(A.read, kb.hb, dv, DK) : nullptr;
  const bool need_amax = split && A.read.format == StorageFormat::nvfp4;
  float local_amax = 0.0f;
  for (int it = 0; it < iterations; ++it) {  // uniform per warp: the row sums shuffle
    const int row = (it * kWarps + warp) * RW + T::row_in_iteration(lane);
    const bool valid = row < dv;
    float x[P][E];
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
      for (int e = 0; e < E; ++e) x[p][e] = next_x[p][e], next_x[p][e] = after_x[p][e];
    load_row(it + 2, after_x);
    kda_replay_row<DK>(x, h0, row, valid, dv, keys, alphas, vals, betas, lane);
    float o = 0.0f;
#pragma unroll
    for (int p = 0; p < P; ++p) o = dot_acc<E>(x[p], qv[p], o);
    o = row_sum<LPR>(o);
    if (valid) {
      if (lane % LPR == 0) A.in.out[kb.hb * dv + row] = o;
#pragma unroll
      for (int p = 0; p < P; ++p) {
        const int col = T::col(lane, p);
        store_recur(row, col, x[p]);
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

// RB rows per lane group in the closed form, AHEAD iterations of rows in flight, and the blocks per SM the
// registers are sized for at dk = 128 (elsewhere no bound).
// kListed: the grid's rows are ReplayConfig::flush_list's sequences, an instance of its own (its sequence index is
// loaded, not the rematerialisable blockIdx.y; decode_replay_flush.cu says what one kernel for both cost).
template <StorageFormat F, int DK, int RB, int AHEAD, int kMinBlocks128, bool kListed>
__global__ void __launch_bounds__(kThreads, DK == 128 ? kMinBlocks128 : 0) kda_flush_kernel(ReplayArgs A) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // The non-flush kernel touches only non-flushing sequences (and reads the current window-state
  // copy, which this kernel does not write): let it launch as soon as every block here has started.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  const int b = kListed ? flush_block_sequence(A) : static_cast<int>(blockIdx.y);
  const WindowState win = current_window(A.rec, b);
  const bool flush = win.h + 1 >= A.window;  // h == L after appending; more after a verification commit
  // The launcher sizes `stage` for every h a commit can leave; more would overrun shared memory. A listed
  // sequence must flush (ReplayConfig::flush_list).
  if ((flush && win.h + 1 > A.stage) || (kListed && !flush)) __trap();
  // Without a list every sequence's next window state; with one the listed (flushing) ones', and the non-flush
  // kernel writes those of the others (decode_kda_replay_nonflush.cu).
  if (blockIdx.x == 0 && threadIdx.x == 0) write_next_window(A.rec, b, next_window(win, flush, A.rec.capacity));
  if (flush) kda_flush_body<F, DK, RB, AHEAD>(A, b, win);
  step_block_done(A.rec, b, step_blocks_of(A, flush));  // every block, every path: the device-side parity (decode_kernels.h)
}

}  // namespace

// 2 rows per lane group, 2 iterations ahead, 4 blocks per SM at dk = 128: the fastest of the variants measured
// (1/2/4, 2/2/4, 4/1/3, 4/2/2) on Kimi Linear, B = 256: 440.6 us against main's 549.5 us per flush step
// (H100, experiments/bench/decode_2026-12-05/session18).
constexpr int kFlushRowsPerGroup = 2, kFlushIterationsAhead = 2, kFlushMinBlocks128 = 4;

void decode_detail::launch_kda_flush(StorageFormat recur, const ReplayArgs& A, dim3 grid, cudaStream_t stream) {
  check_step_blocks(A, grid, true);
  const std::size_t smem = sizeof(float) * flush_shared_floats(A.stage, A.shape.dk, A.shape.dv);
  with_dk(A.shape.dk, [&](auto DK) {
    constexpr int RB = kFlushRowsPerGroup, AHEAD = kFlushIterationsAhead, MB = kFlushMinBlocks128;
    auto flush = [&](auto F) {  // the listed instance where the launcher passes a flush list
      if (A.flush_list) launch_replay_kernel(kda_flush_kernel<F(), DK(), RB, AHEAD, MB, true>, A, grid, smem, false, stream);
      else launch_replay_kernel(kda_flush_kernel<F(), DK(), RB, AHEAD, MB, false>, A, grid, smem, false, stream);
    };
    if (recur == StorageFormat::fp32) flush(std::integral_constant<StorageFormat, StorageFormat::fp32>{});
    else flush(std::integral_constant<StorageFormat, StorageFormat::fp16>{});
  });
}

}  // namespace replayssm::cuda
