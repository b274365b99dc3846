// ReplaySSM standard decode, the non-flush step: the output from the read checkpoint and the window's
// records without materialising the state (OUTPUTONLY with T = 1; REPLAYSSM.md sections 2-3).
#include "ssm/decode_replay.cuh"
#include "ssm/mma_read.cuh"

namespace replayssm::cuda {

using formats::StorageFormat;
using namespace detail;
using namespace decode_detail;

namespace {

// Which instances take their shape constants from the host (NonflushConstants) rather than deriving them in every
// warp: the NVFP4 reads, the most instruction-bound (sessions 36-37, H100: 0.90-0.99x their time with the constants
// from the host; given to every instance, the FP32 and FP8 reads lost up to 12%).
constexpr bool uses_host_constants(StorageFormat read) { return read == StorageFormat::nvfp4; }

// Loads (not yet decoded) of row iterations [it0, it0 + kBatch) of the non-flush checkpoint stream.
// A plain function, not a lambda: a closure holding these arrays put them in local memory.
// `skipped` (sh.skip, or nullptr when nothing skips): rows of heads whose read is skipped (appendix F)
// are not loaded.
template <StorageFormat R, int DK, int kBatch, int P>
__device__ __forceinline__ void load_checkpoint_batch(const HeadView rv, const float* tensor_scales, std::size_t hb0,
                                                      const SmallDiv& head_of_row, int rows_total, int iterations, int it0,
                                                      RawPiece (&raw)[kBatch][P], float (&tscale)[kBatch],
                                                      const float* skipped) {
  using T = Tile<R, DK>;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int j = 0; j < kBatch; ++j) {
    const int row = ((it0 + j) * kWarps + warp) * T::RW + T::row_in_iteration(lane);
    // head_of_row(row) = row / dv without the runtime integer division (Nsight Compute: the division
    // here was 7% of the NVFP4 read's instructions).
    const bool valid = it0 + j < iterations && row < rows_total && !(skipped && skipped[head_of_row(row)] != 0.0f);
    tscale[j] = 1.0f;
    if (valid && R == StorageFormat::nvfp4) tscale[j] = tensor_scales[hb0 + head_of_row(row)];
#pragma unroll
    for (int p = 0; p < P; ++p) raw[j][p] = valid ? load_raw_piece<R, DK>(rv, row, T::col(lane, p)) : RawPiece{};
  }
}

// Where a lane's loads of the tensor-core read (mma_read.cuh) start: its 16-byte piece of row g of the
// warp's first 16-row tile (columns t * E .. + E) and that piece's two scale codes. The NH heads' rows
// are one tall matrix, so the warp's local tile j lies j * kWarps * 16 rows further and row g + 8 a
// constant 8 rows further: one multiply per unit, where indexing each piece from (row, column) in 64 bits
// took about 45 of the unit's 270 instructions (SASS of the Mamba-2 instance, 2026-12-05).
struct MmaReadCursor {
  const uint8_t* payload;
  const uint8_t* scale_codes;
};

template <int DK>
__device__ __forceinline__ MmaReadCursor mma_read_cursor(const HeadView& rv) {
  constexpr int E = FormatTraits<StorageFormat::nvfp4>::kElementsPerPiece;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int i = (warp * 16 + lane / 4) * DK + (lane % 4) * E;  // the piece's first element
  return {rv.payload + i / 2, rv.scale_codes + i / formats::kNvfp4BlockSize};
}

// Loads of local tile `local_tile` of this warp (one unit: at dk = 128 a tile is one 4E-column slab): the
// lane's pieces of rows g and g + 8; zeros for tiles past the block's rows and for heads whose read is
// skipped (appendix F). Tiles never straddle heads (dv % 16 == 0). The tile's tensor scale is staged
// (nvfp4_tile_scales).
template <int DK>
__device__ __forceinline__ MmaReadUnit load_mma_unit(const MmaReadCursor& c, const SmallDiv& head_of_row, int tiles,
                                                     int local_tile, const float* skipped) {
  constexpr int kRowBytes = DK / 2, kRowCodes = DK / formats::kNvfp4BlockSize;
  const int tile = local_tile * kWarps + threadIdx.x / 32;
  MmaReadUnit u{};
  bool valid = tile < tiles;
  if (valid && skipped) valid = skipped[head_of_row(tile * 16)] == 0.0f;
  if (valid) {
    const int rows = local_tile * kWarps * 16;
    const uint8_t* p = c.payload + rows * kRowBytes;
    const uint8_t* s = c.scale_codes + rows * kRowCodes;
    u.row_g.bits = *reinterpret_cast<const uint4*>(p);
    u.row_g8.bits = *reinterpret_cast<const uint4*>(p + 8 * kRowBytes);
    u.row_g.aux = *reinterpret_cast<const uint16_t*>(s);
    u.row_g8.aux = *reinterpret_cast<const uint16_t*>(s + 8 * kRowCodes);
  }
  return u;
}

// Record phase of the non-flush step: decay weights and key products (c1_p = k_p . q_t; GDN c2_p =
// k_p . k_t); the record vectors are already in flight (stage_window_records). Ends without a barrier:
// the checkpoint stream that follows does not read them.
template <ssm::Recurrence K, int DK, bool kHostConstants>
__device__ __forceinline__ void nonflush_record_phase(const ReplayArgs& A, const BlockGeometry& bg, const WindowState& win,
                                                      const ReplayShared& sh, int h0, int staged, const __nv_bfloat16* q_t,
                                                      const __nv_bfloat16* k_t, const NonflushConstants& C) {
  const int lane = threadIdx.x % 32;
  stage_window_records<K, kHostConstants>(A, bg, win, sh.vals, h0, staged, C.inv_record_pieces);
  stage_decay_weights(A, bg, win, sh, h0, staged, false);
  using KT = Tile<StorageFormat::fp32, DK>;
  float qf[KT::P][4], kf[KT::P][4];
  load_lane_vector<4, KT::P, KT::LPR>(q_t, lane, qf);
  load_lane_vector<4, KT::P, KT::LPR>(k_t, lane, kf);
  key_products<DK, 1, K == ssm::Recurrence::gdn ? 2 : 1>(
      staged,
      [&](int p) { return p == h0 ? k_t : A.rec.k + (ring_slot(A.rec, bg.b, win, p) * bg.G + bg.g) * DK; }, &qf, &kf,
      [&](int p, int i, float sum) { (i == 0 ? sh.c1 : sh.c2)[p] = sum; });
}

// The fold of kR adjacent rows idx .. idx + kR - 1 of head n (kR = 2 needs dv even, so both rows are the
// head's) from the staged records: Mamba-2 o = gamma (S q) + sum_p w_p c1_p v_p; GDN the corrections
// and u_t (replay_nonflush_block's comment). Each row's sums in the order of the CPU decoders' fold.
template <ssm::Recurrence K, int kR>
__device__ __forceinline__ void fold_rows(const ReplayArgs& A, const BlockGeometry& bg, const WindowState& win,
                                          const ReplayShared& sh, int idx, int n, int h0, int staged, bool skip, float kq_t) {
  const int L = sh.stride, dv = bg.dv, run = bg.NH * dv, r = idx - n * dv;
  const std::size_t hb = static_cast<std::size_t>(bg.b) * bg.H + bg.head0 + n;
  const float* const c1n = sh.w + n * L;  // w_p c1_p (the coefficient pass)
  const float gamma = sh.gamma[n];
  float rec[kR];
  const auto load_records = [&](int p) {
    if constexpr (K == ssm::Recurrence::mamba2) {
      const __nv_bfloat16* v = reinterpret_cast<const __nv_bfloat16*>(sh.vals) + static_cast<std::size_t>(p) * run + idx;
      if constexpr (kR == 2) {
        const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(v));
        rec[0] = f.x, rec[1] = f.y;
      } else {
        rec[0] = __bfloat162float(v[0]);
      }
    } else {
      const float* u = sh.vals + static_cast<std::size_t>(p) * run + idx;
      if constexpr (kR == 2) {
        const float2 f = *reinterpret_cast<const float2*>(u);
        rec[0] = f.x, rec[1] = f.y;
      } else {
        rec[0] = u[0];
      }
    }
  };
  if constexpr (K == ssm::Recurrence::mamba2) {
    float o[kR];
#pragma unroll
    for (int j = 0; j < kR; ++j) o[j] = skip ? 0.0f : gamma * sh.rows1[idx + j];  // skipped: REPLAY(0, B[1:h+1]) q
    for (int p = 0; p < staged; ++p) {
      load_records(p);
      const float c = c1n[p];
#pragma unroll
      for (int j = 0; j < kR; ++j) o[j] = fmaf(c, rec[j], o[j]);
    }
#pragma unroll
    for (int j = 0; j < kR; ++j) A.in.out[hb * dv + r + j] = o[j];
  } else if (!skip) {  // a skipped GDN head recomputes every u from zero: the flush kernel serves it
    const float* const c2n = sh.a + n * L;  // w_p c2_p
    float sq[kR], sk[kR];
#pragma unroll
    for (int j = 0; j < kR; ++j) sq[j] = gamma * sh.rows1[idx + j], sk[j] = gamma * sh.rows2[idx + j];
    for (int p = 0; p < staged; ++p) {
      load_records(p);
      const float c1 = c1n[p], c2 = c2n[p];
#pragma unroll
      for (int j = 0; j < kR; ++j) {
        sq[j] = fmaf(c1, rec[j], sq[j]);
        sk[j] = fmaf(c2, rec[j], sk[j]);
      }
    }
    const float a_t = A.in.alpha[hb], beta_t = A.in.beta[hb];
    float* const u_out = A.rec.u + (ring_slot(A.rec, bg.b, win, h0) * bg.H + bg.head0 + n) * dv + r;
#pragma unroll
    for (int j = 0; j < kR; ++j) {
      const float u = beta_t * (__bfloat162float(A.in.v[hb * dv + r + j]) - a_t * sk[j]);
      A.in.out[hb * dv + r + j] = fmaf(a_t, sq[j], u * kq_t);
      u_out[j] = u;
    }
  }
}

// Non-flush step of NH heads: output-only from the read checkpoint (LP when split, else the recur copy).
//   Mamba-2: o = gamma (S q) + sum_{p<=h0} w_p (k_p . q) v_p
//   GDN:     S_{t-1}k, S_{t-1}q from (S k, S q) and the cached u; u_t = b (v - a S_{t-1}k);
//            o = a S_{t-1}q + u_t (k . q)
// The checkpoint stream does not depend on the records, so its first batch of loads is issued
// before the record phase and every later batch before the previous one is consumed: the DRAM
// latency overlaps the record phase and the dot products (what a 2-7x smaller LP read needs).
// kMma: the rows on the tensor cores (mma_read.cuh; NVFP4 reads at dk = 128 with dv % 16 == 0),
// else on the CUDA cores in the Tile geometry of state_tiles.cuh.
template <ssm::Recurrence K, StorageFormat R, int DK, bool kSkip, bool kMma>
__device__ void replay_nonflush_block(const ReplayArgs& A, const BlockGeometry& bg, const WindowState& win,
                                      const ReplayShared& sh, const NonflushConstants& C) {
  constexpr bool kHostConstants = uses_host_constants(R);
  using T = Tile<R, DK>;
  constexpr int E = T::E, P = T::P, LPR = T::LPR, RW = T::RW;
  constexpr int NV = K == ssm::Recurrence::gdn ? 2 : 1;
  constexpr int kBatch = R == StorageFormat::nvfp4 ? 2 : 4;  // row iterations per batch of loads
  const int L = A.window, h0 = win.h;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int NH = bg.NH, dv = bg.dv;
  const __nv_bfloat16* k_t = A.in.k + (static_cast<std::size_t>(bg.b) * bg.G + bg.g) * DK;
  const __nv_bfloat16* q_t = A.in.q + (static_cast<std::size_t>(bg.b) * bg.G + bg.g) * DK;
  const int staged = K == ssm::Recurrence::mamba2 ? h0 + 1 : h0;
  // By value: a reference chosen at run time between two kernel-parameter members would have to
  // live in local memory (measured: local loads in the stream loop).
  const DeviceState read_state = A.split ? A.read : A.recur;
  const std::size_t hb0 = static_cast<std::size_t>(bg.b) * bg.H + bg.head0;
  const HeadView rv = head_view(read_state, hb0, dv, DK);  // NH adjacent heads: one tall matrix
  const float* const tensor_scales = read_state.tensor_scales;
  const int rows_total = NH * dv;
  const SmallDiv head_of_row = kHostConstants ? SmallDiv(SmallDiv::Reciprocal{C.inv_dv}) : SmallDiv(dv);
  // Appendix F: the skip decisions come before the first load, so no skipped row is read.
  const bool skip_on = kSkip && A.skip_read > 0.0f;
  if (skip_on) stage_skip_flags(A, bg, win, sh, h0, A.skip_read);
  const float* const skipped = skip_on ? sh.skip : nullptr;

  if constexpr (kMma && R == StorageFormat::fp8b128) {
    // GDN's FP8-b128 read: A the E4M3 codes as f16 (exact), B the shared columns (q hi, lo; k hi, lo), one
    // 16-row tile per unit, kUnits tiles in flight beyond the current one; the block scale multiplies each
    // row sum.
    static_assert(K == ssm::Recurrence::gdn, "the FP8 tensor-core read is GDN's (mma_read_applies)");
    constexpr int kUnits = 1;
    const int tiles = rows_total / 16;
    const int my_tiles = warp < tiles ? (tiles - warp + kWarps - 1) / kWarps : 0;
    const Fp8MmaCursor cursor = fp8_mma_cursor<DK>(rv);
    Fp8MmaUnit buf[kUnits];
#pragma unroll
    for (int j = 0; j < kUnits; ++j) buf[j] = load_fp8_mma_unit<DK>(cursor, head_of_row, tiles, j, skipped);
    // The rows' block scales (contiguous: one per row) into shared memory as their own cp.async group, so
    // that they need no registers while the tiles stream; skipped heads' scales are not read.
    float* const row_scales = fp8_row_scales(sh);
    if (reinterpret_cast<std::uintptr_t>(rv.block_scales) % 16 == 0) {
      for (int i = threadIdx.x; i < rows_total / 4; i += kThreads)
        copy_async16(row_scales + 4 * i, rv.block_scales + 4 * i, !(skipped && skipped[head_of_row(4 * i)] != 0.0f));
    } else {
      for (int i = threadIdx.x; i < rows_total; i += kThreads)
        row_scales[i] = skipped && skipped[head_of_row(i)] != 0.0f ? 0.0f : rv.block_scales[i];
    }
    // Groups: the scales, an empty one, then the records' when stage_window_records copies by cp.async
    // (else it has copied them already). Waiting until at most one group is pending is then waiting for
    // the scales alone either way: the records may stay in flight through the stream.
    copy_async_commit();
    copy_async_commit();
    const int sq = mma_vector_exponent<DK>(q_t), sk = mma_vector_exponent<DK>(k_t);
    build_mma_b_table<DK, false, R>(q_t, k_t, sq, sk, sh.mma_b);
    nonflush_record_phase<K, DK, kHostConstants>(A, bg, win, sh, h0, staged, q_t, k_t, C);
    asm volatile("cp.async.wait_group 1;" ::: "memory");
    __syncthreads();
    uint32_t b[DK / 8];
    const float unscale = load_mma_b<DK, false>(sh.mma_b, sq, sk, b);
    const int g = lane / 4, t = lane % 4;
    for (int lt0 = 0; lt0 < my_tiles; lt0 += kUnits) {
#pragma unroll
      for (int j = 0; j < kUnits; ++j) {
        const Fp8MmaUnit cur = buf[j];
        buf[j] = load_fp8_mma_unit<DK>(cursor, head_of_row, tiles, lt0 + j + kUnits, skipped);
        float d[4] = {};
#pragma unroll
        for (int s = 0; s < 2; ++s) {
          uint32_t ag[8], ag8[8];
          fp8_piece_pairs(cur.row_g[s], ag);
          fp8_piece_pairs(cur.row_g8[s], ag8);
#pragma unroll
          for (int m = 0; m < 4; ++m)
            mma_f16_16816(d, ag[2 * m], ag8[2 * m], ag[2 * m + 1], ag8[2 * m + 1], b[8 * s + 2 * m], b[8 * s + 2 * m + 1]);
        }
        const int tile = (lt0 + j) * kWarps + warp;
        if (tile < tiles && t < 2) {
          float* out = t == 0 ? sh.rows1 : sh.rows2;
          const int row = tile * 16 + g;
          out[row] = (d[0] + d[1]) * unscale * row_scales[row];
          out[row + 8] = (d[2] + d[3]) * unscale * row_scales[row + 8];
        }
      }
    }
  } else if constexpr (kMma) {
    static_assert(mma_read_applies<K, R, DK>(), "the tensor-core read serves NVFP4 at dk = 128");
    {
      // Units (tile, slab): S slabs per 16-row tile (1 for NVFP4 at dk = 128), kUnits in flight; a loop
      // iteration covers G tiles so that every slab and buffer index is a compile-time constant.
      // Mamba-2's skipping instance: one tile in flight beyond the current one, so that 4 blocks per SM fit 64
      // registers (nonflush_min_blocks).
      constexpr int S = DK / (4 * E), kUnits = K == ssm::Recurrence::mamba2 && kSkip ? 1 : 2, G = S >= kUnits ? 1 : kUnits / S,
                    UI = G * S;
      static_assert(S == 1, "load_mma_unit loads whole 16-row tiles (one slab at dk = 128)");
      const int tiles = rows_total / 16;
      const int my_tiles = warp < tiles ? (tiles - warp + kWarps - 1) / kWarps : 0;
      const MmaReadCursor cursor = mma_read_cursor<DK>(rv);
      MmaReadUnit buf[kUnits];
#pragma unroll
      for (int j = 0; j < kUnits; ++j) buf[j] = load_mma_unit<DK>(cursor, head_of_row, tiles, j, skipped);
      // The tiles' tensor scales (1 for skipped heads): loaded now, stored to shared memory after the record phase,
      // whose barrier publishes them. Stored at once, the load's latency held the warp before its record phase
      // (H8, session 34: Qwen3.5-4B's read 1.03-1.045x main's time); the volatile load stays where it is written.
      float* const tile_scales = nvfp4_tile_scales(sh);
      const auto tile_scale = [&](int i) {
        const int head = head_of_row(16 * i);
        return skipped && skipped[head] != 0.0f ? 1.0f : load_global_f32(tensor_scales + hb0 + head);
      };
      const float my_tile_scale = static_cast<int>(threadIdx.x) < tiles ? tile_scale(threadIdx.x) : 1.0f;
      // B (q, k as 16-bit operands) once per block into shared memory; read after the record phase's barrier.
      // Mamba-2 (q only) takes the lane-column layout of mma_read.cuh, GDN the shared columns.
      constexpr bool kLaneColumns = NV == 1;
      const int sq = mma_vector_exponent<DK>(q_t), sk = NV == 2 ? mma_vector_exponent<DK>(k_t) : 0;
      build_mma_b_table<DK, kLaneColumns>(q_t, NV == 2 ? k_t : nullptr, sq, sk, sh.mma_b);
      nonflush_record_phase<K, DK, kHostConstants>(A, bg, win, sh, h0, staged, q_t, k_t, C);
      if (static_cast<int>(threadIdx.x) < tiles) tile_scales[threadIdx.x] = my_tile_scale;
      for (int i = threadIdx.x + kThreads; i < tiles; i += kThreads) tile_scales[i] = tile_scale(i);
      __syncthreads();
      uint32_t b[DK / 8];
      const float unscale = load_mma_b<DK, kLaneColumns>(sh.mma_b, sq, sk, b);
      // Lane columns: the 2^6 that undoes the bare codes' 2^-6 (nvfp4_block_scales), once for the block.
      const float tile_unscale = kLaneColumns ? unscale * 64.0f : unscale;
      const int g = lane / 4, t = lane % 4;
      // Shared addresses of the lane's row g of the warp's first tile (S q, or S k for GDN's lane t = 1) and of
      // that tile's scale; local tile k lies kWarps tiles further. Kept as 32-bit shared addresses: from the
      // generic pointers ptxas rebuilt them every tile under the register bound (about 30 instructions a unit).
      const uint32_t row_at = shared_address((NV == 2 && t == 1 ? sh.rows2 : sh.rows1) + warp * 16 + g);
      const uint32_t scale_at = shared_address(tile_scales + warp);
      for (int lt0 = 0; lt0 < my_tiles; lt0 += G) {
        float d[G][4];
#pragma unroll
        for (int j = 0; j < UI; ++j) {
          const MmaReadUnit cur = buf[j % kUnits];
          buf[j % kUnits] = load_mma_unit<DK>(cursor, head_of_row, tiles, lt0 + j + kUnits, skipped);
          if constexpr (kLaneColumns) {
            // Block sums of the lane's own pieces (d[blk]: rows g in 0, 1; g + 8 in 2, 3), each times its
            // block scale; the 4 lanes of a row group then add up (S == 1: a unit is a whole tile).
            float db[2][4] = {};
            uint32_t ag[E / 2], ag8[E / 2];
            nvfp4_piece_codes(cur.row_g, ag);
            nvfp4_piece_codes(cur.row_g8, ag8);
#pragma unroll
            for (int m = 0; m < E / 4; ++m)
              mma_f16_16816(db[m / (E / 8)], ag[2 * m], ag8[2 * m], ag[2 * m + 1], ag8[2 * m + 1], b[2 * m], b[2 * m + 1]);
            const float2 sg = nvfp4_block_scales(cur.row_g.aux), sg8 = nvfp4_block_scales(cur.row_g8.aux);
            float yg = fmaf(db[1][0] + db[1][1], sg.y, (db[0][0] + db[0][1]) * sg.x);
            float yg8 = fmaf(db[1][2] + db[1][3], sg8.y, (db[0][2] + db[0][3]) * sg8.x);
#pragma unroll
            for (int off = 1; off < 4; off *= 2) {
              yg += __shfl_xor_sync(kFullMask, yg, off);
              yg8 += __shfl_xor_sync(kFullMask, yg8, off);
            }
            const int tile = (lt0 + j) * kWarps + warp;
            if (tile < tiles && t == 0) {
              const uint32_t k = lt0 + j;
              const float f = tile_unscale * load_shared_f32(scale_at + 4 * kWarps * k);
              store_shared_f32(row_at + 64 * kWarps * k, yg * f);
              store_shared_f32(row_at + 64 * kWarps * k + 32, yg8 * f);
            }
            continue;
          }
          const int s = j % S, gi = j / S;
          if (s == 0) d[gi][0] = d[gi][1] = d[gi][2] = d[gi][3] = 0.0f;
          uint32_t ag[E / 2], ag8[E / 2];
          nvfp4_piece_pairs(cur.row_g, ag);
          nvfp4_piece_pairs(cur.row_g8, ag8);
#pragma unroll
          for (int m = 0; m < E / 4; ++m)
            mma_f16_16816(d[gi], ag[2 * m], ag8[2 * m], ag[2 * m + 1], ag8[2 * m + 1], b[s * (E / 2) + 2 * m],
                          b[s * (E / 2) + 2 * m + 1]);
          if (s == S - 1) {
            const int tile = (lt0 + gi) * kWarps + warp;
            if (tile < tiles && t < NV) {
              const uint32_t k = lt0 + gi;
              const float f = tile_unscale * load_shared_f32(scale_at + 4 * kWarps * k);
              store_shared_f32(row_at + 64 * kWarps * k, (d[gi][0] + d[gi][1]) * f);
              store_shared_f32(row_at + 64 * kWarps * k + 32, (d[gi][2] + d[gi][3]) * f);
            }
          }
        }
      }
    }
  }
  if constexpr (!kMma) {
    const int iterations = (rows_total + kWarps * RW - 1) / (kWarps * RW);
    auto row_of = [&](int it) { return (it * kWarps + warp) * RW + T::row_in_iteration(lane); };
    RawPiece raw[kBatch][P];
    float tscale[kBatch];
    load_checkpoint_batch<R, DK>(rv, tensor_scales, hb0, head_of_row, rows_total, iterations, 0, raw, tscale, skipped);
    nonflush_record_phase<K, DK, kHostConstants>(A, bg, win, sh, h0, staged, q_t, k_t, C);
    // Stream the NH heads' read checkpoints: rows1 = S q (rows2 = S k).
    float vecs[P][NV][E];  // lane slices of q (and k), piece-major as dot_raw_piece takes them
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int col = T::col(lane, p);
#pragma unroll
      for (int e = 0; e < E; e += 4) {
        load_bf16x4(q_t + col + e, &vecs[p][0][e]);
        if constexpr (K == ssm::Recurrence::gdn) load_bf16x4(k_t + col + e, &vecs[p][NV - 1][e]);
      }
    }
    for (int it0 = 0; it0 < iterations; it0 += kBatch) {
      RawPiece cur[kBatch][P];
      float cur_scale[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        cur_scale[j] = tscale[j];
#pragma unroll
        for (int p = 0; p < P; ++p) cur[j][p] = raw[j][p];
      }
      if (it0 + kBatch < iterations)
        load_checkpoint_batch<R, DK>(rv, tensor_scales, hb0, head_of_row, rows_total, iterations, it0 + kBatch, raw, tscale, skipped);
      constexpr int N = kBatch * NV;  // partial sums per lane, [j][v]
      float acc[N];
#pragma unroll
      for (int i = 0; i < N; ++i) acc[i] = 0.0f;
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
#pragma unroll
        for (int p = 0; p < P; ++p) dot_raw_piece<R, NV>(cur[j][p], cur_scale[j], vecs[p], &acc[j * NV]);
      if constexpr (N <= LPR) {
        const float sum = row_sum_scatter<LPR, N>(acc);
        const int i = scatter_index<LPR, N>(lane), j = i / NV, v = i % NV;
        const int row = row_of(it0 + j);
        if (lane % (LPR / N) == 0 && it0 + j < iterations && row < rows_total) (v == 0 ? sh.rows1 : sh.rows2)[row] = sum;
      } else {
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          const int row = row_of(it0 + j);
#pragma unroll
          for (int v = 0; v < NV; ++v) {
            const float sum = row_sum<LPR>(acc[j * NV + v]);
            if (lane % LPR == 0 && it0 + j < iterations && row < rows_total) (v == 0 ? sh.rows1 : sh.rows2)[row] = sum;
          }
        }
      }
    }
  }
  float kq_t = 0.0f;
  if (K == ssm::Recurrence::gdn) kq_t = warp_dot_bf16<DK>(k_t, q_t, lane);
  copy_async_wait_all();  // this thread's record pieces (stage_window_records); the barrier publishes everyone's
  __syncthreads();
  // The fold's coefficients once per (head, position), not once per row: w_p c1_p in place of w_p and,
  // for GDN, w_p c2_p in place of the decays (not read again). The same products, bit for bit.
  for (int i = threadIdx.x; i < NH * staged; i += kThreads) {
    const int n = i / staged, p = i - n * staged;
    const float w = sh.w[n * L + p];
    sh.w[n * L + p] = w * sh.c1[p];
    if (K == ssm::Recurrence::gdn) sh.a[n * L + p] = w * sh.c2[p];
  }
  __syncthreads();
  // The fold: two rows per thread where dv is even (one 4-byte bf16 pair or 8-byte u pair per position),
  // except in the FP32-read and appendix-F instances, where ptxas spilled with two (sm_90: 16-92 B).
  constexpr bool kPairs = R != StorageFormat::fp32 && !kSkip;
  if (kPairs && dv % 2 == 0) {
    for (int idx = 2 * threadIdx.x; idx < rows_total; idx += 2 * kThreads) {
      const int n = head_of_row(idx);
      fold_rows<K, 2>(A, bg, win, sh, idx, n, h0, staged, skip_on && sh.skip[n] != 0.0f, kq_t);
    }
  } else {
    for (int idx = threadIdx.x; idx < rows_total; idx += kThreads) {
      const int n = head_of_row(idx);
      fold_rows<K, 1>(A, bg, win, sh, idx, n, h0, staged, skip_on && sh.skip[n] != 0.0f, kq_t);
    }
  }
}

// A replay step is two launches over the same grid, so each path gets its own register budget
// (the flush path needs far more registers, and sharing a kernel would cap the occupancy of the
// non-flush path that most steps take): blocks whose sequence does not take that path exit at once.
// Both read the current window state; the flush kernel (launched first, this one as its
// programmatic dependent) writes the next one.
// Blocks per SM the register budget is sized for. NVFP4 pieces hold 32 columns, so a lane's slice of
// q (and k) alone takes 32 (64) registers. Not spill-free everywhere (ptxas -v, sm_90, 2026-12-04, with
// the chunked record staging): the plain Mamba-2 instances spill at fp8b128/dk 128 (24 B) and fp32/dk 256
// (24 B), GDN at nvfp4 (4 B), and several kSkip instances 4-104 B. Nsight Compute shows the low-precision reads issue-bound, not
// spill-bound (experiments/bench/decode_2026-12-04/README.md), so the bounds were left as they are.
template <ssm::Recurrence K, StorageFormat R, int DK, bool kMma, bool kSkip>
constexpr int nonflush_min_blocks() {
  // The tensor-core read (NVFP4): 16 B-fragment registers, 2 tiles of loads and accumulators per lane;
  // ptxas -v, sm_90: no spills at 3 blocks per SM (120 B at 4, Mamba-2).
  // GDN's FP8 tensor-core read: 64 registers without spills at 4 blocks per SM (ptxas -v, sm_90, 2026-12-06;
  // its skipping instance spills 24 B); at 3 blocks per SM it was slower than the CUDA-core read.
  if (kMma && R == StorageFormat::fp8b128) return 4;
  // Mamba-2's NVFP4 tensor-core read with appendix F skipping: 4 blocks per SM with one tile in flight. Measured
  // for both instances (H5, H100, session 31): the skipping reads took 0.89-0.98x the time at B = 64-256; the plain
  // read 1.00-1.06x at B = 128-256, so it keeps 3 blocks and two tiles in flight. This instance alone (H6, H100,
  // session 32): its 12 skipping NVFP4 reads 0.885-0.975x (geometric mean 0.936), no other row above 1.024x.
  if (kMma && K == ssm::Recurrence::mamba2 && kSkip) return 4;
  if (kMma) return 3;
  if (DK == 256 || R == StorageFormat::nvfp4) return K == ssm::Recurrence::gdn ? 2 : 3;
  return K == ssm::Recurrence::gdn && R == StorageFormat::fp8b128 ? 3 : 4;
}
// kSkip: appendix F skipping in use (its own instantiation, so the plain kernel keeps its registers).
// C: the launch's constants (NonflushConstants), used by the NVFP4 instances only (uses_host_constants).
template <ssm::Recurrence K, StorageFormat R, int DK, bool kSkip, bool kMma>
__global__ void __launch_bounds__(kThreads, nonflush_min_blocks<K, R, DK, kMma, kSkip>())
    replay_nonflush_kernel(ReplayArgs A, NonflushConstants C) {
  constexpr bool kHostConstants = uses_host_constants(R);
  extern __shared__ float smem[];
  const BlockGeometry bg = kHostConstants
                               ? block_geometry(A.shape, A.heads_per_block, C.heads_per_group, C.inv_heads_per_group)
                               : block_geometry(A.shape, A.heads_per_block);
  const WindowState win = current_window(A.rec, bg.b);
  const bool flush = win.h + 1 >= A.window;  // the flush kernel's sequence
  nonflush_window_duties(A, bg.b, win, flush);
  if (!flush) {
    const ReplayShared sh = kHostConstants ? carve_shared_at(smem, C.layout)
                                           : carve_shared(smem, A.window, DK, bg.dv, bg.NH, false,
                                                          bf16_sized_records(K, R) && A.bf16_records);
    append_record(A, bg, win, DK, K == ssm::Recurrence::gdn);
    replay_nonflush_block<K, R, DK, kSkip, kMma>(A, bg, win, sh, C);
  }
  step_block_done(A.rec, bg.b, step_blocks_of(A, flush));  // this kernel's and the flush kernel's blocks
}

// The kernel's per-launch constants (NonflushConstants): each the value the kernel would compute from the shape, so
// every output is the same bit for bit (1.0f / d on the host is IEEE division, as the device's is).
NonflushConstants nonflush_constants(ssm::Recurrence kind, StorageFormat read, const ReplayArgs& A) {
  const DecodeShape& s = A.shape;
  const int NH = A.heads_per_block, hpg = s.heads_per_group();
  NonflushConstants c;
  c.layout = shared_layout(A.window, s.dk, s.dv, NH, false, bf16_sized_records(kind, read) && A.bf16_records);
  c.heads_per_group = hpg;
  c.inv_heads_per_group = small_div_serves(hpg, s.value_heads) ? 1.0f / static_cast<float>(hpg) : 0.0f;
  c.inv_dv = 1.0f / static_cast<float>(s.dv);
  // stage_window_records' 16-byte pieces: Mamba-2's bf16 v (8 a piece), GDN's fp32 u (4).
  const int run = NH * s.dv, piece = kind == ssm::Recurrence::mamba2 ? 8 : 4;
  c.inv_record_pieces = run % piece == 0 && run / piece <= 1024 ? 1.0f / static_cast<float>(run / piece) : 0.0f;
  return c;
}

}  // namespace

void decode_detail::launch_replay_nonflush(ssm::Recurrence kind, StorageFormat read, const ReplayArgs& A, dim3 grid,
                                           cudaStream_t stream) {
  check_step_blocks(A, grid, false);
  const NonflushConstants C = uses_host_constants(read) ? nonflush_constants(kind, read, A) : NonflushConstants{};
  const std::size_t smem = sizeof(float) * replay_shared_floats(A.window, A.shape.dk, A.shape.dv, A.heads_per_block, false,
                                                                bf16_sized_records(kind, read) && A.bf16_records);
  with_kind(kind, [&](auto K) {
    with_dk(A.shape.dk, [&](auto DK) {
      // The skipping instantiation only when skipping is on (kSkip: see replay_nonflush_kernel).
      using SF = StorageFormat;
      auto launch = [&](auto R) {
        // A programmatic dependent launch of the flush kernel (decode_replay.cu says why), where there is one.
        // The tensor-core read where it applies (16-row tiles must not straddle heads: dv % 16 == 0) on large grids.
        auto with_skip = [&](auto kMma) {
          const std::size_t bytes =
              smem + (!kMma() ? 0
                      : R() == SF::fp8b128 ? sizeof(float) * fp8_row_scale_floats(A.shape.dv, A.heads_per_block)
                                           : sizeof(float) * nvfp4_tile_scale_floats(A.shape.dv, A.heads_per_block));
          if (A.skip_read > 0.0f) launch_replay_kernel(replay_nonflush_kernel<K(), R(), DK(), true, kMma()>, A, grid, bytes, flush_kernel_launched(A), stream, C);
          else launch_replay_kernel(replay_nonflush_kernel<K(), R(), DK(), false, kMma()>, A, grid, bytes, flush_kernel_launched(A), stream, C);
        };
        if constexpr (mma_read_applies<K(), R(), DK()>()) {
          using Path = ReplayConfig::ReadPath;
          const bool large = static_cast<long>(grid.x) * grid.y >= static_cast<long>(kLargeGridBlocksPerSm) * sm_count();
          if (tensor_core_read_serves(DK(), A.shape.dv) &&
              (A.read_path == Path::tensor_cores || (A.read_path == Path::automatic && large)))
            return with_skip(std::true_type{});
        }
        with_skip(std::false_type{});
      };
      switch (read) {
        case SF::fp32: launch(std::integral_constant<SF, SF::fp32>{}); break;
        case SF::fp16: launch(std::integral_constant<SF, SF::fp16>{}); break;
        case SF::bf16: launch(std::integral_constant<SF, SF::bf16>{}); break;
        case SF::fp8b128:
          if constexpr (DK() >= 128) launch(std::integral_constant<SF, SF::fp8b128>{});
          break;
        case SF::nvfp4: launch(std::integral_constant<SF, SF::nvfp4>{}); break;
        default: throw std::invalid_argument("unsupported read checkpoint format");
      }
    });
  });
}

}  // namespace replayssm::cuda
