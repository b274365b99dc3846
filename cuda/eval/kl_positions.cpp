#include "eval/kl_positions.h"

#include <limits>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "cuda_check.h"
#include "eval/kl_row_sums_gpu.h"

namespace replayssm::cuda {

void compare_positions_gpu(ConstDeviceMatrix ref, ConstDeviceMatrix cfg, const int32_t* targets,
                           std::span<eval::PositionResult> out, cudaStream_t stream) {
  if (ref.rows != cfg.rows || ref.cols != cfg.cols)
    throw std::invalid_argument(fmt::format("compare_positions_gpu: reference rows are {}x{}, configuration rows {}x{}",
                                            ref.rows, ref.cols, cfg.rows, cfg.cols));
  const int64_t rows = ref.rows, vocab = ref.cols;
  if (static_cast<int64_t>(out.size()) != rows)
    throw std::invalid_argument(fmt::format("compare_positions_gpu: {} rows but room for {} results", rows, out.size()));
  if (rows == 0) return;
  if (vocab < 1 || vocab > std::numeric_limits<int32_t>::max())
    throw std::invalid_argument(fmt::format("compare_positions_gpu: vocabulary size {} (expected 1 to {})", vocab,
                                            std::numeric_limits<int32_t>::max()));
  if (rows > std::numeric_limits<int32_t>::max())
    throw std::invalid_argument(fmt::format("compare_positions_gpu: {} rows in one call (at most {})", rows,
                                            std::numeric_limits<int32_t>::max()));
  if (ref.ld < vocab || cfg.ld < vocab)
    throw std::invalid_argument(fmt::format("compare_positions_gpu: leading dimensions {} (reference) and {} "
                                            "(configuration) must be >= the vocabulary size {}",
                                            ref.ld, cfg.ld, vocab));
  if (!ref.data || !cfg.data || !targets)
    throw std::invalid_argument("compare_positions_gpu: null device pointer (reference, configuration or targets)");

  const std::size_t bytes = static_cast<std::size_t>(rows) * sizeof(eval::kl::RowSums);
  eval::kl::RowSums* sums = nullptr;
  REPLAYSSM_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&sums), bytes, stream));
  std::vector<eval::kl::RowSums> host(static_cast<std::size_t>(rows));
  try {
    detail::launch_kl_row_sums(ref.data, ref.ld, cfg.data, cfg.ld, static_cast<int32_t>(rows),
                               static_cast<int32_t>(vocab), targets, sums, stream);
    REPLAYSSM_CUDA_CHECK(cudaMemcpyAsync(host.data(), sums, bytes, cudaMemcpyDeviceToHost, stream));
  } catch (...) {
    cudaFreeAsync(sums, stream);  // no check: the error being thrown is the one to report
    throw;
  }
  REPLAYSSM_CUDA_CHECK(cudaFreeAsync(sums, stream));
  REPLAYSSM_CUDA_CHECK(cudaStreamSynchronize(stream));

  for (int64_t i = 0; i < rows; ++i) {
    const int32_t t = host[static_cast<std::size_t>(i)].target;
    if (t >= vocab)
      throw std::invalid_argument(fmt::format(
          "compare_positions_gpu: target token {} of row {} is not below the vocabulary size {}", t, i, vocab));
  }
  for (int64_t i = 0; i < rows; ++i)
    out[static_cast<std::size_t>(i)] = eval::finish_position(host[static_cast<std::size_t>(i)]);
}

}  // namespace replayssm::cuda
