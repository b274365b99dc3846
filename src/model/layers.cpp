#include "model/layers.h"

#include <algorithm>
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
  if (shapes_only_) {
    store_.check(name, shape);
    return {};
  }
  return store_.take(name, shape).data;
}

StoredMatrix WeightLoader::stored_matrix(const std::string& name, int rows, int cols) {
  const std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
  parameters_ += n;
  stored_parameters_ += n;
  StoredMatrix m;
  m.store_ = &store_;
  m.name_ = name;
  m.rows_ = rows;
  m.cols_ = cols;
  if (quantized_ && quantized_->holds(name)) {
    quantized_->dequantize(name, rows, cols, true);  // validates codes and scales, records it for `info`
    const TensorStore::Stored s = *store_.stored(name);
    s.file->release_pages(*s.info);  // scanned for NaN codes: resident again only when the forward reads it
    m.quantization_ = quantization_;
    m.stored_bytes_ = quantized_->dequantized().back().stored_bytes;
    const WeightQuantization& q = *quantization_;
    const int64_t scales = *q.format == WeightFormat::fp8_block
                               ? ((rows + q.block_rows - 1) / q.block_rows) * ((cols + q.block_cols - 1) / q.block_cols)
                               : int64_t{rows} * (cols / q.group_size);
    stored_scratch_floats_ = std::max(stored_scratch_floats_, scales);
  } else {
    if (quantized_) quantized_->note_unquantized(name, rows, cols);
    store_.check(name, {rows, cols});
    const TensorStore::Stored s = *store_.stored(name);
    m.file_ = s.file;
    m.info_ = s.info;
    m.stored_bytes_ = s.info->end - s.info->begin;
    s.file->release_pages(*s.info);  // scanned for NaN and Inf: resident again only when the forward reads it
  }
  stored_bytes_ += m.stored_bytes_;
  return m;
}

std::vector<StoredMatrix> WeightLoader::stored_stack(const std::string& name, int n, int rows, int cols) {
  if (quantized_ && quantized_->holds(name))
    throw std::runtime_error(fmt::format(
        "{}: tensor '{}' is stored quantized as a 3-D (fused) tensor; quantized weights load as 2-D matrices "
        "(one tensor per expert, as FP8 and NVFP4 releases store them)",
        store_.files_description(), name));
  const std::size_t per = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
  parameters_ += per * static_cast<std::size_t>(n);
  stored_parameters_ += per * static_cast<std::size_t>(n);
  store_.check(name, {n, rows, cols});
  const TensorStore::Stored s = *store_.stored(name);
  s.file->release_pages(*s.info);
  stored_bytes_ += s.info->end - s.info->begin;
  std::vector<StoredMatrix> out(static_cast<std::size_t>(n));
  for (int e = 0; e < n; ++e) {
    StoredMatrix& m = out[static_cast<std::size_t>(e)];
    m.store_ = &store_;
    m.file_ = s.file;
    m.info_ = s.info;
    m.name_ = name;
    m.first_ = static_cast<uint64_t>(e) * per;
    m.rows_ = rows;
    m.cols_ = cols;
    m.stored_bytes_ = (s.info->end - s.info->begin) / static_cast<uint64_t>(n);
  }
  return out;
}

StoredMatrix StoredMatrix::row_slice(int row0, int rows) const {
  if (quantization_ || row0 < 0 || rows < 0 || row0 + rows > rows_)
    throw std::logic_error(fmt::format("row_slice [{}, {}) of '{}' ({} rows{})", row0, row0 + rows, name_, rows_,
                                       quantization_ ? ", stored quantized" : ""));
  StoredMatrix m = *this;
  m.first_ += static_cast<uint64_t>(row0) * static_cast<uint64_t>(cols_);
  m.rows_ = rows;
  m.stored_bytes_ = stored_bytes_ / static_cast<uint64_t>(rows_) * static_cast<uint64_t>(rows);
  return m;
}

void StoredMatrix::fetch(std::vector<float>& out) const {
  if (quantization_) {
    // A reader of its own per fetch: its records (kept for `info` at load) are not wanted here.
    out = QuantizedWeightReader(*store_, *quantization_).dequantize(name_, rows_, cols_, false);
    return;
  }
  out.resize(static_cast<std::size_t>(rows_) * static_cast<std::size_t>(cols_));
  file_->read_float32(*info_, first_, out.size(), out.data());
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
