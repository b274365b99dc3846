// What the KDA (Kimi Delta Attention) decode kernels share (decode_kda_conventional.cu,
// decode_kda_replay.cu, decode_kda_verify.cu). KDA has a channel-wise decay (REPLAYSSM.md section 1):
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
__device__ __forceinline__ KdaBlock kda_block(const DecodeShape& s) {
  KdaBlock q;
  q.H = s.value_heads, q.G = s.key_heads, q.dv = s.dv;
  q.head = blockIdx.x, q.b = blockIdx.y;
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

}  // namespace replayssm::cuda::decode_detail
