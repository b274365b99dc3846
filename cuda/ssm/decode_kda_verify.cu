// Speculative verification for KDA (Algorithm 2 with the UT transform of REPLAYSSM.md section 3, with
// channel-wise decays): output-only from a shared FP32 checkpoint, the drafts' corrections solved by
// forward substitution, a flush of the committed records when h + T > L. The commit is the generic
// commit_step (decode_verify.cu): the window bookkeeping is the one every kind shares.
#include "ssm/decode_kda.cuh"

namespace replayssm::cuda {

using formats::StorageFormat;
using namespace detail;
using namespace decode_detail;

namespace {

struct KdaVerifyArgs {
  DecodeShape shape;
  StepInputs in;
  int window;
  DeviceState ckpt;
  DeviceRecords rec;
  int max_committed;  // HM = max(L, records.max_drafts): the most committed records a verify step can see
};

// Shared memory (floats), NP = HM + T positions: kw [NP][DK] (one draft's weighted keys, then the
// fold's), y [2T][DK] (G_s . q_s, then G_s . k_{h+s}), fold G [DK], committed u [HM][dv],
// mq, mk [NP][T], rows [2T][dv] (S_ckpt y_i), betas [T], staged keys and decays [NP][DK] each.
std::size_t verify_shared_floats(int HM, int T, int DK, int dv) {
  const std::size_t NP = static_cast<std::size_t>(HM) + T;
  return 3 * NP * DK + 2 * static_cast<std::size_t>(T) * DK + DK + static_cast<std::size_t>(HM) * dv + 2 * NP * T +
         2 * static_cast<std::size_t>(T) * dv + T;
}

// One value head's verification of TD drafts at window positions h..h+TD-1 (0-based). For draft s
// (position t = h + s), with W_{p,s} = prod_{l=p+1}^{t} a_l and G_s = prod_{l=0}^{t} a_l channel-wise:
//   Mq[p][s] = (W_{p,s} . k_p) . q_s  (p <= t),   Mk[p][s] = (W_{p,s} . k_p) . k_t  (p < t)
// (ssm::output_only's decay-weighted K^T Q and K^T K_d), and one streaming read of S_ckpt gives
// S_ckpt (G_s . q_s) and S_ckpt (G_s . k_t). Per row, the UT transform U_d (I + A B_d) = R B_d is the
// forward substitution
//   u_s = b_s (v_s - S_ckpt (G_s . k_t) - sum_{p<h} Mk[p][s] u_p - sum_{j<s} Mk[h+j][s] u_{h+j}),
// and O_s = S_ckpt (G_s . q_s) + sum_{p<=t} Mq[p][s] u_p. A flush (h + T > L, h > 0) folds the h
// committed records into the same streamed rows, S = S_ckpt Diag(G_{0:h-1}) + sum_{p<h} u_p (W_p . k_p)^T
// with the weights up to position h - 1, and writes the checkpoint after the outputs read it.
// Two blocks per SM: without a minimum, ptxas capped some instances at 64 registers and spilled.
template <int DK, int TD>
__device__ __forceinline__ void kda_verify_body(const KdaVerifyArgs& A) {
  extern __shared__ float smem[];
  const KdaBlock kb = kda_block(A.shape);
  const WindowState win = current_window(A.rec, kb.b);
  const int h = win.h, HM = A.max_committed, NP = HM + TD, dv = kb.dv;
  if (h > HM) __trap();  // the launcher sizes HM for every h a commit can leave
  const bool flush = h + TD > A.window;
  const bool fold = flush && h > 0;  // nothing to fold when h = 0: no write (as the CPU decoder)
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float* kw = smem;                                          // [NP][DK]
  float* y = kw + static_cast<std::size_t>(NP) * DK;         // [2TD][DK]
  float* gfold = y + 2 * TD * DK;                            // [DK]
  float* vals = gfold + DK;                                  // [HM][dv]
  float* mq = vals + static_cast<std::size_t>(HM) * dv;      // [NP][TD]
  float* mk = mq + NP * TD;                                  // [NP][TD]
  float* rows = mk + NP * TD;                                // [2TD][dv]
  float* betas = rows + 2 * TD * dv;                         // [TD]
  float* keys = betas + TD;                                  // [NP][DK] staged keys (fp32)
  float* alphas = keys + static_cast<std::size_t>(NP) * DK;  // [NP][DK] staged decays
  auto slot_of = [&](int p) { return ring_slot(A.rec, kb.b, win, p); };
  auto in_head = [&](int s) { return (static_cast<std::size_t>(kb.b) * TD + s) * kb.H + kb.head; };
  auto draft_k = [&](int s) { return A.in.k + ((static_cast<std::size_t>(kb.b) * TD + s) * kb.G + kb.g) * DK; };
  auto draft_q = [&](int s) { return A.in.q + ((static_cast<std::size_t>(kb.b) * TD + s) * kb.G + kb.g) * DK; };
  auto draft_alpha = [&](int s) { return kda_step_alpha(A.in.alpha, in_head(s), DK); };
  auto key_at = [&](int p) { return p >= h ? draft_k(p - h) : A.rec.k + (slot_of(p) * kb.G + kb.g) * DK; };
  auto alpha_at = [&](int p) -> const float* {
    return p >= h ? draft_alpha(p - h) : kda_record_alpha(A.rec, slot_of(p), kb.H, kb.head, DK);
  };

  // B[h+1 : h+T] <- X: draft records after the committed ones (their u after the solve; rejected
  // drafts are overwritten by a later step).
  for (int s = 0; s < TD; ++s)
    kda_write_record<DK>(A.rec, slot_of(h + s), kb.H, kb.G, kb.head, kb.g, kb.vh == 0, dv, draft_k(s),
                         A.in.v + in_head(s) * dv, draft_alpha(s), A.in.beta[in_head(s)]);
  for (int i = threadIdx.x; i < h * dv; i += kThreads) {
    const int p = i / dv, r = i % dv;
    vals[i] = A.rec.u[(slot_of(p) * kb.H + kb.head) * dv + r];
  }
  if (threadIdx.x < TD) betas[threadIdx.x] = A.in.beta[in_head(threadIdx.x)];
  // The keys and decays of every position once (all loads in flight together); each draft's weights
  // below are built from them in shared memory.
  kda_stage_keys_decays<DK>(h + TD - 1, key_at, alpha_at, keys, alphas);

  // Per draft: its weighted keys (one thread per channel), then its key products (a warp per position).
  for (int s = 0; s < TD; ++s) {
    __syncthreads();  // the previous draft's products have read kw
    const __nv_bfloat16* qs = draft_q(s);
    const __nv_bfloat16* ks = draft_k(s);
    kda_weighted_keys<DK>(h + s, keys, alphas, kw, [&](int c, float gc) {
      y[s * DK + c] = __bfloat162float(qs[c]) * gc;  // G_s . q_s
      y[(TD + s) * DK + c] = __bfloat162float(ks[c]) * gc;  // G_s . k_{h+s}
    });
    __syncthreads();
    for (int p = warp; p <= h + s; p += kWarps) {
      const float s1 = warp_dot_f32_bf16<DK>(kw + static_cast<std::size_t>(p) * DK, qs, lane);
      const float s2 = warp_dot_f32_bf16<DK>(kw + static_cast<std::size_t>(p) * DK, ks, lane);
      if (lane == 0) {
        mq[p * TD + s] = s1;
        if (p < h + s) mk[p * TD + s] = s2;
      }
    }
  }
  __syncthreads();
  if (fold) {  // the committed records' weights up to position h - 1, for the flush
    kda_weighted_keys<DK>(h - 1, keys, alphas, kw, [&](int c, float gc) { gfold[c] = gc; });
    __syncthreads();
  }

  // One streaming read of the checkpoint: rows[i] = S_ckpt y_i; the flush folds and writes back.
  {
    using T = Tile<StorageFormat::fp32, DK>;
    constexpr int E = 4, P = T::P, LPR = T::LPR, RW = T::RW;
    const HeadView ck = head_view(A.ckpt, kb.hb, dv, DK);
    float gv[P][E];
    if (fold) load_lane_f32<P, LPR>(gfold, lane, gv);
    const int iterations = (dv + kWarps * RW - 1) / (kWarps * RW);
    // The next iteration's row is loaded before this one is used (each row is written back only by
    // the lanes that read it): its DRAM latency overlaps the products and the fold.
    auto load_row = [&](int it, float (*x)[E]) {
      const int row = (it * kWarps + warp) * RW + T::row_in_iteration(lane);
#pragma unroll
      for (int p = 0; p < P; ++p) {
        if (it < iterations && row < dv) load4<StorageFormat::fp32, DK>(ck, row, T::col(lane, p), x[p]);
        else x[p][0] = x[p][1] = x[p][2] = x[p][3] = 0.0f;
      }
    };
    float next_x[P][E];
    load_row(0, next_x);
    for (int it = 0; it < iterations; ++it) {  // uniform per warp: the row sums shuffle
      const int row = (it * kWarps + warp) * RW + T::row_in_iteration(lane);
      const bool valid = row < dv;
      float x[P][E];
#pragma unroll
      for (int p = 0; p < P; ++p)
#pragma unroll
        for (int e = 0; e < E; ++e) x[p][e] = next_x[p][e];
      load_row(it + 1, next_x);
      // The 2T row sums reduced together (reduce-scatter: 2T - 1 + log2(LPR / 2T) shuffles per lane
      // instead of 2T log2(LPR); the shuffles were most of this loop's instructions).
      constexpr int N = 2 * TD;
      float part[N];
#pragma unroll
      for (int i = 0; i < N; ++i) {
        float yv[P][E];
        load_lane_f32<P, LPR>(y + i * DK, lane, yv);
        part[i] = 0.0f;
#pragma unroll
        for (int p = 0; p < P; ++p) part[i] = dot_acc<E>(x[p], yv[p], part[i]);
      }
      if constexpr (N <= LPR) {
        const float sum = row_sum_scatter<LPR, N>(part);
        if (valid && lane % (LPR / N) == 0) rows[scatter_index<LPR, N>(lane) * dv + row] = sum;
      } else {
#pragma unroll
        for (int i = 0; i < N; ++i) {
          const float sum = row_sum<LPR>(part[i]);
          if (valid && lane % LPR == 0) rows[i * dv + row] = sum;
        }
      }
      if (fold) {
#pragma unroll
        for (int p = 0; p < P; ++p)
#pragma unroll
          for (int e = 0; e < E; ++e) x[p][e] *= gv[p][e];
        for (int j = 0; j < h; ++j) {
          const float c = valid ? vals[static_cast<std::size_t>(j) * dv + row] : 0.0f;
#pragma unroll
          for (int p = 0; p < P; ++p) {
            const float4 k4 = *reinterpret_cast<const float4*>(kw + static_cast<std::size_t>(j) * DK + T::col(lane, p));
            x[p][0] = fmaf(c, k4.x, x[p][0]);
            x[p][1] = fmaf(c, k4.y, x[p][1]);
            x[p][2] = fmaf(c, k4.z, x[p][2]);
            x[p][3] = fmaf(c, k4.w, x[p][3]);
          }
        }
        if (valid)
#pragma unroll
          for (int p = 0; p < P; ++p)
            store_piece<StorageFormat::fp32, DK>(ck, row, T::col(lane, p), x[p], formats::RoundingMode::nearest_even, 0, 0);
      }
    }
  }
  __syncthreads();

  // One thread per row: the drafts' corrections by forward substitution, then the T outputs.
  for (int r = threadIdx.x; r < dv; r += kThreads) {
    float ud[TD];
#pragma unroll
    for (int s = 0; s < TD; ++s) {
      float sk = rows[(TD + s) * dv + r];
      for (int p = 0; p < h; ++p) sk = fmaf(mk[p * TD + s], vals[static_cast<std::size_t>(p) * dv + r], sk);
#pragma unroll
      for (int j = 0; j < s; ++j) sk = fmaf(mk[(h + j) * TD + s], ud[j], sk);
      ud[s] = betas[s] * (__bfloat162float(A.in.v[in_head(s) * dv + r]) - sk);
    }
#pragma unroll
    for (int s = 0; s < TD; ++s) {
      float o = rows[s * dv + r];
      for (int p = 0; p < h; ++p) o = fmaf(mq[p * TD + s], vals[static_cast<std::size_t>(p) * dv + r], o);
#pragma unroll
      for (int j = 0; j <= s; ++j) o = fmaf(mq[(h + j) * TD + s], ud[j], o);
      A.in.out[in_head(s) * dv + r] = o;
      A.rec.u[(slot_of(h + s) * kb.H + kb.head) * dv + r] = ud[s];
    }
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    WindowState next = win;
    if (flush) {  // drop the committed records: the drafts become window positions 0..T-1
      next.start = (win.start + h) % A.rec.capacity;
      next.h = 0;
      if (fold) next.flushes = win.flushes + 1;  // checkpoint writes, as the CPU decoder counts them
    }
    write_next_window(A.rec, kb.b, next);
  }
}

template <int DK, int TD>
__global__ void __launch_bounds__(kThreads, 2) kda_verify_kernel(KdaVerifyArgs A) {
  kda_verify_body<DK, TD>(A);
  step_block_done(A.rec, blockIdx.y, gridDim.x);  // every block, every path: the device-side parity (decode_kernels.h)
}

}  // namespace

void kda_detail::verify_step(const DecodeShape& shape, int drafts, const StepInputs& in, const ReplayConfig& config,
                             DeviceRecords& records, cudaStream_t stream) {
  check_shape(shape);
  check_kda_inputs(in, config.heads_per_block);
  check_kda_records(records);
  if (config.split() || config.recur.format != StorageFormat::fp32 || config.recur.payload == nullptr)
    throw std::invalid_argument("kda verification reads an fp32 shared checkpoint (ReplayConfig::recur fp32, no read copy)");
  if (config.window < 1 || config.window > kMaxWindow)
    throw_invalid_argument("kda verification supports 1 <= L <= 64 (ReplayConfig::window)", "L", config.window);
  if (drafts < 1 || drafts > records.max_drafts)
    throw_invalid_argument("kda verification: T must be in [1, DeviceRecords::max_drafts] (the ring's sizing)", "T", drafts,
                           "max_drafts", records.max_drafts);
  const int max_committed = std::max(config.window, records.max_drafts);
  if (max_committed + 1 > kMaxWindow)
    throw_invalid_argument("kda verification supports max(L, T) + 1 <= 64 (the next standard step may fold that many records)",
                           "L", config.window, "max_drafts", records.max_drafts);
  if (records.capacity < max_committed + records.max_drafts)
    throw_invalid_argument("record ring needs capacity max(L, T) + T (DeviceRecords::capacity)", "capacity", records.capacity,
                           "needed", max_committed + records.max_drafts);
  const KdaVerifyArgs A{shape, in, config.window, config.recur, records, max_committed};
  const dim3 grid(shape.value_heads, shape.batch);
  const std::size_t smem = sizeof(float) * verify_shared_floats(max_committed, drafts, shape.dk, shape.dv);
  if (smem > max_dynamic_smem())
    throw_invalid_argument("kda verification: the staged records of max(L, T) + T positions exceed shared memory",
                           "positions", max_committed + drafts, "bytes", static_cast<long>(smem));
  with_dk(shape.dk, [&](auto DK) {
    with_drafts(drafts, [&](auto TD) {
      auto kernel = kda_verify_kernel<DK(), TD()>;
      REPLAYSSM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
      kernel<<<grid, kThreads, smem, stream>>>(A);
    });
  });
  REPLAYSSM_CUDA_CHECK_LAUNCH();
  advance_host_parity(records);
}

}  // namespace replayssm::cuda
