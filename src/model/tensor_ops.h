// Dense float32 building blocks of the CPU forward pass: row-major matrices (positions x
// features), a multi-threaded linear layer, RMSNorm variants, activations and the causal
// depthwise convolution. Each follows transformers' float32 arithmetic (rsqrt(mean + eps),
// torch's softplus threshold, ...), so our forward agrees with it to float32 rounding.
#pragma once
#include <cmath>
#include <cstddef>
#include <functional>
#include <vector>

#include <Eigen/Core>

namespace replayssm::model {

using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Vec = Eigen::VectorXf;

// Runs fn(task) for task in [0, n_tasks) on up to `threads` threads (the caller's included).
void parallel_for(int n_tasks, int threads, const std::function<void(int)>& fn);
// Number of worker threads to use for `requested` (0: the machine's hardware threads).
int resolve_threads(int requested);

// y = x W^T (+ b): W is out x in (torch's nn.Linear layout).
struct Linear {
  Mat weight;  // out x in
  Vec bias;    // empty: no bias
  int in_features() const { return static_cast<int>(weight.cols()); }
  int out_features() const { return static_cast<int>(weight.rows()); }
  // y is resized to x.rows() x out; threads split positions (or output features for few positions).
  void apply(const Mat& x, Mat& y, int threads) const;
};

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
// torch.nn.functional.softplus (beta 1, threshold 20).
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// RMSNorm of every row in place: x * rsqrt(mean(x^2) + eps) * (w or 1 + w), over groups of
// `group` consecutive features (group = cols: ordinary RMSNorm). A group that does not divide
// the width, or a weight of another length, throws std::invalid_argument.
void rms_norm_rows(Mat& x, const Vec& weight, float eps, bool plus_one, int group, int threads);

// Causal depthwise conv1d over positions (torch Conv1d, groups = channels, left padding K-1,
// first N outputs kept) followed by SiLU. weight: channels x K, bias: channels or empty.
// x is N x channels (a matrix or a block of columns of one); computed in place.
using MatRef = Eigen::Ref<Mat, 0, Eigen::OuterStride<>>;
void causal_conv1d_silu(MatRef x, const Mat& weight, const Vec& bias, int threads);

}  // namespace replayssm::model
