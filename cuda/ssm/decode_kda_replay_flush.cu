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

void decode_detail::launch_kda_flush(StorageFormat recur, const ReplayArgs& A, dim3 grid, cudaStream_t stream) {
  const std::size_t smem = sizeof(float) * flush_shared_floats(A.stage, A.shape.dk, A.shape.dv);
  with_dk(A.shape.dk, [&](auto DK) {
    auto flush = [&](auto kernel) { launch_replay_kernel(kernel, A, grid, smem, false, stream); };
    if (recur == StorageFormat::fp32) flush(kda_flush_kernel<StorageFormat::fp32, DK()>);
    else flush(kda_flush_kernel<StorageFormat::fp16, DK()>);
  });
}

}  // namespace replayssm::cuda
