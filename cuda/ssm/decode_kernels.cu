// Decode kernels: one 256-thread block per (value head, sequence); the block walks its head's
// dv x dk state with the lane geometry of state_tiles.cuh. See decode_kernels.h for the contract.
#include "ssm/decode_kernels.h"

#include <stdexcept>
#include <string>

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
template <SsmKind K, StorageFormat F, int DK>
__global__ void __launch_bounds__(kThreads) conventional_kernel(DecodeShape shape, StepInputs in, DeviceState state) {
  using T = Tile<StorageFormat::fp32, DK>;  // 4 elements per piece whatever the storage width
  constexpr int E = T::E, P = T::P, LPR = T::LPR, RW = T::RW;
  const Geometry geo = geometry(shape);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float kv[P][E], qv[P][E];
  load_lane_vector<E, P, LPR>(in.k + (static_cast<std::size_t>(geo.b) * geo.G + geo.g) * DK, lane, kv);
  load_lane_vector<E, P, LPR>(in.q + (static_cast<std::size_t>(geo.b) * geo.G + geo.g) * DK, lane, qv);
  const float a = in.alpha[geo.hb];
  const float beta = K == SsmKind::gdn ? in.beta[geo.hb] : 0.0f;
  const __nv_bfloat16* v = in.v + geo.hb * geo.dv;
  const HeadView hv = head_view(state, geo.hb, geo.dv, DK);
  constexpr int kBatch = 4;  // row iterations whose loads are issued together
  for (int it0 = 0; it0 * kWarps * RW < geo.dv; it0 += kBatch) {
    float x[kBatch][P][E];
    int rows[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      rows[j] = ((it0 + j) * kWarps + warp) * RW + T::row_in_iteration(lane);
#pragma unroll
      for (int p = 0; p < P; ++p)
        if (rows[j] < geo.dv) load4<F, DK>(hv, rows[j], T::col(lane, p), x[j][p]);
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const bool valid = rows[j] < geo.dv;
      const float vr = valid ? __bfloat162float(v[rows[j]]) : 0.0f;
      float coef = vr;
      if constexpr (K == SsmKind::gdn) {
        float sk = 0.0f;
#pragma unroll
        for (int p = 0; p < P; ++p) sk += valid ? dot_e<E>(x[j][p], kv[p]) : 0.0f;
        sk = row_sum<LPR>(sk);
        coef = beta * (vr - a * sk);
      }
      float o = 0.0f;
#pragma unroll
      for (int p = 0; p < P; ++p) {
#pragma unroll
        for (int e = 0; e < E; ++e) x[j][p][e] = fmaf(a, x[j][p][e], coef * kv[p][e]);
        o += dot_e<E>(x[j][p], qv[p]);
      }
      o = row_sum<LPR>(valid ? o : 0.0f);
      if (valid) {
#pragma unroll
        for (int p = 0; p < P; ++p)
          store_piece<F, DK>(hv, rows[j], T::col(lane, p), x[j][p], formats::RoundingMode::nearest_even, 0, 0);
        if (lane % LPR == 0) in.out[geo.hb * geo.dv + rows[j]] = o;
      }
    }
  }
}

// ================================ ReplaySSM standard decode ===================================
// A replay block serves NH value heads of one key head (NH * dv <= 256, NH divides the heads per
// key head): the key products are computed once for them, the NH states stream as one contiguous
// (NH*dv) x dk matrix (heads are adjacent in memory), and the record phase has one thread per
// (head, row). Blocks of a sequence that reaches h == L flush instead (replay the window from the
// HP checkpoint on chip, write HP and the LP copy).
struct ReplayArgs {
  DecodeShape shape;
  StepInputs in;
  int window;
  DeviceState hp, lp;
  bool split;
  formats::RoundingMode hp_mode;
  uint64_t seed;
  DeviceRecords rec;
  int heads_per_block;  // NH
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

__device__ __forceinline__ std::size_t ring_slot(const DeviceRecords& rec, int b, const WindowState& w, int p) {
  return static_cast<std::size_t>(b) * rec.capacity + (w.start + p) % rec.capacity;
}

// Dynamic shared memory of a replay block. `stage` is a union: non-flush blocks keep the NH heads'
// record vectors there; flush blocks keep the window's keys (fp32) and one head's vectors.
struct ReplayShared {
  float* stage;  // max(NH*L*dv, L*DK + L*dv)
  float* a;      // [NH][L] decays
  float* w;      // [NH][L] decay weights prod_{l>p} a_l
  float* beta;   // [L]  (flush, one head at a time)
  float* c1;     // [L]  key products k_p . q_t
  float* c2;     // [L]  k_p . k_t (GDN)
  float* rows1;  // [NH*dv] S q
  float* rows2;  // [NH*dv] S k (GDN)
  float* gamma;  // [NH]
  float* scratch;  // [kWarps]
};

__host__ __device__ inline std::size_t replay_stage_floats(int L, int DK, int dv, int NH) {
  const std::size_t a = static_cast<std::size_t>(NH) * L * dv, b = static_cast<std::size_t>(L) * (DK + dv);
  return a > b ? a : b;
}

__host__ __device__ inline std::size_t replay_shared_floats(int L, int DK, int dv, int NH) {
  return replay_stage_floats(L, DK, dv, NH) + 2 * static_cast<std::size_t>(NH) * L + 3 * L + 2 * NH * dv + NH + kWarps;
}

__device__ __forceinline__ ReplayShared carve_shared(float* base, int L, int DK, int dv, int NH) {
  ReplayShared s;
  s.stage = base;
  s.a = s.stage + replay_stage_floats(L, DK, dv, NH);
  s.w = s.a + NH * L;
  s.beta = s.w + NH * L;
  s.c1 = s.beta + L;
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

// Quantize row `row` of the LP copy with RTN (values x over the lane's fp32-geometry pieces).
// fp8b128 blocks are row chunks of 128 = 32 lanes x 4; nvfp4 blocks 16 = 4 lanes x 4 and need the
// tensor scale computed beforehand (`tensor`).
template <int DK, int P, int LPR>
__device__ __forceinline__ void store_lp_row(const HeadView& h, StorageFormat f, int row, int lane, const float (*x)[4],
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

// Rows per register group in the flush fold: x of this many row iterations stays in registers
// while the window's keys stream through in chunks of kKeyChunk (lane slices in registers).
constexpr int kFlushRowGroup = 8;
constexpr int kKeyChunk = 8;

// Flush of one value head (h == L after appending): S = REPLAY(S_ckpt^HP, B[1:L]) on chip, o = S q,
// write HP (RTN or SR) and the LP copy. Mamba-2 and shared GDN fold the records as a rank-h update
// (GDN: the cached u, then the current token as a conventional step); split GDN recomputes every u
// on the HP path from the raw records (Algorithm 3 for GDN). Expects sh.stage to hold the keys of
// positions [0, staged) as fp32 ([staged][DK]) and sh.stage + L*DK the head's record vectors.
template <SsmKind K, StorageFormat HP, int DK>
__device__ void replay_flush_head(const ReplayArgs& A, const BlockGeometry& bg, int n, const WindowState& win,
                                  const ReplayShared& sh, int staged, const float (*kv)[4], const float (*qv)[4]) {
  using T = Tile<StorageFormat::fp32, DK>;
  constexpr int E = 4, P = T::P, LPR = T::LPR, RW = T::RW;
  const int L = A.window, h0 = L - 1;
  const int head = bg.head0 + n, vh = bg.vh0 + n;
  const std::size_t hb = static_cast<std::size_t>(bg.b) * bg.H + head;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const HeadView hp = head_view(A.hp, hb, bg.dv, DK);
  const HeadView lp = A.split ? head_view(A.lp, hb, bg.dv, DK) : HeadView{};
  const bool recompute_u = K == SsmKind::gdn && A.split;
  const float* keys = sh.stage;
  const float* vals = sh.stage + static_cast<std::size_t>(L) * DK;  // [staged][dv]
  const float* w = sh.w + n * L;
  const float a_t = A.in.alpha[hb];
  const float beta_t = K == SsmKind::gdn ? A.in.beta[hb] : 0.0f;
  const float gamma = sh.gamma[n];
  const uint64_t hp_stream = sr_stream_device(bg.b, bg.g, vh, 0, win.flushes);
  const bool need_amax = A.split && A.lp.format == StorageFormat::nvfp4;
  float local_amax = 0.0f;
  const int iterations = (bg.dv + kWarps * RW - 1) / (kWarps * RW);
  for (int it0 = 0; it0 < iterations; it0 += kFlushRowGroup) {
    float x[kFlushRowGroup][P][E];
    int rows[kFlushRowGroup];
#pragma unroll
    for (int j = 0; j < kFlushRowGroup; ++j) {
      rows[j] = ((it0 + j) * kWarps + warp) * RW + T::row_in_iteration(lane);
#pragma unroll
      for (int p = 0; p < P; ++p) {
        if (rows[j] < bg.dv) load4<HP, DK>(hp, rows[j], T::col(lane, p), x[j][p]);
        else for (int e = 0; e < E; ++e) x[j][p][e] = 0.0f;
      }
    }
    if (!recompute_u) {
#pragma unroll
      for (int j = 0; j < kFlushRowGroup; ++j)
#pragma unroll
        for (int p = 0; p < P; ++p)
#pragma unroll
          for (int e = 0; e < E; ++e) x[j][p][e] *= gamma;
      for (int j0 = 0; j0 < staged; j0 += kKeyChunk) {
        float kc[kKeyChunk][P][E];
#pragma unroll
        for (int c = 0; c < kKeyChunk; ++c)
#pragma unroll
          for (int p = 0; p < P; ++p) {
            const float4 k4 = j0 + c < staged ? *reinterpret_cast<const float4*>(keys + (j0 + c) * DK + T::col(lane, p))
                                              : make_float4(0, 0, 0, 0);
            kc[c][p][0] = k4.x, kc[c][p][1] = k4.y, kc[c][p][2] = k4.z, kc[c][p][3] = k4.w;
          }
#pragma unroll
        for (int j = 0; j < kFlushRowGroup; ++j) {
          if (rows[j] >= bg.dv) continue;
#pragma unroll
          for (int c = 0; c < kKeyChunk; ++c) {
            if (j0 + c >= staged) break;
            const float coef = w[j0 + c] * vals[(j0 + c) * bg.dv + rows[j]];
#pragma unroll
            for (int p = 0; p < P; ++p)
#pragma unroll
              for (int e = 0; e < E; ++e) x[j][p][e] = fmaf(coef, kc[c][p][e], x[j][p][e]);
          }
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kFlushRowGroup; ++j) {
      const int row = rows[j];
      const bool valid = row < bg.dv;
      if (it0 + j >= iterations) break;  // uniform across the block
      if (recompute_u) {
        // GDN split: u_j^HP = b_j (v_j - a_j S_{j-1} k_j), sequentially from the HP checkpoint.
        for (int r = 0; r < staged; ++r) {
          float sk = 0.0f;
#pragma unroll
          for (int p = 0; p < P; ++p) {
            const float4 k4 = *reinterpret_cast<const float4*>(keys + r * DK + T::col(lane, p));
            sk += x[j][p][0] * k4.x + x[j][p][1] * k4.y + x[j][p][2] * k4.z + x[j][p][3] * k4.w;
          }
          sk = row_sum<LPR>(sk);
          const float ar = sh.a[n * L + r];
          const float u = valid ? sh.beta[r] * (vals[r * bg.dv + row] - ar * sk) : 0.0f;
#pragma unroll
          for (int p = 0; p < P; ++p) {
            const float4 k4 = *reinterpret_cast<const float4*>(keys + r * DK + T::col(lane, p));
            x[j][p][0] = fmaf(ar, x[j][p][0], u * k4.x);
            x[j][p][1] = fmaf(ar, x[j][p][1], u * k4.y);
            x[j][p][2] = fmaf(ar, x[j][p][2], u * k4.z);
            x[j][p][3] = fmaf(ar, x[j][p][3], u * k4.w);
          }
        }
      }
      if (K == SsmKind::gdn) {  // the current token, as a conventional GDN step from S_{t-1}
        float sk = 0.0f;
#pragma unroll
        for (int p = 0; p < P; ++p) sk += dot_e<E>(x[j][p], kv[p]);
        sk = row_sum<LPR>(sk);
        const float vr = valid ? __bfloat162float(A.in.v[hb * bg.dv + row]) : 0.0f;
        const float u = beta_t * (vr - a_t * sk);
#pragma unroll
        for (int p = 0; p < P; ++p)
#pragma unroll
          for (int e = 0; e < E; ++e) x[j][p][e] = fmaf(a_t, x[j][p][e], u * kv[p][e]);
        if (valid && lane % LPR == 0) A.rec.u[(ring_slot(A.rec, bg.b, win, h0) * bg.H + head) * bg.dv + row] = u;
      }
      float o = 0.0f;
#pragma unroll
      for (int p = 0; p < P; ++p) o += dot_e<E>(x[j][p], qv[p]);
      o = row_sum<LPR>(o);
      if (valid) {
        if (lane % LPR == 0) A.in.out[hb * bg.dv + row] = o;
#pragma unroll
        for (int p = 0; p < P; ++p) {
          store_piece<HP, DK>(hp, row, T::col(lane, p), x[j][p], A.hp_mode, A.seed, hp_stream);
          if (need_amax)
#pragma unroll
            for (int e = 0; e < E; ++e) {
              const float ax = fabsf(x[j][p][e]);
              if (ax < INFINITY && ax > local_amax) local_amax = ax;
            }
        }
      }
      if (A.split && !need_amax) store_lp_row<DK, P, LPR>(lp, A.lp.format, row, lane, x[j], valid, {});
    }
  }
  if (need_amax) {
    // NVFP4 LP copy: tensor scale from the block-wide amax, then re-read the HP rows this block
    // just wrote (fp32, L2-resident) and quantize them.
    const float amax = block_max(local_amax, sh.scratch);
    const formats::Nvfp4TensorScale ts = formats::nvfp4_tensor_scale(amax);
    if (threadIdx.x == 0) *lp.tensor_scale_out = ts.decode;
    __syncthreads();
    for (int it = 0; it < iterations; ++it) {
      const int row = (it * kWarps + warp) * RW + T::row_in_iteration(lane);
      const bool valid = row < bg.dv;
      float x[P][E];
#pragma unroll
      for (int p = 0; p < P; ++p) {
        if (valid) load4<HP, DK>(hp, row, T::col(lane, p), x[p]);
        else for (int e = 0; e < E; ++e) x[p][e] = 0.0f;
      }
      store_lp_row<DK, P, LPR>(lp, StorageFormat::nvfp4, row, lane, x, valid, ts);
    }
  }
}

template <SsmKind K, StorageFormat HP, int DK>
__device__ void replay_flush_block(const ReplayArgs& A, const BlockGeometry& bg, const WindowState& win, const ReplayShared& sh) {
  using T = Tile<StorageFormat::fp32, DK>;
  const int L = A.window, h0 = L - 1;
  const int lane = threadIdx.x % 32;
  const bool recompute_u = K == SsmKind::gdn && A.split;
  const int staged = K == SsmKind::mamba2 ? L : h0;  // Mamba-2 folds the current token too
  const __nv_bfloat16* k_t = A.in.k + (static_cast<std::size_t>(bg.b) * bg.G + bg.g) * DK;
  float kv[T::P][4], qv[T::P][4];
  load_lane_vector<4, T::P, T::LPR>(k_t, lane, kv);
  load_lane_vector<4, T::P, T::LPR>(A.in.q + (static_cast<std::size_t>(bg.b) * bg.G + bg.g) * DK, lane, qv);
  for (int idx = threadIdx.x; idx < staged * DK; idx += kThreads) {
    const int p = idx / DK, c = idx % DK;
    const __nv_bfloat16* kp = p == h0 ? k_t : A.rec.k + (ring_slot(A.rec, bg.b, win, p) * bg.G + bg.g) * DK;
    sh.stage[idx] = __bfloat162float(kp[c]);
  }
  float* vals = sh.stage + static_cast<std::size_t>(L) * DK;
  for (int n = 0; n < bg.NH; ++n) {
    const int head = bg.head0 + n;
    const std::size_t hb = static_cast<std::size_t>(bg.b) * bg.H + head;
    __syncthreads();  // previous head done with vals / w
    for (int idx = threadIdx.x; idx < staged * bg.dv; idx += kThreads) {
      const int p = idx / bg.dv, r = idx % bg.dv;
      const std::size_t slot = ring_slot(A.rec, bg.b, win, p);
      float val;
      if (K == SsmKind::mamba2)
        val = __bfloat162float(p == h0 ? A.in.v[hb * bg.dv + r] : A.rec.v[(slot * bg.H + head) * bg.dv + r]);
      else if (recompute_u)
        val = __bfloat162float(A.rec.v[(slot * bg.H + head) * bg.dv + r]);
      else
        val = A.rec.u[(slot * bg.H + head) * bg.dv + r];
      vals[idx] = val;
    }
    if (threadIdx.x < staged) {
      const int p = threadIdx.x;
      const std::size_t slot = ring_slot(A.rec, bg.b, win, p);
      sh.a[n * L + p] = p == h0 ? A.in.alpha[hb] : A.rec.alpha[slot * bg.H + head];
      sh.beta[p] = K == SsmKind::gdn ? A.rec.beta[slot * bg.H + head] : 0.0f;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float w = 1.0f;
      for (int p = staged - 1; p >= 0; --p) {
        sh.w[n * L + p] = w;
        w *= sh.a[n * L + p];
      }
      sh.gamma[n] = w;
    }
    __syncthreads();
    replay_flush_head<K, HP, DK>(A, bg, n, win, sh, staged, kv, qv);
  }
}

// Non-flush step of NH heads: output-only from the read checkpoint (LP when split, else HP).
//   Mamba-2: o = gamma (S q) + sum_{p<=h0} w_p (k_p . q) v_p
//   GDN:     S_{t-1}k, S_{t-1}q from (S k, S q) and the cached u; u_t = b (v - a S_{t-1}k);
//            o = a S_{t-1}q + u_t (k . q)
template <SsmKind K, StorageFormat R, int DK>
__device__ void replay_nonflush_block(const ReplayArgs& A, const BlockGeometry& bg, const WindowState& win,
                                      const ReplayShared& sh) {
  using T = Tile<R, DK>;
  constexpr int E = T::E, P = T::P, LPR = T::LPR, RW = T::RW;
  const int L = A.window, h0 = win.h;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int NH = bg.NH, dv = bg.dv;
  const __nv_bfloat16* k_t = A.in.k + (static_cast<std::size_t>(bg.b) * bg.G + bg.g) * DK;
  const __nv_bfloat16* q_t = A.in.q + (static_cast<std::size_t>(bg.b) * bg.G + bg.g) * DK;
  const int staged = K == SsmKind::mamba2 ? h0 + 1 : h0;
  // Stage the NH heads' record vectors and decays (independent loads, issued before the stream).
  float* vals = sh.stage;  // [NH][staged][dv]
  const int total = NH * staged * dv;
  for (int idx0 = threadIdx.x; idx0 < total; idx0 += 4 * kThreads) {
    float v4[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int idx = idx0 + j * kThreads;
      v4[j] = 0.0f;
      if (idx >= total) continue;
      const int n = idx / (staged * dv), rem = idx % (staged * dv), p = rem / dv, r = rem % dv;
      const std::size_t hb = static_cast<std::size_t>(bg.b) * bg.H + bg.head0 + n;
      if (K == SsmKind::mamba2)
        v4[j] = __bfloat162float(p == h0 ? A.in.v[hb * dv + r]
                                         : A.rec.v[(ring_slot(A.rec, bg.b, win, p) * bg.H + bg.head0 + n) * dv + r]);
      else
        v4[j] = A.rec.u[(ring_slot(A.rec, bg.b, win, p) * bg.H + bg.head0 + n) * dv + r];
    }
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (idx0 + j * kThreads < total) vals[idx0 + j * kThreads] = v4[j];
  }
  for (int idx = threadIdx.x; idx < NH * staged; idx += kThreads) {
    const int n = idx / staged, p = idx % staged;
    const std::size_t hb = static_cast<std::size_t>(bg.b) * bg.H + bg.head0 + n;
    sh.a[n * L + p] = p == h0 ? A.in.alpha[hb] : A.rec.alpha[ring_slot(A.rec, bg.b, win, p) * bg.H + bg.head0 + n];
  }
  // Key products, once for the NH heads: c1_p = k_p . q_t; GDN c2_p = k_p . k_t.
  for (int p = warp; p < staged; p += kWarps) {
    const __nv_bfloat16* kp = p == h0 ? k_t : A.rec.k + (ring_slot(A.rec, bg.b, win, p) * bg.G + bg.g) * DK;
    const float dq = warp_dot_bf16<DK>(kp, q_t, lane);
    const float dk = K == SsmKind::gdn ? warp_dot_bf16<DK>(kp, k_t, lane) : 0.0f;
    if (lane == 0) sh.c1[p] = dq, sh.c2[p] = dk;
  }
  // Stream the NH heads' read checkpoints as one (NH*dv) x dk matrix: rows1 = S q (rows2 = S k).
  constexpr int NV = K == SsmKind::gdn ? 2 : 1;
  float vecs[P][NV][E];  // lane slices of q (and k), piece-major as dot_piece takes them
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int col = T::col(lane, p);
#pragma unroll
    for (int e = 0; e < E; e += 4) {
      load_bf16x4(q_t + col + e, &vecs[p][0][e]);
      if constexpr (K == SsmKind::gdn) load_bf16x4(k_t + col + e, &vecs[p][NV - 1][e]);
    }
  }
  const DeviceState& read_state = A.split ? A.lp : A.hp;
  const std::size_t hb0 = static_cast<std::size_t>(bg.b) * bg.H + bg.head0;
  HeadView rv = head_view(read_state, hb0, dv, DK);  // NH adjacent heads: one tall matrix
  const int rows_total = NH * dv;
  constexpr int kBatch = 4;
  for (int it0 = 0; it0 * kWarps * RW < rows_total; it0 += kBatch) {
    float acc[kBatch][NV];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int row = ((it0 + j) * kWarps + warp) * RW + T::row_in_iteration(lane);
#pragma unroll
      for (int v = 0; v < NV; ++v) acc[j][v] = 0.0f;
      if (row < rows_total) {
        HeadView hv = rv;
        if constexpr (R == StorageFormat::nvfp4) hv.tensor_scale = read_state.tensor_scales[hb0 + row / dv];
#pragma unroll
        for (int p = 0; p < P; ++p) dot_piece<R, DK, NV>(hv, row, T::col(lane, p), vecs[p], acc[j]);
      }
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int row = ((it0 + j) * kWarps + warp) * RW + T::row_in_iteration(lane);
#pragma unroll
      for (int v = 0; v < NV; ++v) acc[j][v] = row_sum<LPR>(acc[j][v]);
      if (row < rows_total && lane % LPR == 0) {
        sh.rows1[row] = acc[j][0];
        if (K == SsmKind::gdn) sh.rows2[row] = acc[j][NV - 1];
      }
    }
  }
  __syncthreads();
  if (threadIdx.x < NH) {
    const int n = threadIdx.x;
    float w = 1.0f;
    for (int p = staged - 1; p >= 0; --p) {
      sh.w[n * L + p] = w;
      w *= sh.a[n * L + p];
    }
    sh.gamma[n] = w;
  }
  float kq_t = 0.0f;
  if (K == SsmKind::gdn) kq_t = warp_dot_bf16<DK>(k_t, q_t, lane);
  __syncthreads();
  // One thread per (head, row): fold the staged records.
  for (int idx = threadIdx.x; idx < rows_total; idx += kThreads) {
    const int n = idx / dv, r = idx % dv;
    const std::size_t hb = hb0 + n;
    const float* vn = vals + static_cast<std::size_t>(n) * staged * dv;
    const float* wn = sh.w + n * L;
    const float gamma = sh.gamma[n];
    if (K == SsmKind::mamba2) {
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
template <SsmKind K, StorageFormat R, int DK>
__global__ void __launch_bounds__(kThreads, 4) replay_nonflush_kernel(ReplayArgs A) {
  extern __shared__ float smem[];
  const BlockGeometry bg = block_geometry(A.shape, A.heads_per_block);
  const WindowState win = A.rec.window[A.rec.parity][bg.b];
  if (win.h + 1 == A.window) return;
  const ReplayShared sh = carve_shared(smem, A.window, DK, bg.dv, bg.NH);
  append_record(A, bg, win, DK, K == SsmKind::gdn);
  replay_nonflush_block<K, R, DK>(A, bg, win, sh);
}

template <SsmKind K, StorageFormat HP, int DK>
__global__ void __launch_bounds__(kThreads) replay_flush_kernel(ReplayArgs A) {
  extern __shared__ float smem[];
  const BlockGeometry bg = block_geometry(A.shape, A.heads_per_block);
  const WindowState win = A.rec.window[A.rec.parity][bg.b];
  const bool flush = win.h + 1 == A.window;
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    WindowState next = win;
    if (flush) {
      next.h = 0;
      next.start = (win.start + A.window) % A.rec.capacity;
      next.flushes = win.flushes + 1;
    } else {
      next.h = win.h + 1;
    }
    A.rec.window[1 - A.rec.parity][bg.b] = next;
  }
  if (!flush) return;
  const ReplayShared sh = carve_shared(smem, A.window, DK, bg.dv, bg.NH);
  append_record(A, bg, win, DK, K == SsmKind::gdn);
  replay_flush_block<K, HP, DK>(A, bg, win, sh);
}

// ================================ speculative verification ====================================
struct VerifyArgs {
  DecodeShape shape;
  StepInputs in;
  int window, drafts;
  DeviceState ckpt;
  DeviceRecords rec;
  int heads_per_block;
};

__host__ __device__ inline std::size_t align4(std::size_t floats) { return (floats + 3) / 4 * 4; }

__host__ __device__ inline std::size_t verify_shared_floats(int L, int T, int DK, int dv, int NH) {
  const int n = L + T;  // positions a verify step can see: h <= L committed (+ T drafts)
  return align4(static_cast<std::size_t>(NH) * n * dv)  // record vectors (v or u) per head
         + static_cast<std::size_t>(L) * DK          // committed keys (flush fold)
         + 2 * static_cast<std::size_t>(n) * T       // key products kq, kk
         + static_cast<std::size_t>(NH) * n * T      // decay weights per head
         + static_cast<std::size_t>(NH) * n          // decays
         + 2 * static_cast<std::size_t>(NH) * T      // d_s, beta_s
         + 2 * static_cast<std::size_t>(NH) * dv * T;  // S q_s, S k_s
}

// Output-only verification of T drafts for NH heads from an FP32 checkpoint (Algorithm 2; GDN: the
// UT transform, solved per row by forward substitution). A flush (h + T > L) folds the h committed
// records into the same streamed rows and writes them back.
template <SsmKind K, int DK, int TD>
__global__ void __launch_bounds__(kThreads) verify_kernel(VerifyArgs A) {
  using T = Tile<StorageFormat::fp32, DK>;
  constexpr int E = 4, P = T::P, LPR = T::LPR, RW = T::RW;
  extern __shared__ float smem[];
  const BlockGeometry bg = block_geometry(A.shape, A.heads_per_block);
  const int NH = bg.NH, dv = bg.dv;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const WindowState win = A.rec.window[A.rec.parity][bg.b];
  const int h = win.h, n = h + TD, NP = A.window + TD;
  const bool flush = h + TD > A.window;
  float* s_vals = smem;                                   // [NH][n][dv]
  float* s_keys = s_vals + align4(static_cast<std::size_t>(NH) * NP * dv);  // [h][DK], 16-byte aligned
  float* s_kq = s_keys + static_cast<std::size_t>(A.window) * DK;    // [n][TD]
  float* s_kk = s_kq + NP * TD;
  float* s_w = s_kk + NP * TD;                            // [NH][n][TD]
  float* s_a = s_w + NH * NP * TD;                        // [NH][n]
  float* s_d = s_a + NH * NP;                             // [NH][TD]
  float* s_beta = s_d + NH * TD;                          // [NH][TD]
  float* s_rows = s_beta + NH * TD;                       // [2][NH*dv][TD]
  const std::size_t hb0 = static_cast<std::size_t>(bg.b) * bg.H + bg.head0;
  auto draft_k = [&](int s) { return A.in.k + ((static_cast<std::size_t>(bg.b) * TD + s) * bg.G + bg.g) * DK; };
  auto draft_q = [&](int s) { return A.in.q + ((static_cast<std::size_t>(bg.b) * TD + s) * bg.G + bg.g) * DK; };
  auto key_at = [&](int p) { return p >= h ? draft_k(p - h) : A.rec.k + (ring_slot(A.rec, bg.b, win, p) * bg.G + bg.g) * DK; };
  auto in_head = [&](int s, int nn) { return (static_cast<std::size_t>(bg.b) * TD + s) * bg.H + bg.head0 + nn; };
  // Draft records after the committed ones (rejected ones are overwritten later).
  for (int s = 0; s < TD; ++s) {
    const std::size_t slot = ring_slot(A.rec, bg.b, win, h + s);
    if (bg.vh0 == 0)
      for (int c = threadIdx.x; c < DK; c += kThreads) A.rec.k[(slot * bg.G + bg.g) * DK + c] = draft_k(s)[c];
    for (int idx = threadIdx.x; idx < NH * dv; idx += kThreads)
      A.rec.v[(slot * bg.H + bg.head0) * dv + idx] = A.in.v[in_head(s, idx / dv) * dv + idx % dv];
    if (threadIdx.x < NH) {
      A.rec.alpha[slot * bg.H + bg.head0 + threadIdx.x] = A.in.alpha[in_head(s, threadIdx.x)];
      if (K == SsmKind::gdn) A.rec.beta[slot * bg.H + bg.head0 + threadIdx.x] = A.in.beta[in_head(s, threadIdx.x)];
    }
  }
  // Stage: committed record vectors (v or u), draft v (Mamba-2), decays, betas, committed keys.
  const int committed_vals = K == SsmKind::mamba2 ? n : h;
  for (int idx = threadIdx.x; idx < NH * committed_vals * dv; idx += kThreads) {
    const int nn = idx / (committed_vals * dv), rem = idx % (committed_vals * dv), p = rem / dv, r = rem % dv;
    float val;
    if (p >= h) val = __bfloat162float(A.in.v[in_head(p - h, nn) * dv + r]);
    else if (K == SsmKind::mamba2) val = __bfloat162float(A.rec.v[(ring_slot(A.rec, bg.b, win, p) * bg.H + bg.head0 + nn) * dv + r]);
    else val = A.rec.u[(ring_slot(A.rec, bg.b, win, p) * bg.H + bg.head0 + nn) * dv + r];
    s_vals[(static_cast<std::size_t>(nn) * NP + p) * dv + r] = val;
  }
  for (int idx = threadIdx.x; idx < NH * n; idx += kThreads) {
    const int nn = idx / n, p = idx % n;
    s_a[nn * NP + p] = p >= h ? A.in.alpha[in_head(p - h, nn)] : A.rec.alpha[ring_slot(A.rec, bg.b, win, p) * bg.H + bg.head0 + nn];
  }
  if (K == SsmKind::gdn)
    for (int idx = threadIdx.x; idx < NH * TD; idx += kThreads) s_beta[idx] = A.in.beta[in_head(idx % TD, idx / TD)];
  if (flush)
    for (int idx = threadIdx.x; idx < h * DK; idx += kThreads)
      s_keys[idx] = __bfloat162float(A.rec.k[(ring_slot(A.rec, bg.b, win, idx / DK) * bg.G + bg.g) * DK + idx % DK]);
  // Key products, once for the NH heads.
  for (int job = warp; job < n * TD; job += kWarps) {
    const int p = job / TD, s = job % TD;
    if (p > h + s) continue;
    const float dq = warp_dot_bf16<DK>(key_at(p), draft_q(s), lane);
    const float dk = K == SsmKind::gdn && p < h + s ? warp_dot_bf16<DK>(key_at(p), draft_k(s), lane) : 0.0f;
    if (lane == 0) s_kq[p * TD + s] = dq, s_kk[p * TD + s] = dk;
  }
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
  // One streaming read of the NH checkpoints: S q_s (and S k_s) for every draft.
  float qv[TD][P][E], kv[K == SsmKind::gdn ? TD : 1][P][E];
#pragma unroll
  for (int s = 0; s < TD; ++s)
#pragma unroll
    for (int p = 0; p < P; ++p) {
      load_bf16x4(draft_q(s) + T::col(lane, p), qv[s][p]);
      if constexpr (K == SsmKind::gdn) load_bf16x4(draft_k(s) + T::col(lane, p), kv[s][p]);
    }
  __syncthreads();
  const HeadView ck = head_view(A.ckpt, hb0, dv, DK);
  const int rows_total = NH * dv;
  for (int it = 0; it * kWarps * RW < rows_total; ++it) {
    const int row = (it * kWarps + warp) * RW + T::row_in_iteration(lane);
    const bool valid = row < rows_total;
    float x[P][E];
#pragma unroll
    for (int p = 0; p < P; ++p) {
      if (valid) load4<StorageFormat::fp32, DK>(ck, row, T::col(lane, p), x[p]);
      else for (int e = 0; e < E; ++e) x[p][e] = 0.0f;
    }
#pragma unroll
    for (int s = 0; s < TD; ++s) {
      float dq = 0.0f, dk = 0.0f;
#pragma unroll
      for (int p = 0; p < P; ++p) {
        dq += dot_e<E>(x[p], qv[s][p]);
        if constexpr (K == SsmKind::gdn) dk += dot_e<E>(x[p], kv[s][p]);
      }
      dq = row_sum<LPR>(dq);
      if constexpr (K == SsmKind::gdn) dk = row_sum<LPR>(dk);
      if (valid && lane % LPR == 0) {
        s_rows[row * TD + s] = dq;
        if (K == SsmKind::gdn) s_rows[(rows_total + row) * TD + s] = dk;
      }
    }
    if (flush && h > 0) {
      // S_new = gamma_h S + sum_{p<h} prod_{l=p+1}^{h-1} a_l  v_p k_p^T (Mamba-2: v; GDN: cached u).
      const int nn = valid ? row / dv : 0, r = row % dv;
      const float* an = s_a + nn * NP;
      float coef_w = 1.0f;
      float gamma_h = 1.0f;
      for (int p = 0; p < h; ++p) gamma_h *= an[p];
#pragma unroll
      for (int p = 0; p < P; ++p)
#pragma unroll
        for (int e = 0; e < E; ++e) x[p][e] *= gamma_h;
      for (int j = h - 1; j >= 0; --j) {
        const float vj = valid ? s_vals[(static_cast<std::size_t>(nn) * NP + j) * dv + r] : 0.0f;
#pragma unroll
        for (int p = 0; p < P; ++p) {
          const float4 k4 = *reinterpret_cast<const float4*>(s_keys + j * DK + T::col(lane, p));
          const float c = coef_w * vj;
          x[p][0] = fmaf(c, k4.x, x[p][0]);
          x[p][1] = fmaf(c, k4.y, x[p][1]);
          x[p][2] = fmaf(c, k4.z, x[p][2]);
          x[p][3] = fmaf(c, k4.w, x[p][3]);
        }
        coef_w *= an[j];
      }
      if (valid)
#pragma unroll
        for (int p = 0; p < P; ++p)
          store_piece<StorageFormat::fp32, DK>(ck, row, T::col(lane, p), x[p], formats::RoundingMode::nearest_even, 0, 0);
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
    if (K == SsmKind::gdn) {
#pragma unroll
      for (int s = 0; s < TD; ++s) {
        float sk = s_d[nn * TD + s] * s_rows[(rows_total + idx) * TD + s];
        for (int p = 0; p < h; ++p) sk = fmaf(wn[p * TD + s] * s_kk[p * TD + s], vn[p * dv + r], sk);
#pragma unroll
        for (int j = 0; j < s; ++j) sk = fmaf(wn[(h + j) * TD + s] * s_kk[(h + j) * TD + s], u_d[j], sk);
        const float vs = __bfloat162float(A.in.v[in_head(s, nn) * dv + r]);
        u_d[s] = s_beta[nn * TD + s] * (vs - sk);
      }
    }
#pragma unroll
    for (int s = 0; s < TD; ++s) {
      float o = s_d[nn * TD + s] * s_rows[idx * TD + s];
      const int committed = K == SsmKind::gdn ? h : h + s + 1;
      for (int p = 0; p < committed; ++p) o = fmaf(wn[p * TD + s] * s_kq[p * TD + s], vn[p * dv + r], o);
      if (K == SsmKind::gdn)
#pragma unroll
        for (int j = 0; j <= s; ++j) o = fmaf(wn[(h + j) * TD + s] * s_kq[(h + j) * TD + s], u_d[j], o);
      A.in.out[in_head(s, nn) * dv + r] = o;
    }
    if (K == SsmKind::gdn)
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
template <SsmKind K, int DK, int TD>
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
      if constexpr (K == SsmKind::gdn) {
        float sk = 0.0f;
#pragma unroll
        for (int p = 0; p < P; ++p) sk += dot_e<E>(x[p], kv[s][p]);
        sk = row_sum<LPR>(sk);
        coef = in.beta[ih] * (vr - a * sk);
      }
      float o = 0.0f;
#pragma unroll
      for (int p = 0; p < P; ++p) {
#pragma unroll
        for (int e = 0; e < E; ++e) x[p][e] = fmaf(a, x[p][e], coef * kv[s][p][e]);
        o += dot_e<E>(x[p], qv[s][p]);
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
    throw std::invalid_argument("decode kernels: unsupported shape (dk must be 64, 128 or 256; 1 <= dv <= 256; value "
                                "heads a multiple of key heads, at most 256 per key head); got dk=" +
                                std::to_string(s.dk) + " dv=" + std::to_string(s.dv));
}

// Value heads per replay/verify block: the largest divisor of the heads per key head with
// NH * dv <= 256 (one thread per (head, row) in the record phase).
int heads_per_block(const DecodeShape& s) {
  int best = 1;
  for (int nh = 1; nh <= s.heads_per_group(); ++nh)
    if (s.heads_per_group() % nh == 0 && nh * s.dv <= kThreads) best = nh;
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
void with_kind(SsmKind k, F&& f) {
  if (k == SsmKind::mamba2) f(std::integral_constant<SsmKind, SsmKind::mamba2>{});
  else f(std::integral_constant<SsmKind, SsmKind::gdn>{});
}

template <class F>
void with_drafts(int t, F&& f) {
  switch (t) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 8: f(std::integral_constant<int, 8>{}); break;
    default: throw std::invalid_argument("verification supports T in {1, 2, 4, 8}, got " + std::to_string(t));
  }
}

}  // namespace

void conventional_step(SsmKind kind, const DecodeShape& shape, const StepInputs& in, DeviceState state,
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

void replay_step(SsmKind kind, const DecodeShape& shape, const StepInputs& in, const ReplayConfig& config,
                 DeviceRecords& records, cudaStream_t stream) {
  check_shape(shape);
  if (config.window < 1 || config.window > kMaxWindow)
    throw std::invalid_argument("replay decode supports 1 <= L <= 64, got " + std::to_string(config.window));
  if (records.capacity < config.window) throw std::invalid_argument("record ring smaller than the window");
  const StorageFormat read = config.split() ? config.lp.format : config.hp.format;
  if (read == StorageFormat::fp8b128 && shape.dk % 128) throw std::invalid_argument("fp8b128 read needs dk % 128 == 0");
  // The NVFP4 LP copy needs the tensor amax before encoding; the flush re-reads the rows from the
  // HP checkpoint it just wrote, which holds S itself only when HP is fp32.
  if (config.split() && read == StorageFormat::nvfp4 && config.hp.format != StorageFormat::fp32)
    throw std::invalid_argument("an NVFP4 read checkpoint needs an fp32 recurrence checkpoint in the kernels");
  const int NH = heads_per_block(shape);
  ReplayArgs A{shape, in, config.window, config.hp, config.lp, config.split(),
               formats::element_rounding_mode(config.hp_rounding), config.seed, records, NH};
  const dim3 grid(shape.value_heads / NH, shape.batch);
  const std::size_t smem = sizeof(float) * replay_shared_floats(config.window, shape.dk, shape.dv, NH);
  with_kind(kind, [&](auto K) {
    with_dk(shape.dk, [&](auto DK) {
      auto launch = [&](auto kernel) {
        REPLAYSSM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
        kernel<<<grid, kThreads, smem, stream>>>(A);
        REPLAYSSM_CUDA_CHECK_LAUNCH();
      };
      switch (read) {
        case StorageFormat::fp32: launch(replay_nonflush_kernel<K(), StorageFormat::fp32, DK()>); break;
        case StorageFormat::fp16: launch(replay_nonflush_kernel<K(), StorageFormat::fp16, DK()>); break;
        case StorageFormat::bf16: launch(replay_nonflush_kernel<K(), StorageFormat::bf16, DK()>); break;
        case StorageFormat::fp8b128:
          if constexpr (DK() >= 128) launch(replay_nonflush_kernel<K(), StorageFormat::fp8b128, DK()>);
          break;
        case StorageFormat::nvfp4: launch(replay_nonflush_kernel<K(), StorageFormat::nvfp4, DK()>); break;
        default: throw std::invalid_argument("unsupported read checkpoint format");
      }
      // (Measured on the H200: one value head per flush block was slower than sharing the
      // non-flush geometry — the extra empty-block launch and the 16x key staging outweigh it.)
      if (config.hp.format == StorageFormat::fp32) launch(replay_flush_kernel<K(), StorageFormat::fp32, DK()>);
      else if (config.hp.format == StorageFormat::fp16) launch(replay_flush_kernel<K(), StorageFormat::fp16, DK()>);
      else throw std::invalid_argument("the recurrence checkpoint is fp32 or fp16");
    });
  });
  REPLAYSSM_CUDA_CHECK_LAUNCH();
  records.parity = 1 - records.parity;
}

void verify_step(SsmKind kind, const DecodeShape& shape, int drafts, const StepInputs& in, const ReplayConfig& config,
                 DeviceRecords& records, cudaStream_t stream) {
  check_shape(shape);
  if (config.split() || config.hp.format != StorageFormat::fp32)
    throw std::invalid_argument("verification kernels read an fp32 shared checkpoint");
  if (records.capacity < std::max(config.window, drafts) + drafts)
    throw std::invalid_argument("record ring needs capacity max(L, T) + T");
  const int NH = heads_per_block(shape);
  VerifyArgs A{shape, in, config.window, drafts, config.hp, records, NH};
  const dim3 grid(shape.value_heads / NH, shape.batch);
  const std::size_t smem = sizeof(float) * verify_shared_floats(config.window, drafts, shape.dk, shape.dv, NH);
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

void snapshot_verify_step(SsmKind kind, const DecodeShape& shape, int drafts, const StepInputs& in, const float* state,
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
