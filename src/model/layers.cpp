#include "model/layers.h"

#include <fmt/format.h>

namespace replayssm::model {

Mat WeightLoader::matrix(const std::string& name, int rows, int cols) {
  parameters_ += static_cast<std::size_t>(rows) * cols;
  if (quantized_) {
    if (quantized_->holds(name)) {
      const std::vector<float> v = quantized_->dequantize(name, rows, cols, shapes_only_);
      return shapes_only_ ? Mat() : Mat(Eigen::Map<const Mat>(v.data(), rows, cols));
    }
    quantized_->note_unquantized(name, rows, cols);
  }
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

Linear WeightLoader::linear(const std::string& prefix, int out, int in, bool bias) {
  Linear l;
  l.weight = matrix(prefix + ".weight", out, in);
  if (bias) l.bias = vector(prefix + ".bias", out);
  return l;
}

}  // namespace replayssm::model
