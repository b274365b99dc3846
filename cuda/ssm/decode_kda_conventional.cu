// Conventional KDA decode (REPLAYSSM.md section 1): 256-thread blocks per (value head, sequence) read the
// head's dv x dk state, update it with the channel-wise decay, output and write it back, each block a range
// of rows (conventional_row_parts, decode_common.cuh).
#include "ssm/decode_kda.cuh"

namespace replayssm::cuda {

using formats::StorageFormat;
using namespace detail;
using namespace decode_detail;

namespace {

// Per row r (rows are independent): u_r = b (v_r - S_r . (a . k)); S_r <- S_r . a + u_r k
// (element-wise, both products rounded and then added, as ssm::decay_and_add); o_r = S_r . q.
// The a . k product is rounded once per element, as ssm::correction forms it.
// kEf: error feedback (+ef) on an fp16/bf16 state, the residual in state.residual
// (ssm::ConventionalDecoder::step's quantize_state with a residual).
template <StorageFormat F, int DK, bool kEf>
__global__ void __launch_bounds__(kThreads) kda_conventional_kernel(DecodeShape shape, StepInputs in, DeviceState state, int parts) {
  using T = Tile<StorageFormat::fp32, DK>;  // 4 elements per piece whatever the storage width
  constexpr int E = T::E, P = T::P, LPR = T::LPR, RW = T::RW;
  constexpr int kBatch = 4;  // row iterations whose loads are issued together
  // Only FP32 heads are split (conventional_row_parts); the other instances compile to one block per head.
  const int split = F == StorageFormat::fp32 ? parts : 1;
  const int head = blockIdx.x / split, part = blockIdx.x - head * split;
  const Geometry geo = geometry_of_head(shape, head);
  const int rows = geo.dv / split, row0 = part * rows, row_end = row0 + rows;  // this block's rows
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float kv[P][E], qv[P][E], av[P][E], akv[P][E];
  load_lane_vector<E, P, LPR>(in.k + (static_cast<std::size_t>(geo.b) * geo.G + geo.g) * DK, lane, kv);
  load_lane_vector<E, P, LPR>(in.q + (static_cast<std::size_t>(geo.b) * geo.G + geo.g) * DK, lane, qv);
  load_lane_f32<P, LPR>(kda_step_alpha(in.alpha, geo.hb, DK), lane, av);
#pragma unroll
  for (int p = 0; p < P; ++p)
#pragma unroll
    for (int e = 0; e < E; ++e) akv[p][e] = av[p][e] * kv[p][e];
  const float beta = in.beta[geo.hb];
  const __nv_bfloat16* v = in.v + geo.hb * geo.dv;
  const HeadView hv = head_view(state, geo.hb, geo.dv, DK);
  float* const residual = kEf ? head_residual(state, geo.hb, geo.dv, DK) : nullptr;
  // Row iterations in batches of kBatch. FP32 states issue the next batch's loads before the current one
  // is updated and stored (as conventional_kernel, decode_conventional.cu): up to 2 kBatch 16-byte loads
  // per thread in flight. FP16/BF16 states load each batch when they reach it: with the prefetch, Kimi
  // Linear's ran 6-20% slower on an H100 (session 21), and they are not split either.
  constexpr bool kPrefetch = F == StorageFormat::fp32;
  const int iterations = (rows + kWarps * RW - 1) / (kWarps * RW);
  auto row_of = [&](int it) { return row0 + (it * kWarps + warp) * RW + T::row_in_iteration(lane); };
  float next[kBatch][P][E];
  auto load_batch = [&](int it0, float (&dst)[kBatch][P][E]) {
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int r = row_of(it0 + j);
#pragma unroll
      for (int p = 0; p < P; ++p) {
        if (r < row_end) load4<F, DK>(hv, r, T::col(lane, p), dst[j][p]);
        else dst[j][p][0] = dst[j][p][1] = dst[j][p][2] = dst[j][p][3] = 0.0f;
      }
    }
  };
  if constexpr (kPrefetch) load_batch(0, next);
  for (int it0 = 0; it0 < iterations; it0 += kBatch) {  // uniform per warp: the row sums shuffle
    float x[kBatch][P][E];
    int row[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) row[j] = row_of(it0 + j);
    if constexpr (kPrefetch) {
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
#pragma unroll
        for (int p = 0; p < P; ++p)
#pragma unroll
          for (int e = 0; e < E; ++e) x[j][p][e] = next[j][p][e];
      if (it0 + kBatch < iterations) load_batch(it0 + kBatch, next);
    } else {
      load_batch(it0, x);
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const bool valid = row[j] < row_end;
      float sk = 0.0f;
#pragma unroll
      for (int p = 0; p < P; ++p) sk = dot_acc<E>(x[j][p], akv[p], sk);
      sk = row_sum<LPR>(sk);  // S_{t-1} Diag(a_t) k_t
      const float u = beta * ((valid ? __bfloat162float(v[row[j]]) : 0.0f) - sk);
      float o = 0.0f;
#pragma unroll
      for (int p = 0; p < P; ++p) {
#pragma unroll
        for (int e = 0; e < E; ++e) x[j][p][e] = x[j][p][e] * av[p][e] + u * kv[p][e];
        o = dot_acc<E>(x[j][p], qv[p], o);
      }
      o = row_sum<LPR>(o);
      if (valid) {
#pragma unroll
        for (int p = 0; p < P; ++p) {
          if constexpr (kEf) store_piece_ef<F, DK>(hv, row[j], T::col(lane, p), x[j][p], residual);
          else store_piece<F, DK>(hv, row[j], T::col(lane, p), x[j][p], formats::RoundingMode::nearest_even, 0, 0);
        }
        if (lane % LPR == 0) in.out[geo.hb * geo.dv + row[j]] = o;
      }
    }
  }
}

}  // namespace

void kda_detail::conventional_step(const DecodeShape& shape, const StepInputs& in, DeviceState state, cudaStream_t stream,
                                   formats::Rounding rounding) {
  check_shape(shape);
  if (checked_rounding(state, rounding, "conventional") == formats::RoundingMode::stochastic)
    throw std::invalid_argument("kda conventional decode rounds with RTN or ef (error feedback), not SR");
  check_kda_inputs(in, 0);
  if (state.payload == nullptr) throw std::invalid_argument("kda conventional decode: DeviceState::payload is required");
  const bool ef = rounding == formats::Rounding::ef;  // checked_rounding: fp16/bf16 with a residual
  const int parts = conventional_row_parts(shape, state.format);
  const dim3 grid(shape.value_heads * parts, shape.batch);
  with_dk(shape.dk, [&](auto DK) {
    switch (state.format) {
      case StorageFormat::fp32:
        kda_conventional_kernel<StorageFormat::fp32, DK(), false><<<grid, kThreads, 0, stream>>>(shape, in, state, parts);
        break;
      case StorageFormat::fp16:
        if (ef) kda_conventional_kernel<StorageFormat::fp16, DK(), true><<<grid, kThreads, 0, stream>>>(shape, in, state, parts);
        else kda_conventional_kernel<StorageFormat::fp16, DK(), false><<<grid, kThreads, 0, stream>>>(shape, in, state, parts);
        break;
      case StorageFormat::bf16:
        if (ef) kda_conventional_kernel<StorageFormat::bf16, DK(), true><<<grid, kThreads, 0, stream>>>(shape, in, state, parts);
        else kda_conventional_kernel<StorageFormat::bf16, DK(), false><<<grid, kThreads, 0, stream>>>(shape, in, state, parts);
        break;
      default: throw std::invalid_argument("kda conventional decode: DeviceState::format must be fp32, fp16 or bf16");
    }
  });
  REPLAYSSM_CUDA_CHECK_LAUNCH();
}

}  // namespace replayssm::cuda
