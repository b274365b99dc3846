// Per-row KL terms on the GPU: one 256-thread block per row pair, two passes over the row (pass 1
// maxima/argmaxes/non-finite counts, pass 2 the double sums of src/eval/kl_terms.h), each a
// fixed per-thread order followed by a fixed shared-memory tree, so results repeat bit for bit
// from run to run. Only the RowSums come back; finish_position (host) evaluates the final formulas.
#include "eval/kl_row_sums_gpu.h"

#include "cuda_check.h"

namespace replayssm::cuda::detail {

namespace kl = eval::kl;

namespace {

constexpr int kThreads = 256;

// f(i, r, c) for this thread's entries of the row, in increasing i: float4 loads when both rows
// are 16-byte aligned, then the tail element by element.
template <class F>
__device__ __forceinline__ void for_each_entry(const float* __restrict__ ref, const float* __restrict__ cfg,
                                               int32_t vocab, F&& f) {
  // int64 loop counters: k + kThreads must not overflow for a vocabulary near 2^31.
  int64_t start = 0;
  if (((reinterpret_cast<uintptr_t>(ref) | reinterpret_cast<uintptr_t>(cfg)) & 15u) == 0) {
    const int64_t n4 = vocab / 4;
    const float4* r4 = reinterpret_cast<const float4*>(ref);
    const float4* c4 = reinterpret_cast<const float4*>(cfg);
    for (int64_t k = threadIdx.x; k < n4; k += kThreads) {
      const float4 a = r4[k], b = c4[k];
      const auto i = static_cast<int32_t>(4 * k);
      f(i, a.x, b.x);
      f(i + 1, a.y, b.y);
      f(i + 2, a.z, b.z);
      f(i + 3, a.w, b.w);
    }
    start = n4 * 4;
  }
  for (int64_t i = start + threadIdx.x; i < vocab; i += kThreads) f(static_cast<int32_t>(i), ref[i], cfg[i]);
}

// Tree over the block's states (thread t merges t + s, s = 128, 64, ..., 1): a fixed order.
template <class T, class Merge>
__device__ __forceinline__ T block_reduce(T* buf, const T& v, Merge merge) {
  buf[threadIdx.x] = v;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (static_cast<int>(threadIdx.x) < s) merge(buf[threadIdx.x], buf[threadIdx.x + s]);
    __syncthreads();
  }
  const T total = buf[0];
  __syncthreads();  // buf is free again
  return total;
}

__global__ void __launch_bounds__(kThreads) kl_row_sums_kernel(const float* __restrict__ ref, int64_t ld_ref,
                                                               const float* __restrict__ cfg, int64_t ld_cfg,
                                                               int32_t vocab, const int32_t* __restrict__ targets,
                                                               kl::RowSums* __restrict__ out) {
  __shared__ kl::ScanState scan_buf[kThreads];
  __shared__ kl::SumState sum_buf[kThreads];
  const int64_t row = blockIdx.x;
  const float* r = ref + row * ld_ref;  // int64 offsets: rows * ld exceeds 2^31 for large chunks
  const float* c = cfg + row * ld_cfg;

  kl::ScanState scan = kl::scan_init();
  for_each_entry(r, c, vocab, [&](int32_t i, float a, float b) { kl::scan_element(scan, i, a, b); });
  scan = block_reduce(scan_buf, scan, [](kl::ScanState& x, const kl::ScanState& y) { kl::scan_merge(x, y); });

  kl::SumState sums = kl::sum_init();
  double anchor = 0.0;
  if (kl::scan_valid(scan)) {  // uniform over the block
    anchor = kl::choose_anchor(scan, c[scan.ref_arg]);
    const double ref_max = scan.ref_max, shift = ref_max - anchor;
    for_each_entry(r, c, vocab,
                   [&](int32_t, float a, float b) { kl::sum_element(sums, ref_max, anchor, shift, a, b); });
    sums = block_reduce(sum_buf, sums, [](kl::SumState& x, const kl::SumState& y) { kl::sum_merge(x, y); });
  }
  if (threadIdx.x == 0) {
    kl::RowSums s;
    s.scan = scan;
    s.sums = sums;
    s.anchor = anchor;
    s.target = targets[row];
    const bool in_range = s.target >= 0 && s.target < vocab;
    s.ref_target = in_range ? r[s.target] : 0.0f;
    s.cfg_target = in_range ? c[s.target] : 0.0f;
    out[row] = s;
  }
}

}  // namespace

void launch_kl_row_sums(const float* ref, int64_t ld_ref, const float* cfg, int64_t ld_cfg, int32_t rows,
                        int32_t vocab, const int32_t* targets, eval::kl::RowSums* out, cudaStream_t stream) {
  if (rows <= 0) return;
  kl_row_sums_kernel<<<rows, kThreads, 0, stream>>>(ref, ld_ref, cfg, ld_cfg, vocab, targets, out);
  REPLAYSSM_CUDA_CHECK_LAUNCH();
}

}  // namespace replayssm::cuda::detail
