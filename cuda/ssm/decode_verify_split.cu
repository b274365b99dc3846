// Speculative verification with separate checkpoint precisions (Algorithm 3, REPLAYSSM.md section 4),
// and with a shared checkpoint stored below FP32 (shared:fp16+sr and the like), for Mamba-2, GDN and
// KDA (channel-wise decays: the decay weights are vectors over dk, so one value head per block and
// the weights folded into the key products, S_ckpt (G_s . q_s) streamed instead of g_s S_ckpt q_s).
//
// Per sequence (staggered windows share one launch):
//   non-flush (h + T <= L): O = OUTPUTONLY(S_ckpt^LP, B[1:h+T], Q) from the read (LP) checkpoint, the
//       cached corrections u of the committed records (GDN: computed from the LP copy when they were
//       appended) and the drafts' corrections solved by the UT transform, as in Algorithm 2;
//   flush (h + T > L, pi = HP): O = OUTPUTONLY(S_ckpt^HP, B[1:h+T], Q) from the recur (HP) checkpoint;
//       then S = REPLAY(S_ckpt^HP, B[1:h]) on chip and both copies written, S_ckpt^HP <- Q_HP(S) (RTN or
//       SR, event = the sequence's flush count) and S_ckpt^LP <- Q_LP(S) (RTN). GDN recomputes the
//       committed corrections on the HP path, u_j^HP = b_j (v_j - a_j S_{j-1}^HP k_j), and the outputs
//       use them, as the CPU's SplitPrecisionReplayDecoder::verify does. A flush with h = 0 (T > L)
//       reads the HP copy and writes nothing (no event).
// The shared FP32 case keeps its own tuned kernel (decode_verify.cu); this one is written for clarity
// (one warp row group per state row, the drafts' queries and keys staged in shared memory, every
// format decoded through one switch), not for the traffic limit.
#include "ssm/decode_common.cuh"
#include "ssm/decode_verify_epilogue.cuh"

namespace replayssm::cuda {

using formats::StorageFormat;
using namespace detail;
using namespace decode_detail;

namespace {

struct SplitVerifyArgs {
  DecodeShape shape;
  StepInputs in;
  int window;
  DeviceState recur, read;  // read: the LP copy (split); unset for a shared checkpoint
  bool split;
  formats::RoundingMode recur_mode;
  uint64_t seed;
  DeviceRecords rec;
  int heads_per_block;
  int max_committed;  // max(L, T_max): the most committed records a verify step can see
  bool recur_ef;      // error feedback on the (fp16/bf16) recur copy; the LP copy's: read.residual set
};

__host__ __device__ inline std::size_t align4(std::size_t floats) { return (floats + 3) / 4 * 4; }

// Shared memory of one block (floats); NP = HM + T positions at most.
struct SplitVerifyLayout {
  std::size_t keys, q, vals, a, beta, kq, kk, cq, ck, d, rows, amax, wk, g, total;
  // channel: KDA (decays of dk floats, weighted-key scratch)
  __host__ __device__ SplitVerifyLayout(int HM, int T, int DK, int dv, int NH, bool channel) {
    const std::size_t NP = static_cast<std::size_t>(HM) + T;
    std::size_t o = 0;
    keys = o, o += NP * DK;                                   // every position's key, fp32
    q = o, o += static_cast<std::size_t>(T) * DK;             // the drafts' queries
    vals = o, o += align4(static_cast<std::size_t>(NH) * NP * dv);  // [NH][NP][dv]: v, or u (GDN, KDA)
    a = o, o += align4(static_cast<std::size_t>(NH) * NP * (channel ? DK : 1));  // decays
    beta = o, o += align4(static_cast<std::size_t>(NH) * NP);
    kq = o, o += align4(NP * T);                              // k_p . q_s
    kk = o, o += align4(NP * T);                              // k_p . k_{h+s}
    cq = o, o += align4(static_cast<std::size_t>(NH) * NP * T);  // w_{p,s} (k_p . q_s), w_{p,s} = prod_{l=p+1}^{h+s} a_l
    ck = o, o += align4(static_cast<std::size_t>(NH) * NP * T);  // w_{p,s} (k_p . k_{h+s}) (GDN, KDA)
    d = o, o += align4(static_cast<std::size_t>(NH) * T);     // prod_{l<=h+s} a_l
    rows = o, o += align4(static_cast<std::size_t>(2) * T * NH * dv);  // S q_s, S k_s per (head, row)
    amax = o, o += align4(NH);                                // NVFP4 LP copy: per-head amax bits
    wk = o, o += channel ? NP * DK : 0;                       // KDA: W_{p,s} . k_p for one draft s
    g = o, o += channel ? static_cast<std::size_t>(T) * DK : 0;  // KDA: G_s = prod_{l<=h+s} a_l
    total = o;
  }
};

// Four elements of one row, at columns col..col+3, decoded from any stored format exactly as
// formats::dequantize does (element code x block scale x tensor scale).
template <int DK>
__device__ __forceinline__ void load4_any(const HeadView& h, StorageFormat f, int row, int col, float* x) {
  const std::size_t i = static_cast<std::size_t>(row) * DK + col;
  switch (f) {
    case StorageFormat::fp32: load4<StorageFormat::fp32, DK>(h, row, col, x); break;
    case StorageFormat::fp16: load4<StorageFormat::fp16, DK>(h, row, col, x); break;
    case StorageFormat::bf16: load4<StorageFormat::bf16, DK>(h, row, col, x); break;
    case StorageFormat::fp8b128: {
      const uint32_t codes = *reinterpret_cast<const uint32_t*>(h.payload + i);
      const float s = h.block_scales[i / formats::kFp8BlockSize];
#pragma unroll
      for (int e = 0; e < 4; ++e) x[e] = formats::fp8b128_decode_element((codes >> (8 * e)) & 0xFFu, s);
      break;
    }
    default: {  // nvfp4: element 2j in the low nibble of byte j
      const uint32_t codes = *reinterpret_cast<const uint16_t*>(h.payload + i / 2);
      const uint32_t sc = h.scale_codes[i / formats::kNvfp4BlockSize];
#pragma unroll
      for (int e = 0; e < 4; ++e) x[e] = formats::nvfp4_decode_element((codes >> (4 * e)) & 0xFu, sc, h.tensor_scale);
      break;
    }
  }
}

// `residual` (the head's, or nullptr): error feedback on an fp16/bf16 recur copy.
template <int DK>
__device__ __forceinline__ void store4_recur(const HeadView& h, StorageFormat f, int row, int col, const float* x,
                                             formats::RoundingMode mode, uint64_t seed, uint64_t stream, float* residual) {
  if (residual != nullptr) {
    if (f == StorageFormat::fp16) store_piece_ef<StorageFormat::fp16, DK>(h, row, col, x, residual);
    else store_piece_ef<StorageFormat::bf16, DK>(h, row, col, x, residual);
    return;
  }
  switch (f) {
    case StorageFormat::fp32: store_piece<StorageFormat::fp32, DK>(h, row, col, x, mode, seed, stream); break;
    case StorageFormat::fp16: store_piece<StorageFormat::fp16, DK>(h, row, col, x, mode, seed, stream); break;
    default: store_piece<StorageFormat::bf16, DK>(h, row, col, x, mode, seed, stream); break;
  }
}

// S q_s and S k_{h+s} (kDelta) of one row x for the TD drafts, into s_rows[s][row] / s_rows[TD + s][row].
template <int DK, int TD, bool kDelta>
__device__ __forceinline__ void row_products(const float (&x)[Tile<StorageFormat::fp32, DK>::P][4], const float* s_q,
                                             const float* s_draft_keys, float* s_rows, int rows_total, int row, bool valid,
                                             int lane) {
  using Geo = Tile<StorageFormat::fp32, DK>;
  constexpr int P = Geo::P, LPR = Geo::LPR;
#pragma unroll
  for (int s = 0; s < TD; ++s) {
    float sq = 0.0f, sk = 0.0f;
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int c = Geo::col(lane, p);
      sq = dot_acc<4>(x[p], s_q + s * DK + c, sq);
      if (kDelta) sk = dot_acc<4>(x[p], s_draft_keys + s * DK + c, sk);
    }
    sq = row_sum<LPR>(sq);
    if (kDelta) sk = row_sum<LPR>(sk);
    if (valid && lane % LPR == 0) {
      s_rows[s * rows_total + row] = sq;
      if (kDelta) s_rows[(TD + s) * rows_total + row] = sk;
    }
  }
}

template <ssm::Recurrence K, int DK, int TD>
__global__ void __launch_bounds__(kThreads) split_verify_kernel(SplitVerifyArgs A) {
  using Geo = Tile<StorageFormat::fp32, DK>;
  constexpr int P = Geo::P, LPR = Geo::LPR, RW = Geo::RW, E = 4;
  constexpr bool kDelta = K != ssm::Recurrence::mamba2;
  constexpr bool kChannel = K == ssm::Recurrence::kda;  // one value head per block (the launcher)
  constexpr int W = kChannel ? DK : 1;                   // floats of one decay
  extern __shared__ float smem[];
  const BlockGeometry bg = block_geometry(A.shape, A.heads_per_block);
  const int NH = bg.NH, dv = bg.dv;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const WindowState win = current_window(A.rec, bg.b);
  const int h = win.h, n = h + TD, HM = A.max_committed, NP = HM + TD;
  if (h > HM) __trap();  // the launcher sizes HM for every h a commit can leave
  const bool flush = h + TD > A.window;  // Algorithm 3: pi = HP
  const bool fold = flush && h > 0;
  // GDN under split precisions recomputes the committed corrections on the HP path at a flush.
  const bool recompute_u = kDelta && A.split && fold;
  const SplitVerifyLayout lay(HM, TD, DK, dv, NH, kChannel);
  float* s_keys = smem + lay.keys;
  float* s_q = smem + lay.q;
  float* s_vals = smem + lay.vals;
  float* s_a = smem + lay.a;
  float* s_beta = smem + lay.beta;
  float* s_kq = smem + lay.kq;
  float* s_kk = smem + lay.kk;
  float* s_cq = smem + lay.cq;
  float* s_ck = smem + lay.ck;
  float* s_d = smem + lay.d;
  float* s_rows = smem + lay.rows;
  unsigned* s_amax = reinterpret_cast<unsigned*>(smem + lay.amax);
  float* s_wk = smem + lay.wk;
  const std::size_t hb0 = static_cast<std::size_t>(bg.b) * bg.H + bg.head0;
  const int rows_total = NH * dv;
  auto in_head = [&](int s, int nn) { return (static_cast<std::size_t>(bg.b) * TD + s) * bg.H + bg.head0 + nn; };
  auto in_key = [&](int s) { return (static_cast<std::size_t>(bg.b) * TD + s) * bg.G + bg.g; };
  auto slot_of = [&](int p) { return ring_slot(A.rec, bg.b, win, p); };

  // B[h+1 : h+T] <- X: the draft records after the committed ones (rejected ones are overwritten later).
  for (int i = threadIdx.x; i < TD * NH * dv; i += kThreads) {
    const int s = i / (NH * dv), nn = (i / dv) % NH, r = i % dv;
    A.rec.v[(slot_of(h + s) * bg.H + bg.head0 + nn) * dv + r] = A.in.v[in_head(s, nn) * dv + r];
  }
  if (bg.vh0 == 0)
    for (int i = threadIdx.x; i < TD * DK; i += kThreads) {
      const int s = i / DK, c = i % DK;
      A.rec.k[(slot_of(h + s) * bg.G + bg.g) * DK + c] = A.in.k[in_key(s) * DK + c];
    }
  for (int i = threadIdx.x; i < TD * NH * W; i += kThreads) {
    const int s = i / (NH * W), nn = (i / W) % NH, c = i % W;
    A.rec.alpha[(slot_of(h + s) * bg.H + bg.head0 + nn) * W + c] = A.in.alpha[in_head(s, nn) * W + c];
    if (kDelta && c == 0) A.rec.beta[slot_of(h + s) * bg.H + bg.head0 + nn] = A.in.beta[in_head(s, nn)];
  }
  // Stage every position's key, the drafts' queries, record vectors, decays and betas.
  for (int i = threadIdx.x; i < n * DK; i += kThreads) {
    const int p = i / DK, c = i % DK;
    const __nv_bfloat16 k = p >= h ? A.in.k[in_key(p - h) * DK + c] : A.rec.k[(slot_of(p) * bg.G + bg.g) * DK + c];
    s_keys[i] = __bfloat162float(k);
  }
  for (int i = threadIdx.x; i < TD * DK; i += kThreads) s_q[i] = __bfloat162float(A.in.q[in_key(i / DK) * DK + i % DK]);
  for (int i = threadIdx.x; i < NH * n * dv; i += kThreads) {
    const int nn = i / (n * dv), p = (i / dv) % n, r = i % dv;
    float x;
    if (p >= h) {
      x = __bfloat162float(A.in.v[in_head(p - h, nn) * dv + r]);
    } else {
      const std::size_t at = (slot_of(p) * bg.H + bg.head0 + nn) * dv + r;
      // Mamba-2 folds v; GDN/KDA the cached u, or the raw v when the flush recomputes u on the HP path.
      x = (!kDelta || recompute_u) ? __bfloat162float(A.rec.v[at]) : A.rec.u[at];
    }
    s_vals[(static_cast<std::size_t>(nn) * NP + p) * dv + r] = x;
  }
  for (int i = threadIdx.x; i < NH * n * W; i += kThreads) {
    const int nn = i / (n * W), p = (i / W) % n, c = i % W;
    const bool draft = p >= h;
    s_a[(nn * NP + p) * W + c] = draft ? A.in.alpha[in_head(p - h, nn) * W + c]
                                       : A.rec.alpha[(slot_of(p) * bg.H + bg.head0 + nn) * W + c];
    if (kDelta && c == 0)
      s_beta[nn * NP + p] = draft ? A.in.beta[in_head(p - h, nn)] : A.rec.beta[slot_of(p) * bg.H + bg.head0 + nn];
  }
  for (int i = threadIdx.x; i < NH; i += kThreads) s_amax[i] = 0u;
  __syncthreads();
  if constexpr (!kChannel) {
    // Key products, shared by the NH heads: k_p . q_s (p <= h + s) and, GDN, k_p . k_{h+s} (p < h + s).
    for (int pair = warp; pair < 2 * n * TD; pair += kWarps) {
      const int which = pair / (n * TD), p = (pair / TD) % n, s = pair % TD;
      if (which == 1 && !kDelta) continue;
      const float* other = which == 0 ? s_q + s * DK : s_keys + (h + s) * DK;
      float acc = 0.0f;
      for (int c = lane; c < DK; c += 32) acc = fmaf(s_keys[p * DK + c], other[c], acc);
      acc = row_sum<32>(acc);
      if (lane == 0) (which == 0 ? s_kq : s_kk)[p * TD + s] = acc;
    }
    __syncthreads();  // the key products, for the coefficients
    // Decay weights w[p][s] = prod_{l=p+1}^{h+s} a_l and d_s = prod_{l<=h+s} a_l, and the record coefficients
    // the outputs and corrections take, the same for every row of a head: cq = w (k_p . q_s), ck = w (k_p . k_{h+s}).
    for (int idx = threadIdx.x; idx < NH * TD; idx += kThreads) {
      const int nn = idx / TD, s = idx % TD;
      float w = 1.0f;
      for (int p = h + s; p >= 0; --p) {
        s_cq[(nn * NP + p) * TD + s] = w * s_kq[p * TD + s];
        if (kDelta) s_ck[(nn * NP + p) * TD + s] = p < h + s ? w * s_kk[p * TD + s] : 0.0f;
        w *= s_a[nn * NP + p];
      }
      s_d[nn * TD + s] = w;
    }
  } else {
    // KDA (one head): per draft s, the channel weights W_{p,s} = prod_{l=p+1}^{h+s} a_l (a vector) go
    // into the key products, (W_{p,s} . k_p) . q_s and (W_{p,s} . k_p) . k_{h+s}; G_s = prod_{l<=h+s} a_l
    // scales the streamed vectors instead of the sums: S_ckpt (G_s . q_s), S_ckpt (G_s . k_{h+s}).
    // The scalar weights and d_s are then 1.
    float* s_g = smem + lay.g;  // [TD][DK]
    for (int s = 0; s < TD; ++s) {
      for (int c = threadIdx.x; c < DK; c += kThreads) {
        float w = 1.0f;
        for (int p = h + s; p >= 0; --p) {
          s_wk[p * DK + c] = w * s_keys[p * DK + c];
          w *= s_a[p * DK + c];
        }
        s_g[s * DK + c] = w;
      }
      __syncthreads();
      for (int pair = warp; pair < 2 * (h + s + 1); pair += kWarps) {
        const int which = pair / (h + s + 1), p = pair % (h + s + 1);
        if (which == 1 && p == h + s) continue;  // k_{h+s} . k_{h+s} is not used (p < h + s)
        const float* other = which == 0 ? s_q + s * DK : s_keys + (h + s) * DK;
        float acc = 0.0f;
        for (int c = lane; c < DK; c += 32) acc = fmaf(s_wk[p * DK + c], other[c], acc);
        acc = row_sum<32>(acc);
        if (lane == 0) (which == 0 ? s_kq : s_kk)[p * TD + s] = acc;
      }
      __syncthreads();
    }
    for (int i = threadIdx.x; i < TD * DK; i += kThreads) {
      const int s = i / DK, c = i % DK;
      s_q[i] *= s_g[i];                             // G_s . q_s
      s_keys[(h + s) * DK + c] *= s_g[i];           // G_s . k_{h+s}: the drafts' raw keys are not needed again
    }
    for (int i = threadIdx.x; i < NP * TD; i += kThreads) s_cq[i] = s_kq[i], s_ck[i] = s_kk[i];  // w = 1 (1 x is x)
    for (int i = threadIdx.x; i < TD; i += kThreads) s_d[i] = 1.0f;
  }
  __syncthreads();

  // One pass over the rows of the NH checkpoints read (Tile<fp32> row geometry: LPR lanes a row):
  // S q_s and S k_{h+s} of the loaded checkpoint, then at a flush the fold and both writes.
  const DeviceState read_state = flush || !A.split ? A.recur : A.read;
  const bool lp_nvfp4 = A.split && A.read.format == StorageFormat::nvfp4;
  const int iterations = (rows_total + kWarps * RW - 1) / (kWarps * RW);
  if (!fold) {
    // No fold: only the products. kBatch row iterations' loads are issued before the first is used:
    // with one row per warp in flight the LP read was latency-bound (H200, 2026-12-03: 3.5-4.3% of
    // copy bandwidth). (Batching the folding path too spilled and ran slower: e548206.)
    constexpr int kBatch = 4;
    for (int it0 = 0; it0 < iterations; it0 += kBatch) {
      float xb[kBatch][P][E];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int row = ((it0 + j) * kWarps + warp) * RW + Geo::row_in_iteration(lane);
        const bool valid = it0 + j < iterations && row < rows_total;
        const int nn = valid ? row / dv : 0, r = valid ? row % dv : 0;
        const HeadView view = head_view(read_state, hb0 + nn, dv, DK);
#pragma unroll
        for (int p = 0; p < P; ++p) {
          if (valid) load4_any<DK>(view, read_state.format, r, Geo::col(lane, p), xb[j][p]);
          else for (int e = 0; e < E; ++e) xb[j][p][e] = 0.0f;
        }
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int row = ((it0 + j) * kWarps + warp) * RW + Geo::row_in_iteration(lane);
        row_products<DK, TD, kDelta>(xb[j], s_q, s_keys + h * DK, s_rows, rows_total, row,
                                     it0 + j < iterations && row < rows_total, lane);
      }
    }
  }
  for (int it = 0; fold && it < iterations; ++it) {
    const int row = (it * kWarps + warp) * RW + Geo::row_in_iteration(lane);
    const bool valid = row < rows_total;
    const int nn = valid ? row / dv : 0, r = valid ? row % dv : 0;
    const HeadView view = head_view(read_state, hb0 + nn, dv, DK);
    float x[P][E];
#pragma unroll
    for (int p = 0; p < P; ++p) {
      if (valid) load4_any<DK>(view, read_state.format, r, Geo::col(lane, p), x[p]);
      else for (int e = 0; e < E; ++e) x[p][e] = 0.0f;
    }
    row_products<DK, TD, kDelta>(x, s_q, s_keys + h * DK, s_rows, rows_total, row, valid, lane);
    // S <- REPLAY(S_ckpt, B[1:h]), one record at a time as the conventional step folds it.
    const float* vn = s_vals + static_cast<std::size_t>(nn) * NP * dv;
    for (int j = 0; j < h; ++j) {
      const float* aj = s_a + (nn * NP + j) * W;  // one decay, or dk of them (KDA)
      const float* kj = s_keys + j * DK;
      float uj;
      if (recompute_u) {  // u_j^HP = b_j (v_j - a_j S_{j-1}^HP k_j); KDA: b_j (v_j - S_{j-1}^HP (a_j . k_j))
        float skj = 0.0f;
#pragma unroll
        for (int p = 0; p < P; ++p) {
          const int c = Geo::col(lane, p);
          if constexpr (kChannel) {
#pragma unroll
            for (int e = 0; e < E; ++e) skj = fmaf(x[p][e], aj[c + e] * kj[c + e], skj);
          } else {
            skj = dot_acc<E>(x[p], kj + c, skj);
          }
        }
        skj = row_sum<LPR>(skj);
        // Lanes past the last row (valid = false) take part in the row sums only: they read no record,
        // which another warp may be rewriting.
        uj = valid ? s_beta[nn * NP + j] * (vn[j * dv + r] - (kChannel ? skj : aj[0] * skj)) : 0.0f;
      } else {
        uj = valid ? vn[j * dv + r] : 0.0f;
      }
#pragma unroll
      for (int p = 0; p < P; ++p) {
        const int c = Geo::col(lane, p);
#pragma unroll
        for (int e = 0; e < E; ++e) x[p][e] = fmaf(aj[kChannel ? c + e : 0], x[p][e], uj * kj[c + e]);
      }
      if (recompute_u) {
        __syncwarp();  // every lane of the row has read v_j[r] before it is replaced by u_j^HP
        if (valid && lane % LPR == 0) s_vals[(static_cast<std::size_t>(nn) * NP + j) * dv + r] = uj;
        __syncwarp();
      }
    }
    // S_ckpt^HP <- Q_HP(S) (RTN or SR, the CPU's stream numbering), S_ckpt^LP <- Q_LP(S) (RTN).
    const int vh = bg.vh0 + nn;
    const HeadView recur_view = head_view(A.recur, hb0 + nn, dv, DK);
    const uint64_t stream = sr_stream_device(bg.b, bg.g, vh, 0, win.flushes);
    float* const recur_residual = A.recur_ef ? head_residual(A.recur, hb0 + nn, dv, DK) : nullptr;
    float* const read_residual = A.split ? head_residual(A.read, hb0 + nn, dv, DK) : nullptr;
    if (valid)
#pragma unroll
      for (int p = 0; p < P; ++p)
        store4_recur<DK>(recur_view, A.recur.format, r, Geo::col(lane, p), x[p], A.recur_mode, A.seed, stream, recur_residual);
    if (A.split && !lp_nvfp4)
      store_read_row<DK, P, LPR>(head_view(A.read, hb0 + nn, dv, DK), A.read.format, r, lane, x, valid, {}, read_residual);
    if (lp_nvfp4 && valid) {
      float m = 0.0f;
#pragma unroll
      for (int p = 0; p < P; ++p) {
        float e4[E];  // the LP copy's input is S + E with error feedback: its amax is taken over that
        load_residual4<DK>(read_residual, r, Geo::col(lane, p), e4);
#pragma unroll
        for (int e = 0; e < E; ++e) {
          const float ax = fabsf(read_residual ? __fadd_rn(x[p][e], e4[e]) : x[p][e]);
          if (ax < INFINITY && ax > m) m = ax;  // the tensor amax skips non-finite values, as the CPU's
        }
      }
      atomicMax(&s_amax[nn], __float_as_uint(m));  // non-negative floats order as their bits
    }
  }
  __syncthreads();
  if (fold && lp_nvfp4) {
    // NVFP4 LP copy: the per-head tensor scale from the amax, then the HP rows this block just wrote
    // (fp32: the launcher requires it) re-read and quantized.
    for (int nn = threadIdx.x; nn < NH; nn += kThreads)
      *head_view(A.read, hb0 + nn, dv, DK).tensor_scale_out =
          formats::nvfp4_tensor_scale(__uint_as_float(s_amax[nn])).decode;
    for (int it = 0; it < iterations; ++it) {
      const int row = (it * kWarps + warp) * RW + Geo::row_in_iteration(lane);
      const bool valid = row < rows_total;
      const int nn = valid ? row / dv : 0, r = valid ? row % dv : 0;
      float y[P][E];
#pragma unroll
      for (int p = 0; p < P; ++p) {
        if (valid) load4<StorageFormat::fp32, DK>(head_view(A.recur, hb0 + nn, dv, DK), r, Geo::col(lane, p), y[p]);
        else for (int e = 0; e < E; ++e) y[p][e] = 0.0f;
      }
      const formats::Nvfp4TensorScale ts = formats::nvfp4_tensor_scale(__uint_as_float(s_amax[nn]));
      store_read_row<DK, P, LPR>(head_view(A.read, hb0 + nn, dv, DK), StorageFormat::nvfp4, r, lane, y, valid, ts,
                                 head_residual(A.read, hb0 + nn, dv, DK));
    }
  }
  // One thread per (head, row): the drafts' outputs (and GDN's corrections), decode_verify_epilogue.cuh.
  for (int idx = threadIdx.x; idx < rows_total; idx += kThreads) {
    const int nn = idx / dv, r = idx % dv;
    verify_row_epilogue<TD, kDelta, false>(
        idx, nn, r, dv, h, NP, rows_total, s_vals, s_cq, s_ck, s_d, s_rows,
        [&](int s, float sk) {
          const float* const vn = s_vals + static_cast<std::size_t>(nn) * NP * dv + r;  // staged at h + s
          return s_beta[nn * NP + h + s] * (vn[static_cast<std::size_t>(h + s) * dv] - sk);
        },
        [&](int s, float u) { A.rec.u[(slot_of(h + s) * bg.H + bg.head0 + nn) * dv + r] = u; },
        [&](int s, float o) { A.in.out[in_head(s, nn) * dv + r] = o; });
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    WindowState next = win;
    if (fold) {  // drop B[1:h]: the drafts become window positions 0..T-1; one checkpoint event
      next.start = (win.start + h) % A.rec.capacity;
      next.h = 0;
      next.flushes = win.flushes + 1;
    }
    write_next_window(A.rec, bg.b, next);
  }
  step_block_done(A.rec, bg.b, gridDim.x);
}

}  // namespace

void decode_detail::launch_split_verify(ssm::Recurrence kind, const DecodeShape& shape, int drafts, const StepInputs& in,
                                        const ReplayConfig& config, const DeviceRecords& records, int max_committed,
                                        cudaStream_t stream) {
  const StorageFormat recur = config.recur.format;
  if (recur != StorageFormat::fp32 && recur != StorageFormat::fp16 && recur != StorageFormat::bf16)
    throw std::invalid_argument("verification: the recurrence checkpoint is fp32, fp16 or bf16");
  if (config.split()) {
    const StorageFormat read = config.read.format;
    if (read == StorageFormat::fp8b128 && shape.dk % 128) throw std::invalid_argument("fp8b128 read needs dk % 128 == 0");
    // The NVFP4 LP copy's tensor amax needs a second pass over S, which re-reads the HP rows just written.
    if (read == StorageFormat::nvfp4 && recur != StorageFormat::fp32)
      throw std::invalid_argument("an NVFP4 read checkpoint needs an fp32 recurrence checkpoint in the kernels");
  }
  int NH;
  if (kind == ssm::Recurrence::kda) {
    // Channel-wise decay weights differ per value head: nothing is shared across a key head's heads.
    if (config.heads_per_block > 1)
      throw_invalid_argument("kda verification runs one value head per block (ReplayConfig::heads_per_block 0 or 1)",
                             "heads_per_block", config.heads_per_block);
    NH = 1;
  } else {
    NH = heads_per_block(shape, config.heads_per_block);
  }
  const formats::RoundingMode recur_mode = checked_rounding(config.recur, config.recur_rounding, "recur");
  if (config.split()) {
    checked_rounding(config.read, config.read_rounding, "read");
    if (config.read_rounding == formats::Rounding::sr)
      throw std::invalid_argument("verification: the read (LP) copy rounds with RTN or ef, not SR");
  }
  const SplitVerifyArgs A{shape,   in,      config.window, config.recur, config.read, config.split(), recur_mode,
                          config.seed, records, NH, max_committed, config.recur_rounding == formats::Rounding::ef};
  const dim3 grid(shape.value_heads / NH, shape.batch);
  const std::size_t smem =
      sizeof(float) * SplitVerifyLayout(max_committed, drafts, shape.dk, shape.dv, NH, kind == ssm::Recurrence::kda).total;
  with_kind_all(kind, [&](auto K) {
    with_dk(shape.dk, [&](auto DK) {
      with_drafts(drafts, [&](auto TD) {
        auto kernel = split_verify_kernel<K(), DK(), TD()>;
        REPLAYSSM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
        kernel<<<grid, kThreads, smem, stream>>>(A);
      });
    });
  });
  REPLAYSSM_CUDA_CHECK_LAUNCH();
}

}  // namespace replayssm::cuda
