// Kernels of the GPU attention block (declared in attention_kernels.h): tiled causal attention
// with an online softmax in FP32 on the CUDA cores, q/k RMSNorm + partial RoPE, and Qwen3.5's
// output gate. The arithmetic mirrors src/model/attention.cpp step for step (same roundings
// where the CPU's order is fixed: the scale, the softmax rescaling, the per-tile accumulation,
// the normalisation, the RoPE rotation); only the order of the sums inside a dot product differs.
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "cuda_check.h"
#include "model/attention_kernels.h"

namespace replayssm::cuda::attention_kernels {
namespace {

// ---- causal attention -------------------------------------------------------------------------
// One block of 256 threads computes one query tile (64 positions) of one query head, looping over
// the key tiles 0..qb (tiles above the diagonal are skipped). Per key tile:
//   phase 1  S = Q K^T: four groups of 64 threads each sum a quarter of the dqk dimensions, each
//            thread an 8 x 8 block of S (register blocking: 16 shared loads per 64 FMAs), then
//            the four partial S are summed in a fixed order through shared memory;
//   softmax  each warp owns 8 rows (4 lanes a row): row max, p = exp(s - m), row sum, the
//            rescaling factor exp(m_old - m_new) (model::causal_attention's online softmax);
//   phase 2  T = P V, each thread an 8 x (dv/32) block; O = O * corr + T (the CPU's order).
// K and V tiles arrive by cp.async: V[kb] is fetched during phase 1, K[kb+1] during phase 2.
constexpr int kTile = 64;
constexpr int kThreads = 256;
constexpr int kPtLd = 72;                       // P^T row stride: conflict-free column writes
constexpr int kPartFloats = 4 * kTile * kTile;  // the four partial S tiles (alias the K tile)

__device__ __forceinline__ void cp_async16(float* smem, const float* gmem, bool valid) {
  const auto dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async4(float* smem, const float* gmem, bool valid) {
  const auto dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmem), "r"(valid ? 4 : 0) : "memory");
}
// Commits and waits for every cp.async this thread issued.
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// Calls f(row, col) for the cells tid, tid + 256, ... of a rows x cols grid (row-major order).
template <class F>
__device__ __forceinline__ void for_each_cell(int rows, int cols, F&& f) {
  int r = static_cast<int>(threadIdx.x) / cols, c = static_cast<int>(threadIdx.x) % cols;
  const int dr = kThreads / cols, dc = kThreads % cols;
  while (r < rows) {
    f(r, c);
    r += dr;
    c += dc;
    if (c >= cols) c -= cols, ++r;
  }
}

// Column swizzle of the partial-S tiles (64 x 64, row stride 64): the phase-1 writes (4 rows x
// 8 columns per warp instruction) and the softmax reads (8 rows x 4 columns) both hit 32 banks.
__device__ __forceinline__ int part_swizzle(int row) { return ((row & 3) << 3) | (row & 4); }

__device__ __forceinline__ float4 lds4(const float* p) { return *reinterpret_cast<const float4*>(p); }

// Shared memory of one block, in floats (the layout the kernel carves out).
constexpr std::size_t tile_floats(int dq_pad, int dv_pad) {
  const std::size_t qk = static_cast<std::size_t>(kTile) * (dq_pad + 4);
  return qk + (qk > kPartFloats ? qk : kPartFloats) + static_cast<std::size_t>(kTile) * dv_pad +
         static_cast<std::size_t>(kTile) * kPtLd + 2 * kTile;
}

template <int DV>
__global__ void __launch_bounds__(kThreads, 1)
    causal_attention_kernel(const CausalAttentionArgs a, const int dq_pad, const bool kv_vec) {
  constexpr int TC = DV / 32;  // output columns per thread in phase 2
  static_assert(DV == 64 || DV == 128 || DV == 256, "DV bucket");
  extern __shared__ float4 smem_f4[];
  const int ldqs = dq_pad + 4;  // == 4 (mod 32): the 4 or 8 rows one instruction reads hit distinct banks
  float* const qs = reinterpret_cast<float*>(smem_f4);
  float* const ks = qs + kTile * ldqs;  // K tile, then the partial S tiles
  float* const vs = ks + (kTile * ldqs > kPartFloats ? kTile * ldqs : kPartFloats);
  float* const pt = vs + kTile * DV;  // P^T: pt[key * kPtLd + row]
  float* const corr_s = pt + kTile * kPtLd;
  float* const l_s = corr_s + kTile;

  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int64_t n = a.positions;
  const int n_qt = static_cast<int>((n + kTile - 1) / kTile);
  // Longest query tiles (the last ones, most key tiles) first, for load balance.
  const int qb = n_qt - 1 - static_cast<int>(blockIdx.x) / a.num_heads;
  const int h = static_cast<int>(blockIdx.x) % a.num_heads;
  const int kvh = h / (a.num_heads / a.num_kv_heads);
  const int64_t q0 = static_cast<int64_t>(qb) * kTile;

  // Q tile, zero beyond dqk and n; ScaleAt::query scales it here (the CPU's qblk *= scale).
  {
    const float* const qh = a.q + h * a.q_head_stride;
    for_each_cell(kTile, dq_pad, [&](int r, int c) {
      float x = 0.0f;
      if (q0 + r < n && c < a.dqk) {
        x = qh[(q0 + r) * a.ldq + c];
        if (!a.scale_at_scores) x *= a.scale;
      }
      qs[r * ldqs + c] = x;
    });
  }
  const float* const kh = a.k + kvh * a.k_head_stride;
  const float* const vh = a.v + kvh * a.v_head_stride;
  // Zero-filled beyond n and beyond dqk / dv: padded keys then score 0 and carry v = 0 (masked
  // anyway), padded dimensions add nothing.
  auto load_k = [&](int kb) {
    const int64_t k0 = static_cast<int64_t>(kb) * kTile;
    if (kv_vec) {
      for_each_cell(kTile, dq_pad / 4, [&](int r, int c4) {
        const bool valid = k0 + r < n && 4 * c4 < a.dqk;
        cp_async16(ks + r * ldqs + 4 * c4, valid ? kh + (k0 + r) * a.ldk + 4 * c4 : kh, valid);
      });
    } else {
      for_each_cell(kTile, dq_pad, [&](int r, int c) {
        const bool valid = k0 + r < n && c < a.dqk;
        cp_async4(ks + r * ldqs + c, valid ? kh + (k0 + r) * a.ldk + c : kh, valid);
      });
    }
  };
  auto load_v = [&](int kb) {
    const int64_t k0 = static_cast<int64_t>(kb) * kTile;
    if (kv_vec) {
      for_each_cell(kTile, DV / 4, [&](int r, int c4) {
        const bool valid = k0 + r < n && 4 * c4 < a.dv;
        cp_async16(vs + r * DV + 4 * c4, valid ? vh + (k0 + r) * a.ldv + 4 * c4 : vh, valid);
      });
    } else {
      for_each_cell(kTile, DV, [&](int r, int c) {
        const bool valid = k0 + r < n && c < a.dv;
        cp_async4(vs + r * DV + c, valid ? vh + (k0 + r) * a.ldv + c : vh, valid);
      });
    }
  };

  // Lane roles. Phase 1 and 2: rows from lane bits 0 and 2, columns from bits 1, 3, 4, so that
  // lane pairs (n, n^2) share their row operand and (n, n^1) their column operand.
  const int rt = (lane & 1) | ((lane >> 1) & 2);
  const int ct = ((lane >> 1) & 1) | ((lane >> 2) & 6);
  const int group = warp >> 1, wg = warp & 1;  // phase 1: dimension quarter, row half
  const int wr = warp & 1, wc = warp >> 1;     // phase 2: row half, column quarter
  // Softmax: row sr of the tile, columns sx + 4m (m < 16).
  const int sr = warp * 8 + (lane >> 2), sx = lane & 3;
  const int64_t s_pos = q0 + sr;
  const int s_swz = part_swizzle(sr);
  float m_run = -INFINITY, l_run = 0.0f;

  auto out_row = [&](int i) { return wr * 32 + (i >> 2) * 16 + rt * 4 + (i & 3); };
  auto out_col = [&](int j) {
    return TC >= 4 ? wc * (DV / 4) + (j / 4) * 32 + ct * 4 + (j % 4) : wc * (DV / 4) + ct * 2 + j;
  };
  float o[8][TC];
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < TC; ++j) o[i][j] = 0.0f;

  load_k(0);
  for (int kb = 0; kb <= qb; ++kb) {
    cp_async_wait_all();
    __syncthreads();  // K[kb] (and Q) landed; V, P^T and corr_s are free again
    load_v(kb);

    // ---- phase 1: this group's share of S = Q K^T for rows wg*32 + rt + 4i, keys ct + 8j.
    float sp[8][8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j) sp[i][j] = 0.0f;
    {
      const int dg = dq_pad / 4;
      const float* const qp = qs + (wg * 32 + rt) * ldqs + group * dg;
      const float* const kp = ks + ct * ldqs + group * dg;
#pragma unroll 2
      for (int d = 0; d < dg; d += 4) {
        float4 qa[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) qa[i] = lds4(qp + 4 * i * ldqs + d);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float4 kv = lds4(kp + 8 * j * ldqs + d);
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            sp[i][j] = __fmaf_rn(qa[i].x, kv.x, sp[i][j]);
            sp[i][j] = __fmaf_rn(qa[i].y, kv.y, sp[i][j]);
            sp[i][j] = __fmaf_rn(qa[i].z, kv.z, sp[i][j]);
            sp[i][j] = __fmaf_rn(qa[i].w, kv.w, sp[i][j]);
          }
        }
      }
    }
    __syncthreads();  // every read of the K tile is done: its space takes the partial S tiles
    {
      float* const part = ks + group * (kTile * kTile);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int row = wg * 32 + rt + 4 * i;
        const int swz = part_swizzle(row);
#pragma unroll
        for (int j = 0; j < 8; ++j) part[row * kTile + ((ct + 8 * j) ^ swz)] = sp[i][j];
      }
    }
    __syncthreads();

    // ---- online softmax of row sr (model::causal_attention: m, corr, p, l).
    {
      const bool diagonal = kb == qb;
      const int64_t k0 = static_cast<int64_t>(kb) * kTile;
      float s[16];
      float tile_max = -INFINITY;
#pragma unroll
      for (int m = 0; m < 16; ++m) {
        const int c = sx + 4 * m;
        const int idx = sr * kTile + (c ^ s_swz);
        float x = ((ks[idx] + ks[kTile * kTile + idx]) + ks[2 * kTile * kTile + idx]) + ks[3 * kTile * kTile + idx];
        if (a.scale_at_scores) x *= a.scale;
        if (diagonal && k0 + c > s_pos) x = -INFINITY;  // causal: key position <= query position
        s[m] = x;
        tile_max = fmaxf(tile_max, x);
      }
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      // Finite: key k0 <= every query position of the tile is never masked.
      const float m_new = fmaxf(m_run, tile_max);
      const float corr = expf(m_run - m_new);  // 0 on the first tile (m_run = -inf)
      float row_sum = 0.0f;
#pragma unroll
      for (int m = 0; m < 16; ++m) {
        const float p = expf(s[m] - m_new);  // masked: exp(-inf) = 0
        pt[(sx + 4 * m) * kPtLd + sr] = p;
        row_sum += p;
      }
      row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 1);
      row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 2);
      l_run = l_run * corr + row_sum;
      m_run = m_new;
      if (sx == 0) corr_s[sr] = corr;
    }
    cp_async_wait_all();
    __syncthreads();  // P^T, corr_s and V[kb] visible; the partial S tiles are consumed
    if (kb < qb) load_k(kb + 1);

    // ---- phase 2: T = P V over this tile's 64 keys, then O = O * corr + T.
    {
      float t[8][TC];
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < TC; ++j) t[i][j] = 0.0f;
      const float* const pp = pt + wr * 32 + rt * 4;
#pragma unroll 4
      for (int key = 0; key < kTile; ++key) {
        const float4 p0 = lds4(pp + key * kPtLd), p1 = lds4(pp + key * kPtLd + 16);
        const float pa[8] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w};
        float vb[TC];
        const float* const vrow = vs + key * DV;
        if constexpr (TC >= 4) {
#pragma unroll
          for (int j4 = 0; j4 < TC / 4; ++j4) {
            const float4 x = lds4(vrow + out_col(4 * j4));
            vb[4 * j4] = x.x, vb[4 * j4 + 1] = x.y, vb[4 * j4 + 2] = x.z, vb[4 * j4 + 3] = x.w;
          }
        } else {
          const float2 x = *reinterpret_cast<const float2*>(vrow + out_col(0));
          vb[0] = x.x, vb[1] = x.y;
        }
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
          for (int j = 0; j < TC; ++j) t[i][j] = __fmaf_rn(pa[i], vb[j], t[i][j]);
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float c = corr_s[out_row(i)];
#pragma unroll
        for (int j = 0; j < TC; ++j) o[i][j] = o[i][j] * c + t[i][j];  // --fmad=false: two roundings, as the CPU
      }
    }
  }

  if (sx == 0) l_s[sr] = l_run;
  __syncthreads();
  float* const oh = a.out + h * a.o_head_stride;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int row = out_row(i);
    if (q0 + row >= n) continue;
    const float l = l_s[row];
    float* const orow = oh + (q0 + row) * a.ldo;
#pragma unroll
    for (int j = 0; j < TC; ++j) {
      const int col = out_col(j);
      if (col < a.dv) orow[col] = o[i][j] / l;
    }
  }
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

template <int DV>
void launch_tiles(const CausalAttentionArgs& a, cudaStream_t stream) {
  const int dq_pad = (a.dqk + 31) / 32 * 32;
  const std::size_t bytes = tile_floats(dq_pad, DV) * sizeof(float);
  int device = 0, optin = 0;
  REPLAYSSM_CUDA_CHECK(cudaGetDevice(&device));
  REPLAYSSM_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (bytes > static_cast<std::size_t>(optin))
    throw_invalid_argument("causal attention: the tiles of this head size need more shared memory per block than "
                           "this GPU allows",
                           "bytes", static_cast<long>(bytes), "limit", optin);
  REPLAYSSM_CUDA_CHECK(cudaFuncSetAttribute(causal_attention_kernel<DV>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(bytes)));
  // 16-byte copies when every K/V row chunk is 16-byte aligned, else 4-byte copies.
  const bool kv_vec = aligned16(a.k) && aligned16(a.v) && a.ldk % 4 == 0 && a.ldv % 4 == 0 &&
                      a.k_head_stride % 4 == 0 && a.v_head_stride % 4 == 0 && a.dqk % 4 == 0 && a.dv % 4 == 0;
  const int64_t blocks = (a.positions + kTile - 1) / kTile * a.num_heads;
  if (blocks > 0x7fffffff) throw_invalid_argument("causal attention: too many query tiles x heads", "blocks", blocks);
  causal_attention_kernel<DV><<<static_cast<unsigned>(blocks), kThreads, bytes, stream>>>(a, dq_pad, kv_vec);
  REPLAYSSM_CUDA_CHECK_LAUNCH();
}

// ---- q/k RMSNorm + RoPE: one warp per (row, head) -----------------------------------------------
constexpr int kMaxHeadDim = 256;

__global__ void qk_norm_rope_kernel(float* data, int64_t rows, int64_t ld, int num_heads, int64_t head_stride,
                                    int head_dim, const float* norm_weight, float eps, const float* rope_cos,
                                    const float* rope_sin, int rotary_dim) {
  __shared__ float staged[kThreads / 32][kMaxHeadDim];
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + warp;
  if (item >= rows * num_heads) return;  // whole warps only: no block-wide barrier below
  const int64_t t = item / num_heads;
  float* const x = data + t * ld + (item % num_heads) * head_stride;
  constexpr int kPerLane = kMaxHeadDim / 32;
  float val[kPerLane];
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int i = lane + 32 * e;
    val[e] = i < head_dim ? x[i] : 0.0f;
  }
  if (norm_weight) {
    // rms_norm_rows: the exact squares summed in double, mean rounded to float, then
    // (x * inv) * (1 + w) in float.
    double ss = 0.0;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) ss += static_cast<double>(val[e]) * val[e];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    const float mean = static_cast<float>(ss / head_dim);
    const float inv = 1.0f / sqrtf(mean + eps);
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) {
      const int i = lane + 32 * e;
      if (i < head_dim) val[e] = (val[e] * inv) * (1.0f + norm_weight[i]);
    }
  }
  if (rotary_dim > 0) {
    // Attention::forward's rotate: x0[i] = x1 c - x2 s, x0[i + half] = x2 c + x1 s (x1 = x0[i],
    // x2 = x0[i + half]), with the host's float cos/sin of t * inv_freq[i].
    float* const xs = staged[warp];
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) {
      const int i = lane + 32 * e;
      if (i < head_dim) xs[i] = val[e];
    }
    __syncwarp();
    const int half = rotary_dim / 2;
    const float* const c = rope_cos + t * half;
    const float* const s = rope_sin + t * half;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) {
      const int i = lane + 32 * e;
      if (i < half) {
        val[e] = xs[i] * c[i] + (-xs[i + half]) * s[i];
      } else if (i < rotary_dim) {
        const int p = i - half;
        val[e] = xs[i] * c[p] + xs[p] * s[p];
      }
    }
  }
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int i = lane + 32 * e;
    if (i < head_dim) x[i] = val[e];
  }
}

// ---- output gate: one thread per (row, d), heads in ascending order -------------------------------
// Head h writes column block h and reads blocks 2h and 2h + 1; block h (h >= 1) was read by head
// h / 2 < h in the same thread, so the in-place compaction never reads a value it overwrote.
__global__ void output_gate_compact_kernel(float* data, int64_t rows, int64_t ld, int num_heads, int head_dim) {
  const int64_t cell = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (cell >= rows * head_dim) return;
  float* const row = data + (cell / head_dim) * ld;
  const int d = static_cast<int>(cell % head_dim);
  for (int h = 0; h < num_heads; ++h) {
    const float att = row[2 * h * head_dim + d];
    const float g = row[(2 * h + 1) * head_dim + d];
    // model::sigmoid, 1 / (1 + exp(-g)) in float; exp rounded from double, as close to the
    // host's expf as a device function gets.
    const float e = static_cast<float>(exp(-static_cast<double>(g)));
    row[h * head_dim + d] = att * (1.0f / (1.0f + e));
  }
}

}  // namespace

void launch_causal_attention(const CausalAttentionArgs& args, cudaStream_t stream) {
  if (args.positions == 0) return;
  if (args.dv <= 64) {
    launch_tiles<64>(args, stream);
  } else if (args.dv <= 128) {
    launch_tiles<128>(args, stream);
  } else {
    launch_tiles<256>(args, stream);
  }
}

void launch_qk_norm_rope(float* data, int64_t rows, int64_t ld, int num_heads, int64_t head_stride, int head_dim,
                         const float* norm_weight, float eps, const float* rope_cos, const float* rope_sin,
                         int rotary_dim, cudaStream_t stream) {
  const int64_t items = rows * num_heads;
  if (items == 0 || (!norm_weight && rotary_dim == 0)) return;
  if (head_dim < 1 || head_dim > kMaxHeadDim || rotary_dim < 0 || rotary_dim % 2 || rotary_dim > head_dim)
    throw_invalid_argument("qk norm/RoPE: need 1 <= head_dim <= 256 and an even rotary_dim <= head_dim", "head_dim",
                           head_dim, "rotary_dim", rotary_dim);
  constexpr int warps = kThreads / 32;
  const int64_t blocks = (items + warps - 1) / warps;
  qk_norm_rope_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      data, rows, ld, num_heads, head_stride, head_dim, norm_weight, eps, rope_cos, rope_sin, rotary_dim);
  REPLAYSSM_CUDA_CHECK_LAUNCH();
}

void launch_output_gate_compact(float* data, int64_t rows, int64_t ld, int num_heads, int head_dim,
                                cudaStream_t stream) {
  const int64_t cells = rows * head_dim;
  if (cells == 0) return;
  const int64_t blocks = (cells + kThreads - 1) / kThreads;
  output_gate_compact_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(data, rows, ld, num_heads,
                                                                                      head_dim);
  REPLAYSSM_CUDA_CHECK_LAUNCH();
}

}  // namespace replayssm::cuda::attention_kernels
