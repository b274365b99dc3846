// The layer scan kernels (sequence_scan.h): one thread block per value head, the emulator's
// sequential fold over every token (src/ssm/sequence_emulator.cpp HeadEmulator::run), the same
// float32 operations in the same order, so outputs and checkpoints equal the CPU's bit for bit.
//
// Mapping. Warp w of the block owns the RB consecutive state rows w*RB .. w*RB+RB-1 (rows >= dv are
// padding and stay zero-valued, never written out); lane l holds columns l, l+32, .., l+32(J-1) of
// each of them (columns >= dk are padding, masked). The state lives in registers (S[RB][J]; split
// policies keep a second one, the recur copy), so every row's dot product is the canonical one of
// ssm/canonical_dot.h: lane l's partial sum over its columns in increasing order, then the
// butterfly over offsets 16..1. The per-row sums come from the reduce-scatter of state_tiles.cuh
// (row_sum_scatter / row_sums_all), which pairs lane l with lane l ^ off at each offset just as the
// butterfly does, so every row's sum has the canonical grouping with fewer shuffles.
//
// Quantization events store the state to a per-head scratch area in global memory (each thread
// its own elements, in the lane layout), quantize it there with rolled loops (small code, any
// shape), and load it back. The NVFP4 per-tensor scale (an amax over the whole dv x dk head) is a
// block reduction; FP8 block-128 and NVFP4 block-16 amaxes are warp shuffles within a row. Element
// codes and scales come from the shared host/device definitions (src/formats), random words from
// the same Philox streams (ssm/sr_stream.h), counter = row * dk + col, as the CPU.
#include "cuda_check.h"
#include "formats/block_scaled.h"
#include "formats/philox.h"
#include "ssm/sequence_scan_kernel.h"
#include "ssm/sr_stream.h"
#include "ssm/state_tiles.cuh"

namespace replayssm::cuda::detail {

namespace {

using formats::ElementFormat;
using formats::RoundingMode;
using ssm::Recurrence;

constexpr int kScanMaxWarps = 8;  // rows per warp grow with dv instead: 255 registers per thread

// One token's inputs as this lane needs them: its columns of k, q (and the kda decays), the
// block's scalars, and the values of the warp's rows.
template <int J, int RB>
struct TokenInputs {
  float k[J], q[J], a[J];
  float alpha, beta;
  float v[RB];
};

template <int J, int RB>
__device__ __forceinline__ void load_token(const ScanKernelArgs& p, int t, int head, int key_head, int row0, int lane,
                                           TokenInputs<J, RB>& in) {
  const int64_t tt = t;
  const float* kp = p.k + tt * p.ld_k + static_cast<int64_t>(key_head) * p.dk;
  const float* qp = p.q + tt * p.ld_q + static_cast<int64_t>(key_head) * p.dk;
  const float* ap = p.alpha + tt * p.ld_alpha + static_cast<int64_t>(head) * (p.kind == Recurrence::kda ? p.dk : 1);
  const float* vp = p.v + tt * p.ld_v + static_cast<int64_t>(head) * p.dv;
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int col = 32 * j + lane;
    const bool valid = col < p.dk;
    in.k[j] = valid ? __ldg(kp + col) : 0.0f;
    in.q[j] = valid ? __ldg(qp + col) : 0.0f;
    in.a[j] = valid && p.kind == Recurrence::kda ? __ldg(ap + col) : 0.0f;
  }
  in.alpha = p.kind == Recurrence::kda ? 0.0f : __ldg(ap);
  in.beta = p.kind == Recurrence::mamba2 ? 0.0f : __ldg(p.beta + tt * p.ld_beta + head);
#pragma unroll
  for (int i = 0; i < RB; ++i) in.v[i] = row0 + i < p.dv ? __ldg(vp + row0 + i) : 0.0f;
}

// Lane partial sums of the canonical dot products of the RB rows with x (canonical_dot.h step 1).
template <int J, int RB>
__device__ __forceinline__ void lane_partials(const float (&S)[RB][J], const float (&x)[J], int dk, int lane,
                                              float (&p)[RB]) {
#pragma unroll
  for (int i = 0; i < RB; ++i) {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < J; ++j)
      if (32 * j + lane < dk) acc += S[i][j] * x[j];  // product rounded, then added (--fmad=false)
    p[i] = acc;
  }
}

// plain_step of src/ssm/recurrence.cpp for the warp's rows: u from S_{t-1}, then S_t.
template <int J, int RB>
__device__ __forceinline__ void plain_step(Recurrence kind, float (&S)[RB][J], const TokenInputs<J, RB>& in, int dk,
                                           int lane) {
  float u[RB];
  if (kind == Recurrence::mamba2) {
#pragma unroll
    for (int i = 0; i < RB; ++i) u[i] = in.v[i];
  } else {
    float x[J];  // k (gdn) or a . k (kda)
#pragma unroll
    for (int j = 0; j < J; ++j) x[j] = kind == Recurrence::kda ? in.a[j] * in.k[j] : in.k[j];
    float sx[RB];
    lane_partials(S, x, dk, lane, sx);
    row_sums_all<32, RB>(sx);  // S_{t-1} k (gdn), S_{t-1} (a . k) (kda), in every lane
#pragma unroll
    for (int i = 0; i < RB; ++i)
      u[i] = kind == Recurrence::gdn ? in.beta * (in.v[i] - in.alpha * sx[i]) : in.beta * (in.v[i] - sx[i]);
  }
#pragma unroll
  for (int i = 0; i < RB; ++i)
#pragma unroll
    for (int j = 0; j < J; ++j)
      if (32 * j + lane < dk)
        S[i][j] = kind == Recurrence::kda ? S[i][j] * in.a[j] + u[i] * in.k[j] : in.alpha * S[i][j] + u[i] * in.k[j];
}

// o = S q for the warp's rows, written to out_row[row] (one lane per row writes).
template <int J, int RB>
__device__ __forceinline__ void write_output(const float (&S)[RB][J], const float (&q)[J], int dk, int dv, int row0,
                                             int lane, float* out_row) {
  float p[RB];
  lane_partials(S, q, dk, lane, p);
  const float mine = row_sum_scatter<32, RB>(p);
  if (lane % (32 / RB) == 0) {
    const int row = row0 + scatter_index<32, RB>(lane);
    if (row < dv) out_row[row] = mine;
  }
}

// Element (warp row i, chunk j) of this lane in a head's scratch copy.
__device__ __forceinline__ int64_t scratch_index(int warp, int rb, int i, int j, int J, int lane) {
  return (static_cast<int64_t>(warp * rb + i) * J + j) * 32 + lane;
}

__device__ __forceinline__ float warp_max(float x, int lanes) {
  for (int off = lanes / 2; off > 0; off /= 2) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, off));
  return x;
}

__device__ __forceinline__ ElementFormat element_format_of(formats::StorageFormat f) {
  switch (f) {
    case formats::StorageFormat::fp16: return ElementFormat::fp16;
    case formats::StorageFormat::bf16: return ElementFormat::bf16;
    case formats::StorageFormat::e4m3:
    case formats::StorageFormat::fp8b128: return ElementFormat::e4m3;
    default: return ElementFormat::e2m1;
  }
}

// ssm::quantize_state (src/ssm/state_quantizer.cpp) of one head's copy held in scratch, in place;
// the result also goes to `checkpoint` (this head's dv x dk slot of the event) when given. Every
// thread of the block calls it (the NVFP4 tensor amax is a block reduction through `red`).
__device__ __noinline__ void quantize_copy(float* scratch, int rb, int J, int dk, int dv, formats::StorageFormat f,
                                           RoundingMode mode, uint64_t seed, uint64_t stream, float* checkpoint,
                                           float* red) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const bool sr = mode == RoundingMode::stochastic;
  const float nan = formats::bits_float(formats::kFloatQuietNanBits);
  auto word = [&](int64_t index) { return sr ? formats::sr_random_word(seed, stream, static_cast<uint64_t>(index)) : 0u; };

  formats::Nvfp4TensorScale ts{1.0f, 1.0f};
  if (f == formats::StorageFormat::nvfp4) {  // tensor amax over the head's finite elements
    formats::BlockAmax local;
    for (int i = 0; i < rb; ++i)
      for (int j = 0; j < J; ++j)
        if (warp * rb + i < dv && 32 * j + lane < dk)
          formats::accumulate_amax(local, scratch[scratch_index(warp, rb, i, j, J, lane)]);
    const float m = warp_max(local.amax, 32);
    if (lane == 0) red[warp] = m;
    __syncthreads();
    float amax = 0.0f;
    for (int w = 0; w < warps; ++w) amax = fmaxf(amax, red[w]);
    __syncthreads();  // red is reused by the next call
    ts = formats::nvfp4_tensor_scale(amax);
  }

  for (int i = 0; i < rb; ++i) {
    const int row = warp * rb + i;  // warp-uniform: every lane takes part in the shuffles below
    if (f == formats::StorageFormat::fp8b128) {
      // Blocks of 128 columns = 4 chunks (dk is a multiple of 128, so no padding columns).
      for (int b = 0; b < J / 4; ++b) {
        float x[4];
        formats::BlockAmax amax;
        for (int jj = 0; jj < 4; ++jj) {
          x[jj] = scratch[scratch_index(warp, rb, i, 4 * b + jj, J, lane)];
          formats::accumulate_amax(amax, x[jj]);
        }
        amax.amax = warp_max(amax.amax, 32);
        amax.has_nonfinite = __any_sync(kFullMask, amax.has_nonfinite);
        const float s = formats::fp8b128_block_scale(amax);
        const float inv = formats::fp8b128_element_encode_scale(s);
        if (row >= dv) continue;
        for (int jj = 0; jj < 4; ++jj) {
          const int col = 32 * (4 * b + jj) + lane;
          const int64_t index = static_cast<int64_t>(row) * dk + col;
          const float y = amax.has_nonfinite ? nan
                                             : formats::fp8b128_decode_element(
                                                   formats::encode_element(ElementFormat::e4m3, x[jj] * inv, mode, word(index)), s);
          scratch[scratch_index(warp, rb, i, 4 * b + jj, J, lane)] = y;
          if (checkpoint) checkpoint[index] = y;
        }
      }
      continue;
    }
    for (int j = 0; j < J; ++j) {
      const int col = 32 * j + lane;
      const bool valid = row < dv && col < dk;
      const int64_t si = scratch_index(warp, rb, i, j, J, lane);
      const int64_t index = static_cast<int64_t>(row) * dk + col;
      const float x = scratch[si];
      float y = x;
      if (f == formats::StorageFormat::nvfp4) {
        // Block of 16 columns = one half-warp of the chunk (dk is a multiple of 16: a half-warp
        // is all data or all padding).
        formats::BlockAmax amax;
        if (valid) formats::accumulate_amax(amax, x);
        amax.amax = warp_max(amax.amax, 16);
        const unsigned poisoned = __ballot_sync(kFullMask, amax.has_nonfinite);
        const bool block_poisoned = ((poisoned >> (lane & 16)) & 0xFFFFu) != 0u;
        if (valid) {
          if (block_poisoned) {
            y = nan;
          } else {
            const uint32_t scale_code = formats::nvfp4_block_scale_code(amax.amax, ts);
            const float enc = formats::nvfp4_element_encode_scale(scale_code, ts);
            y = formats::nvfp4_decode_element(formats::encode_element(ElementFormat::e2m1, x * enc, mode, word(index)),
                                              scale_code, ts.decode);
          }
        }
      } else if (f != formats::StorageFormat::fp32 && valid) {
        y = formats::round_to_element(element_format_of(f), x, mode, word(index));
      }
      if (valid) {
        scratch[si] = y;
        if (checkpoint) checkpoint[index] = y;
      }
    }
  }
}

template <int J, int RB>
__device__ __forceinline__ void store_state(float* scratch, const float (&S)[RB][J], int warp, int lane) {
#pragma unroll
  for (int i = 0; i < RB; ++i)
#pragma unroll
    for (int j = 0; j < J; ++j) scratch[scratch_index(warp, RB, i, j, J, lane)] = S[i][j];
}
template <int J, int RB>
__device__ __forceinline__ void load_state(float (&S)[RB][J], const float* scratch, int warp, int lane) {
#pragma unroll
  for (int i = 0; i < RB; ++i)
#pragma unroll
    for (int j = 0; j < J; ++j) S[i][j] = scratch[scratch_index(warp, RB, i, j, J, lane)];
}

// One quantization event of one copy: S <- Q(S) (fp32: unchanged), checkpointed when asked.
template <int J, int RB>
__device__ __forceinline__ void quantize_event(float (&S)[RB][J], float* scratch, const ScanKernelArgs& p,
                                               formats::StorageFormat f, RoundingMode mode, uint64_t stream,
                                               float* checkpoint, float* red) {
  if (f == formats::StorageFormat::fp32 && checkpoint == nullptr) return;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  store_state(scratch, S, warp, lane);
  quantize_copy(scratch, RB, J, p.dk, p.dv, f, mode, p.seed, stream, checkpoint, red);
  load_state(S, scratch, warp, lane);
}

template <int J, int RB>
__global__ void __launch_bounds__(kScanMaxWarps * 32) sequence_scan_kernel(ScanKernelArgs p, float* scratch,
                                                                           int64_t scratch_per_copy) {
  __shared__ float red[kScanMaxWarps];
  const int head = blockIdx.x, key_head = head / p.heads_per_group, g = head % p.heads_per_group;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, row0 = warp * RB;
  const bool split = p.scheme == ScanScheme::split;
  float* scratch_recur = scratch + static_cast<int64_t>(head) * (split ? 2 : 1) * scratch_per_copy;
  float* scratch_read = scratch_recur + scratch_per_copy;
  const int64_t head_elements = static_cast<int64_t>(p.dv) * p.dk;
  auto checkpoint_of = [&](float* base, uint64_t event) -> float* {
    return base ? base + (static_cast<int64_t>(head) * p.checkpoint_events + static_cast<int64_t>(event)) * head_elements
                : nullptr;
  };
  auto stream_of = [&](ssm::CheckpointCopy copy, uint64_t event) {
    return ssm::pack_sr_stream(p.layer, static_cast<uint32_t>(key_head), static_cast<uint32_t>(g),
                               static_cast<uint32_t>(copy), event);
  };

  // conventional: the stored state; shared: S_run; split: the read (LP) running state. R: split's
  // recur (HP) running state. Both start at zero.
  float S[RB][J], R[RB][J];
#pragma unroll
  for (int i = 0; i < RB; ++i)
#pragma unroll
    for (int j = 0; j < J; ++j) S[i][j] = R[i][j] = 0.0f;

  TokenInputs<J, RB> cur, next;
  load_token(p, 0, head, key_head, row0, lane, cur);
  int h = 0;           // window position
  uint64_t event = 0;  // quantization events so far
  for (int t = 0; t < p.n_tokens; ++t) {
    if (t + 1 < p.n_tokens) load_token(p, t + 1, head, key_head, row0, lane, next);  // in flight during token t
    float* out_row = p.out + static_cast<int64_t>(t) * p.ld_out + static_cast<int64_t>(head) * p.dv;
    switch (p.scheme) {
      case ScanScheme::conventional:
        plain_step(p.kind, S, cur, p.dk, lane);
        write_output(S, cur.q, p.dk, p.dv, row0, lane, out_row);
        quantize_event(S, scratch_recur, p, p.recur_format, p.recur_mode, stream_of(ssm::CheckpointCopy::recur, event),
                       checkpoint_of(p.checkpoint_recur, event), red);
        ++event;
        break;
      case ScanScheme::shared:
        plain_step(p.kind, S, cur, p.dk, lane);
        write_output(S, cur.q, p.dk, p.dv, row0, lane, out_row);
        if (++h == p.window) {  // flush: the checkpoint Q(S_run), from which the next window starts
          quantize_event(S, scratch_recur, p, p.recur_format, p.recur_mode,
                         stream_of(ssm::CheckpointCopy::recur, event), checkpoint_of(p.checkpoint_recur, event), red);
          ++event;
          h = 0;
        }
        break;
      case ScanScheme::split:
        if (++h < p.window) {  // non-flush: output from the read running state; recur keeps pace
          plain_step(p.kind, S, cur, p.dk, lane);
          write_output(S, cur.q, p.dk, p.dv, row0, lane, out_row);
          plain_step(p.kind, R, cur, p.dk, lane);
        } else {  // flush: output and both checkpoints from the recur running state
          plain_step(p.kind, R, cur, p.dk, lane);
          write_output(R, cur.q, p.dk, p.dv, row0, lane, out_row);
#pragma unroll
          for (int i = 0; i < RB; ++i)
#pragma unroll
            for (int j = 0; j < J; ++j) S[i][j] = R[i][j];
          quantize_event(S, scratch_read, p, p.read_format, p.read_mode, stream_of(ssm::CheckpointCopy::read, event),
                         checkpoint_of(p.checkpoint_read, event), red);
          quantize_event(R, scratch_recur, p, p.recur_format, p.recur_mode,
                         stream_of(ssm::CheckpointCopy::recur, event), checkpoint_of(p.checkpoint_recur, event), red);
          ++event;
          h = 0;
        }
        break;
    }
    cur = next;
  }
}

template <int J, int RB>
void launch(const ScanKernelArgs& a, cudaStream_t stream) {
  const int warps = (a.dv + RB - 1) / RB;
  const bool split = a.scheme == ScanScheme::split;
  const int64_t per_copy = static_cast<int64_t>(warps) * RB * J * 32;
  const std::size_t bytes = static_cast<std::size_t>(per_copy) * (split ? 2 : 1) * a.n_value_heads * sizeof(float);
  float* scratch = nullptr;
  REPLAYSSM_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&scratch), bytes, stream));
  sequence_scan_kernel<J, RB><<<a.n_value_heads, warps * 32, 0, stream>>>(a, scratch, per_copy);
  const cudaError_t launched = cudaGetLastError();
  REPLAYSSM_CUDA_CHECK(cudaFreeAsync(scratch, stream));
  REPLAYSSM_CUDA_CHECK(launched);
}

// Rows per warp for dv (at most kScanMaxWarps warps), a power of two for the reduce-scatter.
template <int J>
void launch_for_dv(const ScanKernelArgs& a, cudaStream_t stream) {
  if (a.dv <= 4 * kScanMaxWarps) return launch<J, 4>(a, stream);
  if (a.dv <= 16 * kScanMaxWarps) return launch<J, 16>(a, stream);
  return launch<J, 32>(a, stream);
}

}  // namespace

void launch_sequence_scan(const ScanKernelArgs& a, cudaStream_t stream) {
  if (a.dk < 1 || a.dk > 256 || a.dv < 1 || a.dv > 32 * kScanMaxWarps || a.n_tokens < 1)
    throw_invalid_argument("launch_sequence_scan: unsupported shape", "dk", a.dk, "dv", a.dv);
  if (a.dk <= 32) return launch_for_dv<1>(a, stream);
  if (a.dk <= 64) return launch_for_dv<2>(a, stream);
  if (a.dk <= 128) return launch_for_dv<4>(a, stream);
  return launch_for_dv<8>(a, stream);
}

}  // namespace replayssm::cuda::detail
