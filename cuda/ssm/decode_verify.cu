// Speculative verification (Algorithm 2): output-only verification of T drafts with the GDN UT transform,
// a flush when h + T > L, and the commit (pointer rollback). This file holds the tuned kernel for a
// shared FP32 checkpoint; separate precisions (Algorithm 3) and shared checkpoints below FP32 are in
// decode_verify_split.cu.
#include "ssm/decode_common.cuh"
#include "ssm/decode_kda.cuh"
#include "ssm/mma_tf32.cuh"

namespace replayssm::cuda {

using formats::StorageFormat;
using namespace detail;
using namespace decode_detail;

namespace {

// Copies `count` vectors of `len` elements as 16-byte chunks (8 bf16 or 4 fp32 values each): src(v)
// and dst(v) give vector v's first element. The index math (which vector, whose ring slot) is done once
// per chunk instead of once per element. bf16 -> fp32 is exact, so the values are the same as an
// element-wise copy's. The caller checks that len is a multiple of the chunk and the rows are 16-byte aligned.
template <int kUnroll, class Src, class Dst>
__device__ __forceinline__ void copy_vector_chunks(int count, int len, Src&& src, Dst&& dst) {
  using S = std::remove_cv_t<std::remove_pointer_t<decltype(src(0))>>;
  using D = std::remove_pointer_t<decltype(dst(0))>;
  constexpr int kChunk = 16 / static_cast<int>(sizeof(S));
  static_assert(std::is_same_v<S, D> || (std::is_same_v<S, __nv_bfloat16> && std::is_same_v<D, float>),
                "a plain copy, or bf16 widened to fp32");
  const int chunks = len / kChunk;
  const SmallDiv per_vector(chunks);
  copy_unrolled<kUnroll>(
      count * chunks,
      [&](int i) {
        const int v = per_vector(i);
        return *reinterpret_cast<const uint4*>(src(v) + (i - v * chunks) * kChunk);
      },
      [&](int i, uint4 x) {
        const int v = per_vector(i);
        D* out = dst(v) + (i - v * chunks) * kChunk;
        if constexpr (std::is_same_v<S, D>) {
          *reinterpret_cast<uint4*>(out) = x;
        } else {  // bf16 bits b -> fp32 bits b << 16
          const auto lo = [](uint32_t w) { return __uint_as_float(w << 16); };
          const auto hi = [](uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); };
          reinterpret_cast<float4*>(out)[0] = make_float4(lo(x.x), hi(x.x), lo(x.y), hi(x.y));
          reinterpret_cast<float4*>(out)[1] = make_float4(lo(x.z), hi(x.z), lo(x.w), hi(x.w));
        }
      });
}

// ================================ speculative verification ====================================
struct VerifyArgs {
  DecodeShape shape;
  StepInputs in;
  int window, drafts;
  DeviceState ckpt;
  DeviceRecords rec;
  int heads_per_block;
  int max_committed;  // max(L, records.max_drafts): the most committed records a verify step can see
};

__host__ __device__ inline std::size_t align4(std::size_t floats) { return (floats + 3) / 4 * 4; }

// HM = max(L, T_max): a commit can leave h = L committed records (no flush: h + a <= L), or h = a <= T_max
// after a flush.
__host__ __device__ inline std::size_t verify_shared_floats(int HM, int T, int DK, int dv, int NH) {
  const int L = HM, n = HM + T;  // positions a verify step can see: h <= HM committed (+ T drafts)
  return align4(static_cast<std::size_t>(NH) * n * dv)  // record vectors (v or u) per head
         + static_cast<std::size_t>(L) * DK          // committed keys (flush fold)
         + 2 * static_cast<std::size_t>(n) * T       // key products kq, kk
         + static_cast<std::size_t>(NH) * n * T      // decay weights per head
         + static_cast<std::size_t>(NH) * n          // decays
         + 2 * static_cast<std::size_t>(NH) * T      // d_s, beta_s
         + 2 * static_cast<std::size_t>(NH) * dv * T   // S q_s, S k_s
         + static_cast<std::size_t>(NH) * (L + 1);      // flush weights and gamma per head
}

// The lane's 8 columns from `col` of rows a and b of an FP32 checkpoint (zeros for a row past the end).
// A plain function, not a lambda: a closure holding the arrays would put them in local memory.
template <int DK>
__device__ __forceinline__ void load_row_chunk(const HeadView& ck, int row_a, int row_b, bool valid_a, bool valid_b, int col,
                                               float (&a)[8], float (&b)[8]) {
#pragma unroll
  for (int h4 = 0; h4 < 2; ++h4) {
    if (valid_a) load4<StorageFormat::fp32, DK>(ck, row_a, col + 4 * h4, a + 4 * h4);
    else a[4 * h4] = a[4 * h4 + 1] = a[4 * h4 + 2] = a[4 * h4 + 3] = 0.0f;
    if (valid_b) load4<StorageFormat::fp32, DK>(ck, row_b, col + 4 * h4, b + 4 * h4);
    else b[4 * h4] = b[4 * h4 + 1] = b[4 * h4 + 2] = b[4 * h4 + 3] = 0.0f;
  }
}

// Output-only verification of T drafts for NH heads from an FP32 checkpoint (Algorithm 2; GDN: the
// UT transform, solved per row by forward substitution). A flush (h + T > L) folds the h committed
// records into the same streamed rows and writes them back.
// Where the checkpoint stream (and a flush's fold) runs on the tensor cores instead of the CUDA cores.
// Chosen by measurement (H200, B = 32 and 256, four paper shapes, both variants alternating;
// experiments/bench/decode_2026-12-04/call2_mma_verify/): GDN at dk = 128 with T = 8 drafts takes
// 0.73-0.79 of the CUDA-core time without a flush and 0.90-0.93 with one, at T = 4 0.82-1.02 and
// 0.74-0.98. At T <= 2 and for Mamba-2 (dv rows per head, one product per draft) the CUDA-core stream at
// 3 blocks per SM is faster: the tensor-core one needs 128 registers (2 blocks per SM), and with fewer
// instructions to hide, the lost occupancy costs more than the mma saves. Other dk are not measured.
template <ssm::Recurrence K, int DK, int TD>
constexpr bool verify_on_tensor_cores() {
  return K == ssm::Recurrence::gdn && DK == 128 && TD >= 4;
}

// Blocks per SM the verify kernel's registers are sized for: the key products hold T drafts' query (and
// key) slices, 4T (8T) per lane at dk = 128; the tensor-core stream the drafts' B fragments (dk / 4 per
// lane, as many again for the keys) beside 16 state values per row pair (at 80 registers it spills).
template <ssm::Recurrence K, int DK, int TD>
constexpr int verify_min_blocks() {
  if (DK == 256) return 1;
  if (verify_on_tensor_cores<K, DK, TD>()) return 2;
  return TD == 8 && K == ssm::Recurrence::gdn ? 2 : 3;
}

template <ssm::Recurrence K, int DK, int TD>
__global__ void __launch_bounds__(kThreads, verify_min_blocks<K, DK, TD>()) verify_kernel(VerifyArgs A) {
  using T = Tile<StorageFormat::fp32, DK>;
  constexpr int E = 4, P = T::P;
  extern __shared__ float smem[];
  const BlockGeometry bg = block_geometry(A.shape, A.heads_per_block);
  const int NH = bg.NH, dv = bg.dv;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const WindowState win = current_window(A.rec, bg.b);
  const int h = win.h, n = h + TD, HM = A.max_committed, NP = HM + TD;
  if (h > HM) __trap();  // the launcher sizes HM for every h a commit can leave
  const bool flush = h + TD > A.window;
  float* s_vals = smem;                                   // [NH][n][dv]
  float* s_keys = s_vals + align4(static_cast<std::size_t>(NH) * NP * dv);  // [h][DK], 16-byte aligned
  float* s_kq = s_keys + static_cast<std::size_t>(HM) * DK;          // [n][TD]
  float* s_kk = s_kq + NP * TD;
  float* s_w = s_kk + NP * TD;                            // [NH][n][TD]
  float* s_a = s_w + NH * NP * TD;                        // [NH][n]
  float* s_d = s_a + NH * NP;                             // [NH][TD]
  float* s_beta = s_d + NH * TD;                          // [NH][TD]
  float* s_rows = s_beta + NH * TD;                       // [2][TD][NH*dv] (row-minor: conflict-free reads)
  float* s_fw = s_rows + 2 * NH * dv * TD;                // [NH][HM] flush weights prod_{l=p+1}^{h-1} a_l
  float* s_fg = s_fw + NH * HM;                           // [NH] flush gamma prod_{l<h} a_l
  const std::size_t hb0 = static_cast<std::size_t>(bg.b) * bg.H + bg.head0;
  auto draft_k = [&](int s) { return A.in.k + ((static_cast<std::size_t>(bg.b) * TD + s) * bg.G + bg.g) * DK; };
  auto draft_q = [&](int s) { return A.in.q + ((static_cast<std::size_t>(bg.b) * TD + s) * bg.G + bg.g) * DK; };
  auto key_at = [&](int p) { return p >= h ? draft_k(p - h) : A.rec.k + (ring_slot(A.rec, bg.b, win, p) * bg.G + bg.g) * DK; };
  auto in_head = [&](int s, int nn) { return (static_cast<std::size_t>(bg.b) * TD + s) * bg.H + bg.head0 + nn; };
  // Draft records after the committed ones (rejected ones are overwritten later).
  const SmallDiv per_draft(NH);
  // Record vectors move as 16-byte chunks where dv and the buffers allow (the index math once per chunk,
  // not per element; the values are the same), else element by element.
  const auto aligned16 = [](const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0; };
  const bool v_chunks = dv % 8 == 0 && aligned16(A.in.v) && aligned16(A.rec.v);
  const auto draft_v_src = [&](int vec) { const int s = per_draft(vec), nn = vec - s * NH; return A.in.v + in_head(s, nn) * dv; };
  const auto draft_v_dst = [&](int vec) {
    const int s = per_draft(vec), nn = vec - s * NH;
    return A.rec.v + (ring_slot(A.rec, bg.b, win, h + s) * bg.H + bg.head0 + nn) * dv;
  };
  if (v_chunks)
    copy_vector_chunks<4>(TD * NH, dv, draft_v_src, draft_v_dst);
  else
    copy_vectors(
        TD * NH, dv, [&](int vec, int r) { return draft_v_src(vec)[r]; },
        [&](int vec, int r, __nv_bfloat16 x) { draft_v_dst(vec)[r] = x; });
  if (bg.vh0 == 0)
    copy_unrolled<4>(
        TD * DK / 2, [&](int i) { return reinterpret_cast<const __nv_bfloat162*>(draft_k(2 * i / DK))[i % (DK / 2)]; },
        [&](int i, __nv_bfloat162 x) {
          const std::size_t slot = ring_slot(A.rec, bg.b, win, h + 2 * i / DK);
          reinterpret_cast<__nv_bfloat162*>(A.rec.k + (slot * bg.G + bg.g) * DK)[i % (DK / 2)] = x;
        });
  for (int idx = threadIdx.x; idx < NH * TD; idx += kThreads) {
    const int s = idx / NH, nn = idx % NH;
    const std::size_t slot = ring_slot(A.rec, bg.b, win, h + s);
    A.rec.alpha[slot * bg.H + bg.head0 + nn] = A.in.alpha[in_head(s, nn)];
    if (K == ssm::Recurrence::gdn) A.rec.beta[slot * bg.H + bg.head0 + nn] = A.in.beta[in_head(s, nn)];
  }
  // Stage: committed record vectors (v or u), draft v (Mamba-2), decays, betas, committed keys.
  const int committed_vals = K == ssm::Recurrence::mamba2 ? n : h;
  const SmallDiv per_head(committed_vals > 0 ? committed_vals : 1);
  const auto staged_dst = [&](int vec) {
    const int nn = per_head(vec), p = vec - nn * committed_vals;
    return s_vals + (static_cast<std::size_t>(nn) * NP + p) * dv;
  };
  if constexpr (K == ssm::Recurrence::mamba2) {
    const auto v_src = [&](int vec) {
      const int nn = per_head(vec), p = vec - nn * committed_vals;
      return p >= h ? A.in.v + in_head(p - h, nn) * dv : A.rec.v + (ring_slot(A.rec, bg.b, win, p) * bg.H + bg.head0 + nn) * dv;
    };
    if (v_chunks)
      copy_vector_chunks<4>(NH * committed_vals, dv, v_src, staged_dst);
    else
      copy_vectors(
          NH * committed_vals, dv, [&](int vec, int r) { return __bfloat162float(v_src(vec)[r]); },
          [&](int vec, int r, float x) { staged_dst(vec)[r] = x; });
  } else {  // GDN: the committed records' cached u (committed_vals = h)
    const auto u_src = [&](int vec) {
      const int nn = per_head(vec), p = vec - nn * committed_vals;
      return A.rec.u + (ring_slot(A.rec, bg.b, win, p) * bg.H + bg.head0 + nn) * dv;
    };
    if (dv % 4 == 0 && aligned16(A.rec.u))
      copy_vector_chunks<4>(NH * committed_vals, dv, u_src, staged_dst);
    else
      copy_vectors(
          NH * committed_vals, dv, [&](int vec, int r) { return u_src(vec)[r]; },
          [&](int vec, int r, float x) { staged_dst(vec)[r] = x; });
  }
  copy_unrolled<2>(
      NH * n,
      [&](int idx) {
        const int nn = idx / n, p = idx % n;
        return p >= h ? A.in.alpha[in_head(p - h, nn)] : A.rec.alpha[ring_slot(A.rec, bg.b, win, p) * bg.H + bg.head0 + nn];
      },
      [&](int idx, float x) { s_a[(idx / n) * NP + idx % n] = x; });
  if (K == ssm::Recurrence::gdn)
    for (int idx = threadIdx.x; idx < NH * TD; idx += kThreads) s_beta[idx] = A.in.beta[in_head(idx % TD, idx / TD)];
  if (flush)
    copy_unrolled<4>(
        h * DK / 2,
        [&](int i) {
          const int p = 2 * i / DK;
          return __bfloat1622float2(reinterpret_cast<const __nv_bfloat162*>(
              A.rec.k + (ring_slot(A.rec, bg.b, win, p) * bg.G + bg.g) * DK)[i % (DK / 2)]);
        },
        [&](int i, float2 x) { reinterpret_cast<float2*>(s_keys)[i] = x; });
  // The drafts' queries (and keys), lane slices for the streamed rows and the key products.
  float qv[TD][P][E], kv[K == ssm::Recurrence::gdn ? TD : 1][P][E];
#pragma unroll
  for (int s = 0; s < TD; ++s)
#pragma unroll
    for (int p = 0; p < P; ++p) {
      load_bf16x4(draft_q(s) + T::col(lane, p), qv[s][p]);
      if constexpr (K == ssm::Recurrence::gdn) load_bf16x4(draft_k(s) + T::col(lane, p), kv[s][p]);
    }
  // Key products, once for the NH heads: s_kq[p][s] = k_p . q_s (p <= h + s), s_kk[p][s] = k_p . k_s
  // (p < h + s), all drafts at once.
  key_products<DK, TD, K == ssm::Recurrence::gdn ? 2 : 1>(n, key_at, qv, kv, [&](int p, int i, float sum) {
    const int v = i / TD, s = i % TD;
    if (v == 0 ? p <= h + s : p < h + s) (v == 0 ? s_kq : s_kk)[p * TD + s] = sum;
  });
  __syncthreads();
  for (int idx = threadIdx.x; idx < NH * TD; idx += kThreads) {  // w[p][s] = prod_{l=p+1}^{h+s} a_l, d_s
    const int nn = idx / TD, s = idx % TD;
    float w = 1.0f;
    for (int p = h + s; p >= 0; --p) {
      s_w[(nn * NP + p) * TD + s] = w;
      w *= s_a[nn * NP + p];
    }
    s_d[nn * TD + s] = w;
  }
  if (flush)  // the committed records' weights for the fold, one warp per head
    for (int nn = warp; nn < NH; nn += kWarps) {
      const SuffixProducts fw = warp_suffix_products(lane < h ? s_a[nn * NP + lane] : 1.0f,
                                                     lane + 32 < h ? s_a[nn * NP + lane + 32] : 1.0f);
      if (lane < h) s_fw[nn * HM + lane] = fw.lo;
      if (lane + 32 < h) s_fw[nn * HM + lane + 32] = fw.hi;
      if (lane == 0) s_fg[nn] = fw.gamma;
    }
  // One streaming read of the NH checkpoints: S q_s (and S k_s) for every draft; a flush folds the
  // committed records into the streamed rows and writes them back.
  __syncthreads();
  const HeadView ck = head_view(A.ckpt, hb0, dv, DK);
  const int rows_total = NH * dv;
  if constexpr (verify_on_tensor_cores<K, DK, TD>()) {
    // On the tensor cores (m16n8k8 TF32, fp32 accumulation). A warp takes 16 rows (lane: rows
    // g = lane / 4 and g + 8) and walks dk in chunks of 32 columns (lane: columns 32c + 8t .. +7,
    // t = lane % 4: two 16-byte loads per row). Chunk step i gives k slot t column 32c + 8t + 2i and slot t + 4 the next column, in A and B
    // alike (any assignment of columns to k slots gives the same sums). B's column n is draft n (zero for
    // n >= TD). FP32 S enters as hi + lo, two TF32 terms (2^-22 relative); q and k are bf16, exact in TF32,
    // and a TF32 x bf16 product is exact in fp32. Only the summation order differs from the CUDA-core
    // stream, and, after a flush, the written checkpoint's last bits (the fold sums 8 records per mma).
    constexpr int NV = K == ssm::Recurrence::gdn ? 2 : 1;
    constexpr int kChunks = DK / 32;
    static_assert(TD <= 8 && DK % 32 == 0, "one m16n8 tile holds at most 8 drafts; chunks of 32 columns");
    const int g = lane / 4, t = lane % 4;
    // Draft g's q (and k) at the lane's columns, as bf16 pairs (column 32c + 8t + 2p in the low half).
    uint32_t bpair[NV][kChunks][4];
#pragma unroll
    for (int v = 0; v < NV; ++v)
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        uint4 raw = make_uint4(0, 0, 0, 0);
        if (g < TD) raw = *reinterpret_cast<const uint4*>((v == 0 ? draft_q(g) : draft_k(g)) + 32 * c + 8 * t);
        bpair[v][c][0] = raw.x, bpair[v][c][1] = raw.y, bpair[v][c][2] = raw.z, bpair[v][c][3] = raw.w;
      }
    for (int R0 = warp * 16; R0 < rows_total; R0 += kWarps * 16) {  // warp-uniform: mma needs all 32 lanes
      const int row_a = R0 + g, row_b = R0 + g + 8;
      const bool valid_a = row_a < rows_total, valid_b = row_b < rows_total;
      float d[NV][4];
#pragma unroll
      for (int v = 0; v < NV; ++v) d[v][0] = d[v][1] = d[v][2] = d[v][3] = 0.0f;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        float a[8], b[8];  // latency: the other resident warps' loads cover it (no second buffer: registers)
        load_row_chunk<DK>(ck, row_a, row_b, valid_a, valid_b, 32 * c + 8 * t, a, b);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const uint32_t hi[4] = {to_tf32(a[2 * i]), to_tf32(b[2 * i]), to_tf32(a[2 * i + 1]), to_tf32(b[2 * i + 1])};
          const uint32_t lo[4] = {to_tf32(a[2 * i] - __uint_as_float(hi[0])), to_tf32(b[2 * i] - __uint_as_float(hi[1])),
                                  to_tf32(a[2 * i + 1] - __uint_as_float(hi[2])), to_tf32(b[2 * i + 1] - __uint_as_float(hi[3]))};
#pragma unroll
          for (int v = 0; v < NV; ++v) {
            const uint32_t b0 = bpair[v][c][i] << 16, b1 = bpair[v][c][i] & 0xFFFF0000u;  // bf16 -> fp32 bits
            mma_tf32(d[v], hi, b0, b1);
            mma_tf32(d[v], lo, b0, b1);
          }
        }
        if (flush && h > 0) {
          // S_new = gamma_h S + U, U = sum_{p<h} c_p k_p^T with c_p = prod_{l=p+1}^{h-1} a_l (v_p or u_p) per row
          // (Mamba-2: v; GDN: cached u): a rank-h product on the tensor cores, k = 8 records per step.
          // Its D tile m holds, for lane (g, t), rows g and g + 8 at columns 32c + 8t + 2m and +1: the
          // lane's own 8 columns, so U adds to the state in place. A = c (fp32, hi + lo), B = the bf16
          // keys (exact in TF32); records p >= h are zero in both (the keys' shared rows past h are stale).
          const int na = valid_a ? row_a / dv : 0, ra = row_a % dv, nb = valid_b ? row_b / dv : 0, rb = row_b % dv;
          float u[4][4];  // [tile m][D register]
#pragma unroll
          for (int m = 0; m < 4; ++m) u[m][0] = u[m][1] = u[m][2] = u[m][3] = 0.0f;
          for (int p0 = 0; p0 < h; p0 += 8) {
            float cv[4];  // A registers: (row g, record p0 + t), (g + 8, p0 + t), (g, p0 + t + 4), (g + 8, p0 + t + 4)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
              const int p = p0 + t + 4 * (r / 2);
              const bool upper = r % 2 == 1;
              const bool ok = p < h && (upper ? valid_b : valid_a);
              const int nn = upper ? nb : na, rr = upper ? rb : ra;
              cv[r] = ok ? s_fw[nn * HM + p] * s_vals[(static_cast<std::size_t>(nn) * NP + p) * dv + rr] : 0.0f;
            }
            const uint32_t chi[4] = {to_tf32(cv[0]), to_tf32(cv[1]), to_tf32(cv[2]), to_tf32(cv[3])};
            const uint32_t clo[4] = {to_tf32(cv[0] - __uint_as_float(chi[0])), to_tf32(cv[1] - __uint_as_float(chi[1])),
                                     to_tf32(cv[2] - __uint_as_float(chi[2])), to_tf32(cv[3] - __uint_as_float(chi[3]))};
            // B registers of tile m: records p0 + t and p0 + t + 4 at column n = g of the tile, which is the
            // physical column 32c + 8 (g / 2) + 2m + g % 2 (where lane (g', t') with t' = g / 2 holds it in D).
            const int pb0 = p0 + t, pb1 = p0 + t + 4;
            const int colg = 32 * c + 8 * (g / 2) + g % 2;
#pragma unroll
            for (int m = 0; m < 4; ++m) {
              const uint32_t k0 = pb0 < h ? __float_as_uint(s_keys[pb0 * DK + colg + 2 * m]) : 0u;
              const uint32_t k1 = pb1 < h ? __float_as_uint(s_keys[pb1 * DK + colg + 2 * m]) : 0u;
              mma_tf32(u[m], chi, k0, k1);
              mma_tf32(u[m], clo, k0, k1);
            }
          }
          const float ga = s_fg[na], gb = s_fg[nb];
#pragma unroll
          for (int m = 0; m < 4; ++m) {  // D registers: (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1) of tile m
            a[2 * m] = fmaf(ga, a[2 * m], u[m][0]);
            a[2 * m + 1] = fmaf(ga, a[2 * m + 1], u[m][1]);
            b[2 * m] = fmaf(gb, b[2 * m], u[m][2]);
            b[2 * m + 1] = fmaf(gb, b[2 * m + 1], u[m][3]);
          }
#pragma unroll
          for (int h4 = 0; h4 < 2; ++h4) {
            const int col = 32 * c + 8 * t + 4 * h4;
            if (valid_a) store_piece<StorageFormat::fp32, DK>(ck, row_a, col, a + 4 * h4, formats::RoundingMode::nearest_even, 0, 0);
            if (valid_b) store_piece<StorageFormat::fp32, DK>(ck, row_b, col, b + 4 * h4, formats::RoundingMode::nearest_even, 0, 0);
          }
        }
      }
      // D: lane holds rows g (d[0], d[1]) and g + 8 (d[2], d[3]) of drafts 2t and 2t + 1.
#pragma unroll
      for (int v = 0; v < NV; ++v)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int s = 2 * t + (q & 1), row = q < 2 ? row_a : row_b;
          if (s < TD && (q < 2 ? valid_a : valid_b)) s_rows[(v * TD + s) * rows_total + row] = d[v][q];
        }
    }
  } else {
    // On the CUDA cores: 2T fused multiply-adds per state element and a warp reduction per row.
    constexpr int LPR = T::LPR, RW = T::RW;
    constexpr int kBatch = TD >= 8 ? 2 : 4;  // row iterations whose loads are issued together
    for (int it0 = 0; it0 * kWarps * RW < rows_total; it0 += kBatch) {
      float xb[kBatch][P][E];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int row = ((it0 + j) * kWarps + warp) * RW + T::row_in_iteration(lane);
#pragma unroll
        for (int p = 0; p < P; ++p) {
          if (row < rows_total) load4<StorageFormat::fp32, DK>(ck, row, T::col(lane, p), xb[j][p]);
          else for (int e = 0; e < E; ++e) xb[j][p][e] = 0.0f;
        }
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int row = ((it0 + j) * kWarps + warp) * RW + T::row_in_iteration(lane);
        const bool valid = row < rows_total;
        float (&x)[P][E] = xb[j];
        {
          constexpr int NV = K == ssm::Recurrence::gdn ? 2 : 1, N = TD * NV;  // partial sums [v][s]
          float part[N];
#pragma unroll
          for (int s = 0; s < TD; ++s) {
            part[s] = 0.0f;
            if constexpr (K == ssm::Recurrence::gdn) part[TD + s] = 0.0f;
#pragma unroll
            for (int p = 0; p < P; ++p) {
              part[s] = dot_acc<E>(x[p], qv[s][p], part[s]);
              if constexpr (K == ssm::Recurrence::gdn) part[TD + s] = dot_acc<E>(x[p], kv[s][p], part[TD + s]);
            }
          }
          if constexpr (N <= LPR) {
            const float sum = row_sum_scatter<LPR, N>(part);
            const int i = scatter_index<LPR, N>(lane);
            if (valid && lane % (LPR / N) == 0) s_rows[i * rows_total + row] = sum;
          } else {
#pragma unroll
            for (int i = 0; i < N; ++i) {
              const float sum = row_sum<LPR>(part[i]);
              if (valid && lane % LPR == 0) s_rows[i * rows_total + row] = sum;
            }
          }
        }
      }
      if (flush && h > 0) {
        // S_new = gamma_h S + sum_{p<h} prod_{l=p+1}^{h-1} a_l  v_p k_p^T (Mamba-2: v; GDN: cached u), with the
        // records outermost: one shared-memory load of key j serves the batch's kBatch rows (per (row, record)
        // 10.75 instructions and 4 wavefronts, against 13.6 and 6 row by row; Nemotron-3-Super's verification
        // with a flush, B = 256: 1154 -> 1057 us on an H100, experiments/bench/decode_2026-12-05/session18).
        // Each row's arithmetic is unchanged: x gamma_h, then fmaf over the records in order. Per row: its head's
        // flush weights and its record values (a row past the block reads head 0's, in bounds, and takes 0: a
        // select, not a branch around the loads).
        const float* fw[kBatch];
        const float* vals[kBatch];
        bool valid[kBatch];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          const int row = ((it0 + b) * kWarps + warp) * RW + T::row_in_iteration(lane);
          valid[b] = row < rows_total;
          const int nn = valid[b] ? row / dv : 0, r = row % dv;
          fw[b] = s_fw + nn * HM;
          vals[b] = s_vals + static_cast<std::size_t>(nn) * NP * dv + r;
          const float gamma_h = s_fg[nn];
#pragma unroll
          for (int p = 0; p < P; ++p)
#pragma unroll
            for (int e = 0; e < E; ++e) xb[b][p][e] *= gamma_h;
        }
        for (int j = 0; j < h; ++j) {
          float c[kBatch];
#pragma unroll
          for (int b = 0; b < kBatch; ++b) {
            const float cj = fw[b][j] * vals[b][static_cast<std::size_t>(j) * dv];
            c[b] = valid[b] ? cj : 0.0f;
          }
#pragma unroll
          for (int p = 0; p < P; ++p) {
            const float4 k4 = *reinterpret_cast<const float4*>(s_keys + j * DK + T::col(lane, p));
#pragma unroll
            for (int b = 0; b < kBatch; ++b) {
              xb[b][p][0] = fmaf(c[b], k4.x, xb[b][p][0]);
              xb[b][p][1] = fmaf(c[b], k4.y, xb[b][p][1]);
              xb[b][p][2] = fmaf(c[b], k4.z, xb[b][p][2]);
              xb[b][p][3] = fmaf(c[b], k4.w, xb[b][p][3]);
            }
          }
        }
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          const int row = ((it0 + b) * kWarps + warp) * RW + T::row_in_iteration(lane);
          if (valid[b])
#pragma unroll
            for (int p = 0; p < P; ++p)
              store_piece<StorageFormat::fp32, DK>(ck, row, T::col(lane, p), xb[b][p], formats::RoundingMode::nearest_even, 0, 0);
        }
      }
    }
  }
  __syncthreads();
  // One thread per (head, row): GDN solves the drafts' corrections (forward substitution of
  // U_d (I + A B_d) = R B_d), then every draft output folds the records.
  for (int idx = threadIdx.x; idx < rows_total; idx += kThreads) {
    const int nn = idx / dv, r = idx % dv;
    const float* vn = s_vals + static_cast<std::size_t>(nn) * NP * dv;
    const float* wn = s_w + nn * NP * TD;
    float u_d[TD];
    if (K == ssm::Recurrence::gdn) {
#pragma unroll
      for (int s = 0; s < TD; ++s) {
        float sk = s_d[nn * TD + s] * s_rows[(TD + s) * rows_total + idx];
        for (int p = 0; p < h; ++p) sk = fmaf(wn[p * TD + s] * s_kk[p * TD + s], vn[p * dv + r], sk);
#pragma unroll
        for (int j = 0; j < s; ++j) sk = fmaf(wn[(h + j) * TD + s] * s_kk[(h + j) * TD + s], u_d[j], sk);
        const float vs = __bfloat162float(A.in.v[in_head(s, nn) * dv + r]);
        u_d[s] = s_beta[nn * TD + s] * (vs - sk);
      }
    }
#pragma unroll
    for (int s = 0; s < TD; ++s) {
      float o = s_d[nn * TD + s] * s_rows[s * rows_total + idx];
      const int committed = K == ssm::Recurrence::gdn ? h : h + s + 1;
      for (int p = 0; p < committed; ++p) o = fmaf(wn[p * TD + s] * s_kq[p * TD + s], vn[p * dv + r], o);
      if (K == ssm::Recurrence::gdn)
#pragma unroll
        for (int j = 0; j <= s; ++j) o = fmaf(wn[(h + j) * TD + s] * s_kq[(h + j) * TD + s], u_d[j], o);
      A.in.out[in_head(s, nn) * dv + r] = o;
    }
    if (K == ssm::Recurrence::gdn)
#pragma unroll
      for (int s = 0; s < TD; ++s) A.rec.u[(ring_slot(A.rec, bg.b, win, h + s) * bg.H + bg.head0 + nn) * dv + r] = u_d[s];
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    WindowState next = win;
    if (flush) {  // drop the committed records: the drafts become window positions 0..T-1
      next.start = (win.start + h) % A.rec.capacity;
      next.h = 0;
      next.flushes = win.flushes + 1;
    }
    write_next_window(A.rec, bg.b, next);
  }
  step_block_done(A.rec, bg.b, gridDim.x);
}

__global__ void commit_kernel(int batch, const int* accepted, DeviceRecords rec) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= batch) return;
  rec.window[window_parity(rec, b)][b].h += accepted[b];  // in place: no other kernel reads it meanwhile
}

}  // namespace

void verify_step(ssm::Recurrence kind, const DecodeShape& shape, int drafts, const StepInputs& in, const ReplayConfig& config,
                 DeviceRecords& records, cudaStream_t stream) {
  // Appendix F skipping is defined for standard decode (the CPU decoders refuse it with max_draft > 1).
  if (config.skips())
    throw std::invalid_argument("verification with checkpoint-read skipping (appendix F) is not defined: the CPU decoders "
                                "implement skipping for standard decode only (ReplayConfig skip thresholds must be 0)");
  checked_rounding(config.recur, config.recur_rounding, "recur");
  const bool low_precision = config.split() || config.recur.format != StorageFormat::fp32;
  if (kind == ssm::Recurrence::kda) {
    if (!low_precision) return kda_detail::verify_step(shape, drafts, in, config, records, stream);
    check_kda_inputs(in, config.heads_per_block);  // Algorithm 3 for KDA: decode_verify_split.cu
    check_kda_records(records);
  }
  check_shape(shape);
  if (config.window < 1 || config.window > kMaxWindow)
    throw_invalid_argument("verification supports 1 <= L <= 64", "L", config.window);
  if (drafts > records.max_drafts)
    throw_invalid_argument("verification: more drafts than the record ring was sized for (DeviceRecords::max_drafts)", "T",
                           drafts, "max_drafts", records.max_drafts);
  const int max_committed = std::max(config.window, records.max_drafts);
  if (max_committed + 1 > kMaxWindow)
    throw_invalid_argument("verification supports max(L, T) + 1 <= 64 (the next standard step may fold that many records)",
                           "L", config.window, "max_drafts", records.max_drafts);
  if (records.capacity < max_committed + records.max_drafts)
    throw_invalid_argument("record ring needs capacity max(L, T) + T", "capacity", records.capacity, "needed",
                           max_committed + records.max_drafts);
  if (low_precision) {
    // Algorithm 3 (separate HP / LP checkpoints), or a shared checkpoint stored below fp32.
    launch_split_verify(kind, shape, drafts, in, config, records, max_committed, stream);
    advance_host_parity(records);
    return;
  }
  const int NH = heads_per_block(shape, config.heads_per_block);
  VerifyArgs A{shape, in, config.window, drafts, config.recur, records, NH, max_committed};
  const dim3 grid(shape.value_heads / NH, shape.batch);
  const std::size_t smem = sizeof(float) * verify_shared_floats(max_committed, drafts, shape.dk, shape.dv, NH);
  with_kind(kind, [&](auto K) {
    with_dk(shape.dk, [&](auto DK) {
      with_drafts(drafts, [&](auto TD) {
        auto kernel = verify_kernel<K(), DK(), TD()>;
        REPLAYSSM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
        kernel<<<grid, kThreads, smem, stream>>>(A);
      });
    });
  });
  REPLAYSSM_CUDA_CHECK_LAUNCH();
  advance_host_parity(records);
}

void commit_step(const DecodeShape& shape, const int* accepted, DeviceRecords& records, cudaStream_t stream) {
  commit_kernel<<<(shape.batch + 127) / 128, 128, 0, stream>>>(shape.batch, accepted, records);
  REPLAYSSM_CUDA_CHECK_LAUNCH();
}

}  // namespace replayssm::cuda
