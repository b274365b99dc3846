// What the decode kernels share (one operation per file: decode_conventional.cu, decode_replay_nonflush.cu,
// decode_replay_flush.cu, decode_verify.cu, decode_snapshot.cu; decode_replay.cuh holds what the two
// replay kernels share): the lane geometry's loads and stores of state pieces, the warp's staging and
// key-product helpers, the ring's slot arithmetic, and the host-side shape checks and dispatch.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda_check.h"
#include "formats/philox.h"
#include "ssm/sr_stream.h"
#include "ssm/decode_kernels.h"
#include "ssm/state_tiles.cuh"

namespace replayssm::cuda::decode_detail {

using formats::StorageFormat;
using namespace detail;

inline constexpr int kMaxWindow = kMaxDecodeWindow;  // decode_kernels.h

struct Geometry {
  int H, G, hpg, dk, dv;
  int b, head, g, vh;  // sequence, value head, key head, value head within the group
  std::size_t hb;      // b * H + head
};

// Value head `head` of sequence blockIdx.y; geometry(s): one block per value head (head = blockIdx.x).
__device__ __forceinline__ Geometry geometry_of_head(const DecodeShape& s, int head) {
  Geometry q;
  q.H = s.value_heads, q.G = s.key_heads, q.hpg = s.value_heads / s.key_heads, q.dk = s.dk, q.dv = s.dv;
  q.head = head, q.b = blockIdx.y;
  q.g = q.head / q.hpg, q.vh = q.head % q.hpg;
  q.hb = static_cast<std::size_t>(q.b) * q.H + q.head;
  return q;
}
__device__ __forceinline__ Geometry geometry(const DecodeShape& s) { return geometry_of_head(s, blockIdx.x); }

// The conventional kernels' row split: an FP32 head's dv rows over `conventional_row_parts` blocks,
// ceil(dv / 64) of them where dv > 64 and they divide dv evenly (Qwen3.5 and Kimi Linear's 128 rows: two
// of 64; Nemotron-3-Nano's 80: two of 40), else one block per head. A block streams its rows once, so
// the grid's last blocks leave SMs idle for about half a block's time at the end of the step; blocks of
// 64 FP32 rows at dk = 128 (32 KB, Nemotron-3-Super's head, 92.8% of copy bandwidth at B = 256) shorten
// that tail for the 128-row heads of Qwen3.5 and Kimi Linear (88.9-91.0% with one 64-KB block per head).
// FP16/BF16 heads of 128 rows are 32 KB already; split as well, the Qwen3.5 ones ran 4-9% slower on the
// H200 (2026-12-05), so they keep one block per head and their kernels compile to the unsplit code. Rows
// are independent in every recurrence here, so the split changes no value. Both conventional kernels
// split: Mamba-2/GDN's (decode_conventional.cu) and KDA's (decode_kda_conventional.cu).
inline int conventional_row_parts(const DecodeShape& s, formats::StorageFormat f) {
  return f == formats::StorageFormat::fp32 && s.dv > 64 && s.dv % ((s.dv + 63) / 64) == 0 ? (s.dv + 63) / 64 : 1;
}

// The CPU decoders' stream numbering (ssm::sr_stream, built by the shared ssm::pack_sr_stream of
// src/ssm/sr_stream.h), with the sequence index in the layer field: GPU checkpoints are bit-identical
// to the CPU decoders'.
__device__ __forceinline__ uint64_t sr_stream_device(int sequence, int key_head, int value_head, int copy,
                                                     uint64_t event) {
  return ssm::pack_sr_stream(static_cast<uint32_t>(sequence), static_cast<uint32_t>(key_head),
                             static_cast<uint32_t>(value_head), static_cast<uint32_t>(copy), event);
}

// Lane's slice of a bf16 vector of length DK (the key/query of the key head), as floats.
template <int E, int P, int LPR>
__device__ __forceinline__ void load_lane_vector(const __nv_bfloat16* base, int lane, float (*out)[E]) {
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int col = ((lane % LPR) + p * LPR) * E;
#pragma unroll
    for (int e = 0; e < E; e += 4) load_bf16x4(base + col + e, &out[p][e]);
  }
}

template <int E>
__device__ __forceinline__ float dot_e(const float* x, const float* y) {
  float acc = 0.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) acc = fmaf(x[e], y[e], acc);
  return acc;
}
// acc + x . y as one fma chain (`acc += dot_e(...)` costs an extra add per call: x + 0.0f is not
// foldable in IEEE arithmetic).
template <int E>
__device__ __forceinline__ float dot_acc(const float* x, const float* y, float acc) {
#pragma unroll
  for (int e = 0; e < E; ++e) acc = fmaf(x[e], y[e], acc);
  return acc;
}

// Store a piece in fp32/fp16/bf16 (RTN, or SR with the element's Philox word).
template <StorageFormat F, int DK>
__device__ __forceinline__ void store_piece(const HeadView& h, int row, int col, const float* x,
                                            formats::RoundingMode mode, uint64_t seed, uint64_t stream) {
  constexpr int E = 4;  // fp32-geometry pieces
  const std::size_t i = static_cast<std::size_t>(row) * DK + col;
  if constexpr (F == StorageFormat::fp32) {
    *reinterpret_cast<float4*>(reinterpret_cast<float*>(h.payload) + i) = make_float4(x[0], x[1], x[2], x[3]);
  } else if (mode == formats::RoundingMode::nearest_even) {
    // CUDA's conversions equal formats::encode_element RTN on all 2^32 inputs (test_formats_cuda).
    uint2 packed;
    if constexpr (F == StorageFormat::fp16) {
      const __half2 a = __floats2half2_rn(x[0], x[1]), b = __floats2half2_rn(x[2], x[3]);
      packed = make_uint2(*reinterpret_cast<const uint32_t*>(&a), *reinterpret_cast<const uint32_t*>(&b));
    } else {
      const __nv_bfloat162 a = __floats2bfloat162_rn(x[0], x[1]), b = __floats2bfloat162_rn(x[2], x[3]);
      packed = make_uint2(*reinterpret_cast<const uint32_t*>(&a), *reinterpret_cast<const uint32_t*>(&b));
    }
    *reinterpret_cast<uint2*>(h.payload + 2 * i) = packed;
  } else {
    const formats::ElementFormat ef = F == StorageFormat::fp16 ? formats::ElementFormat::fp16 : formats::ElementFormat::bf16;
    uint16_t c[E];
#pragma unroll
    for (int e = 0; e < E; ++e)
      c[e] = static_cast<uint16_t>(formats::encode_element(ef, x[e], mode, formats::sr_random_word(seed, stream, i + e)));
    *reinterpret_cast<uint2*>(h.payload + 2 * i) = make_uint2(c[0] | (uint32_t(c[1]) << 16), c[2] | (uint32_t(c[3]) << 16));
  }
}

// Error feedback (+ef) around a write of 4 elements in fp16/bf16 (ssm::quantize_state with a
// residual): y = x + E, store Q_rtn(y), E <- y - Q_rtn(y). `residual` is the head's dv x dk residual.
// __fadd_rn/__fsub_rn keep the compiler from contracting them with anything (the CPU rounds each).
template <StorageFormat F, int DK>
__device__ __forceinline__ void store_piece_ef(const HeadView& h, int row, int col, const float* x, float* residual) {
  static_assert(F == StorageFormat::fp16 || F == StorageFormat::bf16, "ef on an element format (fp32 stores exactly)");
  const std::size_t i = static_cast<std::size_t>(row) * DK + col;
  float4* e = reinterpret_cast<float4*>(residual + i);
  const float4 old = *e;
  const float y[4] = {__fadd_rn(x[0], old.x), __fadd_rn(x[1], old.y), __fadd_rn(x[2], old.z), __fadd_rn(x[3], old.w)};
  float q[4];
  uint2 packed;
  if constexpr (F == StorageFormat::fp16) {
    const __half2 a = __floats2half2_rn(y[0], y[1]), b = __floats2half2_rn(y[2], y[3]);
    const float2 fa = __half22float2(a), fb = __half22float2(b);
    q[0] = fa.x, q[1] = fa.y, q[2] = fb.x, q[3] = fb.y;
    packed = make_uint2(*reinterpret_cast<const uint32_t*>(&a), *reinterpret_cast<const uint32_t*>(&b));
  } else {
    const __nv_bfloat162 a = __floats2bfloat162_rn(y[0], y[1]), b = __floats2bfloat162_rn(y[2], y[3]);
    const float2 fa = __bfloat1622float2(a), fb = __bfloat1622float2(b);
    q[0] = fa.x, q[1] = fa.y, q[2] = fb.x, q[3] = fb.y;
    packed = make_uint2(*reinterpret_cast<const uint32_t*>(&a), *reinterpret_cast<const uint32_t*>(&b));
  }
  *reinterpret_cast<uint2*>(h.payload + 2 * i) = packed;
  *e = make_float4(__fsub_rn(y[0], q[0]), __fsub_rn(y[1], q[1]), __fsub_rn(y[2], q[2]), __fsub_rn(y[3], q[3]));
}

// The 4 residual elements at (row, col) of a head's residual (error feedback), or zeros without one.
template <int DK>
__device__ __forceinline__ void load_residual4(const float* residual, int row, int col, float* e) {
  if (residual == nullptr) {
    e[0] = e[1] = e[2] = e[3] = 0.0f;
    return;
  }
  const float4 v = *reinterpret_cast<const float4*>(residual + static_cast<std::size_t>(row) * DK + col);
  e[0] = v.x, e[1] = v.y, e[2] = v.z, e[3] = v.w;
}

// A head's residual of one copy (nullptr when the copy does not round with ef).
__device__ __forceinline__ float* head_residual(const DeviceState& s, std::size_t head, int dv, int dk) {
  return s.residual ? s.residual + head * static_cast<std::size_t>(dv) * dk : nullptr;
}

// Load a piece of 4 elements in fp32/fp16/bf16 (the formats that carry a recurrence).
template <StorageFormat F, int DK>
__device__ __forceinline__ void load4(const HeadView& h, int row, int col, float* x) {
  const std::size_t i = static_cast<std::size_t>(row) * DK + col;
  if constexpr (F == StorageFormat::fp32) {
    const float4 v = *reinterpret_cast<const float4*>(reinterpret_cast<const float*>(h.payload) + i);
    x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
  } else {
    const uint2 raw = *reinterpret_cast<const uint2*>(h.payload + 2 * i);
    const uint32_t w[2] = {raw.x, raw.y};
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float2 f;
      if constexpr (F == StorageFormat::fp16)
        f = __half22float2(*reinterpret_cast<const __half2*>(&w[j]));
      else
        f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[j]));
      x[2 * j] = f.x, x[2 * j + 1] = f.y;
    }
  }
}

struct BlockGeometry {
  int H, G, hpg, dk, dv, NH;
  int b, g, head0, vh0;  // sequence, key head, first value head, its index within the key head
};

// The block at blockIdx.x of sequence b (blockIdx.y, unless a flush list maps the grid's rows).
__device__ __forceinline__ BlockGeometry block_geometry(const DecodeShape& s, int NH, int b = blockIdx.y) {
  BlockGeometry q;
  q.H = s.value_heads, q.G = s.key_heads, q.hpg = s.value_heads / s.key_heads, q.dk = s.dk, q.dv = s.dv, q.NH = NH;
  q.b = b;
  q.head0 = blockIdx.x * NH;
  q.g = q.head0 / q.hpg;
  q.vh0 = q.head0 % q.hpg;
  return q;
}

// x / d for 0 <= x < 2^20 and 1 <= d <= 2^10 with one multiply instead of a runtime integer
// division (~20 instructions, and staging computes one per copied vector): (x + 0.5) / d lies at
// least 0.5 / d from an integer, and the float error of (x + 0.5) * (1 / d) is below x / d * 2^-23
// <= 2^-3 / d.
struct SmallDiv {
  float inv;
  __device__ explicit SmallDiv(int d) : inv(1.0f / static_cast<float>(d)) {}
  // From 1.0f / d computed on the host (NonflushConstants): the host's IEEE division gives the same float as the
  // device's, which costs a correctly rounded reciprocal, about 12 instructions, in every warp.
  struct Reciprocal {
    float value;
  };
  __device__ explicit SmallDiv(Reciprocal r) : inv(r.value) {}
  __device__ int operator()(int x) const { return static_cast<int>((static_cast<float>(x) + 0.5f) * inv); }
};
// Whether SmallDiv serves divisor d for dividends below `limit`.
__host__ __device__ constexpr bool small_div_serves(int d, int limit) { return d >= 1 && d <= (1 << 10) && limit <= (1 << 20); }

// block_geometry from the heads per key head and its SmallDiv reciprocal computed on the host (NonflushConstants;
// 0: outside SmallDiv's range, divide): the two runtime integer divisions above take about 60 instructions in
// every warp.
__device__ __forceinline__ BlockGeometry block_geometry(const DecodeShape& s, int NH, int hpg, float inv_hpg,
                                                        int b = blockIdx.y) {
  BlockGeometry q;
  q.H = s.value_heads, q.G = s.key_heads, q.hpg = hpg, q.dk = s.dk, q.dv = s.dv, q.NH = NH;
  q.b = b;
  q.head0 = blockIdx.x * NH;
  q.g = inv_hpg > 0.0f ? SmallDiv(SmallDiv::Reciprocal{inv_hpg})(q.head0) : q.head0 / hpg;
  q.vh0 = q.head0 - q.g * hpg;
  return q;
}

// Ring slot of window position p. start < capacity and p < capacity hold by construction (the
// launchers require capacity >= L, resp. max(L, T) + T), so one conditional subtraction replaces a
// runtime modulo (tens of instructions, and this is computed per staged element).
__device__ __forceinline__ std::size_t ring_slot(const DeviceRecords& rec, int b, const WindowState& w, int p) {
  const int slot = w.start + p;
  return static_cast<std::size_t>(b) * rec.capacity + (slot >= rec.capacity ? slot - rec.capacity : slot);
}

// The window state of sequence b at this step (DeviceRecords::sync says which copy is current).
__device__ __forceinline__ int window_parity(const DeviceRecords& rec, int b) {
  return rec.sync ? rec.sync[b].parity : rec.parity;
}
__device__ __forceinline__ WindowState current_window(const DeviceRecords& rec, int b) {
  return rec.window[window_parity(rec, b)][b];
}
__device__ __forceinline__ void write_next_window(const DeviceRecords& rec, int b, const WindowState& next) {
  rec.window[1 - window_parity(rec, b)][b] = next;
}
// Every block of a step calls this once at the end, all its threads together (block-uniform control
// flow): the last of the `blocks` blocks of sequence b flips its parity, after every block has read
// the current window state and the one that writes the next state has written it.
__device__ __forceinline__ void step_block_done(const DeviceRecords& rec, int b, unsigned blocks) {
  if (rec.sync == nullptr) return;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(&rec.sync[b].done, 1u) == blocks - 1) {
      rec.sync[b].done = 0;
      rec.sync[b].parity ^= 1;
    }
  }
}
// Host side: the parity flip of a step when it is not device-resident.
inline void advance_host_parity(DeviceRecords& rec) {
  if (rec.sync == nullptr) rec.parity = 1 - rec.parity;
}

// Dot of two bf16 vectors of length DK, reduced over the warp.
template <int DK>
__device__ __forceinline__ float warp_dot_bf16(const __nv_bfloat16* x, const __nv_bfloat16* y, int lane) {
  float acc = 0.0f;
#pragma unroll
  for (int c = lane * 2; c < DK; c += 64) {
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(x + c));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(y + c));
    acc = fmaf(a.x, b.x, fmaf(a.y, b.y, acc));
  }
  return row_sum<32>(acc);
}

// for i in [0, total): store(i, load(i)), with kUnroll loads per thread issued before any store.
// Staging loops written plainly wait one DRAM/L2 round trip per element a thread copies (the store
// needs its load, and issue is in order); this waits one per kUnroll.
template <int kUnroll, class Load, class Store>
__device__ __forceinline__ void copy_unrolled(int total, Load&& load, Store&& store) {
  using V = decltype(load(0));
  for (int i0 = threadIdx.x; i0 < total; i0 += kUnroll * kThreads) {
    V got[kUnroll];
#pragma unroll
    for (int j = 0; j < kUnroll; ++j)
      if (i0 + j * kThreads < total) got[j] = load(i0 + j * kThreads);
#pragma unroll
    for (int j = 0; j < kUnroll; ++j)
      if (i0 + j * kThreads < total) store(i0 + j * kThreads, got[j]);
  }
}

// Copies `count` vectors of `len` <= 256 elements: warp w takes vectors w, w + 8, ... with the lanes
// over the elements, and the loads of kVectors vectors (kSlots elements per lane each) are issued
// before any store. The per-vector index math (which head, which ring slot) is done once per
// vector, not per element. load(v, e) reads element e of vector v; store(v, e, x) writes it.
template <int kVectors, int kSlots, class Load, class Store>
__device__ __forceinline__ void copy_vectors_impl(int count, int len, Load& load, Store& store) {
  using V = decltype(load(0, 0));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int v0 = warp; v0 < count; v0 += kWarps * kVectors) {
    V got[kVectors][kSlots];
#pragma unroll
    for (int i = 0; i < kVectors; ++i) {
      const int v = v0 + i * kWarps;
#pragma unroll
      for (int q = 0; q < kSlots; ++q)
        if (v < count && lane + 32 * q < len) got[i][q] = load(v, lane + 32 * q);
    }
#pragma unroll
    for (int i = 0; i < kVectors; ++i) {
      const int v = v0 + i * kWarps;
#pragma unroll
      for (int q = 0; q < kSlots; ++q)
        if (v < count && lane + 32 * q < len) store(v, lane + 32 * q, got[i][q]);
    }
  }
}
template <class Load, class Store>
__device__ __forceinline__ void copy_vectors(int count, int len, Load&& load, Store&& store) {
  // 8 loads in flight per lane: 16 spilled to local memory under the flush kernel's register bound.
  if (len <= 32) copy_vectors_impl<8, 1>(count, len, load, store);
  else if (len <= 128) copy_vectors_impl<2, 4>(count, len, load, store);
  else copy_vectors_impl<1, 8>(count, len, load, store);
}

// Dot products of window keys with T query vectors and, for GDN (NV = 2), T key vectors: sum
// i = v * T + s of key p is key_p . (v == 0 ? q_s : k_s), handed to store(p, i, sum). One key per warp
// row group (row geometry of Tile<fp32, DK>), the loads of kKeyBatch groups issued before any use;
// all N = NV * T sums of a key are reduced together (reduce-scatter). key(p) gives key p's bf16
// vector; qv / kv hold the lane's column slices.
template <int DK, int T, int NV, class KeyAt, class Store>
__device__ __forceinline__ void key_products(int count, KeyAt&& key, const float (*qv)[Tile<StorageFormat::fp32, DK>::P][4],
                                             const float (*kv)[Tile<StorageFormat::fp32, DK>::P][4], Store&& store) {
  using G = Tile<StorageFormat::fp32, DK>;
  constexpr int P = G::P, LPR = G::LPR, RW = G::RW, N = NV * T;
  constexpr int kKeyBatch = T >= 8 ? 2 : 4;  // register budget: T query (and key) slices stay live
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int iterations = (count + kWarps * RW - 1) / (kWarps * RW);
  for (int it0 = 0; it0 < iterations; it0 += kKeyBatch) {
    float kp[kKeyBatch][P][4];
#pragma unroll
    for (int j = 0; j < kKeyBatch; ++j) {
      const int p = ((it0 + j) * kWarps + warp) * RW + lane / LPR;
#pragma unroll
      for (int q = 0; q < P; ++q) {
        if (p < count) load_bf16x4(key(p) + G::col(lane, q), kp[j][q]);
        else kp[j][q][0] = kp[j][q][1] = kp[j][q][2] = kp[j][q][3] = 0.0f;
      }
    }
#pragma unroll
    for (int j = 0; j < kKeyBatch; ++j) {
      const int p = ((it0 + j) * kWarps + warp) * RW + lane / LPR;
      float part[N];
#pragma unroll
      for (int s = 0; s < T; ++s) {
        part[s] = 0.0f;
        if constexpr (NV == 2) part[T + s] = 0.0f;
#pragma unroll
        for (int q = 0; q < P; ++q) {
          part[s] = dot_acc<4>(kp[j][q], qv[s][q], part[s]);
          if constexpr (NV == 2) part[T + s] = dot_acc<4>(kp[j][q], kv[s][q], part[T + s]);
        }
      }
      if constexpr (N <= LPR) {
        const float sum = row_sum_scatter<LPR, N>(part);
        if (p < count && lane % (LPR / N) == 0) store(p, scatter_index<LPR, N>(lane), sum);
      } else {
#pragma unroll
        for (int i = 0; i < N; ++i) {
          const float sum = row_sum<LPR>(part[i]);
          if (p < count && lane % LPR == 0) store(p, i, sum);
        }
      }
    }
  }
}

// Quantize row `row` of the LP copy with RTN (values x over the lane's fp32-geometry pieces).
// fp8b128 blocks are row chunks of 128 = 32 lanes x 4; nvfp4 blocks 16 = 4 lanes x 4 and need the
// tensor scale computed beforehand (`tensor`; with error feedback, from the amax of x + E).
// `residual` (the head's, or nullptr): error feedback, y = x + E is quantized and E <- y - Q(y),
// Q(y) decoded exactly as ssm::quantize_state decodes it.
template <int DK, int P, int LPR>
__device__ __forceinline__ void store_read_row(const HeadView& h, StorageFormat f, int row, int lane, const float (*x)[4],
                                             bool valid, const formats::Nvfp4TensorScale& tensor, float* residual = nullptr) {
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int col = ((lane % LPR) + p * LPR) * 4;
    const std::size_t i = static_cast<std::size_t>(row) * DK + col;
    float y[4];
    if (residual != nullptr && valid) {
      load_residual4<DK>(residual, row, col, y);
#pragma unroll
      for (int e = 0; e < 4; ++e) y[e] = __fadd_rn(x[p][e], y[e]);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) y[e] = x[p][e];
    }
    float q[4];  // Q(y), decoded (error feedback)
    if (f == StorageFormat::fp16 || f == StorageFormat::bf16) {
      if (!valid) continue;
      const formats::ElementFormat ef = f == StorageFormat::fp16 ? formats::ElementFormat::fp16 : formats::ElementFormat::bf16;
      uint32_t c[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) c[e] = formats::encode_element(ef, y[e]), q[e] = formats::decode_element(ef, c[e]);
      *reinterpret_cast<uint2*>(h.payload + 2 * i) = make_uint2(c[0] | (c[1] << 16), c[2] | (c[3] << 16));
    } else if (f == StorageFormat::fp8b128) {
      formats::BlockAmax amax;
#pragma unroll
      for (int e = 0; e < 4; ++e) formats::accumulate_amax(amax, valid ? y[e] : 0.0f);
      amax.amax = row_max<32>(amax.amax);  // a 128-block is a full warp's piece p (LPR == 32)
      amax.has_nonfinite = __any_sync(kFullMask, amax.has_nonfinite);
      const float s = formats::fp8b128_block_scale(amax);
      const float inv = formats::fp8b128_element_encode_scale(s);
      if (!valid) continue;
      uint32_t packed = 0;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const uint32_t c = amax.has_nonfinite ? formats::kE4m3NanCode
                                              : formats::encode_element(formats::ElementFormat::e4m3, y[e] * inv);
        packed |= c << (8 * e);
        q[e] = amax.has_nonfinite ? __int_as_float(0x7FC00000) : formats::fp8b128_decode_element(c, s);
      }
      *reinterpret_cast<uint32_t*>(h.payload + i) = packed;
      if (lane % 32 == 0) h.block_scales[i / formats::kFp8BlockSize] = s;
    } else if (f == StorageFormat::nvfp4) {
      formats::BlockAmax amax;
#pragma unroll
      for (int e = 0; e < 4; ++e) formats::accumulate_amax(amax, valid ? y[e] : 0.0f);
      amax.amax = row_max<4>(amax.amax);
      const unsigned group_mask = 0xFu << (lane & ~3);
      amax.has_nonfinite = (__ballot_sync(kFullMask, amax.has_nonfinite) & group_mask) != 0;
      if (!valid) continue;
      uint32_t codes = 0;
      uint32_t scale_code = formats::kE4m3NanCode;
#pragma unroll
      for (int e = 0; e < 4; ++e) q[e] = __int_as_float(0x7FC00000);
      if (!amax.has_nonfinite) {
        scale_code = formats::nvfp4_block_scale_code(amax.amax, tensor);
        const float enc = formats::nvfp4_element_encode_scale(scale_code, tensor);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const uint32_t c = formats::encode_element(formats::ElementFormat::e2m1, y[e] * enc);
          codes |= c << (4 * e);
          q[e] = formats::nvfp4_decode_element(c, scale_code, tensor.decode);
        }
      }
      *reinterpret_cast<uint16_t*>(h.payload + i / 2) = static_cast<uint16_t>(codes);
      if (lane % 4 == 0) h.scale_codes[i / formats::kNvfp4BlockSize] = static_cast<uint8_t>(scale_code);
    } else {
      continue;
    }
    if (residual != nullptr)
      *reinterpret_cast<float4*>(residual + i) =
          make_float4(__fsub_rn(y[0], q[0]), __fsub_rn(y[1], q[1]), __fsub_rn(y[2], q[2]), __fsub_rn(y[3], q[3]));
  }
}

// Block-wide max (for the NVFP4 tensor scale of the LP copy).
__device__ __forceinline__ float block_max(float x, float* scratch) {
  x = row_max<32>(x);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  float m = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) m = fmaxf(m, scratch[w]);
  return m;
}

// ================================ dispatch ====================================================
// Verification from a read (LP) and recur (HP) checkpoint pair, or a shared checkpoint below fp32
// (decode_verify_split.cu); verify_step checks the ring and window first.
void launch_split_verify(ssm::Recurrence kind, const DecodeShape& shape, int drafts, const StepInputs& in,
                         const ReplayConfig& config, const DeviceRecords& records, int max_committed, cudaStream_t stream);

// Host side: a copy rounds with error feedback exactly when it has a residual buffer; `formats`
// lists what the kernel implements ef for. Returns the element rounding mode of its other writes.
inline formats::RoundingMode checked_rounding(const DeviceState& s, formats::Rounding r, const char* copy) {
  if ((r == formats::Rounding::ef) != (s.residual != nullptr))
    throw std::invalid_argument(std::string("decode kernels: the ") + copy +
                                " copy's residual buffer must be set exactly when it rounds with error feedback (ef)");
  if (r == formats::Rounding::ef && s.format == StorageFormat::fp32)
    throw std::invalid_argument(std::string("decode kernels: the ") + copy + " copy is fp32, which stores exactly: no ef");
  return r == formats::Rounding::ef ? formats::RoundingMode::nearest_even : formats::element_rounding_mode(r);
}

inline void check_shape(const DecodeShape& s) {
  const bool dk_ok = s.dk == 64 || s.dk == 128 || s.dk == 256;
  if (!dk_ok || s.dv < 1 || s.dv > 256 || s.key_heads < 1 || s.value_heads % s.key_heads != 0 || s.batch < 1 ||
      s.heads_per_group() > 256)
    throw_invalid_argument("decode kernels: unsupported shape (dk must be 64, 128 or 256; 1 <= dv <= 256; value heads a "
                           "multiple of key heads, at most 256 per key head)",
                           "dk", s.dk, "dv", s.dv);
}

// Value heads per replay/verify block. Heads of one key head share the key products, so more
// heads per block is less redundant work — but a small batch then leaves most SMs idle. Automatic
// choice: the largest divisor of the heads per key head with NH * dv <= 256 (one thread per (head,
// row) in the record phase) that still gives at least two blocks per SM; `requested` > 0 forces NH,
// up to NH * dv <= max_rows (the standard replay step loops over rows, so it allows more: kMaxReplayRows).
inline int sm_count() {
  static const int count = [] {
    int device = 0, n = 0;
    REPLAYSSM_CUDA_CHECK(cudaGetDevice(&device));
    REPLAYSSM_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    return n;
  }();
  return count;
}
// Dynamic shared memory one block may opt in to (227 KB on an H200).
inline std::size_t max_dynamic_smem() {
  static const std::size_t bytes = [] {
    int device = 0, n = 0;
    REPLAYSSM_CUDA_CHECK(cudaGetDevice(&device));
    REPLAYSSM_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    return static_cast<std::size_t>(n);
  }();
  return bytes;
}

constexpr int kMaxReplayRows = 1024;
// `option`: the name a refusal gives the requested count (ReplayConfig::heads_per_block or flush_heads_per_block).
inline int heads_per_block(const DecodeShape& s, int requested, int max_rows = kThreads,
                           const char* option = "heads_per_block") {
  auto divides = [&](int nh) { return nh >= 1 && s.heads_per_group() % nh == 0; };
  auto allowed = [&](int nh) { return divides(nh) && nh * s.dv <= kThreads; };
  if (requested > 0) {
    if (!divides(requested) || requested * s.dv > max_rows)
      throw_invalid_argument((std::string(option) + " must divide the value heads per key head and keep " + option +
                              " * dv <= " + std::to_string(max_rows))
                                 .c_str(),
                             option, requested, "dv", s.dv);
    return requested;
  }
  const long target_blocks = 2L * sm_count();
  int best = 1;
  for (int nh = 2; nh <= s.heads_per_group(); ++nh)
    if (allowed(nh) && static_cast<long>(s.batch) * s.value_heads / nh >= target_blocks) best = nh;
  return best;
}

template <class F>
void with_dk(int dk, F&& f) {
  switch (dk) {
    case 64: f(std::integral_constant<int, 64>{}); break;
    case 128: f(std::integral_constant<int, 128>{}); break;
    default: f(std::integral_constant<int, 256>{}); break;
  }
}

template <class F>
void with_kind(ssm::Recurrence k, F&& f) {
  switch (k) {
    case ssm::Recurrence::mamba2: f(std::integral_constant<ssm::Recurrence, ssm::Recurrence::mamba2>{}); break;
    case ssm::Recurrence::gdn: f(std::integral_constant<ssm::Recurrence, ssm::Recurrence::gdn>{}); break;
    default: throw std::invalid_argument("decode kernels: this operation implements mamba2 and gdn, not kda (kda: conventional_step, replay_step, verify_step and commit_step)");
  }
}

// All three recurrences (the kernels written for channel decays too).
template <class F>
void with_kind_all(ssm::Recurrence k, F&& f) {
  switch (k) {
    case ssm::Recurrence::mamba2: f(std::integral_constant<ssm::Recurrence, ssm::Recurrence::mamba2>{}); break;
    case ssm::Recurrence::gdn: f(std::integral_constant<ssm::Recurrence, ssm::Recurrence::gdn>{}); break;
    case ssm::Recurrence::kda: f(std::integral_constant<ssm::Recurrence, ssm::Recurrence::kda>{}); break;
  }
}

// The draft counts T of kVerifyDraftCounts (decode_kernels.h), as compile-time constants.
template <class F>
void with_drafts(int t, F&& f) {
  switch (t) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 8: f(std::integral_constant<int, 8>{}); break;
    default: throw_invalid_argument("verification supports T in {1, 2, 4, 8}", "T", t);
  }
}


}  // namespace replayssm::cuda::decode_detail
