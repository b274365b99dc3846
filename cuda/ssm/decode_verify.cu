// Speculative verification (Algorithm 2): output-only verification of T drafts with the GDN UT transform,
// a flush when h + T > L, and the commit (pointer rollback). This file holds the tuned kernel for a
// shared FP32 checkpoint; separate precisions (Algorithm 3) and shared checkpoints below FP32 are in
// decode_verify_split.cu.
#include "ssm/decode_common.cuh"
#include "ssm/decode_verify_epilogue.cuh"
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

// The streamed tensor-core verification (verify_on_tensor_cores) keeps its committed keys at a stride of
// dk + 8 floats, the flush fold's (fold_records_mma reads them without bank conflicts there), and one buffer
// of kVerifyTileRows checkpoint rows per warp at a stride of dk + 4: the 16-byte reads of a row's 8 columns (B
// fragments, lane (g, t): row g) and of a column piece of rows 2t, 2t + 1 (the fold's accumulators) then
// fall in distinct banks for the 8 lanes of a quarter warp (row r starts 4r banks on).
constexpr int kVerifyTileRows = 8;  // checkpoint rows of one warp's tile in the streamed verification
__host__ __device__ constexpr int verify_key_stride(int DK, bool streamed) { return streamed ? DK + 8 : DK; }
__host__ __device__ constexpr int verify_tile_stride(int DK) { return DK + 4; }
// The drafts' q and k for the products' A fragments, bf16 as given, [2][8][DK + 32] (a row pad of 16 banks:
// lanes g and g + 1 of a quarter warp read 16-byte pieces of rows g and g + 1, 8t words in).
__host__ __device__ constexpr int verify_draft_stride(int DK) { return DK + 32; }

// The floats before the row buffers (16-byte aligned: the buffers start there). HM = max(L, T_max): a commit
// can leave h = L committed records (no flush: h + a <= L), or h = a <= T_max after a flush.
__host__ __device__ inline std::size_t verify_staging_floats(int HM, int T, int DK, int dv, int NH, bool streamed) {
  const int L = HM, n = HM + T;  // positions a verify step can see: h <= HM committed (+ T drafts)
  return align4(align4(static_cast<std::size_t>(NH) * n * dv)  // record vectors (v or u) per head
         + static_cast<std::size_t>(L) * verify_key_stride(DK, streamed)  // committed keys (flush fold)
         + 2 * static_cast<std::size_t>(n) * T       // key products kq, kk
         + 2 * static_cast<std::size_t>(NH) * n * T  // weighted key products per head (cq, ck)
         + static_cast<std::size_t>(NH) * n          // decays
         + 2 * static_cast<std::size_t>(NH) * T      // d_s, beta_s
         + 2 * static_cast<std::size_t>(NH) * dv * T   // S q_s, S k_s
         + static_cast<std::size_t>(NH) * (L + 1));     // flush weights and gamma per head
}
__host__ __device__ inline std::size_t verify_shared_floats(int HM, int T, int DK, int dv, int NH, bool streamed) {
  return verify_staging_floats(HM, T, DK, dv, NH, streamed) +
         (streamed ? static_cast<std::size_t>(kWarps) * kVerifyTileRows * verify_tile_stride(DK)  // row buffers
                       + 2 * 8 * verify_draft_stride(DK) / 2                                       // drafts (bf16)
                   : 0);
}

// Starts loading the warp's tile of kVerifyTileRows checkpoint rows R0 .. (rows of the block's FP32
// checkpoint, dk columns each) into its buffer (rows TS floats apart) by cp.async; rows at or past
// rows_total are zero-filled instead of read.
template <int DK, int TS>
__device__ __forceinline__ void prefetch_verify_tile(const float* block_rows, int R0, int rows_total, float* buf) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < kVerifyTileRows; ++j) {
    const bool valid = R0 + j < rows_total;
    const float* const row = block_rows + static_cast<std::size_t>(valid ? R0 + j : 0) * DK;
#pragma unroll
    for (int piece = lane; piece < DK / 4; piece += 32) copy_async16(buf + j * TS + 4 * piece, row + 4 * piece, valid);
  }
  copy_async_commit();
}

// Output-only verification of T drafts for NH heads from an FP32 checkpoint (Algorithm 2; GDN: the
// UT transform, solved per row by forward substitution). A flush (h + T > L) folds the h committed
// records into the same streamed rows and writes them back.
// Where the checkpoint stream (and a flush's fold) runs on the tensor cores instead of the CUDA cores.
// GDN: chosen by measurement of the register-fed tensor-core stream this one replaced (H200; decode_2026-12-04/
// call2_mma_verify/): at dk = 128, T = 8 it took 0.73-0.79 of the CUDA-core time without a flush, 0.90-0.93
// with one (T = 4: 0.82-1.02, 0.74-0.98; at T <= 2 the CUDA-core stream won). Streaming the rows by cp.async
// then took GDN's verification with a flush from 571 to 479 us (B = 256, H200; decode_2026-12-06/session20/).
// Mamba-2 at T = 8 (queries only): the streamed stream took its verification 0.87-0.93 of the CUDA-core time
// (B = 32, 256; H100; decode_2026-12-06/session21/, change C). Other T and dk are not measured.
template <ssm::Recurrence K, int DK, int TD>
constexpr bool verify_on_tensor_cores() {
  return DK == 128 && (K == ssm::Recurrence::gdn ? TD >= 4 : K == ssm::Recurrence::mamba2 && TD == 8);
}

// Blocks per SM the verify kernel's registers are sized for: the key products hold T drafts' query (and
// key) slices, 4T (8T) per lane at dk = 128; the tensor-core stream a tile's B fragments and fold accumulators
// (32 + 32 per lane). Its shared memory (about 94 KB per block at NH = 2) allows 2 blocks per SM anyway.
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
  constexpr bool kStreamed = verify_on_tensor_cores<K, DK, TD>();
  constexpr int KS = verify_key_stride(DK, kStreamed), TS = verify_tile_stride(DK);
  float* s_vals = smem;                                   // [NH][n][dv]
  float* s_keys = s_vals + align4(static_cast<std::size_t>(NH) * NP * dv);  // [h][DK], 16-byte aligned
  float* s_kq = s_keys + static_cast<std::size_t>(HM) * KS;          // [n][TD]
  float* s_kk = s_kq + NP * TD;
  float* s_cq = s_kk + NP * TD;                           // [NH][n][TD] w_{p,s} (k_p . q_s), 16-byte aligned at TD % 4 = 0
  float* s_ck = s_cq + NH * NP * TD;                      // [NH][n][TD] w_{p,s} (k_p . k_s) (GDN)
  float* s_a = s_ck + NH * NP * TD;                       // [NH][n]
  float* s_d = s_a + NH * NP;                             // [NH][TD]
  float* s_beta = s_d + NH * TD;                          // [NH][TD]
  float* s_rows = s_beta + NH * TD;                       // [2][TD][NH*dv] (row-minor: conflict-free reads)
  float* s_fw = s_rows + 2 * NH * dv * TD;                // [NH][HM] flush weights prod_{l=p+1}^{h-1} a_l
  float* s_fg = s_fw + NH * HM;                           // [NH] flush gamma prod_{l<h} a_l
  const std::size_t hb0 = static_cast<std::size_t>(bg.b) * bg.H + bg.head0;
  // Streamed: [kWarps][kVerifyTileRows][TS] row buffers, then the drafts' bf16 q and k [2][8][DS].
  float* const s_tiles = smem + verify_staging_floats(HM, TD, DK, dv, NH, kStreamed);
  __nv_bfloat16* const s_drafts = reinterpret_cast<__nv_bfloat16*>(s_tiles + kWarps * kVerifyTileRows * TS);
  constexpr int DS = verify_draft_stride(DK);
  if constexpr (kStreamed)  // the warp's first tile loads while the block stages its records
    prefetch_verify_tile<DK, TS>(reinterpret_cast<const float*>(head_view(A.ckpt, hb0, dv, DK).payload),
                                 kVerifyTileRows * warp, NH * dv, s_tiles + static_cast<std::size_t>(warp) * kVerifyTileRows * TS);
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
        [&](int i, float2 x) {
          if constexpr (KS == DK) reinterpret_cast<float2*>(s_keys)[i] = x;
          else reinterpret_cast<float2*>(s_keys + (2 * i / DK) * KS)[i % (DK / 2)] = x;
        });
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
  // w[p][s] = prod_{l=p+1}^{h+s} a_l, d_s, and the record coefficients the outputs and corrections take,
  // the same for every row of a head: cq[p][s] = w[p][s] (k_p . q_s) (p <= h + s), ck[p][s] = w[p][s] (k_p .
  // k_s) (p < h + s; GDN).
  for (int idx = threadIdx.x; idx < NH * TD; idx += kThreads) {
    const int nn = idx / TD, s = idx % TD;
    float w = 1.0f;
    for (int p = h + s; p >= 0; --p) {
      s_cq[(nn * NP + p) * TD + s] = w * s_kq[p * TD + s];
      if (K == ssm::Recurrence::gdn) s_ck[(nn * NP + p) * TD + s] = p < h + s ? w * s_kk[p * TD + s] : 0.0f;
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
  if constexpr (kStreamed) {  // the drafts' q and k as stored (drafts past TD: zero)
    for (int piece = threadIdx.x; piece < (K == ssm::Recurrence::gdn ? 2 : 1) * 8 * DK / 8; piece += kThreads) {
      const int v = piece / (8 * DK / 8), s = piece / (DK / 8) % 8, col = 8 * (piece % (DK / 8));
      copy_async16(s_drafts + (v * 8 + s) * DS + col, (v == 0 ? draft_q(s < TD ? s : 0) : draft_k(s < TD ? s : 0)) + col, s < TD);
    }
    copy_async_commit();
    copy_async_wait_all();
  }
  // One streaming read of the NH checkpoints: S q_s (and S k_s) for every draft; a flush folds the
  // committed records into the streamed rows and writes them back.
  __syncthreads();
  const HeadView ck = head_view(A.ckpt, hb0, dv, DK);
  const int rows_total = NH * dv;
  if constexpr (kStreamed) {
    // On the tensor cores (m16n8k8 TF32, fp32 accumulation), the rows streamed through the warp's buffer
    // by cp.async: a warp's tiles are rows 8 (warp + kWarps i) .. + 7, and tile i + 1 loads while tile i
    // computes (its products, its fold and stores). The products D = V S^T: M = 16 vectors (m = s: q_s,
    // m = 8 + s: k_s (GDN; Mamba-2: zero), zero for s >= TD), N = the tile's 8 rows, K = 8 columns per step. A = the drafts'
    // bf16 values (exact in TF32), B = the FP32 rows as hi + lo, two TF32 terms (2^-22 relative); a TF32 x
    // bf16 product is exact in fp32. Step (c, i) gives k slot t column 32c + 8t + 2i and slot t + 4 the next
    // column (any assignment of columns to k slots gives the same sums): lane (g, t)'s A registers are
    // then one bf16 pair of draft g's q (k), and its B registers two adjacent columns of row g. Only the
    // summation order differs from the CUDA-core stream. A flush (h > 0) folds the committed records into
    // the tile as the standard flush does (fold_records_mma), and stores it: gamma S + U, U = sum_{p<h}
    // c_p k_p^T with c_p = prod_{l=p+1}^{h-1} a_l (v_p or u_p) per row (Mamba-2: v; GDN: cached u).
    static_assert(DK == 128 && TD <= 8, "the streamed verification serves dk = 128, at most 8 drafts");
    constexpr bool gdn = K == ssm::Recurrence::gdn;  // Mamba-2: the queries only (A's rows 8-15 zero)
    constexpr int kChunks = DK / 32;
    const int g = lane / 4, t = lane % 4;
    const bool folding = flush && h > 0;
    const float* const block_rows = reinterpret_cast<const float*>(ck.payload);
    float* const buf = s_tiles + static_cast<std::size_t>(warp) * kVerifyTileRows * TS;
    constexpr int kTileStep = kWarps * kVerifyTileRows;
    for (int R0 = kVerifyTileRows * warp; R0 < rows_total; R0 += kTileStep) {  // warp-uniform: mma needs all 32 lanes
      copy_async_wait_all();
      __syncwarp();
      float x[kChunks][8];  // row g, columns 32c + 8t .. + 7 (B fragments)
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const float4 lo = *reinterpret_cast<const float4*>(buf + g * TS + 32 * c + 8 * t);
        const float4 hi = *reinterpret_cast<const float4*>(buf + g * TS + 32 * c + 8 * t + 4);
        x[c][0] = lo.x, x[c][1] = lo.y, x[c][2] = lo.z, x[c][3] = lo.w, x[c][4] = hi.x, x[c][5] = hi.y, x[c][6] = hi.z, x[c][7] = hi.w;
      }
      float acc[kMmaTiles][4];  // the fold's accumulators: rows 2t, 2t + 1 in the mma layout (mma_tf32.cuh)
      if (folding)
#pragma unroll
        for (int c = 0; c < kMmaTiles / 2; ++c) {
          const float4 r0 = *reinterpret_cast<const float4*>(buf + (2 * t) * TS + 4 * g + 32 * c);
          const float4 r1 = *reinterpret_cast<const float4*>(buf + (2 * t + 1) * TS + 4 * g + 32 * c);
          acc[2 * c][0] = r0.x, acc[2 * c][1] = r1.x, acc[2 * c][2] = r0.y, acc[2 * c][3] = r1.y;
          acc[2 * c + 1][0] = r0.z, acc[2 * c + 1][1] = r1.z, acc[2 * c + 1][2] = r0.w, acc[2 * c + 1][3] = r1.w;
        }
      __syncwarp();  // every lane has read the buffer: the next tile may overwrite it
      if (R0 + kTileStep < rows_total) prefetch_verify_tile<DK, TS>(block_rows, R0 + kTileStep, rows_total, buf);
      // Two accumulators (the hi and the lo terms) halve the chain of dependent products.
      float d[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        // Draft g's q and k at the lane's columns, as bf16 pairs (column 32c + 8t + 2i in the low half); read
        // here, not kept in registers across the tiles (32 registers: the instance spilled).
        const uint4 q8 = *reinterpret_cast<const uint4*>(s_drafts + g * DS + 32 * c + 8 * t);
        const uint4 k8 = gdn ? *reinterpret_cast<const uint4*>(s_drafts + (8 + g) * DS + 32 * c + 8 * t) : make_uint4(0, 0, 0, 0);
        const uint32_t qp[4] = {q8.x, q8.y, q8.z, q8.w}, kp[4] = {k8.x, k8.y, k8.z, k8.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const uint32_t a[4] = {qp[i] << 16, kp[i] << 16, qp[i] & 0xFFFF0000u, kp[i] & 0xFFFF0000u};  // bf16 -> fp32 bits
          const uint32_t b0 = to_tf32(x[c][2 * i]), b1 = to_tf32(x[c][2 * i + 1]);
          mma_tf32(d[0], a, b0, b1);
          mma_tf32(d[1], a, to_tf32(x[c][2 * i] - __uint_as_float(b0)), to_tf32(x[c][2 * i + 1] - __uint_as_float(b1)));
        }
      }
      // D: lane holds draft g's q (d[0], d[1]) and k (d[2], d[3]) products with rows R0 + 2t and + 1.
#pragma unroll
      for (int odd = 0; odd < 2; ++odd) {
        const int row = R0 + 2 * t + odd;
        if (g < TD && row < rows_total) {
          s_rows[g * rows_total + row] = d[0][odd] + d[1][odd];
          if (gdn) s_rows[(TD + g) * rows_total + row] = d[0][2 + odd] + d[1][2 + odd];
        }
      }
      if (folding) {
        float gamma[2];  // rows 2t and 2t + 1 (a row past the block takes head 0's: it is zero and not stored)
#pragma unroll
        for (int odd = 0; odd < 2; ++odd) {
          const int row = R0 + 2 * t + odd;
          gamma[odd] = s_fg[row < rows_total ? row / dv : 0];
        }
#pragma unroll
        for (int m = 0; m < kMmaTiles; ++m)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[m][e] *= gamma[e % 2];
        // The coefficients of row R0 + g (fold_records_mma asks for no other row, and none past rows_total).
        const int my_row = R0 + g, my_n = my_row < rows_total ? my_row / dv : 0;
        const float* const my_fw = s_fw + my_n * HM;
        const float* const my_u = s_vals + static_cast<std::size_t>(my_n) * NP * dv + (my_row - my_n * dv);
        fold_records_mma<KS>(acc, s_keys, [&](int p, int) { return my_fw[p] * my_u[static_cast<std::size_t>(p) * dv]; },
                             rows_total, R0, h);
#pragma unroll
        for (int odd = 0; odd < 2; ++odd) {
          const int row = R0 + 2 * t + odd;
          if (row >= rows_total) continue;
#pragma unroll
          for (int c = 0; c < kMmaTiles / 2; ++c) {
            const float4 s4 = fold_piece(acc, c, odd);
            const float piece[4] = {s4.x, s4.y, s4.z, s4.w};
            store_piece<StorageFormat::fp32, DK>(ck, row, 4 * g + 32 * c, piece, formats::RoundingMode::nearest_even, 0, 0);
          }
        }
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
            const float4 k4 = *reinterpret_cast<const float4*>(s_keys + j * KS + T::col(lane, p));
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
  // One thread per (head, row): the drafts' outputs (and GDN's corrections), decode_verify_epilogue.cuh.
  for (int idx = threadIdx.x; idx < rows_total; idx += kThreads) {
    const int nn = idx / dv, r = idx % dv;
    verify_row_epilogue<TD, K == ssm::Recurrence::gdn, TD % 4 == 0>(
        idx, nn, r, dv, h, NP, rows_total, s_vals, s_cq, s_ck, s_d, s_rows,
        [&](int s, float sk) { return s_beta[nn * TD + s] * (__bfloat162float(A.in.v[in_head(s, nn) * dv + r]) - sk); },
        [&](int s, float u) { A.rec.u[(ring_slot(A.rec, bg.b, win, h + s) * bg.H + bg.head0 + nn) * dv + r] = u; },
        [&](int s, float o) { A.in.out[in_head(s, nn) * dv + r] = o; });
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
  with_kind(kind, [&](auto K) {
    with_dk(shape.dk, [&](auto DK) {
      with_drafts(drafts, [&](auto TD) {
        auto kernel = verify_kernel<K(), DK(), TD()>;
        const std::size_t smem = sizeof(float) * verify_shared_floats(max_committed, drafts, shape.dk, shape.dv, NH,
                                                                      verify_on_tensor_cores<K(), DK(), TD()>());
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
