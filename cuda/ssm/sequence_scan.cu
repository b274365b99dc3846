// The layer scan kernels (sequence_scan.h): the emulator's sequential fold over every token
// (src/ssm/sequence_emulator.cpp HeadEmulator::run), the same float32 operations in the same order,
// so outputs and checkpoints equal the CPU's bit for bit.
//
// Mapping. A value head's dv state rows are independent of each other between quantization events
// (row i needs only its own dot products S_i k, S_i q), so they are spread over the whole GPU: warp
// w of the head owns RB consecutive rows w*RB .. w*RB+RB-1 (rows >= dv are padding: zero-valued,
// masked, never written out), and a head's warps are split over `blocks_per_head` thread blocks of
// up to kScanWarpsPerBlock warps (grid = value heads x blocks_per_head). RB (1, 2 or 4) is chosen
// per shape so that the layer launches several warps per multiprocessor scheduler. Lane l holds
// columns l, l+32, .., l+32(J-1) of each of its rows (columns >= dk are padding, masked). The state
// lives in registers (R[RB][J], the recur copy or the only one; split policies also keep S[RB][J],
// the read running state), so every row's dot product is the canonical one of ssm/canonical_dot.h:
// lane l's partial sum over its columns in increasing order, then the butterfly over offsets 16..1.
// The per-row sums come from the reduce-scatter of state_tiles.cuh (row_sum_scatter / row_sums_all),
// which pairs lane l with lane l ^ off at each offset just as the butterfly does, so every row's sum
// has the canonical grouping whatever block, warp or RB the row lands in.
//
// Quantization events (ssm::quantize_state, src/ssm/state_quantizer.cpp) are done in registers:
// element formats element by element; FP8 block-128 and NVFP4 block-16 amaxes run along a row
// (4 chunks x 32 lanes, a half-warp) and so are shuffles within the row's warp. NVFP4's per-tensor
// scale is an amax over the whole dv x dk head, i.e. over all blocks of the head: they are launched
// as one thread-block cluster (blocks_per_head <= 8, portable), each warp posts its amax in its
// block's shared memory, one cluster barrier per event, and every warp reads all of them through
// distributed shared memory. A max of finite non-negative floats is exact in any order, so this
// gives the CPU's tensor scale bit for bit. Element codes and scales come from the shared
// host/device definitions (src/formats), random words from the same Philox streams
// (ssm/sr_stream.h), counter = row * dk + col, as the CPU.
//
// Error feedback (+ef): an ef copy's residual E is a device buffer in the checkpoint layout, read
// and written by the thread that owns each element at that copy's events only (quantize_copy):
// y = S + E, the NVFP4 tensor amax over y, RTN, E = y - Q(y). Appendix F skipping (kSkip): W and
// gamma_h beside the states (SkipWindow), the decision warp-uniform.
//
// Inputs: each warp loads the next token's k, q, decays and its rows' v into registers one token
// ahead, and asks L2 for the lines of the token kL2PrefetchTokens ahead, so the register loads find
// them in L2 instead of waiting on DRAM.
#include <cooperative_groups.h>

#include <stdexcept>

#include "cuda_check.h"
#include "formats/block_scaled.h"
#include "formats/philox.h"
#include "ssm/sequence_scan_kernel.h"
#include "ssm/sr_stream.h"
#include "ssm/state_tiles.cuh"

namespace replayssm::cuda::detail {

namespace {

namespace cg = cooperative_groups;
using formats::ElementFormat;
using formats::RoundingMode;
using ssm::Recurrence;

constexpr int kScanWarpsPerBlock = 8;
constexpr int kMaxClusterBlocks = 8;   // portable cluster size: the NVFP4 tensor amax's reach
constexpr int kL2PrefetchTokens = 8;   // a few tokens' time covers DRAM latency

// One token's inputs as this lane needs them: its columns of k, q (and the kda decays), the
// block's scalars, and the values of the warp's rows.
template <int J, int RB>
struct TokenInputs {
  float k[J], q[J], a[J];
  float alpha, beta;
  float v[RB];
};

struct TokenPointers {
  const float *k, *q, *alpha, *beta, *v;
};
__device__ __forceinline__ TokenPointers token_pointers(const ScanKernelArgs& p, int t, int head, int key_head) {
  const int64_t tt = t;
  TokenPointers r;
  r.k = p.k + tt * p.ld_k + static_cast<int64_t>(key_head) * p.dk;
  r.q = p.q + tt * p.ld_q + static_cast<int64_t>(key_head) * p.dk;
  r.alpha = p.alpha + tt * p.ld_alpha + static_cast<int64_t>(head) * (p.kind == Recurrence::kda ? p.dk : 1);
  r.beta = p.kind == Recurrence::mamba2 ? nullptr : p.beta + tt * p.ld_beta + head;
  r.v = p.v + tt * p.ld_v + static_cast<int64_t>(head) * p.dv;
  return r;
}

template <int J, int RB>
__device__ __forceinline__ void load_token(const ScanKernelArgs& p, int t, int head, int key_head, int row0, int lane,
                                           TokenInputs<J, RB>& in) {
  const TokenPointers tp = token_pointers(p, t, head, key_head);
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int col = 32 * j + lane;
    const bool valid = col < p.dk;
    in.k[j] = valid ? __ldg(tp.k + col) : 0.0f;
    in.q[j] = valid ? __ldg(tp.q + col) : 0.0f;
    in.a[j] = valid && p.kind == Recurrence::kda ? __ldg(tp.alpha + col) : 0.0f;
  }
  in.alpha = p.kind == Recurrence::kda ? 0.0f : __ldg(tp.alpha);
  in.beta = p.kind == Recurrence::mamba2 ? 0.0f : __ldg(tp.beta);
#pragma unroll
  for (int i = 0; i < RB; ++i) in.v[i] = row0 + i < p.dv ? __ldg(tp.v + row0 + i) : 0.0f;
}

// L2 prefetch of the lines token t's load_token will read (one line per lane, only addresses the
// kernel reads: k, q [and kda decays] chunk by chunk, the scalars, the first and last v of the rows).
template <int J, int RB>
__device__ __forceinline__ void prefetch_token_l2(const ScanKernelArgs& p, int t, int head, int key_head, int row0,
                                                  int lane) {
  const TokenPointers tp = token_pointers(p, t, head, key_head);
  const float* line = nullptr;
  if (lane < J) {
    if (32 * lane < p.dk) line = tp.k + 32 * lane;
  } else if (lane < 2 * J) {
    if (32 * (lane - J) < p.dk) line = tp.q + 32 * (lane - J);
  } else if (lane < 3 * J) {
    if (p.kind == Recurrence::kda && 32 * (lane - 2 * J) < p.dk) line = tp.alpha + 32 * (lane - 2 * J);
  } else if (lane == 3 * J) {
    if (p.kind != Recurrence::kda) line = tp.alpha;
  } else if (lane == 3 * J + 1) {
    line = tp.beta;
  } else if (lane == 3 * J + 2) {
    if (row0 < p.dv) line = tp.v + row0;
  } else if (lane == 3 * J + 3) {
    if (row0 < p.dv) line = tp.v + min(row0 + RB, p.dv) - 1;
  }
  if (line) asm volatile("prefetch.global.L2 [%0];" ::"l"(__cvta_generic_to_global(line)));
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

// Where this thread's rows sit: its head's state rows row0 .. row0 + RB - 1.
struct RowsOfThread {
  int row0, lane, dk, dv;
};

// The NVFP4 tensor amax of the head state held (in this layout) by all warps of the head's cluster:
// max |x| over finite elements (formats::accumulate_amax), as ssm::quantize_state takes it. Every
// thread of the cluster calls it. `slots` is this block's [2][kScanWarpsPerBlock] shared array;
// parity alternates between events, so a slot is rewritten only after the next event's cluster
// barrier, which every reader of the previous value has passed after reading it.
template <int J, int RB>
__device__ __forceinline__ float head_tensor_amax(const float (&S)[RB][J], const RowsOfThread& r, float (*slots)[kScanWarpsPerBlock],
                                                  int& parity) {
  formats::BlockAmax local;
#pragma unroll
  for (int i = 0; i < RB; ++i)
#pragma unroll
    for (int j = 0; j < J; ++j)
      if (r.row0 + i < r.dv && 32 * j + r.lane < r.dk) formats::accumulate_amax(local, S[i][j]);
  const float warp_amax = warp_max(local.amax, 32);
  const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
  if (r.lane == 0) slots[parity][warp] = warp_amax;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every block's slots written (release/acquire across the cluster)
  const int entries = static_cast<int>(cluster.num_blocks()) * warps;
  float amax = 0.0f;
  for (int e = r.lane; e < entries; e += 32) {
    const float* remote = cluster.map_shared_rank(&slots[parity][0], static_cast<unsigned>(e / warps));
    amax = fmaxf(amax, remote[e % warps]);
  }
  parity ^= 1;
  return warp_max(amax, 32);
}

// ssm::quantize_state of this thread's elements of one copy, in registers: S <- Q(S) (fp32:
// unchanged); the result also goes to `checkpoint` (this head's dv x dk slot of the event) when
// given. Every lane of the warp calls it (row tests are warp-uniform; the block amaxes are shuffles).
// tensor_amax: the head's NVFP4 tensor amax (head_tensor_amax), else unused.
template <int J, int RB>
__device__ __forceinline__ void quantize_rows(float (&S)[RB][J], const RowsOfThread& r, formats::StorageFormat f,
                                              RoundingMode mode, uint64_t seed, uint64_t stream, float* checkpoint,
                                              float tensor_amax) {
  const int lane = r.lane;
  const bool sr = mode == RoundingMode::stochastic;
  const float nan = formats::bits_float(formats::kFloatQuietNanBits);
  auto index_of = [&](int i, int j) { return static_cast<int64_t>(r.row0 + i) * r.dk + 32 * j + lane; };
  auto word = [&](int64_t index) { return sr ? formats::sr_random_word(seed, stream, static_cast<uint64_t>(index)) : 0u; };

  if (f == formats::StorageFormat::fp8b128) {
    // Blocks of 128 columns = 4 chunks (dk is a multiple of 128, so no padding columns).
    if constexpr (J % 4 == 0) {
#pragma unroll
      for (int i = 0; i < RB; ++i) {
        const bool row_valid = r.row0 + i < r.dv;  // warp-uniform
#pragma unroll
        for (int b = 0; b < J / 4; ++b) {
          formats::BlockAmax amax;
#pragma unroll
          for (int jj = 0; jj < 4; ++jj) formats::accumulate_amax(amax, S[i][4 * b + jj]);
          amax.amax = warp_max(amax.amax, 32);
          amax.has_nonfinite = __any_sync(kFullMask, amax.has_nonfinite);
          const float s = formats::fp8b128_block_scale(amax);
          const float inv = formats::fp8b128_element_encode_scale(s);
          if (!row_valid) continue;
#pragma unroll
          for (int jj = 0; jj < 4; ++jj) {
            const int j = 4 * b + jj;
            S[i][j] = amax.has_nonfinite
                          ? nan
                          : formats::fp8b128_decode_element(
                                formats::encode_element(ElementFormat::e4m3, S[i][j] * inv, mode, word(index_of(i, j))), s);
          }
        }
      }
    }
  } else if (f == formats::StorageFormat::nvfp4) {
    const formats::Nvfp4TensorScale ts = formats::nvfp4_tensor_scale(tensor_amax);
#pragma unroll
    for (int i = 0; i < RB; ++i) {
#pragma unroll
      for (int j = 0; j < J; ++j) {
        // Block of 16 columns = one half-warp of the chunk (dk is a multiple of 16: a half-warp
        // is all data or all padding).
        const bool valid = r.row0 + i < r.dv && 32 * j + lane < r.dk;
        const float x = S[i][j];
        formats::BlockAmax amax;
        if (valid) formats::accumulate_amax(amax, x);
        amax.amax = warp_max(amax.amax, 16);
        const unsigned poisoned = __ballot_sync(kFullMask, amax.has_nonfinite);
        const bool block_poisoned = ((poisoned >> (lane & 16)) & 0xFFFFu) != 0u;
        if (!valid) continue;
        if (block_poisoned) {
          S[i][j] = nan;
        } else {
          const uint32_t scale_code = formats::nvfp4_block_scale_code(amax.amax, ts);
          const float enc = formats::nvfp4_element_encode_scale(scale_code, ts);
          S[i][j] = formats::nvfp4_decode_element(
              formats::encode_element(ElementFormat::e2m1, x * enc, mode, word(index_of(i, j))), scale_code, ts.decode);
        }
      }
    }
  } else if (f != formats::StorageFormat::fp32) {
    const ElementFormat ef = element_format_of(f);
#pragma unroll
    for (int i = 0; i < RB; ++i)
#pragma unroll
      for (int j = 0; j < J; ++j)
        if (r.row0 + i < r.dv && 32 * j + lane < r.dk)
          S[i][j] = formats::round_to_element(ef, S[i][j], mode, word(index_of(i, j)));
  }
  if (checkpoint) {
#pragma unroll
    for (int i = 0; i < RB; ++i)
#pragma unroll
      for (int j = 0; j < J; ++j)
        if (r.row0 + i < r.dv && 32 * j + lane < r.dk) checkpoint[index_of(i, j)] = S[i][j];
  }
}

// Error feedback around one copy's quantization (ssm::quantize_state with a residual): before it,
// S <- y = S + E and E <- y; after it (S now Q_rtn(y)), E <- y - S. `residual` is this head's
// dv x dk slot. The same float32 additions as the CPU (x + e == e + x bitwise).
template <int J, int RB>
__device__ __forceinline__ void add_residual(float (&S)[RB][J], const RowsOfThread& r, float* residual) {
#pragma unroll
  for (int i = 0; i < RB; ++i)
#pragma unroll
    for (int j = 0; j < J; ++j)
      if (r.row0 + i < r.dv && 32 * j + r.lane < r.dk) {
        float* e = residual + static_cast<int64_t>(r.row0 + i) * r.dk + 32 * j + r.lane;
        S[i][j] = S[i][j] + *e;
        *e = S[i][j];
      }
}
template <int J, int RB>
__device__ __forceinline__ void take_residual(const float (&S)[RB][J], const RowsOfThread& r, float* residual) {
#pragma unroll
  for (int i = 0; i < RB; ++i)
#pragma unroll
    for (int j = 0; j < J; ++j)
      if (r.row0 + i < r.dv && 32 * j + r.lane < r.dk) {
        float* e = residual + static_cast<int64_t>(r.row0 + i) * r.dk + 32 * j + r.lane;
        *e = *e - S[i][j];
      }
}

// One copy's quantization event with or without error feedback. `shared_amax`: the NVFP4 tensor
// amax of the copy's input when no residual changes it (computed once for both copies of a split
// flush); with a residual the amax is taken over y, as the CPU takes it.
template <int J, int RB>
__device__ __forceinline__ void quantize_copy(float (&S)[RB][J], const RowsOfThread& r, formats::StorageFormat f,
                                              RoundingMode mode, uint64_t seed, uint64_t stream, float* checkpoint,
                                              float shared_amax, float* residual, float (*slots)[kScanWarpsPerBlock],
                                              int& parity) {
  if (residual) add_residual(S, r, residual);
  const float amax = residual && f == formats::StorageFormat::nvfp4 ? head_tensor_amax(S, r, slots, parity) : shared_amax;
  quantize_rows(S, r, f, mode, seed, stream, checkpoint, amax);
  if (residual) take_residual(S, r, residual);
}

// Appendix F's running quantities of one head (ssm HeadEmulator::skip_read): W = REPLAY(0, B[1:h])
// lives with the other states; gamma_h is the float32 product of the window's decays in token
// order, per lane for its KDA key channels (the decision uses the largest over all dk), one
// scalar otherwise. Every warp of the head computes the same gamma, so decisions agree.
template <int J>
struct SkipWindow {
  float gamma[J];
  int64_t steps = 0, steps_skipped = 0, flushes = 0, flushes_skipped = 0;
  __device__ __forceinline__ void start() {
#pragma unroll
    for (int j = 0; j < J; ++j) gamma[j] = 1.0f;
  }
  template <int RB>
  __device__ __forceinline__ bool decide(Recurrence kind, const TokenInputs<J, RB>& in, bool flush, float threshold,
                                         int dk, int lane) {
    float largest;
    if (kind == Recurrence::kda) {
      largest = -INFINITY;
#pragma unroll
      for (int j = 0; j < J; ++j)
        if (32 * j + lane < dk) {
          gamma[j] = gamma[j] * in.a[j];
          largest = fmaxf(largest, gamma[j]);
        }
      largest = warp_max(largest, 32);
    } else {
      gamma[0] = gamma[0] * in.alpha;
      largest = gamma[0];
    }
    const bool skip = largest < threshold;
    (flush ? flushes : steps) += 1;
    (flush ? flushes_skipped : steps_skipped) += skip;
    return skip;
  }
};

template <int J, int RB>
__device__ __forceinline__ void copy_state(float (&dst)[RB][J], const float (&src)[RB][J]) {
#pragma unroll
  for (int i = 0; i < RB; ++i)
#pragma unroll
    for (int j = 0; j < J; ++j) dst[i][j] = src[i][j];
}

// blocks_per_head blocks (one cluster when cluster_amax) run value head blockIdx.x / blocks_per_head.
// kSkip: the policy skips checkpoint reads (appendix F); only then does W take registers.
template <int J, int RB, bool kSkip>
__global__ void __launch_bounds__(kScanWarpsPerBlock * 32) sequence_scan_kernel(ScanKernelArgs p, int blocks_per_head) {
  __shared__ float amax_slots[2][kScanWarpsPerBlock];
  const int head = blockIdx.x / blocks_per_head, part = blockIdx.x % blocks_per_head;
  const int key_head = head / p.heads_per_group, g = head % p.heads_per_group;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int row0 = (part * warps + warp) * RB;
  const RowsOfThread rows{row0, lane, p.dk, p.dv};
  const bool split = p.scheme == ScanScheme::split;
  const bool recur_nvfp4 = p.recur_format == formats::StorageFormat::nvfp4;
  const bool read_nvfp4 = split && p.read_format == formats::StorageFormat::nvfp4;
  const int64_t head_elements = static_cast<int64_t>(p.dv) * p.dk;
  auto checkpoint_of = [&](float* base, uint64_t event) -> float* {
    return base ? base + (static_cast<int64_t>(head) * p.checkpoint_events + static_cast<int64_t>(event)) * head_elements
                : nullptr;
  };
  auto residual_of = [&](float* base) -> float* { return base ? base + static_cast<int64_t>(head) * head_elements : nullptr; };
  float* const residual_recur = residual_of(p.residual_recur);
  float* const residual_read = residual_of(p.residual_read);
  auto stream_of = [&](ssm::CheckpointCopy copy, uint64_t event) {
    return ssm::pack_sr_stream(p.layer, static_cast<uint32_t>(key_head), static_cast<uint32_t>(g),
                               static_cast<uint32_t>(copy), event);
  };

  // R: conventional: the stored state; shared: S_run; split: the recur (HP) running state.
  // S: split only, the read (LP) running state. W: kSkip only, the window's zero-started running
  // state. All start at zero.
  float R[RB][J], S[RB][J], W[RB][J];
#pragma unroll
  for (int i = 0; i < RB; ++i)
#pragma unroll
    for (int j = 0; j < J; ++j) W[i][j] = S[i][j] = R[i][j] = 0.0f;
  SkipWindow<J> skip_window;
  skip_window.start();

  for (int t = 0; t < kL2PrefetchTokens && t < p.n_tokens; ++t) prefetch_token_l2<J, RB>(p, t, head, key_head, row0, lane);
  TokenInputs<J, RB> cur, next;
  load_token(p, 0, head, key_head, row0, lane, cur);
  int h = 0;           // window position (conventional: L = 1, every token flushes)
  uint64_t event = 0;  // quantization events so far
  int parity = 0;      // amax slot set of the next NVFP4 event
  for (int t = 0; t < p.n_tokens; ++t) {
    if (t + kL2PrefetchTokens < p.n_tokens) prefetch_token_l2<J, RB>(p, t + kL2PrefetchTokens, head, key_head, row0, lane);
    if (t + 1 < p.n_tokens) load_token(p, t + 1, head, key_head, row0, lane, next);  // in flight during token t
    float* out_row = p.out + static_cast<int64_t>(t) * p.ld_out + static_cast<int64_t>(head) * p.dv;
    const bool flush = ++h == p.window;
    // Appendix F (kSkip): W steps every token (GDN/KDA: u from W) and the decision is made on this
    // token's gamma, after the read state steps, as HeadEmulator::skip_read. Decisions are
    // warp-uniform, so a state is chosen by branch, never by a register-array select.
    auto skip_read = [&](bool at_flush, float threshold) {
      if constexpr (!kSkip) {
        return false;
      } else {
        plain_step(p.kind, W, cur, p.dk, lane);
        return skip_window.decide(p.kind, cur, at_flush, threshold, p.dk, lane);
      }
    };
    if (split && !flush) {  // non-flush: output from the read running state; recur keeps pace
      plain_step(p.kind, S, cur, p.dk, lane);
      if (skip_read(false, p.skip_threshold_read))
        write_output(W, cur.q, p.dk, p.dv, row0, lane, out_row);
      else
        write_output(S, cur.q, p.dk, p.dv, row0, lane, out_row);
      plain_step(p.kind, R, cur, p.dk, lane);
    } else if (split) {  // split flush: output and both checkpoints from R (skipped: a pure write of W)
      plain_step(p.kind, R, cur, p.dk, lane);
      if (skip_read(true, p.skip_threshold_flush)) copy_state(R, W);
      write_output(R, cur.q, p.dk, p.dv, row0, lane, out_row);
    } else {  // conventional (never skips), shared: output from S_run (skipped: from W, which becomes S_run)
      plain_step(p.kind, R, cur, p.dk, lane);
      if (skip_read(flush, flush ? p.skip_threshold_flush : p.skip_threshold_read)) {
        write_output(W, cur.q, p.dk, p.dv, row0, lane, out_row);
        if (flush) copy_state(R, W);
      } else {
        write_output(R, cur.q, p.dk, p.dv, row0, lane, out_row);
      }
    }
    if (flush) {
      // Split: the read copy is Q_read of the same R, so one tensor amax serves both copies unless
      // a residual (+ef) changes a copy's input.
      const bool shared_amax = (recur_nvfp4 && !residual_recur) || (read_nvfp4 && !residual_read);
      const float amax = shared_amax ? head_tensor_amax(R, rows, amax_slots, parity) : 0.0f;
      if (split) {
        copy_state(S, R);
        quantize_copy(S, rows, p.read_format, p.read_mode, p.seed, stream_of(ssm::CheckpointCopy::read, event),
                      checkpoint_of(p.checkpoint_read, event), amax, residual_read, amax_slots, parity);
      }
      if (p.recur_format != formats::StorageFormat::fp32 || p.checkpoint_recur)
        quantize_copy(R, rows, p.recur_format, p.recur_mode, p.seed, stream_of(ssm::CheckpointCopy::recur, event),
                      checkpoint_of(p.checkpoint_recur, event), amax, residual_recur, amax_slots, parity);
      ++event;
      h = 0;
      if constexpr (kSkip) {
#pragma unroll
        for (int i = 0; i < RB; ++i)
#pragma unroll
          for (int j = 0; j < J; ++j) W[i][j] = 0.0f;
        skip_window.start();
      }
    }
    cur = next;
  }
  if constexpr (kSkip) {
    if (p.skip_counts && part == 0 && warp == 0 && lane == 0) {
      int64_t* c = p.skip_counts + 4 * static_cast<int64_t>(head);
      c[0] = skip_window.steps, c[1] = skip_window.steps_skipped, c[2] = skip_window.flushes, c[3] = skip_window.flushes_skipped;
    }
  }
  // Peers may still read this block's amax slots through distributed shared memory: a block's
  // shared memory must outlive their reads.
  if (recur_nvfp4 || read_nvfp4) cg::this_cluster().sync();
}

// Rows per warp and the head's split over blocks.
struct Geometry {
  int rows_per_warp, warps_per_block, blocks_per_head;
};

Geometry geometry_for(const ScanKernelArgs& a, bool cluster_amax) {
  int device = 0, sms = 0;
  REPLAYSSM_CUDA_CHECK(cudaGetDevice(&device));
  REPLAYSSM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  // More rows per warp amortise the shared per-token work (loads, shuffle rounds) but leave fewer
  // warps: take the most (4 at most) that still give about 6 warps per multiprocessor (1.5 per
  // scheduler), so the latency of one warp's token chain is hidden by others.
  int rb = 4;
  while (rb > 1 && static_cast<int64_t>(a.n_value_heads) * ((a.dv + rb - 1) / rb) < 6LL * sms) rb /= 2;
  // The NVFP4 tensor amax reaches over one portable cluster: at most 8 blocks of 8 warps a head.
  if (cluster_amax)
    while ((a.dv + rb - 1) / rb > kMaxClusterBlocks * kScanWarpsPerBlock) rb *= 2;
  const int warps_per_head = (a.dv + rb - 1) / rb;
  const int warps = warps_per_head < kScanWarpsPerBlock ? warps_per_head : kScanWarpsPerBlock;
  return {rb, warps, (warps_per_head + warps - 1) / warps};
}

template <int J, int RB>
void launch(const ScanKernelArgs& a, const Geometry& geo, bool cluster_amax, cudaStream_t stream) {
  auto kernel = a.skip ? sequence_scan_kernel<J, RB, true> : sequence_scan_kernel<J, RB, false>;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(a.n_value_heads) * static_cast<unsigned>(geo.blocks_per_head));
  config.blockDim = dim3(static_cast<unsigned>(geo.warps_per_block * 32));
  config.stream = stream;
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = static_cast<unsigned>(geo.blocks_per_head);
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  if (cluster_amax) {
    config.attrs = &cluster;
    config.numAttrs = 1;
    int clusters = 0;
    REPLAYSSM_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config));
    if (clusters < 1)
      throw std::runtime_error("launch_sequence_scan: a cluster of the head's blocks cannot be scheduled on this GPU");
  }
  REPLAYSSM_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, a, geo.blocks_per_head));
}

template <int J>
void launch_for_rows(const ScanKernelArgs& a, const Geometry& geo, bool cluster_amax, cudaStream_t stream) {
  switch (geo.rows_per_warp) {
    case 1: return launch<J, 1>(a, geo, cluster_amax, stream);
    case 2: return launch<J, 2>(a, geo, cluster_amax, stream);
    default: return launch<J, 4>(a, geo, cluster_amax, stream);
  }
}

}  // namespace

void launch_sequence_scan(const ScanKernelArgs& a, cudaStream_t stream) {
  if (a.dk < 1 || a.dk > 256 || a.dv < 1 || a.dv > 256 || a.n_tokens < 1)
    throw_invalid_argument("launch_sequence_scan: unsupported shape", "dk", a.dk, "dv", a.dv);
  const bool cluster_amax = a.recur_format == formats::StorageFormat::nvfp4 ||
                            (a.scheme == ScanScheme::split && a.read_format == formats::StorageFormat::nvfp4);
  const Geometry geo = geometry_for(a, cluster_amax);
  if (a.dk <= 64) return launch_for_rows<2>(a, geo, cluster_amax, stream);
  if (a.dk <= 128) return launch_for_rows<4>(a, geo, cluster_amax, stream);
  return launch_for_rows<8>(a, geo, cluster_amax, stream);
}

}  // namespace replayssm::cuda::detail
