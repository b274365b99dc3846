// Conventional decode: 256-thread blocks per (value head, sequence) read the head's dv x dk state, update
// it and write it back, each block a range of rows (conventional_row_parts; decode_kernels.h has the contract).
#include "ssm/decode_common.cuh"

namespace replayssm::cuda {

using formats::StorageFormat;
using namespace detail;
using namespace decode_detail;

namespace {

// ================================ conventional decode =========================================
// Read S, update (Mamba-2: S = a S + v k^T; GDN: u = b (v - a S k), S = a S + u k^T), o = S q,
// write S. Rows are independent, so the whole step is row-local.
// kEf: error feedback (+ef) on an fp16/bf16 state, the residual in state.residual.
template <ssm::Recurrence K, StorageFormat F, int DK, bool kEf>
__global__ void __launch_bounds__(kThreads) conventional_kernel(DecodeShape shape, StepInputs in, DeviceState state, int parts) {
  using T = Tile<StorageFormat::fp32, DK>;  // 4 elements per piece whatever the storage width
  constexpr int E = T::E, P = T::P, LPR = T::LPR, RW = T::RW;
  // Only FP32 heads are split (conventional_row_parts); the other instances compile to one block per head.
  const int split = F == StorageFormat::fp32 ? parts : 1;
  const int head = blockIdx.x / split, part = blockIdx.x - head * split;
  const Geometry geo = geometry_of_head(shape, head);
  const int rows = geo.dv / split, row0 = part * rows, row_end = row0 + rows;  // this block's rows
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float kv[P][E], qv[P][E];
  load_lane_vector<E, P, LPR>(in.k + (static_cast<std::size_t>(geo.b) * geo.G + geo.g) * DK, lane, kv);
  load_lane_vector<E, P, LPR>(in.q + (static_cast<std::size_t>(geo.b) * geo.G + geo.g) * DK, lane, qv);
  const float a = in.alpha[geo.hb];
  const float beta = K == ssm::Recurrence::gdn ? in.beta[geo.hb] : 0.0f;
  const __nv_bfloat16* v = in.v + geo.hb * geo.dv;
  const HeadView hv = head_view(state, geo.hb, geo.dv, DK);
  float* const residual = kEf ? head_residual(state, geo.hb, geo.dv, DK) : nullptr;
  // Row iterations in batches of kBatch; the next batch's loads are issued before the current one
  // is updated and stored, so up to 2 kBatch 16-byte loads per thread are in flight.
  constexpr int kBatch = 4;
  const int iterations = (rows + kWarps * RW - 1) / (kWarps * RW);
  auto row_of = [&](int it) { return row0 + (it * kWarps + warp) * RW + T::row_in_iteration(lane); };
  float next[kBatch][P][E];
  auto load_batch = [&](int it0) {
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int row = row_of(it0 + j);
#pragma unroll
      for (int p = 0; p < P; ++p) {
        if (row < row_end) load4<F, DK>(hv, row, T::col(lane, p), next[j][p]);
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
      vr[j] = row < row_end ? __bfloat162float(v[row]) : 0.0f;
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
      if (row < row_end)
#pragma unroll
        for (int p = 0; p < P; ++p) {
          if constexpr (kEf) store_piece_ef<F, DK>(hv, row, T::col(lane, p), x[j][p], residual);
          else store_piece<F, DK>(hv, row, T::col(lane, p), x[j][p], formats::RoundingMode::nearest_even, 0, 0);
        }
    }
    const float sum = row_sum_scatter<LPR, kBatch>(o);
    const int row = row_of(it0 + scatter_index<LPR, kBatch>(lane));
    if (lane % (LPR / kBatch) == 0 && row < row_end) in.out[geo.hb * geo.dv + row] = sum;
  }
}

}  // namespace

void conventional_step(ssm::Recurrence kind, const DecodeShape& shape, const StepInputs& in, DeviceState state,
                       cudaStream_t stream, formats::Rounding rounding) {
  if (kind == ssm::Recurrence::kda) return kda_detail::conventional_step(shape, in, state, stream, rounding);
  check_shape(shape);
  if (checked_rounding(state, rounding, "conventional") == formats::RoundingMode::stochastic)
    throw std::invalid_argument("conventional decode kernels round with RTN or ef (error feedback), not SR");
  const bool ef = rounding == formats::Rounding::ef;
  const int parts = conventional_row_parts(shape, state.format);
  const dim3 grid(shape.value_heads * parts, shape.batch);
  with_kind(kind, [&](auto K) {
    with_dk(shape.dk, [&](auto DK) {
      switch (state.format) {
        case StorageFormat::fp32:
          conventional_kernel<K(), StorageFormat::fp32, DK(), false><<<grid, kThreads, 0, stream>>>(shape, in, state, parts);
          break;
        case StorageFormat::fp16:
          if (ef) conventional_kernel<K(), StorageFormat::fp16, DK(), true><<<grid, kThreads, 0, stream>>>(shape, in, state, parts);
          else conventional_kernel<K(), StorageFormat::fp16, DK(), false><<<grid, kThreads, 0, stream>>>(shape, in, state, parts);
          break;
        case StorageFormat::bf16:
          if (ef) conventional_kernel<K(), StorageFormat::bf16, DK(), true><<<grid, kThreads, 0, stream>>>(shape, in, state, parts);
          else conventional_kernel<K(), StorageFormat::bf16, DK(), false><<<grid, kThreads, 0, stream>>>(shape, in, state, parts);
          break;
        default: throw std::invalid_argument("conventional decode stores fp32, fp16 or bf16 state");
      }
    });
  });
  REPLAYSSM_CUDA_CHECK_LAUNCH();
}

}  // namespace replayssm::cuda
