// ReplaySSM standard decode for KDA (Algorithm 4 with channel-wise decays; Algorithm 3 with a separate
// low-precision read checkpoint): the non-flush kernel (output-only form from the read checkpoint)
// and the flush kernel (REPLAY from the recur checkpoint, writing it and, split, the LP copy), launched
// one after the other over the same grid of (value head, sequence) blocks, as decode_replay.cu does
// for Mamba-2 and GDN. Window bookkeeping (WindowState, ring slots, the flush test h + 1 >= L) is the
// same as theirs, so commit_step and verify_step share the ring.
#include "ssm/decode_kda.cuh"

namespace replayssm::cuda {

using formats::StorageFormat;
using namespace detail;
using namespace decode_detail;

namespace {

// ---- non-flush step --------------------------------------------------------------------------
// Shared memory (floats): kw [L][DK], yq [DK], yk [DK], u [L][dv], c1 [L], c2 [L], rows1 [dv], rows2 [dv].
std::size_t nonflush_shared_floats(int L, int DK, int dv) {
  return static_cast<std::size_t>(L) * DK + 2 * static_cast<std::size_t>(DK) + static_cast<std::size_t>(L) * dv + 2 * L +
         2 * static_cast<std::size_t>(dv);
}

// Non-flush step of one value head, the output-only form with T = 1 (REPLAYSSM.md sections 2-3,
// ssm::output_only for kda): with t = h0 the current window position and the channel-wise weights
// W_p = prod_{l=p+1}^{t} a_l, G = prod_{l=0}^{t} a_l (the current decay included),
//   S_{t-1} (a_t . k_t) = S_ckpt (G . k_t) + sum_{p<t} u_p ((W_p . k_p) . k_t)
//   u_t = b_t (v_t - S_{t-1} (a_t . k_t))
//   o_t = S_ckpt (G . q_t) + sum_{p<=t} u_p ((W_p . k_p) . q_t)
// One streaming read of the read checkpoint (LP when split, else the recur copy) gives both S_ckpt
// products; no state is materialised. u_t goes to the ring for later steps.
template <StorageFormat R, int DK>
__device__ __forceinline__ void kda_nonflush_body(const ReplayArgs& A) {
  extern __shared__ float smem[];
  const KdaBlock kb = kda_block(A.shape);
  const WindowState win = current_window(A.rec, kb.b);
  if (win.h + 1 >= A.window) return;  // the flush kernel's sequence
  const int L = A.window, h0 = win.h, dv = kb.dv;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float* kw = smem;                                      // [L][DK] weighted keys
  float* yq = kw + static_cast<std::size_t>(L) * DK;     // [DK] G . q_t
  float* yk = yq + DK;                                   // [DK] G . k_t
  float* vals = yk + DK;                                 // [L][dv] cached u_p
  float* c1 = vals + static_cast<std::size_t>(L) * dv;   // [L] (W_p . k_p) . q_t
  float* c2 = c1 + L;                                    // [L] (W_p . k_p) . k_t
  float* rows1 = c2 + L;                                 // [dv] S_ckpt (G . q_t)
  float* rows2 = rows1 + dv;                             // [dv] S_ckpt (G . k_t)
  const __nv_bfloat16* k_t = A.in.k + (static_cast<std::size_t>(kb.b) * kb.G + kb.g) * DK;
  const __nv_bfloat16* q_t = A.in.q + (static_cast<std::size_t>(kb.b) * kb.G + kb.g) * DK;
  const float* a_t = kda_step_alpha(A.in.alpha, kb.hb, DK);
  const std::size_t slot_t = ring_slot(A.rec, kb.b, win, h0);
  // B[h+1] <- (a, b, v, k) (u below, once known).
  kda_write_record<DK>(A.rec, slot_t, kb.H, kb.G, kb.head, kb.g, kb.vh == 0, dv, k_t, A.in.v + kb.hb * dv, a_t,
                       A.in.beta[kb.hb]);

  // Record phase: weighted keys and G (one thread per channel), the cached corrections.
  auto key_at = [&](int p) { return p == h0 ? k_t : A.rec.k + (ring_slot(A.rec, kb.b, win, p) * kb.G + kb.g) * DK; };
  auto alpha_at = [&](int p) -> const float* {
    return p == h0 ? a_t : kda_record_alpha(A.rec, ring_slot(A.rec, kb.b, win, p), kb.H, kb.head, DK);
  };
  kda_weighted_keys<DK>(h0, key_at, alpha_at, kw, [&](int c, float gc) {
    yq[c] = __bfloat162float(q_t[c]) * gc;  // the Y rows of ssm::output_only: q . G, k . G
    yk[c] = __bfloat162float(k_t[c]) * gc;
  });
  for (int i = threadIdx.x; i < h0 * dv; i += kThreads) {
    const int p = i / dv, r = i % dv;
    vals[i] = A.rec.u[(ring_slot(A.rec, kb.b, win, p) * kb.H + kb.head) * dv + r];
  }
  __syncthreads();
  for (int p = warp; p <= h0; p += kWarps) {  // key products, one warp per position
    const float s1 = warp_dot_f32_bf16<DK>(kw + static_cast<std::size_t>(p) * DK, q_t, lane);
    const float s2 = warp_dot_f32_bf16<DK>(kw + static_cast<std::size_t>(p) * DK, k_t, lane);
    if (lane == 0) {
      c1[p] = s1;
      if (p < h0) c2[p] = s2;
    }
  }

  // Stream the read checkpoint: rows1 = S_ckpt (G . q_t), rows2 = S_ckpt (G . k_t).
  {
    using T = Tile<R, DK>;
    constexpr int E = T::E, P = T::P, LPR = T::LPR, RW = T::RW;
    constexpr int kBatch = R == StorageFormat::nvfp4 ? 2 : 4;  // row iterations whose loads are issued together
    float vecs[P][2][E];
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
      for (int e = 0; e < E; ++e) {
        vecs[p][0][e] = yq[T::col(lane, p) + e];
        vecs[p][1][e] = yk[T::col(lane, p) + e];
      }
    const DeviceState read_state = A.split ? A.read : A.recur;
    const HeadView rv = head_view(read_state, kb.hb, dv, DK);
    const int iterations = (dv + kWarps * RW - 1) / (kWarps * RW);
    for (int it0 = 0; it0 < iterations; it0 += kBatch) {  // uniform per warp: the row sums shuffle
      RawPiece raw[kBatch][P];
      int rows[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        rows[j] = ((it0 + j) * kWarps + warp) * RW + T::row_in_iteration(lane);
#pragma unroll
        for (int p = 0; p < P; ++p) raw[j][p] = rows[j] < dv ? load_raw_piece<R, DK>(rv, rows[j], T::col(lane, p)) : RawPiece{};
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        float acc[2] = {0.0f, 0.0f};
#pragma unroll
        for (int p = 0; p < P; ++p) dot_raw_piece<R, 2>(raw[j][p], rv.tensor_scale, vecs[p], acc);
        const float s1 = row_sum<LPR>(acc[0]), s2 = row_sum<LPR>(acc[1]);
        if (rows[j] < dv && lane % LPR == 0) rows1[rows[j]] = s1, rows2[rows[j]] = s2;
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
// Shared memory (floats): keys [S][DK], split: decays [S][DK], G [DK], vals [S][dv], betas [S],
// scratch [kWarps]; S = the launch's `stage`.
std::size_t flush_shared_floats(int S, int DK, int dv, bool split) {
  return (split ? 2 : 1) * static_cast<std::size_t>(S) * DK + DK + static_cast<std::size_t>(S) * dv + S + kWarps;
}

// Flush of one value head (h0 + 1 >= L; more than L records only after a verification commit):
// S = REPLAY(S_ckpt^recur, B[1:h0+1]), o = S q, then the recur copy (RTN or SR) and, split, the read
// (LP, RTN) copy are written. Rows are independent; each lane group holds one row in registers.
//   shared: the cached u_p of the committed records in the closed form of section 2 with
//           channel-wise weights, S_{t-1} Diag(a_t) = S_ckpt Diag(G) + sum_{p<t} u_p (W_p . k_p)^T
//           (W_p, G up to and including a_t), then the current token: u_t = b_t (v_t - S_{t-1}
//           Diag(a_t) k_t), S_t = S_{t-1} Diag(a_t) + u_t k_t^T (Algorithm 4 lines 1-4);
//   split:  every u_p recomputed on the recur (HP) path from the raw records, sequentially from
//           S_ckpt^HP (REPLAYSSM.md section 4: u_j^HP = b_j (v_j - S_{j-1}^HP (a_j . k_j))), with the
//           element-wise operations of ssm::correction / ssm::decay_and_add.
template <StorageFormat F, int DK>
__device__ __forceinline__ void kda_flush_body(const ReplayArgs& A) {
  extern __shared__ float smem[];
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
  float* keys = smem;                                                    // [S][DK]
  float* alphas = keys + static_cast<std::size_t>(S) * DK;               // [S][DK] (split)
  float* gdec = alphas + (split ? static_cast<std::size_t>(S) * DK : 0);  // [DK] (shared)
  float* vals = gdec + DK;                                               // [S][dv]
  float* betas = vals + static_cast<std::size_t>(S) * dv;                // [S] (split)
  float* scratch = betas + S;                                            // [kWarps]
  const __nv_bfloat16* k_t = A.in.k + (static_cast<std::size_t>(kb.b) * kb.G + kb.g) * DK;
  const __nv_bfloat16* q_t = A.in.q + (static_cast<std::size_t>(kb.b) * kb.G + kb.g) * DK;
  const float* a_t = kda_step_alpha(A.in.alpha, kb.hb, DK);
  const float beta_t = A.in.beta[kb.hb];
  auto slot_of = [&](int p) { return ring_slot(A.rec, kb.b, win, p); };
  auto key_at = [&](int p) { return p == h0 ? k_t : A.rec.k + (slot_of(p) * kb.G + kb.g) * DK; };
  auto alpha_at = [&](int p) -> const float* {
    return p == h0 ? a_t : kda_record_alpha(A.rec, slot_of(p), kb.H, kb.head, DK);
  };
  if (!split) {
    kda_weighted_keys<DK>(h0, key_at, alpha_at, keys, [&](int c, float gc) { gdec[c] = gc; });
    for (int i = threadIdx.x; i < h0 * dv; i += kThreads) {
      const int p = i / dv, r = i % dv;
      vals[i] = A.rec.u[(slot_of(p) * kb.H + kb.head) * dv + r];
    }
  } else {
    for (int i = threadIdx.x; i < (h0 + 1) * DK; i += kThreads) {
      const int p = i / DK, c = i % DK;
      keys[i] = __bfloat162float(key_at(p)[c]);
      alphas[i] = alpha_at(p)[c];
    }
    for (int i = threadIdx.x; i < (h0 + 1) * dv; i += kThreads) {
      const int p = i / dv, r = i % dv;
      vals[i] = __bfloat162float(p == h0 ? A.in.v[kb.hb * dv + r] : A.rec.v[(slot_of(p) * kb.H + kb.head) * dv + r]);
    }
    for (int p = threadIdx.x; p <= h0; p += kThreads) betas[p] = p == h0 ? beta_t : A.rec.beta[slot_of(p) * kb.H + kb.head];
  }
  __syncthreads();

  using T = Tile<StorageFormat::fp32, DK>;
  constexpr int E = 4, P = T::P, LPR = T::LPR, RW = T::RW;
  float kv[P][E], qv[P][E], gv[P][E];
  load_lane_vector<E, P, LPR>(k_t, lane, kv);
  load_lane_vector<E, P, LPR>(q_t, lane, qv);
  if (!split) load_lane_f32<P, LPR>(gdec, lane, gv);
  const HeadView recur_view = head_view(A.recur, kb.hb, dv, DK);
  const HeadView read_view = split ? head_view(A.read, kb.hb, dv, DK) : HeadView{};
  const uint64_t recur_stream = sr_stream_device(kb.b, kb.g, kb.vh, 0, win.flushes);
  const bool need_amax = split && A.read.format == StorageFormat::nvfp4;
  float local_amax = 0.0f;
  const int iterations = (dv + kWarps * RW - 1) / (kWarps * RW);
  for (int it = 0; it < iterations; ++it) {  // uniform per warp: the row sums shuffle
    const int row = (it * kWarps + warp) * RW + T::row_in_iteration(lane);
    const bool valid = row < dv;
    float x[P][E];
#pragma unroll
    for (int p = 0; p < P; ++p) {
      if (valid) load4<F, DK>(recur_view, row, T::col(lane, p), x[p]);
      else x[p][0] = x[p][1] = x[p][2] = x[p][3] = 0.0f;
    }
    if (!split) {
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
        const float u = betas[j] * ((valid ? vals[static_cast<std::size_t>(j) * dv + row] : 0.0f) - sk);
#pragma unroll
        for (int p = 0; p < P; ++p)
#pragma unroll
          for (int e = 0; e < E; ++e) x[p][e] = x[p][e] * a4[p][e] + u * k4[p][e];
      }
    }
    float o = 0.0f;
#pragma unroll
    for (int p = 0; p < P; ++p) o = dot_acc<E>(x[p], qv[p], o);
    o = row_sum<LPR>(o);
    if (valid) {
      if (lane % LPR == 0) A.in.out[kb.hb * dv + row] = o;
#pragma unroll
      for (int p = 0; p < P; ++p) {
        store_piece<F, DK>(recur_view, row, T::col(lane, p), x[p], A.recur_mode, A.seed, recur_stream);
        if (need_amax)
#pragma unroll
          for (int e = 0; e < E; ++e) {
            const float ax = fabsf(x[p][e]);
            if (ax < INFINITY && ax > local_amax) local_amax = ax;
          }
      }
    }
    if (split && !need_amax) store_read_row<DK, P, LPR>(read_view, A.read.format, row, lane, x, valid, {});
  }
  if (need_amax) {
    // NVFP4 LP copy: the tensor scale needs the head's amax first; then re-read the recur rows this
    // block just wrote (fp32, the launcher requires it) and quantize them.
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
      store_read_row<DK, P, LPR>(read_view, StorageFormat::nvfp4, row, lane, y, valid, ts);
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
  if (A.recur_ef || A.read.residual != nullptr || config.skips())
    throw std::invalid_argument("kda replay decode: error feedback and checkpoint-read skipping are not implemented yet");
  const dim3 grid(shape.value_heads, shape.batch);
  const std::size_t nonflush_smem = sizeof(float) * nonflush_shared_floats(config.window, shape.dk, shape.dv);
  const std::size_t flush_smem = sizeof(float) * flush_shared_floats(stage, shape.dk, shape.dv, config.split());
  with_dk(shape.dk, [&](auto DK) {
    auto nonflush = [&](auto kernel) { launch_replay_kernel(kernel, A, grid, nonflush_smem, false, stream); };
    switch (read) {
      case StorageFormat::fp32: nonflush(kda_nonflush_kernel<StorageFormat::fp32, DK()>); break;
      case StorageFormat::fp16: nonflush(kda_nonflush_kernel<StorageFormat::fp16, DK()>); break;
      case StorageFormat::bf16: nonflush(kda_nonflush_kernel<StorageFormat::bf16, DK()>); break;
      case StorageFormat::fp8b128:
        if constexpr (DK() >= 128) nonflush(kda_nonflush_kernel<StorageFormat::fp8b128, DK()>);
        break;
      default: nonflush(kda_nonflush_kernel<StorageFormat::nvfp4, DK()>); break;
    }
    // A plain (not programmatic) launch: it runs after every non-flush block, which keeps the
    // window-state and ring accesses of the step trivially ordered.
    auto flush = [&](auto kernel) { launch_replay_kernel(kernel, A, grid, flush_smem, false, stream); };
    if (config.recur.format == StorageFormat::fp32) flush(kda_flush_kernel<StorageFormat::fp32, DK()>);
    else flush(kda_flush_kernel<StorageFormat::fp16, DK()>);
  });
  REPLAYSSM_CUDA_CHECK_LAUNCH();
  advance_host_parity(records);
}

}  // namespace replayssm::cuda
