#include "model/layers.h"

#include <stdexcept>

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

std::vector<float> WeightLoader::values(const std::string& name, const std::vector<int64_t>& shape) {
  std::size_t n = 1;
  for (const int64_t d : shape) n *= static_cast<std::size_t>(d);
  parameters_ += n;
  if (quantized_) {
    // Expert matrices come through here: a quantized one dequantizes like any matrix() weight.
    if (quantized_->holds(name)) {
      if (shape.size() != 2)
        throw std::runtime_error(fmt::format(
            "{}: tensor '{}' is stored quantized as a {}-D (fused) tensor; quantized weights load as 2-D matrices "
            "(one tensor per expert, as FP8 and NVFP4 releases store them)",
            store_.files_description(), name, shape.size()));
      return quantized_->dequantize(name, static_cast<int>(shape[0]), static_cast<int>(shape[1]), shapes_only_);
    }
    if (shape.size() == 2) quantized_->note_unquantized(name, static_cast<int>(shape[0]), static_cast<int>(shape[1]));
  }
  if (shapes_only_) {
    store_.check(name, shape);
    return {};
  }
  return store_.take(name, shape).data;
}

Vec WeightLoader::flat(const std::string& name, const std::vector<int64_t>& shape) {
  const std::vector<float> v = values(name, shape);
  return Eigen::Map<const Vec>(v.data(), static_cast<Eigen::Index>(v.size()));
}

Linear WeightLoader::linear(const std::string& prefix, int out, int in, bool bias) {
  Linear l;
  l.weight = matrix(prefix + ".weight", out, in);
  if (bias) l.bias = vector(prefix + ".bias", out);
  return l;
}

}  // namespace replayssm::model
