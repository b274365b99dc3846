// Device memory for the GPU sweep engine: an owning buffer (cudaMalloc, never managed memory) and
// a non-owning row-major matrix view with a leading dimension, the device counterpart of the
// Eigen row-major matrices (model::Mat) of the CPU path. Every GPU op in cuda/ takes views, so a
// column block of a wider activation (q inside qkv) is passed without a copy, as on the CPU.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "cuda_check.h"

namespace replayssm::cuda {

template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t count) { resize(count); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      ptr_ = std::exchange(o.ptr_, nullptr);
      count_ = std::exchange(o.count_, 0);
    }
    return *this;
  }
  ~DeviceBuffer() { release(); }

  // Reallocates only when growing; contents are not preserved.
  void resize(std::size_t count) {
    if (count <= capacity_) {
      count_ = count;
      return;
    }
    release();
    REPLAYSSM_CUDA_CHECK(cudaMalloc(&ptr_, count * sizeof(T)));
    count_ = capacity_ = count;
  }
  T* data() { return ptr_; }
  const T* data() const { return ptr_; }
  std::size_t size() const { return count_; }
  std::size_t bytes() const { return count_ * sizeof(T); }

  void upload(const T* host, std::size_t count, cudaStream_t stream = nullptr) {
    resize(count);
    if (count) REPLAYSSM_CUDA_CHECK(cudaMemcpyAsync(ptr_, host, count * sizeof(T), cudaMemcpyHostToDevice, stream));
  }
  void upload(const std::vector<T>& host, cudaStream_t stream = nullptr) { upload(host.data(), host.size(), stream); }
  // Synchronous copy of the first `count` elements to the host.
  void download(T* host, std::size_t count) const {
    if (count) REPLAYSSM_CUDA_CHECK(cudaMemcpy(host, ptr_, count * sizeof(T), cudaMemcpyDeviceToHost));
  }
  std::vector<T> to_host() const {
    std::vector<T> out(count_);
    download(out.data(), count_);
    return out;
  }

 private:
  void release() {
    if (ptr_) cudaFree(ptr_);  // no check: destructors must not throw, and a failed free leaks only
    ptr_ = nullptr;
    count_ = capacity_ = 0;
  }
  T* ptr_ = nullptr;
  std::size_t count_ = 0, capacity_ = 0;
};

// rows x cols, row-major, element (r, c) at data[r * ld + c]; ld >= cols.
struct DeviceMatrix {
  float* data = nullptr;
  int64_t rows = 0, cols = 0, ld = 0;
  float* row(int64_t r) const { return data + r * ld; }
  // Columns [c0, c0 + n) of every row (no copy).
  DeviceMatrix columns(int64_t c0, int64_t n) const { return {data + c0, rows, n, ld}; }
  // Rows [r0, r0 + n) (no copy).
  DeviceMatrix middle_rows(int64_t r0, int64_t n) const { return {data + r0 * ld, n, cols, ld}; }
};
struct ConstDeviceMatrix {
  const float* data = nullptr;
  int64_t rows = 0, cols = 0, ld = 0;
  ConstDeviceMatrix() = default;
  ConstDeviceMatrix(const float* d, int64_t r, int64_t c, int64_t l) : data(d), rows(r), cols(c), ld(l) {}
  ConstDeviceMatrix(const DeviceMatrix& m) : data(m.data), rows(m.rows), cols(m.cols), ld(m.ld) {}  // NOLINT
  const float* row(int64_t r) const { return data + r * ld; }
  ConstDeviceMatrix columns(int64_t c0, int64_t n) const { return {data + c0, rows, n, ld}; }
  ConstDeviceMatrix middle_rows(int64_t r0, int64_t n) const { return {data + r0 * ld, n, cols, ld}; }
};

// Whether the element ranges two views touch (first to last element, gaps included) intersect:
// the ops that cannot work in place refuse overlapping operands with it.
inline bool views_overlap(ConstDeviceMatrix a, ConstDeviceMatrix b) {
  if (a.rows == 0 || a.cols == 0 || b.rows == 0 || b.cols == 0) return false;
  const float* a_end = a.data + (a.rows - 1) * a.ld + a.cols;
  const float* b_end = b.data + (b.rows - 1) * b.ld + b.cols;
  return a.data < b_end && b.data < a_end;
}

// A dense rows x cols matrix owning its memory.
class DeviceMatrixBuffer {
 public:
  DeviceMatrixBuffer() = default;
  DeviceMatrixBuffer(int64_t rows, int64_t cols) { resize(rows, cols); }
  void resize(int64_t rows, int64_t cols) {
    buf_.resize(static_cast<std::size_t>(rows * cols));
    rows_ = rows;
    cols_ = cols;
  }
  DeviceMatrix view() { return {buf_.data(), rows_, cols_, cols_}; }
  ConstDeviceMatrix view() const { return {buf_.data(), rows_, cols_, cols_}; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  DeviceBuffer<float>& buffer() { return buf_; }
  const DeviceBuffer<float>& buffer() const { return buf_; }

 private:
  DeviceBuffer<float> buf_;
  int64_t rows_ = 0, cols_ = 0;
};

// Host row-major copy of a view (for tests and for results that come back). A synchronous copy on
// the legacy default stream: work queued on a non-blocking stream must be waited for first.
std::vector<float> to_host(ConstDeviceMatrix m);
// Host row-major (rows x cols, dense) to a device view of the same shape.
void upload(const float* host, DeviceMatrix m, cudaStream_t stream = nullptr);

}  // namespace replayssm::cuda
