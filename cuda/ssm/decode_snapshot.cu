// The snapshot baseline of speculative decoding: T sequential updates, each intermediate state written.
#include "ssm/decode_common.cuh"

namespace replayssm::cuda {

using formats::StorageFormat;
using namespace detail;
using namespace decode_detail;

namespace {

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

}  // namespace

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
