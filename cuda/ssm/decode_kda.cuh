// What the KDA (Kimi Delta Attention) decode kernels share (decode_kda_conventional.cu,
// decode_kda_replay*.cu, decode_kda_verify.cu). KDA has a channel-wise decay (REPLAYSSM.md section 1):
//   S_t = S_{t-1} Diag(a_t) + u_t k_t^T,   u_t = b_t (v_t - S_{t-1} (a_t . k_t)),   a_t in (0,1)^dk,
// so the decay weights of the unrolled form are dk-vectors per value head, W_p = prod_{l=p+1}^{t} a_l
// (element-wise), and the key products k_p^T Diag(W_p) q differ per value head: nothing of the key
// head is shared by its value heads beyond the raw key. The kernels therefore run one value head per
// block (NH = 1), unlike the Mamba-2/GDN replay kernels.
//
// Layouts as decode_kernels.h documents for GDN, except the decays: alpha [B][H][dk] (T drafts:
// [B][T][H][dk]) and records.alpha [B][cap][H][dk], all fp32.
#pragma once
#include "ssm/decode_replay.cuh"

namespace replayssm::cuda::decode_detail {

// A KDA block: one value head `head` of sequence b (grid: value heads x batch).
struct KdaBlock {
  int H, G, head, g, vh, b, dv;  // vh: the value head's index within its key head g
  std::size_t hb;                 // b * H + head
};
// The block at blockIdx.x of sequence b (blockIdx.y, unless a flush list maps the grid's rows).
__device__ __forceinline__ KdaBlock kda_block(const DecodeShape& s, int b = blockIdx.y) {
  KdaBlock q;
  q.H = s.value_heads, q.G = s.key_heads, q.dv = s.dv;
  q.head = blockIdx.x, q.b = b;
  q.g = q.head / (q.H / q.G), q.vh = q.head % (q.H / q.G);
  q.hb = static_cast<std::size_t>(q.b) * q.H + q.head;
  return q;
}

// The decay vector of (sequence, value head) hb of the current step, and of a ring record.
__device__ __forceinline__ const float* kda_step_alpha(const float* alpha, std::size_t hb, int dk) {
  return alpha + hb * dk;
}
__device__ __forceinline__ float* kda_record_alpha(const DeviceRecords& rec, std::size_t slot, int H, int head, int dk) {
  return rec.alpha + (slot * H + head) * dk;
}

// Lane slice of an fp32 vector in the fp32 tile geometry (pieces of 4 columns).
template <int P, int LPR>
__device__ __forceinline__ void load_lane_f32(const float* base, int lane, float (*out)[4]) {
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const float4 v = *reinterpret_cast<const float4*>(base + ((lane % LPR) + p * LPR) * 4);
    out[p][0] = v.x, out[p][1] = v.y, out[p][2] = v.z, out[p][3] = v.w;
  }
}

// Writes one token's record of value head `head` at ring slot `slot` (the key once per key head:
// the block of the group's first value head writes it). Whole block.
template <int DK>
__device__ __forceinline__ void kda_write_record(const DeviceRecords& rec, std::size_t slot, int H, int G, int head, int g,
                                                 bool first_of_group, int dv, const __nv_bfloat16* k,
                                                 const __nv_bfloat16* v, const float* alpha, float beta) {
  if (first_of_group)
    for (int c = threadIdx.x; c < DK; c += kThreads) rec.k[(slot * G + g) * DK + c] = k[c];
  for (int r = threadIdx.x; r < dv; r += kThreads) rec.v[(slot * H + head) * dv + r] = v[r];
  float* a = kda_record_alpha(rec, slot, H, head, DK);
  for (int c = threadIdx.x; c < DK; c += kThreads) a[c] = alpha[c];
  if (threadIdx.x == 0) rec.beta[slot * H + head] = beta;
}

// Stages the keys (as fp32) and decay vectors of window positions 0..last into shared memory with
// every thread of the block, so that all their loads are in flight together: the per-channel walk
// below, reading them from global memory, waited on one dependent load pair per position. key(p) /
// alpha(p): position p's bf16 key and fp32 decay vector. Whole block; synchronises at the end.
template <int DK, class KeyAt, class AlphaAt>
__device__ __forceinline__ void kda_stage_keys_decays(int last, KeyAt&& key, AlphaAt&& alpha, float* keys, float* alphas) {
  for (int i = threadIdx.x; i < (last + 1) * DK; i += kThreads) {
    const int p = i / DK, c = i % DK;
    keys[i] = __bfloat162float(key(p)[c]);
    alphas[i] = alpha(p)[c];
  }
  __syncthreads();
}

// Channel-wise decay weights of window positions 0..last (REPLAYSSM.md section 2 with per-channel
// cumulative decays) from the staged keys and decays, walking back from `last` as ssm::output_only
// does: one thread per channel c,
//   kw[p][c] = k_p[c] W_p[c],  W_p = prod_{l=p+1}^{last} a_l  (W_last = 1),
// and returns G[c] = prod_{l=0}^{last} a_l to `done(c, G_c)`. The keys are staged as fp32
// (kda_stage_keys_decays) or as stored, bf16 (kda_stage_keys_decays_async): the same products, since
// bf16 -> fp32 is exact. kw may be `keys` itself (in place, fp32). A caller that wants S_{t-1} Diag(a_t)
// rather than S_t passes last = t.
__device__ __forceinline__ float staged_key_value(float k) { return k; }
__device__ __forceinline__ float staged_key_value(__nv_bfloat16 k) { return __bfloat162float(k); }
template <int DK, class Key, class Done>
__device__ __forceinline__ void kda_weighted_keys(int last, const Key* keys, const float* alphas, float* kw, Done&& done) {
  for (int c = threadIdx.x; c < DK; c += kThreads) {
    float w = 1.0f;
    for (int p = last; p >= 0; --p) {
      const std::size_t i = static_cast<std::size_t>(p) * DK + c;
      kw[i] = staged_key_value(keys[i]) * w;
      w *= alphas[i];
    }
    done(c, w);
  }
}

// The keys (bf16, as stored) and decay vectors of window positions 0..last, global -> shared by 16-byte
// cp.async pieces: every copy is in flight at once and none takes a register. Position-major, DK per
// position. `pieces`: the sources are 16-byte aligned (DK is a whole number of pieces in both types), else
// an element-wise copy into the same layout. Whole block; the caller commits and waits (its barrier
// publishes the copies).
template <int DK, class KeyAt, class AlphaAt>
__device__ __forceinline__ void kda_stage_keys_decays_async(int last, KeyAt&& key, AlphaAt&& alpha, __nv_bfloat16* keys,
                                                            float* alphas, bool pieces) {
  constexpr int kKeyPieces = DK / 8, kAlphaPieces = DK / 4;  // per position
  if (pieces) {
    for (int i = threadIdx.x; i < (last + 1) * kKeyPieces; i += kThreads) {
      const int p = i / kKeyPieces, piece = i % kKeyPieces;
      copy_async16(keys + static_cast<std::size_t>(p) * DK + piece * 8, key(p) + piece * 8, true);
    }
    for (int i = threadIdx.x; i < (last + 1) * kAlphaPieces; i += kThreads) {
      const int p = i / kAlphaPieces, piece = i % kAlphaPieces;
      copy_async16(alphas + static_cast<std::size_t>(p) * DK + piece * 4, alpha(p) + piece * 4, true);
    }
  } else {
    for (int i = threadIdx.x; i < (last + 1) * DK; i += kThreads) {
      const int p = i / DK, c = i % DK;
      keys[i] = key(p)[c];
      alphas[i] = alpha(p)[c];
    }
  }
}

// x . y over DK columns, x in shared memory (fp32) and y a bf16 vector, reduced over the warp.
template <int DK>
__device__ __forceinline__ float warp_dot_f32_bf16(const float* x, const __nv_bfloat16* y, int lane) {
  float acc = 0.0f;
#pragma unroll
  for (int c = lane * 2; c < DK; c += 64) {
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(y + c));
    acc = fmaf(x[c], b.x, fmaf(x[c + 1], b.y, acc));
  }
  return row_sum<32>(acc);
}

// Host-side checks every KDA launcher shares: the fields the channel-wise kernels need.
inline void check_kda_inputs(const StepInputs& in, int heads_per_block) {
  if (in.q == nullptr || in.k == nullptr || in.v == nullptr || in.out == nullptr)
    throw std::invalid_argument("kda decode: StepInputs q, k, v and out are required");
  if (in.alpha == nullptr)
    throw std::invalid_argument("kda decode: StepInputs::alpha is required ([B][H][dk] fp32 channel decays)");
  if (in.beta == nullptr) throw std::invalid_argument("kda decode: StepInputs::beta is required ([B][H] fp32)");
  if (heads_per_block != 0 && heads_per_block != 1)
    throw_invalid_argument("kda decode runs one value head per block (decays differ per value head): "
                           "heads_per_block must be 0 or 1",
                           "heads_per_block", heads_per_block);
}
inline void check_kda_records(const DeviceRecords& r) {
  if (r.k == nullptr || r.v == nullptr || r.alpha == nullptr || r.beta == nullptr || r.u == nullptr)
    throw std::invalid_argument(
        "kda decode: DeviceRecords k, v, u, alpha ([B][cap][H][dk] fp32) and beta are required");
  if (r.window[0] == nullptr || r.window[1] == nullptr)
    throw std::invalid_argument("kda decode: DeviceRecords::window needs both window-state copies");
}

// ---- the ReplaySSM step (decode_kda_replay.cu): what its flush and non-flush kernels share ----------
// decode_kda_replay_flush.cu and decode_kda_replay_nonflush.cu hold the two kernels and their launchers.

__host__ __device__ constexpr std::size_t round_up4(std::size_t n) { return (n + 3) / 4 * 4; }

// Appendix F: gamma of window positions 0..last (the current token's decay included), the float32
// product of the decay vectors in token order starting at position 0, largest over the key channels,
// exactly as ssm::ReplayDecoderBase::skips_checkpoint_read forms it (gamma = a_0, then gamma *= a_j
// for j = 1..last), so that the skip decision is bit-identical to the CPU decoders'. One thread per
// channel multiplies sequentially, then a block max (exact). Whole block (block_max synchronises).
template <int DK, class AlphaAt>
__device__ __forceinline__ float kda_window_gamma(int last, AlphaAt&& alpha, float* scratch) {
  float m = 0.0f;
  for (int c = threadIdx.x; c < DK; c += kThreads) {
    float g = alpha(0)[c];
    for (int p = 1; p <= last; ++p) g *= alpha(p)[c];
    m = fmaxf(m, g);
  }
  return block_max(m, scratch);
}

// The raw records of window positions 0..h0 of the block's value head, staged for kda_replay_row:
// keys [h0+1][DK] (fp32), decays [h0+1][DK], v [h0+1][dv] (fp32), betas [h0+1]. Position h0 is the
// current token, read from the step's inputs (key_at / alpha_at return those for p == h0).
template <int DK, class KeyAt, class AlphaAt>
__device__ __forceinline__ void kda_stage_raw_records(const ReplayArgs& A, const KdaBlock& kb, const WindowState& win,
                                                      int h0, KeyAt&& key_at, AlphaAt&& alpha_at, float* keys,
                                                      float* alphas, float* vals, float* betas) {
  const int dv = kb.dv;
  for (int i = threadIdx.x; i < (h0 + 1) * DK; i += kThreads) {
    const int p = i / DK, c = i % DK;
    keys[i] = __bfloat162float(key_at(p)[c]);
    alphas[i] = alpha_at(p)[c];
  }
  for (int i = threadIdx.x; i < (h0 + 1) * dv; i += kThreads) {
    const int p = i / dv, r = i % dv;
    vals[i] = __bfloat162float(p == h0 ? A.in.v[kb.hb * dv + r]
                                       : A.rec.v[(ring_slot(A.rec, kb.b, win, p) * kb.H + kb.head) * dv + r]);
  }
  for (int p = threadIdx.x; p <= h0; p += kThreads)
    betas[p] = p == h0 ? A.in.beta[kb.hb] : A.rec.beta[ring_slot(A.rec, kb.b, win, p) * kb.H + kb.head];
}

// REPLAY of window positions 0..h0 on one state row, held in the lane's pieces x (fp32 tile
// geometry), with every u recomputed sequentially from the staged raw records (ssm::replay with
// recompute_from = 0, the element-wise operations of ssm::correction and ssm::decay_and_add):
//   u_j = b_j (v_j - x (a_j . k_j)),  x <- x Diag(a_j) + u_j k_j^T.
// Returns u_{h0} (every lane of the row holds it). Uniform per warp: the row sums shuffle.
template <int DK>
__device__ __forceinline__ float kda_replay_row(float (*x)[4], int h0, int row, bool valid, int dv, const float* keys,
                                                const float* alphas, const float* vals, const float* betas, int lane) {
  using T = Tile<StorageFormat::fp32, DK>;
  constexpr int E = 4, P = T::P, LPR = T::LPR;
  float u = 0.0f;
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
    u = betas[j] * ((valid ? vals[static_cast<std::size_t>(j) * dv + row] : 0.0f) - sk);
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
      for (int e = 0; e < E; ++e) x[p][e] = x[p][e] * a4[p][e] + u * k4[p][e];
  }
  return u;
}

// The step's two launches over the grid of (value head, sequence) blocks, in this order: the flush kernel
// as a plain launch (its instance from the recur copy's format), then the non-flush kernel as its
// programmatic dependent (its instance from the read copy's format). Each sizes its own shared memory.
void launch_kda_flush(formats::StorageFormat recur, const ReplayArgs& A, dim3 grid, cudaStream_t stream);
void launch_kda_nonflush(formats::StorageFormat read, const ReplayArgs& A, dim3 grid, cudaStream_t stream);

}  // namespace replayssm::cuda::decode_detail
