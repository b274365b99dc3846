// The prior speculative state-recovery schemes of paper appendix A as kernels (prior_schemes.h has the
// contract and the reading chosen for each scheme). Written plainly, like the snapshot baseline
// (decode_snapshot.cu): one 256-thread block per (value head, sequence[, padded row]) streams its
// head's dv x dk FP32 state row by row; each row runs its serial recurrence chain in registers
// (rows are independent in Mamba-2 and GDN). No tuning beyond that: the comparison measures the
// traffic pattern and the serial chains.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "ssm/decode_common.cuh"
#include "ssm/prior_schemes.h"

namespace replayssm::cuda {

using formats::StorageFormat;
using namespace detail;
using namespace decode_detail;

namespace {

// ================================ launch plans (the traffic) ==================================
// What a launch streams per request: `rows` state rows read once each, `stores_per_row` states
// written per row. A chain launch stores after its replay (`mid`) and/or after its drafts (`end`);
// a copy reads one state and writes `stores_per_row` copies; the chunk scan only reads.
enum class LaunchKind : uint8_t { chain, chunk_scan, copy };
struct LaunchPlan {
  const char* kernel;
  bool after_verdict;
  LaunchKind kind;
  int rows;            // state rows per request (the joint launch pads each request to 2)
  int stores_per_row;  // chain: mid + end stores; copy: targets; chunk scan: 0
  int reads() const { return rows; }
  int writes() const { return rows * stores_per_row; }
};

std::vector<LaunchPlan> plans(PriorScheme s) {
  switch (s) {
    case PriorScheme::mamba_in_llama:
      return {{"fused replay of the accepted drafts + verify of the T new drafts (stores C and F)", false,
               LaunchKind::chain, 1, 2}};
    case PriorScheme::activation_replay:
      return {{"verify forward (W -> W)", false, LaunchKind::chain, 1, 1},
              {"recompute: replay the accepted drafts (C -> C)", true, LaunchKind::chain, 1, 1},
              {"copy C -> W", true, LaunchKind::copy, 1, 1}};
    case PriorScheme::joint_attainment:
      return {{"replicate C into the padded rows A and B", false, LaunchKind::copy, 1, 2},
              {"joint forward over 2B rows (A: attain + padding, B: attain + advance)", false, LaunchKind::chain, 2, 1}};
    case PriorScheme::stree:
      return {{"chunk-scan verification (reads C)", false, LaunchKind::chunk_scan, 1, 0},
              {"masked replay of the T drafts (C -> C)", true, LaunchKind::chain, 1, 1}};
  }
  throw std::invalid_argument("prior schemes: unknown scheme");
}

// mamba_in_llama: replayed drafts for the previous verdict a' (shared by kernel and chain count).
__host__ __device__ inline int mil_replay_count(int a, int T) { return a == T ? 0 : a; }

// ================================ row-chain kernel ============================================
// One state row of a (value head, sequence) in the lane geometry of Tile<fp32, DK>.
template <int DK>
__device__ __forceinline__ void load_row(const float* head, int row, bool valid, int lane,
                                         float (&x)[Tile<StorageFormat::fp32, DK>::P][4]) {
  using Tl = Tile<StorageFormat::fp32, DK>;
#pragma unroll
  for (int p = 0; p < Tl::P; ++p) {
    if (valid) {
      const float4 v = *reinterpret_cast<const float4*>(head + static_cast<std::size_t>(row) * DK + Tl::col(lane, p));
      x[p][0] = v.x, x[p][1] = v.y, x[p][2] = v.z, x[p][3] = v.w;
    } else {
      x[p][0] = x[p][1] = x[p][2] = x[p][3] = 0.0f;
    }
  }
}
template <int DK>
__device__ __forceinline__ void store_row(float* head, int row, int lane, const float (&x)[Tile<StorageFormat::fp32, DK>::P][4]) {
  using Tl = Tile<StorageFormat::fp32, DK>;
#pragma unroll
  for (int p = 0; p < Tl::P; ++p)
    *reinterpret_cast<float4*>(head + static_cast<std::size_t>(row) * DK + Tl::col(lane, p)) =
        make_float4(x[p][0], x[p][1], x[p][2], x[p][3]);
}
// Row dot with a staged fp32 vector (reduced over the LPR lanes of the row).
template <int DK>
__device__ __forceinline__ float row_dot(const float (&x)[Tile<StorageFormat::fp32, DK>::P][4], const float* vec, int lane) {
  using Tl = Tile<StorageFormat::fp32, DK>;
  float acc = 0.0f;
#pragma unroll
  for (int p = 0; p < Tl::P; ++p) {
    const float4 w = *reinterpret_cast<const float4*>(vec + Tl::col(lane, p));
    const float y[4] = {w.x, w.y, w.z, w.w};
    acc = dot_acc<4>(x[p], y, acc);
  }
  return row_sum<Tl::LPR>(acc);
}
// One step of conventional decode on one row (REPLAYSSM.md section 1): x <- alpha x + c k with
// c = v (Mamba-2) or c = beta (v - alpha x.k) (GDN), the arithmetic of the snapshot baseline. A
// masked step (apply = false) does the same work and leaves x unchanged: fma(1, x, 0 k) = x.
template <ssm::Recurrence K, int DK>
__device__ __forceinline__ void step_row(float (&x)[Tile<StorageFormat::fp32, DK>::P][4], const float* k, int lane,
                                         float alpha, float beta, float v, bool apply) {
  using Tl = Tile<StorageFormat::fp32, DK>;
  float kv[Tl::P][4];
#pragma unroll
  for (int p = 0; p < Tl::P; ++p) {
    const float4 w = *reinterpret_cast<const float4*>(k + Tl::col(lane, p));
    kv[p][0] = w.x, kv[p][1] = w.y, kv[p][2] = w.z, kv[p][3] = w.w;
  }
  float coef = v;
  if constexpr (K == ssm::Recurrence::gdn) {
    float sk = 0.0f;
#pragma unroll
    for (int p = 0; p < Tl::P; ++p) sk = dot_acc<4>(x[p], kv[p], sk);
    sk = row_sum<Tl::LPR>(sk);
    coef = beta * (v - alpha * sk);
  }
  const float a = apply ? alpha : 1.0f, c = apply ? coef : 0.0f;
#pragma unroll
  for (int p = 0; p < Tl::P; ++p)
#pragma unroll
    for (int e = 0; e < 4; ++e) x[p][e] = fmaf(a, x[p][e], c * kv[p][e]);
}

enum class Replay : uint8_t {
  none,         // no cached drafts replayed
  accepted,     // the first a cached drafts, exactly a steps
  mil,          // mamba_in_llama: mil_replay_count(a', T) cached drafts; a' = T starts from full_src
  masked_all,   // all T cached drafts, the mask s < a (STree's masked replay)
};
enum class Drafts : uint8_t {
  none,     // no draft phase
  verify,   // the T drafts of `in`, applied, each output written
  padding,  // T padding steps (masked: the row keeps its state), the joint launch's row A
};

struct ChainArgs {
  DecodeShape shape;
  StepInputs in;             // the T drafts being verified
  int T;
  const int* accepted;       // the verdict this launch recovers (per sequence), or null
  DraftCache replay_cache;   // the drafts being replayed (the previous verify step's)
  DraftCache keep_cache;     // where a verify row keeps the drafts of `in` (k == nullptr: not kept)
  Replay replay;
  const float* full_src;     // Replay::mil: F
  const float* src[2];       // per padded row (blockIdx.z): the state read
  float* mid[2];             // stored after the replay (or null)
  float* end[2];             // stored after the draft phase (or null)
  Drafts drafts[2];
};

// Shared memory: keys of up to 2T tokens (replayed + drafts), the T queries, decays and betas.
std::size_t chain_shared_bytes(int T, int dk) {
  return sizeof(float) * (3 * static_cast<std::size_t>(T) * dk + 4 * static_cast<std::size_t>(T));
}

// The drafts of `in` of this block's (sequence, head) into `cache` (the key by the group's first
// value head): the activation cache the schemes replay from after the verdict.
template <int DK>
__device__ void keep_drafts(const StepInputs& in, const DraftCache& cache, const Geometry& geo, int T, bool gdn) {
  const std::size_t b = geo.b;
  for (int i = threadIdx.x; i < T * geo.dv; i += kThreads) {
    const int s = i / geo.dv, r = i % geo.dv;
    const std::size_t at = ((b * T + s) * geo.H + geo.head) * geo.dv + r;
    cache.v[at] = in.v[at];
  }
  for (int s = threadIdx.x; s < T; s += kThreads) {
    const std::size_t at = (b * T + s) * geo.H + geo.head;
    cache.alpha[at] = in.alpha[at];
    if (gdn) cache.beta[at] = in.beta[at];
  }
  if (geo.vh == 0)
    for (int i = threadIdx.x; i < T * DK / 2; i += kThreads) {
      const int s = i / (DK / 2), c = i % (DK / 2);
      const std::size_t at = ((b * T + s) * geo.G + geo.g) * DK;
      reinterpret_cast<__nv_bfloat162*>(cache.k + at)[c] = reinterpret_cast<const __nv_bfloat162*>(in.k + at)[c];
    }
}

// The row-chain kernel every sequential launch of the schemes is an instance of (the launchers
// below say which). Block (head, sequence, padded row z): stage the keys of the replayed cached
// drafts and of the T drafts (and their queries) as floats; then per state row: read it from src
// (or full_src), run the replay steps, store to mid, run the draft steps (outputs), store to end.
template <ssm::Recurrence K, int DK>
__global__ void __launch_bounds__(kThreads) chain_kernel(ChainArgs A) {
  using Tl = Tile<StorageFormat::fp32, DK>;
  constexpr int P = Tl::P, LPR = Tl::LPR, RW = Tl::RW;
  constexpr bool kGdn = K == ssm::Recurrence::gdn;
  extern __shared__ float smem[];
  const Geometry geo = geometry(A.shape);
  const int z = blockIdx.z, T = A.T, lane = threadIdx.x % 32, warp = threadIdx.x / 32, dv = geo.dv;
  const std::size_t b = geo.b;
  const int a = A.accepted ? A.accepted[b] : 0;
  if (a < 0 || a > T) __trap();  // the verdict is in [0, T] (0: no previous verify step)
  const bool from_full = A.replay == Replay::mil && a == T;
  const int n_replay = A.replay == Replay::none ? 0
                       : A.replay == Replay::mil ? mil_replay_count(a, T)
                       : A.replay == Replay::masked_all ? T
                                                        : a;
  const int n_applied = A.replay == Replay::masked_all ? a : n_replay;
  const Drafts mode = A.drafts[z];
  const int n_drafts = mode == Drafts::none ? 0 : T;
  float* s_k = smem;              // [n_replay + n_drafts][DK]
  float* s_q = s_k + 2 * T * DK;  // [T][DK]
  float* s_a = s_q + T * DK;      // [2T]
  float* s_b = s_a + 2 * T;       // [2T]
  auto token = [&](int i) { return i < n_replay ? i : i - n_replay; };  // index within its step's T
  for (int i2 = threadIdx.x; i2 < (n_replay + n_drafts) * DK / 2; i2 += kThreads) {
    const int i = i2 / (DK / 2), c = i2 % (DK / 2);
    const __nv_bfloat16* base = i < n_replay ? A.replay_cache.k : A.in.k;
    const std::size_t at = ((b * T + token(i)) * geo.G + geo.g) * DK;
    reinterpret_cast<float2*>(s_k + i * DK)[c] = __bfloat1622float2(reinterpret_cast<const __nv_bfloat162*>(base + at)[c]);
  }
  if (mode == Drafts::verify)
    for (int i2 = threadIdx.x; i2 < T * DK / 2; i2 += kThreads) {
      const int s = i2 / (DK / 2), c = i2 % (DK / 2);
      const std::size_t at = ((b * T + s) * geo.G + geo.g) * DK;
      reinterpret_cast<float2*>(s_q + s * DK)[c] = __bfloat1622float2(reinterpret_cast<const __nv_bfloat162*>(A.in.q + at)[c]);
    }
  for (int i = threadIdx.x; i < n_replay + n_drafts; i += kThreads) {
    const std::size_t at = (b * T + token(i)) * geo.H + geo.head;
    s_a[i] = i < n_replay ? A.replay_cache.alpha[at] : A.in.alpha[at];
    s_b[i] = kGdn ? (i < n_replay ? A.replay_cache.beta[at] : A.in.beta[at]) : 0.0f;
  }
  if (mode == Drafts::verify && A.keep_cache.k) keep_drafts<DK>(A.in, A.keep_cache, geo, T, kGdn);
  __syncthreads();
  const std::size_t off = geo.hb * dv * DK;
  const float* src = (from_full ? A.full_src : A.src[z]) + off;
  float* mid = A.mid[z] ? A.mid[z] + off : nullptr;
  float* end = A.end[z] ? A.end[z] + off : nullptr;
  auto value = [&](int i, int row) {  // v of token i for this head, row `row`
    const __nv_bfloat16* base = i < n_replay ? A.replay_cache.v : A.in.v;
    return __bfloat162float(base[((b * T + token(i)) * geo.H + geo.head) * dv + row]);
  };
  for (int it = 0; it * kWarps * RW < dv; ++it) {
    const int row = (it * kWarps + warp) * RW + Tl::row_in_iteration(lane);
    const bool valid = row < dv;
    float x[P][4];
    load_row<DK>(src, row, valid, lane, x);
    for (int j = 0; j < n_replay; ++j)
      step_row<K, DK>(x, s_k + j * DK, lane, s_a[j], s_b[j], valid ? value(j, row) : 0.0f, j < n_applied);
    if (mid && valid) store_row<DK>(mid, row, lane, x);
    for (int s = 0; s < n_drafts; ++s) {
      const int i = n_replay + s;
      step_row<K, DK>(x, s_k + i * DK, lane, s_a[i], s_b[i], valid ? value(i, row) : 0.0f, mode == Drafts::verify);
      if (mode == Drafts::verify) {
        const float o = row_dot<DK>(x, s_q + s * DK, lane);
        if (valid && lane % LPR == 0) A.in.out[((b * T + s) * geo.H + geo.head) * dv + row] = o;
      }
    }
    if (end && valid) store_row<DK>(end, row, lane, x);
  }
}

// ================================ STree chunk-scan verification ==============================
// Outputs of the T drafts from C in the parallel (chunk) form, no state materialised or written
// (REPLAYSSM.md section 2 with h = 0): o_s = g_s C q_s + sum_{j<=s} g_{j+1:s} u_j (k_j . q_s),
// g_{i:s} = prod_{l=i..s} alpha_l; Mamba-2 u_j = v_j; GDN u_s = beta_s (v_s - g_s C k_s -
// sum_{j<s} g_{j+1:s} u_j (k_j . k_s)) by forward substitution (the unit-triangular solve). One read
// of C gives C q_s and C k_s for every draft; the key products are computed once per block.
struct ChunkArgs {
  DecodeShape shape;
  StepInputs in;
  int T;
  const float* state;
  DraftCache keep_cache;
};

std::size_t chunk_shared_bytes(int T, int dk, int dv) {
  return sizeof(float) * (2 * static_cast<std::size_t>(T) * dk + 2 * static_cast<std::size_t>(T) * dv +
                          2 * static_cast<std::size_t>(T) * T + 2 * static_cast<std::size_t>(T));
}

template <ssm::Recurrence K, int DK>
__global__ void __launch_bounds__(kThreads) chunk_scan_kernel(ChunkArgs A) {
  using Tl = Tile<StorageFormat::fp32, DK>;
  constexpr int P = Tl::P, LPR = Tl::LPR, RW = Tl::RW;
  constexpr bool kGdn = K == ssm::Recurrence::gdn;
  extern __shared__ float smem[];
  const Geometry geo = geometry(A.shape);
  const int T = A.T, lane = threadIdx.x % 32, warp = threadIdx.x / 32, dv = geo.dv;
  const std::size_t b = geo.b;
  float* s_k = smem;                // [T][DK]
  float* s_q = s_k + T * DK;        // [T][DK]
  float* s_cq = s_q + T * DK;       // [T][dv]: (C q_s)_r
  float* s_ck = s_cq + T * dv;      // [T][dv]: (C k_s)_r (GDN)
  float* s_kq = s_ck + T * dv;      // [T][T]: k_j . q_s
  float* s_kk = s_kq + T * T;       // [T][T]: k_j . k_s
  float* s_a = s_kk + T * T;        // [T]
  float* s_b = s_a + T;             // [T]
  for (int i2 = threadIdx.x; i2 < T * DK / 2; i2 += kThreads) {
    const int s = i2 / (DK / 2), c = i2 % (DK / 2);
    const std::size_t at = ((b * T + s) * geo.G + geo.g) * DK;
    reinterpret_cast<float2*>(s_k + s * DK)[c] = __bfloat1622float2(reinterpret_cast<const __nv_bfloat162*>(A.in.k + at)[c]);
    reinterpret_cast<float2*>(s_q + s * DK)[c] = __bfloat1622float2(reinterpret_cast<const __nv_bfloat162*>(A.in.q + at)[c]);
  }
  for (int s = threadIdx.x; s < T; s += kThreads) {
    const std::size_t at = (b * T + s) * geo.H + geo.head;
    s_a[s] = A.in.alpha[at];
    s_b[s] = kGdn ? A.in.beta[at] : 0.0f;
  }
  if (A.keep_cache.k) keep_drafts<DK>(A.in, A.keep_cache, geo, T, kGdn);
  __syncthreads();
  // Key products, one warp per (j, s) pair.
  for (int pair = warp; pair < 2 * T * T; pair += kWarps) {
    const int which = pair / (T * T), j = pair / T % T, s = pair % T;
    const float* y = which == 0 ? s_q : s_k;
    float acc = 0.0f;
    for (int c = lane; c < DK; c += 32) acc = fmaf(s_k[j * DK + c], y[s * DK + c], acc);
    acc = row_sum<32>(acc);
    if (lane == 0) (which == 0 ? s_kq : s_kk)[j * T + s] = acc;
  }
  // One read of C: C q_s and C k_s per row.
  const float* head = A.state + geo.hb * dv * DK;
  for (int it = 0; it * kWarps * RW < dv; ++it) {
    const int row = (it * kWarps + warp) * RW + Tl::row_in_iteration(lane);
    const bool valid = row < dv;
    float x[P][4];
    load_row<DK>(head, row, valid, lane, x);
    for (int s = 0; s < T; ++s) {
      const float cq = row_dot<DK>(x, s_q + s * DK, lane);
      const float ck = kGdn ? row_dot<DK>(x, s_k + s * DK, lane) : 0.0f;
      if (valid && lane % LPR == 0) s_cq[s * dv + row] = cq, s_ck[s * dv + row] = ck;
    }
  }
  __syncthreads();
  // One thread per row: corrections (GDN) and outputs, position by position.
  for (int r = threadIdx.x; r < dv; r += kThreads) {
    float u[kMaxPriorDrafts];
    for (int s = 0; s < T; ++s) {
      const float v = __bfloat162float(A.in.v[((b * T + s) * geo.H + geo.head) * dv + r]);
      // g_{j+1:s} for j = s-1 .. 0 as a running product; after the loop w = g_{1:s}.
      if constexpr (kGdn) {
        float w = s_a[s], acc = 0.0f;
        for (int j = s - 1; j >= 0; --j) {
          acc = fmaf(w * s_kk[j * T + s], u[j], acc);
          w *= s_a[j];
        }
        u[s] = s_b[s] * (v - (w * s_ck[s * dv + r] + acc));
      } else {
        u[s] = v;
      }
      float w = 1.0f, o = 0.0f;
      for (int j = s; j >= 0; --j) {
        o = fmaf(w * s_kq[j * T + s], u[j], o);
        w *= s_a[j];
      }
      o = fmaf(w, s_cq[s * dv + r], o);
      A.in.out[((b * T + s) * geo.H + geo.head) * dv + r] = o;
    }
  }
}

// ================================ copy ========================================================
// dst[0..W) <- src, FP32 states as float4 (grid-stride): one state read, W states written.
template <int W>
__global__ void __launch_bounds__(kThreads) state_copy_kernel(const float4* src, float4* dst0, float4* dst1, std::size_t n4) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n4;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float4 v = src[i];
    dst0[i] = v;
    if constexpr (W == 2) dst1[i] = v;
  }
}

// ================================ launchers ===================================================
void check_plan(const LaunchPlan& plan, LaunchKind kind, int rows, int stores_per_row) {
  // The counts prior_scheme_launches reports must be what the launch does.
  if (plan.kind != kind || plan.rows != rows || plan.stores_per_row != stores_per_row)
    throw std::logic_error(std::string("prior schemes: launch '") + plan.kernel + "' configured unlike its plan");
}

void launch_chain(ssm::Recurrence kind, const LaunchPlan& plan, const ChainArgs& A, cudaStream_t stream) {
  const int rows = A.drafts[1] == Drafts::none && A.src[1] == nullptr ? 1 : 2;
  int stores = 0;
  for (int z = 0; z < rows; ++z) stores += (A.mid[z] != nullptr) + (A.end[z] != nullptr);
  if (stores % rows != 0) throw std::logic_error("prior schemes: rows of a chain launch store unequally");
  check_plan(plan, LaunchKind::chain, rows, stores / rows);
  const dim3 grid(A.shape.value_heads, A.shape.batch, rows);
  const std::size_t smem = chain_shared_bytes(A.T, A.shape.dk);
  with_kind(kind, [&](auto K) {
    with_dk(A.shape.dk, [&](auto DK) {
      auto kernel = chain_kernel<K(), DK()>;
      REPLAYSSM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
      kernel<<<grid, kThreads, smem, stream>>>(A);
    });
  });
  REPLAYSSM_CUDA_CHECK_LAUNCH();
}

void launch_copy(const LaunchPlan& plan, const DecodeShape& s, const float* src, float* dst0, float* dst1, cudaStream_t stream) {
  check_plan(plan, LaunchKind::copy, 1, dst1 ? 2 : 1);
  const std::size_t n4 = s.heads() * s.head_elements() / 4;  // dk is a multiple of 64
  const int blocks = static_cast<int>(std::min<std::size_t>((n4 + kThreads - 1) / kThreads, 8L * sm_count()));
  const auto* in = reinterpret_cast<const float4*>(src);
  if (dst1)
    state_copy_kernel<2><<<blocks, kThreads, 0, stream>>>(in, reinterpret_cast<float4*>(dst0), reinterpret_cast<float4*>(dst1), n4);
  else
    state_copy_kernel<1><<<blocks, kThreads, 0, stream>>>(in, reinterpret_cast<float4*>(dst0), nullptr, n4);
  REPLAYSSM_CUDA_CHECK_LAUNCH();
}

void launch_chunk_scan(ssm::Recurrence kind, const LaunchPlan& plan, const ChunkArgs& A, cudaStream_t stream) {
  check_plan(plan, LaunchKind::chunk_scan, 1, 0);
  const dim3 grid(A.shape.value_heads, A.shape.batch);
  const std::size_t smem = chunk_shared_bytes(A.T, A.shape.dk, A.shape.dv);
  with_kind(kind, [&](auto K) {
    with_dk(A.shape.dk, [&](auto DK) {
      auto kernel = chunk_scan_kernel<K(), DK()>;
      REPLAYSSM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
      kernel<<<grid, kThreads, smem, stream>>>(A);
    });
  });
  REPLAYSSM_CUDA_CHECK_LAUNCH();
}

void check_common(PriorScheme scheme, ssm::Recurrence kind, const DecodeShape& shape, const PriorBuffers& buf) {
  check_shape(shape);
  if (kind != ssm::Recurrence::mamba2 && kind != ssm::Recurrence::gdn)
    throw std::invalid_argument("prior schemes: recurrence kda is not implemented on the GPU (mamba2, gdn)");
  if (buf.drafts < 1 || buf.drafts > kMaxPriorDrafts)
    throw_invalid_argument("prior schemes: PriorBuffers::drafts (T) must be in [1, 8]", "T", buf.drafts);
  const int needed = prior_state_buffers(scheme);
  for (int i = 0; i < needed; ++i)
    if (!buf.state[i])
      throw_invalid_argument("prior schemes: PriorBuffers::state[i] is null (the scheme needs that many full-state buffers)",
                             "i", i, "needed", needed);
  for (int c = 0; c < 2; ++c) {
    const DraftCache& d = buf.cache[c];
    if (!d.k || !d.v || !d.alpha || (kind == ssm::Recurrence::gdn && !d.beta))
      throw_invalid_argument("prior schemes: PriorBuffers::cache[c] needs k, v, alpha (and beta for GDN)", "c", c);
  }
  if (buf.parity != 0 && buf.parity != 1)
    throw_invalid_argument("prior schemes: PriorBuffers::parity must be 0 or 1", "parity", buf.parity);
  if (buf.rotation != 0 && buf.rotation != 1)
    throw_invalid_argument("prior schemes: PriorBuffers::rotation must be 0 or 1", "rotation", buf.rotation);
}

void check_inputs(ssm::Recurrence kind, const StepInputs& in) {
  if (!in.q || !in.k || !in.v || !in.alpha || !in.out || (kind == ssm::Recurrence::gdn && !in.beta))
    throw std::invalid_argument("prior schemes: StepInputs needs q, k, v, alpha, out (and beta for GDN)");
}

ChainArgs chain_args(const DecodeShape& shape, const StepInputs& in, const PriorBuffers& buf) {
  ChainArgs A{};
  A.shape = shape;
  A.in = in;
  A.T = buf.drafts;
  A.replay_cache = buf.cache[buf.parity];
  A.replay = Replay::none;
  A.drafts[0] = A.drafts[1] = Drafts::none;
  return A;
}

}  // namespace

std::string_view to_string(PriorScheme s) {
  switch (s) {
    case PriorScheme::mamba_in_llama: return "The Mamba in the Llama";
    case PriorScheme::activation_replay: return "Snakes and Ladders, activation replay";
    case PriorScheme::joint_attainment: return "Snakes and Ladders, joint attainment";
    case PriorScheme::stree: return "STree, algorithm";
  }
  return "?";
}

std::string_view scheme_key(PriorScheme s) {
  switch (s) {
    case PriorScheme::mamba_in_llama: return "mil";
    case PriorScheme::activation_replay: return "snakes-ar";
    case PriorScheme::joint_attainment: return "snakes-ja";
    case PriorScheme::stree: return "stree";
  }
  return "?";
}

std::vector<PriorLaunch> prior_scheme_launches(PriorScheme s) {
  std::vector<PriorLaunch> out;
  for (const LaunchPlan& p : plans(s)) out.push_back({p.kernel, p.after_verdict, p.reads(), p.writes()});
  return out;
}

PriorTraffic prior_scheme_traffic(PriorScheme s) {
  PriorTraffic t;
  for (const LaunchPlan& p : plans(s)) t.state_reads += p.reads(), t.state_writes += p.writes();
  return t;
}

int prior_scheme_chain_steps(PriorScheme s, int drafts, int accepted) {
  if (drafts < 1 || drafts > kMaxPriorDrafts) throw_invalid_argument("prior schemes: T must be in [1, 8]", "T", drafts);
  if (accepted < 1 || accepted > drafts)
    throw_invalid_argument("prior schemes: accepted length a must be in [1, T]", "a", accepted, "T", drafts);
  switch (s) {
    case PriorScheme::mamba_in_llama: return mil_replay_count(accepted, drafts) + drafts;  // one fused chain
    case PriorScheme::activation_replay: return drafts + accepted;  // verify chain, then the recompute's
    case PriorScheme::joint_attainment: return accepted + drafts;   // both rows padded to a + T
    case PriorScheme::stree: return drafts;                         // masked replay (the chunk scan has no chain)
  }
  return 0;
}

bool prior_recovery_lags(PriorScheme s) {
  return s == PriorScheme::mamba_in_llama || s == PriorScheme::joint_attainment;
}

int prior_state_buffers(PriorScheme s) {
  switch (s) {
    case PriorScheme::mamba_in_llama: return 2;
    case PriorScheme::activation_replay: return 2;
    case PriorScheme::joint_attainment: return 3;
    case PriorScheme::stree: return 1;
  }
  return 0;
}

const float* prior_committed_state(PriorScheme scheme, const PriorBuffers& buffers) {
  return scheme == PriorScheme::joint_attainment ? buffers.state[buffers.rotation] : buffers.state[0];
}

void prior_verify_step(PriorScheme scheme, ssm::Recurrence kind, const DecodeShape& shape, const StepInputs& in,
                       const int* prev_accepted, PriorBuffers& buf, cudaStream_t stream) {
  check_common(scheme, kind, shape, buf);
  check_inputs(kind, in);
  if (prior_recovery_lags(scheme) && !prev_accepted)
    throw std::invalid_argument("prior schemes: prev_accepted is null (mamba_in_llama and joint_attainment recover the "
                                "previous verdict in the verify step; pass zeros before the first verdict)");
  const std::vector<LaunchPlan> p = plans(scheme);
  const DraftCache keep = buf.cache[1 - buf.parity];
  switch (scheme) {
    case PriorScheme::mamba_in_llama: {
      // One fused launch: read C (or F when a' = T), replay the a' accepted cached drafts, store C,
      // run the T drafts (outputs), store F; keep the drafts for the next verdict.
      ChainArgs A = chain_args(shape, in, buf);
      A.accepted = prev_accepted;
      A.replay = Replay::mil;
      A.full_src = buf.state[1];
      A.src[0] = buf.state[0];
      A.mid[0] = buf.state[0];
      A.end[0] = buf.state[1];
      A.drafts[0] = Drafts::verify;
      A.keep_cache = keep;
      launch_chain(kind, p[0], A, stream);
      break;
    }
    case PriorScheme::activation_replay: {
      // The verification forward: read W, run the T drafts (outputs), store W in place (the stock
      // forward's final-state write); keep the drafts (the activation cache).
      ChainArgs A = chain_args(shape, in, buf);
      A.src[0] = buf.state[1];
      A.end[0] = buf.state[1];
      A.drafts[0] = Drafts::verify;
      A.keep_cache = keep;
      launch_chain(kind, p[0], A, stream);
      break;
    }
    case PriorScheme::joint_attainment: {
      float* c = buf.state[buf.rotation];
      float* row_a = buf.state[1 - buf.rotation];
      float* row_b = buf.state[2];
      // C replicated into the request's two padded rows, then one joint launch over 2B rows:
      // A = attain (replay the a' accepted drafts, then T padding steps), B = attain + advance
      // (replay them, then the T drafts with outputs); both rows stored back.
      launch_copy(p[0], shape, c, row_a, row_b, stream);
      ChainArgs A = chain_args(shape, in, buf);
      A.accepted = prev_accepted;
      A.replay = Replay::accepted;
      A.src[0] = row_a, A.end[0] = row_a, A.drafts[0] = Drafts::padding;
      A.src[1] = row_b, A.end[1] = row_b, A.drafts[1] = Drafts::verify;
      A.keep_cache = keep;
      launch_chain(kind, p[1], A, stream);
      buf.rotation = 1 - buf.rotation;  // row A (attained) is the committed state now
      break;
    }
    case PriorScheme::stree: {
      // Chunk-scan verification: read C once, the T outputs in the parallel form, nothing stored.
      ChunkArgs A{shape, in, buf.drafts, buf.state[0], keep};
      launch_chunk_scan(kind, p[0], A, stream);
      break;
    }
  }
  buf.parity = 1 - buf.parity;  // cache[parity]: these drafts
}

void prior_recover_step(PriorScheme scheme, ssm::Recurrence kind, const DecodeShape& shape, const int* accepted,
                        PriorBuffers& buf, cudaStream_t stream) {
  check_common(scheme, kind, shape, buf);
  if (!accepted) throw std::invalid_argument("prior schemes: accepted is null (device array of B accepted lengths)");
  const std::vector<LaunchPlan> p = plans(scheme);
  switch (scheme) {
    case PriorScheme::mamba_in_llama:
    case PriorScheme::joint_attainment: break;  // recovered by the next verify step (prev_accepted)
    case PriorScheme::activation_replay: {
      // Recompute (read C, replay the a accepted cached drafts, store C), then copy C -> W.
      ChainArgs A = chain_args(shape, StepInputs{}, buf);
      A.accepted = accepted;
      A.replay = Replay::accepted;
      A.src[0] = buf.state[0];
      A.mid[0] = buf.state[0];
      launch_chain(kind, p[1], A, stream);
      launch_copy(p[2], shape, buf.state[0], buf.state[1], nullptr, stream);
      break;
    }
    case PriorScheme::stree: {
      // Masked replay: read C, run all T cached drafts with the mask s < a (the same chain for
      // every a), store C.
      ChainArgs A = chain_args(shape, StepInputs{}, buf);
      A.accepted = accepted;
      A.replay = Replay::masked_all;
      A.src[0] = buf.state[0];
      A.mid[0] = buf.state[0];
      launch_chain(kind, p[1], A, stream);
      break;
    }
  }
}

}  // namespace replayssm::cuda
