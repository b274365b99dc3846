#include "model/tensor_ops.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

namespace replayssm::model {

int resolve_threads(int requested) {
  if (requested > 0) return requested;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw ? static_cast<int>(hw) : 1;
}

void parallel_for(int n_tasks, int threads, const std::function<void(int)>& fn) {
  if (n_tasks <= 0) return;
  const int t = std::min(resolve_threads(threads), n_tasks);
  if (t <= 1) {
    for (int i = 0; i < n_tasks; ++i) fn(i);
    return;
  }
  std::atomic<int> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto worker = [&] {
    for (;;) {
      const int i = next.fetch_add(1);
      if (i >= n_tasks) return;
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        next.store(n_tasks);
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(t - 1);
  for (int i = 0; i < t - 1; ++i) pool.emplace_back(worker);
  worker();
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

void Linear::apply(const Mat& x, Mat& y, int threads) const {
  // The work is cut into fixed blocks (128 positions, or 256 output features when there are few
  // positions) whatever the thread count, so results are bitwise independent of `threads`.
  constexpr Eigen::Index kRows = 128, kCols = 256;
  const Eigen::Index n = x.rows(), out = weight.rows();
  y.resize(n, out);
  if (n >= kRows || out <= kCols) {
    const Eigen::Index blocks = std::max<Eigen::Index>(1, (n + kRows - 1) / kRows);
    parallel_for(static_cast<int>(blocks), threads, [&](int b) {
      const Eigen::Index r0 = b * kRows, r = std::min(kRows, n - r0);
      if (r > 0) y.middleRows(r0, r).noalias() = x.middleRows(r0, r) * weight.transpose();
    });
  } else {
    const Eigen::Index blocks = (out + kCols - 1) / kCols;
    parallel_for(static_cast<int>(blocks), threads, [&](int b) {
      const Eigen::Index c0 = b * kCols, c = std::min(kCols, out - c0);
      y.middleCols(c0, c).noalias() = x * weight.middleRows(c0, c).transpose();
    });
  }
  if (bias.size()) y.rowwise() += bias.transpose();
}

void rms_norm_rows(Mat& x, const Vec& weight, float eps, bool plus_one, int group, int threads) {
  const Eigen::Index n = x.rows(), d = x.cols();
  if (group <= 0 || d % group != 0 || weight.size() != d)
    throw std::invalid_argument(fmt::format("rms_norm_rows: group {} must divide the width {} (weight has {})", group,
                                            d, weight.size()));
  const int blocks = static_cast<int>(std::min<Eigen::Index>(n, 8 * resolve_threads(threads)));
  parallel_for(blocks, threads, [&](int b) {
    const Eigen::Index r0 = n * b / blocks, r1 = n * (b + 1) / blocks;
    for (Eigen::Index r = r0; r < r1; ++r) {
      float* row = x.data() + r * d;
      for (Eigen::Index g0 = 0; g0 < d; g0 += group) {
        double ss = 0.0;
        for (int i = 0; i < group; ++i) ss += static_cast<double>(row[g0 + i]) * row[g0 + i];
        const float mean = static_cast<float>(ss / group);
        const float inv = 1.0f / std::sqrt(mean + eps);
        for (int i = 0; i < group; ++i) {
          const float w = plus_one ? 1.0f + weight[g0 + i] : weight[g0 + i];
          row[g0 + i] = (row[g0 + i] * inv) * w;
        }
      }
    }
  });
}

void causal_conv1d_silu(MatRef x, const Mat& weight, const Vec& bias, int threads) {
  const Eigen::Index n = x.rows(), ch = x.cols(), stride = x.outerStride();
  const int k = static_cast<int>(weight.cols());
  const int blocks =
      static_cast<int>(std::max<Eigen::Index>(1, std::min<Eigen::Index>(ch / 64, 4 * resolve_threads(threads))));
  parallel_for(blocks, threads, [&](int b) {
    const Eigen::Index c0 = ch * b / blocks, c1 = ch * (b + 1) / blocks, w = c1 - c0;
    // Ring of the last k inputs of this channel block (row t % k holds input t); zero before t = 0.
    std::vector<float> ring(static_cast<std::size_t>(k * w), 0.0f);
    std::vector<float> acc(static_cast<std::size_t>(w));
    for (Eigen::Index t = 0; t < n; ++t) {
      float* row = x.data() + t * stride + c0;
      std::copy(row, row + w, ring.begin() + (t % k) * w);
      for (Eigen::Index c = 0; c < w; ++c) acc[c] = 0.0f;
      for (int j = 0; j < k; ++j) {
        const Eigen::Index src = t - (k - 1) + j;  // input position multiplied by tap j
        if (src < 0) continue;
        const float* in = ring.data() + (src % k) * w;
        for (Eigen::Index c = 0; c < w; ++c) acc[c] += weight(c0 + c, j) * in[c];
      }
      for (Eigen::Index c = 0; c < w; ++c) row[c] = silu(acc[c] + (bias.size() ? bias[c0 + c] : 0.0f));
    }
  });
}

}  // namespace replayssm::model
