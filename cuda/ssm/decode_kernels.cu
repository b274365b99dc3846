// Decode kernels: one 256-thread block per (value head, sequence); the block walks its head's
// dv x dk state with the lane geometry of state_tiles.cuh. See decode_kernels.h for the contract.
#include "ssm/decode_kernels.h"

#include <stdexcept>

#include "cuda_check.h"
#include "formats/philox.h"
#include "ssm/state_tiles.cuh"

namespace replayssm::cuda {

using formats::StorageFormat;
using namespace detail;

namespace {

constexpr int kMaxWindow = 64;

struct Geometry {
  int H, G, hpg, dk, dv;
  int b, head, g, vh;  // sequence, value head, key head, value head within the group
  std::size_t hb;      // b * H + head
};

__device__ __forceinline__ Geometry geometry(const DecodeShape& s) {
  Geometry q;
  q.H = s.value_heads, q.G = s.key_heads, q.hpg = s.value_heads / s.key_heads, q.dk = s.dk, q.dv = s.dv;
  q.head = blockIdx.x, q.b = blockIdx.y;
  q.g = q.head / q.hpg, q.vh = q.head % q.hpg;
  q.hb = static_cast<std::size_t>(q.b) * q.H + q.head;
  return q;
}

// Same stream numbering as ssm::sr_stream (src/ssm/state_quantizer.h), with the sequence index
// in the layer field: GPU checkpoints are bit-identical to the CPU decoders'.
__device__ __forceinline__ uint64_t sr_stream_device(int sequence, int key_head, int value_head, int copy,
                                                     uint64_t event) {
  return (static_cast<uint64_t>(sequence) << 48) | (static_cast<uint64_t>(key_head) << 36) |
         (static_cast<uint64_t>(value_head) << 28) | (static_cast<uint64_t>(copy) << 27) | event;
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

// ================================ conventional decode =========================================
// Read S, update (Mamba-2: S = a S + v k^T; GDN: u = b (v - a S k), S = a S + u k^T), o = S q,
// write S. Rows are independent, so the whole step is row-local.
template <ssm::Recurrence K, StorageFormat F, int DK>
__global__ void __launch_bounds__(kThreads) conventional_kernel(DecodeShape shape, StepInputs in, DeviceState state) {
  using T = Tile<StorageFormat::fp32, DK>;  // 4 elements per piece whatever the storage width
  constexpr int E = T::E, P = T::P, LPR = T::LPR, RW = T::RW;
  const Geometry geo = geometry(shape);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float kv[P][E], qv[P][E];
  load_lane_vector<E, P, LPR>(in.k + (static_cast<std::size_t>(geo.b) * geo.G + geo.g) * DK, lane, kv);
  load_lane_vector<E, P, LPR>(in.q + (static_cast<std::size_t>(geo.b) * geo.G + geo.g) * DK, lane, qv);
  const float a = in.alpha[geo.hb];
  const float beta = K == ssm::Recurrence::gdn ? in.beta[geo.hb] : 0.0f;
  const __nv_bfloat16* v = in.v + geo.hb * geo.dv;
  const HeadView hv = head_view(state, geo.hb, geo.dv, DK);
  // Row iterations in batches of kBatch; the next batch's loads are issued before the current one
  // is updated and stored, so up to 2 kBatch 16-byte loads per thread are in flight.
  constexpr int kBatch = 4;
  const int iterations = (geo.dv + kWarps * RW - 1) / (kWarps * RW);
  auto row_of = [&](int it) { return (it * kWarps + warp) * RW + T::row_in_iteration(lane); };
  float next[kBatch][P][E];
  auto load_batch = [&](int it0) {
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int row = row_of(it0 + j);
#pragma unroll
      for (int p = 0; p < P; ++p) {
        if (row < geo.dv) load4<F, DK>(hv, row, T::col(lane, p), next[j][p]);
        else next[j][p][0] = next[j][p][1] = next[j][p][2] = next[j][p][3] = 0.0f;
      }
    }
  };
  load_batch(0);
  for (int it0 = 0; it0 < iterations; it0 += kBatch) {
    float x[kBatch][P][E];
#pragma unroll
    for (int j = 0; j < kBatch; ++j)
#pragma unroll
      for (int p = 0; p < P; ++p)
#pragma unroll
        for (int e = 0; e < E; ++e) x[j][p][e] = next[j][p][e];
    if (it0 + kBatch < iterations) load_batch(it0 + kBatch);
    float vr[kBatch], coef[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int row = row_of(it0 + j);
      vr[j] = row < geo.dv ? __bfloat162float(v[row]) : 0.0f;
      coef[j] = vr[j];
    }
    if constexpr (K == ssm::Recurrence::gdn) {
      float sk[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        sk[j] = 0.0f;
#pragma unroll
        for (int p = 0; p < P; ++p) sk[j] = dot_acc<E>(x[j][p], kv[p], sk[j]);
      }
      row_sums_all<LPR, kBatch>(sk);
#pragma unroll
      for (int j = 0; j < kBatch; ++j) coef[j] = beta * (vr[j] - a * sk[j]);
    }
    float o[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      o[j] = 0.0f;
#pragma unroll
      for (int p = 0; p < P; ++p) {
#pragma unroll
        for (int e = 0; e < E; ++e) x[j][p][e] = fmaf(a, x[j][p][e], coef[j] * kv[p][e]);
        o[j] = dot_acc<E>(x[j][p], qv[p], o[j]);
      }
      const int row = row_of(it0 + j);
      if (row < geo.dv)
#pragma unroll
        for (int p = 0; p < P; ++p)
          store_piece<F, DK>(hv, row, T::col(lane, p), x[j][p], formats::RoundingMode::nearest_even, 0, 0);
    }
    const float sum = row_sum_scatter<LPR, kBatch>(o);
    const int row = row_of(it0 + scatter_index<LPR, kBatch>(lane));
    if (lane % (LPR / kBatch) == 0 && row < geo.dv) in.out[geo.hb * geo.dv + row] = sum;
  }
}

// ================================ ReplaySSM standard decode ===================================
// A replay block serves NH value heads of one key head (NH * dv <= 256, NH divides the heads per
// key head): the key products are computed once for them, the NH states stream as one contiguous
// (NH*dv) x dk matrix (heads are adjacent in memory), and the record phase has one thread per
// (head, row). Blocks of a sequence whose window reaches L records flush instead (replay the window
// from the recur (HP) checkpoint on chip, write the recur copy and the read (LP) copy). As in the CPU
// decoder the flush condition is h + 1 >= L: after a verification commit h can be L or more (up to
// max(L, T)), and that step folds all h + 1 records.
struct ReplayArgs {
  DecodeShape shape;
  StepInputs in;
  int window;
  DeviceState recur, read;
  bool split;
  formats::RoundingMode recur_mode;
  uint64_t seed;
  DeviceRecords rec;
  int heads_per_block;  // NH
  int stage;            // positions a flush may stage: L, or max(L, T) + 1 when the ring serves verification
};

struct BlockGeometry {
  int H, G, hpg, dk, dv, NH;
  int b, g, head0, vh0;  // sequence, key head, first value head, its index within the key head
};

__device__ __forceinline__ BlockGeometry block_geometry(const DecodeShape& s, int NH) {
  BlockGeometry q;
  q.H = s.value_heads, q.G = s.key_heads, q.hpg = s.value_heads / s.key_heads, q.dk = s.dk, q.dv = s.dv, q.NH = NH;
  q.b = blockIdx.y;
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
  __device__ int operator()(int x) const { return static_cast<int>((static_cast<float>(x) + 0.5f) * inv); }
};

// Ring slot of window position p. start < capacity and p < capacity hold by construction (the
// launchers require capacity >= L, resp. max(L, T) + T), so one conditional subtraction replaces a
// runtime modulo (tens of instructions, and this is computed per staged element).
__device__ __forceinline__ std::size_t ring_slot(const DeviceRecords& rec, int b, const WindowState& w, int p) {
  const int slot = w.start + p;
  return static_cast<std::size_t>(b) * rec.capacity + (slot >= rec.capacity ? slot - rec.capacity : slot);
}

// Dynamic shared memory of a replay block. Non-flush blocks stage the NH heads' record vectors;
// flush blocks also stage the window's keys (fp32), shared by the NH heads. Per-position arrays
// have `stride` slots per head: L for non-flush blocks (they stage at most L - 1 records), the
// launch's `stage` for flush blocks.
struct ReplayShared {
  int stride;
  float* keys;     // [stride][DK] (flush only)
  float* vals;     // [NH][stride][dv] record vectors (flush: pre-multiplied by w unless u is recomputed)
  float* a;        // [NH][stride] decays
  float* w;        // [NH][stride] decay weights prod_{l>p} a_l
  float* beta;     // [NH][stride] (GDN flush)
  float* c1;       // [stride]  key products k_p . q_t
  float* c2;       // [stride]  k_p . k_t (GDN)
  float* rows1;    // [NH*dv] S q
  float* rows2;    // [NH*dv] S k (GDN)
  float* gamma;    // [NH]
  float* scratch;  // [kWarps]
};

__host__ __device__ inline std::size_t replay_shared_floats(int L, int DK, int dv, int NH, bool flush) {
  return (flush ? static_cast<std::size_t>(L) * DK : 0) + static_cast<std::size_t>(NH) * L * dv +
         3 * static_cast<std::size_t>(NH) * L + 2 * L + 2 * NH * dv + NH + kWarps;
}

__device__ __forceinline__ ReplayShared carve_shared(float* base, int L, int DK, int dv, int NH, bool flush) {
  ReplayShared s;
  s.stride = L;
  s.keys = base;
  s.vals = s.keys + (flush ? static_cast<std::size_t>(L) * DK : 0);
  s.a = s.vals + static_cast<std::size_t>(NH) * L * dv;
  s.w = s.a + NH * L;
  s.beta = s.w + NH * L;
  s.c1 = s.beta + NH * L;
  s.c2 = s.c1 + L;
  s.rows1 = s.c2 + L;
  s.rows2 = s.rows1 + NH * dv;
  s.gamma = s.rows2 + NH * dv;
  s.scratch = s.gamma + NH;
  return s;
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
// tensor scale computed beforehand (`tensor`).
template <int DK, int P, int LPR>
__device__ __forceinline__ void store_read_row(const HeadView& h, StorageFormat f, int row, int lane, const float (*x)[4],
                                             bool valid, const formats::Nvfp4TensorScale& tensor) {
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int col = ((lane % LPR) + p * LPR) * 4;
    const std::size_t i = static_cast<std::size_t>(row) * DK + col;
    if (f == StorageFormat::fp16 || f == StorageFormat::bf16) {
      if (!valid) continue;
      const formats::ElementFormat ef = f == StorageFormat::fp16 ? formats::ElementFormat::fp16 : formats::ElementFormat::bf16;
      uint32_t c[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) c[e] = formats::encode_element(ef, x[p][e]);
      *reinterpret_cast<uint2*>(h.payload + 2 * i) = make_uint2(c[0] | (c[1] << 16), c[2] | (c[3] << 16));
    } else if (f == StorageFormat::fp8b128) {
      formats::BlockAmax amax;
#pragma unroll
      for (int e = 0; e < 4; ++e) formats::accumulate_amax(amax, valid ? x[p][e] : 0.0f);
      amax.amax = row_max<32>(amax.amax);  // a 128-block is a full warp's piece p (LPR == 32)
      amax.has_nonfinite = __any_sync(kFullMask, amax.has_nonfinite);
      const float s = formats::fp8b128_block_scale(amax);
      const float inv = formats::fp8b128_element_encode_scale(s);
      if (!valid) continue;
      uint32_t packed = 0;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const uint32_t c = amax.has_nonfinite ? formats::kE4m3NanCode
                                              : formats::encode_element(formats::ElementFormat::e4m3, x[p][e] * inv);
        packed |= c << (8 * e);
      }
      *reinterpret_cast<uint32_t*>(h.payload + i) = packed;
      if (lane % 32 == 0) h.block_scales[i / formats::kFp8BlockSize] = s;
    } else if (f == StorageFormat::nvfp4) {
      formats::BlockAmax amax;
#pragma unroll
      for (int e = 0; e < 4; ++e) formats::accumulate_amax(amax, valid ? x[p][e] : 0.0f);
      amax.amax = row_max<4>(amax.amax);
      const unsigned group_mask = 0xFu << (lane & ~3);
      amax.has_nonfinite = (__ballot_sync(kFullMask, amax.has_nonfinite) & group_mask) != 0;
      if (!valid) continue;
      uint32_t codes = 0;
      uint32_t scale_code = formats::kE4m3NanCode;
      if (!amax.has_nonfinite) {
        scale_code = formats::nvfp4_block_scale_code(amax.amax, tensor);
        const float enc = formats::nvfp4_element_encode_scale(scale_code, tensor);
#pragma unroll
        for (int e = 0; e < 4; ++e) codes |= formats::encode_element(formats::ElementFormat::e2m1, x[p][e] * enc) << (4 * e);
      }
      *reinterpret_cast<uint16_t*>(h.payload + i / 2) = static_cast<uint16_t>(codes);
      if (lane % 4 == 0) h.scale_codes[i / formats::kNvfp4BlockSize] = static_cast<uint8_t>(scale_code);
    }
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

// Decay weights of the window for the block's NH heads, one warp per head: w[n][p] =
// prod_{l>p} a_l over the staged positions, gamma[n] = prod a (eq. 5); the raw decays go to
// sh.a and, for GDN, the betas to sh.beta (both [NH][L]). Positions p < h0 are ring records,
// p == h0 the current token.
__device__ __forceinline__ void stage_decay_weights(const ReplayArgs& A, const BlockGeometry& bg, const WindowState& win,
                                                    const ReplayShared& sh, int h0, int staged, bool gdn) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, L = sh.stride;
  for (int n = warp; n < bg.NH; n += kWarps) {
    const std::size_t hb = static_cast<std::size_t>(bg.b) * bg.H + bg.head0 + n;
    float a[2] = {1.0f, 1.0f};
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int p = lane + 32 * half;
      if (p >= staged) continue;
      const std::size_t rec = ring_slot(A.rec, bg.b, win, p) * bg.H + bg.head0 + n;
      a[half] = p == h0 ? A.in.alpha[hb] : A.rec.alpha[rec];
      sh.a[n * L + p] = a[half];
      if (gdn) sh.beta[n * L + p] = p == h0 ? A.in.beta[hb] : A.rec.beta[rec];
    }
    const SuffixProducts w = warp_suffix_products(a[0], a[1]);
    if (lane < staged) sh.w[n * L + lane] = w.lo;
    if (lane + 32 < staged) sh.w[n * L + lane + 32] = w.hi;
    if (lane == 0) sh.gamma[n] = w.gamma;
  }
}

// Record vectors of the block's NH heads at window positions [0, staged) into vals [NH][L][dv]
// (L = `stride`): Mamba-2 v (bf16; position h0 is the current token's v), GDN the cached fp32 u,
// or with `raw_v` the GDN v (split flush recomputes u). With `weights` (sh.w, [NH][L]) each vector
// is stored multiplied by its decay weight w_p. Eight independent loads per thread in flight.
template <ssm::Recurrence K>
__device__ __forceinline__ void stage_record_vectors(const ReplayArgs& A, const BlockGeometry& bg, const WindowState& win,
                                                     float* vals, int stride, int h0, int staged, bool raw_v,
                                                     const float* weights) {
  const int dv = bg.dv, L = stride;
  const SmallDiv per_head(staged);
  if (dv % 2 == 0) {  // element pairs: one 4-byte (bf16) or 8-byte (fp32) load per pair
    copy_vectors(
        bg.NH * staged, dv / 2,
        [&](int vec, int pair) {
          const int n = per_head(vec), p = vec - n * staged, r = 2 * pair;
          const std::size_t hb = static_cast<std::size_t>(bg.b) * bg.H + bg.head0 + n;
          const std::size_t rec = (ring_slot(A.rec, bg.b, win, p) * bg.H + bg.head0 + n) * dv + r;
          if (K == ssm::Recurrence::mamba2 || raw_v)
            return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p == h0 ? A.in.v + hb * dv + r : A.rec.v + rec));
          return *reinterpret_cast<const float2*>(A.rec.u + rec);
        },
        [&](int vec, int pair, float2 x) {
          const int n = per_head(vec), p = vec - n * staged;
          const float w = weights ? weights[n * L + p] : 1.0f;
          *reinterpret_cast<float2*>(vals + (static_cast<std::size_t>(n) * L + p) * dv + 2 * pair) =
              weights ? make_float2(x.x * w, x.y * w) : x;
        });
    return;
  }
  copy_vectors(
      bg.NH * staged, dv,
      [&](int vec, int r) {
        const int n = per_head(vec), p = vec - n * staged;
        const std::size_t hb = static_cast<std::size_t>(bg.b) * bg.H + bg.head0 + n;
        const std::size_t rec = (ring_slot(A.rec, bg.b, win, p) * bg.H + bg.head0 + n) * dv + r;
        if (K == ssm::Recurrence::mamba2 || raw_v) return __bfloat162float(p == h0 ? A.in.v[hb * dv + r] : A.rec.v[rec]);
        return A.rec.u[rec];
      },
      [&](int vec, int r, float x) {
        const int n = per_head(vec), p = vec - n * staged;
        vals[(static_cast<std::size_t>(n) * L + p) * dv + r] = weights ? x * weights[n * L + p] : x;
      });
}

// ---- flush: S = REPLAY(S_ckpt^recur, B[1:h+1]) on chip (h + 1 = L, or more after a verification commit), o = S q, write the recur copy (RTN or SR) and the read (LP) copy.
// Each warp owns kFlushRows consecutive row slots (x in registers) and the window is folded as a
// small GEMM, S <- gamma S + V' K with V'[r][p] = w_p v_p[r] staged in shared memory: per record a
// lane reads its key columns once (16 bytes) and the row coefficients as broadcasts.
constexpr int kFlushRows = 8;

template <int DK>
struct FlushRows {
  using T = Tile<StorageFormat::fp32, DK>;
  static constexpr int P = T::P, LPR = T::LPR, RW = T::RW, G = kFlushRows;
  static constexpr int kRowsPerGroup = kWarps * G * RW;  // rows of one head per group
  __device__ static int row(int group, int warp, int j, int lane) { return ((group * kWarps + warp) * G + j) * RW + lane / LPR; }
};

template <StorageFormat RecurF, int DK>
__device__ __forceinline__ void load_flush_rows(const HeadView& recur_view, int dv, int group, float (*x)[FlushRows<DK>::P][4]) {
  using FR = FlushRows<DK>;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int j = 0; j < FR::G; ++j) {
    const int row = FR::row(group, warp, j, lane);
#pragma unroll
    for (int p = 0; p < FR::P; ++p) {
      if (row < dv) load4<RecurF, DK>(recur_view, row, FR::T::col(lane, p), x[j][p]);
      else x[j][p][0] = x[j][p][1] = x[j][p][2] = x[j][p][3] = 0.0f;
    }
  }
}

// Flush of value head n of the block. Mamba-2 and shared GDN fold the staged records as a rank-
// `staged` update (GDN: the cached u, then the current token as a conventional step); split GDN
// recomputes every u on the recur (HP) path from the raw records (Algorithm 3 for GDN). `x` holds the
// head's first row group on entry (the caller issued those loads early).
template <ssm::Recurrence K, StorageFormat RecurF, int DK>
__device__ void replay_flush_head(const ReplayArgs& A, const BlockGeometry& bg, int n, const WindowState& win,
                                  const ReplayShared& sh, int staged, const float (*kv)[4], const float (*qv)[4],
                                  float (*x)[FlushRows<DK>::P][4]) {
  using FR = FlushRows<DK>;
  constexpr int P = FR::P, LPR = FR::LPR, G = FR::G, E = 4;
  const int L = sh.stride, h0 = win.h, dv = bg.dv;  // h0: window position of the current token
  const int head = bg.head0 + n, vh = bg.vh0 + n;
  const std::size_t hb = static_cast<std::size_t>(bg.b) * bg.H + head;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const HeadView recur_view = head_view(A.recur, hb, dv, DK);
  const HeadView read_view = A.split ? head_view(A.read, hb, dv, DK) : HeadView{};
  const bool recompute_u = K == ssm::Recurrence::gdn && A.split;
  const float* vals = sh.vals + static_cast<std::size_t>(n) * L * dv;  // [p][dv]
  const float a_t = A.in.alpha[hb];
  const float beta_t = K == ssm::Recurrence::gdn ? A.in.beta[hb] : 0.0f;
  const float gamma = sh.gamma[n];
  const uint64_t recur_stream = sr_stream_device(bg.b, bg.g, vh, 0, win.flushes);
  const bool need_amax = A.split && A.read.format == StorageFormat::nvfp4;
  float local_amax = 0.0f;
  const int groups = (dv + FR::kRowsPerGroup - 1) / FR::kRowsPerGroup;
  for (int group = 0; group < groups; ++group) {
    if (group > 0) load_flush_rows<RecurF, DK>(recur_view, dv, group, x);
    int rows[G];
#pragma unroll
    for (int j = 0; j < G; ++j) rows[j] = FR::row(group, warp, j, lane);
    if (!recompute_u) {
#pragma unroll
      for (int j = 0; j < G; ++j)
#pragma unroll
        for (int p = 0; p < P; ++p)
#pragma unroll
          for (int e = 0; e < E; ++e) x[j][p][e] *= gamma;
      // The G rows of a lane are consecutive when RW == 1: their coefficients are 16-byte loads.
      const bool vector_coefs = FR::RW == 1 && dv % 4 == 0 && rows[G - 1] < dv;
      for (int r = 0; r < staged; ++r) {
        float k[P][E];
#pragma unroll
        for (int p = 0; p < P; ++p) {
          const float4 k4 = *reinterpret_cast<const float4*>(sh.keys + r * DK + FR::T::col(lane, p));
          k[p][0] = k4.x, k[p][1] = k4.y, k[p][2] = k4.z, k[p][3] = k4.w;
        }
        float c[G];  // w_r v_r[row]
        if (vector_coefs) {
#pragma unroll
          for (int i = 0; i < G / 4; ++i) {
            const float4 c4 = reinterpret_cast<const float4*>(vals + r * dv + rows[0])[i];
            c[4 * i] = c4.x, c[4 * i + 1] = c4.y, c[4 * i + 2] = c4.z, c[4 * i + 3] = c4.w;
          }
        } else {
#pragma unroll
          for (int j = 0; j < G; ++j) c[j] = rows[j] < dv ? vals[r * dv + rows[j]] : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < G; ++j)
#pragma unroll
          for (int p = 0; p < P; ++p)
#pragma unroll
            for (int e = 0; e < E; ++e) x[j][p][e] = fmaf(c[j], k[p][e], x[j][p][e]);
      }
    } else {
      // GDN split: u_r^HP = b_r (v_r - a_r S_{r-1} k_r), sequentially from the recur (HP) checkpoint.
      for (int r = 0; r < staged; ++r) {
        float k[P][E];
#pragma unroll
        for (int p = 0; p < P; ++p) {
          const float4 k4 = *reinterpret_cast<const float4*>(sh.keys + r * DK + FR::T::col(lane, p));
          k[p][0] = k4.x, k[p][1] = k4.y, k[p][2] = k4.z, k[p][3] = k4.w;
        }
        float sk[G];
#pragma unroll
        for (int j = 0; j < G; ++j) {
          sk[j] = 0.0f;
#pragma unroll
          for (int p = 0; p < P; ++p) sk[j] = dot_acc<E>(x[j][p], k[p], sk[j]);
        }
        row_sums_all<LPR, G>(sk);
        const float ar = sh.a[n * L + r], br = sh.beta[n * L + r];
#pragma unroll
        for (int j = 0; j < G; ++j) {
          const float u = rows[j] < dv ? br * (vals[r * dv + rows[j]] - ar * sk[j]) : 0.0f;
#pragma unroll
          for (int p = 0; p < P; ++p)
#pragma unroll
            for (int e = 0; e < E; ++e) x[j][p][e] = fmaf(ar, x[j][p][e], u * k[p][e]);
        }
      }
    }
    if constexpr (K == ssm::Recurrence::gdn) {  // the current token, as a conventional GDN step from S_{t-1}
      float sk[G];
#pragma unroll
      for (int j = 0; j < G; ++j) {
        sk[j] = 0.0f;
#pragma unroll
        for (int p = 0; p < P; ++p) sk[j] = dot_acc<E>(x[j][p], kv[p], sk[j]);
      }
      row_sums_all<LPR, G>(sk);
#pragma unroll
      for (int j = 0; j < G; ++j) {
        const bool valid = rows[j] < dv;
        const float vr = valid ? __bfloat162float(A.in.v[hb * dv + rows[j]]) : 0.0f;
        const float u = beta_t * (vr - a_t * sk[j]);
#pragma unroll
        for (int p = 0; p < P; ++p)
#pragma unroll
          for (int e = 0; e < E; ++e) x[j][p][e] = fmaf(a_t, x[j][p][e], u * kv[p][e]);
        if (valid && lane % LPR == 0) A.rec.u[(ring_slot(A.rec, bg.b, win, h0) * bg.H + head) * dv + rows[j]] = u;
      }
    }
    float o[G];
#pragma unroll
    for (int j = 0; j < G; ++j) {
      o[j] = 0.0f;
#pragma unroll
      for (int p = 0; p < P; ++p) o[j] = dot_acc<E>(x[j][p], qv[p], o[j]);
    }
    {
      const float sum = row_sum_scatter<LPR, G>(o);
      const int row = FR::row(group, warp, scatter_index<LPR, G>(lane), lane);
      if (lane % (LPR / G) == 0 && row < dv) A.in.out[hb * dv + row] = sum;
    }
#pragma unroll
    for (int j = 0; j < G; ++j) {
      const bool valid = rows[j] < dv;
      if (valid) {
#pragma unroll
        for (int p = 0; p < P; ++p) {
          store_piece<RecurF, DK>(recur_view, rows[j], FR::T::col(lane, p), x[j][p], A.recur_mode, A.seed, recur_stream);
          if (need_amax)
#pragma unroll
            for (int e = 0; e < E; ++e) {
              const float ax = fabsf(x[j][p][e]);
              if (ax < INFINITY && ax > local_amax) local_amax = ax;
            }
        }
      }
      if (A.split && !need_amax) store_read_row<DK, P, LPR>(read_view, A.read.format, rows[j], lane, x[j], valid, {});
    }
  }
  if (need_amax) {
    // NVFP4 LP copy: tensor scale from the block-wide amax, then re-read the recur rows this block
    // just wrote (fp32, L2-resident) and quantize them.
    using T = Tile<StorageFormat::fp32, DK>;
    const float amax = block_max(local_amax, sh.scratch);
    const formats::Nvfp4TensorScale ts = formats::nvfp4_tensor_scale(amax);
    if (threadIdx.x == 0) *read_view.tensor_scale_out = ts.decode;
    __syncthreads();
    const int iterations = (dv + kWarps * T::RW - 1) / (kWarps * T::RW);
    for (int it = 0; it < iterations; ++it) {
      const int row = (it * kWarps + warp) * T::RW + T::row_in_iteration(lane);
      const bool valid = row < dv;
      float y[P][E];
#pragma unroll
      for (int p = 0; p < P; ++p) {
        if (valid) load4<RecurF, DK>(recur_view, row, T::col(lane, p), y[p]);
        else for (int e = 0; e < E; ++e) y[p][e] = 0.0f;
      }
      store_read_row<DK, P, LPR>(read_view, StorageFormat::nvfp4, row, lane, y, valid, ts);
    }
  }
}

template <ssm::Recurrence K, StorageFormat RecurF, int DK>
__device__ void replay_flush_block(const ReplayArgs& A, const BlockGeometry& bg, const WindowState& win, const ReplayShared& sh) {
  using FR = FlushRows<DK>;
  const int h0 = win.h, dv = bg.dv;  // the current token is window position h0 (h0 + 1 >= L)
  const int lane = threadIdx.x % 32;
  const bool recompute_u = K == ssm::Recurrence::gdn && A.split;
  const int staged = K == ssm::Recurrence::mamba2 ? h0 + 1 : h0;  // Mamba-2 folds the current token too
  const __nv_bfloat16* k_t = A.in.k + (static_cast<std::size_t>(bg.b) * bg.G + bg.g) * DK;
  float kv[FR::P][4], qv[FR::P][4];
  load_lane_vector<4, FR::P, FR::LPR>(k_t, lane, kv);
  load_lane_vector<4, FR::P, FR::LPR>(A.in.q + (static_cast<std::size_t>(bg.b) * bg.G + bg.g) * DK, lane, qv);
  // The first head's first row group does not depend on the records: issue its loads first.
  float x[FR::G][FR::P][4];
  load_flush_rows<RecurF, DK>(head_view(A.recur, static_cast<std::size_t>(bg.b) * bg.H + bg.head0, dv, DK), dv, 0, x);
  // Stage the window once for the NH heads: keys, record vectors, decays and their weights.
  copy_unrolled<4>(
      staged * DK / 2,
      [&](int i) {  // two columns per element
        const int p = 2 * i / DK, c = 2 * i % DK;
        const __nv_bfloat16* kp = p == h0 ? k_t : A.rec.k + (ring_slot(A.rec, bg.b, win, p) * bg.G + bg.g) * DK;
        return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(kp + c));
      },
      [&](int i, float2 x) { reinterpret_cast<float2*>(sh.keys)[i] = x; });
  stage_decay_weights(A, bg, win, sh, h0, staged, K == ssm::Recurrence::gdn);
  __syncthreads();  // weights ready: the record vectors are staged as V'[p][r] = w_p v_p[r]
  stage_record_vectors<K>(A, bg, win, sh.vals, sh.stride, h0, staged, recompute_u, recompute_u ? nullptr : sh.w);
  __syncthreads();
  for (int n = 0; n < bg.NH; ++n) {
    if (n > 0) load_flush_rows<RecurF, DK>(head_view(A.recur, static_cast<std::size_t>(bg.b) * bg.H + bg.head0 + n, dv, DK), dv, 0, x);
    replay_flush_head<K, RecurF, DK>(A, bg, n, win, sh, staged, kv, qv, x);
  }
}

// Loads (not yet decoded) of row iterations [it0, it0 + kBatch) of the non-flush checkpoint stream.
// A plain function, not a lambda: a closure holding these arrays put them in local memory.
template <StorageFormat R, int DK, int kBatch, int P>
__device__ __forceinline__ void load_checkpoint_batch(const HeadView rv, const float* tensor_scales, std::size_t hb0,
                                                      int dv, int rows_total, int iterations, int it0,
                                                      RawPiece (&raw)[kBatch][P], float (&tscale)[kBatch]) {
  using T = Tile<R, DK>;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int j = 0; j < kBatch; ++j) {
    const int row = ((it0 + j) * kWarps + warp) * T::RW + T::row_in_iteration(lane);
    const bool valid = it0 + j < iterations && row < rows_total;
    tscale[j] = 1.0f;
    if (valid && R == StorageFormat::nvfp4) tscale[j] = tensor_scales[hb0 + row / dv];
#pragma unroll
    for (int p = 0; p < P; ++p) raw[j][p] = valid ? load_raw_piece<R, DK>(rv, row, T::col(lane, p)) : RawPiece{};
  }
}

// Non-flush step of NH heads: output-only from the read checkpoint (LP when split, else the recur copy).
//   Mamba-2: o = gamma (S q) + sum_{p<=h0} w_p (k_p . q) v_p
//   GDN:     S_{t-1}k, S_{t-1}q from (S k, S q) and the cached u; u_t = b (v - a S_{t-1}k);
//            o = a S_{t-1}q + u_t (k . q)
// The checkpoint stream does not depend on the records, so its first batch of loads is issued
// before the record phase and every later batch before the previous one is consumed: the DRAM
// latency overlaps the record phase and the dot products (what a 2-7x smaller LP read needs).
template <ssm::Recurrence K, StorageFormat R, int DK>
__device__ void replay_nonflush_block(const ReplayArgs& A, const BlockGeometry& bg, const WindowState& win,
                                      const ReplayShared& sh) {
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
  const int iterations = (rows_total + kWarps * RW - 1) / (kWarps * RW);
  auto row_of = [&](int it) { return (it * kWarps + warp) * RW + T::row_in_iteration(lane); };
  RawPiece raw[kBatch][P];
  float tscale[kBatch];
  load_checkpoint_batch<R, DK>(rv, tensor_scales, hb0, dv, rows_total, iterations, 0, raw, tscale);

  // Record phase: record vectors, decay weights, key products (c1_p = k_p . q_t; GDN c2_p = k_p . k_t).
  stage_record_vectors<K>(A, bg, win, sh.vals, sh.stride, h0, staged, false, nullptr);
  stage_decay_weights(A, bg, win, sh, h0, staged, false);
  {
    using KT = Tile<StorageFormat::fp32, DK>;
    float qf[KT::P][4], kf[KT::P][4];
    load_lane_vector<4, KT::P, KT::LPR>(q_t, lane, qf);
    load_lane_vector<4, KT::P, KT::LPR>(k_t, lane, kf);
    key_products<DK, 1, K == ssm::Recurrence::gdn ? 2 : 1>(
        staged,
        [&](int p) { return p == h0 ? k_t : A.rec.k + (ring_slot(A.rec, bg.b, win, p) * bg.G + bg.g) * DK; }, &qf, &kf,
        [&](int p, int i, float sum) { (i == 0 ? sh.c1 : sh.c2)[p] = sum; });
  }

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
      load_checkpoint_batch<R, DK>(rv, tensor_scales, hb0, dv, rows_total, iterations, it0 + kBatch, raw, tscale);
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
  float kq_t = 0.0f;
  if (K == ssm::Recurrence::gdn) kq_t = warp_dot_bf16<DK>(k_t, q_t, lane);
  __syncthreads();
  // One thread per (head, row): fold the staged records.
  for (int idx = threadIdx.x; idx < rows_total; idx += kThreads) {
    const int n = idx / dv, r = idx % dv;
    const std::size_t hb = hb0 + n;
    const float* vn = sh.vals + static_cast<std::size_t>(n) * L * dv;
    const float* wn = sh.w + n * L;
    const float gamma = sh.gamma[n];
    if (K == ssm::Recurrence::mamba2) {
      float o = gamma * sh.rows1[idx];
      for (int p = 0; p < staged; ++p) o = fmaf(wn[p] * sh.c1[p], vn[p * dv + r], o);
      A.in.out[hb * dv + r] = o;
    } else {
      float sq = gamma * sh.rows1[idx], sk = gamma * sh.rows2[idx];
      for (int p = 0; p < staged; ++p) {
        const float up = vn[p * dv + r];
        sq = fmaf(wn[p] * sh.c1[p], up, sq);
        sk = fmaf(wn[p] * sh.c2[p], up, sk);
      }
      const float a_t = A.in.alpha[hb];
      const float u = A.in.beta[hb] * (__bfloat162float(A.in.v[hb * dv + r]) - a_t * sk);
      A.in.out[hb * dv + r] = fmaf(a_t, sq, u * kq_t);
      A.rec.u[(ring_slot(A.rec, bg.b, win, h0) * bg.H + bg.head0 + n) * dv + r] = u;
    }
  }
}

// Appends the current record of the block's NH heads (the key once per key head).
__device__ __forceinline__ void append_record(const ReplayArgs& A, const BlockGeometry& bg, const WindowState& win, int DK,
                                              bool gdn) {
  const std::size_t slot = ring_slot(A.rec, bg.b, win, win.h);
  if (bg.vh0 == 0)
    for (int c = threadIdx.x; c < DK; c += kThreads)
      A.rec.k[(slot * bg.G + bg.g) * DK + c] = A.in.k[(static_cast<std::size_t>(bg.b) * bg.G + bg.g) * DK + c];
  for (int idx = threadIdx.x; idx < bg.NH * bg.dv; idx += kThreads) {
    const std::size_t hb = static_cast<std::size_t>(bg.b) * bg.H + bg.head0 + idx / bg.dv;
    A.rec.v[(slot * bg.H + bg.head0) * bg.dv + idx] = A.in.v[hb * bg.dv + idx % bg.dv];
  }
  if (threadIdx.x < bg.NH) {
    const std::size_t hb = static_cast<std::size_t>(bg.b) * bg.H + bg.head0 + threadIdx.x;
    A.rec.alpha[slot * bg.H + bg.head0 + threadIdx.x] = A.in.alpha[hb];
    if (gdn) A.rec.beta[slot * bg.H + bg.head0 + threadIdx.x] = A.in.beta[hb];
  }
}

// A replay step is two launches over the same grid, so each path gets its own register budget
// (the flush path needs far more registers, and sharing a kernel would cap the occupancy of the
// non-flush path that most steps take): blocks whose sequence does not take that path exit at once.
// Both read window[parity]; the flush kernel, launched second, writes window[1 - parity].
// Blocks per SM the register budget is sized for (ptxas -v: no spills at these bounds). NVFP4
// pieces hold 32 columns, so a lane's slice of q (and k) alone takes 32 (64) registers.
template <ssm::Recurrence K, StorageFormat R, int DK>
constexpr int nonflush_min_blocks() {
  if (DK == 256 || R == StorageFormat::nvfp4) return K == ssm::Recurrence::gdn ? 2 : 3;
  return K == ssm::Recurrence::gdn && R == StorageFormat::fp8b128 ? 3 : 4;
}
template <int DK>
constexpr int flush_min_blocks() { return DK == 256 ? 2 : 3; }

template <ssm::Recurrence K, StorageFormat R, int DK>
__global__ void __launch_bounds__(kThreads, nonflush_min_blocks<K, R, DK>()) replay_nonflush_kernel(ReplayArgs A) {
  extern __shared__ float smem[];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // The flush kernel touches only flushing sequences (and the other window-state copy): let it
  // launch now, so its blocks fill this grid's tail and, at small batches, its launch overlaps.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  const BlockGeometry bg = block_geometry(A.shape, A.heads_per_block);
  const WindowState win = A.rec.window[A.rec.parity][bg.b];
  if (win.h + 1 >= A.window) return;  // the flush kernel's sequence
  const ReplayShared sh = carve_shared(smem, A.window, DK, bg.dv, bg.NH, false);
  append_record(A, bg, win, DK, K == ssm::Recurrence::gdn);
  replay_nonflush_block<K, R, DK>(A, bg, win, sh);
}

template <ssm::Recurrence K, StorageFormat RecurF, int DK>
__global__ void __launch_bounds__(kThreads, flush_min_blocks<DK>()) replay_flush_kernel(ReplayArgs A) {
  extern __shared__ float smem[];
  const BlockGeometry bg = block_geometry(A.shape, A.heads_per_block);
  const WindowState win = A.rec.window[A.rec.parity][bg.b];
  const bool flush = win.h + 1 >= A.window;  // h == L after appending; more after a verification commit
  // The launcher sizes `stage` for every h a commit can leave; more would overrun shared memory.
  if (flush && win.h + 1 > A.stage) __trap();
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    WindowState next = win;
    if (flush) {  // the h + 1 records are folded: position h + 1 becomes position 0
      next.h = 0;
      next.start = (win.start + win.h + 1) % A.rec.capacity;
      next.flushes = win.flushes + 1;
    } else {
      next.h = win.h + 1;
    }
    A.rec.window[1 - A.rec.parity][bg.b] = next;
  }
  if (!flush) return;
  const ReplayShared sh = carve_shared(smem, A.stage, DK, bg.dv, bg.NH, true);
  append_record(A, bg, win, DK, K == ssm::Recurrence::gdn);
  replay_flush_block<K, RecurF, DK>(A, bg, win, sh);
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

// Output-only verification of T drafts for NH heads from an FP32 checkpoint (Algorithm 2; GDN: the
// UT transform, solved per row by forward substitution). A flush (h + T > L) folds the h committed
// records into the same streamed rows and writes them back.
// Blocks per SM the verify kernel's registers are sized for: T drafts' query (and key) slices stay
// in registers, 4T (8T) of them per lane at dk = 128.
template <ssm::Recurrence K, int DK, int TD>
constexpr int verify_min_blocks() {
  if (DK == 256) return 1;
  return TD == 8 && K == ssm::Recurrence::gdn ? 2 : 3;
}

template <ssm::Recurrence K, int DK, int TD>
__global__ void __launch_bounds__(kThreads, verify_min_blocks<K, DK, TD>()) verify_kernel(VerifyArgs A) {
  using T = Tile<StorageFormat::fp32, DK>;
  constexpr int E = 4, P = T::P, LPR = T::LPR, RW = T::RW;
  extern __shared__ float smem[];
  const BlockGeometry bg = block_geometry(A.shape, A.heads_per_block);
  const int NH = bg.NH, dv = bg.dv;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const WindowState win = A.rec.window[A.rec.parity][bg.b];
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
  copy_vectors(
      TD * NH, dv,
      [&](int vec, int r) { const int s = per_draft(vec), nn = vec - s * NH; return A.in.v[in_head(s, nn) * dv + r]; },
      [&](int vec, int r, __nv_bfloat16 x) {
        const int s = per_draft(vec), nn = vec - s * NH;
        A.rec.v[(ring_slot(A.rec, bg.b, win, h + s) * bg.H + bg.head0 + nn) * dv + r] = x;
      });
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
  copy_vectors(
      NH * committed_vals, dv,
      [&](int vec, int r) {
        const int nn = per_head(vec), p = vec - nn * committed_vals;
        if (p >= h) return __bfloat162float(A.in.v[in_head(p - h, nn) * dv + r]);
        const std::size_t rec = (ring_slot(A.rec, bg.b, win, p) * bg.H + bg.head0 + nn) * dv + r;
        return K == ssm::Recurrence::mamba2 ? __bfloat162float(A.rec.v[rec]) : A.rec.u[rec];
      },
      [&](int vec, int r, float x) {
        const int nn = per_head(vec), p = vec - nn * committed_vals;
        s_vals[(static_cast<std::size_t>(nn) * NP + p) * dv + r] = x;
      });
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
  // One streaming read of the NH checkpoints: S q_s (and S k_s) for every draft.
  __syncthreads();
  const HeadView ck = head_view(A.ckpt, hb0, dv, DK);
  const int rows_total = NH * dv;
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
    if (flush && h > 0) {
      // S_new = gamma_h S + sum_{p<h} prod_{l=p+1}^{h-1} a_l  v_p k_p^T (Mamba-2: v; GDN: cached u).
      const int nn = valid ? row / dv : 0, r = row % dv;
      const float gamma_h = s_fg[nn];
#pragma unroll
      for (int p = 0; p < P; ++p)
#pragma unroll
        for (int e = 0; e < E; ++e) x[p][e] *= gamma_h;
      for (int j = 0; j < h; ++j) {
        const float c = valid ? s_fw[nn * HM + j] * s_vals[(static_cast<std::size_t>(nn) * NP + j) * dv + r] : 0.0f;
#pragma unroll
        for (int p = 0; p < P; ++p) {
          const float4 k4 = *reinterpret_cast<const float4*>(s_keys + j * DK + T::col(lane, p));
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
    A.rec.window[1 - A.rec.parity][bg.b] = next;
  }
}

__global__ void commit_kernel(int batch, const int* accepted, DeviceRecords rec) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= batch) return;
  WindowState w = rec.window[rec.parity][b];
  w.h += accepted[b];
  rec.window[1 - rec.parity][b] = w;
}

// ================================ snapshot baseline ===========================================
template <ssm::Recurrence K, int DK, int TD>
__global__ void __launch_bounds__(kThreads) snapshot_verify_kernel(DecodeShape shape, StepInputs in, const float* state,
                                                                   float* snapshots) {
  using T = Tile<StorageFormat::fp32, DK>;
  constexpr int E = 4, P = T::P, LPR = T::LPR, RW = T::RW;
  const Geometry geo = geometry(shape);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float kv[TD][P][E], qv[TD][P][E];
  for (int s = 0; s < TD; ++s) {
    const std::size_t kh = (static_cast<std::size_t>(geo.b) * TD + s) * geo.G + geo.g;
    load_lane_vector<E, P, LPR>(in.k + kh * DK, lane, kv[s]);
    load_lane_vector<E, P, LPR>(in.q + kh * DK, lane, qv[s]);
  }
  const std::size_t head_elems = static_cast<std::size_t>(geo.dv) * DK;
  const std::size_t state_elems = head_elems * shape.batch * geo.H;
  for (int it = 0; it * kWarps * RW < geo.dv; ++it) {
    const int row = (it * kWarps + warp) * RW + T::row_in_iteration(lane);
    const bool valid = row < geo.dv;
    float x[P][E];
#pragma unroll
    for (int p = 0; p < P; ++p) {
      if (valid) {
        const float4 v = *reinterpret_cast<const float4*>(state + geo.hb * head_elems + row * DK + T::col(lane, p));
        x[p][0] = v.x, x[p][1] = v.y, x[p][2] = v.z, x[p][3] = v.w;
      } else {
        for (int e = 0; e < E; ++e) x[p][e] = 0.0f;
      }
    }
#pragma unroll
    for (int s = 0; s < TD; ++s) {
      const std::size_t ih = (static_cast<std::size_t>(geo.b) * TD + s) * geo.H + geo.head;
      const float a = in.alpha[ih];
      const float vr = valid ? __bfloat162float(in.v[ih * geo.dv + row]) : 0.0f;
      float coef = vr;
      if constexpr (K == ssm::Recurrence::gdn) {
        float sk = 0.0f;
#pragma unroll
        for (int p = 0; p < P; ++p) sk = dot_acc<E>(x[p], kv[s][p], sk);
        sk = row_sum<LPR>(sk);
        coef = in.beta[ih] * (vr - a * sk);
      }
      float o = 0.0f;
#pragma unroll
      for (int p = 0; p < P; ++p) {
#pragma unroll
        for (int e = 0; e < E; ++e) x[p][e] = fmaf(a, x[p][e], coef * kv[s][p][e]);
        o = dot_acc<E>(x[p], qv[s][p], o);
      }
      o = row_sum<LPR>(o);
      if (valid) {
#pragma unroll
        for (int p = 0; p < P; ++p)
          *reinterpret_cast<float4*>(snapshots + s * state_elems + geo.hb * head_elems + row * DK + T::col(lane, p)) =
              make_float4(x[p][0], x[p][1], x[p][2], x[p][3]);
        if (lane % LPR == 0) in.out[ih * geo.dv + row] = o;
      }
    }
  }
}

// ================================ dispatch ====================================================
void check_shape(const DecodeShape& s) {
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
// row) in the record phase) that still gives at least two blocks per SM; `requested` > 0 forces NH.
int sm_count() {
  static const int count = [] {
    int device = 0, n = 0;
    REPLAYSSM_CUDA_CHECK(cudaGetDevice(&device));
    REPLAYSSM_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    return n;
  }();
  return count;
}

int heads_per_block(const DecodeShape& s, int requested) {
  auto allowed = [&](int nh) { return nh >= 1 && s.heads_per_group() % nh == 0 && nh * s.dv <= kThreads; };
  if (requested > 0) {
    if (!allowed(requested))
      throw_invalid_argument("heads_per_block must divide the value heads per key head and keep heads_per_block * dv <= 256",
                             "heads_per_block", requested, "dv", s.dv);
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
    default: throw std::invalid_argument("decode kernels: recurrence kda is not implemented on the GPU (mamba2, gdn)");
  }
}

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

}  // namespace

void conventional_step(ssm::Recurrence kind, const DecodeShape& shape, const StepInputs& in, DeviceState state,
                       cudaStream_t stream) {
  check_shape(shape);
  const dim3 grid(shape.value_heads, shape.batch);
  with_kind(kind, [&](auto K) {
    with_dk(shape.dk, [&](auto DK) {
      switch (state.format) {
        case StorageFormat::fp32:
          conventional_kernel<K(), StorageFormat::fp32, DK()><<<grid, kThreads, 0, stream>>>(shape, in, state);
          break;
        case StorageFormat::fp16:
          conventional_kernel<K(), StorageFormat::fp16, DK()><<<grid, kThreads, 0, stream>>>(shape, in, state);
          break;
        case StorageFormat::bf16:
          conventional_kernel<K(), StorageFormat::bf16, DK()><<<grid, kThreads, 0, stream>>>(shape, in, state);
          break;
        default: throw std::invalid_argument("conventional decode stores fp32, fp16 or bf16 state");
      }
    });
  });
  REPLAYSSM_CUDA_CHECK_LAUNCH();
}

void replay_step(ssm::Recurrence kind, const DecodeShape& shape, const StepInputs& in, const ReplayConfig& config,
                 DeviceRecords& records, cudaStream_t stream) {
  check_shape(shape);
  if (config.window < 1 || config.window > kMaxWindow)
    throw_invalid_argument("replay decode supports 1 <= L <= 64", "L", config.window);
  // A ring that serves verification (max_drafts = T > 0) can hold up to max(L, T) committed records
  // when a standard step comes: that flush folds max(L, T) + 1 of them.
  const int stage = records.max_drafts > 0 ? std::max(config.window, records.max_drafts) + 1 : config.window;
  if (records.max_drafts < 0) throw_invalid_argument("record ring: max_drafts must be >= 0", "max_drafts", records.max_drafts);
  if (stage > kMaxWindow)
    throw_invalid_argument("replay decode after verification supports max(L, T) + 1 <= 64", "L", config.window, "T",
                           records.max_drafts);
  const int min_capacity = records.max_drafts > 0 ? std::max(config.window, records.max_drafts) + records.max_drafts : config.window;
  if (records.capacity < min_capacity)
    throw_invalid_argument("record ring needs capacity L, or max(L, T) + T with max_drafts = T", "capacity", records.capacity,
                           "needed", min_capacity);
  const StorageFormat read = config.split() ? config.read.format : config.recur.format;
  if (read == StorageFormat::fp8b128 && shape.dk % 128) throw std::invalid_argument("fp8b128 read needs dk % 128 == 0");
  // The NVFP4 LP copy needs the tensor amax before encoding; the flush re-reads the rows from the
  // recur (HP) checkpoint it just wrote, which holds S itself only when the recur copy is fp32.
  if (config.split() && read == StorageFormat::nvfp4 && config.recur.format != StorageFormat::fp32)
    throw std::invalid_argument("an NVFP4 read checkpoint needs an fp32 recurrence checkpoint in the kernels");
  const int NH = heads_per_block(shape, config.heads_per_block);
  ReplayArgs A{shape, in, config.window, config.recur, config.read, config.split(),
               formats::element_rounding_mode(config.recur_rounding), config.seed, records, NH, stage};
  const dim3 grid(shape.value_heads / NH, shape.batch);
  with_kind(kind, [&](auto K) {
    with_dk(shape.dk, [&](auto DK) {
      auto launch = [&](auto kernel, bool flush) {
        const std::size_t smem = sizeof(float) * replay_shared_floats(flush ? stage : config.window, shape.dk, shape.dv, NH, flush);
        REPLAYSSM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
        // The flush kernel is a programmatic dependent launch of the non-flush kernel: the two work
        // on disjoint sequences, so it may start before the non-flush grid has drained. (What follows
        // in the stream still waits for both.)
        cudaLaunchAttribute attribute{};
        attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attribute.val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t launch_config{};
        launch_config.gridDim = grid;
        launch_config.blockDim = dim3(kThreads);
        launch_config.dynamicSmemBytes = smem;
        launch_config.stream = stream;
        launch_config.attrs = flush ? &attribute : nullptr;
        launch_config.numAttrs = flush ? 1 : 0;
        REPLAYSSM_CUDA_CHECK(cudaLaunchKernelEx(&launch_config, kernel, A));
      };
      switch (read) {
        case StorageFormat::fp32: launch(replay_nonflush_kernel<K(), StorageFormat::fp32, DK()>, false); break;
        case StorageFormat::fp16: launch(replay_nonflush_kernel<K(), StorageFormat::fp16, DK()>, false); break;
        case StorageFormat::bf16: launch(replay_nonflush_kernel<K(), StorageFormat::bf16, DK()>, false); break;
        case StorageFormat::fp8b128:
          if constexpr (DK() >= 128) launch(replay_nonflush_kernel<K(), StorageFormat::fp8b128, DK()>, false);
          break;
        case StorageFormat::nvfp4: launch(replay_nonflush_kernel<K(), StorageFormat::nvfp4, DK()>, false); break;
        default: throw std::invalid_argument("unsupported read checkpoint format");
      }
      if (config.recur.format == StorageFormat::fp32) launch(replay_flush_kernel<K(), StorageFormat::fp32, DK()>, true);
      else if (config.recur.format == StorageFormat::fp16) launch(replay_flush_kernel<K(), StorageFormat::fp16, DK()>, true);
      else throw std::invalid_argument("the recurrence checkpoint is fp32 or fp16");
    });
  });
  REPLAYSSM_CUDA_CHECK_LAUNCH();
  records.parity = 1 - records.parity;
}

void verify_step(ssm::Recurrence kind, const DecodeShape& shape, int drafts, const StepInputs& in, const ReplayConfig& config,
                 DeviceRecords& records, cudaStream_t stream) {
  check_shape(shape);
  if (config.split() || config.recur.format != StorageFormat::fp32)
    throw std::invalid_argument("verification kernels read an fp32 shared checkpoint");
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
  records.parity = 1 - records.parity;
}

void commit_step(const DecodeShape& shape, const int* accepted, DeviceRecords& records, cudaStream_t stream) {
  commit_kernel<<<(shape.batch + 127) / 128, 128, 0, stream>>>(shape.batch, accepted, records);
  REPLAYSSM_CUDA_CHECK_LAUNCH();
  records.parity = 1 - records.parity;
}

void snapshot_verify_step(ssm::Recurrence kind, const DecodeShape& shape, int drafts, const StepInputs& in, const float* state,
                          float* snapshots, cudaStream_t stream) {
  check_shape(shape);
  const dim3 grid(shape.value_heads, shape.batch);
  with_kind(kind, [&](auto K) {
    with_dk(shape.dk, [&](auto DK) {
      with_drafts(drafts, [&](auto TD) {
        snapshot_verify_kernel<K(), DK(), TD()><<<grid, kThreads, 0, stream>>>(shape, in, state, snapshots);
      });
    });
  });
  REPLAYSSM_CUDA_CHECK_LAUNCH();
}

}  // namespace replayssm::cuda
