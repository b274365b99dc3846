// Conventional KDA decode (REPLAYSSM.md section 1): one 256-thread block per (value head, sequence)
// reads its head's dv x dk state, updates it with the channel-wise decay, outputs and writes it back.
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
__global__ void __launch_bounds__(kThreads) kda_conventional_kernel(DecodeShape shape, StepInputs in, DeviceState state) {
  using T = Tile<StorageFormat::fp32, DK>;  // 4 elements per piece whatever the storage width
  constexpr int E = T::E, P = T::P, LPR = T::LPR, RW = T::RW;
  constexpr int kBatch = 4;  // row iterations whose loads are issued together
  const Geometry geo = geometry(shape);
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
  const int iterations = (geo.dv + kWarps * RW - 1) / (kWarps * RW);
  for (int it0 = 0; it0 < iterations; it0 += kBatch) {  // uniform per warp: the row sums shuffle
    float x[kBatch][P][E];
    int rows[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      rows[j] = ((it0 + j) * kWarps + warp) * RW + T::row_in_iteration(lane);
#pragma unroll
      for (int p = 0; p < P; ++p) {
        if (rows[j] < geo.dv) load4<F, DK>(hv, rows[j], T::col(lane, p), x[j][p]);
        else x[j][p][0] = x[j][p][1] = x[j][p][2] = x[j][p][3] = 0.0f;
      }
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const bool valid = rows[j] < geo.dv;
      float sk = 0.0f;
#pragma unroll
      for (int p = 0; p < P; ++p) sk = dot_acc<E>(x[j][p], akv[p], sk);
      sk = row_sum<LPR>(sk);  // S_{t-1} Diag(a_t) k_t
      const float u = beta * ((valid ? __bfloat162float(v[rows[j]]) : 0.0f) - sk);
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
          if constexpr (kEf) store_piece_ef<F, DK>(hv, rows[j], T::col(lane, p), x[j][p], residual);
          else store_piece<F, DK>(hv, rows[j], T::col(lane, p), x[j][p], formats::RoundingMode::nearest_even, 0, 0);
        }
        if (lane % LPR == 0) in.out[geo.hb * geo.dv + rows[j]] = o;
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
  const dim3 grid(shape.value_heads, shape.batch);
  with_dk(shape.dk, [&](auto DK) {
    switch (state.format) {
      case StorageFormat::fp32:
        kda_conventional_kernel<StorageFormat::fp32, DK(), false><<<grid, kThreads, 0, stream>>>(shape, in, state);
        break;
      case StorageFormat::fp16:
        if (ef) kda_conventional_kernel<StorageFormat::fp16, DK(), true><<<grid, kThreads, 0, stream>>>(shape, in, state);
        else kda_conventional_kernel<StorageFormat::fp16, DK(), false><<<grid, kThreads, 0, stream>>>(shape, in, state);
        break;
      case StorageFormat::bf16:
        if (ef) kda_conventional_kernel<StorageFormat::bf16, DK(), true><<<grid, kThreads, 0, stream>>>(shape, in, state);
        else kda_conventional_kernel<StorageFormat::bf16, DK(), false><<<grid, kThreads, 0, stream>>>(shape, in, state);
        break;
      default: throw std::invalid_argument("kda conventional decode: DeviceState::format must be fp32, fp16 or bf16");
    }
  });
  REPLAYSSM_CUDA_CHECK_LAUNCH();
}

}  // namespace replayssm::cuda
