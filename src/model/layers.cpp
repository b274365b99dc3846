#include "model/layers.h"

#include <fmt/format.h>

namespace replayssm::model {

Mat WeightLoader::matrix(const std::string& name, int rows, int cols) {
  parameters_ += static_cast<std::size_t>(rows) * cols;
  if (shapes_only_) {
    store_.check(name, {rows, cols});
    return Mat();
  }
  const Tensor t = store_.take(name, {rows, cols});
  return Eigen::Map<const Mat>(t.data.data(), rows, cols);
}

Vec WeightLoader::vector(const std::string& name, int n) {
  parameters_ += static_cast<std::size_t>(n);
  if (shapes_only_) {
    store_.check(name, {n});
    return Vec();
  }
  const Tensor t = store_.take(name, {n});
  return Eigen::Map<const Vec>(t.data.data(), n);
}

Mat WeightLoader::conv_weight(const std::string& name, int channels, int k) {
  parameters_ += static_cast<std::size_t>(channels) * k;
  if (shapes_only_) {
    store_.check(name, {channels, 1, k});
    return Mat();
  }
  const Tensor t = store_.take(name, {channels, 1, k});
  return Eigen::Map<const Mat>(t.data.data(), channels, k);
}

Vec WeightLoader::flat(const std::string& name, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  parameters_ += static_cast<std::size_t>(n);
  if (shapes_only_) {
    store_.check(name, shape);
    return Vec();
  }
  const Tensor t = store_.take(name, shape);
  return Eigen::Map<const Vec>(t.data.data(), static_cast<Eigen::Index>(n));
}

Linear WeightLoader::linear(const std::string& prefix, int out, int in, bool bias) {
  Linear l;
  l.weight = matrix(prefix + ".weight", out, in);
  if (bias) l.bias = vector(prefix + ".bias", out);
  return l;
}

}  // namespace replayssm::model
